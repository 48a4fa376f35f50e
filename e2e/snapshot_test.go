//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKernelSnapshotClone is the snapshot scenario (docs/snapshots.md
// §7.4): the Linux nvme-tcp host makes ext4 on a volume and writes a
// tree of files; under fio's random writes to the same file system the
// volume is snapshotted and cloned; the host mounts the clone read-write
// (the journal replays: a snapshot under writes is a crash state) and
// finds every file as it was, writes its own, and both file systems fsck
// clean. Deleting the snapshot is refused while the clone shares it;
// after the clone is flattened under the host, the snapshot goes and the
// clone still reads and fscks the same.
func TestKernelSnapshotClone(t *testing.T) {
	s := newScenario(t)
	port := ports(24700)
	tcpPort, api := port(), addr(port())
	s.startDaemon("blkd", api, "--raft-addr", addr(port()), "--tcp-addr", addr(tcpPort), "--nvme-addr", addr(port()))

	const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:e2e00000-0000-4000-8000-000000000024"
	s.blkctl(api, nil, "volume", "create", "v", "--size", "512MiB", "--replicas", "1")
	s.blkctl(api, nil, "host", "allow", "v", hostNQN)
	var at attachInfo
	s.blkctl(api, &at, "attach", "v", "--host-nqn", hostNQN, "--transport", "tcp")
	seed := time.Now().UnixNano()%100000 + 1
	t.Logf("seed %d", seed)
	s.setEnv("TCPPORT", strconv.Itoa(tcpPort), "NQN", at.SubsystemNQN, "HOSTNQN", hostNQN, "SEED", fmt.Sprint(seed))
	s.script("snapshot.sh")
	g := s.boot(vmConfig{name: "snaphost", script: "snapshot.sh", timeout: 12 * time.Minute})

	s.waitMark("ready-snap", g, 8*time.Minute)
	start := time.Now()
	var snap struct {
		Name      string   `json:"name"`
		State     string   `json:"state"`
		Nodes     []string `json:"nodes"`
		HeldNanos int64    `json:"held_ns"`
	}
	s.blkctl(api, &snap, "volume", "snapshot", "v", "s1")
	took := time.Since(start)
	if snap.State != "ready" {
		t.Fatalf("snapshot v@s1: %+v", snap)
	}
	t.Logf("snapshot v@s1 under fio: blkctl took %v, writes held %v", took, time.Duration(snap.HeldNanos))
	var clone struct {
		Name    string `json:"name"`
		NQN     string `json:"nqn"`
		CloneOf string `json:"clone_of"`
	}
	s.blkctl(api, &clone, "volume", "clone", "v@s1", "c1")
	if clone.CloneOf != "v@s1" || clone.NQN == "" {
		t.Fatalf("clone c1: %+v", clone)
	}
	s.blkctl(api, nil, "host", "allow", "c1", hostNQN)
	s.blkctl(api, nil, "attach", "c1", "--host-nqn", hostNQN, "--transport", "tcp")
	if err := os.WriteFile(s.path("clone-nqn"), []byte(clone.NQN+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.mark("snapped")

	s.waitMark("ready-flatten", g, 8*time.Minute)
	err := s.blkctlErr(api, nil, "volume", "delete", "v@s1")
	if err == nil || !strings.Contains(err.Error(), "c1") {
		t.Fatalf("delete v@s1 with clone c1: %v, want a refusal naming c1", err)
	}
	start = time.Now()
	s.blkctl(api, nil, "volume", "flatten", "c1", "--wait")
	t.Logf("flatten c1: %v", time.Since(start))
	s.blkctl(api, nil, "volume", "delete", "v@s1")
	s.mark("flattened")
	s.wait(g)
	s.fioResult("fio-snap-busy.json")
}
