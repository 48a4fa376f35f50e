package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme/auth"
)

// replicaCluster is several storage nodes, each with its own store,
// target and reconciler, over one registry.
type replicaCluster struct {
	w      *world
	reg    *fakeRegistry
	stores map[string]*fakeStore
	tgts   map[string]*fakeTarget
	owners *owners
	mgr    *Manager
	log    *bytes.Buffer
}

// newReplicaCluster registers one node per zone given ("" for none),
// n1, n2, ..., all with the replication feature, and a manager allowing
// five replicas.
func newReplicaCluster(t *testing.T, zones ...string) *replicaCluster {
	t.Helper()
	w := &world{}
	c := &replicaCluster{w: w, reg: &fakeRegistry{w: w, state: meta.NewState()}, stores: map[string]*fakeStore{}, tgts: map[string]*fakeTarget{}, log: &bytes.Buffer{}}
	c.owners = &owners{reg: c.reg, recs: map[string]*Reconciler{}, down: map[string]bool{}}
	for i, z := range zones {
		id := fmt.Sprintf("n%d", i+1)
		c.register(t, id, z, true)
	}
	c.mgr = NewManager(c.reg, c.owners)
	c.mgr.MaxReplicas = meta.MaxReplicas
	c.mgr.Log = slog.New(slog.NewTextHandler(c.log, nil))
	return c
}

func (c *replicaCluster) register(t *testing.T, id, zone string, replication bool) {
	t.Helper()
	var features []string
	if replication {
		features = []string{meta.FeatureReplication, meta.FeatureReplace}
	}
	if _, err := c.reg.Apply(context.Background(), meta.RegisterNode{ID: id, TCPAddr: id + ":4420", MgmtAddr: id + ":7070", Zone: zone, Features: features}); err != nil {
		t.Fatal(err)
	}
	st := &fakeStore{w: c.w, vols: map[uint64]shape{}}
	c.stores[id] = st
	c.tgts[id] = &fakeTarget{w: c.w, subs: map[string]*sub{}, store: st}
	c.owners.recs[id] = NewReconciler(id, st, c.tgts[id], nil)
}

// checkCopies asserts v has a store volume of its ID, size and block size
// on every replica node and on no other, and is served on its primary
// only.
func (c *replicaCluster) checkCopies(t *testing.T, name string) meta.Volume {
	t.Helper()
	v, ok := c.reg.state.Volume(name)
	if !ok {
		t.Fatalf("no volume %q", name)
	}
	for id, st := range c.stores {
		_, holds := v.Replica(id)
		sh, has := st.vols[v.ID]
		switch {
		case holds && !has:
			t.Errorf("replica node %s has no store volume %d", id, v.ID)
		case !holds && has:
			t.Errorf("node %s holds no replica but has store volume %d", id, v.ID)
		case has && (sh.size != v.SizeBytes || sh.bs != v.BlockSize):
			t.Errorf("node %s: store volume %d/%d, registry %d/%d", id, sh.size, sh.bs, v.SizeBytes, v.BlockSize)
		}
		if served := c.tgts[id].Served(v); served != (id == v.Node) {
			t.Errorf("node %s serves %s: %v (primary %s)", id, v.NQN, served, v.Node)
		}
		// Every secondary, and only they, take the primary's replica
		// connections, at the registry's primary and epoch.
		want := ""
		if holds && id != v.Node && v.State != meta.VolumeOffline {
			want = fmt.Sprintf("%s@%d", v.Node, v.CurrentEpoch())
		}
		if got := c.tgts[id].replicas[v.ID]; got != want {
			t.Errorf("node %s replica subsystem of %s admits %q, want %q", id, v.Name, got, want)
		}
	}
	return v
}

func zonesOf(c *replicaCluster, v meta.Volume) []string {
	var out []string
	for _, r := range v.ReplicaSet() {
		n, _ := c.reg.state.Node(r.Node)
		out = append(out, n.Zone)
	}
	return out
}

// TestCreateThreeReplicas: three replicas on three zones, all in sync at
// epoch 1, Want 3; the store volume is created on every replica node, the
// primary serves it, the others hold it on standby; the volume is online.
func TestCreateThreeReplicas(t *testing.T) {
	ctx := context.Background()
	c := newReplicaCluster(t, "a", "a", "b", "c")
	v, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if v.State != meta.VolumeOnline || v.Want != 3 || v.CurrentEpoch() != 1 || len(v.Replicas) != 3 || len(v.InSync()) != 3 {
		t.Fatalf("volume %+v", v)
	}
	if z := zonesOf(c, v); !slices.Equal(slices.Sorted(slices.Values(z)), []string{"a", "b", "c"}) {
		t.Fatalf("zones %v", z)
	}
	c.checkCopies(t, "v")
	// The replica connections' key pair: two distinct DH-HMAC-CHAP
	// secrets, made for this volume.
	rs := v.ReplicaSecret
	if rs == nil {
		t.Fatal("no replica secret")
	}
	for _, k := range []string{rs.Host, rs.Ctrl} {
		if _, err := auth.ParseKey(k); err != nil {
			t.Fatalf("replica secret %q: %v", k, err)
		}
	}
	if rs.Host == rs.Ctrl {
		t.Fatal("the replica secret's halves are equal")
	}
	for _, r := range v.Replicas {
		st, _ := c.owners.recs[r.Node].Status("v")
		if want := readyState(v, r.Node); st.State != want {
			t.Errorf("node %s: %v, want %v", r.Node, st.State, want)
		}
	}
}

// TestCreateTooFewZones: three replicas over two zones are refused before
// anything is written, naming the zones there are.
func TestCreateTooFewZones(t *testing.T) {
	c := newReplicaCluster(t, "a", "a", "b", "b")
	_, err := c.mgr.Create(context.Background(), CreateRequest{Name: "v", SizeBytes: 1 << 20, Replicas: 3})
	if !errors.Is(err, meta.ErrNoPlacement) || !strings.Contains(err.Error(), "2 such zone(s)") {
		t.Fatalf("err %v", err)
	}
	if _, ok := c.reg.state.Volume("v"); ok {
		t.Fatal("volume registered")
	}
	for id, st := range c.stores {
		if len(st.vols) != 0 {
			t.Errorf("node %s store %v", id, st.vols)
		}
	}
}

// TestDefaultReplicas: 0 replicas means 3 with three eligible zones (a
// node without a zone is its own), else 1, never above MaxReplicas, and 1
// while some node cannot apply replica commands; the choice is stored.
func TestDefaultReplicas(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name    string
		zones   []string
		max     int
		old     bool // one more node without the replication feature
		down    string
		want    int
		wantSet bool // an explicit replica set (every node can apply it)
	}{
		{name: "three zones", zones: []string{"a", "b", "c"}, max: 5, want: 3, wantSet: true},
		{name: "no zones: each node its own", zones: []string{"", "", ""}, max: 5, want: 3, wantSet: true},
		{name: "two zones", zones: []string{"a", "b", "b"}, max: 5, want: 1, wantSet: true},
		{name: "third zone down", zones: []string{"a", "b", "c"}, max: 5, down: "n3", want: 1, wantSet: true},
		{name: "capped", zones: []string{"a", "b", "c"}, max: 0, want: 1, wantSet: true},
		{name: "an old node", zones: []string{"a", "b", "c"}, max: 5, old: true, want: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newReplicaCluster(t, tt.zones...)
			c.mgr.MaxReplicas = tt.max
			if tt.old {
				c.register(t, "old", "z", false)
			}
			if tt.down != "" {
				if _, err := c.reg.Apply(ctx, meta.SetNodeState{ID: tt.down, State: meta.NodeDown}); err != nil {
					t.Fatal(err)
				}
			}
			v, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: "n1"})
			if err != nil {
				t.Fatal(err)
			}
			if len(v.ReplicaSet()) != tt.want || v.WantReplicas() != tt.want || (len(v.Replicas) > 0) != tt.wantSet || v.Node != "n1" {
				t.Fatalf("volume %+v, want %d replicas", v, tt.want)
			}
			c.checkCopies(t, "v")
		})
	}
}

// TestReplicasNeedEveryNode: with a node that does not apply replica
// commands, a replicated create and every replica command are refused,
// naming it; nothing is written.
func TestReplicasNeedEveryNode(t *testing.T) {
	ctx := context.Background()
	c := newReplicaCluster(t, "a", "b", "c")
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	c.register(t, "old", "d", false)
	before := c.reg.state.MarshalState()
	errs := []error{}
	_, err := c.mgr.Create(ctx, CreateRequest{Name: "w", SizeBytes: 1 << 20, Replicas: 2})
	errs = append(errs, err, c.mgr.SetReplicaState(ctx, "v", 1, "n2", meta.ReplicaOutOfSync, "x", false))
	_, err = c.mgr.SetPrimary(ctx, "v", 1, "n2", false)
	errs = append(errs, err)
	_, err = c.mgr.AddReplica(ctx, "v", "")
	errs = append(errs, err)
	_, err = c.mgr.RemoveReplica(ctx, "v", "n3")
	errs = append(errs, err)
	for i, err := range errs {
		if !errors.Is(err, ErrFeatureMissing) || !strings.Contains(err.Error(), "node old") {
			t.Errorf("%d: %v", i, err)
		}
	}
	if after := c.reg.state.MarshalState(); !bytes.Equal(before, after) {
		t.Error("a refused request changed the registry")
	}
	// One replica is no replica command: it goes ahead.
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "w", SizeBytes: 1 << 20, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
}

// TestReplicaLimits: counts outside 1..MaxReplicas are refused.
func TestReplicaLimits(t *testing.T) {
	c := newReplicaCluster(t, "a", "b", "c")
	c.mgr.MaxReplicas = 2
	for _, n := range []int{-1, 3, 6} {
		if _, err := c.mgr.Create(context.Background(), CreateRequest{Name: "v", SizeBytes: 1 << 20, Replicas: n}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%d replicas: %v", n, err)
		}
	}
}

// TestTwoReplicasNeedThreeNodes: two copies on a two-node cluster are
// refused (no failover could commit), allowed with a third node.
func TestTwoReplicasNeedThreeNodes(t *testing.T) {
	ctx := context.Background()
	c := newReplicaCluster(t, "a", "b")
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Replicas: 2}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "add a third node") {
		t.Fatalf("two nodes: %v", err)
	}
	c.register(t, "n3", "c", true)
	if v, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Replicas: 2}); err != nil || len(v.Replicas) != 2 {
		t.Fatalf("three nodes: %+v %v", v, err)
	}
}

// TestPinnedPrimary: --node pins the primary; the others are placed in
// other zones.
func TestPinnedPrimary(t *testing.T) {
	c := newReplicaCluster(t, "a", "a", "b", "c")
	v, err := c.mgr.Create(context.Background(), CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: "n2", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if v.Node != "n2" || v.Replicas[0].Node != "n2" || slices.ContainsFunc(v.Replicas[1:], func(r meta.Replica) bool { return r.Node == "n1" }) {
		t.Fatalf("replicas %+v", v.Replicas)
	}
	c.checkCopies(t, "v")
}

// TestReplicaCommandsThroughManager: the four replica operations commit,
// log, and have the nodes follow: a new primary serves and the old one
// stops; an added replica's node creates the empty store volume.
func TestReplicaCommandsThroughManager(t *testing.T) {
	ctx := context.Background()
	c := newReplicaCluster(t, "a", "b", "c", "d")
	v, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: "n1", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	second := v.Replicas[1].Node
	third := v.Replicas[2].Node
	if err := c.mgr.SetReplicaState(ctx, "v", 1, third, meta.ReplicaOutOfSync, "leg failed: timeout", false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(c.log.String(), fmt.Sprintf(`msg="replica state" volume=v node=%s from=in-sync to=out-of-sync epoch=1 reason="leg failed: timeout"`, third)) {
		t.Errorf("log:\n%s", c.log)
	}
	v, err = c.mgr.SetPrimary(ctx, "v", 1, second, true)
	if err != nil {
		t.Fatal(err)
	}
	if v.Node != second || v.CurrentEpoch() != 2 {
		t.Fatalf("after failover %+v", v)
	}
	if r, _ := v.Replica("n1"); r.State != meta.ReplicaOutOfSync {
		t.Fatalf("old primary %+v", r)
	}
	if !c.tgts[second].Served(v) {
		t.Fatal("the new primary does not serve")
	}
	// A failover does not wait for the old primary (presumed lost): it
	// stops serving at the next settle round.
	if !c.tgts["n1"].Served(v) {
		t.Fatal("the failover reached the old primary")
	}
	if bad, err := c.mgr.Settle(ctx); err != nil || len(bad) != 0 {
		t.Fatalf("settle: %v %v", bad, err)
	}
	c.checkCopies(t, "v")
	if st, _ := c.owners.recs["n1"].Status("v"); st.State != StateStandby {
		t.Errorf("old primary's local state %v", st.State)
	}
	// A report of the deposed epoch is refused.
	if err := c.mgr.SetReplicaState(ctx, "v", 1, third, meta.ReplicaRebuilding, "", false); !errors.Is(err, meta.ErrStaleEpoch) {
		t.Fatalf("stale report: %v", err)
	}
	// Replace n1: add a replica where placement says (the one zone
	// left), then remove n1's.
	v, err = c.mgr.AddReplica(ctx, "v", "")
	if err != nil {
		t.Fatal(err)
	}
	added := v.Replicas[len(v.Replicas)-1]
	if added.State != meta.ReplicaOutOfSync || !added.Full || added.Node != "n4" {
		t.Fatalf("added %+v", added)
	}
	if _, err := c.mgr.AddReplica(ctx, "v", ""); !errors.Is(err, meta.ErrNoPlacement) {
		t.Fatalf("a fifth zone: %v", err)
	}
	if _, err := c.mgr.RemoveReplica(ctx, "v", "n1"); err != nil {
		t.Fatal(err)
	}
	// n1 keeps the removed replica's data (step 8 deletes it): only the
	// replica nodes are checked.
	delete(c.stores["n1"].vols, v.ID)
	c.checkCopies(t, "v")
	// A planned handover to third once it is rebuilt: the old primary
	// stops serving before the call returns.
	for _, st := range []meta.ReplicaState{meta.ReplicaRebuilding, meta.ReplicaInSync} {
		if err := c.mgr.SetReplicaState(ctx, "v", 2, third, st, "", false); err != nil {
			t.Fatal(err)
		}
	}
	if v, err = c.mgr.SetPrimary(ctx, "v", 2, third, false); err != nil || v.Node != third || v.CurrentEpoch() != 3 {
		t.Fatalf("handover: %+v %v", v, err)
	}
	c.checkCopies(t, "v")
	for _, want := range []string{
		`msg="replica primary" volume=v from=n1 to=` + second + ` epoch=2 failover=true`,
		`msg="replica state" volume=v node=n1 from=in-sync to=out-of-sync epoch=2 reason="primary lost at epoch 1"`,
		`msg="replica state" volume=v node=n4 from=none to=out-of-sync epoch=2 reason="new replica"`,
		`msg="replica state" volume=v node=n1 from=out-of-sync to=none epoch=2 reason=removed`,
	} {
		if !strings.Contains(c.log.String(), want) {
			t.Errorf("no %s in the log:\n%s", want, c.log)
		}
	}
}

// TestResizeAndDeleteEveryReplica: a resize grows every copy, a delete
// removes every copy before the registry forgets the volume.
func TestResizeAndDeleteEveryReplica(t *testing.T) {
	ctx := context.Background()
	c := newReplicaCluster(t, "a", "b", "c")
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.mgr.Resize(ctx, "v", 4<<20); err != nil {
		t.Fatal(err)
	}
	if v := c.checkCopies(t, "v"); v.SizeBytes != 4<<20 {
		t.Fatalf("size %d", v.SizeBytes)
	}
	// A secondary down: the delete stays pending, nothing is purged.
	c.owners.down["n3"] = true
	if err := c.mgr.Delete(ctx, "v", false); !errors.Is(err, ErrOwnerUnreachable) || !strings.Contains(err.Error(), "node n3") {
		t.Fatalf("delete with n3 down: %v", err)
	}
	if v, ok := c.reg.state.Volume("v"); !ok || v.State != meta.VolumeDeleting {
		t.Fatalf("after a half delete: %+v %v", v, ok)
	}
	// Nor does a settle round while n3 is still down.
	if bad, err := c.mgr.Settle(ctx); err != nil || bad["n3"] == nil {
		t.Fatalf("settle: %v %v", bad, err)
	}
	if _, ok := c.reg.state.Volume("v"); !ok {
		t.Fatal("purged while node n3 still holds a copy")
	}
	c.owners.down["n3"] = false
	if bad, err := c.mgr.Settle(ctx); err != nil || len(bad) != 0 {
		t.Fatalf("settle: %v %v", bad, err)
	}
	if _, ok := c.reg.state.Volume("v"); ok {
		t.Fatal("not purged")
	}
	for id, st := range c.stores {
		if len(st.vols) != 0 {
			t.Errorf("node %s keeps %v", id, st.vols)
		}
	}
}

// TestSettleFinishesASecondary: a create whose secondary did not answer
// stays creating; the settle round has the secondary create its copy and
// only then puts the volume online. A restarted secondary reconciles its
// copy (not an orphan).
func TestSettleFinishesASecondary(t *testing.T) {
	ctx := context.Background()
	c := newReplicaCluster(t, "a", "b", "c")
	c.owners.down["n2"] = true
	_, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: "n1", Replicas: 2})
	if !errors.Is(err, ErrOwnerUnreachable) || !strings.Contains(err.Error(), "node n2") {
		// Placement ranks n2 before n3 (equal capacity and volumes,
		// then by ID); these owners have no Answerer to skip it.
		t.Fatalf("create: %v", err)
	}
	if v, _ := c.reg.state.Volume("v"); v.State != meta.VolumeCreating {
		t.Fatalf("state %v", v.State)
	}
	if bad, _ := c.mgr.Settle(ctx); bad["n2"] == nil {
		t.Fatalf("settle: unreachable %v", bad)
	}
	if v, _ := c.reg.state.Volume("v"); v.State != meta.VolumeCreating {
		t.Fatalf("online before its secondary has a copy: %v", v.State)
	}
	c.owners.down["n2"] = false
	if bad, err := c.mgr.Settle(ctx); err != nil || len(bad) != 0 {
		t.Fatalf("settle: %v %v", bad, err)
	}
	if v := c.checkCopies(t, "v"); v.State != meta.VolumeOnline {
		t.Fatalf("state %v", v.State)
	}
	// n2 restarts: its reconciler finds its copy in the registry.
	c.owners.recs["n2"] = NewReconciler("n2", c.stores["n2"], &fakeTarget{w: c.w, subs: map[string]*sub{}, store: c.stores["n2"]}, nil)
	vols, _ := c.reg.Volumes(ctx)
	sts := c.owners.recs["n2"].ReconcileAll(vols)
	if len(sts) != 1 || sts[0].State != StateStandby {
		t.Fatalf("restart statuses %+v", sts)
	}
}

// crashCluster is newReplicaCluster's nodes as one crash domain for
// TestCrashBetweenStepsReplicated: a crash loses every target (in
// memory); stores and the registry keep what they committed.
type crashCluster struct{ *replicaCluster }

func newCrashCluster(t *testing.T) crashCluster {
	c := crashCluster{newReplicaCluster(t, "a", "b", "c")}
	c.w.steps = 0
	return c
}

// clone is the cluster after a crash: stores and registry copied, targets
// and reconcilers new.
func (c crashCluster) clone(t *testing.T) crashCluster {
	n := &replicaCluster{w: c.w, reg: &fakeRegistry{w: c.w, state: cloneState(t, c.reg.state), index: c.reg.index}, stores: map[string]*fakeStore{}, tgts: map[string]*fakeTarget{}, log: &bytes.Buffer{}}
	for id, st := range c.stores {
		n.stores[id] = &fakeStore{w: c.w, vols: maps(st.vols)}
	}
	out := crashCluster{n}
	out.restart()
	return out
}

// restart is new processes on the same stores and registry.
func (c crashCluster) restart() {
	c.owners = &owners{reg: c.reg, recs: map[string]*Reconciler{}, down: map[string]bool{}}
	for id, st := range c.stores {
		c.tgts[id] = &fakeTarget{w: c.w, subs: map[string]*sub{}, store: st}
		c.owners.recs[id] = NewReconciler(id, st, c.tgts[id], nil)
	}
	c.mgr = NewManager(c.reg, c.owners)
	c.mgr.MaxReplicas = meta.MaxReplicas
}

// recover is every node's restart path, then one settle round.
func (c crashCluster) recover(t *testing.T) {
	vols, _ := c.reg.Volumes(context.Background())
	for _, id := range []string{"n1", "n2", "n3"} {
		c.owners.recs[id].ReconcileAll(vols)
	}
	if bad, err := c.mgr.Settle(context.Background()); err != nil || len(bad) != 0 {
		t.Fatalf("settle: %v %v", bad, err)
	}
}

// check: every registry volume online; a store volume of its shape on
// every replica node and nowhere else; served by its primary only, with
// its hosts; no subsystem or store volume without a registry entry.
func (c crashCluster) check() error {
	vols, _ := c.reg.Volumes(context.Background())
	ids, nqns := map[uint64]bool{}, map[string]bool{}
	for _, v := range vols {
		ids[v.ID], nqns[v.NQN] = true, true
		if v.State != meta.VolumeOnline {
			return fmt.Errorf("volume %q is %v (%s), want online", v.Name, v.State, v.Reason)
		}
		for id, st := range c.stores {
			_, holds := v.Replica(id)
			sh, has := st.vols[v.ID]
			if holds != has || (has && (sh.size != v.SizeBytes || sh.bs != v.BlockSize)) {
				return fmt.Errorf("volume %q on %s: replica %v, store %v %+v, registry %d", v.Name, id, holds, has, sh, v.SizeBytes)
			}
			sub, served := c.tgts[id].subs[v.NQN]
			if served != (id == v.Node) {
				return fmt.Errorf("volume %q served on %s: %v (primary %s)", v.Name, id, served, v.Node)
			}
			if served && !slices.Equal(sub.hosts, v.Hosts) {
				return fmt.Errorf("volume %q: served hosts %v, registry %v", v.Name, sub.hosts, v.Hosts)
			}
		}
	}
	for id, st := range c.stores {
		for vid := range st.vols {
			if !ids[vid] {
				return fmt.Errorf("node %s: store volume %d has no registry entry", id, vid)
			}
		}
		for nqn := range c.tgts[id].subs {
			if !nqns[nqn] {
				return fmt.Errorf("node %s serves %s without a registry entry", id, nqn)
			}
		}
	}
	return nil
}

// randomReplicaOps is a seeded sequence of operations on replicated
// volumes: create (1 to 3 copies), resize, allow, planned change of
// primary, delete, on two names.
func randomReplicaOps(rng *rand.Rand, n int) ([]op, []string) {
	var ops []op
	var desc []string
	for range n {
		name := []string{"a", "b"}[rng.IntN(2)]
		switch rng.IntN(5) {
		case 0, 1:
			k := 1 + rng.IntN(3)
			desc = append(desc, fmt.Sprintf("create %s ×%d", name, k))
			ops = append(ops, func(ctx context.Context, m *Manager) error {
				_, err := m.Create(ctx, CreateRequest{Name: name, SizeBytes: 1 << 20, Replicas: k})
				return err
			})
		case 2:
			desc = append(desc, "resize "+name)
			ops = append(ops, func(ctx context.Context, m *Manager) error {
				v, err := m.reg.Volume(ctx, name)
				if err != nil {
					return err
				}
				_, err = m.Resize(ctx, name, v.SizeBytes+1<<20)
				return err
			})
		case 3:
			to := rng.IntN(3)
			desc = append(desc, fmt.Sprintf("primary %s → replica %d", name, to))
			ops = append(ops, func(ctx context.Context, m *Manager) error {
				v, err := m.reg.Volume(ctx, name)
				if err != nil {
					return err
				}
				set := v.ReplicaSet()
				_, err = m.SetPrimary(ctx, name, v.CurrentEpoch(), set[to%len(set)].Node, false)
				return err
			})
		default:
			if rng.IntN(2) == 0 {
				desc = append(desc, "allow "+name)
				ops = append(ops, func(ctx context.Context, m *Manager) error {
					_, err := m.AllowHost(ctx, name, "nqn.2014-08.org.nvmexpress:uuid:h", meta.HostSecret{})
					return err
				})
				continue
			}
			desc = append(desc, "delete "+name)
			ops = append(ops, func(ctx context.Context, m *Manager) error { return m.Delete(ctx, name, false) })
		}
	}
	return ops, desc
}

// TestCrashBetweenStepsReplicated is TestCrashBetweenSteps over three
// nodes with replicated volumes: a crash (every target lost) before any
// step of a seeded sequence, then a clean recovery, and the copies
// converge: each replica node holds the store volume at the registry's
// size, the primary alone serves it, nothing is left half-made.
func TestCrashBetweenStepsReplicated(t *testing.T) {
	base := seed(t)
	t.Logf("seed %d (replay with BLK_SEED=%d)", base, base)
	for round := range 6 {
		rng := rand.New(rand.NewPCG(base, uint64(round)+100))
		ops, desc := randomReplicaOps(rng, 10)
		c := newCrashCluster(t)
		if s := runOps(c.mgr, ops); s != "" {
			t.Fatalf("dry run crashed at %s", s)
		}
		if err := c.check(); err != nil {
			t.Fatalf("seed %d round %d: without a crash: %v\nops: %s", base, round, err, strings.Join(desc, "; "))
		}
		total := c.w.steps
		t.Logf("round %d: %d steps: %s", round, total, strings.Join(desc, "; "))
		for k := 1; k <= total; k++ {
			c := newCrashCluster(t)
			c.w.crashAt = k
			at := runOps(c.mgr, ops)
			if at == "" {
				t.Fatalf("seed %d round %d: no crash at step %d of %d", base, round, k, total)
			}
			c.w.crashAt = 0
			r := c.clone(t)
			r.recover(t)
			if err := r.check(); err != nil {
				t.Fatalf("seed %d round %d: crash at step %d (%s): %v\nops: %s\nsteps: %s", base, round, k, at, err, strings.Join(desc, "; "), strings.Join(c.w.trace, " "))
			}
		}
	}
}
