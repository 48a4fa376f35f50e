# Issue 25's discovery scenario: the Linux nvme-tcp host runs nvme
# connect-all through one node's port of a 3-node blkd cluster whose
# three volumes live on three different nodes; it must connect all
# three, and fio writes and verifies on each.
# env.sh: DISC NQNS HOSTNQN
. /share/lib.sh
net_user
modprobe nvme-tcp

nvme discover -t tcp -a 10.0.2.2 -s "$DISC" --hostnqn "$HOSTNQN" -o json >/share/discover.json || fail "nvme discover"
nvme connect-all -t tcp -a 10.0.2.2 -s "$DISC" --hostnqn "$HOSTNQN" || fail "nvme connect-all"

i=0
for nqn in $NQNS; do
	n=0 sub=
	while [ -z "$sub" ]; do
		for s in /sys/class/nvme-subsystem/nvme-subsys*; do
			[ -e "$s/subsysnqn" ] && grep -qx "$nqn" "$s/subsysnqn" && sub=$(basename "$s")
		done
		n=$((n + 1))
		[ -n "$sub" ] || [ $n -le 300 ] || fail "connect-all did not connect $nqn: $(cat /sys/class/nvme-subsystem/*/subsysnqn | tr '\n' ' ')"
		[ -n "$sub" ] || sleep 0.1
	done
	head=$(cd /sys/class/nvme-subsystem/$sub && ls -d nvme*n* 2>/dev/null | grep -v c || true)
	wait_dev "/dev/$head" 30
	log "$nqn connected as /dev/$head"
	fio --name="vol$i" --filename="/dev/$head" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
		--iodepth=8 --size=8M --verify=crc32c --do_verify=1 --verify_fatal=1 \
		--output-format=json --output="/share/fio-$i.json" || fail "fio on $nqn"
	i=$((i + 1))
done
no_io_errors
for nqn in $NQNS; do
	nvme disconnect -n "$nqn" >/dev/null || fail "nvme disconnect $nqn"
done
log "passed"
