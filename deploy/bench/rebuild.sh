#!/usr/bin/env bash
# deploy/bench/rebuild.sh: how fast a replica is rebuilt (issue 23, goal 3:
# unthrottled, at least 0.8x the slower of disk and link).
#
# Three blkd (built from this checkout) on loopback, each in a zone of its
# own. The baseline, "disk and link": a volume of one replica on node1
# written whole with 128 KiB writes at QD 8 through blkctl bench over
# NVMe/TCP (the store's write path and the loopback link a rebuild uses
# too). Then a volume of two replicas (node1 primary, and node2 or
# node3) written whole the same way, and:
#   full:        volume replace-replica of the second replica onto the
#                third node: node1 copies every allocated extent there;
#   incremental: that replica's node stopped (SIGSTOP: cut off, its
#                process alive), DIRTY 4 KiB random writes, resumed
#                (SIGCONT): node1 copies the regions its log marked;
#   compare:     that node killed (SIGKILL), DIRTY 4 KiB random writes,
#                started again: node1 compares digests of the whole
#                volume and copies the regions that differ (a process
#                that died may have lost writes it acknowledged, so the
#                log is not trusted: docs/replication.md §5).
# Each rebuild's bytes, time and rate come from node1's "rebuild done"
# log line. One markdown table.
#
# The ceiling. The baseline only writes; a copy reads on node1 and
# writes on node2, both on BENCH_DIR's disk, and crosses the link. So
# before the nodes start, the raw figures: the disk with fio (if
# installed: 1 MiB O_DIRECT sequential, QD 8, 1 GiB files) writing,
# reading, and "copying" (reading one file while writing another: the
# rate of each), and the link with deploy/bench/loopback (one TCP
# connection over 127.0.0.1). The copy's ceiling is the slower of the
# disk's copy rate (the mean of the two directions: the disk's combined
# throughput, shared evenly, as a copy needs) and the link; the table
# gives each rebuild against the baseline and against that ceiling. All
# of it shares the machine's cores with whatever else runs: the load
# average is printed under the table.
#
# Usage: deploy/bench/rebuild.sh
#
# Environment (defaults in brackets):
#   SIZE      volume size [1GiB]
#   DIRTY     4 KiB random writes while node2 is away [16384]
#   BASE_PORT raft BASE_PORT+1..3, NVMe/TCP +11..13, NVMe/RDMA +21..23, API +31..33 [25500]
#   BENCH_DIR where the scratch directory goes: the disk under test [/var/tmp]
#   OUT       the table's file [./rebuild-YYYYMMDDTHHMMZ.md]
#
# Everything it starts is stopped and the scratch directory removed on
# exit, error or Ctrl-C.

set -euo pipefail

bench_name=rebuild
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # say, die, is_ready

SIZE=${SIZE:-1GiB}
DIRTY=${DIRTY:-16384}
BASE_PORT=${BASE_PORT:-25500}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
OUT=${OUT:-./rebuild-$(date -u +%Y%m%dT%H%MZ).md}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

scratch=$(mktemp -d "$BENCH_DIR/blk-rebuild.XXXXXX")
declare -A pid
cleanup() {
	for p in "${pid[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pid[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$scratch"
}
trap cleanup EXIT INT TERM

say "building blkd and blkctl"
(cd "$repo" && go build -o "$scratch/blkd" ./cmd/blkd && go build -o "$scratch/blkctl" ./cmd/blkctl &&
	go build -o "$scratch/loopback" ./deploy/bench/loopback)

# fio1 ARGS...: one fio run of 1 MiB O_DIRECT sequential I/O at QD 8 on
# 1 GiB files in the scratch directory; prints each job's MB/s (read for
# a reader, write for a writer), one a line.
fio1() {
	fio --output-format=terse --terse-version=3 --direct=1 --ioengine=libaio --iodepth=8 --bs=1M --size=1g "$@" |
		awk -F';' '{ print ($7 > 0 ? $7 : $48) * 1.024 / 1000 }'
}
disk_w=-- disk_r=-- disk_cr=-- disk_cw=--
if command -v fio >/dev/null; then
	say "disk: fio in $scratch"
	disk_w=$(fio1 --name=w --rw=write --filename="$scratch/fio-a")
	disk_r=$(fio1 --name=r --rw=read --filename="$scratch/fio-a")
	read -r disk_cr disk_cw < <(fio1 --name=r --rw=read --filename="$scratch/fio-a" --name=w --rw=write --filename="$scratch/fio-b" | paste -sd' ')
	rm -f "$scratch/fio-a" "$scratch/fio-b"
else
	say "disk: no fio, no disk figures"
fi
say "link: loopback TCP"
link=$("$scratch/loopback")
# The copy's ceiling: the slower of the disk's copy rate (its combined
# throughput, halved) and the link.
ceiling=$(awk -v r="$disk_cr" -v w="$disk_cw" -v l="$link" 'BEGIN { c = l; if (r != "--" && (r + w) / 2 < c) c = (r + w) / 2; printf "%.1f", c }')
say "disk write $disk_w, read $disk_r, copy $disk_cr read + $disk_cw write MB/s; link $link MB/s; ceiling $ceiling MB/s"

api() { echo "127.0.0.1:$((BASE_PORT + 30 + $1))"; }
runs=0

# start N: start node N (joining node1 the first time), wait for ready.
start() {
	local n=$1 join=()
	[[ $n != 1 && ! -d "$scratch/node$n/meta" ]] && join=(--join "$(api 1)")
	mkdir -p "$scratch/node$n"
	runs=$((runs + 1))
	local log="$scratch/node$n.log.$runs"
	"$scratch/blkd" --node-id "node$n" --data-dir "$scratch/node$n" --zone "zone-$n" \
		--raft-addr "127.0.0.1:$((BASE_PORT + n))" --tcp-addr "127.0.0.1:$((BASE_PORT + 10 + n))" \
		--nvme-addr "127.0.0.1:$((BASE_PORT + 20 + n))" --api-addr "$(api "$n")" --poll-spin 0 \
		"${join[@]}" >"$log" 2>&1 &
	pid[$n]=$!
	ln -sf "$log" "$scratch/node$n.log"
	for _ in $(seq 600); do
		is_ready "$log" && return
		kill -0 "${pid[$n]}" 2>/dev/null || { cat "$log" >&2; die "node$n exited"; }
		sleep 0.1
	done
	die "node$n not ready in 60 s"
}
stop() { kill "-$2" "${pid[$1]}"; wait "${pid[$1]}" 2>/dev/null || true; unset "pid[$1]"; }
ctl() { "$scratch/blkctl" --api "http://$(api 1)" "$@"; }
for n in 1 2 3; do start "$n"; done
host=nqn.2026-11.io.blk:rebuild-bench
bench() { ctl -o json bench "$@" --host-nqn "$host" --transport tcp; }
mbps() { sed -n 's/.*"mb_per_s": *\([0-9.]*\).*/\1/p'; }

ctl volume create one --size "$SIZE" --node node1 --replicas 1 >/dev/null
ctl host allow one "$host" >/dev/null
bytes=$(ctl -o json volume show one | sed -n 's/.*"size_bytes": *\([0-9]*\).*/\1/p')
ios=$((bytes / 131072))
say "baseline: $SIZE of one replica written with 128 KiB writes at QD 8"
base=$(bench one --rw write --bs 128KiB --qd 8 --ios "$ios")
base_mbps=$(mbps <<<"$base")
[[ -n $base_mbps ]] || base_mbps=$(awk -v b="$bytes" -v s="$(sed -n 's/.*"seconds": *\([0-9.]*\).*/\1/p' <<<"$base")" 'BEGIN {printf "%.1f", b/1e6/s}')
say "baseline $base_mbps MB/s"

ctl volume create two --size "$SIZE" --node node1 --replicas 2 >/dev/null
ctl host allow two "$host" >/dev/null
say "writing the 2-replica volume whole"
bench two --rw write --bs 128KiB --qd 8 --ios "$ios" >/dev/null
second=$(ctl -o json volume show two | tr -d ' \n' | grep -o '"node":"node[0-9]","state":"[a-z-]*"' | grep -v node1 | head -1 | sed 's/.*"node":"\(node[0-9]\)".*/\1/')
[[ -n $second ]] || die "no second replica of volume two"
sn=${second#node}

# rebuilt MODE: wait for node1's next "rebuild done" line of MODE and print
# "bytes seconds MB/s".
rebuilt() {
	local mode=$1 before=$2
	for _ in $(seq 3000); do
		line=$( (grep -h 'msg="rebuild done"' "$scratch"/node1.log.* || true) | (grep "mode=$mode" || true) | sed -n "$((before + 1))p")
		if [[ -n $line ]]; then
			b=$(sed -n 's/.* copied_bytes=\([0-9]*\).*/\1/p' <<<"$line")
			t=$(sed -n 's/.* took=\([0-9.]*[a-zµ]*\).*/\1/p' <<<"$line")
			r=$(sed -n 's/.* copied_mb_per_s=\([0-9.]*\).*/\1/p' <<<"$line")
			echo "$b $t $r"
			return
		fi
		sleep 0.2
	done
	die "no $mode rebuild done within 600 s"
}
count() { (grep -h 'msg="rebuild done"' "$scratch"/node1.log.* || true) | grep -c "mode=$1" || true; }

third=node1
for n in node2 node3; do [[ $n != "$second" ]] && third=$n; done
say "full: the replica on $second replaced by one on $third"
n0=$(count full)
ctl volume replace-replica two "$second" --to "$third" >/dev/null
read -r fb ft fr < <(rebuilt full "$n0")
say "full: $fb bytes in $ft, $fr MB/s"
second=$third
sn=${second#node}
# until the replaced replica is removed and the new one is a leg
for _ in $(seq 300); do
	ctl -o json volume show two | tr -d ' \n' | grep -q '"state":"out-of-sync"\|"state":"rebuilding"\|"replaced_by"' || break
	sleep 0.2
done

say "incremental: $second stopped, $DIRTY random 4 KiB writes, $second resumed"
n0=$(count incremental)
kill -STOP "${pid[$sn]}"
bench two --rw randwrite --bs 4KiB --qd 32 --ios "$DIRTY" >/dev/null
kill -CONT "${pid[$sn]}"
read -r ib it ir < <(rebuilt incremental "$n0")
say "incremental: $ib bytes in $it, $ir MB/s"

say "compare: $second killed, $DIRTY random 4 KiB writes, $second started"
n0=$(count compare)
stop "$sn" KILL
bench two --rw randwrite --bs 4KiB --qd 32 --ios "$DIRTY" >/dev/null
start "$sn"
read -r cb ct cr < <(rebuilt compare "$n0")
say "compare: $cb bytes in $ct, $cr MB/s"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }
{
	echo "| what | bytes | time | MB/s | vs baseline | vs ceiling |"
	echo "| --- | ---: | ---: | ---: | ---: | ---: |"
	printf '| disk (fio, 1 MiB O_DIRECT QD 8): write | | | %s | | |\n' "$disk_w"
	printf '| disk: read | | | %s | | |\n' "$disk_r"
	printf '| disk: copy (read one file while writing another), read / write | | | %s / %s | | |\n' "$disk_cr" "$disk_cw"
	printf '| link: loopback TCP, one connection | | | %s | | |\n' "$link"
	printf '| ceiling of a copy: the slower of the disk copy (mean of both directions) and the link | | | %s | | 1.00 |\n' "$ceiling"
	printf '| baseline: %s of one replica, 128 KiB writes QD 8 | %s | | %s | 1.00 | |\n' "$SIZE" "$bytes" "$base_mbps"
	printf '| full rebuild, unthrottled | %s | %s | %s | %s | %s |\n' "$fb" "$ft" "$fr" "$(ratio "$fr" "$base_mbps")" "$(ratio "$fr" "$ceiling")"
	printf '| incremental rebuild after %s random 4 KiB writes | %s | %s | %s | %s | %s |\n' "$DIRTY" "$ib" "$it" "$ir" "$(ratio "$ir" "$base_mbps")" "$(ratio "$ir" "$ceiling")"
	printf '| compare rebuild after %s random 4 KiB writes (bytes: copied; time: the whole volume compared) | %s | %s | %s | | |\n' "$DIRTY" "$cb" "$ct" "$cr"
	printf '\nload average at the end: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
say "table in $OUT"
