package blkd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/image"
	"github.com/blk-project/blk/internal/testseed"
	"github.com/blk-project/blk/repl"
	"github.com/blk-project/blk/store"
)

// fakeLimiter is a copyLimiter on a virtual clock: each Wait reserves
// its bytes on a timeline advancing at rate bytes per second, as
// repl.Limiter does, without sleeping. The timeline's end is how long
// the copies would have taken at that rate; draws are the bytes of each
// Wait, in order. With failAt > 0, the failAt-th Wait fails.
type fakeLimiter struct {
	mu     sync.Mutex
	rate   float64
	next   time.Duration // virtual time the next reservation goes at
	draws  []uint64
	failAt int
}

var errLimiterTest = errors.New("limiter test: the wait was cut short")

func (l *fakeLimiter) Wait(_ context.Context, n uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.draws = append(l.draws, n)
	if len(l.draws) == l.failAt {
		return errLimiterTest
	}
	l.next += time.Duration(float64(n) / l.rate * float64(time.Second))
	return nil
}

func (l *fakeLimiter) drawn() (sum uint64) {
	for _, n := range l.draws {
		sum += n
	}
	return sum
}

// throttleStore is a node's store in a temporary data dir holding volume
// 1 of size bytes (4 KiB blocks), seeded runs of it written with random
// data, then snapshot 2 of it and clone 3 of that snapshot, with a few
// clusters of the clone rewritten (owned: not the flatten's to copy).
// want is what the snapshot, and the clone where not rewritten, read.
func throttleStore(t *testing.T, rng *rand.Rand, size uint64) (s *store.Store, want, clone []byte) {
	t.Helper()
	s, err := openStore(Config{DataDir: t.TempDir()}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	v, err := s.Create(1, store.CreateOptions{SizeBytes: size, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	want = make([]byte, size)
	const bs = 4096
	for lba := uint64(0); lba < size/bs; {
		n := min(size/bs-lba, 1+rng.Uint64N(64))
		if rng.IntN(3) > 0 {
			p := want[lba*bs : (lba+n)*bs]
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			if err := v.Write(lba, p, 0); err != nil {
				t.Fatal(err)
			}
		}
		lba += n
	}
	if err := s.Snapshot(1, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Clone(2, 3); err != nil {
		t.Fatal(err)
	}
	cv, err := s.Volume(3)
	if err != nil {
		t.Fatal(err)
	}
	clone = bytes.Clone(want)
	cb := s.Stats().ClusterBytes
	for range 3 {
		off := rng.Uint64N(size/cb) * cb
		p := clone[off : off+cb]
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		if err := cv.Write(off/bs, p, 0); err != nil {
			t.Fatal(err)
		}
	}
	return s, want, clone
}

// readVolume is the first size bytes v reads, 1 MiB at a time (the
// store's largest transfer).
func readVolume(t *testing.T, v *store.Volume, size uint64) []byte {
	t.Helper()
	got := make([]byte, size)
	for off := uint64(0); off < size; off += imageChunk {
		if err := v.Read(off/4096, got[off:min(size, off+imageChunk)]); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// exportRuns is the runs of a whole export of snapshot snap.
func exportRuns(t *testing.T, s *store.Store, snap store.ID) []imageRun {
	t.Helper()
	var runs []imageRun
	if err := s.Changes(0, snap, func(lba, blocks uint64, zero bool) error {
		runs = append(runs, imageRun{lba, blocks, zero})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return runs
}

// exportImage writes snapshot 2 of s as an image through lim.
func exportImage(t *testing.T, s *store.Store, size uint64, lim copyLimiter) (image.Header, []byte, error) {
	t.Helper()
	sv, err := s.Volume(2)
	if err != nil {
		t.Fatal(err)
	}
	runs := exportRuns(t, s, 2)
	h := image.Header{Magic: image.Magic, Cluster: "c", Volume: "v", Snapshot: "s", SnapshotID: 2, SizeBytes: size, BlockSize: 4096}
	for _, r := range runs {
		if !r.zero {
			h.DataBytes += r.blocks * 4096
		}
	}
	var buf bytes.Buffer
	err = writeImage(context.Background(), &buf, h, runs, sv, lim)
	return h, buf.Bytes(), err
}

// decodeImage is what a volume of size bytes reads once img is applied.
func decodeImage(t *testing.T, img []byte, size uint64) []byte {
	t.Helper()
	ir, err := image.NewReader(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	for {
		rec, err := ir.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		p := got[rec.LBA*4096 : (rec.LBA+rec.Blocks)*4096]
		if rec.Kind == image.KindZero {
			clear(p)
			continue
		}
		if _, err := ir.ReadData(p); err != nil {
			t.Fatal(err)
		}
	}
}

// TestExportThrottled: an export draws from the node's limiter exactly
// the data bytes it reads from the store (zero runs and holes cost
// nothing), at most one 1 MiB read at a time, so N bytes at rate R take
// N/R on the limiter's clock; the image is the snapshot's all the same.
// A wait cut short stops the export with its cause, before the read it
// was for.
func TestExportThrottled(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "./cmd/blkd/internal/blkd/"), 24))
	const size = 8 << 20
	s, want, _ := throttleStore(t, rng, size)

	const rate = 4 << 20 // bytes/s
	lim := &fakeLimiter{rate: rate}
	h, img, err := exportImage(t, s, size, lim)
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeImage(t, img, size); !bytes.Equal(got, want) {
		t.Fatal("the throttled export differs from the snapshot")
	}
	if h.DataBytes == 0 || lim.drawn() != h.DataBytes {
		t.Fatalf("drew %d bytes for an image of %d data bytes", lim.drawn(), h.DataBytes)
	}
	for i, n := range lim.draws {
		if n == 0 || n > imageChunk {
			t.Fatalf("draw %d of %d bytes: want 1 to %d", i, n, imageChunk)
		}
	}
	if d := time.Duration(float64(h.DataBytes) / rate * float64(time.Second)); lim.next != d {
		t.Fatalf("%d bytes at %d B/s took %v on the limiter's clock, want %v", h.DataBytes, rate, lim.next, d)
	}

	// Unlimited: the same image.
	_, img0, err := exportImage(t, s, size, nil)
	if err != nil || !bytes.Equal(img0, img) {
		t.Fatalf("unlimited export: %v, equal %v", err, bytes.Equal(img0, img))
	}

	// The third wait fails: the export ends with its cause after two.
	lim = &fakeLimiter{rate: rate, failAt: 3}
	if _, _, err := exportImage(t, s, size, lim); !errors.Is(err, errLimiterTest) || len(lim.draws) != 3 {
		t.Fatalf("a failed wait: %v after %d draws, want errLimiterTest after 3", err, len(lim.draws))
	}
}

// TestFlattenThrottled: a flatten through storeParts draws from the
// node's limiter, after each batch of the store's, exactly the bytes of
// the clusters it copied (the clone's own clusters are not copied and
// cost nothing), a batch of at most 32 clusters at a time, and reports
// them as progress; N bytes at rate R take N/R on the limiter's clock.
// The clone reads the same bytes after it, with no parent.
func TestFlattenThrottled(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "./cmd/blkd/internal/blkd/"), 25))
	const size = 8 << 20
	s, want, clone := throttleStore(t, rng, size)
	cb := s.Stats().ClusterBytes
	// The clusters the clone reads from the snapshot's data: the
	// snapshot's, but those the clone rewrote (its own).
	clusters := func(from, to store.ID) map[uint64]bool {
		m := map[uint64]bool{}
		if err := s.Changes(from, to, func(lba, blocks uint64, zero bool) error {
			for b := lba * 4096 / cb; b < (lba+blocks)*4096/cb; b++ {
				m[b] = !zero
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return m
	}
	own := clusters(2, 3)
	var inherited uint64
	for c := range clusters(0, 2) {
		if _, ok := own[c]; !ok {
			inherited++
		}
	}

	const rate = 4 << 20
	lim := &fakeLimiter{rate: rate}
	var done, total uint64
	var calls int
	if err := (storeParts{s: s, limit: lim}).Flatten(context.Background(), 3, func(d, tot uint64) { done, total, calls = d, tot, calls+1 }); err != nil {
		t.Fatal(err)
	}
	if total != inherited*cb || done != total || lim.drawn() != done {
		t.Fatalf("flatten: progress %d of %d bytes, drew %d; want %d inherited clusters of %d bytes", done, total, lim.drawn(), inherited, cb)
	}
	if len(lim.draws) != calls {
		t.Fatalf("%d draws for %d batches", len(lim.draws), calls)
	}
	for i, n := range lim.draws {
		if n == 0 || n > 32*cb {
			t.Fatalf("draw %d of %d bytes: want 1 to %d", i, n, 32*cb)
		}
	}
	if d := time.Duration(float64(done) / rate * float64(time.Second)); lim.next != d {
		t.Fatalf("%d bytes at %d B/s took %v on the limiter's clock, want %v", done, rate, lim.next, d)
	}
	cv, err := s.Volume(3)
	if err != nil {
		t.Fatal(err)
	}
	got := readVolume(t, cv, size)
	info, err := cv.Info()
	if err != nil || info.Parent != 0 || !bytes.Equal(got, clone) {
		t.Fatalf("after the flatten: parent %d (%v), data equal %v", info.Parent, err, bytes.Equal(got, clone))
	}

	// Unlimited: a second clone flattens through the nil limiter.
	if err := s.Clone(2, 4); err != nil {
		t.Fatal(err)
	}
	var done4 uint64
	if err := (storeParts{s: s}).Flatten(context.Background(), 4, func(d, _ uint64) { done4 = d }); err != nil {
		t.Fatal(err)
	}
	v4, err := s.Volume(4)
	if err != nil {
		t.Fatal(err)
	}
	if got := readVolume(t, v4, size); !bytes.Equal(got, want) || done4 == 0 {
		t.Fatalf("unlimited flatten: %d bytes copied, data equal %v", done4, bytes.Equal(got, want))
	}
}

// TestCopiesShareRebuildRate: with the node's real limiter (repl.Limiter,
// as --rebuild-rate makes it), a flatten and an export of 8 MiB at 32
// MiB/s each last at least the time the limiter must hold back all but
// their last draw. A lower bound only: the test cannot flake on a slow
// machine.
func TestCopiesShareRebuildRate(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "./cmd/blkd/internal/blkd/"), 26))
	const size, rate = 8 << 20, 32 << 20
	s, _, _ := throttleStore(t, rng, size)
	cb := s.Stats().ClusterBytes

	lim := repl.NewLimiter(rate)
	var last, done uint64
	start := time.Now()
	if err := (storeParts{s: s, limit: lim}).Flatten(context.Background(), 3, func(d, _ uint64) { last, done = d-done, d }); err != nil {
		t.Fatal(err)
	}
	if min := time.Duration(float64(done-last) / rate * float64(time.Second)); time.Since(start) < min || done < 32*cb {
		t.Fatalf("flatten of %d bytes at %d B/s took %v, want at least %v", done, rate, time.Since(start), min)
	}
	t.Logf("flatten: %d bytes at %d B/s in %v (%.1f MiB/s)", done, rate, time.Since(start), float64(done)/(1<<20)/time.Since(start).Seconds())

	lim = repl.NewLimiter(rate)
	start = time.Now()
	h, _, err := exportImage(t, s, size, lim)
	if err != nil {
		t.Fatal(err)
	}
	if min := time.Duration(float64(h.DataBytes-imageChunk) / rate * float64(time.Second)); time.Since(start) < min || h.DataBytes < 2*imageChunk {
		t.Fatalf("export of %d bytes at %d B/s took %v, want at least %v", h.DataBytes, rate, time.Since(start), min)
	}
	t.Logf("export: %d bytes at %d B/s in %v (%.1f MiB/s)", h.DataBytes, rate, time.Since(start), float64(h.DataBytes)/(1<<20)/time.Since(start).Seconds())
}
