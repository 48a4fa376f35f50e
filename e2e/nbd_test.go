//go:build e2e

package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestNBDAttach is scenario 3: blkctl attach --nbd in a guest (whose kernel
// has nbd) against blkd on the host, advertised to the guest as 10.0.2.2:
// the volume is /dev/nbd0 with the volume's size, fio verifies, a flushed
// pattern reads back through a second attach, and each detach (SIGTERM)
// removes the device and the attachment.
func TestNBDAttach(t *testing.T) {
	s := newScenario(t)
	port := ports(24300)
	nvmePort, apiPort := port(), port()
	api := addr(apiPort)
	// blkctl attach --nbd in the guest connects over NVMe/TCP, the
	// default (the RDMA port stays for the record).
	s.startDaemon("blkd", api, "--raft-addr", addr(port()), "--nvme-addr", addr(nvmePort), "--tcp-addr", addr(port()),
		"--advertise-addr", "10.0.2.2")

	const hostNQN = "nqn.2026-11.io.blk:e2e-nbd-host"
	const size = 64 << 20
	s.blkctl(api, nil, "volume", "create", "vol2", "--size", "64MiB")
	s.blkctl(api, nil, "host", "allow", "vol2", hostNQN)
	s.binaries()
	s.setEnv("API", "10.0.2.2:"+strconv.Itoa(apiPort), "VOLUME", "vol2", "HOSTNQN", hostNQN, "SIZE", strconv.Itoa(size))
	s.script("nbd.sh")
	g := s.boot(vmConfig{name: "nbdhost", script: "nbd.sh", timeout: 8 * time.Minute})
	s.wait(g)

	for _, job := range []string{"fio-nbd4k.json", "fio-nbd128k.json"} {
		s.fioResult(job)
	}
	out := string(s.readShare("attach-1.out"))
	mustContain(t, "blkctl attach --nbd output", out, "/dev/nbd0", "10.0.2.2")
	// Both detaches removed the attachment: a third detach finds none.
	err := s.blkctlErr(api, nil, "detach", "vol2", "--host-nqn", hostNQN)
	if err == nil || !strings.Contains(err.Error(), "not attached") {
		t.Errorf("detach after the guest's detaches: %v, want not attached", err)
	}
}
