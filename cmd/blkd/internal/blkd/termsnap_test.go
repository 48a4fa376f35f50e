package blkd

import (
	"strings"
	"testing"

	"github.com/blk-project/blk/meta"
)

// TestSnapshotSetDiff: the term check's comparison of a replica's
// snapshot chain with the primary's (docs/snapshots.md §4.4). Equal
// chains pass, also when they differ only in snapshots left out (being
// taken or deleted, not listing the replica, another volume's origin);
// a replica lacking a snapshot, reading through an object the registry
// does not know or through one the primary's copy does not, or holding
// them in another order differs, with a reason naming them.
func TestSnapshotSetDiff(t *testing.T) {
	snap := func(name string, id uint64, st meta.SnapshotState, nodes ...string) meta.VolumeSnapshot {
		return meta.VolumeSnapshot{Name: name, ID: id, State: st, Nodes: nodes}
	}
	v := meta.Volume{Name: "v", ID: 10, Snapshots: []meta.VolumeSnapshot{
		snap("s1", 11, meta.SnapshotReady, "n1", "n2", "n3"),
		snap("s2", 12, meta.SnapshotReady, "n1", "n2", "n3"),
		snap("s3", 13, meta.SnapshotReady, "n1", "n2", "n3"),
		snap("away", 14, meta.SnapshotReady, "n1", "n2"), // n3 was out of sync
		snap("new", 15, meta.SnapshotCreating, "n1", "n2", "n3"),
		snap("old", 16, meta.SnapshotDeleting, "n1", "n2", "n3"),
	}}
	known := func(id uint64) bool { return id == 5 || (id >= 11 && id <= 16) } // 5: another volume's snapshot, the origin
	chain := func(ids ...uint64) []chainObject {
		out := make([]chainObject, len(ids))
		for i, id := range ids {
			out[i].ID = id
			if i+1 < len(ids) {
				out[i].Parent = ids[i+1]
			}
		}
		return out
	}
	primary := chain(10, 15, 14, 13, 16, 12, 11, 5)
	for _, c := range []struct {
		name    string
		node    string
		replica []chainObject
		want    string // "": equal; else a part of the reason
		lacks   []string
	}{
		{"equal", "n2", chain(10, 15, 14, 13, 16, 12, 11, 5), "", nil},
		{"not listed left out", "n3", chain(10, 15, 13, 16, 12, 11, 5), "", nil},
		{"creating and deleting left out", "n2", chain(10, 14, 13, 12, 11, 5), "", nil},
		{"origin left out", "n2", chain(10, 14, 13, 12, 11), "", nil},
		{"lacks one", "n2", chain(10, 14, 12, 11, 5), "replica's snapshots differ from the primary's: lacks v@s3", []string{"s3"}},
		{"lacks two", "n3", chain(10, 13), "lacks v@s2, v@s1", []string{"s2", "s1"}},
		{"lacks all", "n2", chain(10), "lacks v@away, v@s3, v@s2, v@s1", []string{"away", "s3", "s2", "s1"}},
		{"unknown", "n2", chain(10, 99, 14, 13, 12, 11, 5), "reads through store object 99 the registry does not know", nil},
		{"order", "n2", chain(10, 14, 12, 13, 11, 5), "in another order (newest first): v@away, v@s2, v@s3, v@s1; the primary: v@away, v@s3, v@s2, v@s1", nil},
	} {
		got, lacks := snapshotSetDiff(v, c.node, known, primary, c.replica)
		if want := strings.Join(c.lacks, " "); strings.Join(lacks, " ") != want {
			t.Errorf("%s: lacks %v, want %v", c.name, lacks, c.lacks)
		}
		switch {
		case c.want == "" && got != "":
			t.Errorf("%s: %q, want no difference", c.name, got)
		case c.want != "" && !strings.Contains(got, c.want):
			t.Errorf("%s: %q, want %q in it", c.name, got, c.want)
		}
	}
	// The primary reverted to s2 (away and s3 off its chain); a replica
	// that did not still reads through them.
	got, _ := snapshotSetDiff(v, "n2", known, chain(10, 12, 11, 5), chain(10, 14, 13, 12, 11, 5))
	if want := "reads through v@away, v@s3, which the primary's copy does not"; !strings.Contains(got, want) {
		t.Errorf("reverted primary: %q, want %q in it", got, want)
	}
}
