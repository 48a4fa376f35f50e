package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestSnapshotModel runs seeded random operations on volumes, their
// snapshots and clones against a model that says what every block of
// every object must read (docs/snapshots.md §7.1): writes of one block to
// three clusters at random offsets (partial, whole and multi-cluster
// copies on write), write zeroes and deallocates (partial and whole
// clusters, over own, inherited and tombstone entries), snapshots, clones
// of a random snapshot, grows, deletes in random order (refused with
// ErrHasChildren where they must be), the refusals (writes and SetState
// to a snapshot, a shrink of an object with a parent), flushes and clean
// reopens. After each operation the object it touched is read whole and
// compared; Check runs every few operations and at the end, where every
// object is read whole and then all are deleted, children first: every
// cluster must be free or ready again.
func TestSnapshotModel(t *testing.T) {
	seed := testSeed(t)
	for it := range iterations(t, 12, 4, 4) {
		s := seed + uint64(it)
		if err := snapModelOnce(s, 600); err != nil {
			t.Fatalf("iteration %d: %v\nreplay it alone with BLK_SEED=%d BLK_ITERS=1", it, err, s)
		}
	}
}

// sobj is the model of one object: the tag every block reads (0: zeros;
// tags are written with fillTagged for ID 0, so a clone reads its
// origin's blocks as they were written).
type sobj struct {
	id     ID
	kind   Kind
	parent ID
	bs     uint32
	tags   []uint64
}

type smodel struct {
	objs map[ID]*sobj
	next ID
}

func (m *smodel) sorted(kind Kind) []*sobj {
	var out []*sobj
	for _, o := range m.objs {
		if o.kind == kind {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b *sobj) int { return int(a.id) - int(b.id) })
	return out
}

func (m *smodel) children(id ID) int {
	n := 0
	for _, o := range m.objs {
		if o.parent == id {
			n++
		}
	}
	return n
}

// verifyObj reads o whole and compares every block with the model.
func verifyObj(s *Store, o *sobj, buf []byte) error {
	v, err := s.Volume(o.id)
	if err != nil {
		return err
	}
	info, err := v.Info()
	if err != nil {
		return err
	}
	if info.Kind != o.kind || info.Parent != o.parent || info.Blocks() != uint64(len(o.tags)) {
		return fmt.Errorf("object %d: info %+v; the model: %v, parent %d, %d blocks", o.id, info, o.kind, o.parent, len(o.tags))
	}
	B := uint64(o.bs)
	per := uint64(len(buf)) / B
	for lba := uint64(0); lba < uint64(len(o.tags)); lba += per {
		n := min(per, uint64(len(o.tags))-lba)
		if err := v.Read(lba, buf[:n*B]); err != nil {
			return fmt.Errorf("object %d: read at %d: %w", o.id, lba, err)
		}
		for i := range n {
			got, err := readTag(buf[i*B:(i+1)*B], 0, lba+i)
			if err != nil || got != o.tags[lba+i] {
				return fmt.Errorf("%v %d (parent %d) block %d: tag %d (%v), want %d", o.kind, o.id, o.parent, lba+i, got, err, o.tags[lba+i])
			}
		}
	}
	return nil
}

func snapModelOnce(seed uint64, nops int) error {
	rng := rand.New(rand.NewPCG(seed, 0x5a9))
	fs := vfs.NewMem()
	const C = 16 << 10
	area := NewMemArea(1024*C, 512, 512)
	cfg := memConfig(fs, area)
	s, err := Open(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	m := &smodel{objs: map[ID]*sobj{}, next: 1}
	create := func() error {
		bs := []uint32{BlockSize512, BlockSize4K}[rng.IntN(2)]
		blocks := uint64(4+rng.IntN(80)) * (C / 4096) / 2 * uint64(BlockSize4K/bs)
		id := m.next
		m.next++
		if _, err := s.Create(id, CreateOptions{SizeBytes: blocks * uint64(bs), BlockSize: bs}); err != nil {
			return err
		}
		m.objs[id] = &sobj{id: id, kind: KindVolume, bs: bs, tags: make([]uint64, blocks)}
		return nil
	}
	for range 2 {
		if err := create(); err != nil {
			return err
		}
	}
	buf := alignedBuf(3*C+4096, 4096)
	rbuf := alignedBuf(64<<10, 4096)
	for k := range nops {
		tag := uint64(k + 1)
		vols := m.sorted(KindVolume)
		snaps := m.sorted(KindSnapshot)
		var touched *sobj
		switch r := rng.IntN(100); {
		case r < 40 && len(vols) > 0: // write 1 block to 3 clusters at a random offset
			o := vols[rng.IntN(len(vols))]
			B := uint64(o.bs)
			n := min(uint64(len(o.tags)), 1+rng.Uint64N(3*C/B))
			lba := rng.Uint64N(uint64(len(o.tags)) - n + 1)
			b := buf[:n*B]
			if rng.IntN(8) == 0 {
				b = buf[512 : 512+n*B] // aligned to 512 only: may bounce
			}
			for i := range n {
				fillTagged(b[i*B:(i+1)*B], 0, lba+i, tag)
				o.tags[lba+i] = tag
			}
			v, err := s.Volume(o.id)
			if err != nil {
				return err
			}
			if err := v.Write(lba, b, WriteFlags(rng.IntN(2))); err != nil {
				return fmt.Errorf("op %d: write %v %d at %d+%d: %w", k, o.kind, o.id, lba, n, err)
			}
			touched = o
		case r < 55 && len(vols) > 0: // write zeroes or deallocate, partial and whole clusters
			o := vols[rng.IntN(len(vols))]
			n := 1 + rng.Uint64N(min(uint64(len(o.tags)), 4*C/uint64(o.bs)))
			lba := rng.Uint64N(uint64(len(o.tags)) - n + 1)
			clear(o.tags[lba : lba+n])
			v, err := s.Volume(o.id)
			if err != nil {
				return err
			}
			if rng.IntN(2) == 0 {
				err = v.WriteZeroes(lba, n, WriteFlags(rng.IntN(2)))
			} else {
				err = v.Deallocate(lba, n)
			}
			if err != nil {
				return fmt.Errorf("op %d: remove %d+%d of %d: %w", k, lba, n, o.id, err)
			}
			touched = o
		case r < 63 && len(vols) > 0 && len(m.objs) < 14: // snapshot
			o := vols[rng.IntN(len(vols))]
			id := m.next
			m.next++
			if err := s.Snapshot(o.id, id); err != nil {
				return fmt.Errorf("op %d: snapshot %d of %d: %w", k, id, o.id, err)
			}
			if err := s.Snapshot(o.id, id); err != nil { // idempotent
				return fmt.Errorf("op %d: snapshot %d of %d again: %w", k, id, o.id, err)
			}
			m.objs[id] = &sobj{id: id, kind: KindSnapshot, parent: o.parent, bs: o.bs, tags: slices.Clone(o.tags)}
			o.parent = id
			touched = m.objs[id]
		case r < 68 && len(snaps) > 0 && len(m.objs) < 14: // clone
			o := snaps[rng.IntN(len(snaps))]
			id := m.next
			m.next++
			if err := s.Clone(o.id, id); err != nil {
				return fmt.Errorf("op %d: clone %d of %d: %w", k, id, o.id, err)
			}
			if err := s.Clone(o.id, id); err != nil {
				return fmt.Errorf("op %d: clone %d of %d again: %w", k, id, o.id, err)
			}
			m.objs[id] = &sobj{id: id, kind: KindVolume, parent: o.id, bs: o.bs, tags: slices.Clone(o.tags)}
			touched = m.objs[id]
		case r < 72 && len(vols) > 0: // grow
			o := vols[rng.IntN(len(vols))]
			add := uint64(1+rng.IntN(40)) * 512 / uint64(o.bs) * uint64(o.bs/512)
			if o.bs == BlockSize4K {
				add = uint64(1 + rng.IntN(10))
			}
			nb := uint64(len(o.tags)) + add
			if err := s.Resize(o.id, nb*uint64(o.bs), false); err != nil {
				return fmt.Errorf("op %d: grow %d: %w", k, o.id, err)
			}
			o.tags = append(o.tags, make([]uint64, add)...)
			touched = o
		case r < 78 && len(m.objs) > 1: // delete a random object
			all := append(vols, snaps...)
			o := all[rng.IntN(len(all))]
			err := s.Delete(o.id)
			if m.children(o.id) > 0 {
				if !errors.Is(err, ErrHasChildren) {
					return fmt.Errorf("op %d: delete of %v %d with children: %v, want ErrHasChildren", k, o.kind, o.id, err)
				}
				break
			}
			if err != nil {
				return fmt.Errorf("op %d: delete %v %d: %w", k, o.kind, o.id, err)
			}
			delete(m.objs, o.id)
		case r < 81: // the refusals
			if len(snaps) > 0 {
				o := snaps[rng.IntN(len(snaps))]
				v, err := s.Volume(o.id)
				if err != nil {
					return err
				}
				fillTagged(buf[:o.bs], 0, 0, tag)
				if err := v.Write(0, buf[:o.bs], 0); !errors.Is(err, ErrReadOnly) {
					return fmt.Errorf("op %d: write to snapshot %d: %v, want ErrReadOnly", k, o.id, err)
				}
				if err := v.Deallocate(0, 1); !errors.Is(err, ErrReadOnly) {
					return fmt.Errorf("op %d: deallocate of snapshot %d: %v, want ErrReadOnly", k, o.id, err)
				}
				if err := s.SetState(o.id, StateOnline); !errors.Is(err, ErrInvalid) {
					return fmt.Errorf("op %d: set state of snapshot %d: %v, want ErrInvalid", k, o.id, err)
				}
				if err := s.Snapshot(o.id, m.next); !errors.Is(err, ErrInvalid) {
					return fmt.Errorf("op %d: snapshot of snapshot %d: %v, want ErrInvalid", k, o.id, err)
				}
				touched = o
			}
			for _, o := range vols {
				if o.parent != 0 {
					err := s.Resize(o.id, uint64(len(o.tags)-1)*uint64(o.bs), true)
					if !errors.Is(err, ErrInvalid) {
						return fmt.Errorf("op %d: shrink of %d (parent %d): %v, want ErrInvalid", k, o.id, o.parent, err)
					}
					if len(snaps) > 0 {
						if err := s.Snapshot(o.id, snaps[0].id); !errors.Is(err, ErrExists) && o.parent != snaps[0].id {
							return fmt.Errorf("op %d: snapshot of %d named as snapshot %d: %v, want ErrExists", k, o.id, snaps[0].id, err)
						}
					}
					break
				}
			}
		case r < 84:
			if err := s.Flush(); err != nil {
				return err
			}
		case r < 87: // clean reopen
			if err := s.Close(); err != nil {
				return fmt.Errorf("op %d: close: %w", k, err)
			}
			if s, err = Open(cfg); err != nil {
				return fmt.Errorf("op %d: reopen: %w", k, err)
			}
		case r < 89 && len(m.objs) < 14:
			if err := create(); err != nil {
				return err
			}
		}
		if touched != nil {
			if err := verifyObj(s, touched, rbuf); err != nil {
				return fmt.Errorf("op %d: %w", k, err)
			}
		}
		if k%25 == 0 {
			if err := s.Check(); err != nil {
				return fmt.Errorf("op %d: %w", k, err)
			}
		}
	}
	if err := s.Check(); err != nil {
		return err
	}
	for _, o := range m.objs {
		if err := verifyObj(s, o, rbuf); err != nil {
			return fmt.Errorf("at the end: %w", err)
		}
	}
	if err := s.Close(); err != nil {
		return err
	}
	if s, err = Open(cfg); err != nil {
		return fmt.Errorf("final reopen: %w", err)
	}
	for _, o := range m.objs {
		if err := verifyObj(s, o, rbuf); err != nil {
			return fmt.Errorf("after the final reopen: %w", err)
		}
	}
	return drain(s)
}

// TestSnapshotCrash crashes the store at each step of a snapshot, a clone
// and a copy-on-write (docs/snapshots.md §1.4: hookSnapFlushed,
// hookSnapCommitted, hookCloneCommitted, and the first write's
// hookDataWritten and hookMapCommitted, which copies on write pass too),
// at a free's commit (tombstones), or after the last operation, with the
// crash test's machinery: pebble's crashable filesystem and a MemArea,
// each keeping what was synced and a random part of the rest. After Open
// on the clones: the objects are those of the model (a snapshot or a
// clone exists iff its commit was durable), every block of every object
// reads its value at its last durable point or one written since (a
// snapshot: exactly what its volume held when it was taken, since it
// flushes first), never another block's bytes, never zeros where a copy
// on write lost the parent's bytes; Check passes, and every cluster
// handed out afterwards reads zeros (scrub).
func TestSnapshotCrash(t *testing.T) {
	seed := testSeed(t)
	points := []hookPoint{hookSnapFlushed, hookSnapCommitted, hookCloneCommitted, hookDataWritten, hookMapCommitted, hookFreed, numHookPoints}
	n := iterations(t, 210, 6, 10)
	crashed := map[hookPoint]int{}
	for it := range n {
		s := seed + uint64(it)
		point := points[s%uint64(len(points))]
		ok, err := snapCrashOnce(s, point)
		if err != nil {
			t.Fatalf("iteration %d (crash at %d): %v\nreplay it alone with BLK_SEED=%d BLK_ITERS=1", it, point, err, s)
		}
		if ok {
			crashed[point]++
		}
	}
	t.Logf("crashes per step: %v", crashed)
	if n >= 100 {
		for _, p := range points {
			if crashed[p] == 0 {
				t.Errorf("no iteration crashed at %v: the harness does not reach it", p)
			}
		}
	}
}

// cobj is an object of the crash model: cvol's blocks, and its kind.
type cobj struct {
	cvol
	kind Kind
}

func snapCrashOnce(seed uint64, point hookPoint) (crashedAt bool, err error) {
	rng := rand.New(rand.NewPCG(seed, 0x5c4a5))
	// numHookPoints: after the last operation, or at any step of the
	// write path it reaches first.
	if point == numHookPoints {
		point = hookPoint(rng.IntN(int(numHookPoints)))
	}
	bs := []uint32{BlockSize512, BlockSize4K}[rng.IntN(2)]
	fs := vfs.NewCrashableMem()
	area := NewMemArea(256*(16<<10), 512, int(bs))
	cfg := memConfig(fs, area)
	s, err := Open(cfg)
	if err != nil {
		return false, err
	}
	defer func() { _ = s.Close() }()
	model := map[ID]*cobj{}
	var pending, pendingOf *cobj // a snapshot or clone being made (in the model at a crash after its commit), and its volume
	cloneModel := func() map[ID]*cobj {
		out := map[ID]*cobj{}
		for id, o := range model {
			c := &cobj{cvol: cvol{id: o.id, bs: o.bs, blocks: slices.Clone(o.blocks)}, kind: o.kind}
			for i := range c.blocks {
				c.blocks[i].later = slices.Clone(c.blocks[i].later)
			}
			out[id] = c
		}
		return out
	}
	next := ID(1)
	for range 2 {
		blocks := uint64(8+rng.IntN(60)) * uint64(BlockSize4K/bs)
		if _, err := s.Create(next, CreateOptions{SizeBytes: blocks * uint64(bs), BlockSize: bs}); err != nil {
			return false, err
		}
		model[next] = &cobj{cvol: cvol{id: next, bs: bs, blocks: make([]cblock, blocks)}}
		next++
	}
	k := 1 + rng.IntN(6)
	var (
		fsClone   vfs.FS
		areaClone *MemArea
		atCrash   map[ID]*cobj
		seen      int
	)
	unsynced := 0
	if rng.IntN(3) != 0 {
		unsynced = rng.IntN(101)
	}
	crash := func(committed bool) {
		fsClone = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: unsynced, RNG: rand.New(rand.NewPCG(seed, 1))})
		areaClone = area.CrashClone(rand.New(rand.NewPCG(seed, 2)), unsynced)
		atCrash = cloneModel()
		if committed && pending != nil {
			atCrash[pending.id] = pending
		}
	}
	var flushed func()
	s.testHook = func(p hookPoint) {
		if p == hookSnapFlushed && atCrash == nil {
			// The snapshot's flush completed: every block is durable, and
			// the snapshot holds what its volume does.
			flushed()
			pending.blocks = slices.Clone(pendingOf.blocks)
		}
		if p == point && atCrash == nil {
			if seen++; seen == k {
				crash(p == hookSnapCommitted || p == hookCloneCommitted)
			}
		}
	}
	flushed = func() {
		for _, o := range model {
			o.durable(0, uint64(len(o.blocks)))
		}
	}
	ids := func(kind Kind) []ID {
		var out []ID
		for id, o := range model {
			if o.kind == kind {
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	buf := alignedBuf(64<<10, 4096)
	nops := 20 + rng.IntN(150)
	for op := 0; op < nops && atCrash == nil; op++ {
		vols, snaps := ids(KindVolume), ids(KindSnapshot)
		m := model[vols[rng.IntN(len(vols))]]
		v, err := s.Volume(m.id)
		if err != nil {
			return false, err
		}
		blocks, B := uint64(len(m.blocks)), uint64(bs)
		tag := uint64(op + 1)
		switch r := rng.IntN(100); {
		case r < 50: // write, across clusters
			n := 1 + rng.Uint64N(min(blocks, uint64(48<<10)/B))
			lba := rng.Uint64N(blocks - n + 1)
			for i := range n {
				fillTagged(buf[i*B:(i+1)*B], 0, lba+i, tag)
			}
			fua := rng.IntN(5) == 0
			m.set(lba, n, tag)
			if err := v.Write(lba, buf[:n*B], map[bool]WriteFlags{true: FUA}[fua]); err != nil {
				return false, fmt.Errorf("op %d: write: %w", op, err)
			}
			if fua {
				m.durable(lba, n)
			}
		case r < 62: // write zeroes, deallocate
			n := 1 + rng.Uint64N(min(blocks, uint64(64<<10)/B))
			lba := rng.Uint64N(blocks - n + 1)
			m.set(lba, n, 0)
			if rng.IntN(2) == 0 {
				err = v.WriteZeroes(lba, n, 0)
			} else {
				err = v.Deallocate(lba, n)
			}
			if err != nil {
				return false, fmt.Errorf("op %d: remove: %w", op, err)
			}
		case r < 75 && len(model) < 10: // snapshot: flushes the store first
			sn := &cobj{cvol: cvol{id: next, bs: bs}, kind: KindSnapshot}
			pending, pendingOf = sn, m
			if err := s.Snapshot(m.id, next); err != nil {
				return false, fmt.Errorf("op %d: snapshot: %w", op, err)
			}
			pending = nil
			if atCrash == nil {
				model[next] = sn
			}
			next++
		case r < 82 && len(snaps) > 0 && len(model) < 10: // clone
			src := model[snaps[rng.IntN(len(snaps))]]
			c := &cobj{cvol: cvol{id: next, bs: bs, blocks: slices.Clone(src.blocks)}}
			pending = c
			if err := s.Clone(src.id, next); err != nil {
				return false, fmt.Errorf("op %d: clone: %w", op, err)
			}
			pending = nil
			if atCrash == nil {
				model[next] = c
			}
			next++
		case r < 90:
			if err := s.Flush(); err != nil {
				return false, err
			}
			flushed()
		}
	}
	crashedAt = atCrash != nil
	if atCrash == nil {
		crash(false)
	}
	s.testHook = nil
	_ = s.Close()

	cfg.FS, cfg.Area = fsClone, areaClone
	s2, err := Open(cfg)
	if err != nil {
		return crashedAt, fmt.Errorf("crash at %v #%d (unsynced kept %d%%): reopen: %w", point, k, unsynced, err)
	}
	defer func() { _ = s2.Close() }()
	if err := s2.Check(); err != nil {
		return crashedAt, err
	}
	infos, err := s2.List()
	if err != nil {
		return crashedAt, err
	}
	if len(infos) != len(atCrash) {
		return crashedAt, fmt.Errorf("%d objects after the crash, the model has %d: %+v", len(infos), len(atCrash), infos)
	}
	one := alignedBuf(int(bs), 4096)
	for _, in := range infos {
		o := atCrash[in.ID]
		if o == nil || o.kind != in.Kind || in.Blocks() != uint64(len(o.blocks)) {
			return crashedAt, fmt.Errorf("object %+v after the crash; the model: %+v", in, o)
		}
		v, err := s2.Volume(in.ID)
		if err != nil {
			return crashedAt, err
		}
		for lba := range in.Blocks() {
			if err := v.Read(lba, one); err != nil {
				return crashedAt, err
			}
			got, err := readTag(one, 0, lba)
			b := o.blocks[lba]
			if err != nil || (got != b.durable && !slices.Contains(b.later, got)) {
				return crashedAt, fmt.Errorf("crash at %v #%d (%v; unsynced kept %d%%): %v %d block %d holds tag %d (%v); it may hold %d (durable) or %v (since)",
					point, k, crashedAt, unsynced, in.Kind, in.ID, lba, got, err, b.durable, b.later)
			}
		}
	}
	if err := scrub(s2); err != nil {
		return crashedAt, err
	}
	return crashedAt, drain(s2)
}
