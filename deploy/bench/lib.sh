# deploy/bench/lib.sh: what the blkd bench scripts share, sourced by
# caw.sh and snapshot.sh (all of it) and by replicas.sh and rebuild.sh
# (say, die, is_ready, median: they start three nodes of their own and
# define ctl again for node1); not run on its own.
#
# Before sourcing, set bench_name (the script's name in log lines and in
# its scratch directory), and for bench_start BASE_PORT and BENCH_DIR.
# bench_start then builds blkd and blkctl from this checkout, starts one
# blkd on loopback (raft BASE_PORT+1, NVMe/TCP +11, NVMe/RDMA +21, API
# +31) and waits for it to be ready; whatever it started is stopped and
# the scratch directory removed on exit, error or Ctrl-C.

say() { printf '%s %s: %s\n' "$(date -u +%H:%M:%S)" "$bench_name" "$*" >&2; }
die() { say "error: $*"; exit 1; }

# is_ready FILE: blkd's log in FILE holds the record whose msg is ready
# (--log-format text or json).
is_ready() { grep -Eq '(^| )msg=ready( |$)|"msg":"ready"' "$1"; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# bench_start: sets scratch (the scratch directory), pid (blkd's) and api
# (its API address).
bench_start() {
	scratch=$(mktemp -d "$BENCH_DIR/blk-$bench_name.XXXXXX")
	pid=
	trap bench_cleanup EXIT INT TERM

	say "building blkd and blkctl"
	(cd "$repo" && go build -o "$scratch/blkd" ./cmd/blkd && go build -o "$scratch/blkctl" ./cmd/blkctl)
	api="127.0.0.1:$((BASE_PORT + 31))"
	mkdir -p "$scratch/node"
	"$scratch/blkd" --node-id node1 --data-dir "$scratch/node" \
		--raft-addr "127.0.0.1:$((BASE_PORT + 1))" --tcp-addr "127.0.0.1:$((BASE_PORT + 11))" \
		--nvme-addr "127.0.0.1:$((BASE_PORT + 21))" --api-addr "$api" >"$scratch/node.log" 2>&1 &
	pid=$!
	for _ in $(seq 600); do
		is_ready "$scratch/node.log" && break
		kill -0 "$pid" 2>/dev/null || { cat "$scratch/node.log" >&2; die "blkd exited"; }
		sleep 0.1
	done
	is_ready "$scratch/node.log" || die "blkd not ready in 60 s"
}

bench_cleanup() {
	[[ -n $pid ]] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
	rm -rf "$scratch"
}

# ctl ARGS...: blkctl against the started blkd.
ctl() { "$scratch/blkctl" --api "http://$api" "$@"; }
# field NAME: the first number of JSON field NAME on stdin.
field() { sed -n "s/.*\"$1\": *\([0-9.]*\).*/\1/p" | head -1; }
# median: the median of the numbers on stdin, one a line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
