package main

import (
	"regexp"
	"strings"
	"testing"
)

// TestSnapshotVerbs drives snapshots and clones through blkctl against
// one blkd: snapshot, snapshots (table and JSON), clone, the refusals
// and their hints, flatten --wait, revert, delete VOL@SNAP and delete
// --snapshots.
func TestSnapshotVerbs(t *testing.T) {
	api := startBlkd(t)
	ok(t, api, "volume", "create", "v", "--size", "64MiB", "--replicas", "1")
	ok(t, api, "host", "allow", "v", host)
	ok(t, api, "bench", "v", "--host-nqn", host, "--ios", "512", "--qd", "8", "--rw", "write", "--bs", "128KiB")

	out := ok(t, api, "volume", "snapshot", "v", "s1")
	if !regexp.MustCompile(`^snapshot v@s1: 64 MiB, taken in \S+ \(writes held \S+\), on node1\n$`).MatchString(out) {
		t.Fatalf("snapshot output %q", out)
	}
	out = ok(t, api, "volume", "snapshots", "v")
	if !regexp.MustCompile(`(?m)^NAME\s+SIZE\s+CREATED\s+STATE\s+OWNED\s+EXCLUSIVE\s+CLONES\s+NODES\n^s1\s+64 MiB\s+\S+\s+ready\s+64 MiB\s+0 B\s+-\s+node1$`).MatchString(out) {
		t.Fatalf("snapshots table:\n%s", out)
	}
	if out := ok(t, api, "volume", "verify", "v", "--snapshots"); !strings.Contains(out, "no difference") {
		t.Fatalf("verify --snapshots output %q", out)
	}
	fails(t, api, 2, `"v" is not a snapshot: name it VOLUME@SNAPSHOT`, "volume", "clone", "v", "c1")
	fails(t, api, 2, `snapshot name`, "volume", "clone", "v@", "c1")
	fails(t, api, 1, `v@nope.*unknown snapshot`, "volume", "clone", "v@nope", "c1")
	fails(t, api, 1, `v@s1 exists`, "volume", "snapshot", "v", "s1")
	out = ok(t, api, "volume", "clone", "v@s1", "c1")
	if !strings.Contains(out, "volume c1: clone of v@s1, 64 MiB, on node1") {
		t.Fatalf("clone output %q", out)
	}
	if show := ok(t, api, "-o", "json", "volume", "show", "c1"); !strings.Contains(show, `"clone_of": "v@s1"`) {
		t.Fatalf("show c1: %s", show)
	}
	fails(t, api, 1, `v@s1 has clones c1.*flatten`, "volume", "delete", "v@s1")
	fails(t, api, 1, `has snapshots v@s1.*blkctl volume delete v --snapshots`, "volume", "delete", "v")
	fails(t, api, 2, `--force and --snapshots are for volumes`, "volume", "delete", "v@s1", "--force")
	fails(t, api, 2, `v@s1 is a snapshot of volume v, not of c1`, "volume", "revert", "c1", "v@s1")
	fails(t, api, 1, `not a clone`, "volume", "flatten", "v")

	out = ok(t, api, "volume", "flatten", "c1", "--wait")
	if !strings.Contains(out, "volume c1 is flat: it no longer shares data with v@s1") {
		t.Fatalf("flatten --wait output %q", out)
	}
	if show := ok(t, api, "-o", "json", "volume", "show", "c1"); strings.Contains(show, "clone_of") {
		t.Fatalf("show c1 after the flatten: %s", show)
	}
	out = ok(t, api, "volume", "revert", "v", "s1")
	if !strings.Contains(out, "volume v reverted to v@s1 (64 MiB); epoch 2") {
		t.Fatalf("revert output %q", out)
	}
	ok(t, api, "volume", "delete", "v@s1")
	out = ok(t, api, "volume", "snapshots", "v")
	if !strings.Contains(out, "volume v has no snapshots") {
		t.Fatalf("snapshots after the delete: %q", out)
	}
	ok(t, api, "volume", "snapshot", "v", "s2")
	ok(t, api, "volume", "delete", "v", "--snapshots")
	ok(t, api, "volume", "delete", "c1")
	if out := ok(t, api, "volume", "list"); !strings.Contains(out, "no volumes") {
		t.Fatalf("list after the deletes:\n%s", out)
	}
}
