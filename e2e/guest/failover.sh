# Scenarios 1 and 3 of the replication issue: the Linux nvme-tcp host with
# native multipath, in this guest, against a 3-node blkd cluster on the
# host (10.0.2.2), a 3-replica volume exported by every node (optimized on
# the primary, inaccessible elsewhere). connect-all through one node's
# discovery log; fio writes and verifies through the head while the test
# kills the primary (SIGKILL), then stops the next one (SIGSTOP).
# env.sh: DISC PORTS NQN HOSTNQN PRIMARY
. /share/lib.sh
net_user
modprobe nvme-tcp

[ "$(cat /sys/module/nvme_core/parameters/multipath)" = Y ] || fail "no native multipath"

# The host's timers (docs/replication.md §4): keep-alive 5 s (default),
# reconnect every 2 s, never give a path up (ctrl-loss-tmo -1: a dead
# node's path is kept for the day it returns).
log "discover through port $DISC; connect-all"
nvme discover -t tcp -a 10.0.2.2 -s "$DISC" --hostnqn "$HOSTNQN" -o json >/share/discover.json || fail "nvme discover"
nvme connect-all -t tcp -a 10.0.2.2 -s "$DISC" --hostnqn "$HOSTNQN" \
	--reconnect-delay=2 --ctrl-loss-tmo=-1 || fail "nvme connect-all"

wait_ctrls 3 three
subs=
for s in /sys/class/nvme-subsystem/nvme-subsys*; do
	grep -qx "$NQN" "$s/subsysnqn" && subs="$subs $(basename "$s")"
done
set -- $subs
[ $# -eq 1 ] || fail "subsystems of $NQN: '$subs', want one"
heads=$(cd /sys/class/nvme-subsystem/$1 && ls -d nvme*n* 2>/dev/null | grep -v c || true)
[ "$(echo $heads | wc -w)" -eq 1 ] || fail "namespace heads: '$heads', want one"
dev=/dev/$heads
wait_dev "$dev" 30

# paths FILE: each path's controller, port, CNTLID, state and ANA state.
paths() {
	for p in $PORTS; do
		c=$(ctrl_of "$p")
		echo "$c trsvcid=$p cntlid=$(cat /sys/class/nvme/$c/cntlid) state=$(cat /sys/class/nvme/$c/state) ana_state=$(path_state $c)"
	done >"/share/$1"
	log "$(tr '\n' ';' <"/share/$1")"
}
# wait_optimized PORT SECONDS: until PORT's path is the one optimized
# path, the others inaccessible and every controller live.
wait_optimized() {
	n=0
	while :; do
		ok=1
		for p in $PORTS; do
			c=$(ctrl_of "$p")
			want=inaccessible
			[ "$p" = "$1" ] && want=optimized
			[ "$(path_state $c)" = $want ] && [ "$(cat /sys/class/nvme/$c/state)" = live ] || ok=0
		done
		[ $ok = 1 ] && break
		n=$((n + 1))
		[ $n -le $(($2 * 10)) ] || { paths paths-timeout.txt; fail "path $1 not the optimized one after $2 s"; }
		sleep 0.1
	done
}
wait_optimized "$PRIMARY" 30
paths paths-before.txt

# fiojob NAME OFFSET SIZE ARGS...: 4 KiB random writes QD8 with crc32c
# verify; the report in /share/fio-NAME.json.
fiojob() {
	out=$1 off=$2 size=$3
	shift 3
	fio --name="$out" --filename="$dev" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
		--iodepth=8 --offset="$off" --size="$size" --verify=crc32c --do_verify=1 --verify_fatal=1 \
		--output-format=json --output="/share/fio-$out.json" "$@"
}
dd if=/dev/urandom of=/share/pattern.bin bs=1M count=4 2>/dev/null
dd if=/share/pattern.bin of="$dev" bs=1M seek=100 oflag=direct conv=fsync 2>/dev/null || fail "writing the pattern"
fiojob before 0 8M || fail "fio before"

# during STEP NAME OFFSET: fio runs while the test fails the primary over
# (fio-running-STEP, switched-STEP); it must pass across it.
during() {
	log "step $1: fio while the test fails the primary over"
	fiojob "$2" "$3" 24M &
	fio=$!
	sleep 3
	kill -0 $fio 2>/dev/null || fail "step $1: fio ended before the failover: make it longer"
	mark "fio-running-$1"
	wait_file "/share/switched-$1" 120
	wait $fio || fail "step $1: fio across the failover failed"
}
optimized_port() {
	for p in $PORTS; do
		[ "$(path_state "$(ctrl_of "$p")")" = optimized ] && echo "$p"
	done
}

during 1 kill 16M
wait_file /share/rebuilt-1 300
# The killed node's path is back (reconnected by the host), inaccessible.
wait_optimized "$(optimized_port)" 60
paths paths-after-kill.txt

during 2 stop 48M
wait_file /share/rebuilt-2 300
wait_optimized "$(optimized_port)" 60
paths paths-after-stop.txt

# A secondary's node killed for good and its replica replaced elsewhere
# (the test marks switched-3 once the new one is in sync): its path stays
# (reconnecting), the others serve.
during 3 replace 72M

log "after both failovers: every job's data and the pattern read back"
fiojob before 0 8M --verify_only=1 || fail "fio before: data lost"
fiojob kill 16M 24M --verify_only=1 || fail "fio kill: data lost"
fiojob stop 48M 24M --verify_only=1 || fail "fio stop: data lost"
fiojob replace 72M 24M --verify_only=1 || fail "fio replace: data lost"
dd if="$dev" of=/tmp/back bs=1M skip=100 count=4 iflag=direct 2>/dev/null || fail "reading the pattern back"
cmp /share/pattern.bin /tmp/back || fail "the pattern differs"
fiojob after 120M 8M || fail "fio after"
no_io_errors
nvme disconnect -n "$NQN" >/dev/null || fail "nvme disconnect"
log "passed"
