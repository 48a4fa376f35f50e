package volume

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// waitSynced waits until the background syncer has synced every plain
// mutation acknowledged so far: the store reports it (flushedSeq reaches
// plainSeq), no sleep stands in for it. The deadline only turns a syncer
// that never syncs into a failure instead of a hang.
func waitSynced(s *Store) error {
	seq := s.plainSeq.Load()
	deadline := time.Now().Add(20 * time.Second)
	for s.flushedSeq.Load() < seq {
		if time.Now().After(deadline) {
			return fmt.Errorf("the store never synced its acknowledged plain writes: synced through %d of %d after 20 s",
				s.flushedSeq.Load(), seq)
		}
		time.Sleep(200 * time.Microsecond)
	}
	return nil
}

// TestPlainWritesSurviveCrashOnceSynced is issue 21 case 4 on pebble's
// crashable filesystem: seeded plain writes (single, multi-block and
// grouped), write-zeroes and deallocates, none flushed, none FUA, then
// nothing: the store is left idle until the background syncer reports it
// has synced past them. A crash then (keeping only what was synced) must
// lose none of them. On main nothing synced them: the WAL's last partial
// block stayed in pebble's memory and the crash lost it.
func TestPlainWritesSurviveCrashOnceSynced(t *testing.T) {
	seed := testSeed(t)
	for it := range iterations(t, 20, 2, 4) {
		if err := plainCrashOnce(seed + uint64(it)); err != nil {
			t.Fatalf("iteration %d: %v\nreplay it alone with BLK_SEED=%d BLK_ITERS=1", it, err, seed+uint64(it))
		}
	}
}

func plainCrashOnce(seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0x5c4))
	fs := vfs.NewCrashableMem()
	cfg := memConfig(fs)
	cfg.SyncInterval = []time.Duration{-1, time.Millisecond, 5 * time.Millisecond}[rng.IntN(3)]
	s, err := Open(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	model := crashState{}
	var vols []*Volume
	for i, bs := range []uint32{BlockSize4K, BlockSize512} {
		blocks := 32 + rng.IntN(64)
		v, err := s.Create(ID(i+1), CreateOptions{SizeBytes: uint64(blocks) * uint64(bs), BlockSize: bs})
		if err != nil {
			return err
		}
		vols = append(vols, v)
		model = append(model, crashVol{v.ID(), bs, make([]uint64, blocks)})
	}
	buf := make([]byte, 8*BlockSize4K)
	groups := []*WriteGroup{vols[0].NewWriteGroup(), vols[1].NewWriteGroup()}
	for k := range 1 + rng.IntN(200) {
		vi := rng.IntN(len(vols))
		v, m := vols[vi], &model[vi]
		B := uint64(m.bs)
		n := 1 + rng.Uint64N(8)
		lba := rng.Uint64N(uint64(len(m.tags)) - n + 1)
		tag := uint64(k + 1)
		switch r := rng.IntN(10); {
		case r < 5:
			for i := range n {
				fillTagged(buf[i*B:(i+1)*B], m.id, lba+i, tag)
				m.tags[lba+i] = tag
			}
			err = v.Write(lba, buf[:n*B], 0)
		case r < 7: // a group of one write per block, committed at once
			g := groups[vi]
			for i := range n {
				fillTagged(buf[i*B:(i+1)*B], m.id, lba+i, tag)
				m.tags[lba+i] = tag
				if err = g.Add(lba+i, buf[i*B:(i+1)*B]); err != nil {
					break
				}
			}
			if err == nil {
				err = g.Commit()
			}
		case r < 9:
			clear(m.tags[lba : lba+n])
			err = v.WriteZeroes(lba, n, 0)
		default:
			clear(m.tags[lba : lba+n])
			err = v.Deallocate(lba, n)
		}
		if err != nil {
			return fmt.Errorf("op %d: %w", k, err)
		}
	}
	if err := waitSynced(s); err != nil {
		return err
	}
	if s.bgSyncs.Load() == 0 {
		return errors.New("synced, but not by the background syncer")
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	cfg.FS = crashed
	s2, err := Open(cfg)
	if err != nil {
		return fmt.Errorf("reopen after crash: %w", err)
	}
	defer func() { _ = s2.Close() }()
	return checkModel(s2, model)
}

// checkModel reads every block of the model's volumes and compares tags.
func checkModel(s *Store, model crashState) error {
	for _, m := range model {
		v, err := s.Volume(m.id)
		if err != nil {
			return err
		}
		one := make([]byte, m.bs)
		for lba, want := range m.tags {
			if err := v.Read(uint64(lba), one); err != nil {
				return err
			}
			got, err := readTag(one, m.id, uint64(lba))
			if err != nil || got != want {
				return fmt.Errorf("volume %d block %d: tag %d (%v), want %d: an acknowledged plain write synced by the syncer was lost",
					m.id, lba, got, err, want)
			}
		}
	}
	return nil
}

// TestSyncerIdle: the syncer syncs once when plain writes were
// acknowledged, never when nothing was written (an idle store costs no
// wake-up and no sync), and counts its syncs.
func TestSyncerIdle(t *testing.T) {
	cfg := memConfig(vfs.NewMem())
	cfg.SyncInterval = time.Millisecond
	s := openStore(t, cfg)
	if err := waitSynced(s); err != nil { // Open's own sync (see Open)
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	base := s.bgSyncs.Load()
	if base != 1 {
		t.Fatalf("%d background syncs after Open and a Create (synced itself): want 1, Open's", base)
	}
	// A synced store stays still: 50 intervals, no sync.
	time.Sleep(50 * cfg.SyncInterval)
	if n := s.bgSyncs.Load(); n != base {
		t.Fatalf("idle store: %d background syncs, want %d", n, base)
	}
	// FUA writes and flushes sync themselves: nothing for the syncer.
	if err := v.Write(0, pattern(BlockSize4K, 1), FUA); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(); err != nil {
		t.Fatal(err)
	}
	if s.syncArmed.Load() {
		t.Fatal("the syncer was armed by a FUA write or a flush")
	}
	// One plain write: exactly one background sync, then still again.
	if err := v.Write(1, pattern(BlockSize4K, 2), 0); err != nil {
		t.Fatal(err)
	}
	if err := waitSynced(s); err != nil {
		t.Fatal(err)
	}
	if n := s.bgSyncs.Load(); n != base+1 {
		t.Fatalf("one plain write: %d background syncs, want %d", n-base, 1)
	}
	time.Sleep(50 * cfg.SyncInterval)
	if n := s.bgSyncs.Load(); n != base+1 {
		t.Fatalf("idle after one synced write: %d background syncs, want %d", n-base, 1)
	}
	if e := s.Engine(); e.BackgroundSyncs != base+1 {
		t.Fatalf("Engine().BackgroundSyncs = %d, want %d", e.BackgroundSyncs, base+1)
	}
}

// TestSyncerSparedByFlush: a host flush after plain writes covers them, so
// the syncer, woken by the first of them, finishes its round without a
// sync of its own. The syncer is held (testBeforeSync) until the flush is
// done, so that the order does not depend on timing.
func TestSyncerSparedByFlush(t *testing.T) {
	cfg := memConfig(vfs.NewMem())
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	waitRounds := func(n uint64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for s.syncRounds.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("the syncer finished %d rounds, want %d", s.syncRounds.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitRounds(1) // Open's sync; the syncer no longer reads testBeforeSync
	syncs := s.bgSyncs.Load()
	flushed := make(chan struct{})
	s.testBeforeSync = func() { <-flushed }
	for i := range 8 {
		if err := v.Write(uint64(i), pattern(BlockSize4K, byte(i)), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.Flush(); err != nil {
		t.Fatal(err)
	}
	close(flushed)
	waitRounds(2)
	if n := s.bgSyncs.Load() - syncs; n != 0 {
		t.Fatalf("the syncer synced %d times after a flush had covered every write", n)
	}
	if s.flushedSeq.Load() != s.plainSeq.Load() {
		t.Fatal("writes left unsynced")
	}
}

// TestSyncerStopsOnClose: Close with plain writes waiting for a long
// interval stops the syncer (it never calls pebble after Close) and still
// makes the writes durable (Close flushes).
func TestSyncerStopsOnClose(t *testing.T) {
	fs := vfs.NewCrashableMem()
	cfg := memConfig(fs)
	cfg.SyncInterval = MaxSyncInterval
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	want := pattern(BlockSize4K, 3)
	if err := v.Write(5, want, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.syncDone:
	default:
		t.Fatal("Close returned with the syncer still running")
	}
	cfg.FS = fs.CrashClone(vfs.CrashCloneCfg{})
	s2 := openStore(t, cfg)
	v2, err := s2.Volume(1)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, BlockSize4K)
	if err := v2.Read(5, got); err != nil || string(got) != string(want) {
		t.Fatalf("after Close and a crash: read %v, data equal %v", err, string(got) == string(want))
	}
}

// TestSyncerReadOnly: a read-only store runs no syncer.
func TestSyncerReadOnly(t *testing.T) {
	fs := vfs.NewMem()
	cfg := memConfig(fs)
	s := openStore(t, cfg)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.ReadOnly = true
	ro := openStore(t, cfg)
	if ro.syncStop != nil {
		t.Fatal("a read-only store started a syncer")
	}
}
