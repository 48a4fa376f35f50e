package meta

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestCNTLIDRange: ordinal k owns (k−1)·1024+1 … k·1024; the ranges of
// 1..MaxOrdinal are disjoint, contiguous and within NVMe's dynamic
// CNTLIDs (1..0xFFEF); there are no others.
func TestCNTLIDRange(t *testing.T) {
	prev := uint16(0)
	for k := 1; k <= MaxOrdinal; k++ {
		lo, hi, ok := CNTLIDRange(k)
		if !ok || lo != prev+1 || int(hi-lo)+1 != CNTLIDsPerNode || hi > 0xFFEF {
			t.Fatalf("CNTLIDRange(%d) = %d..%d, %v after %d", k, lo, hi, ok, prev)
		}
		prev = hi
	}
	if prev != 63*1024 {
		t.Fatalf("last ID %d", prev)
	}
	for _, k := range []int{-1, 0, MaxOrdinal + 1} {
		if lo, hi, ok := CNTLIDRange(k); ok {
			t.Fatalf("CNTLIDRange(%d) = %d..%d, ok", k, lo, hi)
		}
	}
	// A 64th range would pass the largest dynamic CNTLID.
	if (MaxOrdinal+1)*CNTLIDsPerNode <= 0xFFEF {
		t.Fatal("MaxOrdinal leaves room for another node")
	}
}

func register(id string) RegisterNode {
	return RegisterNode{ID: id, TCPAddr: id + ":4420", MgmtAddr: id + ":9000"}
}

// TestOrdinalLimit: MaxOrdinal nodes register with ordinals 1..63; one
// more is refused with ErrLimit and a message an operator can act on,
// and changes nothing; the registered ones still re-register; once one
// is removed, a new node takes its ordinal.
func TestOrdinalLimit(t *testing.T) {
	s := NewState()
	for k := 1; k <= MaxOrdinal; k++ {
		r := mustApply(t, s, register(fmt.Sprintf("n%d", k)))
		if r.Node.Ordinal != k {
			t.Fatalf("node %d got ordinal %d", k, r.Node.Ordinal)
		}
	}
	before, idx := s.MarshalState(), s.Index()
	r := s.Apply(idx+1, register("extra"))
	if !errors.Is(r.Err, ErrLimit) || !strings.Contains(r.Err.Error(), "remove a node") {
		t.Fatalf("64th node: %v", r.Err)
	}
	s.index = idx // a failed command changes nothing but the index
	if !bytes.Equal(before, s.MarshalState()) {
		t.Fatal("the refused registration changed the registry")
	}
	if r := mustApply(t, s, register("n7")); r.Node.Ordinal != 7 {
		t.Fatalf("n7 re-registered with ordinal %d", r.Node.Ordinal)
	}
	mustApply(t, s, RemoveNode{ID: "n40"})
	if r := mustApply(t, s, register("extra")); r.Node.Ordinal != 40 {
		t.Fatalf("new node after n40 left: ordinal %d", r.Node.Ordinal)
	}
	checkInvariants(t, s)
}

// TestOldRegistryOrdinals: a registry written before ordinals loads with
// none (and re-encodes unchanged, TestOldRegistryOneReplica); each node
// gets one the next time it registers, the smallest free, in the order
// they register, and keeps it through a snapshot.
func TestOldRegistryOrdinals(t *testing.T) {
	old, err := os.ReadFile("testdata/registry-before-replicas.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := UnmarshalState(bytes.TrimSpace(old))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"n1", "n2"} {
		if n, _ := s.Node(id); n.Ordinal != 0 {
			t.Fatalf("%s loaded with ordinal %d", id, n.Ordinal)
		}
	}
	n2, _ := s.Node("n2")
	r := mustApply(t, s, RegisterNode{ID: "n2", TargetAddr: n2.TargetAddr, MgmtAddr: n2.MgmtAddr, Zone: n2.Zone})
	if r.Node.Ordinal != 1 {
		t.Fatalf("n2 got ordinal %d", r.Node.Ordinal)
	}
	if n1, _ := s.Node("n1"); n1.Ordinal != 0 {
		t.Fatalf("n1 got ordinal %d without registering", n1.Ordinal)
	}
	mustApply(t, s, RegisterNode{ID: "n1", TCPAddr: "a:1", MgmtAddr: "a:2", Zone: "za"})
	mustApply(t, s, RegisterNode{ID: "n2", TargetAddr: n2.TargetAddr, MgmtAddr: n2.MgmtAddr, Zone: n2.Zone})
	s2, err := UnmarshalState(s.MarshalState())
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]int{"n1": 2, "n2": 1} {
		if n, _ := s2.Node(id); n.Ordinal != want {
			t.Fatalf("%s: ordinal %d after a snapshot, want %d", id, n.Ordinal, want)
		}
	}
	checkInvariants(t, s2)
}

// TestSnapshotBadOrdinal: a snapshot whose ordinals are out of range or
// shared is refused, not loaded into a registry that would hand two
// nodes one CNTLID range.
func TestSnapshotBadOrdinal(t *testing.T) {
	for _, nodes := range []string{
		`{"id":"a","target_addr":"a:1","mgmt_addr":"a:2","state":"up","ordinal":3},{"id":"b","target_addr":"b:1","mgmt_addr":"b:2","state":"up","ordinal":3}`,
		`{"id":"a","target_addr":"a:1","mgmt_addr":"a:2","state":"up","ordinal":64}`,
		`{"id":"a","target_addr":"a:1","mgmt_addr":"a:2","state":"up","ordinal":-1}`,
	} {
		b := `{"version":1,"index":1,"next_volume_id":1,"nodes":[` + nodes + `],"volumes":[],"connections":[]}`
		if _, err := UnmarshalState([]byte(b)); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v", nodes, err)
		}
	}
	good := `{"version":1,"index":1,"next_volume_id":1,"nodes":[{"id":"a","target_addr":"a:1","mgmt_addr":"a:2","state":"up","ordinal":63}],"volumes":[],"connections":[]}`
	s, err := UnmarshalState([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.MarshalState(); string(got) != good {
		t.Fatalf("re-encoded as %s", got)
	}
}
