#!/usr/bin/env bash
# deploy/bench/caw.sh: what fused Compare and Write costs, through blkd
# (issue 25's goal: pairs at QD32 on distinct blocks ≥ 0.8× plain writes).
#
# One blkd (built from this checkout) on loopback, a one-replica volume
# of SIZE first written whole with zeros, driven by blkctl bench (blk's
# initiator over NVMe/TCP, one I/O queue, 4 KiB, QD32). Per round, in
# this order: 4 KiB random writes of zeros (the baseline), Compare and
# Write pairs at random blocks (compare zeros, write zeros: every pair
# compares equal and writes), 4 KiB random reads. The ceiling of pairs
# whose Write may start only once their Compare's read matched is
# t_w/(t_r+t_w) = reads/(reads+writes) per second at the same depth.
# One markdown table of medians over the rounds, each ratio the median
# of the rounds' ratios.
#
# Usage: deploy/bench/caw.sh
#
# Environment (defaults in brackets):
#   SIZE      the volume's size [1GiB]
#   RUNTIME   seconds per run [4]
#   RUNS      rounds [5]
#   BASE_PORT raft BASE_PORT+1, NVMe/TCP +11, NVMe/RDMA +21, API +31 [25600]
#   BENCH_DIR where the scratch directory goes: the disk under test [/var/tmp]
#   OUT       the table's file [./caw-YYYYMMDDTHHMMZ.md]
#
# Everything it starts is stopped and the scratch directory removed on
# exit, error or Ctrl-C.

set -euo pipefail

bench_name=caw
SIZE=${SIZE:-1GiB}
RUNTIME=${RUNTIME:-4}
RUNS=${RUNS:-5}
BASE_PORT=${BASE_PORT:-25600}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
OUT=${OUT:-./caw-$(date -u +%Y%m%dT%H%MZ).md}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_start
host=nqn.2026-11.io.blk:caw-bench
bench() { # RW ARGS... -> the run's JSON
	local rw=$1
	shift
	ctl -o json bench v --host-nqn "$host" --transport tcp --rw "$rw" --bs 4KiB --qd 32 --time "${RUNTIME}s" "$@"
}

ctl volume create v --size "$SIZE" --replicas 1 >/dev/null
ctl host allow v "$host" >/dev/null
bytes=$(ctl -o json volume show v | field size_bytes)
say "writing the volume whole with zeros ($SIZE)"
ctl bench v --host-nqn "$host" --transport tcp --rw write --zero-data --bs 128KiB --qd 8 --ios $((bytes / 131072)) >/dev/null

declare -A res
for run in $(seq "$RUNS"); do
	w=$(bench randwrite --zero-data | field iops | xargs printf "%.0f")
	j=$(bench caw)
	p=$(field iops <<<"$j" | xargs printf "%.0f")
	m=$(field miscompares <<<"$j")
	r=$(bench randread | field iops | xargs printf "%.0f")
	[[ -z $m || $m == 0 ]] || die "run $run: $m pairs miscompared: the volume is not all zeros"
	res["w|$run"]=$w res["p|$run"]=$p res["r|$run"]=$r
	res["x|$run"]=$(awk -v a="$p" -v b="$w" 'BEGIN {printf "%.2f\n", a/b}')
	res["c|$run"]=$(awk -v r="$r" -v w="$w" 'BEGIN {printf "%.2f\n", r/(r+w)}')
	say "run $run: writes $w IOPS, pairs $p/s (${res["x|$run"]}×), reads $r IOPS (ceiling ${res["c|$run"]}×)"
done

col() { for run in $(seq "$RUNS"); do echo "${res["$1|$run"]}"; done | median; }
all() { for run in $(seq "$RUNS"); do echo "${res["$1|$run"]}"; done | paste -sd' ' | sed 's/ /, /g'; }
{
	echo "| measure (4 KiB, QD32, $RUNS rounds) | median | rounds |"
	echo "| --- | --- | --- |"
	printf '| random writes, IOPS | %s | %s |\n' "$(col w)" "$(all w)"
	printf '| Compare and Write pairs, per second | %s | %s |\n' "$(col p)" "$(all p)"
	printf '| pairs ÷ writes | %s | %s |\n' "$(col x)" "$(all x)"
	printf '| random reads, IOPS | %s | %s |\n' "$(col r)" "$(all r)"
	printf '| ceiling reads/(reads+writes) | %s | %s |\n' "$(col c)" "$(all c)"
} | tee "$OUT"
say "table in $OUT"
