package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/blk-project/blk/target/volume"
)

// TestHugeResizeRefused: `resize --size 4194305TiB` wrote 4 EiB into the
// registry, failed in the store, and blkd then refused to start. Now the
// size is checked against the store before the registry changes: 400, the
// volume unchanged, and the node restarts serving it.
func TestHugeResizeRefused(t *testing.T) {
	dir := t.TempDir()
	d := startBlkd(t, dir)
	var v volumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "rv", "size": "16MiB"}`, 201, &v)
	d.refuse(t, "POST", "/v1/volumes/rv/resize", `{"size": "4194305TiB"}`, 400, `more than the largest volume the store holds`)
	d.refuse(t, "POST", "/v1/volumes", `{"name": "big", "size": "4194305TiB"}`, 400, `more than the largest volume the store holds`)
	d.must(t, "GET", "/v1/volumes/rv", "", 200, &v)
	if v.SizeBytes != 16<<20 || v.State != "online" {
		t.Fatalf("after a refused resize: %+v, want 16 MiB online", v)
	}
	d.stop(t)
	d = startBlkd(t, dir)
	d.must(t, "GET", "/v1/volumes/rv", "", 200, &v)
	if v.State != "online" {
		t.Fatalf("after restart: %+v", v)
	}
}

// TestMissingVolumeFailsAlone: a volume whose data is gone from the store
// (here deleted behind blkd's back with the store's own API) used to stop
// the whole node at start. Now the node starts, says which volume failed
// and why, marks it failed in the registry, and serves the others; the
// failed volume can be deleted.
func TestMissingVolumeFailsAlone(t *testing.T) {
	dir := t.TempDir()
	d := startBlkd(t, dir)
	var lost, kept volumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "lost", "size": "8MiB"}`, 201, &lost)
	d.must(t, "POST", "/v1/volumes", `{"name": "kept", "size": "8MiB"}`, 201, &kept)
	d.stop(t)

	s, err := volume.Open(volume.Config{Dir: filepath.Join(dir, "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(volume.ID(lost.ID)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	d = startBlkd(t, dir)
	if !strings.Contains(d.output(), `volume lost failed: the store has no volume`) {
		t.Errorf("start output does not name the failed volume:\n%s", d.output())
	}
	var v volumeJSON
	d.must(t, "GET", "/v1/volumes/lost", "", 200, &v)
	if v.State != "failed" || !strings.Contains(v.Reason, "the store has no volume") {
		t.Fatalf("lost: %+v, want failed with the reason", v)
	}
	d.must(t, "GET", "/v1/volumes/kept", "", 200, &v)
	if v.State != "online" {
		t.Fatalf("kept: %+v, want online", v)
	}
	var a attachJSON
	d.must(t, "POST", "/v1/volumes/kept/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	d.must(t, "POST", "/v1/volumes/kept/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	ctrl, ns := connect(t, a)
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = byte(i)
	}
	if _, err := ns.WriteAt(buf, 0); err != nil {
		t.Fatalf("write to the kept volume: %v", err)
	}
	ctrl.Close()
	d.must(t, "DELETE", "/v1/volumes/lost", "", 204, nil)
	d.refuse(t, "GET", "/v1/volumes/lost", "", 404, "unknown volume")
}

// TestOperatorErrors: the answers the issue found wrong, each with the
// status that names the problem: a second blkd on a data dir in use
// (it blamed --raft-addr), deleting a host the volume never allowed (200),
// removing an unknown node (200, blkctl exit 0), a wrong method (404).
func TestOperatorErrors(t *testing.T) {
	dir := t.TempDir()
	d := startBlkd(t, dir)
	out, code := runBlkd(t, "--data-dir", dir, "--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--api-addr", freeAddr(t))
	if code == 0 || !strings.Contains(out, "is in use by another blkd (pid") {
		t.Errorf("second blkd on the same data dir: exit %d, output:\n%s\nwant a non-zero exit naming the data dir in use", code, out)
	}
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "8MiB"}`, 201, nil)
	d.refuse(t, "DELETE", "/v1/volumes/v/hosts/"+hostNQN, "", 404, `does not allow host`)
	d.refuse(t, "POST", "/v1/cluster/remove", `{"node_id": "nobody"}`, 404, `no node "nobody"`)
	d.refuse(t, "PUT", "/v1/volumes", `{}`, 405, `use GET, POST`)
	d.refuse(t, "GET", "/v1/volumes/v/resize", "", 405, `use POST`)
	d.refuse(t, "GET", "/v1/nothing", "", 404, `no route`)
}
