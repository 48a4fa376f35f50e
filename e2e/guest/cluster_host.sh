# Scenario 4: a kernel host (nvme-rdma over siw) on a volume of a 3-node
# blkd cluster on the host; the registry's leader (another node) is killed
# while fio runs: the I/O must go on undisturbed. Then the whole cluster
# is killed and restarted together under the host (ride_restart).
# env.sh: PORT NQN HOSTNQN
. /share/lib.sh
net_user
siw_up
modprobe nvme-rdma
nvme connect -t rdma -a 10.0.2.2 -s "$PORT" -n "$NQN" --hostnqn "$HOSTNQN" \
	--reconnect-delay=1 --ctrl-loss-tmo=120 || fail "nvme connect"
wait_dev /dev/nvme0n1 30
dev=/dev/nvme0n1

fio --name=during --filename=$dev --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
	--iodepth=16 --size=48M --verify=crc32c --do_verify=1 --verify_fatal=1 \
	--output-format=json --output=/share/fio-during.json &
fio=$!
sleep 2
kill -0 $fio || fail "fio ended early"
mark io-running
wait_file /share/leader-killed 120
wait $fio || fail "fio across the leader's death"
fio --name=after --filename=$dev --ioengine=libaio --direct=1 --rw=randwrite --bs=64k \
	--iodepth=4 --offset=64M --size=16M --verify=crc32c --do_verify=1 --verify_fatal=1 \
	--output-format=json --output=/share/fio-after.json || fail "fio after the leader's death"
if dmesg | grep -E 'nvme0: (Reconnecting|resetting|I/O .* timeout|starting error recovery)'; then
	fail "the controller was disturbed"
fi
# The whole cluster killed and started again together: the host reads
# through the outage, reconnects by itself, its flushed pattern intact.
ride_restart "$dev" nvme0
fio --name=restarted --filename=$dev --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
	--iodepth=4 --offset=112M --size=8M --verify=crc32c --do_verify=1 --verify_fatal=1 \
	--output-format=json --output=/share/fio-restarted.json || fail "fio after the whole-cluster restart"
no_io_errors
nvme disconnect -n "$NQN" || fail "nvme disconnect"
log "passed"
