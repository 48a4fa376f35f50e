package meta

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// snapshotInvariants are the rules of docs/snapshots.md §2.2 every
// registry keeps after every command: store IDs unique across volumes
// and snapshots; every Parent an existing snapshot, with no cycle; a
// snapshot's Nodes among its volume's replicas; a deleting snapshot
// leaves at most one child once the deleting ones below it are freed
// (its nodes merge it into that one); a volume's chain (its Parent, then its own snapshots'
// parents) leaves the volume's own snapshots at its CloneOf, or at
// nothing when it is no clone; a flatten only of a clone without
// snapshots; at most one snapshot of a volume being taken, and none
// while it is flattened.
func snapshotInvariants(s *State) error {
	type obj struct {
		what   string
		parent uint64
		vol    *Volume
		sn     *VolumeSnapshot
	}
	objs := map[uint64]obj{}
	for _, v := range s.vols {
		if o, dup := objs[v.ID]; dup {
			return fmt.Errorf("volume %q and %s share ID %d", v.Name, o.what, v.ID)
		}
		objs[v.ID] = obj{what: "volume " + v.Name, parent: v.Parent, vol: v}
		creating := 0
		for i := range v.Snapshots {
			sn := &v.Snapshots[i]
			name := snapName(v.Name, sn.Name)
			if o, dup := objs[sn.ID]; dup || sn.ID == 0 || sn.ID >= s.nextVol {
				return fmt.Errorf("snapshot %s ID %d: taken by %s, or outside 1..%d", name, sn.ID, o.what, s.nextVol-1)
			}
			objs[sn.ID] = obj{what: "snapshot " + name, parent: sn.Parent, vol: v, sn: sn}
			if s.snaps[sn.ID] != v.Name {
				return fmt.Errorf("snapshot %s indexed under volume %q", name, s.snaps[sn.ID])
			}
			if !sn.State.valid() || v.snapshotIndex(sn.Name) != i {
				return fmt.Errorf("snapshot %s: state %v, or its name twice", name, sn.State)
			}
			if sn.State == SnapshotCreating {
				creating++
			}
			if v.State == VolumeDeleting && sn.State != SnapshotDeleting {
				return fmt.Errorf("snapshot %s is %v in a deleting volume", name, sn.State)
			}
			for j, n := range sn.Nodes {
				if _, ok := v.Replica(n); !ok || slices.Contains(sn.Nodes[:j], n) {
					return fmt.Errorf("snapshot %s: node %q holds no replica of %q, or is listed twice", name, n, v.Name)
				}
			}
		}
		if creating > 1 || (creating > 0 && v.Flatten != nil) {
			return fmt.Errorf("volume %q: %d snapshots being taken, flatten %v", v.Name, creating, v.Flatten)
		}
		if v.Flatten != nil && (v.CloneOf == nil || len(v.Snapshots) > 0) {
			return fmt.Errorf("volume %q flattened: clone of %v, %d snapshots", v.Name, v.CloneOf, len(v.Snapshots))
		}
	}
	for id := range s.snaps {
		if o, ok := objs[id]; !ok || o.sn == nil {
			return fmt.Errorf("snapshot ID %d indexed, not in the registry", id)
		}
	}
	children := map[uint64][]obj{}
	for id, o := range objs {
		if o.parent == 0 {
			continue
		}
		p, ok := objs[o.parent]
		if !ok || p.sn == nil {
			return fmt.Errorf("%s: parent %d is no snapshot", o.what, o.parent)
		}
		children[o.parent] = append(children[o.parent], o)
		n := 0
		for q := o.parent; q != 0; q = objs[q].parent {
			if n++; n > len(objs) {
				return fmt.Errorf("%s (%d): its parents form a cycle", o.what, id)
			}
		}
	}
	// live counts the objects a snapshot's children leave it once the
	// deleting ones are freed (a deleting snapshot merged into its
	// children): computed here from the object graph, independently of
	// State.liveChildren.
	var live func(id uint64) int
	live = func(id uint64) int {
		n := 0
		for _, c := range children[id] {
			switch {
			case c.sn == nil && c.vol.State == VolumeDeleting:
			case c.sn != nil && c.sn.State == SnapshotDeleting:
				n += live(c.sn.ID)
			default:
				n++
			}
		}
		return n
	}
	for id, o := range objs {
		if o.sn == nil || o.sn.State != SnapshotDeleting {
			continue
		}
		if alive := live(id); alive > 1 {
			return fmt.Errorf("%s is being deleted with %d children alive", o.what, alive)
		}
	}
	for _, v := range s.vols {
		// Walk v's chain past its own snapshots: the first object of
		// another volume is its origin.
		var origin uint64
		for q := v.Parent; q != 0; q = objs[q].parent {
			if objs[q].vol != v {
				origin = q
				break
			}
		}
		switch {
		case v.CloneOf == nil && origin != 0:
			return fmt.Errorf("volume %q reads through %s but is no clone", v.Name, objs[origin].what)
		case v.CloneOf != nil && (origin != v.CloneOf.ID || objs[origin].vol.Name != v.CloneOf.Volume || objs[origin].sn.Name != v.CloneOf.Snapshot):
			return fmt.Errorf("volume %q: clone of %s (%d), its chain leaves it at %d", v.Name, v.CloneOf, v.CloneOf.ID, origin)
		}
	}
	return nil
}

// snapshotCommand draws a command for TestSnapshotRandom: mostly
// snapshot commands on the volumes and snapshots the registry holds
// (so that most apply and the refusals are the interesting ones), over
// four nodes in four zones, with volume churn, replica moves and host
// connections enough to reach every refusal.
func snapshotCommand(rng *rand.Rand, s *State, at int64) Command {
	node := func() string { return fmt.Sprintf("n%d", rng.IntN(4)) }
	var names []string
	for n := range s.vols {
		names = append(names, n)
	}
	slices.Sort(names) // map order is random: the draw must not be
	vol := fmt.Sprintf("v%d", rng.IntN(3))
	if len(names) > 0 && rng.IntN(4) != 0 {
		vol = names[rng.IntN(len(names))]
	}
	snap := fmt.Sprintf("s%d", rng.IntN(4))
	epoch := uint64(1)
	if v, ok := s.vols[vol]; ok {
		epoch = v.CurrentEpoch()
		if len(v.Snapshots) > 0 && rng.IntN(4) != 0 {
			snap = v.Snapshots[rng.IntN(len(v.Snapshots))].Name
		}
	}
	host := fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:h%d", rng.IntN(2))
	// pick draws one of the objects for which ok holds, if any.
	pick := func(ok func(v *Volume, sn *VolumeSnapshot) bool) (string, string, bool) {
		type cand struct{ v, s string }
		var cs []cand
		for _, n := range names {
			v := s.vols[n]
			if ok(v, nil) {
				cs = append(cs, cand{n, ""})
			}
			for i := range v.Snapshots {
				if ok(v, &v.Snapshots[i]) {
					cs = append(cs, cand{n, v.Snapshots[i].Name})
				}
			}
		}
		if len(cs) == 0 || rng.IntN(4) == 0 {
			return "", "", false
		}
		c := cs[rng.IntN(len(cs))]
		return c.v, c.s, true
	}
	switch k := rng.IntN(100); {
	case k < 2:
		id := node()
		return RegisterNode{ID: id, TCPAddr: id + ":1", MgmtAddr: id + ":2", Zone: "z" + id}
	case k < 3:
		return SetNodeState{ID: node(), State: []NodeState{NodeUp, NodeUp, NodeDown}[rng.IntN(3)]}
	case k < 10:
		p := node()
		replicas := []string{p}
		for range rng.IntN(3) {
			replicas = append(replicas, node())
		}
		return CreateVolume{Name: fmt.Sprintf("v%d", rng.IntN(3)), SizeBytes: 8192, BlockSize: 4096, Node: p, Replicas: replicas, At: at}
	case k < 20:
		if v, _, ok := pick(func(v *Volume, sn *VolumeSnapshot) bool { return sn == nil && v.State == VolumeCreating }); ok {
			vol = v
		}
		return SetVolumeState{Name: vol, State: VolumeOnline}
	case k < 21:
		return DeleteVolume{Name: vol, Force: true, WithSnapshots: rng.IntN(2) == 0}
	case k < 23:
		return PurgeVolume{Name: vol}
	case k < 24:
		if rng.IntN(2) == 0 {
			return AllowHost{Volume: vol, HostNQN: host}
		}
		return SetAllowAny{Volume: vol, AllowAny: true}
	case k < 26:
		return Connect{HostNQN: host, Volume: vol, Node: node(), At: at}
	case k < 30:
		return Disconnect{HostNQN: host, Volume: vol, Node: node()}
	case k < 33:
		return SetReplicaState{Volume: vol, Epoch: epoch, Node: node(),
			State: []ReplicaState{ReplicaInSync, ReplicaOutOfSync, ReplicaRebuilding}[rng.IntN(3)], Reason: "r", At: at}
	case k < 35:
		return SetPrimary{Volume: vol, Epoch: epoch, Node: node(), At: at}
	case k < 37:
		return AddReplica{Volume: vol, Node: node(), At: at}
	case k < 39:
		return RemoveReplica{Volume: vol, Node: node()}
	case k < 50:
		return CreateSnapshot{Volume: vol, Name: snap, At: at}
	case k < 60:
		var nodes []string
		if v, ok := s.vols[vol]; ok {
			nodes = v.InSync()
			if rng.IntN(8) == 0 {
				nodes = nodes[1:] // the primary missing: refused
			}
		}
		return SnapshotDone{Volume: vol, Name: snap, Epoch: epoch, Nodes: nodes}
	case k < 67:
		return DeleteSnapshot{Volume: vol, Name: snap}
	case k < 74:
		return PurgeSnapshot{Volume: vol, Name: snap}
	case k < 81:
		if v, sn, ok := pick(func(v *Volume, sn *VolumeSnapshot) bool { return sn != nil && sn.State == SnapshotReady }); ok {
			vol, snap = v, sn
		}
		return CloneVolume{Name: fmt.Sprintf("c%d", rng.IntN(6)), Volume: vol, Snapshot: snap, At: at}
	case k < 85:
		if v, _, ok := pick(func(v *Volume, sn *VolumeSnapshot) bool {
			return sn == nil && v.CloneOf != nil && serving(v.State) && len(v.Snapshots) == 0
		}); ok {
			vol = v
		}
		return FlattenVolume{Name: vol, At: at}
	case k < 89:
		if v, _, ok := pick(func(v *Volume, sn *VolumeSnapshot) bool { return sn == nil && v.Flatten != nil }); ok {
			vol = v
		}
		return FlattenDone{Name: vol}
	case k < 96:
		return RevertVolume{Name: vol, Snapshot: snap, Epoch: epoch}
	default:
		if rng.IntN(2) == 0 {
			return SnapshotNodes{Volume: vol, Snapshot: snap, Add: node()}
		}
		return SnapshotNodes{Volume: vol, Snapshot: snap, Remove: node()}
	}
}

// TestSnapshotRandom applies a seeded random log of snapshot, clone,
// flatten and revert commands among volume, replica and connection
// churn, and checks after every command: the invariants of §2.2; a
// refused command changed nothing; a clone's replicas are among its
// origin snapshot's Nodes; epochs never go back. Every snapshot command
// must succeed at least once, or the generator is not exercising it.
func TestSnapshotRandom(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 24))
	s := NewState()
	n := 6000
	if testing.Short() {
		n = 2000
	}
	ok := map[Op]int{}
	epochs := map[uint64]uint64{}
	for i := 1; i <= n; i++ {
		c := snapshotCommand(rng, s, int64(i))
		before := s.MarshalState()
		var origin VolumeSnapshot
		if cv, isClone := c.(CloneVolume); isClone {
			if v, found := s.vols[cv.Volume]; found {
				origin, _ = v.Snapshot(cv.Snapshot)
			}
		}
		r := s.ApplyBytes(uint64(i), mustEncode(t, c))
		if r.Err != nil {
			s.index = uint64(i - 1)
			if after := s.MarshalState(); !bytes.Equal(before, after) {
				t.Fatalf("entry %d %#v refused (%v) but changed the registry:\n%s\n%s", i, c, r.Err, before, after)
			}
			s.index = uint64(i)
		} else {
			ok[c.Op()]++
		}
		if err := snapshotInvariants(s); err != nil {
			t.Fatalf("after entry %d %#v (%v): %v", i, c, r.Err, err)
		}
		if _, isClone := c.(CloneVolume); isClone && r.Err == nil {
			for _, rep := range r.Volume.Replicas {
				if !slices.Contains(origin.Nodes, rep.Node) {
					t.Fatalf("entry %d: clone %q has a replica on %s, which holds no copy of its origin (%v)", i, r.Volume.Name, rep.Node, origin.Nodes)
				}
			}
		}
		for _, v := range s.vols {
			if e := v.CurrentEpoch(); e < epochs[v.ID] {
				t.Fatalf("after entry %d %#v: volume %q epoch %d < %d", i, c, v.Name, e, epochs[v.ID])
			}
			epochs[v.ID] = v.CurrentEpoch()
		}
		if i%500 == 0 {
			checkInvariants(t, s)
		}
	}
	for _, op := range []Op{OpCreateSnapshot, OpSnapshotDone, OpDeleteSnapshot, OpPurgeSnapshot, OpCloneVolume,
		OpFlattenVolume, OpFlattenDone, OpRevertVolume, OpSnapshotNodes} {
		if ok[op] == 0 {
			t.Errorf("no %v succeeded in %d commands: the generator does not reach it", op, n)
		}
	}
	t.Logf("succeeded: %v", ok)
}

// snapshotBase: nodes a, b, c (zones za, zb, zc); volume "v" on a, b
// online with snapshots s1 ← s2 (ready) ← v, a clone "c" of v@s1 on a,
// b, flattening, a clone "d" of v@s2 on a, b, with its own snapshot d1,
// and "w" on c, reverted to its snapshot w1 with w2 taken after it.
func snapshotBase(t *testing.T) *State {
	t.Helper()
	s := NewState()
	for _, c := range []Command{
		RegisterNode{ID: "a", TCPAddr: "a:1", MgmtAddr: "a:2", Zone: "za", Features: []string{FeatureSnapshots}},
		RegisterNode{ID: "b", TCPAddr: "b:1", MgmtAddr: "b:2", Zone: "zb", Features: []string{FeatureSnapshots}},
		RegisterNode{ID: "c", TCPAddr: "c:1", MgmtAddr: "c:2", Zone: "zc", Features: []string{FeatureSnapshots}},
		CreateVolume{Name: "v", SizeBytes: 8192, BlockSize: 4096, Node: "a", Replicas: []string{"a", "b"}, At: 1},
		SetVolumeState{Name: "v", State: VolumeOnline},
		CreateSnapshot{Volume: "v", Name: "s1", At: 2},
		SnapshotDone{Volume: "v", Name: "s1", Epoch: 1, Nodes: []string{"a", "b"}},
		CreateSnapshot{Volume: "v", Name: "s2", At: 3},
		SnapshotDone{Volume: "v", Name: "s2", Epoch: 1, Nodes: []string{"b", "a"}},
		CloneVolume{Name: "c", Volume: "v", Snapshot: "s1", At: 4},
		SetVolumeState{Name: "c", State: VolumeOnline},
		FlattenVolume{Name: "c", At: 5},
		CloneVolume{Name: "d", Volume: "v", Snapshot: "s2", NQN: "nqn.x:d", At: 6},
		SetVolumeState{Name: "d", State: VolumeOnline},
		CreateSnapshot{Volume: "d", Name: "d1", At: 7},
		SnapshotDone{Volume: "d", Name: "d1", Epoch: 1, Nodes: []string{"a", "b"}},
		CreateVolume{Name: "w", SizeBytes: 4096, BlockSize: 4096, Node: "c", At: 8},
		SetVolumeState{Name: "w", State: VolumeOnline},
		CreateSnapshot{Volume: "w", Name: "w1", At: 9},
		SnapshotDone{Volume: "w", Name: "w1", Epoch: 1, Nodes: []string{"c"}},
		ResizeVolume{Name: "w", SizeBytes: 8192},
		CreateSnapshot{Volume: "w", Name: "w2", At: 10},
		SnapshotDone{Volume: "w", Name: "w2", Epoch: 1, Nodes: []string{"c"}},
		RevertVolume{Name: "w", Snapshot: "w1", Epoch: 1},
		CreateSnapshot{Volume: "w", Name: "w3", At: 11},
	} {
		mustApply(t, s, c)
	}
	checkInvariants(t, s)
	return s
}

// TestSnapshotHelpers: Snapshot, SnapshotByID, Children and Clones, which
// the control layer and the API read the registry through.
func TestSnapshotHelpers(t *testing.T) {
	s := snapshotBase(t)
	v, _ := s.Volume("v")
	s1, ok := v.Snapshot("s1")
	if !ok || s1.State != SnapshotReady || !slices.Equal(s1.Nodes, []string{"a", "b"}) || s1.Parent != 0 || s1.SizeBytes != 8192 || s1.CreatedAt != 2 {
		t.Fatalf("v@s1 = %+v, %v", s1, ok)
	}
	s2, _ := v.Snapshot("s2")
	if got, ok := v.SnapshotByID(s2.ID); !ok || got.Name != "s2" || got.Parent != s1.ID || v.Parent != s2.ID {
		t.Fatalf("SnapshotByID(%d) = %+v, %v; v.Parent %d", s2.ID, got, ok, v.Parent)
	}
	if _, ok := v.Snapshot("nope"); ok {
		t.Fatal("v@nope found")
	}
	if vol, got, ok := s.SnapshotByID(s2.ID); !ok || vol != "v" || got.Name != "s2" {
		t.Fatalf("State.SnapshotByID = %q %+v %v", vol, got, ok)
	}
	if _, _, ok := s.SnapshotByID(v.ID); ok {
		t.Fatal("a volume's ID found as a snapshot")
	}
	d, _ := s.Volume("d")
	d1, _ := d.Snapshot("d1")
	snaps, vols := s.Children(s2.ID)
	if want := []SnapshotRef{{Volume: "d", Snapshot: "d1", ID: d1.ID}}; !reflect.DeepEqual(snaps, want) || !slices.Equal(vols, []string{"v"}) {
		t.Fatalf("Children(v@s2) = %v %v", snaps, vols)
	}
	if snaps, vols := s.Children(s1.ID); len(snaps) != 1 || snaps[0].String() != "v@s2" || !slices.Equal(vols, []string{"c"}) {
		t.Fatalf("Children(v@s1) = %v %v", snaps, vols)
	}
	if got := s.Clones("v", s1.ID); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("Clones(v@s1) = %v", got)
	}
	if got := s.Clones("v", s2.ID); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("Clones(v@s2) = %v", got)
	}
	if snaps, vols := s.Children(0); snaps != nil || vols != nil {
		t.Fatalf("Children(0) = %v %v", snaps, vols)
	}
	if d.CloneOf == nil || d.CloneOf.String() != "v@s2" || d.CloneOf.ID != s2.ID || d.Parent != d1.ID || d1.Parent != s2.ID {
		t.Fatalf("d: %+v, d1 %+v", d, d1)
	}
	w, _ := s.Volume("w")
	w1, _ := w.Snapshot("w1")
	if w.Parent != w1.ID || w.SizeBytes != 4096 || w.Reverted != 24 || w.CurrentEpoch() != 2 {
		t.Fatalf("w after revert: %+v", w)
	}
}

// TestVolumeCloneDeep: the copies State hands out share nothing with
// the registry (the control layer keeps them across calls).
func TestVolumeCloneDeep(t *testing.T) {
	s := snapshotBase(t)
	before := s.MarshalState()
	for _, name := range []string{"c", "d", "v"} {
		v, _ := s.Volume(name)
		for i := range v.Snapshots {
			v.Snapshots[i].Nodes[0] = "zz"
			v.Snapshots[i].Name = "zz"
		}
		if v.CloneOf != nil {
			v.CloneOf.Snapshot, v.CloneOf.ID = "zz", 99
		}
		if v.Flatten != nil {
			v.Flatten.Since = 99
		}
		if sn, ok := v.Snapshot("zz"); ok {
			sn.Nodes[0] = "yy"
		}
	}
	r := mustApply(t, s, SnapshotNodes{Volume: "v", Snapshot: "s1", Remove: "b"})
	r.Snapshot.Nodes[0] = "zz"
	r.Volume.Snapshots[0].Nodes = append(r.Volume.Snapshots[0].Nodes, "zz")
	for i := range r.Volume.Snapshots {
		r.Volume.Snapshots[i].Nodes[0] = "zz"
	}
	mustApply(t, s, SnapshotNodes{Volume: "v", Snapshot: "s1", Add: "b"})
	s.index = 25 // the two SnapshotNodes undid each other
	v, _ := s.Volume("v")
	if sn, _ := v.Snapshot("s1"); !slices.Equal(sn.Nodes, []string{"a", "b"}) {
		t.Fatalf("v@s1 nodes %v", sn.Nodes)
	}
	if after := s.MarshalState(); !bytes.Equal(before, after) {
		t.Fatalf("changing copies changed the registry:\n%s\n%s", before, after)
	}
}

// TestSnapshotRestore: the new fields survive the raft snapshot (FSM
// Snapshot, Persist, Restore) and Export unchanged, and the restored
// registry applies the next commands as the original does.
func TestSnapshotRestore(t *testing.T) {
	s := snapshotBase(t)
	f := &FSM{s: s}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := NewFSM()
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.Export(), g.Export()) || !bytes.Equal(f.MarshalState(), g.MarshalState()) {
		t.Fatalf("restored registry differs:\n%s\n%s", f.MarshalState(), g.MarshalState())
	}
	for _, want := range []string{`"snapshots":[`, `"parent":`, `"clone_of":{"volume":"v","snapshot":"s1","id":`, `"flatten":{"since":5}`, `"reverted":24`, `"state":"creating"`, `"nodes":["b","a"]`} {
		if !bytes.Contains(sink.Bytes(), []byte(want)) {
			t.Errorf("snapshot lacks %s: %s", want, sink.Bytes())
		}
	}
	next := []Command{
		SnapshotDone{Volume: "w", Name: "w3", Epoch: 2, Nodes: []string{"c"}},
		FlattenDone{Name: "c"},
		DeleteSnapshot{Volume: "v", Name: "s1"},
		PurgeSnapshot{Volume: "v", Name: "s1"},
		CloneVolume{Name: "e", Volume: "w", Snapshot: "w2", At: 30},
	}
	for i, c := range next {
		idx := uint64(100 + i)
		data := mustEncode(t, c)
		l := &raft.Log{Index: idx, Type: raft.LogCommand, Data: data}
		ra, rb := f.Apply(l).(Result), g.Apply(l).(Result)
		if ra.Err != nil || rb.Err != nil || !reflect.DeepEqual(ra, rb) {
			t.Fatalf("%#v: %+v / %+v", c, ra, rb)
		}
	}
	if !bytes.Equal(f.MarshalState(), g.MarshalState()) {
		t.Fatal("registries differ after the same commands")
	}
	f.Read(func(s *State) { checkInvariants(t, s) })
}

// TestOldRegistrySnapshots: a registry written before snapshots
// (testdata/registry-before-replicas.json) loads with no snapshot, no
// parent, no clone, re-encodes to the same bytes, and takes a snapshot,
// a clone and a revert.
func TestOldRegistrySnapshots(t *testing.T) {
	old, err := os.ReadFile("testdata/registry-before-replicas.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := UnmarshalState(bytes.TrimSpace(old))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := s.Volume("v")
	if v.Snapshots != nil || v.Parent != 0 || v.CloneOf != nil || v.Flatten != nil || v.Reverted != 0 {
		t.Fatalf("old volume %+v", v)
	}
	if got := s.MarshalState(); !bytes.Equal(got, bytes.TrimSpace(old)) {
		t.Fatalf("re-encoded differently:\n%s\n%s", got, old)
	}
	r := mustApply(t, s, CreateSnapshot{Volume: "v", Name: "first", At: 10})
	if !slices.Equal(r.Snapshot.Nodes, []string{"n2"}) || r.Snapshot.ID != 2 {
		t.Fatalf("snapshot %+v", r.Snapshot)
	}
	mustApply(t, s, SnapshotDone{Volume: "v", Name: "first", Epoch: 1, Nodes: []string{"n2"}})
	mustApply(t, s, CloneVolume{Name: "c", Volume: "v", Snapshot: "first", At: 11})
	if r := s.Apply(s.Index()+1, RevertVolume{Name: "v", Snapshot: "first", Epoch: 1}); !errors.Is(r.Err, ErrHasConnections) || !strings.Contains(r.Err.Error(), "host nqn.2014-08.org.nvmexpress:uuid:host1 is connected through node n2") {
		t.Fatalf("revert with a host connected: %v", r.Err)
	}
	mustApply(t, s, Disconnect{HostNQN: "nqn.2014-08.org.nvmexpress:uuid:host1", Volume: "v", Node: "n2"})
	r = mustApply(t, s, RevertVolume{Name: "v", Snapshot: "first", Epoch: 1})
	if r.Volume.CurrentEpoch() != 2 || r.Volume.Parent != 2 {
		t.Fatalf("after revert %+v", r.Volume)
	}
	checkInvariants(t, s)
}

// TestBadSnapshotRegistry: a registry whose snapshots break an
// invariant is refused at load, not loaded.
func TestBadSnapshotRegistry(t *testing.T) {
	s := snapshotBase(t)
	v, _ := s.Volume("v")
	s1, _ := v.Snapshot("s1")
	s2, _ := v.Snapshot("s2")
	good := string(s.MarshalState())
	id := func(n uint64) string { return fmt.Sprint(n) }
	for name, bad := range map[string][2]string{
		"snapshot ID of a volume": {`"name":"s1","id":` + id(s1.ID), `"name":"s1","id":` + id(v.ID)},
		"snapshot ID twice":       {`"name":"s2","id":` + id(s2.ID), `"name":"s2","id":` + id(s1.ID)},
		"snapshot ID too high":    {`"name":"s2","id":` + id(s2.ID), `"name":"s2","id":999`},
		"name twice":              {`"name":"s2","id":`, `"name":"s1","id":`},
		"bogus state":             {`"state":"creating","parent"`, `"state":"lost","parent"`},
		"node not a replica":      {`"nodes":["b","a"]`, `"nodes":["b","c"]`},
		"node twice":              {`"nodes":["b","a"]`, `"nodes":["b","b"]`},
		"parent missing":          {`"parent":` + id(s1.ID) + `,"nodes"`, `"parent":999,"nodes"`},
		"parent a volume":         {`"parent":` + id(s1.ID) + `,"nodes"`, `"parent":` + id(v.ID) + `,"nodes"`},
		"cycle":                   {`"name":"s1","id":` + id(s1.ID) + `,"size_bytes":8192,"created_at":2,"state":"ready","nodes"`, `"name":"s1","id":` + id(s1.ID) + `,"size_bytes":8192,"created_at":2,"state":"ready","parent":` + id(s2.ID) + `,"nodes"`},
		"origin missing":          {`"clone_of":{"volume":"v","snapshot":"s1"`, `"clone_of":{"volume":"v","snapshot":"nope"`},
		"flatten of no clone":     {`"clone_of":{"volume":"v","snapshot":"s1","id":` + id(s1.ID) + `},`, ``},
	} {
		b := strings.Replace(good, bad[0], bad[1], 1)
		if b == good {
			t.Errorf("%s: %q not in the registry %s", name, bad[0], good)
			continue
		}
		if _, err := UnmarshalState([]byte(b)); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: loaded (%v)", name, err)
		}
	}
}

// TestSnapshotLimit: a volume takes at most MaxSnapshots snapshots;
// deleting and purging one makes room.
func TestSnapshotLimit(t *testing.T) {
	s := snapshotBase(t)
	for i := range MaxSnapshots - 1 {
		name := fmt.Sprintf("t%d", i)
		mustApply(t, s, CreateSnapshot{Volume: "d", Name: name, At: 20})
		mustApply(t, s, SnapshotDone{Volume: "d", Name: name, Epoch: 1, Nodes: []string{"a", "b"}})
	}
	r := s.Apply(s.Index()+1, CreateSnapshot{Volume: "d", Name: "over", At: 21})
	if !errors.Is(r.Err, ErrLimit) {
		t.Fatalf("snapshot %d: %v", MaxSnapshots+1, r.Err)
	}
	mustApply(t, s, DeleteSnapshot{Volume: "d", Name: "t7"})
	if r := s.Apply(s.Index()+1, CreateSnapshot{Volume: "d", Name: "over", At: 21}); !errors.Is(r.Err, ErrLimit) {
		t.Fatalf("with one deleting: %v", r.Err)
	}
	mustApply(t, s, PurgeSnapshot{Volume: "d", Name: "t7"})
	mustApply(t, s, CreateSnapshot{Volume: "d", Name: "over", At: 21})
	checkInvariants(t, s)
}

// BenchmarkSnapshotCycle times one snapshot's life in the registry
// (CreateSnapshot, SnapshotDone, DeleteSnapshot, PurgeSnapshot: four
// Applies) on a registry of vols volumes with 8 snapshots each, whose
// lookups by ID walk every volume; it reports the registry's encoded
// bytes per snapshot.
func BenchmarkSnapshotCycle(b *testing.B) {
	for _, vols := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("volumes=%d", vols), func(b *testing.B) {
			s := NewState()
			idx := uint64(0)
			apply := func(c Command) {
				idx++
				if r := s.Apply(idx, c); r.Err != nil {
					b.Fatalf("%#v: %v", c, r.Err)
				}
			}
			apply(RegisterNode{ID: "a", TCPAddr: "a:1", MgmtAddr: "a:2"})
			for i := range vols {
				name := fmt.Sprintf("v%05d", i)
				apply(CreateVolume{Name: name, SizeBytes: 1 << 30, BlockSize: 4096, Node: "a"})
				apply(SetVolumeState{Name: name, State: VolumeOnline})
				for j := range 8 {
					apply(CreateSnapshot{Volume: name, Name: fmt.Sprintf("s%d", j), At: 1700000000000000000})
					apply(SnapshotDone{Volume: name, Name: fmt.Sprintf("s%d", j), Epoch: 1, Nodes: []string{"a"}})
				}
			}
			plain := NewState()
			plain.Apply(1, RegisterNode{ID: "a", TCPAddr: "a:1", MgmtAddr: "a:2"})
			for i := range vols {
				name := fmt.Sprintf("v%05d", i)
				plain.Apply(2, CreateVolume{Name: name, SizeBytes: 1 << 30, BlockSize: 4096, Node: "a"})
				plain.Apply(3, SetVolumeState{Name: name, State: VolumeOnline})
			}
			perSnap := float64(len(s.MarshalState())-len(plain.MarshalState())) / float64(8*vols)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				v := fmt.Sprintf("v%05d", i%vols)
				apply(CreateSnapshot{Volume: v, Name: "b", At: 1})
				apply(SnapshotDone{Volume: v, Name: "b", Epoch: 1, Nodes: []string{"a"}})
				apply(DeleteSnapshot{Volume: v, Name: "b"})
				apply(PurgeSnapshot{Volume: v, Name: "b"})
			}
			b.ReportMetric(perSnap, "registry-bytes/snapshot")
		})
	}
}

// TestSnapshotStateText: states encode by name, as the package's other
// states do, and an unknown name or number is refused, not loaded.
func TestSnapshotStateText(t *testing.T) {
	for st, name := range map[SnapshotState]string{SnapshotCreating: "creating", SnapshotReady: "ready", SnapshotDeleting: "deleting"} {
		b, err := st.MarshalText()
		var back SnapshotState
		if err != nil || string(b) != name || back.UnmarshalText(b) != nil || back != st || !st.valid() {
			t.Errorf("%d: %q %v → %v", st, b, err, back)
		}
	}
	var st SnapshotState
	if err := st.UnmarshalText([]byte("snapshot-state(9)")); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown state decoded: %v", err)
	}
	if SnapshotState(9).String() != "snapshot-state(9)" || SnapshotState(0).valid() || SnapshotState(4).valid() {
		t.Error("out-of-range states")
	}
	for from := SnapshotState(0); from <= 4; from++ {
		for to := SnapshotState(0); to <= 4; to++ {
			want := (from == SnapshotCreating && (to == SnapshotReady || to == SnapshotDeleting)) || (from == SnapshotReady && to == SnapshotDeleting)
			if validSnapshotTransition(from, to) != want {
				t.Errorf("%v → %v: %v", from, to, !want)
			}
		}
	}
}
