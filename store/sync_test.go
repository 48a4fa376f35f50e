package store

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// waitSynced waits until the background syncer has covered every mutation
// counted so far (it always does, within SyncInterval plus a flush: the
// deadline only turns a broken syncer into a failure instead of a hang).
func waitSynced(t *testing.T, s *Store) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for s.flushedSeq.Load() < s.seq.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("the syncer did not sync: seq %d, flushed %d", s.seq.Load(), s.flushedSeq.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSyncerMakesPlainWritesDurable: seeded plain first writes, overwrites,
// write-zeroes and deallocates, never flushed nor FUA; once the syncer
// reports it synced past them, a crash that keeps nothing unsynced (of the
// area or of pebble's files) loses none of them, and the clusters they
// freed were recycled (limbo empty).
func TestSyncerMakesPlainWritesDurable(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 5))
	fs := vfs.NewCrashableMem()
	area := NewMemArea(128*(16<<10), 512, 4096)
	cfg := memConfig(fs, area)
	cfg.SyncInterval = time.Millisecond
	s := openStore(t, cfg)
	const blocks = 256
	v := mustCreate(t, s, 1, blocks, BlockSize4K)
	tags := make([]uint64, blocks)
	buf := alignedBuf(64<<10, 4096)
	for k := range 300 {
		n := 1 + rng.Uint64N(16)
		lba := rng.Uint64N(blocks - n + 1)
		tag := uint64(k + 1)
		if rng.IntN(5) == 0 {
			if err := v.Deallocate(lba, n); err != nil {
				t.Fatal(err)
			}
			clear(tags[lba : lba+n])
			continue
		}
		for i := range n {
			fillTagged(buf[i*4096:(i+1)*4096], 1, lba+i, tag)
			tags[lba+i] = tag
		}
		if err := v.Write(lba, buf[:n*4096], 0); err != nil {
			t.Fatal(err)
		}
	}
	waitSynced(t, s)
	if st := s.Stats(); st.BackgroundSyncs == 0 || st.Flushes == 0 {
		t.Fatalf("no background sync counted: %+v", st)
	}
	crashedFS := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	crashedArea := area.CrashClone(rand.New(rand.NewPCG(seed, 6)), 0)
	cfg.FS, cfg.Area = crashedFS, crashedArea
	cfg.SyncInterval = -1
	s2 := openStore(t, cfg)
	v2, err := s2.Volume(1)
	if err != nil {
		t.Fatal(err)
	}
	for lba := range uint64(blocks) {
		if err := v2.Read(lba, buf[:4096]); err != nil {
			t.Fatal(err)
		}
		if got, err := readTag(buf[:4096], 1, lba); err != nil || got != tags[lba] {
			t.Fatalf("block %d after the crash: tag %d (%v), want %d: a synced plain write was lost", lba, got, err, tags[lba])
		}
	}
	if err := s2.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestSyncerIdle: the syncer syncs after writes and not otherwise: no
// background sync on an idle store, nor after a Flush that covered
// everything; it stops on Close.
func TestSyncerIdle(t *testing.T) {
	cfg := memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512))
	cfg.SyncInterval = time.Millisecond
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	idle := func(what string) {
		t.Helper()
		before := s.Stats().BackgroundSyncs
		time.Sleep(30 * time.Millisecond) // 30 intervals: any wake-up would have synced
		if got := s.Stats().BackgroundSyncs; got != before {
			t.Fatalf("%s: %d background syncs while idle", what, got-before)
		}
	}
	idle("fresh store")
	buf := alignedBuf(4096, 4096)
	if err := v.Write(3, buf, 0); err != nil {
		t.Fatal(err)
	}
	waitSynced(t, s)
	for s.Stats().BackgroundSyncs == 0 { // counted just after flushedSeq moves
		time.Sleep(time.Millisecond)
	}
	idle("after the sync")
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	idle("after a flush")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.syncDone:
	default:
		t.Fatal("the syncer still runs after Close")
	}
}

// TestSyncerCoveredByFlush: a plain write followed by a host Flush costs
// one sync, whichever of the Flush and the syncer's round (woken by the
// write) runs first: the other finds everything synced and syncs nothing.
// One mutation, so that every interleaving must give exactly one.
// (target/volume's TestSyncerSparedByFlush, ported when it was retired.)
func TestSyncerCoveredByFlush(t *testing.T) {
	cfg := memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512))
	cfg.SyncInterval = time.Millisecond
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	buf := alignedBuf(4096, 4096)
	if err := v.Write(3, buf, 0); err != nil { // allocate the cluster
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	before, bgBefore := s.Stats().Flushes, s.Stats().BackgroundSyncs
	buf[0] = 1
	if err := v.Write(3, buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(); err != nil {
		t.Fatal(err)
	}
	// Let the syncer's round run: it disarms when it starts, then flushes
	// under flushMu, which the empty critical section below waits for. (Were
	// the round not started yet, it would find the write synced: the count
	// could only be checked too early, never come out wrong.)
	deadline := time.Now().Add(20 * time.Second)
	for s.syncArmed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the syncer never started its round")
		}
		time.Sleep(time.Millisecond)
	}
	s.flushMu.Lock()
	s.flushMu.Unlock()
	if n := s.Stats().Flushes - before; n != 1 {
		t.Fatalf("%d syncs for a write one Flush covered, want 1", n)
	}
	if s.flushedSeq.Load() != s.seq.Load() {
		t.Fatal("writes left unsynced")
	}
	// The round found nothing to sync: it is not a background sync
	// (blk_volume_store_background_syncs_total). Stopping the syncer
	// waits for the round's end, where it counts.
	s.stopSyncer()
	if n := s.Stats().BackgroundSyncs - bgBefore; n != 0 {
		t.Fatalf("%d background syncs counted for a round that synced nothing", n)
	}
}

// TestSyncerReadOnly: a read-only store runs no syncer. (Ported from
// target/volume when it was retired.)
func TestSyncerReadOnly(t *testing.T) {
	fs, area := vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512)
	cfg := memConfig(fs, area)
	cfg.SyncInterval = time.Millisecond
	s := openStore(t, cfg)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.ReadOnly = true
	ro := openStore(t, cfg)
	if ro.syncStop != nil || ro.syncKick != nil {
		t.Fatal("a read-only store started a syncer")
	}
}
