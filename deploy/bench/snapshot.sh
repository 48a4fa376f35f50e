#!/usr/bin/env bash
# deploy/bench/snapshot.sh: what snapshots cost, through blkd (issue 24).
#
# One blkd (built from this checkout) on loopback, one-replica volumes,
# driven by blkctl bench (blk's initiator over NVMe/TCP, one I/O queue).
# Per round:
#   - creation: `blkctl volume snapshot` and `volume clone` wall time,
#     and the writes-held time blkd reports, on a volume of SIZE written
#     whole and on a thin volume of BIG (16 GiB) with SIZE written;
#   - writes: 4 KiB random writes at QD32 on the written volume, IOS of
#     them (one per 64 KiB cluster of SIZE by default) with no snapshot
#     (the baseline), right after a snapshot (every first write into a
#     cluster is redirected into a partial one), and after a whole rewrite (every cluster owned
#     again);
#   - reads: 4 KiB random reads at QD32 of the clone and of its origin.
# One markdown table of medians over the rounds, each ratio the median
# of the rounds' ratios.
#
# Usage: deploy/bench/snapshot.sh
#
# Environment (defaults in brackets):
#   SIZE      the written volume's size [1GiB]
#   BIG       the thin volume's size [16GiB]
#   IOS       4 KiB writes per write run [SIZE / 64 KiB]
#   RUNTIME   seconds per read run [10]
#   RUNS      rounds [3]
#   SETTLE    seconds to wait after the rewrite before the third write run [10]
#   BASE_PORT raft BASE_PORT+1, NVMe/TCP +11, NVMe/RDMA +21, API +31 [25500]
#   BENCH_DIR where the scratch directory goes: the disk under test [/var/tmp]
#   OUT       the table's file [./snapshot-YYYYMMDDTHHMMZ.md]
#
# Everything it starts is stopped and the scratch directory removed on
# exit, error or Ctrl-C.

set -euo pipefail

bench_name=snapshot
SIZE=${SIZE:-1GiB}
BIG=${BIG:-16GiB}
RUNTIME=${RUNTIME:-10}
RUNS=${RUNS:-3}
BASE_PORT=${BASE_PORT:-25500}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
OUT=${OUT:-./snapshot-$(date -u +%Y%m%dT%H%MZ).md}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_start
host=nqn.2026-11.io.blk:snapshot-bench
ms() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f\n", (b - a) / 1e6}'; }
now() { date +%s%N; }

mkvol() { # NAME SIZE
	ctl volume create "$1" --size "$2" --replicas 1 >/dev/null
	ctl host allow "$1" "$host" >/dev/null
}
bench() { # VOLUME RW ARGS... -> IOPS
	local v=$1 rw=$2
	shift 2
	ctl -o json bench "$v" --host-nqn "$host" --transport tcp --rw "$rw" --bs 4KiB --qd 32 "$@" | field iops
}
writeall() { # VOLUME BYTES
	ctl bench "$1" --host-nqn "$host" --transport tcp --rw write --bs 128KiB --qd 8 --ios $(($2 / 131072)) >/dev/null
}

# served PATH: how long blkd took to answer the last POST of PATH, in ms
# (its audit log's duration: the request's whole time in blkd, the
# registry's commits included, without blkctl's own start).
served() {
	grep "msg=\"api call\".*method=POST path=$1 status=20" "$scratch/node.log" | tail -1 |
		sed -n 's/.* duration=\([0-9.]*\)\(µs\|ms\|s\).*/\1 \2/p' |
		awk '{v = $1; if ($2 == "µs") v /= 1000; if ($2 == "s") v *= 1000; printf "%.2f\n", v}'
}

declare -A res
rows=(create-written clone-written create-thin-big writes-none writes-after writes-owned reads-origin reads-clone)
for run in $(seq "$RUNS"); do
	v="v$run" big="b$run" c="c$run"
	mkvol "$v" "$SIZE"
	bytes=$(ctl -o json volume show "$v" | field size_bytes)
	ios=${IOS:-$((bytes / 65536))}
	mkvol "$big" "$BIG"
	say "run $run: writing $v whole, and $SIZE of $big"
	writeall "$v" "$bytes"
	writeall "$big" "$bytes"

	w0=$(bench "$v" randwrite --ios "$ios")
	t0=$(now); j=$(ctl -o json volume snapshot "$v" s1); t1=$(now)
	res["create-written|$run"]="$(ms "$t0" "$t1") $(awk -v h="$(field held_ns <<<"$j")" 'BEGIN {printf "%.2f\n", h / 1e6}') $(served "/v1/volumes/$v/snapshots")"
	w1=$(bench "$v" randwrite --ios "$ios")
	writeall "$v" "$bytes"
	# The copies' map keys (one per cluster) are being flushed and
	# compacted by pebble now: on two cores that takes the CPU the I/O
	# needs. Measure once it has settled.
	sleep "${SETTLE:-10}"
	w2=$(bench "$v" randwrite --ios "$ios")
	res["writes-none|$run"]="$w0 1"
	res["writes-after|$run"]="$w1 $(awk -v a="$w1" -v b="$w0" 'BEGIN {printf "%.2f\n", a/b}')"
	res["writes-owned|$run"]="$w2 $(awk -v a="$w2" -v b="$w0" 'BEGIN {printf "%.2f\n", a/b}')"

	t0=$(now); ctl volume clone "$v@s1" "$c" >/dev/null; t1=$(now)
	res["clone-written|$run"]="$(ms "$t0" "$t1") - $(served "/v1/volumes/$v/snapshots/s1/clone")"
	ctl host allow "$c" "$host" >/dev/null
	t0=$(now); j=$(ctl -o json volume snapshot "$big" s1); t1=$(now)
	res["create-thin-big|$run"]="$(ms "$t0" "$t1") $(awk -v h="$(field held_ns <<<"$j")" 'BEGIN {printf "%.2f\n", h / 1e6}') $(served "/v1/volumes/$big/snapshots")"

	# The origin's reads: its snapshot's clusters are what the clone reads.
	r0=$(bench "$v" randread --time "${RUNTIME}s")
	r1=$(bench "$c" randread --time "${RUNTIME}s")
	res["reads-origin|$run"]="$r0 1"
	res["reads-clone|$run"]="$r1 $(awk -v a="$r1" -v b="$r0" 'BEGIN {printf "%.2f\n", a/b}')"
	say "run $run: snapshot ${res["create-written|$run"]} ms (wall, held), writes $w0 / $w1 / $w2 IOPS, reads origin $r0 clone $r1 IOPS"
	ctl volume delete "$c" --force >/dev/null
	ctl volume delete "$v" --force --snapshots >/dev/null
	ctl volume delete "$big" --force --snapshots >/dev/null
done

col() { for run in $(seq "$RUNS"); do echo "${res["$1|$run"]}" | cut -d' ' -f"$2"; done | median; }
{
	echo "| measure | median | second figure |"
	echo "| --- | --- | --- |"
	printf '| `volume snapshot` of a written %s volume, ms (blkctl wall) | %s | in blkd %s ms, writes held %s ms |\n' "$SIZE" "$(col create-written 1)" "$(col create-written 3)" "$(col create-written 2)"
	printf '| `volume clone` of it, ms (blkctl wall) | %s | in blkd %s ms |\n' "$(col clone-written 1)" "$(col clone-written 3)"
	printf '| `volume snapshot` of a %s volume, %s written, ms (blkctl wall) | %s | in blkd %s ms, writes held %s ms |\n' "$BIG" "$SIZE" "$(col create-thin-big 1)" "$(col create-thin-big 3)" "$(col create-thin-big 2)"
	printf '| 4 KiB random writes QD32, no snapshot, IOPS | %s | 1 |\n' "$(col writes-none 1)"
	printf '| the same right after a snapshot (first writes redirect), IOPS | %s | %s × |\n' "$(col writes-after 1)" "$(col writes-after 2)"
	printf '| the same once every cluster was rewritten, IOPS | %s | %s × |\n' "$(col writes-owned 1)" "$(col writes-owned 2)"
	printf '| 4 KiB random reads QD32 of the origin, IOPS | %s | 1 |\n' "$(col reads-origin 1)"
	printf '| the same of its clone, IOPS | %s | %s × |\n' "$(col reads-clone 1)" "$(col reads-clone 2)"
} | tee "$OUT"
say "table in $OUT"
