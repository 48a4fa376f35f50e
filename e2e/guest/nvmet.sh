# Scenario 2: the Linux NVMe target (nvmet-rdma over siw) in this guest,
# serving a 64 MiB RAM disk to blk's initiator on the host (through the
# user-mode network's forward to 10.0.2.15:4420). env.sh: NQN HOSTNQN IMAGE_MIB
. /share/lib.sh
net_user
siw_up
modprobe nvmet
modprobe nvmet-rdma
modprobe brd rd_nr=1 rd_size=65536
wait_dev /dev/ram0 10

cd /sys/kernel/config/nvmet
mkdir "hosts/$HOSTNQN"
mkdir "subsystems/$NQN"
echo 0 >"subsystems/$NQN/attr_allow_any_host"
ln -s "/sys/kernel/config/nvmet/hosts/$HOSTNQN" "subsystems/$NQN/allowed_hosts/$HOSTNQN"
mkdir "subsystems/$NQN/namespaces/1"
echo /dev/ram0 >"subsystems/$NQN/namespaces/1/device_path"
echo 1 >"subsystems/$NQN/namespaces/1/enable"
mkdir ports/1
echo rdma >ports/1/addr_trtype
echo ipv4 >ports/1/addr_adrfam
echo 10.0.2.15 >ports/1/addr_traddr
echo 4420 >ports/1/addr_trsvcid
ln -s "/sys/kernel/config/nvmet/subsystems/$NQN" ports/1/subsystems/
cd /tmp
log "nvmet-rdma listening on 10.0.2.15:4420"
mark target-ready

wait_file /share/host-done 900
# What blk's initiator wrote is on the RAM disk, byte for byte.
dd if=/dev/ram0 of=/tmp/image bs=1M count="$IMAGE_MIB" 2>/dev/null
cmp /tmp/image /share/expected.img || fail "the RAM disk differs from what the initiator wrote"
log "the RAM disk holds exactly what the initiator wrote ($IMAGE_MIB MiB)"
no_io_errors
log "passed"
