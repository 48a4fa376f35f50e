package main

import (
	"crypto/rand"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/store"
)

// TestTermCheck: when a primary's term begins, an in-sync replica that
// holds other bytes than the primary's copy (here two regions written
// into a secondary's store while the cluster was down, as writes in
// flight at a crash reach some copies only: one where the primary has
// data, one where it has none) is taken out of sync with the reason, and
// rebuilt by a compare that copies back exactly those regions; the
// other replica is found equal; verify and the three stores agree with
// what the host wrote.
func TestTermCheck(t *testing.T) {
	c, ids, leader := startZoned(t, 3)
	var v replicatedJSON
	a := pinnedVolume(t, c, ids, leader, "t", "16MiB", &v)
	pin := v.Node
	ctrl, ns := connect(t, a.over("tcp"))
	model := make([]byte, 16<<20)
	if _, err := rand.Read(model[:4<<20]); err != nil {
		t.Fatal(err)
	}
	for off := 0; off < 4<<20; off += 128 << 10 {
		if _, err := ns.WriteAt(model[off:off+128<<10], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	ctrl.Close()
	var victim, other string
	for _, id := range ids {
		switch {
		case id == pin:
		case victim == "":
			victim = id
		default:
			other = id
		}
	}
	c.stopAll(syscall.SIGTERM)

	// Block 300 (region 18: data on the primary) and block 2000 (region
	// 125: a hole on the primary) changed on the victim only.
	s, err := store.Open(store.Config{Dir: filepath.Join(c.nodes[victim].dir, "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	vol, err := s.Volume(store.ID(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 4096)
	rand.Read(junk)
	for _, lba := range []uint64{300, 2000} {
		if err := vol.Write(lba, junk, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// The whole cluster again: the primary's term begins with a check.
	ready := map[string]<-chan struct{}{}
	for _, id := range ids {
		n := c.nodes[id]
		c.procs[id], ready[id] = launchBlkdOn(t, n.dir, n.raft, n.nvme, n.api, append(append([]string{"--node-id", id}, c.common...), "--zone", zoneOf(id))...)
	}
	for _, id := range ids {
		c.procs[id].waitReady(t, ready[id], 90*time.Second)
	}
	pp := c.procs[pin]
	eventually(t, 60*time.Second, victim+" taken out of sync and rebuilt", func() error {
		out := pp.output()
		if !strings.Contains(out, `msg="replica differs from the primary: taken out of sync, to be copied back"`) ||
			!strings.Contains(out, `msg="rebuild done"`) {
			return fmt.Errorf("no divergence and rebuild logged yet")
		}
		v = replicatedJSON{}
		pp.must(t, "GET", "/v1/volumes/t", "", 200, &v)
		for _, r := range v.Replicas {
			if r.State != "in-sync" {
				return fmt.Errorf("%+v", v.Replicas)
			}
		}
		return nil
	})
	var diverged, done, equal string
	for _, line := range strings.Split(pp.output(), "\n") {
		switch {
		case strings.Contains(line, `msg="replica differs from the primary`):
			diverged = line
		case strings.Contains(line, `msg="rebuild done"`) && strings.Contains(line, " node="+victim+" "):
			done = line
		case strings.Contains(line, `msg="term check: replica equal to the primary"`) && strings.Contains(line, "node="+other):
			equal = line
		}
	}
	if !strings.Contains(diverged, "node="+victim+" ") || !strings.Contains(diverged, "regions=2 first_lba=288") {
		t.Errorf("divergence logged as %q: want %s, 2 regions from LBA 288", diverged, victim)
	}
	// Region 18 copied, region 125 deallocated (a hole on the primary).
	if !strings.Contains(done, "mode=compare copied_bytes=65536 ") {
		t.Errorf("rebuild logged as %q: want a compare copying one 64 KiB region", done)
	}
	if equal == "" {
		t.Errorf("%s not found equal by the term check:\n%s", other, pp.output())
	}
	var res verifyJSON
	var cls clusterJSON
	pp.must(t, "GET", "/v1/cluster", "", 200, &cls)
	c.procs[cls.LeaderID].must(t, "POST", "/v1/volumes/t/verify", "", 200, &res)
	if len(res.Compared) != 3 || len(res.Mismatches) != 0 {
		t.Fatalf("verify: %+v", res)
	}
	c.stopAll(syscall.SIGTERM)
	for _, id := range ids {
		if err := storeEquals(filepath.Join(c.nodes[id].dir, "volumes"), v.ID, model); err != nil {
			t.Errorf("replica on %s: %v", id, err)
		}
	}
}
