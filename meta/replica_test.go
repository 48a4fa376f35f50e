package meta

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"testing"
)

// replicaInvariants are the rules of docs/replication.md §1 every volume
// keeps after every command: Node among the replicas, its replica in
// sync (so at least one is), replica nodes known and distinct, in
// distinct zones (zones of nodes that kept theirs since placement: the
// generators here never move a node), at most MaxReplicas.
func replicaInvariants(s *State, v *Volume) error {
	set := v.ReplicaSet()
	if len(set) == 0 || len(set) > MaxReplicas {
		return fmt.Errorf("%d replicas", len(set))
	}
	if v.CurrentEpoch() < 1 {
		return fmt.Errorf("epoch %d", v.Epoch)
	}
	inSync, primary := 0, false
	zones := map[string]string{}
	for i, r := range set {
		if !r.State.valid() {
			return fmt.Errorf("replica %q in state %q", r.Node, r.State)
		}
		if r.State == ReplicaInSync {
			inSync++
			if r.Full {
				return fmt.Errorf("in-sync replica %q wants a full copy", r.Node)
			}
		}
		if r.Node == v.Node {
			primary = true
			if r.State != ReplicaInSync {
				return fmt.Errorf("primary %q is %s", r.Node, r.State)
			}
		}
		if slices.ContainsFunc(set[:i], func(o Replica) bool { return o.Node == r.Node }) {
			return fmt.Errorf("two replicas on %q", r.Node)
		}
		n, ok := s.nodes[r.Node]
		if !ok {
			return fmt.Errorf("replica on unknown node %q", r.Node)
		}
		if r.ReplacedBy != "" && !slices.ContainsFunc(set, func(o Replica) bool { return o.Node == r.ReplacedBy && o.Node != r.Node }) {
			return fmt.Errorf("replica %q replaced by %q, which holds none", r.Node, r.ReplacedBy)
		}
		if slices.ContainsFunc(set[:i], func(o Replica) bool { return o.ReplacedBy != "" && o.ReplacedBy == r.ReplacedBy }) {
			return fmt.Errorf("two replicas replaced by %q", r.ReplacedBy)
		}
		// A leaving replica's zone is its replacement's to share.
		if o, dup := zones[zoneOf(n)]; dup && !replacedBy(set, o, r.Node) && !replacedBy(set, r.Node, o) {
			return fmt.Errorf("replicas on %q and %q share zone %q", o, r.Node, zoneOf(n))
		}
		zones[zoneOf(n)] = r.Node
	}
	if !primary || inSync < 1 {
		return fmt.Errorf("primary %q among replicas: %v; %d in sync", v.Node, primary, inSync)
	}
	if got := v.InSync(); len(got) != inSync || got[0] != v.Node {
		return fmt.Errorf("InSync() = %v, %d in sync, primary %q", got, inSync, v.Node)
	}
	return nil
}

// replacedBy says whether set's replica on node is being replaced by
// the one on by.
func replacedBy(set []Replica, node, by string) bool {
	return slices.ContainsFunc(set, func(r Replica) bool { return r.Node == node && r.ReplacedBy == by })
}

// replicaBase: nodes a (zone za), b (zb), c (zc), d (za), e (ze, down),
// f (no zone); volume "r" on a, b, c; "old" on a, written before replicas;
// "gone" on a, b, deleting.
func replicaBase(t *testing.T) *State {
	t.Helper()
	s := NewState()
	cmds := []Command{
		RegisterNode{ID: "a", TCPAddr: "a:1", MgmtAddr: "a:2", Zone: "za"},
		RegisterNode{ID: "b", TCPAddr: "b:1", MgmtAddr: "b:2", Zone: "zb"},
		RegisterNode{ID: "c", TCPAddr: "c:1", MgmtAddr: "c:2", Zone: "zc"},
		RegisterNode{ID: "d", TCPAddr: "d:1", MgmtAddr: "d:2", Zone: "za"},
		RegisterNode{ID: "e", TCPAddr: "e:1", MgmtAddr: "e:2", Zone: "ze"},
		RegisterNode{ID: "f", TCPAddr: "f:1", MgmtAddr: "f:2", CapacityBytes: 4096},
		SetNodeState{ID: "e", State: NodeDown},
		CreateVolume{Name: "r", SizeBytes: 8192, BlockSize: 4096, Node: "a", Replicas: []string{"a", "b", "c"}, At: 10},
		CreateVolume{Name: "old", SizeBytes: 4096, BlockSize: 4096, Node: "a", At: 20},
		CreateVolume{Name: "gone", SizeBytes: 4096, BlockSize: 4096, Node: "a", Replicas: []string{"a", "b"}, At: 30},
		DeleteVolume{Name: "gone"},
	}
	for i, c := range cmds {
		if r := s.Apply(uint64(i+1), c); r.Err != nil {
			t.Fatalf("base %d %#v: %v", i, c, r.Err)
		}
	}
	return s
}

func mustApply(t *testing.T, s *State, c Command) Result {
	t.Helper()
	r := s.Apply(s.Index()+1, c)
	if r.Err != nil {
		t.Fatalf("%#v: %v", c, r.Err)
	}
	return r
}

// TestReplicaMoves: every (from, to) pair of SetReplicaState, with and
// without Full, against the table of docs/replication.md §1.
func TestReplicaMoves(t *testing.T) {
	states := []ReplicaState{ReplicaInSync, ReplicaOutOfSync, ReplicaRebuilding, ReplicaFailed}
	// into puts b's replica of "r" in state st through legal moves.
	into := map[ReplicaState][]ReplicaState{
		ReplicaInSync:     nil,
		ReplicaOutOfSync:  {ReplicaOutOfSync},
		ReplicaRebuilding: {ReplicaOutOfSync, ReplicaRebuilding},
		ReplicaFailed:     {ReplicaFailed},
	}
	legal := func(from, to ReplicaState, full bool) bool {
		switch {
		case to == ReplicaFailed:
			return true
		case from == ReplicaInSync:
			return to == ReplicaOutOfSync
		case from == ReplicaOutOfSync:
			return to == ReplicaRebuilding || to == ReplicaOutOfSync
		case from == ReplicaRebuilding:
			return to == ReplicaInSync || to == ReplicaOutOfSync
		case from == ReplicaFailed:
			return to == ReplicaOutOfSync && full
		}
		return false
	}
	for _, from := range states {
		for _, to := range states {
			for _, full := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s→%s full=%v", from, to, full), func(t *testing.T) {
					s := replicaBase(t)
					for _, st := range into[from] {
						mustApply(t, s, SetReplicaState{Volume: "r", Epoch: 1, Node: "b", State: st, Reason: "setup", At: 50})
					}
					before := s.MarshalState()
					r := s.Apply(s.Index()+1, SetReplicaState{Volume: "r", Epoch: 1, Node: "b", State: to, Reason: "why", Full: full, At: 99})
					if want := legal(from, to, full); (r.Err == nil) != want {
						t.Fatalf("err %v, legal %v", r.Err, want)
					}
					if r.Err != nil {
						if !errors.Is(r.Err, ErrBadTransition) {
							t.Errorf("err %v, want ErrBadTransition", r.Err)
						}
						s.index--
						if !bytes.Equal(before, s.MarshalState()) {
							t.Error("a refused move changed the registry")
						}
						return
					}
					v, _ := s.Volume("r")
					got, _ := v.Replica("b")
					wantFull := to != ReplicaInSync && (full || (from != ReplicaInSync && got.Full))
					if got.State != to || got.Reason != "why" || got.Since != 99 || (to == ReplicaInSync && got.Full) || (full && to != ReplicaInSync && !got.Full) || got.Full != wantFull {
						t.Errorf("replica %+v", got)
					}
					if !reflect.DeepEqual(*r.Volume, v) {
						t.Errorf("result %+v, registry %+v", *r.Volume, v)
					}
					checkInvariants(t, s)
				})
			}
		}
	}
}

// TestReplicaCommands: the effects and refusals of the replica commands,
// one row each, on replicaBase.
func TestReplicaCommands(t *testing.T) {
	replicas := func(v Volume) string {
		var out []string
		for _, r := range v.ReplicaSet() {
			out = append(out, fmt.Sprintf("%s:%s", r.Node, r.State))
		}
		return fmt.Sprint(out)
	}
	tests := []struct {
		name  string
		pre   []Command
		cmd   Command
		err   error
		check func(t *testing.T, v Volume)
	}{
		{name: "create three", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "c", Replicas: []string{"c", "a", "f"}, At: 7}, check: func(t *testing.T, v Volume) {
			if v.Node != "c" || v.Epoch != 1 || v.Want != 3 || replicas(v) != "[c:in-sync a:in-sync f:in-sync]" || v.Replicas[2].Since != 7 {
				t.Errorf("%+v", v)
			}
		}},
		{name: "create one explicit", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "c", Replicas: []string{"c"}}, check: func(t *testing.T, v Volume) {
			if v.Want != 1 || v.Epoch != 1 || len(v.Replicas) != 1 {
				t.Errorf("%+v", v)
			}
		}},
		{name: "create with a replica secret", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "c", Replicas: []string{"c", "a"}, ReplicaSecret: &HostSecret{Host: "DHHC-1:00:aG9zdA==:", Ctrl: "DHHC-1:00:Y3RybA==:"}}, check: func(t *testing.T, v Volume) {
			if v.ReplicaSecret == nil || v.ReplicaSecret.Host != "DHHC-1:00:aG9zdA==:" || v.ReplicaSecret.Ctrl != "DHHC-1:00:Y3RybA==:" {
				t.Errorf("replica secret %+v", v.ReplicaSecret)
			}
		}},
		{name: "create replica secret one half", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "c", Replicas: []string{"c", "a"}, ReplicaSecret: &HostSecret{Host: "DHHC-1:00:aG9zdA==:"}}, err: ErrInvalid},
		{name: "create replica secret not DHHC-1", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "c", Replicas: []string{"c", "a"}, ReplicaSecret: &HostSecret{Host: "hunter2", Ctrl: "DHHC-1:00:Y3RybA==:"}}, err: ErrInvalid},
		{name: "create replica secret halves equal", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "c", Replicas: []string{"c", "a"}, ReplicaSecret: &HostSecret{Host: "DHHC-1:00:aG9zdA==:", Ctrl: "DHHC-1:00:aG9zdA==:"}}, err: ErrInvalid},
		{name: "create first not primary", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "c", Replicas: []string{"a", "c"}}, err: ErrInvalid},
		{name: "create unknown node", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "a", Replicas: []string{"a", "x"}}, err: ErrUnknownNode},
		{name: "create node down", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "a", Replicas: []string{"a", "e"}}, err: ErrNodeNotUp},
		{name: "create node twice", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "a", Replicas: []string{"a", "b", "a"}}, err: ErrInvalid},
		{name: "create shared zone", cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "a", Replicas: []string{"a", "d"}}, err: ErrInvalid},
		{name: "create too many", pre: []Command{
			RegisterNode{ID: "g", TCPAddr: "g:1", MgmtAddr: "g:2"}, RegisterNode{ID: "h", TCPAddr: "h:1", MgmtAddr: "h:2"}},
			cmd: CreateVolume{Name: "n", SizeBytes: 4096, BlockSize: 4096, Node: "a", Replicas: []string{"a", "b", "c", "f", "g", "h"}}, err: ErrLimit},

		{name: "state stale epoch", cmd: SetReplicaState{Volume: "r", Epoch: 0, Node: "b", State: ReplicaOutOfSync}, err: ErrStaleEpoch},
		{name: "state future epoch", cmd: SetReplicaState{Volume: "r", Epoch: 2, Node: "b", State: ReplicaOutOfSync}, err: ErrStaleEpoch},
		{name: "state deposed primary", pre: []Command{SetPrimary{Volume: "r", Epoch: 1, Node: "b", Failover: true}},
			cmd: SetReplicaState{Volume: "r", Epoch: 1, Node: "c", State: ReplicaOutOfSync}, err: ErrStaleEpoch},
		{name: "state at new epoch", pre: []Command{SetPrimary{Volume: "r", Epoch: 1, Node: "b", Failover: true}},
			cmd: SetReplicaState{Volume: "r", Epoch: 2, Node: "c", State: ReplicaOutOfSync, Reason: "leg failed"}, check: func(t *testing.T, v Volume) {
				if replicas(v) != "[a:out-of-sync b:in-sync c:out-of-sync]" {
					t.Errorf("%s", replicas(v))
				}
			}},
		{name: "state of the primary", cmd: SetReplicaState{Volume: "r", Epoch: 1, Node: "a", State: ReplicaOutOfSync}, err: ErrBadTransition},
		{name: "state of a stranger", cmd: SetReplicaState{Volume: "r", Epoch: 1, Node: "d", State: ReplicaOutOfSync}, err: ErrUnknownNode},
		{name: "state bogus", cmd: SetReplicaState{Volume: "r", Epoch: 1, Node: "b", State: "sleepy"}, err: ErrInvalid},
		{name: "state failed without reason", cmd: SetReplicaState{Volume: "r", Epoch: 1, Node: "b", State: ReplicaFailed}, err: ErrInvalid},
		{name: "state unknown volume", cmd: SetReplicaState{Volume: "x", Epoch: 1, Node: "b", State: ReplicaFailed, Reason: "x"}, err: ErrUnknownVolume},
		{name: "state deleting volume", cmd: SetReplicaState{Volume: "gone", Epoch: 1, Node: "b", State: ReplicaFailed, Reason: "x"}, err: ErrVolumeDeleting},
		{name: "state on old volume", cmd: SetReplicaState{Volume: "old", Epoch: 1, Node: "a", State: ReplicaOutOfSync}, err: ErrBadTransition},

		{name: "failover", cmd: SetPrimary{Volume: "r", Epoch: 1, Node: "c", Failover: true, At: 77}, check: func(t *testing.T, v Volume) {
			if v.Node != "c" || v.Epoch != 2 || replicas(v) != "[a:out-of-sync b:in-sync c:in-sync]" || v.Replicas[0].Reason != "primary lost at epoch 1" || v.Replicas[0].Since != 77 {
				t.Errorf("%+v", v)
			}
		}},
		{name: "planned handover", cmd: SetPrimary{Volume: "r", Epoch: 1, Node: "b"}, check: func(t *testing.T, v Volume) {
			if v.Node != "b" || v.Epoch != 2 || replicas(v) != "[a:in-sync b:in-sync c:in-sync]" {
				t.Errorf("%+v", v)
			}
		}},
		{name: "restart: same primary, new epoch", cmd: SetPrimary{Volume: "r", Epoch: 1, Node: "a"}, check: func(t *testing.T, v Volume) {
			if v.Node != "a" || v.Epoch != 2 || replicas(v) != "[a:in-sync b:in-sync c:in-sync]" {
				t.Errorf("%+v", v)
			}
		}},
		{name: "restart of an old volume", cmd: SetPrimary{Volume: "old", Epoch: 1, Node: "a"}, check: func(t *testing.T, v Volume) {
			if v.Epoch != 2 || replicas(v) != "[a:in-sync]" || v.Replicas[0].Since != 20 {
				t.Errorf("%+v", v)
			}
		}},
		{name: "failover to itself", cmd: SetPrimary{Volume: "r", Epoch: 1, Node: "a", Failover: true}, err: ErrInvalid},
		{name: "primary stale epoch", cmd: SetPrimary{Volume: "r", Epoch: 0, Node: "b"}, err: ErrStaleEpoch},
		{name: "primary twice at one epoch", pre: []Command{SetPrimary{Volume: "r", Epoch: 1, Node: "b", Failover: true}},
			cmd: SetPrimary{Volume: "r", Epoch: 1, Node: "c", Failover: true}, err: ErrStaleEpoch},
		{name: "primary out of sync", pre: []Command{SetReplicaState{Volume: "r", Epoch: 1, Node: "b", State: ReplicaOutOfSync}},
			cmd: SetPrimary{Volume: "r", Epoch: 1, Node: "b", Failover: true}, err: ErrBadTransition},
		{name: "primary node down", pre: []Command{SetNodeState{ID: "b", State: NodeDown}},
			cmd: SetPrimary{Volume: "r", Epoch: 1, Node: "b", Failover: true}, err: ErrNodeNotUp},
		{name: "primary not a replica", cmd: SetPrimary{Volume: "r", Epoch: 1, Node: "f"}, err: ErrUnknownNode},
		{name: "primary unknown node", cmd: SetPrimary{Volume: "r", Epoch: 1, Node: "x"}, err: ErrUnknownNode},

		{name: "add", cmd: AddReplica{Volume: "old", Node: "b", At: 5}, check: func(t *testing.T, v Volume) {
			if v.Epoch != 1 || replicas(v) != "[a:in-sync b:out-of-sync]" || !v.Replicas[1].Full || v.Replicas[1].Since != 5 || v.Want != 0 {
				t.Errorf("%+v", v)
			}
		}},
		{name: "add no zone node", pre: []Command{RemoveReplica{Volume: "r", Node: "c"}}, cmd: AddReplica{Volume: "r", Node: "f"}, err: ErrNoCapacity},
		{name: "add holder", cmd: AddReplica{Volume: "r", Node: "b"}, err: ErrInvalid},
		{name: "add same zone", cmd: AddReplica{Volume: "r", Node: "d"}, err: ErrInvalid},
		{name: "add down", cmd: AddReplica{Volume: "old", Node: "e"}, err: ErrNodeNotUp},
		{name: "add unknown", cmd: AddReplica{Volume: "old", Node: "x"}, err: ErrUnknownNode},
		{name: "add deleting", cmd: AddReplica{Volume: "gone", Node: "c"}, err: ErrVolumeDeleting},
		{name: "add too many", pre: []Command{
			RegisterNode{ID: "g", TCPAddr: "g:1", MgmtAddr: "g:2"}, RegisterNode{ID: "h", TCPAddr: "h:1", MgmtAddr: "h:2"},
			AddReplica{Volume: "r", Node: "g"}, AddReplica{Volume: "r", Node: "h"}},
			cmd: AddReplica{Volume: "r", Node: "f"}, err: ErrLimit},

		{name: "remove", cmd: RemoveReplica{Volume: "r", Node: "b"}, check: func(t *testing.T, v Volume) {
			if replicas(v) != "[a:in-sync c:in-sync]" || v.Want != 3 {
				t.Errorf("%+v", v)
			}
		}},
		{name: "remove primary", cmd: RemoveReplica{Volume: "r", Node: "a"}, err: ErrInvalid},
		{name: "remove old primary", cmd: RemoveReplica{Volume: "old", Node: "a"}, err: ErrInvalid},
		{name: "remove stranger", cmd: RemoveReplica{Volume: "r", Node: "d"}, err: ErrUnknownNode},
		{name: "remove node holding a replica", cmd: RemoveNode{ID: "c"}, err: ErrNodeInUse},
		{name: "remove node after its replica", pre: []Command{RemoveReplica{Volume: "r", Node: "c"}}, cmd: RemoveNode{ID: "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := replicaBase(t)
			for _, c := range tt.pre {
				mustApply(t, s, c)
			}
			before := s.MarshalState()
			r := s.ApplyBytes(s.Index()+1, mustEncode(t, tt.cmd))
			if !errors.Is(r.Err, tt.err) || (tt.err == nil) != (r.Err == nil) {
				t.Fatalf("err %v, want %v", r.Err, tt.err)
			}
			if r.Err != nil {
				s.index--
				if !bytes.Equal(before, s.MarshalState()) {
					t.Error("a refused command changed the registry")
				}
			}
			if tt.check != nil {
				tt.check(t, *r.Volume)
			}
			checkInvariants(t, s)
		})
	}
}

// TestReplicaInvariantsRandom applies a seeded random log (every command,
// the replica ones included, over nodes in four zones) and checks the
// invariants after every command, and that no volume's epoch ever
// decreases.
func TestReplicaInvariantsRandom(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 23))
	s := NewState()
	n := 4000
	if testing.Short() {
		n = 2500
	}
	epochs := map[uint64]uint64{} // volume ID → last epoch seen
	ok := map[Op]int{}
	for i := 1; i <= n; i++ {
		c := replicaCommand(rng, s, int64(i))
		r := s.ApplyBytes(uint64(i), mustEncode(t, c))
		if r.Err == nil {
			ok[c.Op()]++
		}
		for _, v := range s.vols {
			if err := replicaInvariants(s, v); err != nil {
				t.Fatalf("after entry %d %#v: volume %q: %v", i, c, v.Name, err)
			}
			if e := v.CurrentEpoch(); e < epochs[v.ID] {
				t.Fatalf("after entry %d %#v: volume %q epoch %d < %d", i, c, v.Name, e, epochs[v.ID])
			}
			epochs[v.ID] = v.CurrentEpoch()
		}
		if i%200 == 0 {
			checkInvariants(t, s)
		}
	}
	for _, op := range []Op{OpSetReplicaState, OpSetPrimary, OpAddReplica, OpRemoveReplica} {
		if ok[op] == 0 {
			t.Errorf("no %v succeeded in %d commands: the generator does not reach it", op, n)
		}
	}
	t.Logf("succeeded: %v", ok)
}

// replicaCommand draws a command for TestReplicaInvariantsRandom: mostly
// replica commands at an epoch near the volume's current one, over five
// nodes (n4 without a zone, the others each in their own, fixed) and
// four volume names, with enough node and volume churn to hit every
// refusal.
func replicaCommand(rng *rand.Rand, s *State, at int64) Command {
	node := func() string { return fmt.Sprintf("n%d", rng.IntN(5)) }
	vol := fmt.Sprintf("v%d", rng.IntN(4))
	epoch := uint64(1)
	if v, ok := s.vols[vol]; ok {
		epoch = v.CurrentEpoch()
	}
	if rng.IntN(5) == 0 {
		epoch = uint64(rng.IntN(int(epoch) + 2))
	}
	states := []ReplicaState{ReplicaInSync, ReplicaOutOfSync, ReplicaRebuilding, ReplicaFailed}
	switch k := rng.IntN(100); {
	case k < 8:
		id := node()
		zone := "z" + id
		if id == "n4" {
			zone = ""
		}
		return RegisterNode{ID: id, TCPAddr: id + ":1", MgmtAddr: id + ":2", Zone: zone}
	case k < 12:
		return SetNodeState{ID: node(), State: []NodeState{NodeUp, NodeUp, NodeUp, NodeDraining, NodeDown}[rng.IntN(5)]}
	case k < 13:
		return RemoveNode{ID: node()}
	case k < 26:
		p := node()
		replicas := []string{p}
		for range rng.IntN(4) {
			replicas = append(replicas, node())
		}
		return CreateVolume{Name: vol, SizeBytes: 4096, BlockSize: 4096, Node: p, Replicas: replicas, At: at}
	case k < 28:
		return DeleteVolume{Name: vol, Force: true}
	case k < 30:
		return PurgeVolume{Name: vol}
	case k < 36:
		return SetVolumeState{Name: vol, State: VolumeOnline}
	case k < 66:
		return SetReplicaState{Volume: vol, Epoch: epoch, Node: node(), State: states[rng.IntN(4)],
			Reason: "r", Full: rng.IntN(2) == 0, At: at}
	case k < 80:
		return SetPrimary{Volume: vol, Epoch: epoch, Node: node(), Failover: rng.IntN(3) != 0, At: at}
	case k < 92:
		return AddReplica{Volume: vol, Node: node(), At: at}
	default:
		return RemoveReplica{Volume: vol, Node: node()}
	}
}

// TestOldRegistryOneReplica: a snapshot written before replicas
// (testdata/registry-before-replicas.json) loads; its volume reads as one
// in-sync replica on its node at epoch 1, wanting 1; re-encoding gives
// the same bytes (nothing is rewritten at load); the first replica
// command writes the set explicitly.
func TestOldRegistryOneReplica(t *testing.T) {
	old, err := os.ReadFile("testdata/registry-before-replicas.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := UnmarshalState(bytes.TrimSpace(old))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := s.Volume("v")
	want := []Replica{{Node: "n2", State: ReplicaInSync, Since: 1700000000000000000}}
	if !reflect.DeepEqual(v.ReplicaSet(), want) || v.CurrentEpoch() != 1 || v.WantReplicas() != 1 || !slices.Equal(v.InSync(), []string{"n2"}) {
		t.Fatalf("replicas %+v epoch %d want %d", v.ReplicaSet(), v.CurrentEpoch(), v.WantReplicas())
	}
	if r, ok := v.Replica("n2"); !ok || r.State != ReplicaInSync {
		t.Fatalf("Replica(n2) = %+v, %v", r, ok)
	}
	if _, ok := v.Replica("n1"); ok {
		t.Fatal("a replica on n1")
	}
	if v.PromisedOn("n2") != 4096 || v.PromisedOn("n1") != 0 {
		t.Fatalf("promised %d / %d", v.PromisedOn("n2"), v.PromisedOn("n1"))
	}
	if got := s.MarshalState(); !bytes.Equal(got, bytes.TrimSpace(old)) {
		t.Fatalf("re-encoded differently:\n%s\n%s", got, old)
	}
	r := mustApply(t, s, AddReplica{Volume: "v", Node: "n1", At: 5})
	if r.Volume.Epoch != 1 || len(r.Volume.Replicas) != 2 || r.Volume.Replicas[0] != want[0] {
		t.Fatalf("after AddReplica: %+v", r.Volume)
	}
	checkInvariants(t, s)
}

// TestBadReplicaSnapshot: a snapshot whose replica set breaks an
// invariant is refused, not loaded.
func TestBadReplicaSnapshot(t *testing.T) {
	s := replicaBase(t)
	good := string(s.MarshalState())
	for name, bad := range map[string][2]string{
		"primary out of sync":   {`"replicas":[{"node":"a","state":"in-sync"`, `"replicas":[{"node":"a","state":"out-of-sync"`},
		"primary not a replica": {`"node":"a","state":"creating","nqn":"nqn.2024-01.io.blk:volume:r"`, `"node":"f","state":"creating","nqn":"nqn.2024-01.io.blk:volume:r"`},
		"bogus state":           {`{"node":"b","state":"in-sync","since":10}`, `{"node":"b","state":"lost","since":10}`},
		"unknown node":          {`{"node":"b","state":"in-sync","since":10}`, `{"node":"zz","state":"in-sync","since":10}`},
		"two on one node":       {`{"node":"b","state":"in-sync","since":10}`, `{"node":"c","state":"in-sync","since":10}`},
	} {
		b := bytes.Replace([]byte(good), []byte(bad[0]), []byte(bad[1]), 1)
		if bytes.Equal(b, []byte(good)) {
			t.Fatalf("%s: pattern %s not in %s", name, bad[0], good)
		}
		if _, err := UnmarshalState(b); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestReplicaAddr: a node's replica address is registered (and updated
// at every registration), checked, and read back through ReplicaTCPAddr,
// which falls back to the NVMe/TCP address hosts are told.
func TestReplicaAddr(t *testing.T) {
	s := NewState()
	if r := s.Apply(1, RegisterNode{ID: "a", TCPAddr: "10.0.2.2:4420", MgmtAddr: "a:7070", ReplicaAddr: "127.0.0.1:4420"}); r.Err != nil {
		t.Fatal(r.Err)
	}
	n, _ := s.Node("a")
	if n.ReplicaTCPAddr() != "127.0.0.1:4420" {
		t.Fatalf("replica address %q", n.ReplicaTCPAddr())
	}
	if r := s.Apply(2, RegisterNode{ID: "a", TCPAddr: "10.0.2.2:4420", MgmtAddr: "a:7070"}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if n, _ = s.Node("a"); n.ReplicaTCPAddr() != "10.0.2.2:4420" {
		t.Fatalf("without a replica address: %q", n.ReplicaTCPAddr())
	}
	if r := s.Apply(3, RegisterNode{ID: "a", TCPAddr: "10.0.2.2:4420", MgmtAddr: "a:7070", ReplicaAddr: "a b"}); r.Err == nil {
		t.Fatalf("a bad replica address: %v", r.Err)
	}
}
