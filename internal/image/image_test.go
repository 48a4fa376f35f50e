package image

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/blk-project/blk/internal/testseed"
)

// extent is a record as a test writes and expects to read it.
type extent struct {
	kind Kind
	lba  uint64
	data []byte // data records
	n    uint64 // zero records: blocks
}

// randomImage builds a seeded random image: header and records.
func randomImage(rng *rand.Rand, maxBlocks uint64) (Header, []extent) {
	bs := uint32(512)
	if rng.IntN(2) == 0 {
		bs = 4096
	}
	blocks := 1 + rng.Uint64N(maxBlocks)
	h := Header{Cluster: "c-1", Volume: "v", Snapshot: "s2", SnapshotID: 7, SizeBytes: blocks * uint64(bs), BlockSize: bs}
	if rng.IntN(2) == 0 {
		h.Base = &Base{Name: "s1", ID: 3}
	}
	var es []extent
	for lba := rng.Uint64N(4); lba < blocks; {
		n := 1 + rng.Uint64N(min(blocks-lba, 16))
		if rng.IntN(3) == 0 {
			es = append(es, extent{kind: KindZero, lba: lba, n: n})
		} else {
			d := make([]byte, n*uint64(bs))
			for i := range d {
				d[i] = byte(rng.Uint32())
			}
			es = append(es, extent{kind: KindData, lba: lba, data: d})
			h.DataBytes += uint64(len(d))
		}
		lba += n + rng.Uint64N(8)
	}
	return h, es
}

func encode(t testing.TB, h Header, es []extent) []byte {
	t.Helper()
	var b bytes.Buffer
	w, err := NewWriter(&b, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.kind == KindData {
			err = w.Data(e.lba, e.data)
		} else {
			err = w.Zero(e.lba, e.n)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w.Written() != uint64(b.Len()) {
		t.Fatalf("Written %d, wrote %d bytes", w.Written(), b.Len())
	}
	return b.Bytes()
}

// decode reads a whole image, returning its header and records, or the
// first error.
func decode(r io.Reader) (Header, []extent, error) {
	ir, err := NewReader(r)
	if err != nil {
		return Header{}, nil, err
	}
	var es []extent
	buf := make([]byte, 64<<10)
	for {
		rec, err := ir.Next()
		if errors.Is(err, io.EOF) {
			return ir.Header(), es, nil
		}
		if err != nil {
			return Header{}, nil, err
		}
		e := extent{kind: rec.Kind, lba: rec.LBA, n: rec.Blocks}
		if rec.Kind == KindData {
			e.n = 0
			for {
				n, err := ir.Read(buf[:1+len(buf)/2])
				e.data = append(e.data, buf[:n]...)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return Header{}, nil, err
				}
			}
		}
		es = append(es, e)
	}
}

func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "./internal/image/"), 1))
	for i := range 100 {
		h, es := randomImage(rng, 128)
		b := encode(t, h, es)
		// Some read one byte at a time: a pipe gives short reads.
		var r io.Reader = bytes.NewReader(b)
		if i%10 == 0 {
			r = &oneByte{r}
		}
		got, ges, err := decode(r)
		if err != nil {
			t.Fatalf("image %d: %v", i, err)
		}
		h.Magic = Magic
		if got.Magic != h.Magic || got.SizeBytes != h.SizeBytes || got.BlockSize != h.BlockSize || got.DataBytes != h.DataBytes || (got.Base == nil) != (h.Base == nil) || got.Origin() != h.Origin() || got.BaseOrigin() != h.BaseOrigin() {
			t.Fatalf("image %d: header %+v, wrote %+v", i, got, h)
		}
		if len(ges) != len(es) {
			t.Fatalf("image %d: %d records, wrote %d", i, len(ges), len(es))
		}
		for j := range es {
			if ges[j].kind != es[j].kind || ges[j].lba != es[j].lba || ges[j].n != es[j].n || !bytes.Equal(ges[j].data, es[j].data) {
				t.Fatalf("image %d record %d: read %v@%d n=%d (%d bytes), wrote %v@%d n=%d (%d bytes)", i, j, ges[j].kind, ges[j].lba, ges[j].n, len(ges[j].data), es[j].kind, es[j].lba, es[j].n, len(es[j].data))
			}
		}
	}
}

type oneByte struct{ r io.Reader }

func (o *oneByte) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}

// TestCorruption flips each byte of an image (every byte of a small
// one): the reader refuses every one, by a field check or the checksum.
func TestCorruption(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "./internal/image/"), 2))
	h := Header{Cluster: "c", Volume: "v", Snapshot: "s", SnapshotID: 2, SizeBytes: 16 * 512, BlockSize: 512, Base: &Base{Name: "b", ID: 1}, DataBytes: 3 * 512}
	es := []extent{{kind: KindData, lba: 1, data: bytes.Repeat([]byte{0xa5}, 2*512)}, {kind: KindZero, lba: 4, n: 3}, {kind: KindData, lba: 15, data: make([]byte, 512)}}
	img := encode(t, h, es)
	c := make([]byte, len(img))
	for i := range img {
		copy(c, img)
		c[i] ^= byte(1 + rng.IntN(255))
		_, _, err := decode(bytes.NewReader(c))
		if err == nil {
			t.Fatalf("byte %d changed (%#x → %#x): the image was accepted", i, img[i], c[i])
		}
		if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrChecksum) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("byte %d changed: error %v wraps none of the package's", i, err)
		}
		// Past the header, a change to a data byte is only the checksum's
		// to see.
		if i >= HeaderSize+RecordSize && i < HeaderSize+RecordSize+2*512 && !errors.Is(err, ErrChecksum) {
			t.Fatalf("data byte %d changed: %v, want ErrChecksum", i, err)
		}
	}
	// A trailing byte, or another stream after this one.
	if _, _, err := decode(bytes.NewReader(append(img, 0))); !errors.Is(err, ErrFormat) {
		t.Fatalf("a byte after the checksum: %v, want ErrFormat", err)
	}
}

// TestTruncation cuts an image at every length: each is refused as
// truncated.
func TestTruncation(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "./internal/image/"), 3))
	h, es := randomImage(rng, 24)
	img := encode(t, h, es)
	for n := range len(img) {
		_, _, err := decode(bytes.NewReader(img[:n]))
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("image cut at %d of %d bytes: %v, want io.ErrUnexpectedEOF", n, len(img), err)
		}
	}
}

// TestReaderRefuses: hand-made streams, each with one thing wrong.
func TestReaderRefuses(t *testing.T) {
	good := Header{Magic: Magic, Volume: "v", Snapshot: "s", SnapshotID: 2, SizeBytes: 8 * 512, BlockSize: 512, DataBytes: 512}
	hdr := func(h Header) []byte {
		b, err := encodeHeader(&h)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rec := func(k Kind, lba, blocks uint64) []byte {
		b := make([]byte, RecordSize)
		record{k, lba, blocks}.put(b)
		return b
	}
	mut := func(f func(*Header)) []byte { h := good; f(&h); return hdr(h) }
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	blk := make([]byte, 512)
	for _, c := range []struct {
		name, want string
		b          []byte
	}{
		{"magic", "magic", mut(func(h *Header) { h.Magic = "blk-image/2" })},
		{"block size", "block size", mut(func(h *Header) { h.BlockSize = 1024 })},
		{"size", "size", mut(func(h *Header) { h.SizeBytes = 513 })},
		{"huge size", "size", mut(func(h *Header) { h.SizeBytes = 1 << 62 })},
		{"data bytes", "data bytes", mut(func(h *Header) { h.DataBytes = 9 * 512 })},
		{"snapshot id", "snapshot ID", mut(func(h *Header) { h.SnapshotID = 0 })},
		{"base is self", "own", mut(func(h *Header) { h.Base = &Base{Name: "s", ID: 2} })},
		{"control char", "control", mut(func(h *Header) { h.Volume = "v\n" })},
		{"no json", "no JSON", make([]byte, HeaderSize)},
		{"unknown field", "unknown field", func() []byte {
			b := make([]byte, HeaderSize)
			copy(b, `{"magic":"blk-image/1","volume":"v","snapshot":"s","snapshot_id":2,"size_bytes":512,"block_size":512,"data_bytes":0,"x":1}`)
			return b
		}()},
		{"padding", "not zeros", func() []byte { b := hdr(good); b[HeaderSize-1] = 1; return b }()},
		{"kind", "unknown kind", cat(hdr(good), rec(9, 0, 1))},
		{"reserved", "reserved", func() []byte { b := cat(hdr(good), rec(KindZero, 0, 1)); b[HeaderSize+3] = 1; return b }()},
		{"zero blocks", "0 blocks", cat(hdr(good), rec(KindZero, 0, 0))},
		{"past the end", "past", cat(hdr(good), rec(KindZero, 7, 2))},
		{"overflow", "past", cat(hdr(good), rec(KindZero, ^uint64(0), 2))},
		{"overlap", "before the end", cat(hdr(good), rec(KindZero, 2, 2), rec(KindZero, 3, 1))},
		{"too much data", "more data", cat(hdr(good), rec(KindData, 0, 2), blk, blk)},
		{"short data", "data bytes in the records", cat(hdr(good), rec(KindEnd, 0, 0))},
		{"end fields", "end record", cat(hdr(good), rec(KindData, 0, 1), blk, rec(KindEnd, 1, 0))},
		{"checksum", "checksum", cat(hdr(good), rec(KindData, 0, 1), blk, rec(KindEnd, 0, 0), make([]byte, ChecksumSize))},
	} {
		_, _, err := decode(bytes.NewReader(c.b))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// TestWriterRefuses: the writer does not write what the reader would
// refuse.
func TestWriterRefuses(t *testing.T) {
	h := Header{Volume: "v", Snapshot: "s", SnapshotID: 2, SizeBytes: 8 * 512, BlockSize: 512, DataBytes: 1024}
	if _, err := NewWriter(io.Discard, Header{Volume: "v", Snapshot: "s", SnapshotID: 2, SizeBytes: 8 * 512, BlockSize: 100}); !errors.Is(err, ErrFormat) {
		t.Fatalf("block size 100: %v", err)
	}
	w, err := NewWriter(io.Discard, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"odd length", w.Data(0, make([]byte, 100))},
		{"empty", w.Data(0, nil)},
		{"past the end", w.Zero(7, 2)},
		{"too much data", w.Data(0, make([]byte, 1536))},
	} {
		if !errors.Is(c.err, ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", c.name, c.err)
		}
	}
	if err := w.Data(2, make([]byte, 512)); err != nil {
		t.Fatal(err)
	}
	if err := w.Zero(1, 1); !errors.Is(err, ErrFormat) {
		t.Fatalf("out of order: %v", err)
	}
	if err := w.Close(); !errors.Is(err, ErrFormat) {
		t.Fatalf("close short of DataBytes: %v", err)
	}
}

// TestReaderAllocs: reading a data record allocates nothing per record.
func TestReaderAllocs(t *testing.T) {
	h := Header{Volume: "v", Snapshot: "s", SnapshotID: 2, SizeBytes: 1 << 20, BlockSize: 4096, DataBytes: 1 << 20}
	var es []extent
	for i := range uint64(256) {
		es = append(es, extent{kind: KindData, lba: i, data: make([]byte, 4096)})
	}
	img := encode(t, h, es)
	r, err := NewReader(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReadData(buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per record, want 0", allocs)
	}
}

// FuzzReader: any stream reads to an error or to a verified end, never
// a panic; an accepted one carries exactly the header's data bytes.
func FuzzReader(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 4 {
		h, es := randomImage(rng, 8)
		img := encode(f, h, es)
		f.Add(img)
		f.Add(img[:len(img)/2])
	}
	f.Add([]byte{})
	f.Add(make([]byte, HeaderSize+RecordSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, es, err := decode(bytes.NewReader(b))
		if err != nil {
			return
		}
		var data uint64
		for _, e := range es {
			data += uint64(len(e.data))
		}
		if data != h.DataBytes {
			t.Fatalf("accepted with %d data bytes, header says %d", data, h.DataBytes)
		}
	})
}

// BenchmarkImage writes and reads back an image of 64 MiB in 1 MiB
// records: the format's cost per byte (SHA-256 dominates).
func BenchmarkImage(b *testing.B) {
	const rec, n = 1 << 20, 64
	h := Header{Volume: "v", Snapshot: "s", SnapshotID: 2, SizeBytes: rec * n, BlockSize: 4096, DataBytes: rec * n}
	data := make([]byte, rec)
	var img bytes.Buffer
	img.Grow(rec*n + HeaderSize + 4096)
	buf := make([]byte, rec)
	b.SetBytes(rec * n)
	b.ReportAllocs()
	for b.Loop() {
		img.Reset()
		w, err := NewWriter(&img, h)
		if err != nil {
			b.Fatal(err)
		}
		for i := range uint64(n) {
			if err := w.Data(i*rec/4096, data); err != nil {
				b.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
		r, err := NewReader(bytes.NewReader(img.Bytes()))
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := r.Next(); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				b.Fatal(err)
			}
			if _, err := r.ReadData(buf); err != nil {
				b.Fatal(err)
			}
		}
	}
}
