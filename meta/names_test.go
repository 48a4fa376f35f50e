package meta

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// legacyNames are volume names an older blkd accepted (printable ASCII):
// each is a path segment that an HTTP stack cleans, decodes or splits.
var legacyNames = []string{".", "..", "../x", "a/b", "%2e%2e", "-v"}

// TestNewNamesHeldToGrammar: a new volume (Check, as the API calls it
// before proposing) and a new node are held to the name grammar.
func TestNewNamesHeldToGrammar(t *testing.T) {
	for _, name := range legacyNames {
		err := CreateVolume{Name: name, SizeBytes: 4096, BlockSize: 4096, Node: "s"}.Check()
		if !errors.Is(err, ErrInvalid) || !errors.Is(err, api.ErrName) {
			t.Errorf("create %q: %v, want ErrInvalid and api.ErrName", name, err)
		}
		if !LegacyName(name) {
			t.Errorf("LegacyName(%q) = false", name)
		}
	}
	if err := (CreateVolume{Name: "vol-1.a_b", SizeBytes: 4096, BlockSize: 4096, Node: "s"}).Check(); err != nil || LegacyName("vol-1.a_b") {
		t.Errorf("good name: %v", err)
	}
	// Clones and snapshots are new: Check and Apply both hold their
	// names to the grammar ('@' included: VOL@SNAP must not be
	// ambiguous).
	s := snapshotBase(t)
	for _, name := range append(legacyNames, "v@s1", "") {
		for _, c := range []interface {
			Command
			Check() error
		}{CloneVolume{Name: name, Volume: "v", Snapshot: "s1"}, CreateSnapshot{Volume: "v", Name: name}} {
			if err := c.Check(); !errors.Is(err, ErrInvalid) {
				t.Errorf("%#v: Check: %v, want ErrInvalid", c, err)
			}
			if r := s.Apply(s.Index()+1, c); !errors.Is(r.Err, ErrInvalid) {
				t.Errorf("%#v: Apply: %v, want ErrInvalid", c, r.Err)
			}
		}
	}
	if err := (CloneVolume{Name: "c-1", NQN: "bad"}).Check(); !errors.Is(err, ErrInvalid) {
		t.Errorf("clone with a bad NQN: %v", err)
	}
	if err := (CloneVolume{Name: "c-1", ReplicaSecret: &HostSecret{Host: "DHHC-1:00:a:"}}).Check(); !errors.Is(err, ErrInvalid) {
		t.Errorf("clone with half a replica secret: %v", err)
	}
	if err := (CloneVolume{Name: "c-1", Volume: "v", Snapshot: "s1"}).Check(); err != nil {
		t.Errorf("good clone: %v", err)
	}
	if err := (CreateSnapshot{Volume: "v", Name: "nightly-2026.11.27_3"}).Check(); err != nil {
		t.Errorf("good snapshot: %v", err)
	}
}

// TestLegacyNamesReplay: a registry whose log and snapshot hold names
// from before the grammar (committed by an older blkd: proposed here
// straight to raft, past Node.Apply) restarts with every one of them,
// from the snapshot and from the log after it; Node.Apply refuses new
// such names but deletes and purges the old ones, and a legacy node
// re-registers.
func TestLegacyNamesReplay(t *testing.T) {
	dir := t.TempDir()
	fs := vfs.NewMem()
	start := func() *Node {
		return startSolo(t, dir, fs, func(cfg *Config) {
			cfg.SnapshotInterval, cfg.SnapshotThreshold = time.Hour, 1<<20 // snapshots only when asked
		})
	}
	ctx := context.Background()
	old := func(n *Node, c Command) {
		t.Helper()
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		f := n.Raft().Apply(b, 10*time.Second)
		if err := f.Error(); err != nil {
			t.Fatal(err)
		}
		if r := f.Response().(Result); r.Err != nil {
			t.Fatalf("%#v: %v", c, r.Err)
		}
	}
	n := start()
	old(n, RegisterNode{ID: "s/1", TCPAddr: "a:1", MgmtAddr: "a:2"})
	half := len(legacyNames) / 2
	for _, name := range legacyNames[:half] {
		old(n, CreateVolume{Name: name, SizeBytes: 4096, BlockSize: 4096, Node: "s/1"})
	}
	if err := n.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	for _, name := range legacyNames[half:] {
		old(n, CreateVolume{Name: name, SizeBytes: 4096, BlockSize: 4096, Node: "s/1"})
	}
	// New names outside the grammar never reach the log.
	idx := n.AppliedIndex()
	for _, name := range []string{"./y", "b/c"} {
		if _, err := n.Apply(ctx, CreateVolume{Name: name, SizeBytes: 4096, BlockSize: 4096, Node: "s/1"}); !errors.Is(err, api.ErrName) {
			t.Errorf("new volume %q: %v, want api.ErrName", name, err)
		}
	}
	if _, err := n.Apply(ctx, RegisterNode{ID: "t/2", TCPAddr: "a:1", MgmtAddr: "a:2"}); !errors.Is(err, api.ErrName) {
		t.Errorf("new node t/2: %v, want api.ErrName", err)
	}
	if err := n.AddNonvoter(ctx, "../t", "b:1"); !errors.Is(err, api.ErrName) {
		t.Errorf("new raft member ../t: %v, want api.ErrName", err)
	}
	if got := n.AppliedIndex(); got != idx {
		t.Errorf("refused proposals moved the applied index %d → %d", idx, got)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = start()
	defer n.Close()
	for _, name := range legacyNames {
		if v, err := n.ReadVolume(ctx, name); err != nil || v.Node != "s/1" {
			t.Fatalf("after restart, volume %q: %+v, %v", name, v, err)
		}
	}
	// The legacy node re-registers (as blkd does on every start).
	if _, err := n.Apply(ctx, RegisterNode{ID: "s/1", TCPAddr: "a:3", MgmtAddr: "a:2"}); err != nil {
		t.Fatalf("legacy node re-registers: %v", err)
	}
	for _, name := range legacyNames {
		if _, err := n.Apply(ctx, DeleteVolume{Name: name}); err != nil {
			t.Fatalf("delete %q: %v", name, err)
		}
		if _, err := n.Apply(ctx, PurgeVolume{Name: name}); err != nil {
			t.Fatalf("purge %q: %v", name, err)
		}
	}
	n.FSM().Read(func(s *State) {
		if vs := s.Export().Volumes; len(vs) != 0 {
			t.Errorf("volumes left: %+v", vs)
		}
	})
}

// TestNewNodeIDGrammar: a node that starts without state is held to the
// grammar; one with state keeps its ID.
func TestNewNodeIDGrammar(t *testing.T) {
	_, tr := raft.NewInmemTransport("x")
	cfg := testConfig(t, "a/b", t.TempDir())
	cfg.Transport, cfg.Bootstrap, cfg.FS = tr, true, vfs.NewMem()
	if n, err := NewNode(cfg); !errors.Is(err, api.ErrName) {
		if n != nil {
			n.Close()
		}
		t.Fatalf("new node a/b: %v, want api.ErrName", err)
	}
}
