package store

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// The zeroed watermark (docs/store.md, "Zeroed watermark"): a store on an
// area that held data before (a used block device) zeroes each cluster
// before it first hands it out, never the whole area at creation, and no
// byte of what the area held may ever be read through a volume.

// TestLazyZeroModel runs the seeded workload of lazyWorkload on a
// MemArea full of a random pattern.
func TestLazyZeroModel(t *testing.T) {
	seed := testSeed(t)
	for it := range iterations(t, 6, 2, 3) {
		s := seed + uint64(it)
		area := NewUnzeroedMemArea(256*(16<<10), 512, 512, s)
		if err := lazyWorkload(memConfig(vfs.NewMem(), area), s, 300); err != nil {
			t.Fatalf("iteration %d: %v\nreplay it alone with BLK_SEED=%d BLK_ITERS=1", it, err, s)
		}
	}
}

// TestDeviceLazyZero: a loop device filled with a random pattern, then a
// store created on it (the wipe confirmed): creating it zeroes the ends
// (no signature left for blkid) and not the middle, and the seeded
// workload of lazyWorkload never reads a byte of the pattern.
func TestDeviceLazyZero(t *testing.T) {
	const size = 8 << 20
	seed := testSeed(t)
	dev := loopDevice(t, size)
	pattern := make([]byte, size)
	r := rand.New(rand.NewPCG(seed, 0xde))
	for i := range pattern {
		pattern[i] = byte(r.Uint32() | 1)
	}
	writeDevice(t, dev, pattern, 0)
	cfg := deviceConfig(t, dev)
	cfg.ClusterBytes, cfg.ReadyClusters = 16<<10, 8
	if _, err := Open(cfg); !errors.Is(err, ErrNotBlank) {
		t.Fatalf("a device full of data without the wipe: %v, want ErrNotBlank", err)
	}
	cfg.WipeDevice = true
	s := openStore(t, cfg)
	if st := s.Stats(); !s.format.lazy || st.Zeroed != 1 {
		t.Fatalf("a store on a device: lazy %v, watermark %d; want lazy at 1", s.format.lazy, st.Zeroed)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	h := readDevice(t, dev, 1<<20, 0)
	if what := recognise(h, true, size); !strings.Contains(what, "blk store") {
		t.Fatalf("the device's start after create: %q, want the store's header", what)
	}
	if !isZero(h[headerLen:]) {
		t.Fatal("the wipe left old bytes in the first MiB")
	}
	if !isZero(readDevice(t, dev, 1<<20, size-1<<20)) {
		t.Fatal("the wipe left old bytes in the last MiB")
	}
	if got := readDevice(t, dev, 1<<20, 4<<20); !bytes.Equal(got, pattern[4<<20:5<<20]) {
		t.Fatal("creating the store wrote to the middle of the device: it must zero clusters only as they are first handed out")
	}
	if err := lazyWorkload(cfg, seed, 300); err != nil {
		t.Fatal(err)
	}
}

// lazyWorkload opens the store of cfg (created on an area that held a
// pattern), creates volumes (every block reads zeros), then runs ops
// seeded operations checked against a byte-exact model: partial and full
// first writes (some FUA), overwrites, write-zeroes and deallocates
// (freed clusters are reused), flushes, forced shrinks and grows, and
// reopens (each followed by Check). The volumes fit the area, so no write
// fails for space. At the end every volume is read whole, Check passes,
// scrub takes every free and ready cluster and finds zeros in each, and
// nothing leaked.
func lazyWorkload(cfg Config, seed uint64, ops int) error {
	rng := rand.New(rand.NewPCG(seed, 0x1a2))
	s, err := Open(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	if !s.format.lazy {
		return fmt.Errorf("a store on an area that held data is not lazy")
	}
	C := s.cmask + 1
	perVol := (s.al.clusters - 1) / 3 // every volume may be fully written
	type mvol struct {
		bs   uint32
		data []byte
	}
	model := map[ID]*mvol{}
	buf := alignedBuf(int(min(uint64(s.cfg.MaxTransferBytes), 64<<10)), 4096)
	for id := ID(1); id <= 3; id++ {
		bs := []uint32{BlockSize512, BlockSize4K}[rng.IntN(2)]
		size := (1 + rng.Uint64N(perVol)) * C
		v, err := s.Create(id, CreateOptions{SizeBytes: size, BlockSize: bs})
		if err != nil {
			return err
		}
		model[id] = &mvol{bs: bs, data: make([]byte, size)}
		for off := uint64(0); off < size; off += uint64(len(buf)) {
			n := min(uint64(len(buf)), size-off)
			if err := v.Read(off/uint64(bs), buf[:n]); err != nil {
				return err
			}
			if !isZero(buf[:n]) {
				return fmt.Errorf("volume %d at byte %d: a new volume does not read zeros", id, off)
			}
		}
	}
	verify := func(op int, id ID, v *Volume, lba, n uint64) error {
		m := model[id]
		B := uint64(m.bs)
		for done := uint64(0); done < n; {
			k := min(n-done, uint64(len(buf))/B)
			if err := v.Read(lba+done, buf[:k*B]); err != nil {
				return fmt.Errorf("op %d: read volume %d: %w", op, id, err)
			}
			want := m.data[(lba+done)*B : (lba+done+k)*B]
			if i := mismatch(buf[:k*B], want); i >= 0 {
				return fmt.Errorf("op %d: volume %d byte %d reads %#x, want %#x (a byte the area held before the store?)",
					op, id, (lba+done)*B+uint64(i), buf[i], want[i])
			}
			done += k
		}
		return nil
	}
	for op := range ops {
		id := ID(1 + rng.IntN(3))
		m := model[id]
		v, err := s.Volume(id)
		if err != nil {
			return fmt.Errorf("op %d: %w", op, err)
		}
		B := uint64(m.bs)
		blocks := uint64(len(m.data)) / B
		n := 1 + rng.Uint64N(min(blocks, uint64(len(buf))/B))
		lba := rng.Uint64N(blocks - n + 1)
		switch r := rng.IntN(100); {
		case r < 40: // write: often a partial first write of a cluster
			for i := range buf[:n*B] {
				buf[i] = byte(rng.Uint32())
			}
			copy(m.data[lba*B:], buf[:n*B])
			flags := WriteFlags(0)
			if rng.IntN(5) == 0 {
				flags = FUA
			}
			if err := v.Write(lba, buf[:n*B], flags); err != nil {
				return fmt.Errorf("op %d: write: %w", op, err)
			}
		case r < 55: // write zeroes or deallocate, often of whole clusters
			n = 1 + rng.Uint64N(blocks)
			lba = rng.Uint64N(blocks - n + 1)
			clear(m.data[lba*B : (lba+n)*B])
			if r < 48 {
				err = v.WriteZeroes(lba, n, WriteFlags(rng.IntN(2))*FUA)
			} else {
				err = v.Deallocate(lba, n)
			}
			if err != nil {
				return fmt.Errorf("op %d: remove: %w", op, err)
			}
		case r < 62:
			if err := s.Flush(); err != nil {
				return fmt.Errorf("op %d: flush: %w", op, err)
			}
		case r < 68: // resize, shrinks forced
			size := (1 + rng.Uint64N(perVol)) * C
			if rng.IntN(2) == 0 {
				size -= B * rng.Uint64N(C/B) // not a whole number of clusters
			}
			if err := s.Resize(id, size, true); err != nil {
				return fmt.Errorf("op %d: resize: %w", op, err)
			}
			if size < uint64(len(m.data)) {
				m.data = m.data[:size]
			} else {
				m.data = append(m.data, make([]byte, size-uint64(len(m.data)))...)
			}
		case r < 72: // reopen
			if err := s.Close(); err != nil {
				return fmt.Errorf("op %d: close: %w", op, err)
			}
			if s, err = Open(cfg); err != nil {
				return fmt.Errorf("op %d: reopen: %w", op, err)
			}
			if err := s.Check(); err != nil {
				return fmt.Errorf("op %d: after reopen: %w", op, err)
			}
		default:
			if err := verify(op, id, v, lba, n); err != nil {
				return err
			}
		}
	}
	for id, m := range model {
		v, err := s.Volume(id)
		if err != nil {
			return err
		}
		if err := verify(ops, id, v, 0, uint64(len(m.data))/uint64(m.bs)); err != nil {
			return err
		}
	}
	if err := s.Check(); err != nil {
		return err
	}
	if st := s.Stats(); st.Zeroed < 2 {
		return fmt.Errorf("%+v: the watermark never moved", st)
	}
	if err := scrub(s); err != nil {
		return err
	}
	if st := s.Stats(); st.Zeroed != st.Clusters {
		return fmt.Errorf("%+v: every cluster was handed out, the watermark is not at the end", st)
	}
	return nil
}

// mismatch is the index of the first byte where a and b differ, or -1.
func mismatch(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestLazyZeroRefill: a refill zeroes exactly the clusters it picks past
// the watermark, in one call for the run, syncs, then advances the
// watermark durably with their reservations; clusters below it are not
// zeroed again.
func TestLazyZeroRefill(t *testing.T) {
	area := NewUnzeroedMemArea(64*(16<<10), 512, 512, 1)
	var zeroes [][2]int64
	cfg := memConfig(vfs.NewMem(), &zeroSpy{MemArea: area, calls: &zeroes})
	s := openStore(t, cfg)
	if !s.format.lazy {
		t.Fatal("a store on an Unzeroed area is not lazy")
	}
	v := mustCreate(t, s, 1, 63*4, BlockSize4K) // 63 clusters of 4 blocks
	one := alignedBuf(4096, 4096)
	one[0] = 1
	if err := v.Write(0, one, 0); err != nil { // refill: clusters 1-8
		t.Fatal(err)
	}
	if st := s.Stats(); st.Zeroed != 9 || st.ZeroedAhead != 8 {
		t.Fatalf("after the first refill: watermark %d, %d zeroed ahead; want 9 and 8", st.Zeroed, st.ZeroedAhead)
	}
	if want := [][2]int64{{1 << 14, 8 << 14}}; fmt.Sprint(zeroes) != fmt.Sprint(want) {
		t.Fatalf("zeroes %v, want one call for clusters 1-8: %v", zeroes, want)
	}
	if w := readZeroed(t, s); w != 9 {
		t.Fatalf("the 'Z' key says %d, want 9", w)
	}
	// The rest of the cluster written into reads zeros on the area,
	// whatever the pattern held.
	got := alignedBuf(16<<10, 4096)
	if err := v.Read(0, got); err != nil || got[0] != 1 || !isZero(got[1:]) {
		t.Fatalf("a partial first write: the rest of its cluster does not read zeros (%v)", err)
	}
	// Free everything, flush (limbo back to ready), and write again: the
	// pool is below the watermark, nothing is zeroed ahead.
	for i := range uint64(8) {
		if err := v.Write(i*4, one, 0); err != nil {
			t.Fatal(err)
		}
	}
	zeroes = zeroes[:0]
	if err := v.Deallocate(0, 63*4); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	before := s.Stats()
	for i := range uint64(8) {
		if err := v.Write(i*4, one, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.ZeroedAhead != before.ZeroedAhead || st.Zeroed != before.Zeroed {
		t.Fatalf("reusing freed clusters zeroed ahead: %+v then %+v", before, st)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// zeroSpy records the area's Zero calls (offset, length).
type zeroSpy struct {
	*MemArea
	calls *[][2]int64
}

func (z *zeroSpy) Zero(off, n int64) error {
	*z.calls = append(*z.calls, [2]int64{off, n})
	return z.MemArea.Zero(off, n)
}

func readZeroed(t *testing.T, s *Store) uint64 {
	t.Helper()
	v, closer, err := s.db.Get(zeroedKey)
	if err != nil {
		t.Fatalf("the 'Z' key: %v", err)
	}
	defer closer.Close()
	w, ok := parseZeroed(v)
	if !ok {
		t.Fatalf("the 'Z' key holds %x", v)
	}
	return w
}

// TestZeroedWatermarkUpgrade: a device store written by the release that
// zeroed the whole device at creation ("blk-store/2", no 'Z' key) opens
// with the watermark at the device's end, zeroes nothing ahead, and
// stays "/2"; a file store has no watermark key and never zeroes ahead.
func TestZeroedWatermarkUpgrade(t *testing.T) {
	t.Run("device-v2", func(t *testing.T) {
		dev := loopDevice(t, 8<<20) // a sparse file: zeros, as the old create left it
		cfg := deviceConfig(t, dev)
		s := openStore(t, cfg)
		f := s.format
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// What the release before wrote: the record and the header "/2",
		// no watermark key.
		f.lazy = false
		db, err := pebble.Open(cfg.Dir, &pebble.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(db.Set(formatKey, f.record(), pebble.Sync), db.Delete(zeroedKey, pebble.Sync), db.Close()); err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, 4096)
		f.encodeHeader(hdr)
		writeDevice(t, dev, hdr, 0)

		s = openStore(t, cfg)
		if st := s.Stats(); s.format.lazy || st.Zeroed != st.Clusters {
			t.Fatalf("a /2 device store: lazy %v, watermark %d of %d clusters; want the end", s.format.lazy, st.Zeroed, st.Clusters)
		}
		v := mustCreate(t, s, 1, 2048, BlockSize4K)
		buf := alignedBuf(64<<10, 4096)
		buf[0] = 9
		for i := range uint64(40) { // 40 first writes: one refill
			if err := v.Write(i*16, buf[:4096], FUA); err != nil {
				t.Fatal(err)
			}
		}
		if st := s.Stats(); st.ZeroedAhead != 0 || st.Zeroed != st.Clusters {
			t.Fatalf("a /2 store zeroed ahead: %+v", st)
		}
		if err := errors.Join(s.Check(), s.Close()); err != nil {
			t.Fatal(err)
		}
		if h := readDevice(t, dev, 4096, 0); !bytes.HasPrefix(h, []byte("blk-store/2\x00")) {
			t.Fatalf("the /2 store's header became %q", h[:16])
		}
		s = openStore(t, cfg)
		if err := s.Check(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("file", func(t *testing.T) {
		s := openStore(t, memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512)))
		v := mustCreate(t, s, 1, 64*4, BlockSize4K)
		for i := range uint64(20) {
			if err := v.Write(i*4, alignedBuf(4096, 4096), 0); err != nil {
				t.Fatal(err)
			}
		}
		if st := s.Stats(); s.format.lazy || st.Zeroed != st.Clusters || st.ZeroedAhead != 0 {
			t.Fatalf("a store on a zeroed area: lazy %v, %+v", s.format.lazy, st)
		}
		if _, _, err := s.db.Get(zeroedKey); !errors.Is(err, pebble.ErrNotFound) {
			t.Fatalf("a store on a zeroed area has a 'Z' key: %v", err)
		}
		if v := s.format.record(); string(v[:12]) != "blk-store/1\x00" {
			t.Fatalf("format record %q", v[:16])
		}
	})
}

// TestZeroedWatermarkCorrupt: a lazy store whose watermark key is
// missing, outside the area, or below a cluster in use does not open
// (ErrCorrupt, naming the watermark); a watermark in a store that is not
// lazy fails Check.
func TestZeroedWatermarkCorrupt(t *testing.T) {
	fs := vfs.NewMem()
	area := NewUnzeroedMemArea(32*(16<<10), 512, 512, 2)
	cfg := memConfig(fs, area)
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 16*4, BlockSize4K)
	for i := range uint64(12) { // two refills: clusters 1-16, watermark 17
		if err := v.Write(i*4, alignedBuf(4096, 4096), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	set := func(v []byte) {
		t.Helper()
		db, err := pebble.Open(cfg.Dir, &pebble.Options{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		op := db.Delete(zeroedKey, pebble.Sync)
		if v != nil {
			op = db.Set(zeroedKey, v, pebble.Sync)
		}
		if err := errors.Join(op, db.Close()); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		v    []byte
	}{
		{"missing", nil},
		{"zero", zeroedValue(0)},
		{"past-the-end", zeroedValue(33)},
		{"short", []byte{1}},
		{"below-a-mapped-cluster", zeroedValue(5)},
	} {
		set(c.v)
		if _, err := Open(cfg); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "watermark") {
			t.Errorf("%s: Open: %v, want ErrCorrupt naming the watermark", c.name, err)
		}
	}
	set(zeroedValue(17))
	s = openStore(t, cfg)
	if err := s.Check(); err != nil {
		t.Fatalf("restored: %v", err)
	}
	s.al.mu.Lock()
	s.al.zeroed = 5 // as if a refill had handed out clusters without moving it
	s.al.mu.Unlock()
	if err := s.Check(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "at or past the zeroed watermark 5") {
		t.Fatalf("clusters in use past the watermark: Check %v, want ErrCorrupt", err)
	}
	s.al.mu.Lock()
	s.al.zeroed = 17
	s.al.mu.Unlock()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, memConfig(vfs.NewMem(), NewMemArea(32*(16<<10), 512, 512)))
	if err := s.db.Set(zeroedKey, zeroedValue(3), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "watermark") {
		t.Fatalf("a watermark in a store that is not lazy: Check %v, want ErrCorrupt", err)
	}
}

// TestLazyZeroConcurrentRefills: a refill zeroing past the watermark
// does not hold the allocator: while its zeroing is held up, a Flush
// completes. Another volume's first write that needs a refill meanwhile
// waits for it (it must not zero from the same watermark: it could zero a
// cluster the first refill hands out and a write fills), then finds the
// pool refilled; the next refill zeroes from where the first ended, and
// Check passes.
func TestLazyZeroConcurrentRefills(t *testing.T) {
	area := NewUnzeroedMemArea(64*(16<<10), 512, 512, 3)
	var zeroes [][2]int64
	gate := &gatedZero{MemArea: area, calls: &zeroes, entered: make(chan struct{}), release: make(chan struct{})}
	s := openStore(t, memConfig(vfs.NewMem(), gate))
	var opened sync.Once
	unblock := func() { opened.Do(func() { close(gate.release) }) }
	t.Cleanup(unblock) // before the store's Close, which waits for the held write
	v1, v2 := mustCreate(t, s, 1, 16*4, BlockSize4K), mustCreate(t, s, 2, 16*4, BlockSize4K)
	one, two := alignedBuf(4096, 4096), alignedBuf(4096, 4096)
	one[0], two[0] = 1, 2
	done1, done2 := make(chan error, 1), make(chan error, 1)
	go func() { done1 <- v1.Write(0, one, 0) }() // refill: clusters 1-8, zeroing held
	<-gate.entered
	if err := s.Flush(); err != nil {
		t.Fatalf("a flush while a refill zeroes: %v", err)
	}
	go func() { done2 <- v2.Write(0, two, 0) }() // needs a refill too: must wait
	waitForRefill(t, s, done2, "a second refill went on while the first was zeroing (%v): it must wait")
	unblock()
	if err := errors.Join(<-done1, <-done2); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Zeroed != 9 || st.Refills != 1 {
		t.Fatalf("after both first writes: watermark %d, %d refills; want 9 and 1 (the second took from the first's pool)", st.Zeroed, st.Refills)
	}
	for i := range uint64(8) { // empties the pool and refills: clusters 9-16
		if err := v1.Write((i+1)*4, one, 0); err != nil {
			t.Fatal(err)
		}
	}
	if want := [][2]int64{{1 << 14, 8 << 14}, {9 << 14, 8 << 14}}; fmt.Sprint(zeroes) != fmt.Sprint(want) {
		t.Fatalf("zeroes %v, want %v", zeroes, want)
	}
	if st, w := s.Stats(), readZeroed(t, s); st.Zeroed != 17 || w != 17 {
		t.Fatalf("watermark %d in memory, %d in pebble; want 17", st.Zeroed, w)
	}
	got := alignedBuf(16<<10, 4096)
	for i, v := range []*Volume{v1, v2} {
		if err := v.Read(0, got); err != nil || got[0] != byte(i+1) || !isZero(got[1:]) {
			t.Fatalf("volume %d's first cluster: %v, want its byte then zeros", i+1, err)
		}
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// gatedZero records the Zero calls and holds up the first until release
// is closed.
type gatedZero struct {
	*MemArea
	once             sync.Once
	mu               sync.Mutex
	calls            *[][2]int64
	entered, release chan struct{}
}

func (g *gatedZero) Zero(off, n int64) error {
	g.mu.Lock()
	*g.calls = append(*g.calls, [2]int64{off, n})
	g.mu.Unlock()
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.release
	}
	return g.MemArea.Zero(off, n)
}
