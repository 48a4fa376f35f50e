package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestCrashRecovery crashes the store at every step of the write path and
// checks what survives. Each seeded iteration runs random writes (some
// FUA), overwrites, write-zeroes (some FUA), deallocates, flushes, forced
// shrinks, grows and delete-and-recreates on volumes on pebble's crashable
// filesystem and a MemArea, and crashes once: at the k-th time the write
// path reaches a chosen step (hookPoint: after a refill's reservations,
// after the area grew and before the format record says so, after a
// refill zeroed clusters past the zeroed watermark and after it synced
// them (before the commit of their 'R' keys and the new watermark),
// between a first write's data and its map commit, between the map commit
// and its publication, after a free's commit, in a flush after zeroing
// limbo and after syncing the area, in delete/shrink after zeroing and
// after the new size), or after the last operation. Rounds of the
// background refill (refillAhead, called between operations as its
// goroutine would run them; the goroutine itself is off) reach the
// refill's steps too, and every one of those steps is crashed inside a
// background round in some iteration. Both the filesystem
// and the area are cloned at that instant, keeping what was synced and a
// random part of the rest (the area torn per block: a crash mid-batch of
// a zeroing keeps part of it). Half the iterations (all that crash at the
// watermark's steps) run on an area that starts full of a random pattern,
// as a used block device does (lazily zeroed); none of it may ever be
// read. The store is reopened on the clones, and:
//
//   - every block reads back whole (never torn, never another volume's or
//     another LBA's data) and holds a value it may hold: what it held at
//     its last durable point (a completed Flush, its FUA write or
//     write-zeroes, its volume's creation or growth), or a value written
//     after that;
//   - the volumes and their sizes are those of the model (Create, Delete
//     and Resize are durable; a delete or shrink the crash interrupted is
//     finished by Open);
//   - Check passes (no cluster mapped twice, the allocator equals its
//     recomputation from pebble), and after deleting every volume and a
//     flush every cluster is free or ready: none leaked.
func TestCrashRecovery(t *testing.T) {
	seed := testSeed(t)
	n := iterations(t, 300, 6, 10)
	crashed := make([]int, writePathPoints+1) // per hook point; the last: crashed after the last operation
	inRound := make([]int, writePathPoints+1) // crashes inside a background refill round
	for it := range n {
		s := seed + uint64(it)
		where, bg, err := crashOnce(s)
		if err != nil {
			t.Fatalf("iteration %d: %v\nreplay it alone with BLK_SEED=%d BLK_ITERS=1", it, err, s)
		}
		crashed[where]++
		if bg {
			inRound[where]++
		}
	}
	t.Logf("crashes per step: %v; of them in a background refill: %v", crashed, inRound)
	if n >= 100 {
		for p := range writePathPoints {
			if crashed[p] == 0 {
				t.Errorf("no iteration crashed at step %v: the harness does not reach it", p)
			}
		}
		for _, p := range []hookPoint{hookReserved, hookAheadZeroed, hookAheadSynced} {
			if inRound[p] == 0 {
				t.Errorf("no iteration crashed at step %v in a background refill: the harness does not reach it", p)
			}
		}
	}
}

// writePathPoints are the hook points the write path reaches (the
// upgrade's are tested in upgrade_test.go); as a crash point it means
// "after the last operation".
const writePathPoints = hookMigrated

// cblock is the model of one block: cur is the last value written (0:
// zeros), durable what it held at its last durable point, later every
// value written since.
type cblock struct {
	cur, durable uint64
	later        []uint64
}

type cvol struct {
	id     ID
	bs     uint32
	blocks []cblock
}

type cmodel map[ID]*cvol

func (m cmodel) clone() cmodel {
	out := cmodel{}
	for id, v := range m {
		c := &cvol{id: v.id, bs: v.bs, blocks: slices.Clone(v.blocks)}
		for i := range c.blocks {
			c.blocks[i].later = slices.Clone(c.blocks[i].later)
		}
		out[id] = c
	}
	return out
}

func (v *cvol) set(lba, n, tag uint64) {
	for i := lba; i < lba+n; i++ {
		b := &v.blocks[i]
		b.cur = tag
		b.later = append(b.later, tag)
	}
}

func (v *cvol) durable(lba, n uint64) {
	for i := lba; i < lba+n; i++ {
		b := &v.blocks[i]
		b.durable, b.later = b.cur, nil
	}
}

func crashOnce(seed uint64) (where hookPoint, inRound bool, err error) {
	rng := rand.New(rand.NewPCG(seed, 0xc4a54))
	bs := []uint32{BlockSize512, BlockSize4K}[rng.IntN(2)]
	fs := vfs.NewCrashableMem()
	// The crash: at the k-th time the write path reaches point, or after
	// the last operation.
	point := hookPoint(rng.IntN(int(writePathPoints) + 1))
	lazy := point == hookAheadZeroed || point == hookAheadSynced || rng.IntN(2) == 0
	area := NewMemArea(24*(16<<10), 512, int(bs))
	if lazy {
		area = NewUnzeroedMemArea(24*(16<<10), 512, int(bs), seed)
	}
	cfg := memConfig(fs, area)
	cfg.AreaMaxBytes = 256 * (16 << 10) // grows as volumes fill; room for all of them: no ErrNoSpace here
	s, err := Open(cfg)
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = s.Close() }()
	// The background refill's rounds run between operations, below a
	// low-water mark of half the pool: in half the iterations that crash
	// at the refill's steps before every operation (nearly every refill
	// is then a background one), else before one in eight.
	bgEvery := 8
	if (point == hookReserved || point == hookAheadZeroed || point == hookAheadSynced) && rng.IntN(2) == 0 {
		bgEvery = 1
	}
	inBg := false

	model := cmodel{}
	create := func(id ID) error {
		blocks := uint64(16+rng.IntN(200)) * uint64(BlockSize4K/bs) / 2
		if _, err := s.Create(id, CreateOptions{SizeBytes: blocks * uint64(bs), BlockSize: bs}); err != nil {
			return err
		}
		model[id] = &cvol{id: id, bs: bs, blocks: make([]cblock, blocks)}
		return nil
	}
	for id := ID(1); id <= 3; id++ {
		if err := create(id); err != nil {
			return 0, false, err
		}
	}

	if s.format.lazy != lazy {
		return 0, false, fmt.Errorf("a store on an area with Unzeroed %v is lazy %v", lazy, s.format.lazy)
	}
	k := 1 + rng.IntN(12)
	if point == hookGrown || point == hookAheadZeroed || point == hookAheadSynced {
		k = 1 + rng.IntN(3) // the area grows, the watermark moves, a few times per run
	}
	var (
		fsClone   vfs.FS
		areaClone *MemArea
		atCrash   cmodel
		seen      int
	)
	unsynced := 0
	if rng.IntN(3) != 0 {
		unsynced = rng.IntN(101)
	}
	crash := func() {
		fsClone = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: unsynced, RNG: rand.New(rand.NewPCG(seed, 1))})
		areaClone = area.CrashClone(rand.New(rand.NewPCG(seed, 2)), unsynced)
		atCrash = model.clone()
		inRound = inBg
	}
	s.testHook = func(p hookPoint) {
		if p == point && atCrash == nil {
			if seen++; seen == k {
				crash()
			}
		}
	}

	buf := alignedBuf(64<<10, 4096)
	nops := 30 + rng.IntN(250)
	for op := 0; op < nops && atCrash == nil; op++ {
		if rng.IntN(bgEvery) == 0 {
			inBg = true
			_, err := s.refillAhead(cfg.ReadyClusters / 2)
			inBg = false
			if err != nil {
				return 0, false, fmt.Errorf("op %d: background refill: %w", op, err)
			}
			if atCrash != nil {
				break
			}
		}
		ids := make([]ID, 0, len(model))
		for id := range model {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		m := model[ids[rng.IntN(len(ids))]]
		v, err := s.Volume(m.id)
		if err != nil {
			return 0, false, fmt.Errorf("op %d: %w", op, err)
		}
		blocks, B := uint64(len(m.blocks)), uint64(bs)
		tag := uint64(op + 1)
		switch r := rng.IntN(100); {
		case r < 50: // write
			n := 1 + rng.Uint64N(min(blocks, uint64(64<<10)/B))
			lba := rng.Uint64N(blocks - n + 1)
			for i := range n {
				fillTagged(buf[i*B:(i+1)*B], m.id, lba+i, tag)
			}
			fua := rng.IntN(5) == 0
			m.set(lba, n, tag)
			if err := v.Write(lba, buf[:n*B], map[bool]WriteFlags{true: FUA}[fua]); err != nil {
				return 0, false, fmt.Errorf("op %d: write: %w", op, err)
			}
			if fua {
				m.durable(lba, n)
			}
		case r < 62, r < 72: // write zeroes (sometimes FUA), deallocate
			n := 1 + rng.Uint64N(blocks)
			lba := rng.Uint64N(blocks - n + 1)
			m.set(lba, n, 0)
			fua := r < 62 && rng.IntN(3) == 0
			if r < 62 {
				err = v.WriteZeroes(lba, n, map[bool]WriteFlags{true: FUA}[fua])
			} else {
				err = v.Deallocate(lba, n)
			}
			if err != nil {
				return 0, false, fmt.Errorf("op %d: remove: %w", op, err)
			}
			if fua {
				m.durable(lba, n)
			}
		case r < 84: // flush
			if err := s.Flush(); err != nil {
				return 0, false, fmt.Errorf("op %d: flush: %w", op, err)
			}
			for _, mv := range model {
				mv.durable(0, uint64(len(mv.blocks)))
			}
		case r < 90: // resize: a forced shrink is durable from its first step on
			nb := uint64(8+rng.IntN(200)) * uint64(BlockSize4K/bs) / 2
			if nb < blocks {
				m.blocks = m.blocks[:nb]
			}
			if err := s.Resize(m.id, nb*B, true); err != nil {
				return 0, false, fmt.Errorf("op %d: resize: %w", op, err)
			}
			if nb > blocks {
				m.blocks = append(m.blocks, make([]cblock, nb-blocks)...)
			}
		case r < 93: // delete (gone from its first step on) and re-create
			delete(model, m.id)
			if err := s.Delete(m.id); err != nil {
				return 0, false, fmt.Errorf("op %d: delete: %w", op, err)
			}
			if atCrash != nil {
				break
			}
			if err := create(m.id); err != nil {
				return 0, false, fmt.Errorf("op %d: create: %w", op, err)
			}
		default: // live read
			n := 1 + rng.Uint64N(min(blocks, uint64(64<<10)/B))
			lba := rng.Uint64N(blocks - n + 1)
			if err := v.Read(lba, buf[:n*B]); err != nil {
				return 0, false, fmt.Errorf("op %d: read: %w", op, err)
			}
			for i := range n {
				got, err := readTag(buf[i*B:(i+1)*B], m.id, lba+i)
				if err != nil || got != m.blocks[lba+i].cur {
					return 0, false, fmt.Errorf("op %d: live read of volume %d block %d: %d (%v), want %d", op, m.id, lba+i, got, err, m.blocks[lba+i].cur)
				}
			}
		}
	}
	where = point
	if atCrash == nil {
		where = writePathPoints
		crash()
	}
	s.testHook = nil
	_ = s.Close() // the original goes on to its end; the clones are what survived

	cfg.FS, cfg.Area = fsClone, areaClone
	s2, err := Open(cfg)
	if err != nil {
		return where, inRound, fmt.Errorf("crash at %v (unsynced kept %d%%, lazy %v): reopen: %w", where, unsynced, lazy, err)
	}
	defer func() { _ = s2.Close() }()
	if err := verifyCrash(s2, atCrash); err != nil {
		return where, inRound, fmt.Errorf("crash at %v #%d (unsynced kept %d%%, lazy %v): %w", where, k, unsynced, lazy, err)
	}
	if err := scrub(s2); err != nil {
		return where, inRound, fmt.Errorf("crash at %v #%d (unsynced kept %d%%, lazy %v): %w", where, k, unsynced, lazy, err)
	}
	if err := drain(s2); err != nil {
		return where, inRound, fmt.Errorf("crash at %v #%d: %w", where, k, err)
	}
	return where, inRound, nil
}

func verifyCrash(s *Store, want cmodel) error {
	if err := s.Check(); err != nil {
		return err
	}
	infos, err := s.List()
	if err != nil {
		return err
	}
	if len(infos) != len(want) {
		return fmt.Errorf("%d volumes after the crash, want %d (%v)", len(infos), len(want), infos)
	}
	for _, in := range infos {
		m := want[in.ID]
		if m == nil || in.Blocks() != uint64(len(m.blocks)) {
			return fmt.Errorf("volume %d of %d blocks after the crash; the model has %v", in.ID, in.Blocks(), m != nil)
		}
		v, err := s.Volume(in.ID)
		if err != nil {
			return err
		}
		one := alignedBuf(int(in.BlockSize), 4096)
		for lba := range in.Blocks() {
			if err := v.Read(lba, one); err != nil {
				return fmt.Errorf("read volume %d block %d: %w", in.ID, lba, err)
			}
			got, err := readTag(one, in.ID, lba)
			if errors.Is(err, errTorn) {
				return fmt.Errorf("volume %d block %d is torn or foreign", in.ID, lba)
			}
			b := m.blocks[lba]
			if got != b.durable && !slices.Contains(b.later, got) {
				return fmt.Errorf("volume %d block %d holds tag %d; it may hold %d (durable) or %v (since)", in.ID, lba, got, b.durable, b.later)
			}
		}
	}
	return nil
}

// scrub creates a volume as large as every free and ready cluster, writes
// the first block of each of its clusters (so each takes one from the
// allocator) and reads it all: every other block must be zeros.
func scrub(s *Store) error {
	st := s.Stats()
	n := st.Free + st.Ready
	if n == 0 {
		return nil
	}
	const id = 1 << 40
	C := st.ClusterBytes
	v, err := s.Create(id, CreateOptions{SizeBytes: n * C, BlockSize: BlockSize4K})
	if err != nil {
		return err
	}
	per := C / BlockSize4K
	buf := alignedBuf(int(C), 4096)
	for c := range n {
		fillTagged(buf[:BlockSize4K], id, c*per, 7)
		if err := v.Write(c*per, buf[:BlockSize4K], 0); err != nil {
			return fmt.Errorf("scrub: write cluster %d: %w", c, err)
		}
	}
	if st := s.Stats(); st.Free+st.Ready != 0 {
		return fmt.Errorf("scrub: %+v: clusters left over", st)
	}
	for c := range n {
		if err := v.Read(c*per, buf); err != nil {
			return err
		}
		for i := range per {
			want := uint64(0)
			if i == 0 {
				want = 7
			}
			if got, err := readTag(buf[i*BlockSize4K:(i+1)*BlockSize4K], id, c*per+i); err != nil || got != want {
				return fmt.Errorf("scrub: a cluster handed out after the crash holds old bytes: block %d of cluster %d: tag %d (%v), want %d", i, c, got, err, want)
			}
		}
	}
	return s.Check()
}
