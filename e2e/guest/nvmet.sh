# Scenario 2: the Linux NVMe target (nvmet-rdma over siw, and nvmet-tcp) in
# this guest, serving a 64 MiB RAM disk to blk's initiator on the host
# (through the user-mode network's forwards to 10.0.2.15:4420 and :4421). env.sh: NQN HOSTNQN IMAGE_MIB
. /share/lib.sh
net_user
siw_up
nvmet_serve 10.0.2.15 "$NQN" "$HOSTNQN"
nvmet_tcp_port 10.0.2.15 4421 "$NQN"
mark target-ready

wait_file /share/host-done 900
# What blk's initiator wrote is on the RAM disk, byte for byte.
dd if=/dev/ram0 of=/tmp/image bs=1M count="$IMAGE_MIB" 2>/dev/null
cmp /tmp/image /share/expected.img || fail "the RAM disk differs from what the initiator wrote"
log "the RAM disk holds exactly what the initiator wrote ($IMAGE_MIB MiB)"
no_io_errors
log "passed"
