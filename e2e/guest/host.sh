# The host guest of the verbs scenarios, on the link (192.168.77.2) with
# DEVKIND (rxe, siw, none): TASKS is a list of
#   kernel  the Linux nvme-rdma host: discover, connect to v1, fio crc32c
#           verify, mkfs.ext4 + fsck, disconnect
#   verify  blkverify (blk's initiator on PROVIDER) against VERIFYSUB
# env.sh: H_DEVKIND H_PROVIDER TASKS HOSTNQN VERIFYNQN VERIFYSUB KERNELSUB SEED
. /share/lib.sh
DEVKIND=$H_DEVKIND PROVIDER=${H_PROVIDER:-soft}
net_link
rdma_up "$DEVKIND" eth1
wait_file /share/storage-ready 300
for task in $TASKS; do
	case $task in
	kernel)
		modprobe nvme-rdma
		nvme discover -t rdma -a 192.168.77.1 -s 4420 --hostnqn "$HOSTNQN" -o json >/share/discover.json || fail "nvme discover"
		grep -q "$KERNELSUB" /share/discover.json || fail "discovery log lacks $KERNELSUB"
		nvme connect -t rdma -a 192.168.77.1 -s 4420 -n "$KERNELSUB" --hostnqn "$HOSTNQN" || fail "nvme connect"
		wait_dev /dev/nvme0n1 30
		nvme id-ctrl /dev/nvme0 -o json >/share/id-ctrl.json || fail "id-ctrl"
		fio --name=rand4k --filename=/dev/nvme0n1 --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
			--iodepth=16 --size=32M --verify=crc32c --do_verify=1 --verify_fatal=1 \
			--output-format=json --output=/share/fio-kernel.json || fail "fio"
		mkfs.ext4 -q -F /dev/nvme0n1 || fail "mkfs.ext4"
		mkdir -p /mnt/v && mount -t ext4 /dev/nvme0n1 /mnt/v || fail "mount"
		dd if=/dev/urandom of=/tmp/f bs=1M count=8 2>/dev/null && cp /tmp/f /mnt/v/f && umount /mnt/v
		fsck.ext4 -fn /dev/nvme0n1 >/share/fsck.txt 2>&1 || fail "fsck: $(cat /share/fsck.txt)"
		mount -t ext4 -o ro /dev/nvme0n1 /mnt/v && cmp /tmp/f /mnt/v/f || fail "file differs"
		umount /mnt/v
		nvme disconnect -n "$KERNELSUB" || fail "nvme disconnect"
		log "kernel host: fio verify, ext4 and fsck passed"
		;;
	verify)
		dev=
		[ "$PROVIDER" = verbs ] && dev="-device ${DEVKIND}0"
		# shellcheck disable=SC2086
		/share/blkverify -addr 192.168.77.1:4420 -nqn "$VERIFYSUB" -hostnqn "$VERIFYNQN" \
			-provider "$PROVIDER" $dev -seed "$SEED" -mib 16 -rounds 3 >/share/verify.out 2>&1 ||
			fail "blkverify: $(tail -3 /share/verify.out)"
		cat /share/verify.out
		;;
	*) fail "task $task" ;;
	esac
done
no_io_errors
mark host-done
log "passed"
