package meta

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// snapshotInvariants are the rules of docs/snapshots.md §2.2 every
// registry keeps after every command: store IDs unique across volumes
// and snapshots; every Parent an existing snapshot, with no cycle; a
// snapshot's Nodes among its volume's replicas; a deleting snapshot has
// at most one child that is not being deleted itself (its nodes merge it
// into that one); a volume's chain (its Parent, then its own snapshots'
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
	for id, o := range objs {
		if o.sn == nil || o.sn.State != SnapshotDeleting {
			continue
		}
		alive := 0
		for _, c := range children[id] {
			if (c.sn == nil || c.sn.State != SnapshotDeleting) && c.vol.State != VolumeDeleting {
				alive++
			}
		}
		if alive > 1 {
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
