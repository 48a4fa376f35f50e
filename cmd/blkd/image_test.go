package main

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/internal/image"
	"github.com/blk-project/blk/internal/testseed"
)

var (
	blkctlOnce sync.Once
	blkctlBin  string
	blkctlErr  error
)

// blkctlBinary builds blkctl once, beside blkd's test binary.
func blkctlBinary(t *testing.T) string {
	t.Helper()
	blkctlOnce.Do(func() {
		blkctlBin = filepath.Join(filepath.Dir(binary), "blkctl")
		out, err := exec.Command("go", "build", "-o", blkctlBin, "../blkctl").CombinedOutput()
		if err != nil {
			blkctlErr = err
			blkctlBin = string(out)
		}
	})
	if blkctlErr != nil {
		t.Fatalf("build blkctl: %v: %s", blkctlErr, blkctlBin)
	}
	return blkctlBin
}

// blkctl runs blkctl against d; it returns the exit status and the
// output (stdout then stderr).
func blkctl(t *testing.T, d *daemon, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(blkctlBinary(t), append([]string{"--api", d.api}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("blkctl %v: %v", args, err)
	}
	return code, out.String() + errb.String()
}

func mustBlkctl(t *testing.T, d *daemon, args ...string) string {
	t.Helper()
	code, out := blkctl(t, d, args...)
	if code != 0 {
		t.Fatalf("blkctl %s: exit %d: %s", strings.Join(args, " "), code, out)
	}
	return out
}

// readAll reads the whole namespace, in pieces a command carries.
func readAll(t *testing.T, ns *initiator.Namespace, size int) []byte {
	t.Helper()
	b := make([]byte, size)
	for off := 0; off < size; off += 128 << 10 {
		if _, err := ns.ReadAt(b[off:min(off+128<<10, size)], int64(off)); err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
	}
	return b
}

func sameBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("%s: byte %d is %#x, want %#x", what, i, got[i], want[i])
	}
}

// TestExportImport: a volume's snapshots exported whole, as a diff and
// raw through blkctl, imported into a new volume (whole, then the diff
// onto the first import's snapshot), every byte read back through
// NVMe/TCP equal to what was written; a raw file equal byte for byte and
// sparse; a damaged image refused by its checksum; the refusals of the
// routes.
func TestExportImport(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "./cmd/blkd/"), 24))
	const mib = 1 << 20
	const size = 16 * mib
	dir := t.TempDir()
	d := startBlkd(t, dir)
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "16MiB", "replicas": 1}`, 201, nil)
	ctrl, ns := attachNS(t, d, "v")

	// The model: what v reads.
	model := make([]byte, size)
	write := func(off, n int) {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		mustWrite(t, ns, int64(off), p)
		copy(model[off:], p)
	}
	write(0, mib+4096)         // a run longer than a chunk of the export
	write(5*mib+4096*3, 4096)  // inside a cluster
	write(8*mib, 256<<10)      // zeroed after s1
	write(size-64<<10, 64<<10) // the last cluster
	write(12*mib+rng.IntN(64)*4096, 4096)
	d.must(t, "POST", "/v1/volumes/v/snapshots", `{"name": "s1"}`, 201, nil)
	s1 := bytes.Clone(model)

	write(4096, 8192)
	write(10*mib, 3*4096)
	if err := ns.WriteZeroes(8*mib/4096, 256<<10/4096); err != nil {
		t.Fatal(err)
	}
	clear(model[8*mib : 8*mib+256<<10])
	d.must(t, "POST", "/v1/volumes/v/snapshots", `{"name": "s2"}`, 201, nil)
	s2 := bytes.Clone(model)
	write(0, 4096) // after s2: no export carries it

	out := t.TempDir()
	full, diff, raw := filepath.Join(out, "s1.img"), filepath.Join(out, "s2-since-s1.img"), filepath.Join(out, "s2.raw")
	mustBlkctl(t, d, "volume", "export", "v@s1", full, "--progress")
	mustBlkctl(t, d, "volume", "export", "v@s2", diff, "--since", "v@s1")
	mustBlkctl(t, d, "volume", "export", "v@s2", raw, "--format", "raw")

	// The raw file is s2, byte for byte, and sparse.
	rb, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "raw export of v@s2", rb, s2)
	if fi, err := os.Stat(raw); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Blocks*512 >= size/2 {
			t.Errorf("raw export: %d bytes allocated of %d: the holes were written", st.Blocks*512, size)
		}
	}
	// The diff holds the changed clusters only (two of 64 KiB, the
	// store's unit of copy-on-write), the zeroed ones as a zero record.
	hd := readImageFile(t, diff)
	if hd.Base == nil || hd.Base.Name != "s1" || hd.DataBytes < 8192+3*4096 || hd.DataBytes > 2*64<<10 || hd.zeros == 0 {
		t.Fatalf("diff image: base %+v, %d data bytes, %d zero records; want base s1, %d to %d data bytes, a zero record", hd.Base, hd.DataBytes, hd.zeros, 8192+3*4096, 2*64<<10)
	}

	// Import whole into w, then the diff onto w@s1.
	o := mustBlkctl(t, d, "volume", "import", full, "w")
	if !strings.Contains(o, "snapshot w@s1") {
		t.Fatalf("import: %s", o)
	}
	var ws snapshotJSON
	d.must(t, "GET", "/v1/volumes/w/snapshots/s1", "", 200, &ws)
	wctrl, wns := attachNS(t, d, "w")
	sameBytes(t, "w after the import of v@s1", readAll(t, wns, size), s1)
	// An import needs no host connected.
	hdr, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	d.refuse(t, "PUT", "/v1/volumes/w/import", string(hdr[:image.HeaderSize]), 409, `connected.*disconnect`)
	if code, o := blkctl(t, d, "volume", "import", diff, "w", "--base", "s1"); code == 0 || !strings.Contains(o, "connected") {
		t.Fatalf("import with a host connected: exit %d: %s", code, o)
	}
	detachNS(t, d, "w", wctrl)
	mustWrite(t, ns, 0, pattern('x', 4096)) // v moves on; w does not care
	mustBlkctl(t, d, "volume", "import", diff, "w", "--base", "s1")
	wctrl, wns = attachNS(t, d, "w")
	sameBytes(t, "w after the diff v@s1..s2", readAll(t, wns, size), s2)
	d.must(t, "GET", "/v1/volumes/w/snapshots/s2", "", 200, &ws)
	if code, o := blkctl(t, d, "volume", "import", diff, "w", "--base", "s1"); code == 0 || !strings.Contains(o, "imported already") {
		t.Fatalf("the same diff again: exit %d: %s", code, o)
	}
	detachNS(t, d, "w", wctrl)

	// A damaged image: one data byte changed. The import fails by the
	// checksum, says so, and leaves the volume as written.
	img, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	img[image.HeaderSize+image.RecordSize+rng.IntN(4096)] ^= 0x40
	bad := filepath.Join(out, "bad.img")
	if err := os.WriteFile(bad, img, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, o := blkctl(t, d, "volume", "import", bad, "x"); code == 0 || !strings.Contains(o, "checksum") || !strings.Contains(o, "left as written") || !strings.Contains(o, "blkctl volume delete x") {
		t.Fatalf("import of a damaged image: exit %d: %s", code, o)
	}
	d.refuse(t, "GET", "/v1/volumes/x/snapshots/s1", "", 404, `unknown snapshot`)

	// Refusals.
	d.refuse(t, "PUT", "/v1/volumes/w/import", string(img[:image.HeaderSize]), 409, `holds data.*new one`)
	d.refuse(t, "PUT", "/v1/volumes/w/import", "garbage", 400, `image`)
	d.refuse(t, "GET", "/v1/volumes/v/snapshots/s1/export?since=s2", "", 409, `not an earlier snapshot`)
	d.refuse(t, "GET", "/v1/volumes/v/snapshots/s1/export?since=s1", "", 400, `itself`)
	d.refuse(t, "GET", "/v1/volumes/v/snapshots/nope/export", "", 404, `unknown snapshot`)

	// export VOL takes a snapshot for the export and deletes it after.
	now := filepath.Join(out, "now.raw")
	if o := mustBlkctl(t, d, "volume", "export", "v", now, "--format", "raw"); !strings.Contains(o, "took snapshot v@export-") {
		t.Fatalf("export v: %s", o)
	}
	copy(model, pattern('x', 4096))
	if rb, err = os.ReadFile(now); err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "raw export of v", rb, model)
	var l struct {
		Snapshots []snapshotJSON `json:"snapshots"`
	}
	d.must(t, "GET", "/v1/volumes/v/snapshots", "", 200, &l)
	if len(l.Snapshots) != 2 {
		t.Fatalf("v's snapshots after export v: %+v, want s1 and s2 only", l.Snapshots)
	}
	ctrl.Close()
}

// imageInfo is an image file's header and its count of zero records.
type imageInfo struct {
	image.Header
	zeros int
}

func readImageFile(t *testing.T, path string) imageInfo {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := image.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	info := imageInfo{Header: r.Header()}
	for {
		rec, err := r.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return info
			}
			t.Fatalf("%s: %v", path, err)
		}
		if rec.Kind == image.KindZero {
			info.zeros++
		}
	}
}
