#!/usr/bin/env bash
# deploy/bench/spdk-compare.sh: blkd beside SPDK's nvmf_tgt, both measured by
# SPDK's spdk_nvme_perf over NVMe/TCP on loopback (issue 22's table).
#
# blkd (built from this checkout) serves a volume; nvmf_tgt serves an AIO bdev
# on a file of the same size in the same scratch directory (the same disk).
# Each target is pinned to one CPU and the client to another (taskset); the
# target not being measured is stopped (SIGSTOP) meanwhile, because both share
# that CPU and nvmf_tgt's reactor busy-polls it even with no host connected
# (before this, every blkd figure was taken beside a reactor spinning on its
# CPU). Each is written once with 128 KiB writes, then every pattern runs RUNS times,
# alternating blkd and SPDK, and the medians go into one markdown table (each
# ratio the median of the runs' ratios to the SPDK run beside them):
# throughput, mean and p99 latency, and the target's CPU time per I/O (from
# /proc/PID/stat; SPDK's reactor busy-polls, so its figure is an upper bound).
#
# Nothing of SPDK is built or kept here: point SPDK_DIR at an SPDK build
# made outside this repository (README.md's figures used v24.01, configured
# --with-dpdk against Debian's libdpdk-dev with the optional parts off;
# spdk_nvme_perf is built with the apps). Without SPDK_DIR, or with an
# incomplete build, the script says so and exits 0. It needs root only for hugepages: with
# fewer than HUGE_MB free it raises vm.nr_hugepages (and mounts hugetlbfs in
# its scratch directory when none is mounted), and puts both back on exit.
#
# Usage: SPDK_DIR=/path/to/spdk deploy/bench/spdk-compare.sh
#
# Environment (defaults in brackets):
#   SPDK_DIR          SPDK build with build/bin/nvmf_tgt, build/bin/spdk_nvme_perf, scripts/rpc.py
#   SIZE              volume and AIO file size, bytes or with KiB/MiB/GiB/TiB [1GiB]
#   SPDK_BDEV         aio: SPDK serves a file in the scratch directory (the disk, opened
#                     O_DIRECT); malloc: a RAM bdev, SPDK's ceiling, which takes the disk out
#                     of SPDK's side when other work shares it [aio]
#   RUNTIME           seconds per run [10]
#   RUNS              runs per pattern and target; the table shows medians [3]
#   PREWRITE_ROUNDS   full sequential 128 KiB write passes before measuring;
#                     more than 1 measures an overwritten volume [1]
#   ROWS              which patterns, comma-separated numbers 1-7 in table order [all]
#   TARGET_CPU        CPU of blkd and of nvmf_tgt [0]
#   CLIENT_CPU        CPU of spdk_nvme_perf [1]
#   BASE_PORT         blkd NVMe/TCP BASE_PORT, SPDK BASE_PORT+1, blkd API +2, raft +3 [24420]
#                     (below the ephemeral range, so other jobs' connections do not take them)
#   BENCH_DIR         where the scratch directory goes: the disk under test [/var/tmp]
#   OUT               the table's file [./spdk-compare-YYYYMMDDTHHMMZ.md]
#   BLK_REPO          the blk checkout whose blkd is measured [the one holding this script]
#   SUSTAIN           instead of the table: N back-to-back RUNTIME-second runs of
#                     4 KiB random writes at QD32 on each target (blkd's N, then
#                     SPDK's N), one line per run (IOPS, p99, max) and a summary:
#                     the spread of the runs around the median and the worst
#                     latencies, issue 22's "no stalls" test [0: off]
#   HUGE_MB           hugepage memory the two SPDK processes need, MiB [1024; with
#                     malloc, 1024 more than SIZE]
#
# Everything it starts (blkd, nvmf_tgt, spdk_nvme_perf) is stopped and the
# scratch directory removed on exit, error or Ctrl-C. Only loopback is used.

set -euo pipefail

say() { printf '%s spdk-compare: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { say "error: $*"; exit 1; }
skip() { say "skipped: $*"; exit 0; }

case "${1:-}" in
-h | --help)
	sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"
	exit 0
	;;
"") ;;
*) die "unexpected argument '$1': settings come from the environment (--help lists them)" ;;
esac

# --- SPDK build: skip without one ---------------------------------------------

[[ -n "${SPDK_DIR:-}" ]] || skip "SPDK_DIR is not set (an SPDK build directory with build/bin/nvmf_tgt, build/bin/spdk_nvme_perf and scripts/rpc.py)"
for f in build/bin/nvmf_tgt build/bin/spdk_nvme_perf scripts/rpc.py; do
	[[ -e "$SPDK_DIR/$f" ]] || skip "SPDK_DIR=$SPDK_DIR has no $f (build SPDK first: make in that directory)"
done
[[ -x "$SPDK_DIR/build/bin/nvmf_tgt" && -x "$SPDK_DIR/build/bin/spdk_nvme_perf" ]] || skip "SPDK_DIR=$SPDK_DIR: nvmf_tgt or spdk_nvme_perf is not executable"
for tool in go python3 taskset stdbuf ss awk; do
	command -v "$tool" >/dev/null || die "$tool is not installed"
done
TGT="$SPDK_DIR/build/bin/nvmf_tgt"
PERF="$SPDK_DIR/build/bin/spdk_nvme_perf"
RPC_PY="$SPDK_DIR/scripts/rpc.py"
export LD_LIBRARY_PATH="$SPDK_DIR/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# --- settings -----------------------------------------------------------------

to_bytes() { # 1GiB, 512MiB, 4096 -> bytes
	local v="$1" n unit
	[[ "$v" =~ ^([0-9]+)[[:space:]]*([KMGT]i?B?|B)?$ ]] || return 1
	n="${BASH_REMATCH[1]}"
	unit="${BASH_REMATCH[2]:-B}"
	case "${unit:0:1}" in
	B) echo "$n" ;;
	K) echo $((n << 10)) ;;
	M) echo $((n << 20)) ;;
	G) echo $((n << 30)) ;;
	T) echo $((n << 40)) ;;
	esac
}

SIZE="${SIZE:-1GiB}"
SIZE_BYTES="$(to_bytes "$SIZE")" || die "SIZE=$SIZE: want bytes or a number with KiB, MiB, GiB or TiB"
((SIZE_BYTES >= 1 << 20 && SIZE_BYTES % (128 << 10) == 0)) || die "SIZE=$SIZE: want at least 1 MiB, a multiple of 128 KiB"
RUNTIME="${RUNTIME:-10}"
RUNS="${RUNS:-3}"
PREWRITE_ROUNDS="${PREWRITE_ROUNDS:-1}"
TARGET_CPU="${TARGET_CPU:-0}"
CLIENT_CPU="${CLIENT_CPU:-1}"
BASE_PORT="${BASE_PORT:-24420}"
BENCH_DIR="${BENCH_DIR:-/var/tmp}"
SPDK_BDEV="${SPDK_BDEV:-aio}"
case "$SPDK_BDEV" in
aio) TGT_MB=512 SPDK_LABEL="SPDK, AIO file" ;;
malloc) TGT_MB=$((512 + (SIZE_BYTES >> 20))) SPDK_LABEL="SPDK, RAM bdev" ;;
*) die "SPDK_BDEV=$SPDK_BDEV: want aio or malloc" ;;
esac
HUGE_MB="${HUGE_MB:-$((TGT_MB + 512))}"
OUT="${OUT:-./spdk-compare-$(date -u +%Y%m%dT%H%MZ).md}"
SUSTAIN="${SUSTAIN:-0}"
for v in RUNTIME RUNS PREWRITE_ROUNDS TARGET_CPU CLIENT_CPU BASE_PORT HUGE_MB SUSTAIN; do
	[[ "${!v}" =~ ^[0-9]+$ ]] || die "$v=${!v}: want a whole number"
done
((RUNTIME >= 1 && RUNS >= 1 && PREWRITE_ROUNDS >= 1)) || die "RUNTIME, RUNS and PREWRITE_ROUNDS must be at least 1"
((BASE_PORT >= 1024 && BASE_PORT + 3 <= 65535)) || die "BASE_PORT=$BASE_PORT: want 1024-65532"
((TARGET_CPU != CLIENT_CPU)) || die "TARGET_CPU and CLIENT_CPU are both $TARGET_CPU: the target and the client need a CPU each"
for c in "$TARGET_CPU" "$CLIENT_CPU"; do
	taskset -c "$c" true 2>/dev/null || die "CPU $c is not usable here (taskset -c $c failed); set TARGET_CPU and CLIENT_CPU"
done
[[ -d "$BENCH_DIR" ]] || die "BENCH_DIR=$BENCH_DIR is not a directory"

BLK_PORT=$BASE_PORT
SPDK_PORT=$((BASE_PORT + 1))
API_PORT=$((BASE_PORT + 2))
RAFT_PORT=$((BASE_PORT + 3))
for p in $BLK_PORT $SPDK_PORT $API_PORT $RAFT_PORT; do
	[[ -z "$(ss -Hltn "sport = :$p")" ]] || die "port $p on this machine is taken (ss -ltnp); choose another BASE_PORT"
done

HOSTNQN="nqn.2014-08.io.blk:spdk-compare"
SPDK_NQN="nqn.2016-06.io.spdk:spdk-compare"
VOL="spdk-compare"
API="http://127.0.0.1:$API_PORT"
CLK_TCK="$(getconf CLK_TCK)"
REPO="${BLK_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
[[ -f "$REPO/go.mod" && -d "$REPO/cmd/blkd" ]] || die "BLK_REPO=$REPO is not a blk checkout"

# The patterns of issue 22's table: label, queue depth, I/O size, pattern, read %.
ROW_LABEL=("4 KiB rand read QD1" "4 KiB rand read QD32" "4 KiB rand write QD1" "4 KiB rand write QD32"
	"4 KiB 70/30 rand r/w QD32" "128 KiB seq read QD8" "128 KiB seq write QD8")
ROW_QD=(1 32 1 32 32 8 8)
ROW_BS=(4096 4096 4096 4096 4096 131072 131072)
ROW_RW=(randread randread randwrite randwrite randrw read write)
ROW_MIX=("" "" "" "" 70 "" "")
ROWS="${ROWS:-1,2,3,4,5,6,7}"
IFS=, read -r -a SELECTED <<<"$ROWS"
for r in "${SELECTED[@]}"; do
	[[ "$r" =~ ^[1-7]$ ]] || die "ROWS=$ROWS: want numbers 1-7 separated by commas"
done

# --- cleanup: everything this script starts or creates ------------------------

WORK=""
BLKD_PID=""
TGT_PID=""
PERF_PID=""
HUGE_MOUNT=""
OLD_NR_HUGEPAGES=""

stop() { # pid signal seconds: signal, wait, then SIGKILL
	local pid="$1" sig="$2" secs="$3" i
	[[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
	kill "-$sig" "$pid" 2>/dev/null || true
	for ((i = 0; i < secs * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		say "pid $pid did not stop on SIG$sig within ${secs}s: SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	for pid in "$TGT_PID" "$BLKD_PID"; do
		[[ -n "$pid" ]] && kill -CONT "$pid" 2>/dev/null
	done
	stop "$PERF_PID" INT 5
	stop "$TGT_PID" INT 10
	[[ -n "$TGT_PID" ]] && rm -f "/dev/shm/nvmf_trace.pid$TGT_PID"
	stop "$BLKD_PID" TERM 10
	if [[ -n "$HUGE_MOUNT" ]]; then
		umount "$HUGE_MOUNT" 2>/dev/null || say "could not unmount $HUGE_MOUNT"
	fi
	if [[ -n "$OLD_NR_HUGEPAGES" ]]; then
		echo "$OLD_NR_HUGEPAGES" >/proc/sys/vm/nr_hugepages 2>/dev/null || say "could not put vm.nr_hugepages back to $OLD_NR_HUGEPAGES"
	fi
	if [[ -n "$WORK" && -d "$WORK" ]]; then
		if ((rc != 0 && rc != 130)); then
			for log in "$WORK"/blkd.log "$WORK"/nvmf_tgt.log; do
				[[ -s "$log" ]] && { say "last lines of $(basename "$log"):"; tail -n 15 "$log" >&2; }
			done
		fi
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

WORK="$(mktemp -d "$BENCH_DIR/spdk-compare.XXXXXX")"
mkdir -p "$WORK/bin" "$WORK/res"

# --- hugepages for the SPDK processes -------------------------------------------

huge_free_mb() { awk '/^HugePages_Free:/ {f=$2} /^Hugepagesize:/ {s=$2} END {print int(f * s / 1024)}' /proc/meminfo; }
if (($(huge_free_mb) < HUGE_MB)); then
	[[ $EUID -eq 0 ]] || die "SPDK needs ${HUGE_MB} MiB of free hugepages and there are $(huge_free_mb) MiB; as root: echo N > /proc/sys/vm/nr_hugepages (or run this as root)"
	OLD_NR_HUGEPAGES="$(cat /proc/sys/vm/nr_hugepages)"
	page_kb="$(awk '/^Hugepagesize:/ {print $2}' /proc/meminfo)"
	want=$((OLD_NR_HUGEPAGES + (HUGE_MB - $(huge_free_mb)) * 1024 / page_kb))
	echo "$want" >/proc/sys/vm/nr_hugepages
	(($(huge_free_mb) >= HUGE_MB)) || die "raised vm.nr_hugepages to $want but only $(huge_free_mb) MiB are free (memory too fragmented or short)"
	say "vm.nr_hugepages $OLD_NR_HUGEPAGES -> $want (put back on exit)"
fi
HUGE_DIR_ARGS=()
if ! awk '$3 == "hugetlbfs" {found=1} END {exit !found}' /proc/mounts; then
	[[ $EUID -eq 0 ]] || die "no hugetlbfs is mounted; as root: mount -t hugetlbfs nodev /dev/hugepages (or run this as root)"
	mkdir -p "$WORK/huge"
	mount -t hugetlbfs nodev "$WORK/huge"
	HUGE_MOUNT="$WORK/huge"
	HUGE_DIR_ARGS=(--huge-dir "$HUGE_MOUNT")
fi

# --- blkd -----------------------------------------------------------------------

say "building blkd and blkctl from $REPO"
(cd "$REPO" && go build -o "$WORK/bin/" ./cmd/blkd ./cmd/blkctl)
BLKCTL=("$WORK/bin/blkctl" --api "$API")

say "starting blkd on CPU $TARGET_CPU (NVMe/TCP 127.0.0.1:$BLK_PORT, RDMA off, data in $WORK/blk-data)"
taskset -c "$TARGET_CPU" "$WORK/bin/blkd" --data-dir "$WORK/blk-data" --node-id bench \
	--raft-addr "127.0.0.1:$RAFT_PORT" --api-addr "127.0.0.1:$API_PORT" \
	--tcp-addr "127.0.0.1:$BLK_PORT" --nvme-addr off --log-level warn >"$WORK/blkd.log" 2>&1 &
BLKD_PID=$!
for ((i = 0; ; i++)); do
	kill -0 "$BLKD_PID" 2>/dev/null || die "blkd exited while starting"
	"${BLKCTL[@]}" volume list >/dev/null 2>&1 && break
	((i < 300)) || die "blkd did not answer on $API within 30 s"
	sleep 0.1
done
"${BLKCTL[@]}" volume create "$VOL" --size "$SIZE_BYTES" >/dev/null
"${BLKCTL[@]}" host allow "$VOL" "$HOSTNQN" >/dev/null
BLK_NQN="$("${BLKCTL[@]}" -o json volume show "$VOL" | sed -n 's/^ *"nqn": *"\([^"]*\)".*/\1/p' | head -n 1)"
[[ -n "$BLK_NQN" ]] || die "blkctl volume show $VOL gave no NQN"

# --- nvmf_tgt with an AIO bdev on a file beside blkd's data -------------------------

if [[ $SPDK_BDEV == aio ]]; then
	say "starting nvmf_tgt on CPU $TARGET_CPU (NVMe/TCP 127.0.0.1:$SPDK_PORT, AIO bdev on $WORK/aio.img)"
	truncate -s "$SIZE_BYTES" "$WORK/aio.img"
else
	say "starting nvmf_tgt on CPU $TARGET_CPU (NVMe/TCP 127.0.0.1:$SPDK_PORT, RAM bdev of $((SIZE_BYTES >> 20)) MiB)"
fi
taskset -c "$TARGET_CPU" "$TGT" -m "$(printf '0x%x' $((1 << TARGET_CPU)))" --no-pci -s "$TGT_MB" \
	-r "$WORK/spdk.sock" "${HUGE_DIR_ARGS[@]}" >"$WORK/nvmf_tgt.log" 2>&1 &
TGT_PID=$!
rpc() { python3 "$RPC_PY" -s "$WORK/spdk.sock" "$@"; }
for ((i = 0; ; i++)); do
	kill -0 "$TGT_PID" 2>/dev/null || die "nvmf_tgt exited while starting"
	rpc -t 1 spdk_get_version >/dev/null 2>&1 && break
	((i < 300)) || die "nvmf_tgt did not answer on $WORK/spdk.sock within 30 s"
	sleep 0.1
done
SPDK_VERSION="$(rpc spdk_get_version | sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p')"
{
	rpc nvmf_create_transport -t TCP
	if [[ $SPDK_BDEV == aio ]]; then
		rpc bdev_aio_create "$WORK/aio.img" bdev0 4096
	else
		rpc bdev_malloc_create -b bdev0 $((SIZE_BYTES >> 20)) 4096
	fi
	rpc nvmf_create_subsystem "$SPDK_NQN" -s SPDKCOMPARE0001
	rpc nvmf_subsystem_add_host "$SPDK_NQN" "$HOSTNQN"
	rpc nvmf_subsystem_add_ns "$SPDK_NQN" bdev0
	rpc nvmf_subsystem_add_listener "$SPDK_NQN" -t tcp -a 127.0.0.1 -s "$SPDK_PORT"
} >/dev/null || die "setting up nvmf_tgt over $WORK/spdk.sock failed"

# --- spdk_nvme_perf ------------------------------------------------------------------

target_pid() { case "$1" in blkd) echo "$BLKD_PID" ;; spdk) echo "$TGT_PID" ;; esac; }
target_trid() {
	case "$1" in
	blkd) echo "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$BLK_PORT subnqn:$BLK_NQN hostnqn:$HOSTNQN" ;;
	spdk) echo "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$SPDK_PORT subnqn:$SPDK_NQN hostnqn:$HOSTNQN" ;;
	esac
}
# only TARGET: lets TARGET run and stops the other one (they share TARGET_CPU,
# and nvmf_tgt's reactor polls it whether or not a host is connected).
only() {
	local other=spdk
	[[ $1 == spdk ]] && other=blkd
	kill -CONT "$(target_pid "$1")" 2>/dev/null || true
	kill -STOP "$(target_pid "$other")" 2>/dev/null || true
}
cpu_ticks() { awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }

# start_perf TARGET LOG ARGS...: starts spdk_nvme_perf on CLIENT_CPU against
# TARGET, in the background so that Ctrl-C reaches the trap at once; its
# output is line-buffered so that launched() sees when the I/O begins.
start_perf() {
	local target="$1" log="$2"
	shift 2
	taskset -c "$CLIENT_CPU" stdbuf -oL "$PERF" -c "$(printf '0x%x' $((1 << CLIENT_CPU)))" "$@" \
		-r "$(target_trid "$target")" >"$log" 2>&1 &
	PERF_PID=$!
}
# wait_perf: perf's exit status.
wait_perf() {
	local rc=0
	wait "$PERF_PID" || rc=$?
	PERF_PID=""
	return "$rc"
}
# launched LOG: waits until perf has connected and starts its I/O (or has
# exited), so that the target's CPU time is counted over the I/O only and not
# over perf's DPDK start-up, during which SPDK's reactor polls anyway.
launched() {
	while kill -0 "$PERF_PID" 2>/dev/null && ! grep -qs 'Launching workers' "$1"; do
		sleep 0.01
	done
}
run_perf() {
	start_perf "$@"
	wait_perf
}

# measure TARGET ROW RUN: one run; appends "iops avg_us p99_us cpu_us_per_io" to
# res/ROW.TARGET, or "fail".
measure() {
	local target="$1" row="$2" run="$3" log="$WORK/res/$2.$1.$3.log" pid t0 t1 mix=()
	pid="$(target_pid "$target")"
	kill -0 "$pid" 2>/dev/null || die "$target (pid $pid) is gone; see its log"
	[[ -n "${ROW_MIX[$row]}" ]] && mix=(-M "${ROW_MIX[$row]}")
	only "$target"
	start_perf "$target" "$log" -q "${ROW_QD[$row]}" -o "${ROW_BS[$row]}" -w "${ROW_RW[$row]}" "${mix[@]}" -t "$RUNTIME" -L
	launched "$log"
	t0="$(cpu_ticks "$pid")"
	if ! wait_perf; then
		say "$target, ${ROW_LABEL[$row]}, run $run: spdk_nvme_perf failed:"
		tail -n 5 "$log" >&2
		echo fail >>"$WORK/res/$row.$target"
		FAILS="$FAILS $target failed ${ROW_LABEL[$row]} run $run (spdk_nvme_perf exited with an error)."
		return 0
	fi
	t1="$(cpu_ticks "$pid")"
	awk -v ticks=$((t1 - t0)) -v hz="$CLK_TCK" -v secs="$RUNTIME" '
		/^Total *:/ { iops = $3; avg = $5 }
		/^ *99\.00000% *:/ { p99 = $3; sub(/us$/, "", p99) }
		END {
			if (iops == "" || iops + 0 == 0) { print "fail"; exit }
			printf "%.2f %.2f %.2f %.3f\n", iops, avg, p99, ticks / hz * 1e6 / (iops * secs)
		}' "$log" >>"$WORK/res/$row.$target"
	if [[ "$(tail -n 1 "$WORK/res/$row.$target")" == fail ]]; then
		say "$target, ${ROW_LABEL[$row]}, run $run: spdk_nvme_perf reported no I/O:"
		tail -n 8 "$log" >&2
		FAILS="$FAILS $target failed ${ROW_LABEL[$row]} run $run (no I/O completed)."
		return 0
	fi
	say "$target, ${ROW_LABEL[$row]}, run $run: $(tail -n 1 "$WORK/res/$row.$target" | awk '$1 != "fail" {printf "%.0f IOPS, avg %.0f us, p99 %.0f us, target CPU %.1f us/IO", $1, $2, $3, $4; next} {print}')"
}

# --- pre-write: both targets written in full with 128 KiB writes --------------------

IOS_PER_PASS=$((SIZE_BYTES / (128 << 10)))
FAILS=""
for target in blkd spdk; do
	only "$target"
	for ((round = 1; round <= PREWRITE_ROUNDS; round++)); do
		start=$(date +%s.%N)
		run_perf "$target" "$WORK/prewrite.$target.log" -q 8 -o 131072 -w write -d "$IOS_PER_PASS" -t 36000 ||
			{ tail -n 5 "$WORK/prewrite.$target.log" >&2; die "pre-writing $target failed"; }
		say "$target written in full with 128 KiB writes (pass $round of $PREWRITE_ROUNDS, $(awk -v s="$start" -v e="$(date +%s.%N)" -v b="$SIZE_BYTES" 'BEGIN {printf "%.0f MB/s", b / (e - s) / 1e6}'))"
	done
done

# --- SUSTAIN: back-to-back runs of 4 KiB random writes at QD32 ---------------------

if ((SUSTAIN > 0)); then
	for target in blkd spdk; do
		only "$target"
		: >"$WORK/sustain.$target"
		for ((run = 1; run <= SUSTAIN; run++)); do
			log="$WORK/sustain.$target.$run.log"
			run_perf "$target" "$log" -q 32 -o 4096 -w randwrite -t "$RUNTIME" -L ||
				{ tail -n 5 "$log" >&2; die "$target: spdk_nvme_perf failed in sustained run $run"; }
			awk '/^Total *:/ { iops = $3; max = $7 } /^ *99\.00000% *:/ { p99 = $3; sub(/us$/, "", p99) }
				END { printf "%.0f %.0f %.0f\n", iops, p99, max }' "$log" >>"$WORK/sustain.$target"
			say "$target, sustained run $run of $SUSTAIN: $(tail -n 1 "$WORK/sustain.$target" | awk '{printf "%d IOPS, p99 %d us, max %d us", $1, $2, $3}')"
		done
	done
	COMMIT="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
	git -C "$REPO" diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT+changes"
	{
		echo "Sustained 4 KiB random writes at QD32: blkd ($COMMIT) and $SPDK_VERSION nvmf_tgt ($SPDK_LABEL), each $SUSTAIN back-to-back ${RUNTIME} s runs of spdk_nvme_perf"
		echo "on a $((SIZE_BYTES >> 20)) MiB volume written $PREWRITE_ROUNDS× first, $(date -u +%Y-%m-%d), $(nproc) CPUs; the other target stopped meanwhile."
		echo
		echo "| target | median IOPS | lowest, highest run ÷ median | worst run's p99 | worst max latency |"
		echo "| --- | ---: | ---: | ---: | ---: |"
		for target in blkd spdk; do
			sort -n -k1 "$WORK/sustain.$target" | awk -v t="$target" '
				{ iops[NR] = $1; if ($2 > p99) p99 = $2; if ($3 > max) max = $3 }
				END {
					m = (NR % 2) ? iops[(NR + 1) / 2] : (iops[NR / 2] + iops[NR / 2 + 1]) / 2
					printf "| %s | %.1f k | %.2f, %.2f | %.2f ms | %.1f ms |\n", t, m / 1000, iops[1] / m, iops[NR] / m, p99 / 1000, max / 1000
				}'
		done
		echo
		echo "Per run (IOPS, p99 µs, max µs): blkd: $(awk '{printf "%s%d/%d/%d", (NR > 1 ? ", " : ""), $1, $2, $3}' "$WORK/sustain.blkd")"
		echo "SPDK: $(awk '{printf "%s%d/%d/%d", (NR > 1 ? ", " : ""), $1, $2, $3}' "$WORK/sustain.spdk")"
	} >"$WORK/table.md"
	cp "$WORK/table.md" "$OUT"
	cat "$WORK/table.md"
	say "written to $OUT"
	exit 0
fi

# --- the runs: each pattern RUNS times, blkd and SPDK alternating ------------------

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
for r in "${SELECTED[@]}"; do
	row=$((r - 1))
	for ((run = 1; run <= RUNS; run++)); do
		for target in blkd spdk; do
			measure "$target" "$row" "$run"
		done
	done
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"
DISK_BLKD="$(du -sm "$WORK/blk-data" | cut -f1)"
DISK_SPDK="RAM"
[[ $SPDK_BDEV == aio ]] && DISK_SPDK="$(du -sm "$WORK/aio.img" | cut -f1) MiB"

# --- the table -------------------------------------------------------------------------

# medians ROW TARGET: "iops avg p99 cpu" medians of the successful runs, or nothing.
medians() {
	local f="$WORK/res/$1.$2"
	[[ -f "$f" ]] || return 0
	grep -v '^fail$' "$f" | awk '
		{ n++; for (i = 1; i <= 4; i++) v[i, n] = $i }
		END {
			if (n == 0) exit
			for (i = 1; i <= 4; i++) {
				for (j = 1; j <= n; j++) a[j] = v[i, j]
				for (j = 2; j <= n; j++) for (k = j; k > 1 && a[k - 1] > a[k]; k--) { t = a[k]; a[k] = a[k - 1]; a[k - 1] = t }
				m[i] = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
			}
			print m[1], m[2], m[3], m[4]
		}'
}
# paired ROW: "throughput p99 cpu" ratios blkd ÷ SPDK, the median over the runs
# of each run's ratio to the SPDK run beside it (robust to a load that drifts
# over the minutes of a run), or nothing.
paired() {
	local b="$WORK/res/$1.blkd" s="$WORK/res/$1.spdk"
	[[ -f "$b" && -f "$s" ]] || return 0
	awk '
		FNR == NR { line[FNR] = $0; next }
		{
			split(line[FNR], x)
			if (x[1] == "fail" || $1 == "fail" || x[1] + 0 == 0 || $1 + 0 == 0 || $3 + 0 == 0 || $4 + 0 == 0) next
			n++; v[1, n] = x[1] / $1; v[2, n] = x[3] / $3; v[3, n] = x[4] / $4
		}
		END {
			if (n == 0) exit
			for (i = 1; i <= 3; i++) {
				for (j = 1; j <= n; j++) a[j] = v[i, j]
				for (j = 2; j <= n; j++) for (k = j; k > 1 && a[k - 1] > a[k]; k--) { t = a[k]; a[k] = a[k - 1]; a[k - 1] = t }
				m[i] = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
			}
			print m[1], m[2], m[3]
		}' "$b" "$s"
}
lat() { awk -v u="$1" 'BEGIN { if (u < 1000) printf "%.0f µs", u; else printf "%.1f ms", u / 1000 }'; }
cell() { # bs iops avg p99
	awk -v bs="$1" -v iops="$2" 'BEGIN {
		if (bs >= 65536) printf "%.0f MB/s", iops * bs / 1e6
		else if (iops >= 1000) printf "%.1f k IOPS", iops / 1000
		else printf "%.0f IOPS", iops }'
	printf ', avg %s, p99 %s' "$(lat "$3")" "$(lat "$4")"
}
times() { awk -v r="$1" 'BEGIN { printf "%.2f×", r }'; }

COMMIT="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$REPO" diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT+changes"
{
	echo "blkd ($COMMIT) beside $SPDK_VERSION nvmf_tgt ($([[ $SPDK_BDEV == aio ]] && echo "AIO bdev on a file in the same directory" || echo "RAM bdev")), $(date -u +%Y-%m-%d), $(nproc) CPUs ($(uname -r))."
	echo "spdk_nvme_perf over NVMe/TCP on loopback; targets on CPU $TARGET_CPU (each stopped while the other is measured), client on CPU $CLIENT_CPU; $((SIZE_BYTES >> 20)) MiB written $PREWRITE_ROUNDS× with 128 KiB writes first;"
	echo "${RUNTIME} s runs, medians of $RUNS, blkd and SPDK alternating; each ratio is the median of the runs' ratios to the SPDK run beside them."
	echo "Load average before $LOAD_BEFORE, after $LOAD_AFTER.$FAILS"
	echo "Data on disk afterwards: blkd $DISK_BLKD MiB, SPDK $DISK_SPDK. SPDK's CPU per I/O is an upper bound (its reactor busy-polls)."
	echo
	echo "| pattern | blkd | $SPDK_LABEL | blkd ÷ SPDK | p99, blkd ÷ SPDK | target CPU per I/O, blkd ÷ SPDK |"
	echo "| --- | ---: | ---: | ---: | ---: | ---: |"
	for r in "${SELECTED[@]}"; do
		row=$((r - 1))
		read -r b_iops b_avg b_p99 b_cpu <<<"$(medians "$row" blkd)" || true
		read -r s_iops s_avg s_p99 s_cpu <<<"$(medians "$row" spdk)" || true
		b="failed"
		s="failed"
		[[ -n "${b_iops:-}" ]] && b="$(cell "${ROW_BS[$row]}" "$b_iops" "$b_avg" "$b_p99")"
		[[ -n "${s_iops:-}" ]] && s="$(cell "${ROW_BS[$row]}" "$s_iops" "$s_avg" "$s_p99")"
		read -r r_io r_p99 r_cpu <<<"$(paired "$row")" || true
		if [[ -n "${r_io:-}" ]]; then
			printf '| %s | %s | %s | %s | %s | %s (%.1f / %.1f µs) |\n' "${ROW_LABEL[$row]}" "$b" "$s" \
				"$(times "$r_io")" "$(times "$r_p99")" "$(times "$r_cpu")" "$b_cpu" "$s_cpu"
		else
			printf '| %s | %s | %s | n/a | n/a | n/a |\n' "${ROW_LABEL[$row]}" "$b" "$s"
		fi
		unset b_iops b_avg b_p99 b_cpu s_iops s_avg s_p99 s_cpu r_io r_p99 r_cpu
	done
} >"$WORK/table.md"
cp "$WORK/table.md" "$OUT"
cat "$WORK/table.md"
say "table written to $OUT"
