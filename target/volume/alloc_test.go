package volume

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestSteadyStateAllocs guards the data path's allocations once pools are
// warm and pebble's memtable has grown to its full size. Every request is
// allocation-free except two, where pebble allocates:
//
//   - a single-block read served from an sstable: pebble's point lookup
//     (DB.Get) appends a filter to a nil slice for each sstable it
//     consults (sstable.Reader.TryAddBlockPropertyFilterForHideObsoletePoints),
//     1 allocation of 16 bytes. Multi-block reads use an iterator, whose
//     filter slice pebble preallocates.
//   - a range deletion: the memtable replaces its cache of fragmented
//     range tombstones (keySpanCache.invalidate), 1 allocation; the next
//     read re-fragments them. One reason small deallocations use point
//     deletes (doc.go).
//
// Pebble also allocates when it rotates the memtable and WAL (every
// MemTableBytes written; it starts at 256 KiB and doubles up to
// MemTableBytes), so the test writes 2 × MemTableBytes before measuring.
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	cfg := memConfig(vfs.NewMem())
	cfg.MemTableBytes = 64 << 20 // no memtable flush during the measurement
	cfg.MaxTransferBytes = 128 << 10
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 1024, BlockSize4K)
	cold := mustCreate(t, s, 2, 1024, BlockSize4K)
	one := pattern(4096, 1)
	many := pattern(32*4096, 2)
	for lba := uint64(0); lba < 1024; lba += 32 {
		if err := cold.Write(lba, many, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Flush(); err != nil { // volume 2 into an sstable
		t.Fatal(err)
	}
	var lba uint64
	next := func() uint64 { lba = (lba + 37) % (1024 - 32); return lba }
	// Grow the memtable to its full size: 256 KiB doubling to 64 MiB.
	for range 2 * cfg.MemTableBytes / len(many) {
		if err := v.Write(next(), many, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Start the measurements on an empty memtable of full size, so that
	// no rotation and no flush (whose sstable writing allocates on a
	// background goroutine, counted by AllocsPerRun) falls inside them.
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, s)
	for _, c := range []struct {
		name string
		max  float64
		fn   func() error
	}{
		{"write 1 block", 0, func() error { return v.Write(next(), one, 0) }},
		{"write 32 blocks", 0, func() error { return v.Write(next(), many, 0) }},
		{"write 1 block FUA", 0, func() error { return v.Write(next(), one, FUA) }},
		{"read 1 block (memtable)", 0, func() error { return v.Read(next(), one) }},
		{"read 32 blocks (memtable)", 0, func() error { return v.Read(next(), many) }},
		{"read 1 block (sstable)", 0, func() error { return cold.Read(next(), one) }},
		{"read 32 blocks (sstable)", 0, func() error { return cold.Read(next(), many) }},
		{"view 32 blocks", 0, func() error { return v.View(next(), 32, func(uint64, []byte) {}) }},
		{"write zeroes 8 (point deletes)", 0, func() error { return v.WriteZeroes(next(), 8, 0) }},
		{"deallocate 512 (range deletion)", 1, func() error { return v.Deallocate(next()%512, 512) }},
		{"flush", 0, func() error { return v.Flush() }},
	} {
		for range 50 { // warm pools and batch buffers
			if err := c.fn(); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		measure := func() float64 {
			return testing.AllocsPerRun(100, func() {
				if e := c.fn(); e != nil {
					err = e
				}
			})
		}
		// The best of three windows: AllocsPerRun counts every
		// goroutine, and pebble's background goroutines allocate now
		// and then; an allocation of the request's own path shows in
		// every window.
		got := min(measure(), measure(), measure())
		if err != nil {
			t.Fatal(err)
		}
		if got > c.max {
			t.Errorf("%s: %.2f allocations per request, want ≤ %.0f", c.name, got, c.max)
		}
	}
}

// waitQuiet waits until pebble has no flush or compaction running (seen
// idle five times 20 ms apart): their sstable writing allocates on
// background goroutines, which AllocsPerRun counts.
func waitQuiet(t *testing.T, s *Store) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for idle := 0; idle < 5; {
		if time.Now().After(deadline) {
			t.Fatal("pebble did not go quiet within 30 s")
		}
		m := s.db.Metrics()
		if m.Flush.NumInProgress == 0 && m.Compact.NumInProgress == 0 {
			idle++
		} else {
			idle = 0
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWriteGroupAllocs: adding and committing a group of writes allocates
// nothing once the group exists.
func TestWriteGroupAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	cfg := memConfig(vfs.NewMem())
	cfg.MemTableBytes = 64 << 20
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 1024, BlockSize4K)
	g := v.NewWriteGroup()
	blk := pattern(4096, 1)
	var lba uint64
	run := func() {
		for range 32 {
			lba = (lba + 37) % 1024
			if err := g.Add(lba, blk); err != nil {
				t.Fatal(err)
			}
		}
		if err := g.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// Grow the memtable to its full size (it starts at 256 KiB and
	// doubles), then start on an empty one with pebble quiet, so that no
	// rotation or flush (which allocate) falls inside the measurement.
	big := pattern(s.Config().MaxTransferBytes, 2)
	for i := range 2 * cfg.MemTableBytes / len(big) {
		if err := v.Write(uint64(i*len(big)/4096)%(1024-uint64(len(big)/4096)), big, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		run()
	}
	waitQuiet(t, s)
	// The best of three windows: AllocsPerRun counts every goroutine,
	// and pebble's background goroutines allocate now and then; an
	// allocation of the group's own path would show in every window.
	best := testing.AllocsPerRun(100, run)
	for range 2 {
		best = min(best, testing.AllocsPerRun(100, run))
	}
	if best > 0 {
		t.Errorf("%.2f allocations per group of 32 writes, want 0", best)
	}
}
