# Scenario 1: the Linux nvme-rdma host over siw, in this guest, against blkd
# on the host (10.0.2.2). env.sh: PORT NQN HOSTNQN SEED
. /share/lib.sh
net_user
siw_up
modprobe nvme-rdma

log "discover"
nvme discover -t rdma -a 10.0.2.2 -s "$PORT" --hostnqn "$HOSTNQN" -o json >/share/discover.json || fail "nvme discover"

log "connect"
nvme connect -t rdma -a 10.0.2.2 -s "$PORT" -n "$NQN" --hostnqn "$HOSTNQN" \
	--reconnect-delay=1 --ctrl-loss-tmo=120 || fail "nvme connect"
wait_dev /dev/nvme0n1 30
dev=/dev/nvme0n1
log "$(cat /sys/class/nvme/nvme0/transport) $(cat /sys/class/nvme/nvme0/address) state $(cat /sys/class/nvme/nvme0/state) queues $(ls /sys/block/nvme0n1/mq | wc -l)"

nvme list -o json >/share/list.json || fail "nvme list"
nvme id-ctrl /dev/nvme0 -o json >/share/id-ctrl.json || fail "nvme id-ctrl"
nvme id-ns $dev -o json >/share/id-ns.json || fail "nvme id-ns"
nvme smart-log /dev/nvme0 -o json >/share/smart-log.json || fail "nvme smart-log"
cat /sys/block/nvme0n1/queue/max_hw_sectors_kb >/share/max_hw_sectors_kb
cat /sys/block/nvme0n1/queue/write_zeroes_max_bytes >/share/write_zeroes_max_bytes

log "fio: 4 KiB random writes QD16 over 32 MiB, then crc32c verify"
fio --name=rand4k --filename=$dev --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
	--iodepth=16 --offset=0 --size=32M --verify=crc32c --do_verify=1 --verify_fatal=1 \
	--randseed="$SEED" --output-format=json --output=/share/fio-rand4k.json || fail "fio rand4k"
log "fio: 128 KiB sequential writes QD4 over 32 MiB, then crc32c verify"
fio --name=seq128k --filename=$dev --ioengine=libaio --direct=1 --rw=write --bs=128k \
	--iodepth=4 --offset=32M --size=32M --verify=crc32c --do_verify=1 --verify_fatal=1 \
	--output-format=json --output=/share/fio-seq128k.json || fail "fio seq128k"

log "ext4: mkfs, mount, write, fsck"
mkfs.ext4 -q -F $dev || fail "mkfs.ext4"
mkdir -p /mnt/v
mount -t ext4 $dev /mnt/v || fail "mount"
dd if=/dev/urandom of=/tmp/file bs=1M count=16 2>/dev/null
cp /tmp/file /mnt/v/file
mkdir /mnt/v/dir && for i in 1 2 3 4 5 6 7 8; do echo "file $i $SEED" >/mnt/v/dir/f$i; done
sync
umount /mnt/v || fail "umount"
fsck.ext4 -fn $dev >/share/fsck.txt 2>&1 || fail "fsck.ext4 found problems: $(cat /share/fsck.txt)"
mount -t ext4 -o ro $dev /mnt/v || fail "mount again"
cmp /tmp/file /mnt/v/file || fail "the file read back differs"
[ "$(cat /mnt/v/dir/f5)" = "file 5 $SEED" ] || fail "small file differs"
umount /mnt/v

ride_restart "$dev" nvme0
fio --name=after --filename=$dev --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
	--iodepth=8 --offset=128M --size=8M --verify=crc32c --do_verify=1 --verify_fatal=1 \
	--output-format=json --output=/share/fio-after.json || fail "fio after restart"
no_io_errors
nvme disconnect -n "$NQN" || fail "nvme disconnect"

# A second volume requires DH-HMAC-CHAP of this host. The guest's NVMe
# modules are rebuilt with CONFIG_NVME_AUTH (prepare.sh); its built-in
# crypto has no RFC 7919 groups, so blkd runs with --dhchap-dhgroups null.
authctrl() { # the controller of $AUTHNQN, if any
	for c in /sys/class/nvme/nvme*; do
		[ -e "$c" ] && grep -qx "$AUTHNQN" "$c/subsysnqn" && basename "$c"
	done
	true
}
authconnect() { # authconnect NAME ARGS...: nvme connect to $AUTHNQN, output kept
	name=$1; shift
	nvme connect -t rdma -a 10.0.2.2 -s "$PORT" -n "$AUTHNQN" --hostnqn "$HOSTNQN" "$@" >/share/auth-$name.txt 2>&1
}
for mode in host bidirectional; do
	log "DH-HMAC-CHAP ($mode): connect with the right secrets, fio crc32c verify"
	if [ $mode = host ]; then
		authconnect ok-$mode --dhchap-secret="$AUTHSECRET" || fail "nvme connect --dhchap-secret: $(cat /share/auth-ok-$mode.txt)"
	else
		authconnect ok-$mode --dhchap-secret="$AUTHSECRET" --dhchap-ctrl-secret="$AUTHCTRLSECRET" ||
			fail "nvme connect --dhchap-secret --dhchap-ctrl-secret: $(cat /share/auth-ok-$mode.txt)"
	fi
	c=$(authctrl)
	[ -n "$c" ] || fail "no controller of $AUTHNQN after the connect"
	wait_dev "/dev/${c}n1" 30
	fio --name=auth-$mode --filename="/dev/${c}n1" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
		--iodepth=8 --size=8M --verify=crc32c --do_verify=1 --verify_fatal=1 --randseed="$SEED" \
		--output-format=json --output=/share/fio-auth-$mode.json || fail "fio on the authenticated volume ($mode)"
	nvme disconnect -n "$AUTHNQN" >/dev/null || fail "nvme disconnect $AUTHNQN"
done
dmesg | grep -iE 'authenticat' >/share/auth-dmesg-ok.txt || true

log "DH-HMAC-CHAP: a wrong secret, no secret, a wrong controller secret: each refused"
authconnect wrong --dhchap-secret="$WRONGSECRET" && fail "connected with a wrong secret"
authconnect none && fail "connected without a secret"
authconnect wrongctrl --dhchap-secret="$AUTHSECRET" --dhchap-ctrl-secret="$WRONGSECRET" && fail "accepted a controller that does not hold the controller secret"
[ -z "$(authctrl)" ] || fail "a controller of a refused connect remains: $(authctrl)"
dmesg | grep -iE 'authenticat|dhchap|no key' >/share/auth-dmesg.txt || true
no_io_errors
log "passed"
