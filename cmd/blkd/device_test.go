package main

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/loopdev"
)

// loopDevice is loopdev.Attach.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	return loopdev.Attach(t, size)
}

// TestDataDevice: blkd --data-device keeps the volumes' data on a block
// device (a loop device here): the start's log says so and how large it
// is, no area file is made, a host writes through NVMe/TCP with blk's
// initiator and reads the same bytes after a restart. A second blkd on
// the device while the first runs, a new data dir on the device without
// --data-device-wipe, and the data dir started without its device are
// each refused with exit 1 and a message saying why. Reads go to the
// device through the asynchronous path.
func TestDataDevice(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	const devBytes = 64 << 20
	dev := loopDevice(t, devBytes)
	dir := t.TempDir()

	d := startBlkd(t, dir, "--data-device", dev)
	out := d.output()
	if !strings.Contains(out, "volume store opened") || !strings.Contains(out, "area="+dev) ||
		!strings.Contains(out, `area_kind="block device"`) || !strings.Contains(out, "area_bytes=67108864") {
		t.Fatalf("the start's log does not say the store is on %s (64 MiB):\n%s", dev, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "volumes.area")); !os.IsNotExist(err) {
		t.Fatalf("a data area file was made beside a device store: %v", err)
	}

	// Another node's data dir on the same device while this one runs.
	if out, code := runBlkd(t, "--data-dir", t.TempDir(), "--data-device", dev, "--api-addr", freeAddr(t), "--raft-addr", freeAddr(t),
		"--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t)); code != 1 || !strings.Contains(out, "is in use") {
		t.Fatalf("a second blkd on a device in use: exit %d, want 1 saying it is in use:\n%s", code, out)
	}

	var v volumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "ondev", "size": "8MiB"}`, 201, &v)
	d.must(t, "POST", "/v1/volumes/ondev/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	want := make([]byte, 8<<20)
	rw := func(d *daemon, write bool) []byte {
		var a attachJSON
		d.must(t, "POST", "/v1/volumes/ondev/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
		if a.Transport != "tcp" {
			t.Fatalf("attach: transport %q, want tcp", a.Transport)
		}
		ctrl, ns := connect(t, a)
		defer func() {
			ctrl.Close()
			d.must(t, "POST", "/v1/volumes/ondev/detach", `{"host_nqn": "`+hostNQN+`"}`, 204, nil)
		}()
		if write {
			for _, r := range []struct{ off, n int }{{0, 256 << 10}, {3<<20 + 4096, 64 << 10}, {len(want) - 4096, 4096}} {
				b := want[r.off : r.off+r.n]
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				if _, err := ns.WriteAt(b, int64(r.off)); err != nil {
					t.Fatalf("write at %d: %v", r.off, err)
				}
			}
			if err := ns.Flush(); err != nil {
				t.Fatal(err)
			}
			return nil
		}
		got := make([]byte, len(want))
		for off := 0; off < len(got); off += 128 << 10 {
			if _, err := ns.ReadAt(got[off:off+128<<10], int64(off)); err != nil {
				t.Fatalf("read at %d: %v", off, err)
			}
		}
		return got
	}
	rw(d, true)
	d.stop(t)

	// The data dir without its device, then a new data dir on the device
	// without the wipe confirmation: both refused, nothing changed.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--data-dir", dir}, "was created on the block device " + dev},
		{[]string{"--data-dir", t.TempDir(), "--data-device", dev}, "holds a blk store's data area"},
		{[]string{"--data-dir", t.TempDir(), "--data-device", dev, "--data-device-wipe", "/dev/other"}, "does not repeat --data-device"},
	} {
		args := append(c.args, "--api-addr", freeAddr(t), "--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t))
		if out, code := runBlkd(t, args...); code != 1 || !strings.Contains(out, c.want) {
			t.Fatalf("blkd %v: exit %d, want 1 saying %q:\n%s", c.args, code, c.want, out)
		}
	}

	d = startBlkd(t, dir, "--data-device", dev)
	if got := rw(d, false); !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("after a restart the volume differs from what was written, first at byte %d (seed %d)", i, seed)
	}
	// The reads went straight to the device through the poll groups'
	// asynchronous engine (the device's descriptor, O_DIRECT), not only
	// through the store's synchronous path.
	if n := d.metric(t, "blk_store_io_direct_requests_total"); n == 0 {
		t.Errorf("no request went to the device asynchronously (blk_store_io_direct_requests_total %v)", n)
	}
	if n := d.metric(t, "blk_store_io_engine_errors_total"); n != 0 {
		t.Errorf("blk_store_io_engine_errors_total %v on a device", n)
	}
	d.stop(t)
}
