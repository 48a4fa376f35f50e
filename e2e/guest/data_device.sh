# Scenario: the Linux nvme-tcp host, in this guest, against blkd on the
# host whose volumes live on a block device (--data-device, a loop
# device). env.sh: TCPPORT NQN HOSTNQN SEED
. /share/lib.sh
net_user
modprobe nvme-tcp

log "connect over TCP"
nvme connect -t tcp -a 10.0.2.2 -s "$TCPPORT" -n "$NQN" --hostnqn "$HOSTNQN" \
	--reconnect-delay=1 --ctrl-loss-tmo=120 || fail "nvme connect -t tcp"
ctrl=
for c in /sys/class/nvme/nvme*; do
	[ -e "$c" ] && grep -qx "$NQN" "$c/subsysnqn" && ctrl=$(basename "$c")
done
[ -n "$ctrl" ] || fail "no controller of $NQN after nvme connect"
dev=/dev/${ctrl}n1
wait_dev "$dev" 30

# verify NAME BS DEPTH OFFSET SIZE [rand]: fio writes, then checks crc32c.
verify() {
	rw=write; [ "${6:-}" = rand ] && rw=randwrite
	fio --name="$1" --filename="$dev" --ioengine=libaio --direct=1 --rw=$rw --bs="$2" \
		--iodepth="$3" --offset="$4" --size="$5" --verify=crc32c --do_verify=1 --verify_fatal=1 \
		--randseed="$SEED" --output-format=json --output="/share/fio-dev-$1.json" || fail "fio $1"
}
log "fio: 4 KiB random writes QD16 and 128 KiB sequential writes QD4, crc32c verify"
verify rand4k 4k 16 0 16M rand
verify seq128k 128k 4 16M 16M
log "ext4 on the volume: mkfs, mount, write, fsck"
mkfs.ext4 -q -F "$dev" || fail "mkfs.ext4"
mkdir -p /mnt/v
mount -t ext4 "$dev" /mnt/v || fail "mount"
dd if=/dev/urandom of=/tmp/file bs=1M count=8 2>/dev/null
cp /tmp/file /mnt/v/file
sync
umount /mnt/v || fail "umount"
fsck.ext4 -fn "$dev" >/share/fsck-dev.txt 2>&1 || fail "fsck.ext4 found problems: $(cat /share/fsck-dev.txt)"

ride_restart "$dev" "$ctrl"
mount -t ext4 -o ro "$dev" /mnt/v || fail "mount after the restart"
cmp /tmp/file /mnt/v/file || fail "the file read back after the restart differs"
umount /mnt/v
no_io_errors
nvme disconnect -n "$NQN" >/dev/null || fail "nvme disconnect"
log "passed"
