#!/usr/bin/env bash
# local-cluster.sh: build blkd and run a 3-node blk cluster on loopback.
#
#   ./local-cluster.sh            build, start node1 (bootstrap), node2 and node3
#                                 (--join node1), print GET /v1/cluster, then
#                                 watch them; Ctrl-C stops all three. A node that
#                                 dies is reported and the others keep running
#                                 (the cluster shows it down within ~8 s).
#   ./local-cluster.sh restart N  start node N again (after it died or was killed)
#   ./local-cluster.sh stop       stop a cluster started earlier (from any shell).
#
# The management API of every node answers (writes follow the leader):
#   blkctl --api http://127.0.0.1:7071 cluster status
#
# Ports: raft 7001-7003, NVMe/TCP 4421-4423, NVMe/RDMA 4431-4433, API 7071-7073. Data, logs and
# pid files live under ./blk-cluster (relative to the current directory;
# BLK_CLUSTER_DIR overrides). Restarting reuses the data: the nodes keep
# their raft state, so node2 and node3 rejoin without asking again.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
base=${BLK_CLUSTER_DIR:-$PWD/blk-cluster}
bin=$base/bin/blkd

stop_all() {
	local n pid
	for n in 3 2 1; do
		if [[ -f $base/node$n.pid ]]; then
			pid=$(<"$base/node$n.pid")
			if kill -0 "$pid" 2>/dev/null; then
				echo "stopping node$n (pid $pid)"
				kill -TERM "$pid" 2>/dev/null || true
				for _ in $(seq 100); do
					kill -0 "$pid" 2>/dev/null || break
					sleep 0.1
				done
				kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
			fi
			rm -f "$base/node$n.pid"
		fi
	done
}

case ${1:-} in
stop)
	touch "$base/stopping"
	stop_all
	exit 0
	;;
restart) ;;
"") ;;
*)
	echo "usage: $0 [stop | restart N]" >&2
	exit 2
	;;
esac

mkdir -p "$base/bin"
if [[ ${1:-} != restart || ! -x $bin ]]; then
	echo "building blkd into $bin"
	(cd "$repo" && go build -o "$bin" ./cmd/blkd)
fi

launch() { # n [extra flags...]
	local n=$1
	shift
	if [[ -f $base/node$n.pid ]] && kill -0 "$(<"$base/node$n.pid")" 2>/dev/null; then
		echo "node$n already running (pid $(<"$base/node$n.pid")); run '$0 stop' first" >&2
		exit 1
	fi
	mkdir -p "$base/node$n"
	"$bin" --node-id "node$n" --data-dir "$base/node$n" \
		--raft-addr "127.0.0.1:700$n" --tcp-addr "127.0.0.1:442$n" --nvme-addr "127.0.0.1:443$n" --api-addr "127.0.0.1:707$n" \
		--zone "zone-$n" \
		"$@" >"$base/node$n.log" 2>&1 &
	echo $! >"$base/node$n.pid"
}

# is_ready FILE: blkd's log in FILE holds the record whose msg is ready
# (--log-format text or json).
is_ready() { grep -Eq '(^| )msg=ready( |$)|"msg":"ready"' "$1"; }

wait_ready() { # n
	local n=$1 pid
	pid=$(<"$base/node$n.pid")
	for _ in $(seq 900); do # up to 90 s
		if is_ready "$base/node$n.log"; then
			echo "node$n ready (pid $pid, api http://127.0.0.1:707$n, log $base/node$n.log)"
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "node$n exited; its log:" >&2
			cat "$base/node$n.log" >&2
			return 1
		fi
		sleep 0.1
	done
	echo "node$n not ready within 90 s; its log:" >&2
	cat "$base/node$n.log" >&2
	return 1
}

if [[ ${1:-} == restart ]]; then
	n=${2:-}
	if [[ ! $n =~ ^[123]$ ]]; then
		echo "usage: $0 restart N (N: 1, 2 or 3)" >&2
		exit 2
	fi
	# Its data dir holds its raft state: it is a member, and --join (a node
	# that is up, for a node that lost its data dir and must join again) is
	# a no-op; it waits for the leader and re-registers its addresses.
	join=()
	for m in 1 2 3; do
		if [[ $m != "$n" && -f $base/node$m.pid ]] && kill -0 "$(<"$base/node$m.pid")" 2>/dev/null; then
			join=(--join "127.0.0.1:707$m")
			break
		fi
	done
	rm -f "$base/node$n.pid"
	launch "$n" "${join[@]}"
	wait_ready "$n"
	exit 0
fi

rm -f "$base/stopping"
trap 'echo; touch "$base/stopping"; stop_all; exit 0' INT TERM

# All three start at once: on a restart none can finish starting before a
# quorum of them runs. The first time, node2 and node3 retry their join
# until node1 is up; on a restart their data dirs hold raft state, they are
# members, and --join is a no-op: the three elect a leader among themselves
# (whichever wins serves the others' registrations while it starts).
launch 1
launch 2 --join 127.0.0.1:7071
launch 3 --join 127.0.0.1:7071
for n in 1 2 3; do
	wait_ready $n || {
		stop_all
		exit 1
	}
done

echo "GET http://127.0.0.1:7071/v1/cluster"
if command -v curl >/dev/null; then
	curl -fsS http://127.0.0.1:7071/v1/cluster
	echo
fi
echo "cluster running; the API of any node answers, e.g. blkctl --api http://127.0.0.1:7071 cluster status"
echo "Ctrl-C (or '$0 stop' from another shell) stops it; '$0 restart N' starts a node that died"
declare -A reported=()
while true; do
	if [[ -f $base/stopping ]]; then
		echo "stopped ('$0 stop')"
		exit 0
	fi
	for n in 1 2 3; do
		pid=
		[[ -f $base/node$n.pid ]] && pid=$(<"$base/node$n.pid")
		if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
			if [[ -n ${reported[$n]:-} ]]; then
				echo "node$n is running again (pid $pid)"
				unset "reported[$n]"
			fi
		elif [[ -z ${reported[$n]:-} ]]; then
			echo "node$n is gone (see $base/node$n.log); the other nodes keep running and show it down within ~8 s." >&2
			echo "  restart it with: $0 restart $n" >&2
			reported[$n]=1
		fi
	done
	sleep 1 &
	wait $! || true
done
