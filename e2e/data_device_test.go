//go:build e2e

package e2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/loopdev"
)

// TestKernelTCPHostDataDevice: blkd on the host keeps its volumes on a
// block device (--data-device on a loop device); the Linux nvme-tcp host
// in a guest writes and verifies with fio, makes an ext4 filesystem on
// the volume, and rides a SIGKILL and restart of blkd (which must take
// the device back: the dead process's exclusive hold is gone) with its
// data intact.
func TestKernelTCPHostDataDevice(t *testing.T) {
	s := newScenario(t)
	dev := loopdev.Attach(t, 256<<20)
	port := ports(24600)
	tcpPort, api := port(), addr(port())
	d := s.startDaemon("blkd", api, "--raft-addr", addr(port()), "--tcp-addr", addr(tcpPort), "--nvme-addr", addr(port()),
		"--data-device", dev)

	const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:e2e00000-0000-4000-8000-000000000009"
	s.blkctl(api, nil, "volume", "create", "devvol", "--size", "128MiB")
	s.blkctl(api, nil, "host", "allow", "devvol", hostNQN)
	var at attachInfo
	s.blkctl(api, &at, "attach", "devvol", "--host-nqn", hostNQN, "--transport", "tcp")
	seed := time.Now().UnixNano() % 1000000
	t.Logf("fio seed %d", seed)
	s.setEnv("TCPPORT", strconv.Itoa(tcpPort), "NQN", at.SubsystemNQN, "HOSTNQN", hostNQN, "SEED", fmt.Sprint(seed))
	s.script("data_device.sh")

	g := s.boot(vmConfig{name: "devhost", script: "data_device.sh", timeout: 10 * time.Minute})
	s.waitMark("ready-kill", g, 8*time.Minute)
	d.kill()
	t.Logf("blkd killed with SIGKILL under the connected host")
	time.Sleep(2 * time.Second)
	d.start()
	s.mark("restarted")
	s.wait(g)

	for _, job := range []string{"rand4k", "seq128k"} {
		s.fioResult("fio-dev-" + job + ".json")
	}
	for _, f := range []string{"blkd.log.1", "blkd.log.2"} {
		mustContain(t, f, string(s.readShare(f)), `msg="volume store opened"`, "area="+dev, `area_kind="block device"`, "area_bytes=268435456")
	}
}
