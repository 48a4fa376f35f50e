package main

import (
	"bytes"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
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
	c.relaunchZoned(ids)
	pp := c.procs[pin]
	v = rebuiltAfter(t, pp, "t", victim, `msg="replica differs from the primary: taken out of sync, to be copied back"`)
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

// TestTermCheckSnapshots: the term check compares snapshot sets too
// (docs/snapshots.md §4.4). A 3-replica volume with three snapshots,
// each on the three nodes; the cluster stopped, one secondary's copy
// of the middle one, r@s2, deleted from its store behind the
// registry's back (merged into s3, as a lost delete would leave it);
// the cluster again: the new term's primary finds that replica lacking
// r@s2, takes it out of sync with that reason, and its rebuild carries
// the snapshots back from below the hole (r@s1: the replica reverted to
// it, s2 and s3 copied and taken again); afterwards verify --snapshots
// is clean and every node's copy of every snapshot and of the volume
// equals what the host had written at that point, byte for byte.
func TestTermCheckSnapshots(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := mrand.New(mrand.NewPCG(uint64(seed), 44))
	c, ids, leader := startZoned(t, 3)
	lp := c.procs[leader]
	var v replicatedJSON
	a := pinnedVolume(t, c, ids, leader, "r", "16MiB", &v)
	pin := v.Node
	ctrl, ns := connect(t, a.over("tcp"))
	const bs = 4096
	model := make([]byte, 16<<20)
	writes := func(n int) {
		t.Helper()
		for range n {
			blocks := 1 + rng.IntN(32)
			lba := rng.IntN(len(model)/bs - blocks)
			buf := make([]byte, blocks*bs)
			for i := range buf {
				buf[i] = byte(rng.Uint32())
			}
			if _, err := ns.WriteAt(buf, int64(lba*bs)); err != nil {
				t.Fatalf("seed %d: write %d blocks at %d: %v", seed, blocks, lba, err)
			}
			copy(model[lba*bs:], buf)
		}
	}
	var snaps []snapshotJSON
	var models [][]byte
	for i := range 3 {
		writes(100)
		var s snapshotJSON
		lp.must(t, "POST", "/v1/volumes/r/snapshots", fmt.Sprintf(`{"name": "s%d"}`, i+1), 201, &s)
		if len(s.Nodes) != 3 {
			t.Fatalf("r@%s: nodes %v, want the three", s.Name, s.Nodes)
		}
		snaps, models = append(snaps, s), append(models, bytes.Clone(model))
	}
	writes(100)
	ctrl.Close()
	victim := ""
	for _, id := range ids {
		if id != pin {
			victim = id
		}
	}
	c.stopAll(syscall.SIGTERM)

	s, err := store.Open(store.Config{Dir: filepath.Join(c.nodes[victim].dir, "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(store.ID(snaps[1].ID)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	c.relaunchZoned(ids)
	pp := c.procs[pin]
	v = rebuiltAfter(t, pp, "r", victim, `msg="replica's snapshots differ from the primary's: taken out of sync, to be rebuilt"`)
	var differ, missed string
	for _, line := range strings.Split(pp.output(), "\n") {
		switch {
		case strings.Contains(line, `msg="replica's snapshots differ`):
			differ = line
		case strings.Contains(line, `msg="replica missed a write`) && strings.Contains(line, "node="+victim+" "):
			missed = line
		}
	}
	if !strings.Contains(differ, "node="+victim+" ") || !strings.Contains(differ, `diff="replica's snapshots differ from the primary's: lacks r@s2"`) {
		t.Errorf("difference logged as %q: want %s lacking r@s2", differ, victim)
	}
	if !strings.Contains(missed, "lacks r@s2, at the start of epoch") {
		t.Errorf("reported as %q: want the reason naming r@s2", missed)
	}
	// Before it left the in-sync set, the registry stopped listing it
	// among r@s2's copies (the rebuild listed it again).
	unlisted := false
	for _, line := range strings.Split(pp.output(), "\n") {
		unlisted = unlisted || (strings.Contains(line, `msg="a replica lacking a snapshot no longer listed among its copies"`) &&
			strings.Contains(line, " node="+victim+" snapshot=s2"))
	}
	if !unlisted {
		t.Errorf("%s not unlisted from r@s2's copies", victim)
	}
	// Reverted to r@s1, below the hole: s2 and s3 copied and taken again.
	if carried := carriedTo(pp, victim); !strings.Contains(carried, `snapshots="[s2 s3]"`) {
		t.Errorf("carried to %s: %q, want r@s2 and r@s3", victim, carried)
	}
	var cls clusterJSON
	pp.must(t, "GET", "/v1/cluster", "", 200, &cls)
	verifyClean(t, c.procs[cls.LeaderID], "r", 3)
	for _, sn := range snaps {
		var got snapshotJSON
		pp.must(t, "GET", "/v1/volumes/r/snapshots/"+sn.Name, "", 200, &got)
		if len(got.Nodes) != 3 {
			t.Errorf("r@%s: nodes %v, want the three", sn.Name, got.Nodes)
		}
	}
	c.stopAll(syscall.SIGTERM)
	for _, id := range ids {
		dir := filepath.Join(c.nodes[id].dir, "volumes")
		for i, sn := range snaps {
			if err := storeEquals(dir, sn.ID, models[i]); err != nil {
				t.Errorf("seed %d: r@%s on %s: %v", seed, sn.Name, id, err)
			}
		}
		if err := storeEquals(dir, v.ID, model); err != nil {
			t.Errorf("seed %d: r on %s: %v", seed, id, err)
		}
	}
}
