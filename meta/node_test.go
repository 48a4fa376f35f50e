package meta

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// TestNodeSingle: a one-member cluster on an in-memory transport and an
// in-memory pebble FS; restart keeps the registry.
func TestNodeSingle(t *testing.T) {
	dir := t.TempDir()
	fs := vfs.NewMem()
	start := func() *Node { return startSolo(t, dir, fs, nil) }
	n := start()
	ctx := context.Background()
	if r, err := n.Apply(ctx, RegisterNode{ID: "s", TargetAddr: "a:1", MgmtAddr: "a:2"}); err != nil || r.Node.State != NodeUp || r.Index == 0 {
		t.Fatalf("register: %+v, %v", r, err)
	}
	r, err := n.Apply(ctx, CreateVolume{Name: "v", SizeBytes: 4096, BlockSize: 4096, Node: "s", At: 42})
	if err != nil || r.Volume.ID != 1 {
		t.Fatalf("create: %+v, %v", r, err)
	}
	// A refused command: the error is the result's, typed.
	if r, err := n.Apply(ctx, CreateVolume{Name: "w", SizeBytes: 4000, BlockSize: 4096, Node: "s"}); !errors.Is(err, ErrSizeNotMultiple) || r.Err != err {
		t.Fatalf("bad size: %+v, %v", r, err)
	}
	// Encoding limits are checked before raft.
	if _, err := n.Apply(ctx, CreateVolume{Name: string(make([]byte, MaxCommandBytes))}); !errors.Is(err, ErrLimit) {
		t.Fatalf("huge command: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := n.Linearize(cctx); !errors.Is(err, context.Canceled) {
		// The barrier may have finished first; both are fine, but not
		// another error.
		if err != nil {
			t.Fatalf("cancelled Linearize: %v", err)
		}
	}
	if addr, id := n.Leader(); addr != "solo" || id != "solo" {
		t.Errorf("Leader() = %q, %q", addr, id)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	n = start()
	defer n.Close()
	v, err := n.ReadVolume(ctx, "v")
	if err != nil || v.CreatedAt != 42 || v.State != VolumeCreating {
		t.Fatalf("after restart: %+v, %v", v, err)
	}
}

func TestNotLeaderError(t *testing.T) {
	var err error = &NotLeaderError{}
	if !errors.Is(err, ErrNotLeader) || err.Error() == "" {
		t.Error(err)
	}
	err = &NotLeaderError{LeaderAddr: "10.0.0.1:7000", LeaderID: "m1"}
	if want := "meta: not the raft leader (leader m1 at 10.0.0.1:7000)"; err.Error() != want {
		t.Errorf("%q", err)
	}
}

func TestNewNodeBadConfig(t *testing.T) {
	if _, err := NewNode(Config{ID: "x"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("missing DataDir: %v", err)
	}
}

// TestNodeMember: Member reads this node's own raft configuration, with
// no leader needed: a new node without state is no member; one added as
// a nonvoter is a member once the configuration reached it, and stays
// one across a restart with the rest of the cluster down (what lets blkd
// skip --join when a whole cluster restarts); a voter says so.
func TestNodeMember(t *testing.T) {
	c := newInmemCluster(t, 2)
	first := c.start(0, true)
	if m, v := first.Member(); !m || !v {
		t.Fatalf("bootstrapped node: member %v voter %v", m, v)
	}
	second := c.start(1, false)
	if m, _ := second.Member(); m {
		t.Fatal("a new node without state is a member")
	}
	c.waitLeader()
	ctx := context.Background()
	if err := first.AddNonvoter(ctx, "m1", string(c.addr(1))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "nonvoter sees itself", func() error {
		if m, v := second.Member(); !m || v {
			return fmt.Errorf("member %v voter %v", m, v)
		}
		return nil
	})
	if err := first.AddVoter(ctx, "m1", string(c.addr(1))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "voter sees itself", func() error {
		if m, v := second.Member(); !m || !v {
			return fmt.Errorf("member %v voter %v", m, v)
		}
		return nil
	})
	c.stop(0)
	c.stop(1)
	again := c.start(1, false)
	if m, v := again.Member(); !m || !v || !again.HasState() {
		t.Fatalf("restarted alone: member %v voter %v state %v", m, v, again.HasState())
	}
}

// startSolo starts a bootstrapped one-voter node "solo" on dir in fs
// (edit, if not nil, adjusts its Config first) and waits until it leads.
func startSolo(t *testing.T, dir string, fs vfs.FS, edit func(*Config)) *Node {
	t.Helper()
	_, tr := raft.NewInmemTransport("solo")
	cfg := testConfig(t, "solo", dir)
	cfg.Transport, cfg.Bootstrap, cfg.FS = tr, true, fs
	if edit != nil {
		edit(&cfg)
	}
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "leader", func() error {
		if !n.IsLeader() {
			return errors.New("not yet")
		}
		return nil
	})
	return n
}
