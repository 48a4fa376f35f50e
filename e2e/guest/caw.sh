# Issue 25's Compare and Write race: two guests (caw1, caw2) run blkcaw,
# blk's initiator over NVMe/TCP to blkd on the host (10.0.2.2), on one
# block: caw1 writes round 0 first, then both race to ROUNDS.
# env.sh: TCPPORT NQN ROUNDS
. /share/lib.sh
net_user
me=$(hostname)
case $me in
caw1) owner=1 peer=caw2 ;;
caw2) owner=2 peer=caw1 ;;
*) fail "unknown role $me" ;;
esac
init=
[ $me = caw1 ] && init=-init
# caw1 writes round 0 before caw2 reads the block for the first time.
[ $me = caw2 ] && wait_file /share/ready-caw1 300
/share/blkcaw -addr "10.0.2.2:$TCPPORT" -nqn "$NQN" -hostnqn "nqn.2026-11.io.blk:e2e-$me" -owner $owner \
	-rounds 0 $init -out /tmp/none || fail "blkcaw connect"
mark "ready-$me"
wait_file "/share/ready-$peer" 300
/share/blkcaw -addr "10.0.2.2:$TCPPORT" -nqn "$NQN" -hostnqn "nqn.2026-11.io.blk:e2e-$me" -owner $owner \
	-rounds "$ROUNDS" -out "/share/won-$me.txt" || fail "blkcaw"
log "passed"
