package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
)

type snapshotJSON struct {
	Name           string   `json:"name"`
	Volume         string   `json:"volume"`
	ID             uint64   `json:"id"`
	SizeBytes      uint64   `json:"size_bytes"`
	State          string   `json:"state"`
	Nodes          []string `json:"nodes"`
	Clones         []string `json:"clones"`
	OwnedBytes     *uint64  `json:"owned_bytes"`
	ExclusiveBytes *uint64  `json:"exclusive_bytes"`
}

type snapVolumeJSON struct {
	volumeJSON
	Snapshots []string `json:"snapshots"`
	CloneOf   string   `json:"clone_of"`
	Epoch     uint64   `json:"epoch"`
	Flatten   *struct {
		DoneBytes  uint64 `json:"done_bytes"`
		TotalBytes uint64 `json:"total_bytes"`
	} `json:"flatten"`
	OwnedBytes *uint64 `json:"owned_bytes"`
}

// attachNS allows hostNQN on vol, attaches it and connects.
func attachNS(t *testing.T, d *daemon, vol string) (*initiator.Controller, *initiator.Namespace) {
	t.Helper()
	var v volumeJSON
	d.must(t, "POST", "/v1/volumes/"+vol+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, &v)
	var a attachJSON
	d.must(t, "POST", "/v1/volumes/"+vol+"/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	return connect(t, a)
}

// detachNS closes the controller and removes the attachment.
func detachNS(t *testing.T, d *daemon, vol string, ctrl *initiator.Controller) {
	t.Helper()
	ctrl.Close()
	d.must(t, "POST", "/v1/volumes/"+vol+"/detach", `{"host_nqn": "`+hostNQN+`"}`, 204, nil)
	// The target tears the controller down after the socket closes.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if code, msg := d.call(t, "POST", "/v1/volumes/"+vol+"/revert", `{"snapshot": "no-such-snapshot"}`, nil); code == 404 || !strings.Contains(msg, "connected") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("volume %s still shows a connected host 10 s after the controller closed", vol)
}

func pattern(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

func mustRead(t *testing.T, ns *initiator.Namespace, off int64, want []byte, what string) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := ns.ReadAt(got, off); err != nil {
		t.Fatalf("%s: read at %d: %v", what, off, err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: at %d+%d read %#x, want %#x", what, off, i, got[i], want[i])
	}
}

func mustWrite(t *testing.T, ns *initiator.Namespace, off int64, data []byte) {
	t.Helper()
	if _, err := ns.WriteAt(data, off); err != nil {
		t.Fatalf("write at %d: %v", off, err)
	}
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotAPI runs snapshots and clones through one blkd: every
// route, what each object reads, the refusals and their messages, and a
// restart keeping them all.
func TestSnapshotAPI(t *testing.T) {
	dir := t.TempDir()
	d := startBlkd(t, dir)
	var v snapVolumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "16MiB", "replicas": 1}`, 201, &v)
	ctrl, ns := attachNS(t, d, "v")

	// A: 1 MiB at 0 and 64 KiB at 8 MiB, then the snapshot.
	const mib = 1 << 20
	mustWrite(t, ns, 0, pattern('A', mib))
	mustWrite(t, ns, 8*mib, pattern('a', 64<<10))
	var s snapshotJSON
	d.must(t, "POST", "/v1/volumes/v/snapshots", `{"name": "s1"}`, 201, &s)
	if s.Name != "s1" || s.Volume != "v" || s.State != "ready" || s.SizeBytes != 16*mib || len(s.Nodes) != 1 {
		t.Fatalf("snapshot: %+v", s)
	}
	// B over the first half MiB: the snapshot keeps A.
	mustWrite(t, ns, 0, pattern('B', mib/2))
	mustRead(t, ns, 0, append(pattern('B', mib/2), pattern('A', mib/2)...), "v after the snapshot")

	// Refusals.
	d.refuse(t, "POST", "/v1/volumes/v/snapshots", `{"name": "s1"}`, 409, `v@s1 exists: choose another name`)
	d.refuse(t, "POST", "/v1/volumes/v/snapshots", `{"name": "a@b"}`, 400, `snapshot name`)
	d.refuse(t, "POST", "/v1/volumes/v/snapshots", `{}`, 400, `missing "name"`)
	d.refuse(t, "POST", "/v1/volumes/nope/snapshots", `{"name": "x"}`, 404, `unknown volume`)
	d.refuse(t, "GET", "/v1/volumes/v/snapshots/nope", "", 404, `v@nope.*unknown snapshot`)
	d.refuse(t, "DELETE", "/v1/volumes/v/snapshots/nope", "", 404, `unknown snapshot`)
	d.refuse(t, "POST", "/v1/volumes/v/snapshots/nope/clone", `{"name": "c"}`, 404, `unknown snapshot`)
	d.refuse(t, "POST", "/v1/volumes/v/snapshots/s1/clone", `{"name": "v"}`, 409, `already in use`)
	d.refuse(t, "POST", "/v1/volumes/v/flatten", "", 409, `not a clone`)
	d.refuse(t, "POST", "/v1/volumes/v/revert", `{"snapshot": "s1"}`, 409, `connected`)
	d.refuse(t, "DELETE", "/v1/volumes/v?force=true", "", 409, `snapshots v@s1.*snapshots=true`)

	// The listing, with the space the primary counts.
	var l struct {
		Snapshots []snapshotJSON `json:"snapshots"`
	}
	d.must(t, "GET", "/v1/volumes/v/snapshots", "", 200, &l)
	if len(l.Snapshots) != 1 || l.Snapshots[0].OwnedBytes == nil || l.Snapshots[0].ExclusiveBytes == nil {
		t.Fatalf("list: %+v", l)
	}
	if ex := *l.Snapshots[0].ExclusiveBytes; ex < mib/2 || ex > mib {
		t.Fatalf("s1 holds %d bytes exclusively after half a MiB was rewritten, want [512 KiB, 1 MiB]", ex)
	}

	// A clone reads the snapshot and is written on its own.
	var c snapVolumeJSON
	d.must(t, "POST", "/v1/volumes/v/snapshots/s1/clone", `{"name": "c1"}`, 201, &c)
	if c.CloneOf != "v@s1" || c.SizeBytes != 16*mib || c.State != "online" {
		t.Fatalf("clone: %+v", c)
	}
	cctrl, cns := attachNS(t, d, "c1")
	mustRead(t, cns, 0, pattern('A', mib), "c1")
	mustRead(t, cns, 8*mib, pattern('a', 64<<10), "c1 at 8 MiB")
	mustWrite(t, cns, 4096, pattern('C', 8192))
	mustRead(t, ns, 0, append(pattern('B', mib/2), pattern('A', mib/2)...), "v after c1 was written")
	d.refuse(t, "DELETE", "/v1/volumes/v/snapshots/s1", "", 409, `v@s1.*clones c1.*flatten`)
	if n := d.metric(t, "blk_volume_store_copies_on_write_total"); n < 2 {
		t.Fatalf("blk_volume_store_copies_on_write_total %v after writes over v's and c1's shared clusters, want at least 2", n)
	}
	if n := d.metric(t, "blk_snapshot_disk_bytes"); n < mib {
		t.Fatalf("blk_snapshot_disk_bytes %v, want at least the MiB s1 holds", n)
	}

	// Revert once the host is gone: v reads A again.
	detachNS(t, d, "v", ctrl)
	var rv snapVolumeJSON
	d.must(t, "POST", "/v1/volumes/v/revert", `{"snapshot": "s1"}`, 200, &rv)
	if rv.Epoch != v.Epoch+1 {
		t.Fatalf("revert: epoch %d, was %d", rv.Epoch, v.Epoch)
	}
	ctrl, ns = attachNS(t, d, "v")
	mustRead(t, ns, 0, pattern('A', mib), "v after the revert")

	// Flatten the clone under writes; then s1 has one child and goes.
	d.must(t, "POST", "/v1/volumes/c1/flatten", "", 202, &c)
	mustWrite(t, cns, 2*mib, pattern('D', 4096))
	deadline := time.Now().Add(30 * time.Second)
	for c.CloneOf != "" {
		if time.Now().After(deadline) {
			t.Fatalf("c1 not flat after 30 s: %+v", c)
		}
		time.Sleep(100 * time.Millisecond)
		c = snapVolumeJSON{} // fields the answer omits must not keep old values
		d.must(t, "GET", "/v1/volumes/c1", "", 200, &c)
	}
	want := pattern('A', mib)
	copy(want[4096:], pattern('C', 8192))
	mustRead(t, cns, 0, want, "c1 after the flatten")
	mustRead(t, cns, 2*mib, pattern('D', 4096), "c1's write during the flatten")
	d.must(t, "DELETE", "/v1/volumes/v/snapshots/s1", "", 204, nil)
	mustRead(t, ns, 0, pattern('A', mib), "v after s1 was deleted")
	mustRead(t, cns, 0, want, "c1 after s1 was deleted")

	// Snapshots survive a restart; delete with ?snapshots=true takes them.
	mustWrite(t, ns, 0, pattern('E', 4096))
	d.must(t, "POST", "/v1/volumes/v/snapshots", `{"name": "s2"}`, 201, &s)
	mustWrite(t, ns, 0, pattern('F', 4096))
	ctrl.Close()
	cctrl.Close()
	d.stop(t)
	d = startBlkd(t, dir)
	d.must(t, "GET", "/v1/volumes/v/snapshots/s2", "", 200, &s)
	d.must(t, "POST", "/v1/volumes/v/snapshots/s2/clone", `{"name": "c2"}`, 201, &c)
	var a attachJSON
	d.must(t, "POST", "/v1/volumes/c2/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	d.must(t, "POST", "/v1/volumes/c2/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	c2ctrl, c2 := connect(t, a)
	mustRead(t, c2, 0, pattern('E', 4096), "c2 (of s2, after a restart)")
	c2ctrl.Close()
	d.refuse(t, "DELETE", "/v1/volumes/v?force=true&snapshots=true", "", 409, `clones c2`)
	d.must(t, "DELETE", "/v1/volumes/c2?force=true", "", 204, nil)
	d.must(t, "DELETE", "/v1/volumes/v?force=true&snapshots=true", "", 204, nil)
	d.must(t, "DELETE", "/v1/volumes/c1?force=true", "", 204, nil)
	if vols := d.volumes(t); len(vols) != 0 {
		t.Fatalf("volumes left: %+v", vols)
	}
}
