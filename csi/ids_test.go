package csi

import (
	"errors"
	"strings"
	"testing"
)

func TestBlkName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"pvc-0b6c8a5e-1f2d-4c3b-9a8e-7d6c5b4a3f21", "pvc-0b6c8a5e-1f2d-4c3b-9a8e-7d6c5b4a3f21"},
		{"sanity-Node-1.x_y", "sanity-Node-1.x_y"},
		{strings.Repeat("a", 128), strings.Repeat("a", 128)},
	} {
		if got := blkName(tc.in); got != tc.want {
			t.Errorf("blkName(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// Names outside the grammar are hashed: the same name always gives
	// the same blk name, different names different ones, each a valid
	// volume ID.
	seen := map[string]string{}
	for _, in := range []string{strings.Repeat("a", 129), "-leading-dash", "has space", "a/b", "ünïcode", ".", ".."} {
		got := blkName(in)
		if got != blkName(in) || !strings.HasPrefix(got, hashedPrefix) || len(got) != len(hashedPrefix)+32 {
			t.Errorf("blkName(%q) = %q: not a stable csi-<32 hex>", in, got)
		}
		if err := checkVolumeID(got); err != nil {
			t.Errorf("blkName(%q) = %q: %v", in, got, err)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("blkName(%q) = blkName(%q) = %q", in, prev, got)
		}
		seen[got] = in
	}
}

func TestSnapshotID(t *testing.T) {
	vol, snap, err := parseSnapshotID(snapshotID("pvc-1", "snap-1"))
	if err != nil || vol != "pvc-1" || snap != "snap-1" {
		t.Fatalf("round trip: %q %q %v", vol, snap, err)
	}
	for _, bad := range []string{"", "nosep", "/snap", "vol/", "vol/a/b", "v ol/s", "vol/-s"} {
		if _, _, err := parseSnapshotID(bad); !errors.Is(err, errBadID) {
			t.Errorf("parseSnapshotID(%q): %v; want errBadID", bad, err)
		}
	}
}
