package main

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blk-project/blk/internal/image"
	"github.com/blk-project/blk/internal/testseed"
)

// TestExportImportUsage: what blkctl refuses before it asks blkd.
func TestExportImportUsage(t *testing.T) {
	diff := filepath.Join(t.TempDir(), "d.img")
	var b bytes.Buffer
	w, err := image.NewWriter(&b, image.Header{Cluster: "c", Volume: "v", Snapshot: "s2", SnapshotID: 3, SizeBytes: 1 << 20, BlockSize: 4096, Base: &image.Base{Name: "s1", ID: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(diff, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"volume", "export", "v w", "f"}, "VOLUME"},
		{[]string{"volume", "export", "v@s", "f", "--format", "qcow2"}, "use blk or raw"},
		{[]string{"volume", "export", "v@s", "f", "--since", "s0", "--format", "raw"}, "whole volume"},
		{[]string{"volume", "export", "v@s", "f", "--since", "w@s0"}, "snapshot of w, not of v"},
		{[]string{"volume", "import", diff, "w"}, "holds the changes of v@s2 since v@s1"},
		{[]string{"volume", "import", filepath.Join(t.TempDir(), "none"), "w"}, "no such file"},
	} {
		code, out, errs := runIn(append([]string{"--api", "127.0.0.1:1"}, c.args...)...)
		if code == 0 || !strings.Contains(out+errs, c.want) {
			t.Errorf("%v: exit %d: %s%s, want an error saying %q", c.args, code, out, errs, c.want)
		}
	}
}

// TestWriteRaw: a whole image written raw to a file (seeking over
// holes) and to a pipe-like writer (zeros written) gives the same bytes,
// which are the image's content.
func TestWriteRaw(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "./cmd/blkctl/"), 5))
	const bs, blocks = 512, 300
	want := make([]byte, bs*blocks)
	type ext struct{ lba, n uint64 }
	var es []ext
	var data uint64
	for lba := rng.Uint64N(3); lba < blocks; {
		n := 1 + rng.Uint64N(min(blocks-lba, 20))
		es = append(es, ext{lba, n})
		for i := lba * bs; i < (lba+n)*bs; i++ {
			want[i] = byte(rng.Uint32())
		}
		data += n * bs
		lba += n + rng.Uint64N(30)
	}
	var img bytes.Buffer
	w, err := image.NewWriter(&img, image.Header{Volume: "v", Snapshot: "s", SnapshotID: 1, SizeBytes: bs * blocks, BlockSize: bs, DataBytes: data})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if err := w.Data(e.lba, want[e.lba*bs:(e.lba+e.n)*bs]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var pipe bytes.Buffer
	if _, err := writeRaw(bytes.NewReader(img.Bytes()), &pipe); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pipe.Bytes(), want) {
		t.Fatal("raw to a writer: not the image's content")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "v.raw"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := writeRaw(bytes.NewReader(img.Bytes()), f); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("raw to a file: not the image's content")
	}
	// A damaged image is an error, not a file.
	bad := bytes.Clone(img.Bytes())
	bad[len(bad)-1] ^= 1
	if _, err := writeRaw(bytes.NewReader(bad), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("raw of a damaged image: %v", err)
	}
}
