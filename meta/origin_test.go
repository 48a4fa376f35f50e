package meta

import (
	"errors"
	"strings"
	"testing"
)

// TestSnapshotOrigin: CreateSnapshot keeps a well-formed Origin as the
// snapshot's, and Check refuses a malformed one.
func TestSnapshotOrigin(t *testing.T) {
	for _, o := range []string{"", "c-1/7", "a/b/18446744073709551615", "/3"} {
		if err := (CreateSnapshot{Name: "s", Origin: o}).Check(); err != nil {
			t.Errorf("origin %q: %v", o, err)
		}
	}
	for _, o := range []string{"7", "c/", "c/0", "c/07", "c/-1", "c/x", "c\n/1", strings.Repeat("c", MaxOriginLen) + "/1"} {
		if err := (CreateSnapshot{Name: "s", Origin: o}).Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("origin %q: %v, want ErrInvalid", o, err)
		}
	}
}

// TestSnapshotOriginApplied: the origin a CreateSnapshot carries is the
// snapshot's after it is applied, and a bad one is refused by Apply.
func TestSnapshotOriginApplied(t *testing.T) {
	s := snapshotBase(t)
	mustApply(t, s, SnapshotDone{Volume: "w", Name: "w3", Epoch: 2, Nodes: []string{"c"}})
	mustApply(t, s, CreateSnapshot{Volume: "w", Name: "w4", At: 12, Origin: "other/42"})
	v, _ := s.Volume("w")
	if sn, ok := v.Snapshot("w4"); !ok || sn.Origin != "other/42" {
		t.Fatalf("w@w4 after CreateSnapshot with an origin: %+v", sn)
	}
	if sn, _ := v.Snapshot("w3"); sn.Origin != "" {
		t.Fatalf("w@w3 has origin %q, none given", sn.Origin)
	}
	if r := s.Apply(s.Index()+1, CreateSnapshot{Volume: "v", Name: "s9", At: 13, Origin: "x/0"}); !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("origin x/0 applied: %v", r.Err)
	}
}
