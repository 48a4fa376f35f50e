# Issue 25's reservations scenario: two guests (resv1, resv2), each the
# Linux nvme-tcp host with native multipath and its own host ID, share a
# 3-replica volume of a 3-node blkd cluster on the host (10.0.2.2). Both
# run this script; the guest's name is its role. nvme-cli sends the
# reservation commands; dd with O_DIRECT checks what each host may do.
# The test kills the primary (failover) and then the whole cluster
# between the steps (marks switched, restarted).
# env.sh: DISC PORTS NQN HOSTID_resv1 HOSTID_resv2
. /share/lib.sh
net_user
modprobe nvme-tcp
[ "$(cat /sys/module/nvme_core/parameters/multipath)" = Y ] || fail "no native multipath"

me=$(hostname)
case $me in
resv1) key=161 peer=resv2 hostid=$HOSTID_resv1 ;; # 0xa1
resv2) key=178 peer=resv1 hostid=$HOSTID_resv2 ;; # 0xb2
*) fail "unknown role $me" ;;
esac
hostnqn="nqn.2014-08.org.nvmexpress:uuid:$hostid"

log "connect-all through port $DISC as $hostnqn"
nvme connect-all -t tcp -a 10.0.2.2 -s "$DISC" --hostnqn "$hostnqn" --hostid "$hostid" \
	--reconnect-delay=2 --ctrl-loss-tmo=-1 || fail "nvme connect-all"
wait_ctrls 3 three
sub=
for s in /sys/class/nvme-subsystem/nvme-subsys*; do
	grep -qx "$NQN" "$s/subsysnqn" && sub=$(basename "$s")
done
head=$(cd /sys/class/nvme-subsystem/$sub && ls -d nvme*n* 2>/dev/null | grep -v c || true)
dev=/dev/$head
wait_dev "$dev" 30

# optimized: wait until one path is optimized and live (after a failover
# or the cluster's restart).
optimized() {
	n=0
	while :; do
		for p in $PORTS; do
			c=$(ctrl_of "$p")
			[ -n "$c" ] && [ "$(path_state $c)" = optimized ] && [ "$(cat /sys/class/nvme/$c/state)" = live ] && return 0
		done
		n=$((n + 1))
		[ $n -le 1200 ] || fail "no optimized live path after 120 s"
		sleep 0.1
	done
}
# report STEP: the Reservation Status (128-bit host IDs) as JSON.
report() {
	nvme resv-report "$dev" -n 1 --eds -o json >"/share/report-$me-$1.json" || fail "resv-report at step $1"
	log "report $1: $(tr -d ' \n' <"/share/report-$me-$1.json")"
}
# write_block FILE: 4 KiB of FILE to block 0, O_DIRECT; read_block FILE:
# block 0 into FILE.
write_block() { dd if="$1" of="$dev" bs=4096 count=1 oflag=direct 2>/tmp/dd.err; }
read_block() { dd if="$dev" of="$1" bs=4096 count=1 iflag=direct 2>/dev/null || fail "reading block 0"; }
# refused STEP: this host's write must fail, its read must succeed and
# return the holder's block.
refused() {
	dd if=/dev/urandom of=/tmp/mine bs=4096 count=1 2>/dev/null
	if write_block /tmp/mine; then
		fail "step $1: the write of a host the reservation excludes succeeded"
	fi
	log "step $1: write refused as it must be: $(tail -1 /tmp/dd.err)"
	read_block /tmp/got
	cmp -s /tmp/got "$2" || fail "step $1: block 0 is not the holder's data"
}
# holds WHO WHAT: as the holder, write a new random block (kept as
# /share/block-WHO) and read it back; WHAT names the holder in failures.
holds() {
	dd if=/dev/urandom of=/share/block-$1 bs=4096 count=1 2>/dev/null
	write_block /share/block-$1 || fail "$2's write failed: $(cat /tmp/dd.err)"
	read_block /tmp/got
	cmp -s /tmp/got /share/block-$1 || fail "$2 reads back another block"
}

# Step 1: both register (resv1 first, for a stable registrant order),
# resv1 acquires Write Exclusive and writes; resv2 is refused writes and
# reads resv1's block.
[ $me = resv2 ] && wait_file /share/registered-resv1 300
nvme resv-register "$dev" -n 1 --nrkey=$key --rrega=0 --cptpl=3 || fail "resv-register"
mark "registered-$me"
if [ $me = resv1 ]; then
	wait_file /share/registered-resv2 300
	nvme resv-acquire "$dev" -n 1 --crkey=$key --rtype=1 --racqa=0 || fail "resv-acquire"
	holds resv1 "the holder"
	mark acquired
else
	wait_file /share/acquired 300
	refused 1 /share/block-resv1
fi
report 1
mark "checked-1-$me"

# Step 2: after a failover to another replica, the same state.
wait_file /share/switched 300
optimized
report 2
[ $me = resv2 ] && refused 2 /share/block-resv1
mark "checked-2-$me"

# Step 3: after the whole cluster's restart, the same state.
wait_file /share/restarted 300
optimized
report 3
[ $me = resv2 ] && refused 3 /share/block-resv1
mark "checked-3-$me"

# Step 4: resv2 preempts resv1 and aborts its commands: resv2 writes,
# resv1 is refused and no longer registered.
if [ $me = resv2 ]; then
	wait_file /share/checked-3-resv1 300
	nvme resv-acquire "$dev" -n 1 --crkey=$key --prkey=161 --rtype=1 --racqa=2 || fail "preempt-and-abort"
	holds resv2 "the new holder"
	mark preempted
else
	wait_file /share/preempted 300
	refused 4 /share/block-resv2
	# Its key is gone: a register with the old key as the current one is
	# a conflict.
	if nvme resv-register "$dev" -n 1 --crkey=$key --nrkey=$key --rrega=2 2>/dev/null; then
		fail "replace with the preempted key succeeded"
	fi
fi
report 4
mark "checked-4-$me"
wait_file "/share/checked-4-$peer" 300
# The refused writes are the only errors: 6.1 logs each as "I/O Cmd(0x1)
# ... (sct 0x0 / sc 0x83) DNR" (Reservation Conflict, unnamed there) and
# "critical nexus error ... op 0x1:(WRITE)".
if dmesg | grep -Ei 'I/O error|blk_update_request|Buffer I/O error|nexus' | grep -v -e 'op 0x1:(WRITE)' -e 'Cmd(0x1) .*(sct 0x0 / sc 0x83) DNR'; then
	fail "the kernel logged I/O errors other than the refused writes"
fi
nvme disconnect -n "$NQN" >/dev/null || fail "nvme disconnect"
log "passed"
