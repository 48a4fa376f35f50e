//go:build e2e

package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestClusterConnectAll is issue 25's discovery scenario: a 3-node blkd
// cluster, one single-replica volume on each node, and a Linux host
// (guest, nvme-tcp) that runs nvme connect-all through node1's port
// only. node1's discovery log lists the volumes of all three nodes, each
// on the port of the node that serves it, so connect-all connects all
// three; fio writes and verifies on each.
func TestClusterConnectAll(t *testing.T) {
	s := newScenario(t)
	port := ports(25300)
	nodes, order, _ := s.startCluster(port)
	const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:e2e0ca11-0000-4000-8000-000000000003"
	nqns := map[string]string{} // NQN → the node serving it
	var list []string
	for _, id := range order {
		var v replicatedVolume
		name := "ca-" + id
		s.blkctl(nodes["node1"].api, &v, "volume", "create", name, "--size", "32MiB", "--replicas", "1", "--node", id)
		s.blkctl(nodes["node1"].api, nil, "host", "allow", name, hostNQN)
		s.blkctl(nodes["node1"].api, &v, "volume", "show", name)
		if v.Node != id || v.NQN == "" {
			t.Fatalf("volume %s: %+v, want it on %s", name, v, id)
		}
		nqns[v.NQN] = id
		list = append(list, v.NQN)
	}
	s.setEnv("DISC", strconv.Itoa(nodes["node1"].tcpPort), "NQNS", strings.Join(list, " "), "HOSTNQN", hostNQN)
	s.script("connect_all.sh")
	g := s.boot(vmConfig{name: "cahost", script: "connect_all.sh", timeout: 10 * time.Minute})
	s.wait(g)

	var disc struct {
		Records []struct {
			Trtype, Subnqn, Trsvcid, Traddr string
		}
	}
	s.decode("discover.json", &disc)
	seen := map[string]bool{}
	for _, r := range disc.Records {
		id, ok := nqns[r.Subnqn]
		if !ok {
			continue
		}
		if r.Trtype == "tcp" {
			if r.Trsvcid != strconv.Itoa(nodes[id].tcpPort) || r.Traddr != "10.0.2.2" {
				t.Errorf("node1's discovery log lists %s (on %s) at %s:%s, want 10.0.2.2:%d", r.Subnqn, id, r.Traddr, r.Trsvcid, nodes[id].tcpPort)
			}
			seen[r.Subnqn] = true
		}
	}
	for nqn, id := range nqns {
		if !seen[nqn] {
			t.Errorf("node1's discovery log has no NVMe/TCP entry for %s, served by %s", nqn, id)
		}
	}
	for i := range list {
		s.fioResult(fmt.Sprintf("fio-%d.json", i))
	}
}
