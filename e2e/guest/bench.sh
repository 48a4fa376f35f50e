# The end-to-end benchmarks of target/rdma (the bare transport baseline and
# the NVMe target, each in a child process) on the verbs provider in this
# guest, on Soft-RoCE over eth0, both ends here (loopback through rxe0).
# env.sh: ARGS
. /share/lib.sh
net_user
rxe_up eth0
modprobe ib_uverbs
ulimit -l unlimited
export BLK_BENCH_PROVIDER=verbs BLK_BENCH_DEVICE=rxe0 BLK_BENCH_ADDR=10.0.2.15
rc=0
cd /tmp || fail "cd /tmp"
# shellcheck disable=SC2086 # ARGS is a word list
/share/rdma-bench.test -test.run '^$' -test.bench . -test.benchmem -test.timeout=15m $ARGS >/share/bench.txt 2>&1 || rc=$?
grep -E '^(Benchmark|PASS|FAIL|ok)|--- FAIL' /share/bench.txt | tail -40
[ $rc = 0 ] || fail "benchmarks on rxe0 exited $rc"
log "passed"
