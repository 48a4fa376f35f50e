package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/target/volume"
)

// TestUpgradeFromVolumeStore: a node whose data dir was written by the
// release before issue 22 (the registry as today, the volumes in
// target/volume's one-key-per-block pebble layout) starts on the extent
// store: Open migrates the volumes in place, saying so in the log, and
// the host reads the same bytes through NVMe/TCP with blk's initiator;
// a second start does not migrate again and serves them still.
func TestUpgradeFromVolumeStore(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	dir := t.TempDir()

	// The registry: a volume of 8 MiB (4 KiB blocks) and a 512-byte one.
	d := startBlkd(t, dir)
	var big, small volumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "old", "size": "8MiB"}`, 201, &big)
	d.must(t, "POST", "/v1/volumes", `{"name": "old512", "size": "1MiB", "block_size": 512}`, 201, &small)
	for _, n := range []string{"old", "old512"} {
		d.must(t, "POST", "/v1/volumes/"+n+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	}
	d.stop(t)

	// The volumes, as the previous release's store wrote them: the new
	// store's files are removed and target/volume's written in their
	// place, holding whole runs, scattered blocks, the last block.
	storeDir := filepath.Join(dir, "volumes")
	for _, p := range []string{storeDir, storeDir + ".area"} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	old, err := volume.Open(volume.Config{Dir: storeDir})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"old": make([]byte, 8<<20), "old512": make([]byte, 1<<20)}
	for _, v := range []struct {
		j  volumeJSON
		bs int
	}{{big, 4096}, {small, 512}} {
		img := want[v.j.Name]
		vol, err := old.Create(volume.ID(v.j.ID), volume.CreateOptions{SizeBytes: uint64(len(img)), BlockSize: uint32(v.bs)})
		if err != nil {
			t.Fatal(err)
		}
		blocks := len(img) / v.bs
		put := func(lba, n int) {
			b := img[lba*v.bs : (lba+n)*v.bs]
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			if err := vol.Write(uint64(lba), b, 0); err != nil {
				t.Fatal(err)
			}
		}
		put(0, 64)          // a run from the start
		put(blocks-1, 1)    // the last block
		put(blocks/2-3, 40) // a run across the middle
		for range 50 {      // scattered blocks
			put(rng.IntN(blocks), 1)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	readAll := func(d *daemon, name string) []byte {
		var a attachJSON
		d.must(t, "POST", "/v1/volumes/"+name+"/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
		if a.Transport != "tcp" {
			t.Fatalf("attach of %s: transport %q, want tcp", name, a.Transport)
		}
		ctrl, ns := connect(t, a)
		defer func() {
			ctrl.Close()
			d.must(t, "POST", "/v1/volumes/"+name+"/detach", `{"host_nqn": "`+hostNQN+`"}`, 204, nil)
		}()
		got := make([]byte, len(want[name]))
		for off := 0; off < len(got); off += 128 << 10 {
			if _, err := ns.ReadAt(got[off:off+128<<10], int64(off)); err != nil {
				t.Fatalf("read %s at %d: %v", name, off, err)
			}
		}
		return got
	}
	check := func(d *daemon, when string) {
		for _, name := range []string{"old", "old512"} {
			if got := readAll(d, name); !bytes.Equal(got, want[name]) {
				i := 0
				for got[i] == want[name][i] {
					i++
				}
				t.Fatalf("%s: volume %s differs from what the previous release wrote, first at byte %d (seed %d)", when, name, i, seed)
			}
		}
	}

	d = startBlkd(t, dir)
	out := d.output()
	for _, line := range []string{"from target/volume's layout: 2 volumes to migrate", fmt.Sprintf("upgrade: volume %d done", big.ID), "done: 2 volumes"} {
		if !strings.Contains(out, line) {
			t.Errorf("the start's log lacks %q:\n%s", line, out)
		}
	}
	if fi, err := os.Stat(storeDir + ".area"); err != nil || fi.Size() < 9<<20 {
		t.Fatalf("data area after the upgrade: %v, %v", fi, err)
	}
	check(d, "after the upgrade")
	d.stop(t)

	d = startBlkd(t, dir)
	if strings.Contains(d.output(), "to migrate") {
		t.Errorf("second start migrated again:\n%s", d.output())
	}
	check(d, "after a restart")
}
