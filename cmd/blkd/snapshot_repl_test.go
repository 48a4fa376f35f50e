package main

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/cmd/blkd/internal/blkd"
	"github.com/blk-project/blk/store"
)

// TestSnapshotReplicated: snapshots of a 3-replica volume taken while a
// host writes, through the primary's barrier. Every snapshot is on the
// three nodes and their copies of it are equal byte for byte (the
// barrier held the writes in flight so every copy took it at the same
// point of the write stream); a clone of one is made on the three nodes
// from their own copies, reads what the snapshot reads there, and the
// live volume still equals the host's model everywhere.
func TestSnapshotReplicated(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	c, ids, leader := startZoned(t, 3)
	lp := c.procs[leader]
	var v replicatedJSON
	a := pinnedVolume(t, c, ids, leader, "r", "16MiB", &v)
	ctrl, ns := connect(t, a.over("tcp"))
	defer ctrl.Close()

	const bs, blocks = 4096, 16 << 20 / 4096
	model := make([]byte, blocks*bs)
	const quarter = blocks / 4
	write := func(r *rand.Rand, q int) error {
		lba, n, buf := randomRun(r, q*quarter, quarter, bs)
		if err := pathRetry(func() error { _, err := ns.WriteAt(buf, int64(lba*bs)); return err }); err != nil {
			return fmt.Errorf("write %d blocks at %d: %w", n, lba, err)
		}
		copy(model[lba*bs:], buf)
		return nil
	}
	var writes atomic.Int64
	stop := runWriters(4, seed, 0, &writes, write)
	var snaps []snapshotJSON
	for i := range 4 {
		time.Sleep(150 * time.Millisecond)
		var s snapshotJSON
		var held struct {
			HeldNanos int64 `json:"held_ns"`
		}
		body := fmt.Sprintf(`{"name": "s%d"}`, i+1)
		lp.must(t, "POST", "/v1/volumes/r/snapshots", body, 201, &s)
		lp.must(t, "GET", "/v1/volumes/r/snapshots/"+s.Name, "", 200, &held)
		if s.State != "ready" || len(s.Nodes) != 3 {
			t.Fatalf("snapshot %s under writes: %+v, want ready on 3 nodes", s.Name, s)
		}
		snaps = append(snaps, s)
	}
	time.Sleep(150 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d writes while 4 snapshots were taken", writes.Load())
	var clone replicatedJSON
	lp.must(t, "POST", "/v1/volumes/r/snapshots/s2/clone", `{"name": "c"}`, 201, &clone)
	if len(clone.Replicas) != 3 || clone.State != "online" {
		t.Fatalf("clone of r@s2: %+v, want online on 3 nodes", clone)
	}
	// A verify compares the live copies: equal.
	verifyClean(t, lp, "r", 4)
	lp.refuse(t, "POST", "/v1/volumes/r/verify?snapshots=maybe", "", 400, `snapshots="maybe"`)
	ctrl.Close()

	c.stopAll(syscall.SIGTERM)
	read := func(id string, obj uint64) []byte {
		s, err := store.Open(store.Config{Dir: filepath.Join(c.nodes[id].dir, "volumes")})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		vol, err := s.Volume(store.ID(obj))
		if err != nil {
			t.Fatalf("node %s: object %d: %v", id, obj, err)
		}
		out := make([]byte, len(model))
		for off := 0; off < len(out); off += 1 << 20 {
			if err := vol.Read(uint64(off/bs), out[off:off+1<<20]); err != nil {
				t.Fatalf("node %s: read object %d: %v", id, obj, err)
			}
		}
		return out
	}
	var prev []byte
	for i, s := range snaps {
		first := read(ids[0], s.ID)
		for _, id := range ids[1:] {
			if got := read(id, s.ID); !bytes.Equal(got, first) {
				j := 0
				for got[j] == first[j] {
					j++
				}
				t.Fatalf("snapshot %s: node %s's copy differs from %s's from byte %d", s.Name, id, ids[0], j)
			}
		}
		if prev != nil && bytes.Equal(prev, first) {
			t.Logf("snapshot %s reads what the one before it reads (no write between them)", s.Name)
		}
		prev = first
		if i == 1 {
			for _, id := range ids {
				if got := read(id, clone.ID); !bytes.Equal(got, first) {
					t.Fatalf("clone c on %s differs from r@s2", id)
				}
			}
		}
	}
	for _, id := range ids {
		if got := read(id, v.ID); !bytes.Equal(got, model) {
			t.Fatalf("volume r on %s differs from what the host wrote", id)
		}
		if !slices.Contains(snaps[0].Nodes, id) {
			t.Fatalf("node %s not among %v", id, snaps[0].Nodes)
		}
	}
}

// TestSnapshotReplicaAway: a snapshot taken while a replica is out of
// sync is on the in-sync copies only, and says so (nodes); the rebuild
// that brings the replica back carries it (docs/snapshots.md §4.3): the
// replica then holds it, listed in its nodes, a revert to it works and
// leaves the three copies equal, and every node's copy of it equals the
// others' byte for byte. A snapshot taken with every replica in sync is
// on all three, and a revert to it leaves the three copies equal.
func TestSnapshotReplicaAway(t *testing.T) {
	c, ids, leader := startZoned(t, 3)
	lp := c.procs[leader]
	var v replicatedJSON
	a := pinnedVolume(t, c, ids, leader, "r", "16MiB", &v)
	victim := ""
	for _, id := range ids {
		if id != leader && id != v.Node {
			victim = id
		}
	}
	if victim == "" { // the primary leads: any secondary
		for _, id := range ids {
			if id != v.Node {
				victim = id
			}
		}
	}
	ctrl, ns := connect(t, a.over("tcp"))
	defer ctrl.Close()
	write := func(off int64, b byte) {
		t.Helper()
		buf := bytes.Repeat([]byte{b}, 64<<10)
		if err := pathRetry(func() error { _, err := ns.WriteAt(buf, off); return err }); err != nil {
			t.Fatal(err)
		}
	}
	write(0, 'a')
	c.procs[victim].cmd.Process.Signal(syscall.SIGSTOP)
	write(1<<20, 'b') // missed by the victim
	eventually(t, 20*time.Second, victim+" out of sync", func() error {
		v = replicatedJSON{}
		lp.must(t, "GET", "/v1/volumes/r", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == victim && r.State == "out-of-sync" {
				return nil
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
	var s1 snapshotJSON
	lp.must(t, "POST", "/v1/volumes/r/snapshots", `{"name": "s1"}`, 201, &s1)
	if len(s1.Nodes) != 2 || slices.Contains(s1.Nodes, victim) {
		t.Fatalf("r@s1 with %s away: nodes %v, want the two others", victim, s1.Nodes)
	}
	write(0, 'c')
	c.procs[victim].cmd.Process.Signal(syscall.SIGCONT)
	eventually(t, 40*time.Second, victim+" rebuilt in sync", func() error {
		v = replicatedJSON{}
		lp.must(t, "GET", "/v1/volumes/r", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == victim && r.State == "in-sync" {
				return nil
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
	// Recorded before the replica was committed in sync.
	lp.must(t, "GET", "/v1/volumes/r/snapshots/s1", "", 200, &s1)
	if !slices.Contains(s1.Nodes, victim) || len(s1.Nodes) != 3 {
		t.Fatalf("r@s1 after %s's rebuild: nodes %v, want all three", victim, s1.Nodes)
	}
	// The victim's store: its live copy reads through its copy of r@s1.
	vp := c.procs[victim]
	var chain struct {
		Chain []struct {
			ID     uint64 `json:"id"`
			Parent uint64 `json:"parent"`
		} `json:"chain"`
		Held []uint64 `json:"held"`
	}
	vp.must(t, "GET", fmt.Sprintf("/v1/internal/snapshots?id=%d&ids=%d,999999", v.ID, s1.ID), "", 200, &chain)
	if len(chain.Chain) != 2 || chain.Chain[0].ID != v.ID || chain.Chain[0].Parent != s1.ID || !slices.Equal(chain.Held, []uint64{s1.ID}) {
		t.Fatalf("%s's chain of r: %+v, want r on r@s1 (%d)", victim, chain, s1.ID)
	}
	// The rebuild's routes refuse what no rebuild asks: an in-sync
	// replica, a stale epoch, missing fields, an unknown snapshot.
	body := func(snap string, epoch uint64) string {
		return fmt.Sprintf(`{"volume": "r", "snapshot": %q, "epoch": %d}`, snap, epoch)
	}
	vp.refuse(t, "POST", "/v1/internal/rebuild-revert", body("s1", v.Epoch), 409, `holds no secondary replica of it out of sync or rebuilding`)
	vp.refuse(t, "POST", "/v1/internal/rebuild-snapshot", body("s1", v.Epoch), 409, `out of sync or rebuilding`)
	vp.refuse(t, "POST", "/v1/internal/rebuild-revert", body("s1", v.Epoch+7), 409, `epoch`)
	vp.refuse(t, "POST", "/v1/internal/rebuild-revert", body("", v.Epoch), 400, `required`)
	vp.refuse(t, "POST", "/v1/internal/rebuild-snapshot", body("nope", v.Epoch), 409, `out of sync or rebuilding`)
	vp.refuse(t, "GET", "/v1/internal/snapshots?id=x", "", 400, `store object ID`)
	vp.refuse(t, "GET", "/v1/internal/snapshots?id=999999", "", 404, `no store object`)
	lp.refuse(t, "POST", "/v1/internal/snapshot-nodes", `{"volume": "r"}`, 400, `required`)
	lp.refuse(t, "POST", "/v1/internal/snapshot-nodes", `{"volume": "r", "snapshot": "s1", "node": "nobody"}`, 404, `no replica on node`)
	ctrl.Close()
	lp.must(t, "POST", "/v1/volumes/r/detach", `{"host_nqn": "`+hostNQN+`"}`, 204, nil)
	eventually(t, 20*time.Second, "the revert to r@s1 once the host is gone", func() error {
		if code, msg := lp.call(t, "POST", "/v1/volumes/r/revert", `{"snapshot": "s1"}`, nil); code != 200 {
			return fmt.Errorf("%d %s", code, msg)
		}
		return nil
	})
	var res struct {
		Mismatches []any `json:"mismatches"`
	}
	eventually(t, 30*time.Second, "the replicas equal after the revert to r@s1", func() error {
		lp.must(t, "POST", "/v1/volumes/r/verify", "", 200, &res)
		if len(res.Mismatches) != 0 {
			return fmt.Errorf("%+v", res.Mismatches)
		}
		return nil
	})

	var s2 snapshotJSON
	lp.must(t, "POST", "/v1/volumes/r/snapshots", `{"name": "s2"}`, 201, &s2)
	if len(s2.Nodes) != 3 {
		t.Fatalf("r@s2 with every replica in sync: nodes %v", s2.Nodes)
	}
	// A write after s2, undone by the revert (no host connected: the
	// write goes through a second, short connection).
	lp.must(t, "POST", "/v1/volumes/r/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	ctrl2, ns2 := connect(t, a.over("tcp"))
	ns = ns2
	write(2<<20, 'd')
	ctrl2.Close()
	lp.must(t, "POST", "/v1/volumes/r/detach", `{"host_nqn": "`+hostNQN+`"}`, 204, nil)
	eventually(t, 20*time.Second, "the revert once the host is gone", func() error {
		if code, msg := lp.call(t, "POST", "/v1/volumes/r/revert", `{"snapshot": "s2"}`, nil); code != 200 {
			return fmt.Errorf("%d %s", code, msg)
		}
		return nil
	})
	eventually(t, 30*time.Second, "the replicas equal after the revert", func() error {
		lp.must(t, "POST", "/v1/volumes/r/verify", "", 200, &res)
		if len(res.Mismatches) != 0 {
			return fmt.Errorf("%+v", res.Mismatches)
		}
		return nil
	})
	lp.must(t, "GET", "/v1/volumes/r", "", 200, &v)
	c.stopAll(syscall.SIGTERM)
	// r@s1 (and so r@s2, and the volume reverted to it) read 'a' then
	// 'b': the 'c' written after r@s1 is undone, on the victim too.
	want := make([]byte, 16<<20)
	copy(want, bytes.Repeat([]byte{'a'}, 64<<10))
	copy(want[1<<20:], bytes.Repeat([]byte{'b'}, 64<<10))
	for _, id := range ids {
		dir := filepath.Join(c.nodes[id].dir, "volumes")
		if err := storeEquals(dir, v.ID, want); err != nil {
			t.Errorf("replica on %s after the revert to r@s2: %v", id, err)
		}
		for _, s := range []snapshotJSON{s1, s2} {
			if err := storeEquals(dir, s.ID, want); err != nil {
				t.Errorf("r@%s on %s: %v", s.Name, id, err)
			}
		}
	}
}

// TestSnapshotRebuildCarries: a replica that misses two snapshots, with
// writes between and after them, comes back holding both (the rebuild
// carries them from the snapshot it shares with the primary, r@s0, its
// live copy reverted to it first: docs/snapshots.md §4.3), listed in
// their nodes; every node's copy of every snapshot and of the volume
// equals what the host had written at that point, byte for byte. Killed
// (SIGKILL: the node restarts, its run changed) and stopped (SIGSTOP:
// the primary kept a dirty-region log of it).
func TestSnapshotRebuildCarries(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		t.Run(map[syscall.Signal]string{syscall.SIGKILL: "kill", syscall.SIGSTOP: "stop"}[sig], func(t *testing.T) { testSnapshotRebuildCarries(t, sig) })
	}
}

func testSnapshotRebuildCarries(t *testing.T, sig syscall.Signal) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 24))
	c, ids, leader := startZoned(t, 3)
	lp := c.procs[leader]
	var v replicatedJSON
	a := pinnedVolume(t, c, ids, leader, "r", "16MiB", &v)
	victim := ""
	for _, id := range ids {
		if id != leader && id != v.Node {
			victim = id
		}
	}
	if victim == "" {
		for _, id := range ids {
			if id != v.Node {
				victim = id
			}
		}
	}
	ctrl, ns := connect(t, a.over("tcp"))
	defer ctrl.Close()
	const bs = 4096
	model := make([]byte, 16<<20)
	// writes puts n random runs of 1 to 32 blocks, some of them over
	// 64 KiB clusters the snapshots share, some zeroed.
	writes := func(n int) {
		t.Helper()
		for range n {
			blocks := 1 + rng.IntN(32)
			lba := rng.IntN(len(model)/bs - blocks)
			buf := make([]byte, blocks*bs)
			if rng.IntN(5) != 0 {
				for i := range buf {
					buf[i] = byte(rng.Uint32())
				}
			}
			if err := pathRetry(func() error { _, err := ns.WriteAt(buf, int64(lba*bs)); return err }); err != nil {
				t.Fatalf("seed %d: write %d blocks at %d: %v", seed, blocks, lba, err)
			}
			copy(model[lba*bs:], buf)
		}
	}
	snap := func(name string, nodes int) snapshotJSON {
		t.Helper()
		var s snapshotJSON
		lp.must(t, "POST", "/v1/volumes/r/snapshots", `{"name": "`+name+`"}`, 201, &s)
		if len(s.Nodes) != nodes {
			t.Fatalf("r@%s: nodes %v, want %d", name, s.Nodes, nodes)
		}
		return s
	}
	writes(200)
	s0 := snap("s0", 3)
	m0 := bytes.Clone(model)
	writes(100) // the victim has these: its live copy is past r@s0
	c.procs[victim].cmd.Process.Signal(sig)
	if sig == syscall.SIGKILL {
		<-c.procs[victim].exited
		delete(c.procs, victim)
	}
	writes(20)
	eventually(t, 20*time.Second, victim+" out of sync", func() error {
		v = replicatedJSON{}
		lp.must(t, "GET", "/v1/volumes/r", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == victim && r.State == "out-of-sync" {
				return nil
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
	writes(100)
	s1 := snap("s1", 2)
	m1 := bytes.Clone(model)
	writes(100)
	s2 := snap("s2", 2)
	m2 := bytes.Clone(model)
	writes(100)
	if sig == syscall.SIGKILL {
		c.start(victim)
	} else {
		c.procs[victim].cmd.Process.Signal(syscall.SIGCONT)
	}
	eventually(t, 60*time.Second, victim+" rebuilt in sync", func() error {
		v = replicatedJSON{}
		lp.must(t, "GET", "/v1/volumes/r", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == victim && r.State == "in-sync" {
				return nil
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
	writes(50) // on the three again
	for _, s := range []*snapshotJSON{&s1, &s2} {
		lp.must(t, "GET", "/v1/volumes/r/snapshots/"+s.Name, "", 200, s)
		if len(s.Nodes) != 3 {
			t.Fatalf("r@%s after %s's rebuild: nodes %v, want all three", s.Name, victim, s.Nodes)
		}
	}
	var res struct {
		Mismatches []any `json:"mismatches"`
	}
	lp.must(t, "POST", "/v1/volumes/r/verify", "", 200, &res)
	if len(res.Mismatches) != 0 {
		t.Fatalf("verify after the rebuild: %+v", res.Mismatches)
	}
	ctrl.Close()
	c.stopAll(syscall.SIGTERM)
	for _, id := range ids {
		dir := filepath.Join(c.nodes[id].dir, "volumes")
		for _, o := range []struct {
			name string
			id   uint64
			want []byte
		}{{"r@s0", s0.ID, m0}, {"r@s1", s1.ID, m1}, {"r@s2", s2.ID, m2}, {"r", v.ID, model}} {
			if err := storeEquals(dir, o.id, o.want); err != nil {
				t.Errorf("seed %d: %s on %s: %v", seed, o.name, id, err)
			}
		}
	}
}

// TestSnapshotFailover: the primary of a 3-replica volume under a
// host's writes killed (SIGKILL) inside a snapshot's barrier (held
// there by the test-only snapshot_hold: no timing race). The contract
// (docs/snapshots.md §4.2): the snapshot, left being taken, is settled
// by the leader's settle rounds: done if every in-sync replica holds
// it, else deleted everywhere. The host's writes go on through the new
// primary and none acknowledged is lost; the old primary, restarted, is
// rebuilt; verify --snapshots is clean; and the registry agrees with
// every store: each holds the volume and the snapshot's copy if it is
// done, and no other object (no orphan stays), the copies equal byte
// for byte.
//
// copies: killed once every copy took it, before the barrier ended:
// done on the two in-sync replicas, then carried to the old primary by
// its rebuild (its own copy, never listed, taken again). local: killed
// once the primary's own copy took it, before the replicas were asked:
// deleted, the old primary's copy with it once it is back (the purge
// waits for it).
func TestSnapshotFailover(t *testing.T) {
	for _, at := range []string{blkd.HoldCopies, blkd.HoldLocal} {
		t.Run(at, func(t *testing.T) { testSnapshotFailover(t, at) })
	}
}

func testSnapshotFailover(t *testing.T, at string) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	cfg := filepath.Join(t.TempDir(), "hold.json")
	if err := os.WriteFile(cfg, []byte(`{"snapshot_hold": "10s", "snapshot_hold_at": "`+at+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c, ids, leader := startZoned(t, 3, "--config", cfg)
	lp := c.procs[leader]
	var v replicatedJSON
	a := pinnedVolume(t, c, ids, leader, "f", "16MiB", &v)
	primary := v.Node
	host := &multipathHost{}
	defer host.close()
	for id, addr := range tcpAddrsOf(t, lp) {
		if err := host.connect(id, addr, a.SubsystemNQN); err != nil {
			t.Fatal(err)
		}
	}
	const bs, blocks = 4096, 16 << 20 / 4096
	const quarter = blocks / 4
	model := make([]byte, blocks*bs)
	write := func(r *rand.Rand, q int) error {
		lba, n, buf := randomRun(r, q*quarter, quarter, bs)
		if _, err := host.write(buf, int64(lba*bs), 30*time.Second); err != nil {
			return fmt.Errorf("seed %d: write of %d blocks at %d: %w", seed, n, lba, err)
		}
		copy(model[lba*bs:], buf) // writer q alone writes quarter q
		return nil
	}
	var writes atomic.Int64
	stop := runWriters(4, seed, 0, &writes, write)
	time.Sleep(300 * time.Millisecond)

	// The snapshot, from the leader; its answer comes once the primary
	// is dead, whatever it is.
	answered := make(chan string, 1)
	go func() {
		code, body := lp.call(t, "POST", "/v1/volumes/f/snapshots", `{"name": "s1"}`, nil)
		answered <- fmt.Sprintf("%d %s", code, body)
	}()
	pp := c.procs[primary]
	eventually(t, 20*time.Second, "the barrier held on "+primary, func() error {
		if !strings.Contains(pp.output(), `msg="snapshot barrier held for a test"`) {
			return errors.New("not yet")
		}
		return nil
	})
	killed := writes.Load()
	pp.cmd.Process.Signal(syscall.SIGKILL)
	<-pp.exited
	delete(c.procs, primary)
	t.Logf("the snapshot's answer after the kill: %s", <-answered)

	var s snapshotJSON
	var live string
	eventually(t, 30*time.Second, "another primary", func() error {
		for id, p := range c.procs {
			v = replicatedJSON{}
			if code, _ := p.call(t, "GET", "/v1/volumes/f", "", &v); code == 200 && v.Node != primary && v.Epoch == 2 {
				live = id
				return nil
			}
		}
		return fmt.Errorf("%+v", v)
	})
	lp, np := c.procs[live], c.procs[v.Node]
	eventually(t, 25*time.Second, "writes through the new primary", func() error {
		if writes.Load() < killed+50 {
			return fmt.Errorf("%d writes since the kill", writes.Load()-killed)
		}
		return nil
	})
	// Settled: creating for snapshotSettle (30 s), then a settle round;
	// deleted, it is purged only once the old primary's store answers.
	code := 0
	eventually(t, 60*time.Second, "f@s1 settled", func() error {
		s = snapshotJSON{}
		var body string
		code, body = lp.call(t, "GET", "/v1/volumes/f/snapshots/s1", "", &s)
		if (code != 200 && code != 404) || s.State == "creating" {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	if err := stop(); err != nil {
		t.Fatalf("a host write failed across the failover: %v", err)
	}
	t.Logf("%d writes, %d after the kill", writes.Load(), writes.Load()-killed)
	var inSync []string
	for _, r := range v.Replicas {
		if r.State == "in-sync" {
			inSync = append(inSync, r.Node)
		}
	}
	slices.Sort(inSync)
	slices.Sort(s.Nodes)
	switch {
	case at == blkd.HoldCopies && (s.State != "ready" || !slices.Equal(s.Nodes, inSync)):
		// Every copy took it before the kill.
		t.Fatalf("f@s1 settled as %+v, want ready on the in-sync replicas %v", s, inSync)
	case at == blkd.HoldLocal && code != 404 && s.State != "deleting":
		// The replicas in sync lack it.
		t.Fatalf("f@s1 settled as %d %+v, want deleted", code, s)
	}

	// The old primary again: rebuilt, the snapshot carried to it.
	c.start(primary)
	eventually(t, 60*time.Second, primary+" rebuilt in sync, f@s1 settled everywhere", func() error {
		v = replicatedJSON{}
		lp.must(t, "GET", "/v1/volumes/f", "", 200, &v)
		for _, r := range v.Replicas {
			if r.State != "in-sync" {
				return fmt.Errorf("%+v", v.Replicas)
			}
		}
		s = snapshotJSON{}
		code, body := lp.call(t, "GET", "/v1/volumes/f/snapshots/s1", "", &s)
		switch {
		case at == blkd.HoldCopies && (code != 200 || len(s.Nodes) != 3):
			return fmt.Errorf("f@s1: %d %s", code, body)
		case at == blkd.HoldLocal && code != 404:
			return fmt.Errorf("f@s1 not purged: %d %s", code, body)
		}
		return nil
	})
	if at == blkd.HoldCopies {
		if carried := carriedTo(np, primary); !strings.Contains(carried, `snapshots=[s1]`) {
			t.Errorf("carried to %s: %q, want f@s1 (its own copy, never listed, taken again)", primary, carried)
		}
	}
	var cls clusterJSON
	lp.must(t, "GET", "/v1/cluster", "", 200, &cls)
	want := []uint64{v.ID} // the store objects
	if at == blkd.HoldCopies {
		want = append(want, s.ID)
	}
	verifyClean(t, c.procs[cls.LeaderID], "f", len(want)-1)
	host.close()
	c.stopAll(syscall.SIGTERM)
	var first []byte
	for _, id := range ids {
		st, err := store.Open(store.Config{Dir: filepath.Join(c.nodes[id].dir, "volumes")})
		if err != nil {
			t.Fatal(err)
		}
		objs, err := st.List()
		var got []uint64
		for _, o := range objs {
			got = append(got, uint64(o.ID))
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("node %s's store holds %v (%v), want the registry's %v", id, got, err, want)
		}
		copyOf := make([]byte, len(model))
		if at == blkd.HoldLocal {
			// nothing more to read
		} else if vol, err := st.Volume(store.ID(s.ID)); err != nil {
			t.Errorf("node %s: f@s1: %v", id, err)
		} else {
			for off := 0; off < len(copyOf); off += 1 << 20 {
				if err := vol.Read(uint64(off/bs), copyOf[off:off+1<<20]); err != nil {
					t.Fatalf("node %s: read f@s1: %v", id, err)
				}
			}
		}
		st.Close()
		if first == nil {
			first = copyOf
		} else if !bytes.Equal(copyOf, first) {
			t.Errorf("f@s1 on %s differs from %s's from byte %d", id, ids[0], firstDiff(copyOf, first))
		}
		if err := storeEquals(filepath.Join(c.nodes[id].dir, "volumes"), v.ID, model); err != nil {
			t.Errorf("seed %d: f on %s: %v", seed, id, err)
		}
	}
}
