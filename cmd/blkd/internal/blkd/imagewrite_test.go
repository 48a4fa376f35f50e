package blkd

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/internal/image"
	"github.com/blk-project/blk/internal/testseed"
	"github.com/blk-project/blk/target"
)

// shuffleBackend is an asynchronous backend that completes its IOs in a
// random order, several at once, applying each to a MemBackend at its
// completion (an import's writes never overlap). It checks what the
// import writer promises: at most depth IOs at the backend, and a flush
// only with no write at the backend.
type shuffleBackend struct {
	t      *testing.T
	rng    *rand.Rand
	m      *target.MemBackend
	depth  int
	failAt int // the failAt-th write fails (0: none)

	mu      sync.Mutex
	pending []*target.IO
	flushes int
	after   int // IOs submitted after the first failure completed
	failed  bool
}

func (b *shuffleBackend) submit(io *target.IO) {
	b.mu.Lock()
	if b.failed {
		b.after++
	}
	if len(b.pending) >= b.depth {
		b.t.Errorf("%d IOs at the backend, depth %d", len(b.pending)+1, b.depth)
	}
	if io.Op == target.OpFlush && len(b.pending) != 0 {
		b.t.Errorf("flush submitted with %d writes at the backend", len(b.pending))
	}
	b.pending = append(b.pending, io)
	// Complete some at random, the rest when the writer waits (a slot
	// free, or wait).
	var done []*target.IO
	for len(b.pending) > 0 && (len(b.pending) == b.depth || b.rng.IntN(3) == 0) {
		i := b.rng.IntN(len(b.pending))
		done = append(done, b.pending[i])
		b.pending = append(b.pending[:i], b.pending[i+1:]...)
	}
	if io.Op == target.OpFlush {
		done = append(done, b.pending...)
		b.pending = b.pending[:0]
	}
	b.mu.Unlock()
	for _, d := range done {
		d.Done(b.apply(d))
	}
}

// drain completes everything pending (the writer is blocked on a slot
// or in wait: go does that on a goroutine of its own).
func (b *shuffleBackend) drain() {
	b.mu.Lock()
	done := b.pending
	b.pending = nil
	b.mu.Unlock()
	for _, d := range done {
		d.Done(b.apply(d))
	}
}

func (b *shuffleBackend) apply(io *target.IO) error {
	switch io.Op {
	case target.OpWrite:
		b.mu.Lock()
		b.failAt--
		fail := b.failAt == 0
		if fail {
			b.failed = true
		}
		b.mu.Unlock()
		if fail {
			return errors.New("injected write failure")
		}
		return b.m.Write(io.LBA, io.Data, false)
	case target.OpWriteZeroes:
		return b.m.WriteZeroes(io.LBA, io.Blocks, false)
	case target.OpFlush:
		b.mu.Lock()
		b.flushes++
		b.mu.Unlock()
		return nil
	}
	return errors.New("unexpected op")
}

// randomImage is a seeded image of blocks 4 KiB blocks (data runs of up
// to 3 MiB, zero runs, holes) and what a volume that read 0xee
// everywhere reads after it.
func randomImage(t *testing.T, rng *rand.Rand, blocks uint64) ([]byte, []byte) {
	const bs = 4096
	want := bytes.Repeat([]byte{0xee}, int(blocks*bs))
	type rec struct {
		lba, n uint64
		zero   bool
	}
	var recs []rec
	var data uint64
	for lba := uint64(0); lba < blocks; {
		n := min(blocks-lba, 1+rng.Uint64N(800))
		switch rng.IntN(3) {
		case 0:
			recs = append(recs, rec{lba, n, false})
			data += n * bs
		case 1:
			recs = append(recs, rec{lba, n, true})
		}
		lba += n
	}
	var buf bytes.Buffer
	iw, err := image.NewWriter(&buf, image.Header{Magic: image.Magic, Cluster: "c", Volume: "v", Snapshot: "s", SnapshotID: 7, SizeBytes: blocks * bs, BlockSize: bs, DataBytes: data})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		p := want[r.lba*bs : (r.lba+r.n)*bs]
		if r.zero {
			clear(p)
			if err := iw.Zero(r.lba, r.n); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		if err := iw.Data(r.lba, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := iw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), want
}

func newShuffle(t *testing.T, rng *rand.Rand, blocks uint64, depth int) *shuffleBackend {
	m, err := target.NewMemBackend(4096, blocks)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Write(0, bytes.Repeat([]byte{0xee}, int(blocks*4096)), false); err != nil {
		t.Fatal(err)
	}
	return &shuffleBackend{t: t, rng: rng, m: m, depth: depth}
}

// runImport runs readImage of img through b on a goroutine, draining b
// while the writer waits for a slot or in wait.
func runImport(t *testing.T, b *shuffleBackend, img []byte, depth int) (api.ImportResult, error) {
	ir, err := image.NewReader(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	res := api.ImportResult{DataBytes: ir.Header().DataBytes}
	var inflight sync.WaitGroup
	done := make(chan error, 1)
	w := newImportWriter(b.submit, func() { inflight.Done() }, depth)
	submit := w.submit
	w.submit = func(io *target.IO) { inflight.Add(1); submit(io) }
	go func() { done <- readImage(ir, w, &res) }()
	for {
		select {
		case err := <-done:
			inflight.Wait() // every done called: nothing left at the backend
			b.mu.Lock()
			left := len(b.pending)
			b.mu.Unlock()
			if left != 0 {
				t.Errorf("readImage returned with %d IOs at the backend", left)
			}
			return res, err
		default:
			b.drain()
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// TestImportWriter: readImage through an importWriter over a backend
// that completes out of order writes exactly the image (seeded), with
// at most depth writes at the backend, a flush after every write
// completed, and nothing in flight when it returns; a write that fails
// fails the import as the store's error (500) and stops its writes; a
// truncated image fails as the image's error (400) with its writes
// completed.
func TestImportWriter(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "./cmd/blkd/internal/blkd/"), 24))
	const blocks = 4096 // 16 MiB
	for round := range 6 {
		depth := 1 + rng.IntN(importDepth)
		img, want := randomImage(t, rng, blocks)
		b := newShuffle(t, rng, blocks, depth)
		res, err := runImport(t, b, img, depth)
		if err != nil {
			t.Fatalf("round %d (depth %d): %v", round, depth, err)
		}
		got := make([]byte, len(want))
		if err := b.m.Read(0, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			j := 0
			for got[j] == want[j] {
				j++
			}
			t.Fatalf("round %d (depth %d): the volume differs from the image at byte %d", round, depth, j)
		}
		if b.flushes != 1 || res.WrittenBytes != res.DataBytes {
			t.Fatalf("round %d: %d flushes, %d of %d bytes written", round, b.flushes, res.WrittenBytes, res.DataBytes)
		}
	}

	// A write fails: the import says so as the store's error, submits
	// at most the writes that were already in the slots after it.
	// The third write must exist: an image with less than three chunks
	// of data (it happens: records are random) would never fail.
	img, _ := randomImage(t, rng, blocks)
	for {
		ir, err := image.NewReader(bytes.NewReader(img))
		if err != nil {
			t.Fatal(err)
		}
		if ir.Header().DataBytes >= 3*imageChunk {
			break
		}
		img, _ = randomImage(t, rng, blocks)
	}
	b := newShuffle(t, rng, blocks, importDepth)
	b.failAt = 3
	_, err := runImport(t, b, img, importDepth)
	var se *storeError
	if !errors.As(err, &se) || !bytes.Contains([]byte(err.Error()), []byte("injected")) {
		t.Fatalf("a failed write: %v, want the store's error", err)
	}
	if b.after > importDepth || b.flushes != 0 {
		t.Fatalf("after the failure: %d IOs submitted, %d flushes; want at most %d, none", b.after, b.flushes, importDepth)
	}

	// A truncated image: the image's error, not the store's.
	b = newShuffle(t, rng, blocks, importDepth)
	_, err = runImport(t, b, img[:len(img)/2], importDepth)
	if err == nil || errors.As(err, &se) {
		t.Fatalf("a truncated image: %v, want the image's error", err)
	}
}

// TestImportTerm: an import's writes through a term that is not (or no
// longer) the host path's fail with errTermEnded, through one without a
// lease with the path's status, and the term's count of import writes
// (what endTerm waits for) is back to 0 after each.
func TestImportTerm(t *testing.T) {
	m, err := target.NewMemBackend(4096, 16)
	if err != nil {
		t.Fatal(err)
	}
	hv := &hostVolume{hb: &hostBackend{local: target.Inline(m)}}
	pl := &primaryLeg{}
	it := importTerm{hv, pl}
	write := func() error {
		w := newImportWriter(it.Submit, it.done, 2)
		s := w.slot()
		s.io.Op, s.io.LBA, s.io.Blocks, s.io.Data = target.OpWrite, 0, 1, make([]byte, 4096)
		w.start(s)
		return w.wait()
	}
	if err := write(); !errors.Is(err, errTermEnded) || pl.imports.Load() != 0 {
		t.Fatalf("no term: %v, %d writes counted", err, pl.imports.Load())
	}
	hv.hb.cur.Store(pl) // the term, its lease never granted
	if err := write(); !errors.Is(err, errNoLease) || pl.imports.Load() != 0 {
		t.Fatalf("no lease: %v, %d writes counted", err, pl.imports.Load())
	}
	hv.hb.cur.Store(&primaryLeg{}) // another term
	if err := write(); !errors.Is(err, errTermEnded) || pl.imports.Load() != 0 {
		t.Fatalf("another term: %v, %d writes counted", err, pl.imports.Load())
	}
}
