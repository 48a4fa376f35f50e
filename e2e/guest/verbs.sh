# The verbs provider's own tests (the conformance suite and its guards) in
# this guest, on one RDMA device over eth0, both ends of every connection
# here (loopback through the device). env.sh: KIND (rxe|siw) ARGS
. /share/lib.sh
net_user
case $KIND in
rxe)
	rxe_up eth0
	dev=rxe0
	;;
siw)
	siw_up
	dev=siw0
	;;
*) fail "unknown device kind $KIND" ;;
esac
modprobe ib_uverbs
ibv_devinfo -v -d $dev >/share/devinfo-$KIND.txt 2>&1 || fail "ibv_devinfo: $(cat /share/devinfo-$KIND.txt)"
log "$(grep -E 'hca_id|transport|max_qp_wr|max_cqe|max_srq_wr|max_mr_size' /share/devinfo-$KIND.txt | tr -s ' \t\n' ' ')"
ulimit -l unlimited
export BLK_VERBS_DEVICE=$dev BLK_VERBS_ADDR=10.0.2.15
rc=0
# shellcheck disable=SC2086 # ARGS is a word list
/share/verbs.test -test.v -test.count=1 -test.timeout=15m $ARGS >/share/verbs-$KIND.txt 2>&1 || rc=$?
grep -E '^(=== RUN|--- |PASS|FAIL|ok)|^\s+--- ' /share/verbs-$KIND.txt | grep -v '=== RUN' | tail -80
[ $rc = 0 ] || fail "verbs tests on $dev exited $rc"
log "passed"
