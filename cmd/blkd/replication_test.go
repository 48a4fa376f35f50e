package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/store"
)

// replicaJSON is one replica as GET /v1/volumes/{name} shows it.
type replicaJSON struct {
	Node    string       `json:"node"`
	State   string       `json:"state"`
	Reason  string       `json:"reason"`
	Primary bool         `json:"primary"`
	Rebuild *rebuildJSON `json:"rebuild"`
}

type rebuildJSON struct {
	Done  uint64 `json:"done_bytes"`
	Total uint64 `json:"total_bytes"`
}

type verifyJSON struct {
	Regions     uint64            `json:"regions"`
	Compared    []string          `json:"compared"`
	Unreachable map[string]string `json:"unreachable"`
	Mismatches  []struct {
		Offset uint64 `json:"offset"`
		Node   string `json:"node"`
		InSync bool   `json:"in_sync"`
	} `json:"mismatches"`
}

type replicatedJSON struct {
	volumeJSON
	Epoch    uint64        `json:"epoch"`
	Want     int           `json:"want_replicas"`
	Replicas []replicaJSON `json:"replicas"`
}

// TestReplication: a 3-replica volume on three real blkd processes, a
// host writing through blk's initiator to the primary. Every write is on
// every replica's store (read back from the three data directories once
// the nodes stop). A secondary killed with SIGKILL while the host writes
// costs the host nothing: the writes it missed are acknowledged only
// after the leader recorded it out of sync, the volume says it is
// degraded, and what the host reads back is what it wrote. Restarted,
// the victim is rebuilt by the primary while the host writes, comes back
// in sync, volume verify finds no difference, and the three stores hold
// what the host wrote. A connection
// to a replica subsystem that is not its primary's — a host's NQN, the
// primary's NQN at another epoch, the right NQN without the replica
// secret — is refused.
func TestReplication(t *testing.T) { testReplication(t, false) }

// TestReplicationLeaderLost: as TestReplication, the secondary killed
// being the registry's leader: the primary's report of its loss waits
// for the election of another, and no host write fails meanwhile.
func TestReplicationLeaderLost(t *testing.T) { testReplication(t, true) }

func testReplication(t *testing.T, killLeader bool) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 23))

	// A rebuild of the 16 MiB volume takes 16 s at least: the restarted
	// victim is compared by verify before it is in sync again.
	c, ids, leader := startZoned(t, 3, "--rebuild-rate", "1048576")
	lp := c.procs[leader]
	// The primary is a node that does not lead the registry: it outlives
	// the victim either way.
	pin := ""
	for _, id := range ids {
		if id != leader {
			pin = id
			break
		}
	}

	// Three zones: the default is three replicas.
	var v replicatedJSON
	lp.must(t, "POST", "/v1/volumes", `{"name": "r", "size": "16MiB", "node": "`+pin+`"}`, 201, &v)
	if v.Want != 3 || len(v.Replicas) != 3 || v.Epoch != 1 || v.State != "online" {
		t.Fatalf("created %+v: want 3 in-sync replicas at epoch 1, online", v)
	}
	seen := map[string]bool{}
	for _, r := range v.Replicas {
		if r.State != "in-sync" || seen[r.Node] || r.Primary != (r.Node == v.Node) {
			t.Fatalf("replicas %+v (primary %s)", v.Replicas, v.Node)
		}
		seen[r.Node] = true
	}
	primary := v.Node
	if primary != pin {
		t.Fatalf("pinned to %s, primary %s", pin, primary)
	}
	// The victim is the secondary that leads the registry, or the one
	// that does not (its loss is then recorded without an election).
	var victim string
	for _, id := range ids {
		if id != primary && (id == leader) == killLeader {
			victim = id
			break
		}
	}
	pp := c.procs[primary]

	lp.must(t, "POST", "/v1/volumes/r/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	var a attachJSON
	lp.must(t, "POST", "/v1/volumes/r/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	ctrl, ns := connect(t, a.over("tcp"))
	defer ctrl.Close()

	// The model: what each 4 KiB block of the volume must read.
	const bs, blocks = 4096, 16 << 20 / 4096
	model := make([]byte, blocks*bs)
	// write writes 1..16 random blocks at random in quarter q of the
	// volume; writers of distinct quarters never overlap, so the model's
	// order is the host's.
	const quarter = blocks / 4
	write := func(r *rand.Rand, q int) error {
		lba, n, buf := randomRun(r, q*quarter, quarter, bs)
		// A path status is retried, as a host does: the primary's lease
		// may lapse for a moment while the registry elects a leader
		// (docs/replication.md §3); a write that fails is an error.
		if err := pathRetry(func() error { _, err := ns.WriteAt(buf, int64(lba*bs)); return err }); err != nil {
			return fmt.Errorf("write %d blocks at %d: %w", n, lba, err)
		}
		copy(model[lba*bs:], buf)
		return nil
	}
	for i := range 200 {
		if err := write(rng, i%4); err != nil {
			t.Fatal(err)
		}
	}

	// Refused connections to a secondary's replica subsystem.
	var secondary string
	for _, id := range ids {
		if id != primary {
			secondary = id
			break
		}
	}
	replNQN := fmt.Sprintf("nqn.2024-01.io.blk:replica:%d", v.ID)
	tcpAddr := tcpAddrsOf(t, lp)[secondary]
	for _, hn := range []string{
		hostNQN, // a host
		fmt.Sprintf("nqn.2024-01.io.blk:node:%s:epoch:1", primary),   // the primary, without the secret
		fmt.Sprintf("nqn.2024-01.io.blk:node:%s:epoch:1", secondary), // not the primary
		fmt.Sprintf("nqn.2024-01.io.blk:node:%s:epoch:2", primary),   // an epoch not yet begun
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rc, err := initiator.Connect(ctx, initiator.Config{Transport: initiator.TransportTCP, HostNQN: hn, CtrlLossTimeout: time.Millisecond}, tcpAddr, replNQN)
		cancel()
		if err == nil {
			rc.Close()
			t.Fatalf("host %s connected to %s's replica subsystem %s", hn, secondary, replNQN)
		}
		t.Logf("refused as it must be: %s: %v", hn, err)
	}

	// writers runs four writers, one per quarter, each seeded from base,
	// until the returned stop, which gives the first write error.
	var writes atomic.Int64
	writers := func(base uint64) (stop func() error) { return runWriters(4, seed, base, &writes, write) }

	// Kill a secondary while the host writes: no write fails.
	stop := writers(0)
	time.Sleep(300 * time.Millisecond) // writes in flight when the node dies
	c.procs[victim].cmd.Process.Signal(syscall.SIGKILL)
	<-c.procs[victim].exited
	delete(c.procs, victim) // stopAll stops the others
	eventually(t, 20*time.Second, victim+" recorded out of sync", func() error {
		pp.must(t, "GET", "/v1/volumes/r", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == victim && r.State == "out-of-sync" && r.Reason != "" {
				return nil
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
	before := writes.Load()
	time.Sleep(500 * time.Millisecond) // writes after the loss
	if err := stop(); err != nil {
		t.Fatalf("a host write failed while a secondary died: %v", err)
	}
	if after := writes.Load() - before; after == 0 {
		t.Errorf("no write completed after %s was recorded out of sync", victim)
	}
	if v.State != "online" || v.Reason == "" {
		t.Errorf("after the loss: state %q reason %q, want online and degraded", v.State, v.Reason)
	}
	t.Logf("after the loss of %s: %s (%+v)", victim, v.Reason, v.Replicas)
	// The primary's metrics say the same: the victim missed a write and
	// is no longer sent any, the other replica took every write.
	m := pp.metricsText(t)
	var other string
	for _, id := range ids {
		if id != primary && id != victim {
			other = id
		}
	}
	for series, want := range map[string]func(float64) bool{
		`blk_volume_epoch{volume="r"}`:                                       func(f float64) bool { return f == 1 },
		`blk_volume_replication_serving{volume="r"}`:                         func(f float64) bool { return f == 1 },
		`blk_replica_in_sync{node="` + victim + `",volume="r"}`:              func(f float64) bool { return f == 0 },
		`blk_replica_in_sync{node="` + other + `",volume="r"}`:               func(f float64) bool { return f == 1 },
		`blk_replica_write_failures_total{node="` + victim + `",volume="r"}`: func(f float64) bool { return f >= 1 },
		`blk_replica_write_failures_total{node="` + other + `",volume="r"}`:  func(f float64) bool { return f == 0 },
		`blk_replica_writes_total{node="` + other + `",volume="r"}`:          func(f float64) bool { return f >= 200 },
	} {
		if got := sampleOf(m, series); !want(got) {
			t.Errorf("primary's %s = %v", series, got)
		}
	}

	// The host reads what it wrote.
	got := make([]byte, len(model))
	for off := 0; off < len(got); off += 64 << 10 {
		if err := pathRetry(func() error { _, err := ns.ReadAt(got[off:off+64<<10], int64(off)); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, model) {
		t.Fatalf("the host reads back other bytes than it wrote")
	}

	// volume verify, through the leader: the victim is dead (not
	// compared), the in-sync replica equals the primary.
	verify := func() verifyJSON {
		t.Helper()
		var cl clusterJSON
		pp.must(t, "GET", "/v1/cluster", "", 200, &cl)
		var res verifyJSON
		c.procs[cl.LeaderID].must(t, "POST", "/v1/volumes/r/verify", "", 200, &res)
		return res
	}
	res := verify()
	if res.Regions != 16 || len(res.Compared) != 2 || res.Compared[0] != primary || res.Unreachable[victim] == "" || len(res.Mismatches) != 0 {
		t.Fatalf("verify with %s dead: %+v", victim, res)
	}

	// Restarted, the victim is compared while the primary rebuilds it
	// (1 MiB/s, LBA order: the last region is copied ~15 s after the
	// restart): it still differs where it missed writes, as
	// a replica not in sync, which blkctl reports without failing.
	c.start(victim, "--zone", zoneOf(victim))
	eventually(t, 30*time.Second, "verify compares "+victim, func() error {
		if res = verify(); len(res.Compared) != 3 {
			return fmt.Errorf("%+v", res)
		}
		return nil
	})
	if len(res.Mismatches) == 0 {
		t.Fatalf("verify finds no difference on %s, which missed writes: %+v", victim, res)
	}
	for _, m := range res.Mismatches {
		if m.Node != victim || m.InSync {
			t.Fatalf("verify: %+v: only %s, not in sync, may differ", m, victim)
		}
	}
	t.Logf("verify: %s differs in %d of %d regions", victim, len(res.Mismatches), res.Regions)

	// The primary rebuilds it while the host keeps writing, and it comes
	// back in sync: by a compare, not from the dirty-region log of what
	// it missed, since the victim's process died and may have lost
	// writes it had acknowledged (boot.go).
	stop = writers(100)
	states := map[string]bool{}
	var progress []rebuildJSON
	eventually(t, 60*time.Second, victim+" rebuilt in sync", func() error {
		v = replicatedJSON{} // omitted fields must not keep older values
		pp.must(t, "GET", "/v1/volumes/r", "", 200, &v)
		for _, r := range v.Replicas {
			if r.Node == victim {
				states[r.State] = true
				if r.Rebuild != nil {
					progress = append(progress, *r.Rebuild)
				}
				if r.State == "in-sync" {
					return nil
				}
			}
		}
		return fmt.Errorf("%+v", v.Replicas)
	})
	time.Sleep(300 * time.Millisecond) // writes to the rebuilt replica
	if err := stop(); err != nil {
		t.Fatalf("a host write failed while %s was rebuilt: %v", victim, err)
	}
	t.Logf("%s back in sync (states seen: %v, %d progress reports): %+v", victim, states, len(progress), v.Replicas)
	if v.Reason != "" {
		t.Errorf("after the rebuild: reason %q, want none", v.Reason)
	}
	for i, p := range progress {
		if p.Total == 0 || p.Total > 16<<20 || p.Done > p.Total || i > 0 && p.Done < progress[i-1].Done {
			t.Errorf("rebuild progress %v of a 16 MiB volume's dirty regions", progress)
		}
	}
	if len(progress) == 0 {
		t.Errorf("no rebuild progress shown by the primary during a 16 s rebuild")
	}
	m = pp.metricsText(t)
	for series, want := range map[string]float64{
		`blk_replica_in_sync{node="` + victim + `",volume="r"}`:                 1,
		`blk_replica_rebuild_remaining_bytes{node="` + victim + `",volume="r"}`: 0,
	} {
		if got := sampleOf(m, series); got != want {
			t.Errorf("primary's %s = %v after the rebuild, want %v", series, got, want)
		}
	}
	passed := sampleOf(m, `blk_replica_rebuild_bytes_total{node="`+victim+`",volume="r"}`)
	copied := sampleOf(m, `blk_replica_rebuild_copied_bytes_total{mode="compare",node="`+victim+`",volume="r"}`)
	if passed != 16<<20 || copied <= 0 || copied > passed {
		t.Errorf("primary's rebuild of %s: compared %v bytes of the 16 MiB volume, copied %v", victim, passed, copied)
	}
	res = verify()
	if len(res.Compared) != 3 || len(res.Mismatches) != 0 {
		ctrl.Close()
		c.stopAll(syscall.SIGTERM)
		for _, id := range ids {
			t.Logf("after the failed verify, the store of %s: %v", id, storeEquals(filepath.Join(c.nodes[id].dir, "volumes"), v.ID, model))
		}
		t.Fatalf("verify after the rebuild of %s: %+v", victim, res)
	}
	ctrl.Close()

	// Every replica's store holds exactly the model, the rebuilt one too.
	c.stopAll(syscall.SIGTERM)
	for _, id := range ids {
		if err := storeEquals(filepath.Join(c.nodes[id].dir, "volumes"), v.ID, model); err != nil {
			t.Errorf("replica on %s: %v", id, err)
		}
	}
}

// storeEquals opens the store in dir and compares volume id with want.
func storeEquals(dir string, id uint64, want []byte) error {
	s, err := store.Open(store.Config{Dir: dir})
	if err != nil {
		return err
	}
	defer s.Close()
	vol, err := s.Volume(store.ID(id))
	if err != nil {
		return err
	}
	got := make([]byte, len(want))
	for off := 0; off < len(got); off += 1 << 20 {
		end := min(off+1<<20, len(got))
		if err := vol.Read(uint64(off/4096), got[off:end]); err != nil {
			return err
		}
	}
	if !bytes.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				return fmt.Errorf("differs from what the host wrote from byte %d (block %d)", i, i/4096)
			}
		}
	}
	return nil
}
