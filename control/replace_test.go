package control

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/meta"
)

// inSyncCount is how many of v's replicas are in sync.
func inSyncCount(v meta.Volume) int { return len(v.InSync()) }

// rebuilt moves v's replica on node through rebuilding to in sync, as
// the primary's rebuild does.
func rebuilt(t *testing.T, c *replicaCluster, name, node string) {
	t.Helper()
	v, _ := c.reg.state.Volume(name)
	for _, st := range []meta.ReplicaState{meta.ReplicaRebuilding, meta.ReplicaInSync} {
		if err := c.mgr.SetReplicaState(context.Background(), name, v.CurrentEpoch(), node, st, "", false); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReplaceDeadReplica: a secondary's node dies; its replacement goes
// where placement says, in the dead node's own zone when no other is
// free; the old replica stays in the registry (and counts) until the new
// one is in sync, and is removed then.
func TestReplaceDeadReplica(t *testing.T) {
	ctx := context.Background()
	c := newReplicaCluster(t, "a", "b", "c", "c")
	v, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: "n1", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := replicaNodes(v); strings.Join(got, ",") != "n1,n2,n3" && strings.Join(got, ",") != "n1,n2,n4" {
		t.Fatalf("placed on %v", got)
	}
	dead := v.Replicas[2].Node
	spare := map[string]string{"n3": "n4", "n4": "n3"}[dead]
	before := inSyncCount(v)
	c.owners.down[dead] = true
	if _, err := c.reg.Apply(ctx, meta.SetNodeState{ID: dead, State: meta.NodeDown}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.mgr.ReplaceReplica(ctx, "v", "n1", "n2", ""); !errors.Is(err, meta.ErrInvalid) {
		t.Fatalf("replace onto a replica's node: %v", err)
	}
	if _, err := c.mgr.ReplaceReplica(ctx, "v", "n9", "", ""); !errors.Is(err, meta.ErrUnknownNode) {
		t.Fatalf("replace of no replica: %v", err)
	}
	v, err = c.mgr.ReplaceReplica(ctx, "v", dead, "", "")
	if err != nil {
		t.Fatal(err)
	}
	old, _ := v.Replica(dead)
	nr, _ := v.Replica(spare)
	if old.ReplacedBy != spare || nr.State != meta.ReplicaOutOfSync || !nr.Full {
		t.Fatalf("after replace: old %+v new %+v", old, nr)
	}
	if _, ok := c.stores[spare].vols[v.ID]; !ok {
		t.Fatal("the new replica's node has no store volume")
	}
	if _, err := c.mgr.ReplaceReplica(ctx, "v", dead, "", ""); !errors.Is(err, meta.ErrInvalid) {
		t.Fatalf("a second replacement: %v", err)
	}
	// Not in sync yet: nothing happens, however often the leader asks.
	for range 3 {
		if done, err := c.mgr.FinishReplace(ctx, "v", dead); done || err != nil {
			t.Fatalf("finish before in sync: %v %v", done, err)
		}
	}
	if v, _ := c.reg.state.Volume("v"); len(v.Replicas) != 4 {
		t.Fatalf("replicas %+v", v.Replicas)
	}
	rebuilt(t, c, "v", spare)
	done, err := c.mgr.FinishReplace(ctx, "v", dead)
	if !done || err != nil {
		t.Fatalf("finish: %v %v", done, err)
	}
	v, _ = c.reg.state.Volume("v")
	if _, ok := v.Replica(dead); ok || len(v.Replicas) != 3 || inSyncCount(v) < before {
		t.Fatalf("after finish: %+v (in sync before: %d)", v.Replicas, before)
	}
	if done, err := c.mgr.FinishReplace(ctx, "v", dead); !done || err != nil {
		t.Fatalf("finish again: %v %v", done, err)
	}
	for _, want := range []string{
		`msg="replica replaced" volume=v node=` + dead + ` by=` + spare,
		`msg="replaced replica's store volume kept on its node (not served, not counted): it did not delete it" volume=v node=` + dead,
	} {
		if !strings.Contains(c.log.String(), want) {
			t.Errorf("no %s in the log:\n%s", want, c.log)
		}
	}
	// The dead node kept its copy (it was down): back, it serves none of
	// it and reports it as a replica it does not hold.
	if _, ok := c.stores[dead].vols[v.ID]; !ok {
		t.Fatal("the dead node's copy went")
	}
	delete(c.owners.down, dead)
	var report []Status
	vols, _ := c.reg.Volumes(ctx)
	report = c.owners.recs[dead].ReconcileAll(vols)
	if len(report) != 1 || report[0].State != StateFailed || !strings.Contains(report[0].Reason, "places no replica of the volume on this node") {
		t.Fatalf("the returned node reports %+v", report)
	}
	if c.tgts[dead].Served(v) {
		t.Fatal("the returned node serves the replaced copy")
	}
}

// TestMovePrimary: moving the primary's replica hands over to the new
// one (epoch+1, the old primary stops serving) before removing it.
func TestMovePrimary(t *testing.T) {
	ctx := context.Background()
	c := newReplicaCluster(t, "a", "b", "c", "a")
	v, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: "n1", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.mgr.ReplaceReplica(ctx, "v", "n1", "n4", "moving"); err != nil {
		t.Fatal(err)
	}
	// The new replica falls out of sync between the leader's read and
	// the removal: the registry refuses the removal.
	rebuilt(t, c, "v", "n4")
	if err := c.mgr.SetReplicaState(ctx, "v", 1, "n4", meta.ReplicaOutOfSync, "leg failed", false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.mgr.removeReplica(ctx, "v", "n1", true); !errors.Is(err, meta.ErrInvalid) && !errors.Is(err, meta.ErrBadTransition) {
		t.Fatalf("removal with the new one out of sync: %v", err)
	}
	rebuilt(t, c, "v", "n4")
	if done, err := c.mgr.FinishReplace(ctx, "v", "n1"); !done || err != nil {
		t.Fatalf("finish: %v %v", done, err)
	}
	v, _ = c.reg.state.Volume("v")
	// n4 takes n1's place first in placement order: failback returns
	// there, not to n2.
	if v.Node != "n4" || v.Replicas[0].Node != "n4" || v.CurrentEpoch() != 2 || len(v.Replicas) != 3 || inSyncCount(v) != 3 {
		t.Fatalf("after move: node %s epoch %d %+v", v.Node, v.CurrentEpoch(), v.Replicas)
	}
	if c.tgts["n1"].Served(v) || !c.tgts["n4"].Served(v) {
		t.Fatalf("served on n1 %v, on n4 %v", c.tgts["n1"].Served(v), c.tgts["n4"].Served(v))
	}
	// n1 was up: it deleted its copy, and refuses to delete one it holds.
	c.checkCopies(t, "v")
	if err := c.owners.recs["n2"].DropRemoved(v, v.ID); !errors.Is(err, ErrInvalid) {
		t.Fatalf("drop of a replica held: %v", err)
	}
	if _, ok := c.stores["n2"].vols[v.ID]; !ok {
		t.Fatal("n2's copy went")
	}
}

// TestReplaceNeedsFeature: a node without the replace feature (an older
// blkd) refuses the command before anything is written.
func TestReplaceNeedsFeature(t *testing.T) {
	ctx := context.Background()
	c := newReplicaCluster(t, "a", "b", "c")
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.reg.Apply(ctx, meta.RegisterNode{ID: "n4", TCPAddr: "n4:4420", MgmtAddr: "n4:7070", Zone: "d", Features: []string{meta.FeatureReplication}}); err != nil {
		t.Fatal(err)
	}
	before := c.reg.state.MarshalState()
	if _, err := c.mgr.ReplaceReplica(ctx, "v", "n3", "n4", ""); !errors.Is(err, ErrFeatureMissing) {
		t.Fatalf("replace: %v", err)
	}
	if string(c.reg.state.MarshalState()) != string(before) {
		t.Fatal("the registry changed")
	}
}

// TestDueReplacements: only a secondary on a node down for the wait, of
// a volume not deleting whose primary is up, not already replaced or
// replacing, one per volume.
func TestDueReplacements(t *testing.T) {
	nodes := []meta.NodeInfo{{ID: "a", State: meta.NodeUp}, {ID: "b", State: meta.NodeDown}, {ID: "c", State: meta.NodeDown}, {ID: "d", State: meta.NodeUp}}
	rs := func(nodes ...string) []meta.Replica {
		var out []meta.Replica
		for _, n := range nodes {
			out = append(out, meta.Replica{Node: n, State: meta.ReplicaInSync})
		}
		return out
	}
	vols := []meta.Volume{
		{Name: "two-down", Node: "a", Replicas: rs("a", "b", "c")},
		{Name: "primary-down", Node: "b", Replicas: rs("b", "a")},
		{Name: "no-source", Node: "b", Replicas: rs("b", "c", "a")},
		{Name: "single", Node: "b"},
		{Name: "deleting", Node: "a", State: meta.VolumeDeleting, Replicas: rs("a", "b")},
		{Name: "replaced", Node: "a", Replicas: []meta.Replica{{Node: "a"}, {Node: "b", ReplacedBy: "d"}, {Node: "d"}}},
		{Name: "replacing", Node: "a", Replicas: []meta.Replica{{Node: "a"}, {Node: "d", ReplacedBy: "c"}, {Node: "c"}}},
	}
	downFor := func(n string) time.Duration {
		return map[string]time.Duration{"b": time.Minute, "c": 2 * time.Minute}[n]
	}
	got := DueReplacements(vols, nodes, downFor, time.Minute)
	if len(got) != 1 || got[0] != (DueReplacement{Volume: "two-down", Node: "b", Down: time.Minute}) {
		t.Fatalf("due %+v", got)
	}
	if got := DueReplacements(vols, nodes, downFor, 3*time.Minute); len(got) != 0 {
		t.Fatalf("due before the wait: %+v", got)
	}
}

// DropRemoved implements Dropper for the fake cluster: the node deletes
// its copy from its registry copy (the fake's is the registry itself).
func (o *owners) DropRemoved(_ context.Context, node, name string, id, _ uint64) error {
	if o.down[node] {
		return errors.New("connection refused")
	}
	v, ok := o.reg.state.Volume(name)
	if !ok {
		return meta.ErrUnknownVolume
	}
	return o.recs[node].DropRemoved(v, id)
}
