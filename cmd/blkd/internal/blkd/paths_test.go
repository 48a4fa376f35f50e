package blkd

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestPortIDs: every port kind of every ordinal, and of a node without
// one, has a PORTID no other has, and it fits a PORTID.
func TestPortIDs(t *testing.T) {
	seen := map[uint16]string{}
	for ord := 0; ord <= meta.MaxOrdinal; ord++ {
		for _, kind := range []uint16{tcpPortID, rdmaPortID, discPortID} {
			id := portID(ord, kind)
			if prev, dup := seen[id]; dup || id == 0 {
				t.Fatalf("ordinal %d kind %d: PORTID %d (also %s)", ord, kind, id, prev)
			}
			seen[id] = fmt.Sprintf("ordinal %d kind %d", ord, kind)
		}
	}
	if portID(0, tcpPortID) != 1 || portID(0, rdmaPortID) != 2 || portID(0, discPortID) != 3 {
		t.Fatal("a node without an ordinal does not keep the old PORTIDs")
	}
}

// TestPathsOf: the paths of a volume are its other replica nodes' ports
// in replica order, NVMe/TCP before NVMe/RDMA, at the addresses each
// registered, with the PORTIDs their own discovery logs give them; this
// node, failed replicas, unknown nodes, nodes without an ordinal and
// addresses a host cannot reach are left out; each path passes the
// target's checks (SetPaths).
func TestPathsOf(t *testing.T) {
	s := meta.NewState()
	reg := func(c meta.RegisterNode) {
		t.Helper()
		if r := s.Apply(s.Index()+1, c); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	reg(meta.RegisterNode{ID: "n1", TCPAddr: "10.0.0.1:4420", TargetAddr: "10.0.1.1:4421", MgmtAddr: "m:1", Zone: "z1"})
	reg(meta.RegisterNode{ID: "n2", TCPAddr: "[fd00::2]:4420", MgmtAddr: "m:2", Zone: "z2"})
	reg(meta.RegisterNode{ID: "n3", TCPAddr: "203.0.113.3:14420", TargetAddr: "203.0.113.3:14421", MgmtAddr: "m:3", Zone: "z3"})
	reg(meta.RegisterNode{ID: "n4", TCPAddr: "0.0.0.0:4420", TargetAddr: "10.0.1.4:4421", MgmtAddr: "m:4", Zone: "z4"})
	reg(meta.RegisterNode{ID: "n5", TCPAddr: "10.0.0.5:4420", MgmtAddr: "m:5", Zone: "z5"})
	reg(meta.RegisterNode{ID: "n6", TCPAddr: "10.0.0.6", MgmtAddr: "m:6", Zone: "z6"})
	tcpPort := func(ord int, host, svc string, fam uint8) target.Port {
		return target.Port{ID: uint16(4*ord + 1), TrType: nvme.TrTypeTCP, AdrFam: fam, TrAddr: host, TrSvcID: svc, TReq: nvme.TReqDisableSQFlow}
	}
	rdmaPort := func(ord int, host, svc string) target.Port {
		return target.Port{ID: uint16(4*ord + 2), TrType: nvme.TrTypeRDMA, AdrFam: nvme.AdrFamIPv4, TrAddr: host, TrSvcID: svc}
	}
	in := func(n string) meta.Replica { return meta.Replica{Node: n, State: meta.ReplicaInSync} }
	v := meta.Volume{Name: "v", Node: "n3", Replicas: []meta.Replica{
		in("n3"), in("n1"), {Node: "n2", State: meta.ReplicaOutOfSync}, in("n4"),
		{Node: "n5", State: meta.ReplicaFailed, Reason: "store lost"}, in("n6"), in("gone"),
	}}
	want := []target.Port{
		tcpPort(3, "203.0.113.3", "14420", nvme.AdrFamIPv4), rdmaPort(3, "203.0.113.3", "14421"),
		tcpPort(2, "fd00::2", "4420", nvme.AdrFamIPv6),
		rdmaPort(4, "10.0.1.4", "4421"), // its TCP address is a wildcard
	}
	// From n1: n3 (primary, first in replica order), n2, n4; n5 failed,
	// n6 registered no port, "gone" is not registered.
	if got := pathsOf(s, v, "n1"); !reflect.DeepEqual(got, want) {
		t.Fatalf("from n1:\n got %+v\nwant %+v", got, want)
	}
	// From n3, n1's two ports come first.
	got := pathsOf(s, v, "n3")
	wantN3 := append([]target.Port{tcpPort(1, "10.0.0.1", "4420", nvme.AdrFamIPv4), rdmaPort(1, "10.0.1.1", "4421")}, want[2:]...)
	if !reflect.DeepEqual(got, wantN3) {
		t.Fatalf("from n3:\n got %+v\nwant %+v", got, wantN3)
	}
	// The target takes them as they are.
	tgt, err := target.New(target.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	sub, err := tgt.AddSubsystem(target.SubsystemConfig{NQN: "nqn.2024-01.io.blk:volume:v", AllowAnyHost: true, Paths: got})
	if err != nil {
		t.Fatalf("AddSubsystem with the paths: %v", err)
	}
	if err := sub.SetPaths(pathsOf(s, v, "n1")); err != nil {
		t.Fatalf("SetPaths: %v", err)
	}

	// A volume written before replicas: its primary only.
	old := meta.Volume{Name: "o", Node: "n1"}
	if got := pathsOf(s, old, "n1"); len(got) != 0 {
		t.Fatalf("the primary itself: %+v", got)
	}
	if got := pathsOf(s, old, "n3"); !reflect.DeepEqual(got, wantN3[:2]) {
		t.Fatalf("old volume from n3: %+v", got)
	}

	// A node registered before ordinals (a loaded old registry) has no
	// path until it registers again.
	snap := s.Export()
	for i := range snap.Nodes {
		if snap.Nodes[i].ID == "n1" {
			snap.Nodes[i].Ordinal = 0
		}
	}
	b, _ := json.Marshal(snap)
	legacy, err := meta.UnmarshalState(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := pathsOf(legacy, old, "n3"); len(got) != 0 {
		t.Fatalf("a node without an ordinal: %+v", got)
	}
}
