# Scenario: the Linux nvme-tcp host with native multipath, in this guest,
# against two blk targets run by the test process on the host (10.0.2.2):
# the same subsystem NQN on two ports, ANA on, one namespace each over one
# shared backing store; path A optimized, B inaccessible, until the test
# flips them under fio. env.sh: PORTA PORTB NQN HOSTNQN HOSTID SEED
. /share/lib.sh
net_user
modprobe nvme-tcp

mp=$(cat /sys/module/nvme_core/parameters/multipath)
echo "$mp" >/share/multipath-param
[ "$mp" = Y ] || fail "nvme_core.multipath is $mp: no native multipath"
# The host's ANA updates are dev_dbg lines ("ANA group 1: optimized."):
# turn them on for multipath.c.
dyndbg=/proc/dynamic_debug/control
[ -w $dyndbg ] || { mount -t debugfs none /sys/kernel/debug 2>/dev/null; dyndbg=/sys/kernel/debug/dynamic_debug/control; }
echo 'module nvme_core func nvme_update_ana_state +p' >$dyndbg || fail "enabling multipath.c's debug lines through $dyndbg"
grep nvme_update_ana_state $dyndbg >/share/dyndbg.txt || fail "no nvme_update_ana_state in $dyndbg"

log "discover through path A; connect-all (path B comes from A's discovery log)"
nvme discover -t tcp -a 10.0.2.2 -s "$PORTA" --hostnqn "$HOSTNQN" --hostid "$HOSTID" -o json >/share/discover.json || fail "nvme discover"
nvme connect-all -t tcp -a 10.0.2.2 -s "$PORTA" --hostnqn "$HOSTNQN" --hostid "$HOSTID" \
	--reconnect-delay=1 --ctrl-loss-tmo=60 || fail "nvme connect-all"

wait_ctrls 2 two
ca=$(ctrl_of "$PORTA")
cb=$(ctrl_of "$PORTB")
[ -n "$ca" ] && [ -n "$cb" ] || fail "controllers of path A ($ca) and B ($cb) not found"

# One subsystem holding both controllers, one namespace head.
subs=
for s in /sys/class/nvme-subsystem/nvme-subsys*; do
	grep -qx "$NQN" "$s/subsysnqn" && subs="$subs $(basename "$s")"
done
set -- $subs
[ $# -eq 1 ] || fail "subsystems of $NQN: '$subs', want one"
sub=$1
ls /sys/class/nvme-subsystem/$sub >/share/subsys-entries.txt
[ -e /sys/class/nvme-subsystem/$sub/$ca ] && [ -e /sys/class/nvme-subsystem/$sub/$cb ] ||
	fail "$ca and $cb not both in $sub: $(ls /sys/class/nvme-subsystem/$sub | tr '\n' ' ')"
heads=$(cd /sys/class/nvme-subsystem/$sub && ls -d nvme*n* 2>/dev/null | grep -v c || true)
[ "$(echo $heads | wc -w)" -eq 1 ] || fail "namespace heads of $sub: '$heads', want one"
dev=/dev/$heads
wait_dev "$dev" 30

# wait_states A B SECONDS: until path A's state is A and B's is B.
wait_states() {
	n=0
	until [ "$(path_state $ca)" = "$1" ] && [ "$(path_state $cb)" = "$2" ]; do
		n=$((n + 1))
		[ $n -le $(($3 * 10)) ] || fail "paths A $ca '$(path_state $ca)' B $cb '$(path_state $cb)' after $3 s, want $1 and $2"
		sleep 0.1
	done
}
# paths FILE: each path's controller, port, CNTLID, state and ANA state.
paths() {
	for c in $ca $cb; do
		echo "$c $(cat /sys/class/nvme/$c/address | tr ',' ' ' | grep -o 'trsvcid=[0-9]*') cntlid=$(cat /sys/class/nvme/$c/cntlid) state=$(cat /sys/class/nvme/$c/state) ana_state=$(path_state $c)"
	done >"/share/$1"
	log "$(tr '\n' ';' <"/share/$1")"
}
wait_states optimized inaccessible 30
paths paths-before.txt

# Path A's controller stops sending ANA change notices (Asynchronous
# Event Configuration, feature 0Bh, bit 11 cleared): the host learns of
# A's fencing only from the status of the I/O A refuses, and must fail
# it over itself (nvme_failover_req). B keeps its notices: its promotion
# is announced.
aec=$(nvme get-feature "/dev/$ca" -f 0x0b | sed -n 's/.*Current value: *\(0x[0-9a-fA-F]*\).*/\1/p')
[ -n "$aec" ] && [ $((aec & 0x800)) -ne 0 ] || fail "path A's Asynchronous Event Configuration '$aec': ANA change notices not enabled by the host"
nvme set-feature "/dev/$ca" -f 0x0b -v $((aec & ~0x800)) >/dev/null || fail "clearing path A's ANA change notices"
echo "aec=$aec now=$(nvme get-feature "/dev/$ca" -f 0x0b | sed -n 's/.*Current value: *//p')" >/share/aec-a.txt
log "path A's Asynchronous Event Configuration: $(cat /share/aec-a.txt)"
nvme list-subsys -o json >/share/list-subsys.json 2>&1 || true

log "through the head $dev (path A): a pattern, then fio with crc32c verify"
dd if=/dev/urandom of=/share/pattern.bin bs=1M count=4 2>/dev/null
dd if=/share/pattern.bin of="$dev" bs=1M seek=8 oflag=direct conv=fsync 2>/dev/null || fail "writing the pattern"
# fiojob NAME OFFSET ARGS...: 4 KiB random writes QD8 over 4 MiB at
# OFFSET, crc32c verify; the report in /share/fio-NAME.json. The seed and
# the job's name stay the same, so a --verify_only job checks another's.
fiojob() {
	out=$1 off=$2
	shift 2
	fio --name=mp --filename="$dev" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
		--iodepth=8 --offset="$off" --size=4M --verify=crc32c --do_verify=1 --verify_fatal=1 \
		--randseed="$SEED" --output-format=json --output="/share/fio-$out.json" "$@"
}
fiojob before 16M || fail "fio before"

# pstat CTRL: the writes completed through CTRL's path (the head keeps
# no I/O counts in this kernel; the path disks do).
pstat() { awk '{print $5}' /sys/class/nvme/$1/nvme*c*n1/stat; }
# flip STEP CTRL NAME OFFSET [SIZE]: fio job NAME (SIZE, 16 MiB, of 4 KiB
# random writes at OFFSET, then its verify: seconds long) runs through CTRL's path
# while the test flips the states, or restarts a target
# (fio-running-STEP, flipped-STEP); it must pass across it (the caller
# waits for $fio).
flip() {
	log "flip $1: fio through $2 while the test flips the paths"
	stat0=$(pstat "$2")
	fiojob "$3" "$4" --size="${5:-16M}" &
	fio=$!
	n=0
	until [ "$(pstat "$2")" -gt $((stat0 + 50)) ]; do
		n=$((n + 1))
		[ $n -le 300 ] || fail "flip $1: fio did not start writing through $2 within 30 s"
		sleep 0.1
	done
	mark "fio-running-$1"
	wait_file "/share/flipped-$1" 60
	kill -0 $fio 2>/dev/null || fail "flip $1: fio ended before the flip: make it longer"
}

flip 1 "$ca" flip 32M
wait_states inaccessible optimized 30
paths paths-flip.txt
wait $fio || fail "fio across flip 1 failed"

log "after flip 1 (path B): the pattern and the first fio's data read back"
dd if="$dev" of=/tmp/back bs=1M skip=8 count=4 iflag=direct 2>/dev/null || fail "reading the pattern back"
cmp /share/pattern.bin /tmp/back || fail "the pattern read through path B differs"
fiojob before-again 16M --verify_only=1 || fail "the first fio's data did not verify through path B"
mark flip-1-done

# Failback with A's notices on again: both changes announced.
nvme set-feature "/dev/$ca" -f 0x0b -v $((aec)) >/dev/null || fail "restoring path A's ANA change notices"
flip 2 "$cb" failback 48M
wait_states optimized inaccessible 30
paths paths-failback.txt
wait $fio || fail "fio across flip 2 failed"
log "after flip 2 (path A): flip 1's data, written through A and B, verified through A"
fiojob flip-again 32M --size=16M --verify_only=1 || fail "flip 1's fio data did not verify through path A"
mark flip-2-done

# B restarted under fio on A (the test marks flipped-3 once it listens
# again): the host reconnects by itself and keeps B inaccessible.
flip 3 "$ca" restart 48M 8M
n=0
until dmesg | grep -q "$cb: Successfully reconnected"; do
	n=$((n + 1))
	[ $n -le 300 ] || fail "$cb did not reconnect to the restarted B within 30 s"
	sleep 0.1
done
dmesg | grep -E "$cb: (Successfully reconnected|reconnect|starting error recovery)" | tail -3
until [ "$(cat /sys/class/nvme/$cb/state)" = live ]; do
	n=$((n + 1))
	[ $n -le 600 ] || fail "$cb not live again after the restart"
	sleep 0.1
done
wait_states optimized inaccessible 30
paths paths-restart.txt
wait $fio || fail "fio across B's restart failed"
no_io_errors
nvme disconnect -n "$NQN" >/dev/null || fail "nvme disconnect"
log "passed"
