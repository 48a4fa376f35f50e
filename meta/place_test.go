package meta

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestPlace: Place's choices over small registries, one table row each.
func TestPlace(t *testing.T) {
	const gib = 1 << 30
	reg := func(id, zone string, capacity uint64) Command {
		return RegisterNode{ID: id, TCPAddr: id + ":4420", MgmtAddr: id + ":9000", CapacityBytes: capacity, Zone: zone}
	}
	vol := func(name, node string, size uint64) Command {
		return CreateVolume{Name: name, SizeBytes: size, BlockSize: 4096, Node: node}
	}
	tests := []struct {
		name string
		cmds []Command
		req  PlaceRequest
		want []string
		err  error
		msg  string // in the error
	}{
		{name: "empty registry", req: PlaceRequest{SizeBytes: gib}, err: ErrNoPlacement},
		{name: "most free capacity", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 20*gib), reg("c", "", 15*gib)},
			req: PlaceRequest{SizeBytes: gib}, want: []string{"b"}},
		{name: "promised capacity counts", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 20*gib), vol("v", "b", 11*gib)},
			req: PlaceRequest{SizeBytes: gib}, want: []string{"a"}},
		{name: "deleting volumes do not count", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 20*gib), vol("v", "b", 11*gib), DeleteVolume{Name: "v"}},
			req: PlaceRequest{SizeBytes: gib}, want: []string{"b"}},
		{name: "tie: fewer volumes", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 10*gib), vol("v", "b", 0x1000), vol("w", "a", 0x1000), vol("x", "a", 0x1000), ResizeVolume{Name: "v", SizeBytes: 0x2000}},
			req: PlaceRequest{SizeBytes: gib}, want: []string{"b"}},
		{name: "tie: node ID", cmds: []Command{reg("c", "", 10*gib), reg("b", "", 10*gib), reg("a", "", 10*gib)},
			req: PlaceRequest{SizeBytes: gib}, want: []string{"a"}},
		{name: "no capacity registered is no limit", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 0)},
			req: PlaceRequest{SizeBytes: 100 * gib}, want: []string{"b"}},
		{name: "down and draining excluded", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 20*gib), reg("c", "", 30*gib),
			SetNodeState{ID: "b", State: NodeDown}, SetNodeState{ID: "c", State: NodeDraining}},
			req: PlaceRequest{SizeBytes: gib}, want: []string{"a"}},
		{name: "excluded (not answering) skipped", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 20*gib), reg("c", "", 15*gib)},
			req: PlaceRequest{SizeBytes: gib, Exclude: []string{"b"}}, want: []string{"c"}},
		{name: "every node excluded", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 20*gib)},
			req: PlaceRequest{SizeBytes: gib, Exclude: []string{"b", "a"}}, err: ErrNoPlacement, msg: "not counting b, a, which did not answer"},
		{name: "full disk skipped", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 20*gib), reg("c", "", 15*gib)},
			req: PlaceRequest{SizeBytes: gib, Full: []string{"b"}}, want: []string{"c"}},
		{name: "every node full or silent", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 20*gib)},
			req: PlaceRequest{SizeBytes: gib, Exclude: []string{"a"}, Full: []string{"b"}}, err: ErrNoPlacement, msg: "not counting a, which did not answer) (not counting b, whose disk is full"},
		{name: "the others too small", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 20*gib)},
			req: PlaceRequest{SizeBytes: 12 * gib, Full: []string{"b"}}, err: ErrNoCapacity, msg: "fits on 0 node(s) up in distinct zones (not counting b, whose disk is full), 1 needed: node a may be promised the most"},
		{name: "no node up", cmds: []Command{reg("a", "", 10*gib), SetNodeState{ID: "a", State: NodeDown}},
			req: PlaceRequest{SizeBytes: gib}, err: ErrNoPlacement, msg: "0 such zone(s) among 1 nodes"},
		{name: "too big for the freest", cmds: []Command{reg("a", "", 10*gib), reg("b", "", 20*gib), vol("v", "b", 5*gib)},
			req: PlaceRequest{SizeBytes: 16 * gib}, err: ErrNoCapacity, msg: fmt.Sprintf("node b may be promised the most, %d more bytes", 15*gib)},
		{name: "exactly fits", cmds: []Command{reg("a", "", 10*gib)},
			req: PlaceRequest{SizeBytes: 10 * gib}, want: []string{"a"}},
		{name: "overcommitted node has nothing free", cmds: []Command{reg("a", "", 10*gib), vol("v", "a", 12*gib)},
			req: PlaceRequest{SizeBytes: 0x1000}, err: ErrNoCapacity, msg: "node a may be promised the most, 0 more bytes"},
		// The generalisation replica sets will use: N nodes, N zones.
		{name: "three replicas three zones", cmds: []Command{reg("a1", "a", 30*gib), reg("a2", "a", 29*gib), reg("b1", "b", 10*gib), reg("c1", "", 5*gib)},
			req: PlaceRequest{Replicas: 3, SizeBytes: gib}, want: []string{"a1", "b1", "c1"}},
		{name: "two replicas one zone", cmds: []Command{reg("a1", "a", 30*gib), reg("a2", "a", 29*gib)},
			req: PlaceRequest{Replicas: 2, SizeBytes: gib}, err: ErrNoPlacement, msg: "1 such zone(s)"},
		{name: "replica skips a full zone member", cmds: []Command{reg("a1", "a", 30*gib), reg("b1", "b", gib), reg("b2", "b", 4*gib)},
			req: PlaceRequest{Replicas: 2, SizeBytes: 2 * gib}, want: []string{"a1", "b2"}},
		{name: "secondary replicas count against their nodes", cmds: []Command{reg("a", "za", 10*gib), reg("b", "zb", 10*gib), reg("c", "zc", 9*gib),
			CreateVolume{Name: "v", SizeBytes: 5 * gib, BlockSize: 4096, Node: "a", Replicas: []string{"a", "b"}}},
			req: PlaceRequest{SizeBytes: gib}, want: []string{"c"}},
		{name: "secondary replica fills its node", cmds: []Command{reg("a", "za", 10*gib), reg("b", "zb", 10*gib),
			CreateVolume{Name: "v", SizeBytes: 10 * gib, BlockSize: 4096, Node: "a", Replicas: []string{"a", "b"}}},
			req: PlaceRequest{SizeBytes: gib}, err: ErrNoCapacity, msg: "0 more bytes"},
		{name: "taken nodes and their zones excluded", cmds: []Command{reg("a1", "a", 30*gib), reg("a2", "a", 29*gib), reg("b1", "b", 10*gib), reg("c1", "", 5*gib)},
			req: PlaceRequest{Replicas: 1, SizeBytes: gib, Taken: []string{"a1", "b1"}}, want: []string{"c1"}},
		{name: "taken zones leave too few", cmds: []Command{reg("a1", "a", 30*gib), reg("a2", "a", 29*gib), reg("b1", "b", 10*gib)},
			req: PlaceRequest{Replicas: 1, SizeBytes: gib, Taken: []string{"a1", "b1"}}, err: ErrNoPlacement, msg: "not counting the zones of a1, b1"},
		{name: "replicas: one zone too full", cmds: []Command{reg("a1", "a", 30*gib), reg("b1", "b", gib)},
			req: PlaceRequest{Replicas: 2, SizeBytes: 2 * gib}, err: ErrNoCapacity, msg: "fits on 1 node(s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewState()
			for i, c := range tt.cmds {
				if r := s.Apply(uint64(i+1), c); r.Err != nil {
					t.Fatalf("%#v: %v", c, r.Err)
				}
			}
			got, err := s.Place(tt.req)
			if tt.err != nil {
				if !errors.Is(err, tt.err) || !strings.Contains(fmt.Sprint(err), tt.msg) {
					t.Fatalf("Place = %v, %v; want %v containing %q", got, err, tt.err, tt.msg)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("Place = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// TestPlaceDeterministic: the same registry, built by commands in any
// order, places the same way (Place reads maps), and placing volume after
// volume of equal size on equal nodes spreads them evenly.
func TestPlaceDeterministic(t *testing.T) {
	seed := testSeed(t)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	var cmds []Command
	for i := range 5 {
		cmds = append(cmds, RegisterNode{ID: fmt.Sprintf("n%d", i), TCPAddr: "a:1", MgmtAddr: "a:2", CapacityBytes: 1 << 30, Zone: fmt.Sprintf("z%d", i%3)})
	}
	var first []string
	for round := range 20 {
		rng.Shuffle(len(cmds), func(i, j int) { cmds[i], cmds[j] = cmds[j], cmds[i] })
		s := NewState()
		for i, c := range cmds {
			s.Apply(uint64(i+1), c)
		}
		var got []string
		for v := range 10 {
			ids, err := s.Place(PlaceRequest{SizeBytes: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, ids...)
			if r := s.Apply(uint64(100+v), CreateVolume{Name: fmt.Sprintf("v%d", v), SizeBytes: 1 << 20, BlockSize: 4096, Node: ids[0]}); r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		three, err := s.Place(PlaceRequest{Replicas: 3, SizeBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, three...)
		if round == 0 {
			first = got
			continue
		}
		if !slices.Equal(got, first) {
			t.Fatalf("round %d placed %v, round 0 %v", round, got, first)
		}
	}
	want := []string{"n0", "n1", "n2", "n3", "n4", "n0", "n1", "n2", "n3", "n4", "n0", "n1", "n2"}
	if !slices.Equal(first, want) {
		t.Fatalf("placed %v, want %v", first, want)
	}
}

// TestOldSnapshotHasNoZones: a snapshot written before zones (no "zone"
// field) loads, its nodes are their own failure domains, and re-encoding
// it gives the same bytes.
func TestOldSnapshotHasNoZones(t *testing.T) {
	old := `{"version":1,"index":3,"next_volume_id":2,"nodes":[{"id":"n1","target_addr":"","tcp_addr":"a:1","mgmt_addr":"a:2","state":"up","capacity_bytes":1048576},{"id":"n2","target_addr":"b:1","mgmt_addr":"b:2","state":"up"}],"volumes":[{"name":"v","id":1,"size_bytes":4096,"block_size":4096,"node":"n2","state":"online","nqn":"nqn.2024-01.io.blk:volume:v","created_at":0}],"connections":[]}`
	s, err := UnmarshalState([]byte(old))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Node("n1"); n.Zone != "" {
		t.Fatalf("zone %q from a snapshot without zones", n.Zone)
	}
	// n2 (no capacity registered: no limit) ranks first, but is primary
	// of v already: n1 leads the new volume.
	if got, err := s.Place(PlaceRequest{Replicas: 2, SizeBytes: 4096}); err != nil || !slices.Equal(got, []string{"n1", "n2"}) {
		t.Fatalf("Place = %v, %v", got, err)
	}
	if s2, err := UnmarshalState(s.MarshalState()); err != nil || string(s2.MarshalState()) != string(s.MarshalState()) {
		t.Fatalf("round trip: %v", err)
	}
}

// TestPlacePrimariesSpread: volumes of three replicas on three nodes
// hold a copy on every node; their primaries, which serve the hosts,
// still go round the nodes (before, every one went to the node ranked
// first, n1, by ID).
func TestPlacePrimariesSpread(t *testing.T) {
	s := NewState()
	idx := uint64(0)
	apply := func(c Command) Result {
		t.Helper()
		idx++
		r := s.Apply(idx, c)
		if r.Err != nil {
			t.Fatalf("%+v: %v", c, r.Err)
		}
		return r
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		apply(RegisterNode{ID: id, TCPAddr: id + ":1", MgmtAddr: id + ":2", Zone: "z" + id})
	}
	primaries := map[string]int{}
	for i := range 6 {
		nodes, err := s.Place(PlaceRequest{Replicas: 3, SizeBytes: 4096})
		if err != nil {
			t.Fatal(err)
		}
		apply(CreateVolume{Name: fmt.Sprintf("v%d", i), SizeBytes: 4096, BlockSize: 4096, Node: nodes[0], Replicas: nodes})
		primaries[nodes[0]]++
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		if primaries[id] != 2 {
			t.Fatalf("primaries %v: want two on each node", primaries)
		}
	}
}
