package meta

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/blk-project/blk/nvme/auth"
)

var seedFlag = flag.Uint64("meta.seed", 0, "seed for randomized meta tests (0: from the clock)")

func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (replay: go test ./meta -run '^%s$' -meta.seed=%d)", seed, t.Name(), seed)
		}
	})
	return seed
}

const (
	h1 = "nqn.2014-08.org.nvmexpress:uuid:host1"
	h2 = "nqn.2014-08.org.nvmexpress:uuid:host2"
)

// base is a registry with nodes n1 (up), n2 (down); volumes "on" (online,
// 4096, allows h1, h1 connected through n1), "new" (creating, 512),
// "any" (online, allow-any, h2 connected through n1), "del" (deleting).
func base() []Command {
	return []Command{
		RegisterNode{ID: "n1", TargetAddr: "10.0.0.1:4420", MgmtAddr: "10.0.0.1:9000"},
		RegisterNode{ID: "n2", TargetAddr: "10.0.0.2:4420", MgmtAddr: "10.0.0.2:9000"},
		CreateVolume{Name: "on", SizeBytes: 1 << 20, BlockSize: 4096, Node: "n1", At: 100},
		SetVolumeState{Name: "on", State: VolumeOnline},
		AllowHost{Volume: "on", HostNQN: h1},
		Connect{HostNQN: h1, Volume: "on", Node: "n1", At: 200},
		CreateVolume{Name: "new", SizeBytes: 512 * 3, BlockSize: 512, Node: "n1", At: 300},
		CreateVolume{Name: "any", SizeBytes: 4096, BlockSize: 4096, Node: "n1", NQN: "nqn.2024-01.io.blk:any"},
		SetVolumeState{Name: "any", State: VolumeOnline},
		SetAllowAny{Volume: "any", AllowAny: true},
		Connect{HostNQN: h2, Volume: "any", Node: "n1", At: 400},
		CreateVolume{Name: "del", SizeBytes: 4096, BlockSize: 4096, Node: "n1"},
		DeleteVolume{Name: "del"},
		SetNodeState{ID: "n2", State: NodeDown},
	}
}

func baseState(t *testing.T) *State {
	t.Helper()
	s := NewState()
	for i, c := range base() {
		if r := s.Apply(uint64(i+1), c); r.Err != nil {
			t.Fatalf("base %d %#v: %v", i, c, r.Err)
		}
	}
	return s
}

func TestApplyTable(t *testing.T) {
	long := string(bytes.Repeat([]byte("x"), MaxNameLen+1))
	tests := []struct {
		name  string
		cmd   Command
		err   error
		check func(t *testing.T, s *State, r Result)
	}{
		{"register new", RegisterNode{ID: "n3", TargetAddr: "a:1", MgmtAddr: "a:2"}, nil, func(t *testing.T, s *State, r Result) {
			if n, _ := s.Node("n3"); n.State != NodeUp || r.Node.ID != "n3" {
				t.Errorf("node %+v result %+v", n, r.Node)
			}
		}},
		{"register again updates", RegisterNode{ID: "n1", TargetAddr: "b:1", MgmtAddr: "b:2"}, nil, func(t *testing.T, s *State, r Result) {
			if n, _ := s.Node("n1"); n.TargetAddr != "b:1" || n.State != NodeUp {
				t.Errorf("node %+v", n)
			}
		}},
		{"register empty id", RegisterNode{TargetAddr: "a:1", MgmtAddr: "a:2"}, ErrInvalid, nil},
		{"register long id", RegisterNode{ID: long, TargetAddr: "a:1", MgmtAddr: "a:2"}, ErrInvalid, nil},
		{"register no target", RegisterNode{ID: "n3", MgmtAddr: "a:2"}, ErrInvalid, nil},
		{"register TCP only", RegisterNode{ID: "n4", TCPAddr: "a:3", MgmtAddr: "a:2"}, nil, func(t *testing.T, s *State, r Result) {
			if n, _ := s.Node("n4"); n.TCPAddr != "a:3" || n.TargetAddr != "" {
				t.Errorf("node %+v", n)
			}
		}},
		{"register both", RegisterNode{ID: "n1", TargetAddr: "b:1", TCPAddr: "b:3", MgmtAddr: "b:2"}, nil, func(t *testing.T, s *State, r Result) {
			if n, _ := s.Node("n1"); n.TargetAddr != "b:1" || n.TCPAddr != "b:3" {
				t.Errorf("node %+v", n)
			}
		}},
		{"register TCP space", RegisterNode{ID: "n3", TCPAddr: "a 3", MgmtAddr: "a:2"}, ErrInvalid, nil},
		{"register no mgmt", RegisterNode{ID: "n3", TargetAddr: "a:1"}, ErrInvalid, nil},
		{"register space", RegisterNode{ID: "n 3", TargetAddr: "a:1", MgmtAddr: "a:2"}, ErrInvalid, nil},
		{"node state", SetNodeState{ID: "n1", State: NodeDraining}, nil, nil},
		{"node state unknown", SetNodeState{ID: "nx", State: NodeDown}, ErrUnknownNode, nil},
		{"node state invalid", SetNodeState{ID: "n1", State: 9}, ErrBadCommand, nil},
		{"volume state invalid", SetVolumeState{Name: "on", State: 0}, ErrBadCommand, nil},
		{"remove node", RemoveNode{ID: "n2"}, nil, func(t *testing.T, s *State, r Result) {
			if _, ok := s.Node("n2"); ok {
				t.Error("n2 still there")
			}
		}},
		{"remove unknown node", RemoveNode{ID: "nx"}, ErrUnknownNode, nil},
		{"remove node in use", RemoveNode{ID: "n1"}, ErrNodeInUse, nil},
		{"create", CreateVolume{Name: "v", SizeBytes: 8192, BlockSize: 4096, Node: "n1", At: 7}, nil, func(t *testing.T, s *State, r Result) {
			v, _ := s.Volume("v")
			want := Volume{Name: "v", ID: 5, SizeBytes: 8192, BlockSize: 4096, Node: "n1", State: VolumeCreating, NQN: DefaultNQN("v"), CreatedAt: 7}
			if !reflect.DeepEqual(v, want) || !reflect.DeepEqual(*r.Volume, want) {
				t.Errorf("got %+v / %+v, want %+v", v, *r.Volume, want)
			}
		}},
		{"create bad name", CreateVolume{Name: "", SizeBytes: 4096, BlockSize: 4096, Node: "n1"}, ErrInvalid, nil},
		{"create bad block size", CreateVolume{Name: "v", SizeBytes: 4096, BlockSize: 1024, Node: "n1"}, ErrBadBlockSize, nil},
		{"create size not multiple", CreateVolume{Name: "v", SizeBytes: 4097, BlockSize: 4096, Node: "n1"}, ErrSizeNotMultiple, nil},
		{"create size zero", CreateVolume{Name: "v", SizeBytes: 0, BlockSize: 512, Node: "n1"}, ErrSizeNotMultiple, nil},
		{"create bad nqn", CreateVolume{Name: "v", SizeBytes: 4096, BlockSize: 4096, Node: "n1", NQN: "iqn.x"}, ErrInvalid, nil},
		{"create duplicate name", CreateVolume{Name: "on", SizeBytes: 4096, BlockSize: 4096, Node: "n1"}, ErrVolumeExists, nil},
		{"create duplicate nqn", CreateVolume{Name: "v", SizeBytes: 4096, BlockSize: 4096, Node: "n1", NQN: "nqn.2024-01.io.blk:any"}, ErrNQNInUse, nil},
		{"create unknown node", CreateVolume{Name: "v", SizeBytes: 4096, BlockSize: 4096, Node: "nx"}, ErrUnknownNode, nil},
		{"create node down", CreateVolume{Name: "v", SizeBytes: 4096, BlockSize: 4096, Node: "n2"}, ErrNodeNotUp, nil},
		{"online", SetVolumeState{Name: "new", State: VolumeOnline}, nil, nil},
		{"offline", SetVolumeState{Name: "on", State: VolumeOffline}, nil, nil},
		{"state unknown volume", SetVolumeState{Name: "vx", State: VolumeOnline}, ErrUnknownVolume, nil},
		{"state to deleting", SetVolumeState{Name: "on", State: VolumeDeleting}, ErrBadTransition, nil},
		{"state from deleting", SetVolumeState{Name: "del", State: VolumeOnline}, ErrBadTransition, nil},
		{"state to creating", SetVolumeState{Name: "on", State: VolumeCreating}, ErrBadTransition, nil},
		{"resize", ResizeVolume{Name: "on", SizeBytes: 2 << 20}, nil, func(t *testing.T, s *State, r Result) {
			if v, _ := s.Volume("on"); v.SizeBytes != 2<<20 {
				t.Errorf("size %d", v.SizeBytes)
			}
		}},
		{"resize unknown", ResizeVolume{Name: "vx", SizeBytes: 4096}, ErrUnknownVolume, nil},
		{"resize not multiple", ResizeVolume{Name: "new", SizeBytes: 4000}, ErrSizeNotMultiple, nil},
		{"resize shrink", ResizeVolume{Name: "on", SizeBytes: 4096}, ErrShrink, nil},
		{"resize deleting", ResizeVolume{Name: "del", SizeBytes: 8192}, ErrVolumeDeleting, nil},
		{"delete", DeleteVolume{Name: "new"}, nil, func(t *testing.T, s *State, r Result) {
			if v, _ := s.Volume("new"); v.State != VolumeDeleting {
				t.Errorf("state %v", v.State)
			}
		}},
		{"delete unknown", DeleteVolume{Name: "vx"}, ErrUnknownVolume, nil},
		{"delete connected", DeleteVolume{Name: "on"}, ErrHasConnections, nil},
		{"delete connected force", DeleteVolume{Name: "on", Force: true}, nil, func(t *testing.T, s *State, r Result) {
			if n := s.countConns("on", ""); n != 0 {
				t.Errorf("%d connections left", n)
			}
		}},
		{"delete twice", DeleteVolume{Name: "del"}, ErrVolumeDeleting, nil},
		{"purge", PurgeVolume{Name: "del"}, nil, func(t *testing.T, s *State, r Result) {
			if _, ok := s.Volume("del"); ok {
				t.Error("del still there")
			}
			// Its NQN is free again.
			if r := s.Apply(99, CreateVolume{Name: "del2", SizeBytes: 4096, BlockSize: 4096, Node: "n1", NQN: DefaultNQN("del")}); r.Err != nil {
				t.Error(r.Err)
			}
		}},
		{"purge unknown", PurgeVolume{Name: "vx"}, ErrUnknownVolume, nil},
		{"purge not deleting", PurgeVolume{Name: "on"}, ErrBadTransition, nil},
		{"allow", AllowHost{Volume: "on", HostNQN: h2}, nil, func(t *testing.T, s *State, r Result) {
			if v, _ := s.Volume("on"); !reflect.DeepEqual(v.Hosts, []string{h1, h2}) {
				t.Errorf("hosts %q", v.Hosts)
			}
		}},
		{"allow again", AllowHost{Volume: "on", HostNQN: h1}, nil, nil},
		{"allow unknown volume", AllowHost{Volume: "vx", HostNQN: h1}, ErrUnknownVolume, nil},
		{"allow bad nqn", AllowHost{Volume: "on", HostNQN: "host1"}, ErrInvalid, nil},
		{"disallow a host never allowed", DisallowHost{Volume: "on", HostNQN: h2}, ErrHostNotAllowed, nil},
		{"disallow unknown volume", DisallowHost{Volume: "vx", HostNQN: h2}, ErrUnknownVolume, nil},
		{"disallow connected", DisallowHost{Volume: "on", HostNQN: h1}, ErrHasConnections, nil},
		{"disallow connected force", DisallowHost{Volume: "on", HostNQN: h1, Force: true}, nil, func(t *testing.T, s *State, r Result) {
			if v, _ := s.Volume("on"); len(v.Hosts) != 0 || s.countConns("on", "") != 0 {
				t.Errorf("hosts %q conns %d", v.Hosts, s.countConns("on", ""))
			}
		}},
		{"allow any", SetAllowAny{Volume: "on", AllowAny: true}, nil, nil},
		{"allow any unknown", SetAllowAny{Volume: "vx"}, ErrUnknownVolume, nil},
		{"allow any off with stranger connected", SetAllowAny{Volume: "any", AllowAny: false}, ErrHasConnections, nil},
		{"connect", Connect{HostNQN: h1, Volume: "any", Node: "n1", At: 5}, nil, func(t *testing.T, s *State, r Result) {
			c := s.conns[connKey{h1, "any", "n1"}]
			if c == nil || c.Since != 5 {
				t.Errorf("connection %+v", c)
			}
		}},
		{"connect unknown volume", Connect{HostNQN: h1, Volume: "vx", Node: "n1"}, ErrUnknownVolume, nil},
		{"connect bad nqn", Connect{HostNQN: "h", Volume: "on", Node: "n1"}, ErrInvalid, nil},
		{"connect unknown node", Connect{HostNQN: h1, Volume: "on", Node: "nx"}, ErrUnknownNode, nil},
		{"connect node down", Connect{HostNQN: h1, Volume: "on", Node: "n2"}, ErrNodeNotUp, nil},
		{"connect not online", Connect{HostNQN: h1, Volume: "new", Node: "n1"}, ErrVolumeNotOnline, nil},
		{"connect not allowed", Connect{HostNQN: h2, Volume: "on", Node: "n1"}, ErrHostNotAllowed, nil},
		{"connect twice", Connect{HostNQN: h1, Volume: "on", Node: "n1"}, ErrAlreadyConnected, nil},
		{"disconnect", Disconnect{HostNQN: h1, Volume: "on", Node: "n1"}, nil, nil},
		{"disconnect unknown", Disconnect{HostNQN: h2, Volume: "on", Node: "n1"}, ErrNotConnected, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := baseState(t)
			before := s.MarshalState()
			// Through the encoding, as raft delivers it.
			b, err := EncodeCommand(tt.cmd)
			if err != nil {
				t.Fatal(err)
			}
			r := s.ApplyBytes(50, b)
			if !errors.Is(r.Err, tt.err) || (tt.err == nil) != (r.Err == nil) {
				t.Fatalf("err %v, want %v", r.Err, tt.err)
			}
			if r.Index != 50 || s.Index() != 50 {
				t.Errorf("index %d / %d, want 50", r.Index, s.Index())
			}
			if r.Err != nil {
				// A failed command changes nothing but the index.
				s.index = 14
				if after := s.MarshalState(); !bytes.Equal(before, after) {
					t.Errorf("failed command changed state:\n%s\n%s", before, after)
				}
			}
			if tt.check != nil {
				tt.check(t, s, r)
			}
			checkInvariants(t, s)
		})
	}
}

func TestDecodeBad(t *testing.T) {
	good, _ := EncodeCommand(RemoveNode{ID: "n"})
	for _, b := range [][]byte{
		nil, {1}, {2, byte(OpRemoveNode), '{', '}'}, {1, 0, '{', '}'}, {1, 200, '{', '}'},
		{1, byte(OpRemoveNode), '{'}, {1, byte(OpRemoveNode), '[', ']'},
		append(good[:len(good):len(good)], make([]byte, MaxCommandBytes)...),
	} {
		s := NewState()
		if r := s.ApplyBytes(3, b); !errors.Is(r.Err, ErrBadCommand) || s.Index() != 3 {
			t.Errorf("%q: %v (index %d)", b, r.Err, s.Index())
		}
	}
}

func TestCommandRoundTrip(t *testing.T) {
	for _, c := range append(base(), PurgeVolume{Name: "x"}, ResizeVolume{Name: "x", SizeBytes: 3},
		DisallowHost{Volume: "x", HostNQN: h1, Force: true}, Disconnect{HostNQN: h1, Volume: "v", Node: "n"}, RemoveNode{ID: "n"},
		RegisterNode{ID: "n", TCPAddr: "a:1", MgmtAddr: "a:2", Zone: "z", Features: []string{FeatureReplication}},
		CreateVolume{Name: "r", SizeBytes: 4096, BlockSize: 4096, Node: "a", At: 3, Replicas: []string{"a", "b", "c"}},
		SetReplicaState{Volume: "r", Epoch: 2, Node: "b", State: ReplicaFailed, Reason: "disk", Full: true, At: 9},
		SetPrimary{Volume: "r", Epoch: 3, Node: "b", Failover: true, At: 10},
		AddReplica{Volume: "r", Node: "d", At: 11}, RemoveReplica{Volume: "r", Node: "c"},
		DeleteVolume{Name: "r", Force: true, WithSnapshots: true},
		CreateSnapshot{Volume: "r", Name: "s1", At: 12}, SnapshotDone{Volume: "r", Name: "s1", Epoch: 3, Nodes: []string{"a", "b"}},
		DeleteSnapshot{Volume: "r", Name: "s1"}, PurgeSnapshot{Volume: "r", Name: "s1"},
		CloneVolume{Name: "c", Volume: "r", Snapshot: "s1", NQN: "nqn.x:c", At: 13, ReplicaSecret: &HostSecret{Host: "DHHC-1:00:a:", Ctrl: "DHHC-1:00:b:"}},
		FlattenVolume{Name: "c", At: 14}, FlattenDone{Name: "c"}, RevertVolume{Name: "r", Snapshot: "s1", Epoch: 4},
		SnapshotNodes{Volume: "r", Snapshot: "s1", Add: "d"}, SnapshotNodes{Volume: "r", Snapshot: "s1", Remove: "b"}) {
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeCommand(b)
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Errorf("%#v → %q → %#v, %v", c, b, got, err)
		}
	}
}

// checkInvariants asserts the relationships a state must keep.
func checkInvariants(t *testing.T, s *State) {
	t.Helper()
	if len(s.nqns) != len(s.vols) {
		t.Errorf("%d NQNs for %d volumes", len(s.nqns), len(s.vols))
	}
	for name, v := range s.vols {
		if s.nqns[v.NQN] != name {
			t.Errorf("volume %q NQN %q maps to %q", name, v.NQN, s.nqns[v.NQN])
		}
		if _, ok := s.nodes[v.Node]; !ok {
			t.Errorf("volume %q on unknown node %q", name, v.Node)
		}
		if v.ID == 0 || v.ID >= s.nextVol || v.SizeBytes%uint64(v.BlockSize) != 0 {
			t.Errorf("volume %+v, next ID %d", v, s.nextVol)
		}
		if err := replicaInvariants(s, v); err != nil {
			t.Errorf("volume %q: %v", name, err)
		}
	}
	ordinals := map[int]string{}
	for id, n := range s.nodes {
		if n.Ordinal == 0 {
			continue // registered before ordinals (a loaded snapshot)
		}
		if n.Ordinal < 1 || n.Ordinal > MaxOrdinal {
			t.Errorf("node %q ordinal %d outside 1..%d", id, n.Ordinal, MaxOrdinal)
		} else if o, dup := ordinals[n.Ordinal]; dup {
			t.Errorf("nodes %q and %q share ordinal %d", id, o, n.Ordinal)
		}
		ordinals[n.Ordinal] = id
	}
	for k, c := range s.conns {
		v, ok := s.vols[k.volume]
		if !ok || v.State == VolumeDeleting || k != c.key() {
			t.Errorf("connection %+v to volume %+v", c, v)
		}
		if _, ok := s.nodes[k.node]; !ok {
			t.Errorf("connection %+v through unknown node", c)
		}
	}
	if err := snapshotInvariants(s); err != nil {
		t.Error(err)
	}
	// The canonical encoding round-trips.
	b := s.MarshalState()
	s2, err := UnmarshalState(b)
	if err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	if b2 := s2.MarshalState(); !bytes.Equal(b, b2) {
		t.Errorf("round trip differs:\n%s\n%s", b, b2)
	}
}

// randCommand draws a command over a small name space so that most commands
// hit existing objects and many fail.
func randCommand(rng *rand.Rand, at int64) Command {
	node := fmt.Sprintf("n%d", rng.IntN(4))
	vol := fmt.Sprintf("v%d", rng.IntN(8))
	host := fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:h%d", rng.IntN(4))
	bs := []uint32{512, 4096, 4096, 1000}[rng.IntN(4)]
	snap := fmt.Sprintf("s%d", rng.IntN(3))
	switch rng.IntN(24) {
	case 18:
		return CreateSnapshot{Volume: vol, Name: snap, At: at}
	case 19:
		return SnapshotDone{Volume: vol, Name: snap, Epoch: uint64(rng.IntN(3)), Nodes: []string{node}}
	case 20:
		if rng.IntN(2) == 0 {
			return DeleteSnapshot{Volume: vol, Name: snap}
		}
		return PurgeSnapshot{Volume: vol, Name: snap}
	case 21:
		return CloneVolume{Name: fmt.Sprintf("v%d", rng.IntN(8)), Volume: vol, Snapshot: snap, At: at}
	case 22:
		if rng.IntN(2) == 0 {
			return FlattenVolume{Name: vol, At: at}
		}
		return FlattenDone{Name: vol}
	case 23:
		return RevertVolume{Name: vol, Snapshot: snap, Epoch: uint64(rng.IntN(3))}
	case 14:
		return SetReplicaState{Volume: vol, Epoch: uint64(rng.IntN(4)), Node: node,
			State:  []ReplicaState{ReplicaInSync, ReplicaOutOfSync, ReplicaRebuilding, ReplicaFailed, "bogus"}[rng.IntN(5)],
			Reason: []string{"", "leg failed"}[rng.IntN(2)], Full: rng.IntN(2) == 0, At: at}
	case 15:
		return SetPrimary{Volume: vol, Epoch: uint64(rng.IntN(4)), Node: node, Failover: rng.IntN(2) == 0, At: at}
	case 16:
		if rng.IntN(2) == 0 {
			return AddReplica{Volume: vol, Node: node, At: at}
		}
		return RemoveReplica{Volume: vol, Node: node}
	case 0, 1:
		return RegisterNode{ID: node, TargetAddr: fmt.Sprintf("10.0.0.%d:4420", rng.IntN(3)), MgmtAddr: "m:1"}
	case 2:
		return SetNodeState{ID: node, State: NodeState(1 + rng.IntN(3))}
	case 3:
		return RemoveNode{ID: node}
	case 4:
		nqn := ""
		if rng.IntN(3) == 0 {
			nqn = fmt.Sprintf("nqn.x:%d", rng.IntN(4))
		}
		var replicas []string
		if k := rng.IntN(4); k > 0 {
			replicas = []string{node}
			for range k - 1 {
				replicas = append(replicas, fmt.Sprintf("n%d", rng.IntN(4)))
			}
		}
		return CreateVolume{Name: vol, SizeBytes: uint64(rng.IntN(4)) * 4096, BlockSize: bs, Node: node, NQN: nqn, At: at, Replicas: replicas}
	case 5:
		return SetVolumeState{Name: vol, State: VolumeState(1 + rng.IntN(4))}
	case 6:
		return ResizeVolume{Name: vol, SizeBytes: uint64(rng.IntN(8)) * 2048}
	case 7:
		return DeleteVolume{Name: vol, Force: rng.IntN(2) == 0}
	case 8:
		return PurgeVolume{Name: vol}
	case 9:
		return AllowHost{Volume: vol, HostNQN: host}
	case 10:
		return DisallowHost{Volume: vol, HostNQN: host, Force: rng.IntN(2) == 0}
	case 11:
		return SetAllowAny{Volume: vol, AllowAny: rng.IntN(2) == 0}
	case 12:
		return Connect{HostNQN: host, Volume: vol, Node: node, At: at}
	default:
		return Disconnect{HostNQN: host, Volume: vol, Node: node}
	}
}

// TestRandomDeterminism applies one seeded random log to two FSMs through
// raft.FSM, snapshots one midway and restores it into a third, and checks
// all agree byte for byte, entry by entry.
func TestRandomDeterminism(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	n := 3000
	if testing.Short() {
		n = 500
	}
	a, b := NewFSM(), NewFSM()
	var c *FSM
	mid := n/3 + rng.IntN(n/3)
	fails := 0
	for i := 1; i <= n; i++ {
		data, err := EncodeCommand(randCommand(rng, int64(i)*1000))
		if err != nil {
			t.Fatal(err)
		}
		l := &raft.Log{Index: uint64(i), Term: 1, Type: raft.LogCommand, Data: data}
		ra, rb := a.Apply(l).(Result), b.Apply(l).(Result)
		if (ra.Err == nil) != (rb.Err == nil) || !reflect.DeepEqual(ra.Volume, rb.Volume) {
			t.Fatalf("entry %d: results differ: %+v / %+v", i, ra, rb)
		}
		if ra.Err != nil {
			fails++
		}
		if c != nil {
			c.Apply(l)
		}
		if i == mid {
			snap, err := b.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			sink := &memSink{}
			if err := snap.Persist(sink); err != nil {
				t.Fatal(err)
			}
			snap.Release()
			c = NewFSM()
			// Restore over a non-empty registry replaces it.
			c.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: mustEncode(t, RegisterNode{ID: "junk", TargetAddr: "x", MgmtAddr: "y"})})
			if err := c.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
				t.Fatal(err)
			}
		}
		if i%97 == 0 || i == n {
			sa, sb := a.MarshalState(), b.MarshalState()
			if !bytes.Equal(sa, sb) {
				t.Fatalf("entry %d: states differ", i)
			}
			if c != nil && !bytes.Equal(sa, c.MarshalState()) {
				t.Fatalf("entry %d: restored state differs:\n%s\n%s", i, sa, c.MarshalState())
			}
			a.Read(func(s *State) { checkInvariants(t, s) })
		}
	}
	if st := a.Stats(); st.Applied != uint64(n) || st.Refused != uint64(fails) || c.Stats().Restored != 1 {
		t.Errorf("stats %+v / %+v, want %d applied, %d refused", st, c.Stats(), n, fails)
	}
	if fails == 0 || fails == n {
		t.Errorf("%d of %d commands failed: the generator is not exercising both paths", fails, n)
	}
	t.Logf("%d commands, %d failed, final registry %d bytes", n, fails, len(a.MarshalState()))
}

func mustEncode(t *testing.T, c Command) []byte {
	t.Helper()
	b, err := EncodeCommand(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct {
	bytes.Buffer
	cancelled, closed bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

func TestRestoreBad(t *testing.T) {
	for _, b := range []string{
		``, `{`, `{"version":2}`,
		`{"version":1,"next_volume_id":2,"nodes":[{"id":"a","state":"up"},{"id":"a","state":"up"}]}`,
		`{"version":1,"next_volume_id":2,"nodes":[{"id":"a","state":"sideways"}]}`,
		`{"version":1,"next_volume_id":2,"volumes":[{"name":"v","id":1,"node":"nx"}]}`,
		`{"version":1,"next_volume_id":1,"nodes":[{"id":"a","state":"up"}],"volumes":[{"name":"v","id":1,"node":"a"}]}`,
		`{"version":1,"next_volume_id":2,"nodes":[{"id":"a","state":"up"}],"connections":[{"volume":"v","node":"a"}]}`,
		`{"version":1,"next_volume_id":2,"nodes":[{"id":"a","state":"up"}],"volumes":[{"name":"v","id":1,"node":"a","size_bytes":4096,"block_size":4096}]}`,
		`{"version":1,"next_volume_id":2,"nodes":[{"id":"a","state":"up"}],"volumes":[{"name":"v","id":1,"node":"a","size_bytes":4000,"block_size":4096,"state":"online"}]}`,
		`{"version":1,"next_volume_id":2,"nodes":[{"id":"a","state":"up"}],"volumes":[{"name":"v","id":1,"node":"a","size_bytes":4096,"block_size":4096,"state":"deleting"}],"connections":[{"volume":"v","node":"a"}]}`,
	} {
		f := NewFSM()
		if err := f.Restore(io.NopCloser(bytes.NewReader([]byte(b)))); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v", b, err)
		}
	}
}

// TestClusterIDAndFailedSnapshot: the cluster ID is set once (the same ID
// again is a no-op, another is refused) and survives a snapshot, as does a
// failed volume with its reason (a snapshot refusing VolumeFailed would
// keep a node from restoring its registry).
func TestClusterIDAndFailedSnapshot(t *testing.T) {
	s := baseState(t)
	if r := s.Apply(100, SetClusterID{ID: "c-1"}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := s.Apply(101, SetClusterID{ID: "c-1"}); r.Err != nil {
		t.Fatalf("same cluster ID again: %v", r.Err)
	}
	if r := s.Apply(102, SetClusterID{ID: "c-2"}); !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("another cluster ID: %v, want ErrInvalid", r.Err)
	}
	if r := s.Apply(103, SetClusterID{ID: ""}); !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("empty cluster ID: %v, want ErrInvalid", r.Err)
	}
	if r := s.Apply(104, SetVolumeState{Name: "on", State: VolumeFailed}); !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("failed without a reason: %v, want ErrInvalid", r.Err)
	}
	if r := s.Apply(105, SetVolumeState{Name: "on", State: VolumeFailed, Reason: "disk gone"}); r.Err != nil {
		t.Fatal(r.Err)
	}
	c, err := UnmarshalState(s.MarshalState())
	if err != nil {
		t.Fatalf("snapshot with a failed volume: %v", err)
	}
	if c.ClusterID() != "c-1" {
		t.Fatalf("cluster ID after a snapshot: %q", c.ClusterID())
	}
	if v, _ := c.Volume("on"); v.State != VolumeFailed || v.Reason != "disk gone" {
		t.Fatalf("failed volume after a snapshot: %+v", v)
	}
	if r := c.Apply(106, SetVolumeState{Name: "on", State: VolumeOnline}); r.Err != nil || r.Volume.Reason != "" {
		t.Fatalf("failed -> online: %v, reason %q", r.Err, r.Volume.Reason)
	}
}

// Host secrets: validated, kept by a plain re-allow, replaced by a new
// one, dropped with the host, carried by snapshots.
func TestHostSecrets(t *testing.T) {
	s := NewState()
	mustApply := func(t *testing.T, s *State, c Command) {
		t.Helper()
		if r := s.Apply(1, c); r.Err != nil {
			t.Fatalf("%#v: %v", c, r.Err)
		}
	}
	mustApply(t, s, RegisterNode{ID: "n1", TargetAddr: "10.0.0.1:4420", MgmtAddr: "10.0.0.1:9000"})
	mustApply(t, s, CreateVolume{Name: "v", SizeBytes: 1 << 20, BlockSize: 4096, Node: "n1"})
	const host = "nqn.2014-08.org.nvmexpress:uuid:1"
	k1, _ := auth.GenerateKey(auth.SHA256, 32)
	k2, _ := auth.GenerateKey(0, 48)
	for _, bad := range []AllowHost{
		{Volume: "v", HostNQN: host, Secret: "DHHC-2:00:bogus:"},
		{Volume: "v", HostNQN: host, CtrlSecret: k1.Encode()},
		{Volume: "v", HostNQN: host, Secret: k1.Encode(), CtrlSecret: k1.Encode()},
		{Volume: "v", HostNQN: host, Secret: k1.Encode(), CtrlSecret: "x"},
	} {
		if r := s.Apply(1, bad); !errors.Is(r.Err, ErrInvalid) {
			t.Fatalf("%+v: %v", bad, r.Err)
		}
	}
	mustApply(t, s, AllowHost{Volume: "v", HostNQN: host, Secret: k1.Encode(), CtrlSecret: k2.Encode()})
	mustApply(t, s, AllowHost{Volume: "v", HostNQN: host}) // keeps them
	v, _ := s.Volume("v")
	if got := v.Secrets[host]; got.Host != k1.Encode() || got.Ctrl != k2.Encode() {
		t.Fatalf("secrets after a plain re-allow: %+v", got)
	}
	back, err := UnmarshalState(s.MarshalState())
	if err != nil {
		t.Fatal(err)
	}
	if bv, _ := back.Volume("v"); bv.Secrets[host] != v.Secrets[host] {
		t.Fatal("the snapshot lost the secrets")
	}
	mustApply(t, s, AllowHost{Volume: "v", HostNQN: host, Secret: k2.Encode()})
	v, _ = s.Volume("v")
	if got := v.Secrets[host]; got.Host != k2.Encode() || got.Ctrl != "" {
		t.Fatalf("secrets after a new one: %+v", got)
	}
	mustApply(t, s, DisallowHost{Volume: "v", HostNQN: host})
	if v, _ = s.Volume("v"); v.Secrets != nil {
		t.Fatalf("secrets of a disallowed host: %+v", v.Secrets)
	}
}
