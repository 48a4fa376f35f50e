# Scenario: blk's CSI node service (blk-csi --mode all) in this guest, the
# Linux nvme-tcp host under it, blkd on the host (10.0.2.2). The real
# csi-sanity runs all its specs against it; then the test drives
# the driver over gRPC (a forward to port 10000) and this script writes
# and reads through the mounts it makes. env.sh: APIPORT HOSTNQN
. /share/lib.sh
net_user
modprobe nvme-tcp
modprobe nbd

log "blk-csi: node and controller services on :10000"
mkdir -p /tmp/blk-csi
/share/blk-csi --mode all --endpoint tcp://0.0.0.0:10000 --api "10.0.2.2:$APIPORT" --host-nqn "$HOSTNQN" \
	--node-name guest1 --state-dir /tmp/blk-csi --log-format text --log-level debug >/share/blk-csi.log 2>&1 &
csi=$!
n=0
until grep -q 'msg=serving' /share/blk-csi.log; do
	kill -0 $csi 2>/dev/null || fail "blk-csi exited: $(tail -3 /share/blk-csi.log)"
	n=$((n + 1)); [ $n -le 600 ] || fail "blk-csi not serving after 60 s"
	sleep 0.1
done

log "csi-sanity: every spec (identity, controller against blkd, node against this kernel)"
t0=$(cut -d' ' -f1 /proc/uptime)
/share/csi-sanity --csi.endpoint 127.0.0.1:10000 --csi.stagingdir /tmp/csi-stage --csi.mountdir /tmp/csi-mount \
	--csi.testvolumesize 67108864 --csi.testvolumeexpandsize 134217728 --csi.junitfile /share/csi-sanity.xml \
	--ginkgo.no-color --ginkgo.v >/share/csi-sanity.txt 2>&1 ||
	fail "csi-sanity: $(grep -a -E '\[FAIL\]|Ran [0-9]+ of' /share/csi-sanity.txt | head -8 | tr '\n' ' ')"
t1=$(cut -d' ' -f1 /proc/uptime)
echo "$t0 $t1" | awk '{print $2 - $1}' >/share/csi-sanity-seconds
log "csi-sanity passed in $(cat /share/csi-sanity-seconds) s: $(grep -a 'Ran [0-9]* of' /share/csi-sanity.txt)"
ls /sys/class/nvme >/share/nvme-after-sanity.txt 2>&1 || true
mark sanity-done

log "data survives unstage and stage: write through the published mount"
wait_file /share/write 300
head -c 4194304 /dev/urandom >/tmp/data
cp /tmp/data /tmp/e2e-target/file
sync
grep -E ' /tmp/e2e-(stage|target) ' /proc/self/mountinfo >/share/mounts-first.txt
mark written

wait_file /share/unstaged 300
ls /sys/class/nvme >/share/nvme-unstaged.txt 2>&1 || true
mark checked-unstaged

wait_file /share/read 300
cmp /tmp/data /tmp/e2e-target/file || fail "the file read back after unstage and stage differs"
grep -E ' /tmp/e2e-(stage|target) ' /proc/self/mountinfo >/share/mounts-second.txt
log "read back equal"
mark read-ok

wait_file /share/done 600
kill $csi
wait $csi || true
no_io_errors
log "passed"
