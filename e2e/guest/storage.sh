# The storage guest of the verbs scenarios: on the link (192.168.77.1) it
# brings up DEVKIND (rxe, siw, or none for the soft provider) and serves
# with ROLE: blkd (PROVIDER soft|verbs; volumes v1 (128 MiB) and v2 (64 MiB) for
# HOSTNQN and VERIFYNQN) or nvmet (the Linux target on a 64 MiB RAM disk,
# subsystem NQN, for VERIFYNQN). Then it waits for the host guest.
# env.sh: ROLE S_DEVKIND S_PROVIDER NQN HOSTNQN VERIFYNQN
. /share/lib.sh
DEVKIND=$S_DEVKIND PROVIDER=${S_PROVIDER:-soft}
net_link
rdma_up "$DEVKIND" eth1
case $ROLE in
blkd)
	dev=
	[ "$PROVIDER" = verbs ] && dev="--rdma-device ${DEVKIND}0"
	# shellcheck disable=SC2086
	/share/blkd --data-dir /tmp/blk --raft-addr 127.0.0.1:7000 --api-addr 127.0.0.1:7070 \
		--nvme-addr 192.168.77.1:4420 --rdma-provider "$PROVIDER" $dev >/share/blkd.out 2>/share/blkd.err &
	blkd=$!
	n=0
	# blkd logs on stderr; ready is the record whose msg is ready (text
	# or JSON), and nothing goes to stdout.
	until grep -Eq '(^| )msg=ready( |$)|"msg":"ready"' /share/blkd.err 2>/dev/null; do
		kill -0 $blkd 2>/dev/null || fail "blkd exited: $(cat /share/blkd.err)"
		n=$((n + 1)); [ $n -le 600 ] || fail "blkd not ready"
		sleep 0.1
	done
	c="/share/blkctl --api http://127.0.0.1:7070"
	$c volume create v1 --size 128MiB >/dev/null && $c host allow v1 "$HOSTNQN" >/dev/null || fail "v1"
	$c volume create v2 --size 64MiB >/dev/null && $c host allow v2 "$VERIFYNQN" >/dev/null || fail "v2"
	log "blkd on $PROVIDER ${dev:-} serving v1 and v2"
	;;
nvmet)
	nvmet_serve 192.168.77.1 "$NQN"
	;;
*) fail "ROLE $ROLE" ;;
esac
mark storage-ready
wait_file /share/host-done 900
if [ "$ROLE" = blkd ]; then
	wget -q -O /share/metrics.txt http://127.0.0.1:7070/metrics || fail "GET /metrics"
	kill -TERM $blkd
	wait $blkd || fail "blkd exited $? on SIGTERM: $(tail -5 /share/blkd.err)"
fi
no_io_errors
log "passed"
