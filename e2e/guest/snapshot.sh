# Scenario: snapshots and clones under the Linux nvme-tcp host (this
# guest) against blkd on the host (10.0.2.2). env.sh: TCPPORT NQN HOSTNQN
# SEED; the clone's NQN arrives in /share/clone-nqn once the host made it.
. /share/lib.sh
net_user
modprobe nvme-tcp

# ctrl_for NQN: the controller of subsystem NQN, if any.
ctrl_for() {
	for c in /sys/class/nvme/nvme*; do
		[ -e "$c/subsysnqn" ] && grep -qx "$1" "$c/subsysnqn" && basename "$c"
	done
	true
}
# attach NQN: connect over TCP; prints the namespace's device.
attach() {
	nvme connect -t tcp -a 10.0.2.2 -s "$TCPPORT" -n "$1" --hostnqn "$HOSTNQN" >/dev/null || fail "nvme connect $1"
	c=$(ctrl_for "$1")
	[ -n "$c" ] || fail "no controller of $1 after nvme connect"
	wait_dev "/dev/${c}n1" 30
	echo "/dev/${c}n1"
}

log "volume v: ext4 and a tree of files"
vdev=$(attach "$NQN")
mkfs.ext4 -q -F "$vdev" || fail "mkfs.ext4 v"
mkdir -p /mnt/v /mnt/c
mount -t ext4 "$vdev" /mnt/v || fail "mount v"
mkdir -p /mnt/v/tree/a /mnt/v/tree/b
i=1
while [ $i -le 24 ]; do
	# Seeded sizes from 1 KiB to about 1.5 MiB.
	kib=$(( (SEED * i * 7919) % 1500 + 1 ))
	d=a; [ $((i % 2)) -eq 0 ] && d=b
	head -c $((kib * 1024)) /dev/urandom >"/mnt/v/tree/$d/f$i"
	i=$((i + 1))
done
(cd /mnt/v && find tree -type f | sort | xargs sha256sum) >/tmp/sums
cp /tmp/sums /share/sums.txt
sync

log "fio: 4 KiB random writes into another file of v, QD16, 30 s; the snapshot is taken at 10 s"
fio --name=busy --filename=/mnt/v/busy --size=64M --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
	--iodepth=16 --time_based --runtime=30 --randseed="$SEED" --output-format=json --output=/share/fio-snap-busy.json &
fio=$!
sleep 10
mark ready-snap
wait_file /share/snapped 180
CNQN=$(cat /share/clone-nqn)

log "clone c1 of v@s1: mount read-write (the journal replays a crash state), files as before the snapshot"
cdev=$(attach "$CNQN")
mount -t ext4 "$cdev" /mnt/c || fail "mount the clone"
(cd /mnt/c && sha256sum -c -s /tmp/sums) || fail "the clone's files differ from what was written before the snapshot"
head -c 3145728 /dev/urandom >/mnt/c/tree/new
sha256sum /mnt/c/tree/new | sed 's| /mnt/c/| |' >/tmp/newsum
sync
umount /mnt/c || fail "umount the clone"
e2fsck -fn "$cdev" >/share/fsck-clone.txt 2>&1 || fail "e2fsck of the clone: $(tail -5 /share/fsck-clone.txt)"

wait $fio || fail "fio on v"
umount /mnt/v || fail "umount v"
e2fsck -fn "$vdev" >/share/fsck-v.txt 2>&1 || fail "e2fsck of v: $(tail -5 /share/fsck-v.txt)"
mount -t ext4 -o ro "$vdev" /mnt/v || fail "mount v again"
(cd /mnt/v && sha256sum -c -s /tmp/sums) || fail "v's files of before the snapshot changed"
[ ! -e /mnt/v/tree/new ] || fail "the clone's new file shows in v"
umount /mnt/v

mark ready-flatten
wait_file /share/flattened 300
log "after the flatten and the snapshot's deletion: the clone reads the same"
e2fsck -fn "$cdev" >/share/fsck-clone2.txt 2>&1 || fail "e2fsck of the flat clone: $(tail -5 /share/fsck-clone2.txt)"
mount -t ext4 -o ro "$cdev" /mnt/c || fail "mount the flat clone"
(cd /mnt/c && sha256sum -c -s /tmp/sums) || fail "the flat clone's files differ"
(cd /mnt/c && sha256sum -c -s /tmp/newsum) || fail "the flat clone's own file differs"
umount /mnt/c
e2fsck -fn "$vdev" >/share/fsck-v2.txt 2>&1 || fail "e2fsck of v after the snapshot's deletion"
no_io_errors
nvme disconnect -n "$NQN" >/dev/null
nvme disconnect -n "$CNQN" >/dev/null
log "passed"
