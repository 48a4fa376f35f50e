package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The upgrade fixture, testdata/volumes-v1 (README there), is the
// volumes directory of a node of the release before issue 22: pebble in
// target/volume's one-key-per-block layout, written by that release's code
// and committed. It holds upgradeVolumes, each written by upgradeWrites in
// order with fixtureBlock's contents, so the test knows every byte.
const upgradeFixture = "testdata/volumes-v1"

// upgradeVolumes are the fixture's volumes: the IDs a fresh registry
// gives the test's first two volumes.
var upgradeVolumes = []struct {
	id, size uint64
	bs       uint32
	name     string
}{{1, 8 << 20, 4096, "old"}, {2, 1 << 20, 512, "old512"}}

type upgradeWrite struct{ lba, n uint64 }

// upgradeWrites are the writes to a volume of blocks blocks, in order:
// whole runs, the last block, a run across the middle, scattered blocks
// (some landing on earlier runs: overwrites).
func upgradeWrites(blocks uint64) []upgradeWrite {
	w := []upgradeWrite{{0, 64}, {blocks - 1, 1}, {blocks/2 - 3, 40}}
	for k := range uint64(50) {
		w = append(w, upgradeWrite{(k*7919 + 13) % blocks, 1})
	}
	return w
}

// fixtureBlock fills dst, one block, with a record of 61 bytes (a prime:
// no block or sector shift maps it onto itself) derived from the volume,
// the block and the write that wrote it, repeated: unique to that write
// of that block, and small once git compresses it.
func fixtureBlock(dst []byte, id, lba, gen uint64) {
	var rec [61]byte
	x := id<<48 ^ lba<<8 ^ gen
	for i := range rec {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		rec[i] = byte(x >> 32)
	}
	for i := 0; i < len(dst); i += len(rec) {
		copy(dst[i:], rec[:])
	}
}

// upgradeImages is what each fixture volume must read, by name.
func upgradeImages() map[string][]byte {
	want := map[string][]byte{}
	for _, uv := range upgradeVolumes {
		img := make([]byte, uv.size)
		bs := uint64(uv.bs)
		for k, w := range upgradeWrites(uv.size / bs) {
			for i := w.lba; i < w.lba+w.n; i++ {
				fixtureBlock(img[i*bs:(i+1)*bs], uv.id, i, uint64(k+1))
			}
		}
		want[uv.name] = img
	}
	return want
}

// TestUpgradeFromVolumeStore: a node whose data dir was written by the
// release before issue 22 (the registry as today, the volumes in
// target/volume's one-key-per-block pebble layout, from the fixture)
// starts on the extent store: Open migrates the volumes in place, saying
// so in the log, and the host reads the same bytes through NVMe/TCP with
// blk's initiator; a second start does not migrate again and serves them
// still.
func TestUpgradeFromVolumeStore(t *testing.T) {
	dir := t.TempDir()

	// The registry: a volume of 8 MiB (4 KiB blocks) and a 512-byte one,
	// the fixture's.
	d := startBlkd(t, dir)
	for _, uv := range upgradeVolumes {
		var v volumeJSON
		body := fmt.Sprintf(`{"name": %q, "size": "%dMiB", "block_size": %d}`, uv.name, uv.size>>20, uv.bs)
		d.must(t, "POST", "/v1/volumes", body, 201, &v)
		if v.ID != uv.id {
			t.Fatalf("volume %s got ID %d, the fixture's is %d", uv.name, v.ID, uv.id)
		}
		d.must(t, "POST", "/v1/volumes/"+uv.name+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	}
	d.stop(t)

	// The volumes, as the previous release's store wrote them: the new
	// store's files are removed and the fixture copied in their place.
	storeDir := filepath.Join(dir, "volumes")
	for _, p := range []string{storeDir, storeDir + ".area"} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	copyDir(t, upgradeFixture, storeDir)
	want := upgradeImages()

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
				t.Fatalf("%s: volume %s differs from what the previous release wrote, first at byte %d", when, name, i)
			}
		}
	}

	d = startBlkd(t, dir)
	out := d.output()
	for _, line := range []string{"from target/volume's layout: 2 volumes to migrate", fmt.Sprintf("upgrade: volume %d done", upgradeVolumes[0].id), "done: 2 volumes"} {
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

// copyDir copies the files of src into a new directory dst (the fixture
// is flat; pebble rewrites what it opens, so the test works on a copy).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatalf("the upgrade fixture: %v", err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			t.Fatalf("the upgrade fixture: %s is not a plain file", e.Name())
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
