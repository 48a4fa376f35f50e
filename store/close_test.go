package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// closeWorkload writes seeded tagged blocks (plain and FUA), write-zeroes
// and deallocates (whole clusters among them, so limbo fills) and flushes
// on two volumes of both block sizes, and returns the model: the tag each
// block holds (0: zeros). It ends with a deallocate of whole clusters and
// no flush, so Close finds both a ready pool and limbo.
func closeWorkload(t *testing.T, s *Store, rng *rand.Rand) map[ID][]uint64 {
	t.Helper()
	model := map[ID][]uint64{}
	vols := map[ID]*Volume{}
	for id, bs := range map[ID]uint32{1: BlockSize4K, 2: BlockSize512} {
		blocks := uint64(12*(16<<10)) / uint64(bs) // 12 clusters of 16 KiB
		vols[id] = mustCreate(t, s, id, blocks, bs)
		model[id] = make([]uint64, blocks)
	}
	buf := alignedBuf(64<<10, 4096)
	for k := range 200 {
		id := ID(1 + rng.IntN(2))
		v, tags := vols[id], model[id]
		bs := uint64(4096)
		if id == 2 {
			bs = 512
		}
		blocks := uint64(len(tags))
		n := 1 + rng.Uint64N(min(blocks, uint64(len(buf))/bs))
		lba := rng.Uint64N(blocks - n + 1)
		var err error
		switch r := rng.IntN(20); {
		case r < 14:
			for i := range n {
				fillTagged(buf[i*bs:(i+1)*bs], id, lba+i, uint64(k+1))
				tags[lba+i] = uint64(k + 1)
			}
			err = v.Write(lba, buf[:n*bs], map[bool]WriteFlags{true: FUA}[r == 0])
		case r < 16:
			clear(tags[lba : lba+n])
			err = v.WriteZeroes(lba, n, 0)
		case r < 19:
			clear(tags[lba : lba+n])
			err = v.Deallocate(lba, n)
		default:
			err = s.Flush()
		}
		if err != nil {
			t.Fatalf("op %d: %v", k, err)
		}
	}
	// Fill volume 1's first two clusters, then free them: limbo.
	for i := range uint64(8) {
		fillTagged(buf[i*4096:(i+1)*4096], 1, i, 1000)
	}
	if err := vols[1].Write(0, buf[:8*4096], 0); err != nil {
		t.Fatal(err)
	}
	if err := vols[1].Deallocate(0, 8); err != nil {
		t.Fatal(err)
	}
	clear(model[1][:8])
	return model
}

// readModel checks that every block of every volume of model reads back
// the tag the model says, whole.
func readModel(s *Store, model map[ID][]uint64) error {
	for id, tags := range model {
		v, err := s.Volume(id)
		if err != nil {
			return err
		}
		info, _ := v.Info()
		one := alignedBuf(int(info.BlockSize), 4096)
		for lba, want := range tags {
			if err := v.Read(uint64(lba), one); err != nil {
				return err
			}
			if got, err := readTag(one, id, uint64(lba)); err != nil || got != want {
				return fmt.Errorf("volume %d block %d: tag %d (%v), want %d", id, lba, got, err, want)
			}
		}
	}
	return nil
}

// TestCloseReleasesReadyPool: a clean Close deletes the reservations of
// the ready pool (limbo's first zeroed by Close's flush), durably: on what
// a power loss right after Close leaves (nothing unsynced kept), Open
// zeroes nothing and writes nothing to the area, every block reads what
// was written, Check passes, and every cluster the allocator hands out
// next reads zeros (scrub: a cluster released with old bytes in it fails
// here). Before, each Open zeroed and synced the whole ready pool again.
func TestCloseReleasesReadyPool(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0xc105e))
	fs := vfs.NewCrashableMem()
	area := NewMemArea(64*(16<<10), 512, 4096)
	cfg := memConfig(fs, area)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	model := closeWorkload(t, s, rng)
	before := s.Stats()
	if before.Ready == 0 || before.Limbo == 0 {
		t.Fatalf("the workload must leave a ready pool and limbo for Close: %+v", before)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	after := s.Stats()
	if after.Ready != 0 || after.Limbo != 0 || after.Free != before.Free+before.Ready+before.Limbo {
		t.Fatalf("after Close: %+v, want ready and limbo released to free (before: %+v)", after, before)
	}

	cfg.FS = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	cfg.Area = area.CrashClone(rand.New(rand.NewPCG(seed, 1)), 0)
	s2 := openStore(t, cfg)
	if st := s2.Stats(); st.ZeroedAtOpen != 0 || st.Ready != 0 || st.Limbo != 0 || st.Free != after.Free {
		t.Fatalf("open after a clean Close: %+v, want nothing zeroed, nothing reserved, %d free", st, after.Free)
	}
	if n := cfg.Area.(*MemArea).Pending(); n != 0 {
		t.Fatalf("open after a clean Close wrote %d times to the area", n)
	}
	if err := s2.Check(); err != nil {
		t.Fatal(err)
	}
	if err := readModel(s2, model); err != nil {
		t.Fatalf("after a clean Close and a power loss: %v", err)
	}
	if err := scrub(s2); err != nil {
		t.Fatal(err)
	}
}

// TestCrashStillZeroesAtOpen: without Close the reservations stay, and
// Open zeroes every one of them, as before: a crash after a flush (so
// the ready pool, freed clusters included, is all that is reserved)
// leaves Open exactly the ready pool to zero; the reopened store checks
// and hands out only zeros.
func TestCrashStillZeroesAtOpen(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0xc4a5))
	fs := vfs.NewCrashableMem()
	area := NewMemArea(64*(16<<10), 512, 4096)
	cfg := memConfig(fs, area)
	s := openStore(t, cfg)
	model := closeWorkload(t, s, rng)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Ready == 0 || st.Limbo != 0 {
		t.Fatalf("after the flush: %+v, want a ready pool and no limbo", st)
	}
	cfg.FS = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	cfg.Area = area.CrashClone(rand.New(rand.NewPCG(seed, 1)), 0)
	s2 := openStore(t, cfg)
	if got := s2.Stats(); got.ZeroedAtOpen != st.Ready || got.Ready != st.Ready {
		t.Fatalf("open after a crash: zeroed %d, ready %d; want the %d clusters of the ready pool zeroed and ready", got.ZeroedAtOpen, got.Ready, st.Ready)
	}
	if err := s2.Check(); err != nil {
		t.Fatal(err)
	}
	if err := readModel(s2, model); err != nil {
		t.Fatalf("after a crash: %v", err)
	}
	if err := scrub(s2); err != nil {
		t.Fatal(err)
	}
}

// TestCloseOfFailedStoreKeepsReservations: a store failed by an area sync
// error cannot know what its area holds: its Close releases nothing, and
// the next Open zeroes every reservation (the ready pool and the cluster
// taken by the write whose FUA failed, whose map key may or may not have
// reached pebble).
func TestCloseOfFailedStoreKeepsReservations(t *testing.T) {
	fs := vfs.NewMem()
	area := NewMemArea(64*(16<<10), 512, 4096)
	cfg := memConfig(fs, area)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	b := alignedBuf(4096, 4096)
	fillTagged(b, 1, 0, 1)
	if err := v.Write(0, b, FUA); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	area.Fault = func(op string, _ int64) error {
		if op == "sync" {
			return boom
		}
		return nil
	}
	fillTagged(b, 1, 8, 2)
	if err := v.Write(8, b, FUA); !errors.Is(err, ErrIO) || s.Health() == nil {
		t.Fatalf("FUA write with a failing sync: %v, health %v", err, s.Health())
	}
	st := s.Stats()
	if err := s.Close(); !errors.Is(err, ErrIO) {
		t.Fatalf("Close of a failed store: %v, want ErrIO", err)
	}
	area.Fault = nil
	s2 := openStore(t, cfg)
	// The second write's cluster: its map key was committed, unsynced,
	// and this filesystem kept it (no crash), so it is mapped, not reserved.
	if got := s2.Stats(); got.ZeroedAtOpen != st.Ready || st.Ready == 0 {
		t.Fatalf("open after the Close of a failed store: zeroed %d, want the %d clusters still reserved", got.ZeroedAtOpen, st.Ready)
	}
	if err := s2.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestCloseReleasesFragmentedPool: a ready pool of more runs of
// consecutive clusters than one release batch holds (every other cluster
// deallocated) is released whole, durably.
func TestCloseReleasesFragmentedPool(t *testing.T) {
	const clusters = 2*releaseRunsPerBatch + 100
	fs := vfs.NewCrashableMem()
	area := NewMemArea((clusters+1)*4096, 512, 4096)
	cfg := memConfig(fs, area)
	cfg.ClusterBytes = 4096
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, clusters, BlockSize4K)
	buf := alignedBuf(64<<10, 4096)
	for lba := uint64(0); lba < clusters; lba += 16 {
		n := min(16, clusters-lba)
		for i := range n {
			fillTagged(buf[i*4096:(i+1)*4096], 1, lba+i, 1)
		}
		if err := v.Write(lba, buf[:n*4096], 0); err != nil {
			t.Fatal(err)
		}
	}
	tags := make([]uint64, clusters)
	for lba := range uint64(clusters) {
		tags[lba] = 1
		if lba%2 == 1 {
			if err := v.Deallocate(lba, 1); err != nil {
				t.Fatal(err)
			}
			tags[lba] = 0
		}
	}
	if st := s.Stats(); st.Limbo <= releaseRunsPerBatch {
		t.Fatalf("%+v: want more than %d clusters in limbo", st, releaseRunsPerBatch)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.FS = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	cfg.Area = area.CrashClone(rand.New(rand.NewPCG(1, 1)), 0)
	s2 := openStore(t, cfg)
	if st := s2.Stats(); st.ZeroedAtOpen != 0 || st.Free != clusters/2 {
		t.Fatalf("open after a clean Close: %+v, want nothing zeroed and %d free", st, clusters/2)
	}
	if err := s2.Check(); err != nil {
		t.Fatal(err)
	}
	if err := readModel(s2, map[ID][]uint64{1: tags}); err != nil {
		t.Fatal(err)
	}
	if err := scrub(s2); err != nil {
		t.Fatal(err)
	}
}
