#!/usr/bin/env bash
# deploy/bench/replicas.sh: what replication costs (issue 23, goal 2).
#
# Three blkd (built from this checkout) on loopback, each in a zone of its
# own; three volumes with node1 as primary: r1 (one replica), r2 (two),
# r3 (three). Each volume is written whole twice (sequential 128 KiB),
# then, round by round, the patterns run on r1, r2 and r3 in turn through
# blkctl bench (blk's initiator over NVMe/TCP, one I/O queue): 4 KiB
# random writes at QD1 and QD32, 4 KiB random reads at QD32. One markdown
# table of medians, each ratio the median of the rounds' ratios to r1,
# with the CPU time the whole machine's share of the run took per I/O
# (the three blkd and blkctl, user + system, from /proc): where the
# nodes share their cores, as here, IOPS follow CPU per I/O.
#
# Usage: deploy/bench/replicas.sh
#
# Environment (defaults in brackets):
#   SIZE      volume size [256MiB]
#   RUNTIME   seconds per run [10]
#   RUNS      rounds; the table shows medians [3]
#   POLL_SPIN blkd --poll-spin: the three nodes share this machine's cores,
#             where a spinning poll group takes the CPU the others need [0]
#   BASE_PORT raft BASE_PORT+1..3, NVMe/TCP +11..13, NVMe/RDMA +21..23, API +31..33 [25400]
#   BENCH_DIR where the scratch directory goes: the disk under test [/var/tmp]
#   OUT       the table's file [./replicas-YYYYMMDDTHHMMZ.md]
#
# Everything it starts is stopped and the scratch directory removed on
# exit, error or Ctrl-C.

set -euo pipefail

bench_name=replicas
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # say, die, is_ready, median

SIZE=${SIZE:-256MiB}
RUNTIME=${RUNTIME:-10}
RUNS=${RUNS:-3}
BASE_PORT=${BASE_PORT:-25400}
POLL_SPIN=${POLL_SPIN:-0}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
OUT=${OUT:-./replicas-$(date -u +%Y%m%dT%H%MZ).md}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

scratch=$(mktemp -d "$BENCH_DIR/blk-replicas.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$scratch"
}
trap cleanup EXIT INT TERM

say "building blkd and blkctl"
(cd "$repo" && go build -o "$scratch/blkd" ./cmd/blkd && go build -o "$scratch/blkctl" ./cmd/blkctl)

api() { echo "127.0.0.1:$((BASE_PORT + 30 + $1))"; }

for n in 1 2 3; do
	join=()
	[[ $n != 1 ]] && join=(--join "$(api 1)")
	mkdir -p "$scratch/node$n"
	"$scratch/blkd" --node-id "node$n" --data-dir "$scratch/node$n" --zone "zone-$n" \
		--raft-addr "127.0.0.1:$((BASE_PORT + n))" --tcp-addr "127.0.0.1:$((BASE_PORT + 10 + n))" \
		--nvme-addr "127.0.0.1:$((BASE_PORT + 20 + n))" --api-addr "$(api $n)" --poll-spin "$POLL_SPIN" \
		"${join[@]}" >"$scratch/node$n.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 600); do
		is_ready "$scratch/node$n.log" && break
		kill -0 "${pids[-1]}" 2>/dev/null || { cat "$scratch/node$n.log" >&2; die "node$n exited"; }
		sleep 0.1
	done
	is_ready "$scratch/node$n.log" || die "node$n not ready in 60 s"
done
ctl() { "$scratch/blkctl" --api "http://$(api 1)" "$@"; }
host=nqn.2026-11.io.blk:replicas-bench
for r in 1 2 3; do
	ctl volume create "r$r" --size "$SIZE" --node node1 --replicas "$r" >/dev/null
	ctl host allow "r$r" "$host" >/dev/null
done
bytes=$(ctl -o json volume show r1 | sed -n 's/.*"size_bytes": *\([0-9]*\).*/\1/p')
for r in 1 2 3; do
	say "writing r$r twice"
	ctl bench "r$r" --host-nqn "$host" --transport tcp --rw write --bs 128KiB --qd 8 --ios $((2 * bytes / 131072)) >/dev/null
done

# cpu: the CPU ticks of the three blkd (utime + stime) and of this
# shell's waited-for children, blkctl among them (cutime + cstime), so far.
cpu() {
	local t p
	t=$(awk '{print $16 + $17}' "/proc/$$/stat")
	for p in "${pids[@]}"; do
		t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo "$t"
}
hz=$(getconf CLK_TCK)

rows=("randwrite 4KiB 1" "randwrite 4KiB 32" "randread 4KiB 32")
declare -A res
for run in $(seq "$RUNS"); do
	for row in "${rows[@]}"; do
		read -r rw bs qd <<<"$row"
		for r in 1 2 3; do
			c0=$(cpu)
			j=$(ctl -o json bench "r$r" --host-nqn "$host" --transport tcp --rw "$rw" --bs "$bs" --qd "$qd" --time "${RUNTIME}s")
			c1=$(cpu)
			iops=$(sed -n 's/.*"iops": *\([0-9.]*\).*/\1/p' <<<"$j")
			lat=$(sed -n 's/.*"lat_mean_us": *\([0-9.]*\).*/\1/p' <<<"$j")
			p99=$(sed -n 's/.*"lat_p99_us": *\([0-9.]*\).*/\1/p' <<<"$j")
			cpuio=$(awk -v c=$((c1 - c0)) -v hz="$hz" -v i="$iops" -v t="$RUNTIME" 'BEGIN {printf "%.1f\n", c / hz * 1e6 / (i * t)}')
			res["$row|$r|$run"]="$iops $lat $p99 $cpuio"
			say "run $run $rw $bs QD$qd r$r: $iops IOPS, mean $lat us, p99 $p99 us, $cpuio CPU us per I/O"
		done
	done
done

{
	echo "| pattern | replicas | IOPS | mean µs | p99 µs | CPU µs per I/O | IOPS vs 1 | mean latency vs 1 |"
	echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
	for row in "${rows[@]}"; do
		read -r rw bs qd <<<"$row"
		for r in 1 2 3; do
			iops=$(for run in $(seq "$RUNS"); do echo "${res["$row|$r|$run"]}" | cut -d' ' -f1; done | median)
			lat=$(for run in $(seq "$RUNS"); do echo "${res["$row|$r|$run"]}" | cut -d' ' -f2; done | median)
			p99=$(for run in $(seq "$RUNS"); do echo "${res["$row|$r|$run"]}" | cut -d' ' -f3; done | median)
			cpuio=$(for run in $(seq "$RUNS"); do echo "${res["$row|$r|$run"]}" | cut -d' ' -f4; done | median)
			ri=$(for run in $(seq "$RUNS"); do
				read -r a _ <<<"${res["$row|$r|$run"]}"
				read -r b _ <<<"${res["$row|1|$run"]}"
				awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f\n", a/b}'
			done | median)
			rl=$(for run in $(seq "$RUNS"); do
				read -r _ a _ <<<"${res["$row|$r|$run"]}"
				read -r _ b _ <<<"${res["$row|1|$run"]}"
				awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f\n", a/b}'
			done | median)
			printf '| %s %s QD%s | %s | %.0f | %.1f | %.1f | %.1f | %s | %s |\n' "$rw" "$bs" "$qd" "$r" "$iops" "$lat" "$p99" "$cpuio" "$ri" "$rl"
		done
	done
} | tee "$OUT"
say "table in $OUT"
