# Scenario 3: blkctl attach --nbd in this guest, against blkd on the host
# (API and NVMe/RDMA port through 10.0.2.2): the volume becomes /dev/nbd0,
# fio verifies, a pattern survives a detach and a second attach, and a
# detach removes the device. env.sh: API VOLUME HOSTNQN SIZE
. /share/lib.sh
net_user
modprobe nbd
blkctl="/share/blkctl --api http://$API"

# attach_nbd N: run blkctl attach --nbd in the background, wait for the device.
attach_nbd() {
	$blkctl attach "$VOLUME" --host-nqn "$HOSTNQN" --nbd /dev/nbd0 >/share/attach-$1.out 2>/share/attach-$1.err &
	pid=$!
	n=0
	until [ -e /sys/block/nbd0/pid ] && [ "$(blockdev --getsize64 /dev/nbd0 2>/dev/null)" = "$SIZE" ]; do
		kill -0 $pid 2>/dev/null || fail "blkctl attach --nbd exited: $(cat /share/attach-$1.err)"
		n=$((n + 1)); [ $n -le 600 ] || fail "/dev/nbd0 did not appear with $SIZE bytes"
		sleep 0.1
	done
	log "attach $1: /dev/nbd0 is $(blockdev --getsize64 /dev/nbd0) bytes, served by blkctl pid $(cat /sys/block/nbd0/pid)"
}

# detach_nbd N: SIGTERM blkctl; it must exit 0 and leave no device behind.
detach_nbd() {
	kill -TERM $pid
	wait $pid || fail "blkctl attach --nbd exited $? on SIGTERM: $(cat /share/attach-$1.err)"
	[ ! -e /sys/block/nbd0/pid ] || fail "/dev/nbd0 still connected after detach"
	[ "$(cat /sys/block/nbd0/size)" = 0 ] || fail "/dev/nbd0 still has $(cat /sys/block/nbd0/size) sectors after detach"
	! dmesg | grep -E 'nbd0: (shutting down sockets|Send disconnect failed)' || fail "the device was shut down, not disconnected"
	log "detach $1: blkctl exited 0, /dev/nbd0 disconnected"
}

attach_nbd 1
# Signals to blkctl while it serves I/O (SIGURG: the Go runtime's own, with
# a handler on every thread) must not reach the thread blocked in
# NBD_DO_IT, which the kernel would take as a reason to shut the device down.
fio --name=nbd4k --filename=/dev/nbd0 --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
	--iodepth=16 --size=16M --verify=crc32c --do_verify=1 --verify_fatal=1 \
	--output-format=json --output=/share/fio-nbd4k.json &
fio=$!
i=0
while [ $i -lt 4000 ] && kill -0 $fio 2>/dev/null; do
	kill -URG $pid; kill -URG $pid; kill -URG $pid; kill -URG $pid
	i=$((i + 4))
done
log "$i SIGURGs sent to blkctl during fio"
wait $fio || fail "fio 4k on nbd"
fio --name=nbd128k --filename=/dev/nbd0 --ioengine=libaio --direct=1 --rw=write --bs=128k \
	--iodepth=4 --offset=16M --size=16M --verify=crc32c --do_verify=1 --verify_fatal=1 \
	--output-format=json --output=/share/fio-nbd128k.json || fail "fio 128k on nbd"
dd if=/dev/urandom of=/tmp/pat bs=1M count=4 2>/dev/null
dd if=/tmp/pat of=/dev/nbd0 bs=1M seek=40 oflag=direct conv=fsync 2>/dev/null || fail "pattern write"
blkdiscard -o $((48 << 20)) -l $((4 << 20)) /dev/nbd0 || log "blkdiscard refused (not fatal)"
detach_nbd 1

attach_nbd 2
dd if=/dev/nbd0 of=/tmp/back bs=1M skip=40 count=4 iflag=direct 2>/dev/null || fail "pattern read"
cmp /tmp/pat /tmp/back || fail "the pattern differs after detach and a new attach"
log "pattern read back equal through a second attach"
detach_nbd 2
no_io_errors
log "passed"
