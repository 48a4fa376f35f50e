# Scenario: the Linux nvme-tcp host, in this guest, against blkd's NVMe/TCP
# port on the host (10.0.2.2) — no RDMA anywhere. env.sh: TCPPORT
# DISCPORT (blkd's discovery-only port) NQN HOSTNQN SEED
. /share/lib.sh
net_user
modprobe nvme-tcp

log "discover over TCP"
nvme discover -t tcp -a 10.0.2.2 -s "$TCPPORT" --hostnqn "$HOSTNQN" -o json >/share/discover-tcp.json || fail "nvme discover -t tcp"
log "discover through the discovery-only port"
nvme discover -t tcp -a 10.0.2.2 -s "$DISCPORT" --hostnqn "$HOSTNQN" -o json >/share/discover-disc.json || fail "nvme discover -t tcp -s DISCPORT"

# tcpctrl: the controller of $NQN, if any.
tcpctrl() {
	for c in /sys/class/nvme/nvme*; do
		[ -e "$c" ] && grep -qx "$NQN" "$c/subsysnqn" && basename "$c"
	done
	true
}
# connect ARGS...: nvme connect over TCP to $NQN; sets $ctrl and $dev.
connect() {
	nvme connect -t tcp -a 10.0.2.2 -s "$TCPPORT" -n "$NQN" --hostnqn "$HOSTNQN" \
		--reconnect-delay=1 --ctrl-loss-tmo=120 "$@" || fail "nvme connect -t tcp $*"
	ctrl=$(tcpctrl)
	[ -n "$ctrl" ] || fail "no controller of $NQN after nvme connect -t tcp $*"
	dev=/dev/${ctrl}n1
	wait_dev "$dev" 30
	log "$(cat /sys/class/nvme/$ctrl/transport) $(cat /sys/class/nvme/$ctrl/address) state $(cat /sys/class/nvme/$ctrl/state) queues $(ls /sys/block/${ctrl}n1/mq | wc -l)"
}
# verify NAME BS DEPTH OFFSET SIZE [rand]: fio writes, then checks crc32c.
verify() {
	rw=write; [ "${6:-}" = rand ] && rw=randwrite
	fio --name="$1" --filename="$dev" --ioengine=libaio --direct=1 --rw=$rw --bs="$2" \
		--iodepth="$3" --offset="$4" --size="$5" --verify=crc32c --do_verify=1 --verify_fatal=1 \
		--randseed="$SEED" --output-format=json --output="/share/fio-tcp-$1.json" || fail "fio $1"
}

log "connect over TCP, no digests"
connect
nvme id-ctrl "/dev/$ctrl" -o json >/share/id-ctrl-tcp.json || fail "nvme id-ctrl"
cat /sys/block/${ctrl}n1/queue/max_hw_sectors_kb >/share/tcp_max_hw_sectors_kb
log "fio: 4 KiB random writes QD16 and 128 KiB sequential writes QD4, crc32c verify"
verify rand4k 4k 16 0 32M rand
verify seq128k 128k 4 32M 32M
log "ext4: mkfs, mount, write, fsck"
mkfs.ext4 -q -F "$dev" || fail "mkfs.ext4"
mkdir -p /mnt/v
mount -t ext4 "$dev" /mnt/v || fail "mount"
dd if=/dev/urandom of=/tmp/file bs=1M count=16 2>/dev/null
cp /tmp/file /mnt/v/file
sync
umount /mnt/v || fail "umount"
fsck.ext4 -fn "$dev" >/share/fsck-tcp.txt 2>&1 || fail "fsck.ext4 found problems: $(cat /share/fsck-tcp.txt)"
mount -t ext4 -o ro "$dev" /mnt/v || fail "mount again"
cmp /tmp/file /mnt/v/file || fail "the file read back differs"
umount /mnt/v
nvme disconnect -n "$NQN" >/dev/null || fail "nvme disconnect"

log "connect over TCP with header and data digests (-g -G)"
connect -g -G
verify digest4k 4k 16 64M 16M rand
verify digest128k 128k 4 80M 16M

ride_restart "$dev" "$ctrl"
verify after 4k 8 128M 8M rand
no_io_errors
nvme disconnect -n "$NQN" >/dev/null || fail "nvme disconnect"
log "passed"
