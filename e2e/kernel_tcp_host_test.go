//go:build e2e

package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKernelTCPHostToBlkd is the NVMe/TCP scenario: the Linux nvme-tcp
// host in a guest — no RDMA device, no siw — attaches to blkd's NVMe/TCP
// port on the host: discover, connect, fio with crc32c verify, ext4 made
// and checked; then again with header and data digests, and blkd killed
// with SIGKILL and restarted under the connected host, which reconnects
// by itself with its flushed data intact and reads through the outage
// without an I/O error.
func TestKernelTCPHostToBlkd(t *testing.T) {
	s := newScenario(t)
	port := ports(24500)
	tcpPort, rdmaPort, discPort, api := port(), port(), port(), addr(port())
	d := s.startDaemon("blkd", api, "--raft-addr", addr(port()), "--tcp-addr", addr(tcpPort), "--nvme-addr", addr(rdmaPort),
		"--discovery-addr", addr(discPort))

	const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:e2e00000-0000-4000-8000-000000000007"
	s.blkctl(api, nil, "volume", "create", "tcpvol", "--size", "256MiB")
	s.blkctl(api, nil, "host", "allow", "tcpvol", hostNQN)
	var at attachInfo
	s.blkctl(api, &at, "attach", "tcpvol", "--host-nqn", hostNQN, "--transport", "tcp")
	if at.Transport != "tcp" || at.Port != tcpPort || at.SubsystemNQN == "" {
		t.Fatalf("attach --transport tcp answered %+v, want tcp on port %d", at, tcpPort)
	}
	seed := time.Now().UnixNano() % 1000000
	t.Logf("fio seed %d", seed)
	s.setEnv("TCPPORT", strconv.Itoa(tcpPort), "DISCPORT", strconv.Itoa(discPort), "NQN", at.SubsystemNQN, "HOSTNQN", hostNQN, "SEED", fmt.Sprint(seed))
	s.script("kernel_tcp_host.sh")

	g := s.boot(vmConfig{name: "tcphost", script: "kernel_tcp_host.sh", timeout: 10 * time.Minute})
	s.waitMark("ready-kill", g, 8*time.Minute)
	digests := s.metric(api, "blk_tcp_digest_connections_total")
	d.kill()
	t.Logf("blkd killed with SIGKILL under the connected host")
	time.Sleep(2 * time.Second)
	d.start()
	s.mark("restarted")
	s.wait(g)

	// Discovery through the NVMe/TCP port and through the
	// discovery-only port: both list the volume once on each I/O port,
	// never on the discovery port.
	for _, file := range []string{"discover-tcp.json", "discover-disc.json"} {
		var disc struct {
			Records []struct {
				Trtype, Subnqn, Trsvcid, Traddr string
			}
		}
		s.decode(file, &disc)
		found := 0
		for _, r := range disc.Records {
			if r.Subnqn == at.SubsystemNQN {
				found++
				switch r.Trtype {
				case "tcp":
					if r.Trsvcid != strconv.Itoa(tcpPort) {
						t.Errorf("%s: discovery record %+v: want service %d", file, r, tcpPort)
					}
				case "rdma":
					if r.Trsvcid != strconv.Itoa(rdmaPort) {
						t.Errorf("%s: discovery record %+v: want service %d", file, r, rdmaPort)
					}
				default:
					t.Errorf("%s: discovery record %+v: transport", file, r)
				}
			}
		}
		if found != 2 {
			t.Errorf("%s: discovery log %+v: want %s once per I/O port (tcp and rdma)", file, disc.Records, at.SubsystemNQN)
		}
	}
	var idc map[string]any
	s.decode("id-ctrl-tcp.json", &idc)
	if got := fmt.Sprint(idc["subnqn"]); got != at.SubsystemNQN {
		t.Errorf("id-ctrl subnqn %q, want %q", got, at.SubsystemNQN)
	}
	for _, f := range []string{"mdts", "maxcmd", "ioccsz", "sgls"} {
		t.Logf("id-ctrl over TCP %s = %v", f, idc[f])
	}
	if int(num(idc["sgls"]))&3 == 0 {
		t.Errorf("id-ctrl sgls %v: a TCP host needs SGLs", idc["sgls"])
	}
	t.Logf("max_hw_sectors_kb over TCP: %s", strings.TrimSpace(string(s.readShare("tcp_max_hw_sectors_kb"))))
	for _, job := range []string{"rand4k", "seq128k", "digest4k", "digest128k", "after"} {
		s.fioResult("fio-tcp-" + job + ".json")
	}
	if digests < 1 {
		t.Errorf("blk_tcp_digest_connections_total %v before the kill: the -g -G connect did not negotiate digests", digests)
	}
	for _, f := range []string{"blkd.log.1", "blkd.log.2"} {
		mustContain(t, f, string(s.readShare(f)), `msg="controller created"`, "host_nqn="+hostNQN)
	}
}
