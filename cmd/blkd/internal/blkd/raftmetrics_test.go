package blkd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// TestRaftCollector: a single-node registry reports itself leader, its
// indexes and the FSM's counters; after Close it reports shutdown.
func TestRaftCollector(t *testing.T) {
	_, tr := raft.NewInmemTransport("solo")
	n, err := meta.NewNode(meta.Config{ID: "solo", DataDir: t.TempDir(), FS: vfs.NewMem(), Transport: tr, Bootstrap: true,
		HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for deadline := time.Now().Add(10 * time.Second); !n.IsLeader(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
	}
	ctx := context.Background()
	if _, err := n.Apply(ctx, meta.RegisterNode{ID: "solo", TargetAddr: "a:1", MgmtAddr: "a:2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Apply(ctx, meta.CreateVolume{Name: "v", SizeBytes: 4000, BlockSize: 4096, Node: "solo"}); !errors.Is(err, meta.ErrSizeNotMultiple) {
		t.Fatalf("bad size: %v", err)
	}
	p := prometheus.NewRegistry()
	if err := p.Register(NewRaftCollector(n)); err != nil {
		t.Fatal(err)
	}
	vals := gather(t, p)
	for name, want := range map[string]float64{
		`blk_raft_state{state="leader"}`: 1, `blk_raft_state{state="follower"}`: 0,
		`blk_raft_state{state="candidate"}`: 0, `blk_raft_state{state="shutdown"}`: 0,
		"blk_raft_peers": 1, "blk_meta_commands_applied_total": 2, "blk_meta_commands_refused_total": 1,
		"blk_meta_snapshots_restored_total": 0,
	} {
		if got, ok := vals[name]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	if vals["blk_raft_term"] < 1 || vals["blk_raft_last_log_index"] < 3 || vals["blk_raft_commit_index"] < 3 || vals["blk_raft_applied_index"] < 3 {
		t.Fatalf("raft gauges: %v", vals)
	}
	if _, ok := vals["blk_raft_last_contact_seconds"]; ok {
		t.Fatalf("a leader exports blk_raft_last_contact_seconds: %v", vals)
	}
	n.Close()
	if vals := gather(t, p); vals[`blk_raft_state{state="shutdown"}`] != 1 || vals[`blk_raft_state{state="leader"}`] != 0 {
		t.Fatalf("after Close: %v", vals)
	}
}

// gather returns every sample of p by name, with its labels as
// name{k="v",...}.
func gather(t *testing.T, p *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := p.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if len(ls) > 0 {
				name += "{" + strings.Join(ls, ",") + "}"
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			out[name] = v
		}
	}
	return out
}
