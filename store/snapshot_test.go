package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	own    map[uint64]uint8 // cluster index -> ownCluster or ownTomb (absent: read through the parent)
}

const (
	ownCluster = 1
	ownTomb    = 2
)

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

func (m *smodel) children(id ID) int { return len(m.kids(id)) }

func (m *smodel) kids(id ID) []*sobj {
	var out []*sobj
	for _, o := range m.objs {
		if o.parent == id {
			out = append(out, o)
		}
	}
	return out
}

// reads says what o reads at cluster index i: ownCluster (data, its own
// or an ancestor's) or 0 (zeros).
func (m *smodel) reads(o *sobj, i uint64) uint8 {
	for ; o != nil; o = m.objs[o.parent] {
		switch o.own[i] {
		case ownCluster:
			return ownCluster
		case ownTomb:
			return 0
		}
		if o.parent == 0 {
			return 0
		}
	}
	return 0
}

// parentHas says whether an ancestor of o owns cluster index i (data or
// a tombstone).
func (m *smodel) parentHas(o *sobj, i uint64) bool {
	for a := m.objs[o.parent]; a != nil; a = m.objs[a.parent] {
		if a.own[i] != 0 {
			return true
		}
	}
	return false
}

func (m *smodel) parentReads(o *sobj, i uint64) bool {
	return o.parent != 0 && m.reads(m.objs[o.parent], i) == ownCluster
}

// cpb is the blocks per cluster of o.
func cpb(o *sobj) uint64 { return (16 << 10) / uint64(o.bs) }

// nclusters is the clusters o's size spans.
func nclusters(o *sobj) uint64 { return (uint64(len(o.tags)) + cpb(o) - 1) / cpb(o) }

// written: a write (or a partial write zeroes over a read cluster) made
// cluster i of o its own.
func (m *smodel) written(o *sobj, i uint64) { o.own[i] = ownCluster }

// removed: blocks [lba, lba+n) of o write zeroes: whole clusters become
// tombstones (where the parent reads data) or nothing; a partial one
// read through the parent's data is copied.
func (m *smodel) removed(o *sobj, lba, n uint64) {
	c := cpb(o)
	for i := lba / c; i*c < lba+n; i++ {
		whole := i*c >= lba && (i+1)*c <= lba+n
		switch {
		case whole && o.own[i] == ownCluster && m.parentHas(o, i):
			o.own[i] = ownTomb
		case whole && o.own[i] == ownCluster:
			delete(o.own, i)
		case whole && o.own[i] == 0 && m.parentReads(o, i):
			o.own[i] = ownTomb
		case !whole && o.own[i] == 0 && m.parentReads(o, i):
			o.own[i] = ownCluster
		}
	}
}

// space is what SpaceOf must say of o, in clusters.
func (m *smodel) space(o *sobj) (owned, shared, excl uint64) {
	kids := m.kids(o.id)
	for i, st := range o.own {
		if st != ownCluster {
			continue
		}
		owned++
		hidden := true
		for _, k := range kids {
			if i < nclusters(k) && k.own[i] == 0 {
				hidden = false
			}
		}
		if hidden {
			excl++
		}
	}
	for i := range nclusters(o) {
		if o.own[i] == 0 && m.parentReads(o, i) {
			shared++
		}
	}
	return
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

var debugSnap = os.Getenv("BLK_SNAPDEBUG") != ""

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
	defer func() {
		if s != nil {
			_ = s.Close()
		}
	}()
	m := &smodel{objs: map[ID]*sobj{}, next: 1}
	create := func() error {
		bs := []uint32{BlockSize512, BlockSize4K}[rng.IntN(2)]
		blocks := uint64(4+rng.IntN(80)) * (C / 4096) / 2 * uint64(BlockSize4K/bs)
		id := m.next
		m.next++
		if _, err := s.Create(id, CreateOptions{SizeBytes: blocks * uint64(bs), BlockSize: bs}); err != nil {
			return err
		}
		m.objs[id] = &sobj{id: id, kind: KindVolume, bs: bs, tags: make([]uint64, blocks), own: map[uint64]uint8{}}
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
		r := rng.IntN(100)
		if debugSnap {
			for _, o := range m.sorted(KindVolume) {
				fmt.Printf("  vol %d parent %d own %v\n", o.id, o.parent, o.own)
			}
			for _, o := range m.sorted(KindSnapshot) {
				fmt.Printf("  snap %d parent %d own %v\n", o.id, o.parent, o.own)
			}
			fmt.Println("op", k, "r", r)
		}
		switch {
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
				m.written(o, (lba+i)/cpb(o))
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
			m.removed(o, lba, n)
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
			m.objs[id] = &sobj{id: id, kind: KindSnapshot, parent: o.parent, bs: o.bs, tags: slices.Clone(o.tags), own: o.own}
			o.parent, o.own = id, map[uint64]uint8{}
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
			m.objs[id] = &sobj{id: id, kind: KindVolume, parent: o.id, bs: o.bs, tags: slices.Clone(o.tags), own: map[uint64]uint8{}}
			touched = m.objs[id]
		case r < 72 && len(vols) > 0: // grow
			o := vols[rng.IntN(len(vols))]
			add := uint64(1+rng.IntN(40)) * 512 / uint64(o.bs) * uint64(o.bs/512)
			if o.bs == BlockSize4K {
				add = uint64(1 + rng.IntN(10))
			}
			nb := uint64(len(o.tags)) + add
			if old := uint64(len(o.tags)); old%cpb(o) != 0 && o.own[old/cpb(o)] == 0 && m.parentReads(o, old/cpb(o)) {
				o.own[old/cpb(o)] = ownCluster // zeroTail copies it with zeros past the old end
			}
			if err := s.Resize(o.id, nb*uint64(o.bs), false); err != nil {
				return fmt.Errorf("op %d: grow %d: %w", k, o.id, err)
			}
			o.tags = append(o.tags, make([]uint64, add)...)
			touched = o
		case r < 78 && len(m.objs) > 1: // delete a random object
			all := append(vols, snaps...)
			o := all[rng.IntN(len(all))]
			err := s.Delete(o.id)
			kids := m.kids(o.id)
			if len(kids) > 1 {
				if !errors.Is(err, ErrHasChildren) {
					return fmt.Errorf("op %d: delete of %v %d with %d children: %v, want ErrHasChildren", k, o.kind, o.id, len(kids), err)
				}
				break
			}
			if err != nil {
				return fmt.Errorf("op %d: delete %v %d: %w", k, o.kind, o.id, err)
			}
			if len(kids) == 1 { // merged into its one child
				c := kids[0]
				for i, st := range o.own {
					if c.own[i] == 0 && (st == ownCluster || o.parent != 0) {
						c.own[i] = st
					}
				}
				c.parent = o.parent
				if c.parent == 0 && c.kind == KindVolume {
					dropTombs(c)
				}
				touched = c
			}
			delete(m.objs, o.id)
		case r < 80 && len(vols) > 0: // revert to an ancestor or any snapshot, by token; a retry is a no-op
			o := vols[rng.IntN(len(vols))]
			var anc []*sobj
			for a := m.objs[o.parent]; a != nil; a = m.objs[a.parent] {
				anc = append(anc, a)
			}
			if len(snaps) > 0 && rng.IntN(2) == 0 {
				// Any snapshot of the same block size, not only an
				// ancestor: after a revert to s1, s2 is off the
				// volume's chain and still a target.
				if a := snaps[rng.IntN(len(snaps))]; a.bs == o.bs {
					anc = append(anc[:0], a)
				} else if err := s.Revert(o.id, a.id, uint64(k+1)); !errors.Is(err, ErrInvalid) {
					return fmt.Errorf("op %d: revert %d (%d-byte blocks) to %d (%d-byte blocks): %v, want ErrInvalid", k, o.id, o.bs, a.id, a.bs, err)
				}
			}
			if len(anc) == 0 {
				break
			}
			a := anc[rng.IntN(len(anc))]
			token := uint64(k + 1)
			if err := s.Revert(o.id, a.id, token); err != nil {
				return fmt.Errorf("op %d: revert %d to %d: %w", k, o.id, a.id, err)
			}
			o.tags, o.parent, o.own = slices.Clone(a.tags), a.id, map[uint64]uint8{}
			if err := verifyObj(s, o, rbuf); err != nil {
				return fmt.Errorf("op %d: after revert: %w", k, err)
			}
			if len(snaps) > 0 { // a retry with the same token, even naming another snapshot
				if err := s.Revert(o.id, snaps[0].id, token); err != nil {
					return fmt.Errorf("op %d: revert retry: %w", k, err)
				}
			}
			touched = o
		case r < 82 && len(vols) > 0: // flatten, whole or cancelled after a few clusters
			o := vols[rng.IntN(len(vols))]
			v, err := s.Volume(o.id)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(context.Background())
			stop := -1
			if rng.IntN(3) == 0 {
				stop = rng.IntN(4)
			}
			copied := 0
			s.testHook = func(p hookPoint) {
				if p == hookFlattenChunk {
					if copied++; copied == stop {
						cancel()
					}
				}
			}
			var last uint64
			err = v.Flatten(ctx, func(done, total uint64) { last = done })
			s.testHook = nil
			cancel()
			// The model: the first copied inherited clusters become its own.
			n := 0
			for i := range nclusters(o) {
				if o.own[i] == 0 && m.parentReads(o, i) && (err == nil || n < copied) {
					o.own[i] = ownCluster
					n++
				}
			}
			switch {
			case errors.Is(err, context.Canceled):
			case err != nil:
				return fmt.Errorf("op %d: flatten %d: %w", k, o.id, err)
			default:
				if last != uint64(n) && n > 0 {
					return fmt.Errorf("op %d: flatten %d: progress said %d copied, the model %d", k, o.id, last, n)
				}
				o.parent = 0
				dropTombs(o)
			}
			touched = o
		case r < 84: // the refusals
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
		case r < 86:
			if err := s.Flush(); err != nil {
				return err
			}
		case r < 89: // clean reopen
			if err := s.Close(); err != nil {
				return fmt.Errorf("op %d: close: %w", k, err)
			}
			if s, err = Open(cfg); err != nil {
				return fmt.Errorf("op %d: reopen: %w", k, err)
			}
			for _, o := range m.objs {
				if o.parent == 0 {
					dropTombs(o) // Open trims a parentless map's tombstones
				}
			}
		case r < 91 && len(m.objs) < 14:
			if err := create(); err != nil {
				return err
			}
		}
		if touched != nil {
			if err := verifyObj(s, touched, rbuf); err != nil {
				return fmt.Errorf("op %d: %w", k, err)
			}
			if err := checkSpace(s, m, touched); err != nil {
				return fmt.Errorf("op %d: %w", k, err)
			}
			if err := checkChanges(s, m, touched, rng, rbuf); err != nil {
				return fmt.Errorf("op %d: %w", k, err)
			}
		}
		if k%25 == 0 || debugSnap {
			if err := s.Check(); err != nil {
				return fmt.Errorf("op %d: %w", k, err)
			}
			for _, o := range m.objs {
				if err := checkSpace(s, m, o); err != nil {
					return fmt.Errorf("op %d (full check): %w", k, err)
				}
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

// dropTombs: o has no parent any more; its tombstones read as holes.
func dropTombs(o *sobj) {
	for i, st := range o.own {
		if st == ownTomb {
			delete(o.own, i)
		}
	}
}

// checkSpace compares SpaceOf and MappedOwn of o with the model, and the
// sum of every object's owned space with the store's mapped clusters.
func checkSpace(s *Store, m *smodel, o *sobj) error {
	const C = 16 << 10
	sp, err := s.SpaceOf(o.id)
	if err != nil {
		return err
	}
	owned, shared, excl := m.space(o)
	if o.kind == KindVolume {
		excl = owned
	}
	if sp != (ObjectSpace{owned * C, shared * C, excl * C}) {
		return fmt.Errorf("%v %d (parent %d): space %+v; the model: owned %d, shared %d, exclusive %d clusters", o.kind, o.id, o.parent, sp, owned, shared, excl)
	}
	var sum uint64
	for _, x := range m.objs {
		n, _, _ := m.space(x)
		sum += n
	}
	if st := s.Stats(); st.Mapped != sum {
		return fmt.Errorf("%d clusters mapped, the objects own %d", st.Mapped, sum)
	}
	v, err := s.Volume(o.id)
	if err != nil {
		return err
	}
	c := cpb(o)
	got := make([]uint8, len(o.tags))
	err = v.MappedOwn(0, ^uint64(0), func(lba, n uint64, zero bool) error {
		for b := lba; b < lba+n; b++ {
			if got[b] != 0 {
				return fmt.Errorf("block %d reported twice", b)
			}
			got[b] = map[bool]uint8{false: ownCluster, true: ownTomb}[zero]
		}
		return nil
	})
	if err != nil {
		return err
	}
	for b := range uint64(len(o.tags)) {
		if got[b] != o.own[b/c] {
			return fmt.Errorf("%v %d block %d: MappedOwn says %d, the model %d", o.kind, o.id, b, got[b], o.own[b/c])
		}
	}
	return nil
}

// checkChanges runs Changes from a random ancestor of o (or 0) to o and
// checks it with the model, and by content: a block not reported reads
// the same in both (zeros, from 0).
func checkChanges(s *Store, m *smodel, o *sobj, rng *rand.Rand, buf []byte) error {
	var anc []*sobj
	for a := m.objs[o.parent]; a != nil; a = m.objs[a.parent] {
		anc = append(anc, a)
	}
	var from *sobj
	if n := rng.IntN(len(anc) + 1); n < len(anc) {
		from = anc[n]
	}
	fromID := ID(0)
	if from != nil {
		fromID = from.id
	}
	got := make([]uint8, len(o.tags))
	err := s.Changes(fromID, o.id, func(lba, n uint64, zero bool) error {
		for b := lba; b < lba+n; b++ {
			if got[b] != 0 {
				return fmt.Errorf("block %d reported twice", b)
			}
			got[b] = map[bool]uint8{false: ownCluster, true: ownTomb}[zero]
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("changes %d..%d: %w", fromID, o.id, err)
	}
	c := cpb(o)
	for b := range uint64(len(o.tags)) {
		want := uint8(0)
		for x := o; x != nil && x != from; x = m.objs[x.parent] {
			if st := x.own[b/c]; st != 0 {
				want = st
				break
			}
			if x.parent == 0 {
				break
			}
		}
		if from == nil && want == ownTomb {
			want = 0
		}
		if got[b] != want {
			return fmt.Errorf("changes %d..%d block %d: %d, the model %d", fromID, o.id, b, got[b], want)
		}
		if want == 0 {
			base := uint64(0)
			if from != nil && b < uint64(len(from.tags)) {
				base = from.tags[b]
			}
			if o.tags[b] != base {
				return fmt.Errorf("changes %d..%d block %d: not reported, and reads %d, not %d", fromID, o.id, b, o.tags[b], base)
			}
		}
	}
	// Not an ancestor: a sibling or o's own child.
	for _, x := range m.objs {
		isAnc := x == o
		for _, a := range anc {
			isAnc = isAnc || a == x
		}
		if !isAnc {
			if err := s.Changes(x.id, o.id, func(uint64, uint64, bool) error { return nil }); !errors.Is(err, ErrNotAncestor) {
				return fmt.Errorf("changes %d..%d (not an ancestor): %v, want ErrNotAncestor", x.id, o.id, err)
			}
			break
		}
	}
	return nil
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
	points := []hookPoint{hookSnapFlushed, hookSnapCommitted, hookCloneCommitted, hookDataWritten, hookMapCommitted, hookFreed,
		hookRevertCommitted, hookMergeChunk, hookMergeDone, hookFlattenChunk, hookFlattenDone, hookDeferredCommitted, numHookPoints}
	n := iterations(t, 240, 6, 10)
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

// cobj is an object of the crash model: cvol's blocks, its kind and
// parent.
type cobj struct {
	cvol
	kind   Kind
	parent ID
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
			c := &cobj{cvol: cvol{id: o.id, bs: o.bs, blocks: slices.Clone(o.blocks)}, kind: o.kind, parent: o.parent}
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
		case r < 72 && len(model) < 10: // snapshot: flushes the store first
			sn := &cobj{cvol: cvol{id: next, bs: bs}, kind: KindSnapshot, parent: m.parent}
			pending, pendingOf = sn, m
			if err := s.Snapshot(m.id, next); err != nil {
				return false, fmt.Errorf("op %d: snapshot: %w", op, err)
			}
			pending = nil
			if atCrash == nil {
				model[next] = sn
			}
			m.parent = next
			next++
		case r < 78 && len(snaps) > 0 && len(model) < 10: // clone
			src := model[snaps[rng.IntN(len(snaps))]]
			c := &cobj{cvol: cvol{id: next, bs: bs, blocks: slices.Clone(src.blocks)}, parent: src.id}
			pending = c
			if err := s.Clone(src.id, next); err != nil {
				return false, fmt.Errorf("op %d: clone: %w", op, err)
			}
			pending = nil
			if atCrash == nil {
				model[next] = c
			}
			next++
		case r < 86 && m.parent != 0: // revert to an ancestor: durable from its commit on
			var anc []*cobj
			for a := model[m.parent]; a != nil; a = model[a.parent] {
				anc = append(anc, a)
			}
			a := anc[rng.IntN(len(anc))]
			m.blocks = slices.Clone(a.blocks) // all durable: a snapshot's are
			m.parent = a.id
			if err := s.Revert(m.id, a.id, uint64(op+1)); err != nil {
				return false, fmt.Errorf("op %d: revert: %w", op, err)
			}
		case r < 90 && len(snaps) > 0: // delete a snapshot with one child (a merge) or none
			sn := model[snaps[rng.IntN(len(snaps))]]
			var kids []*cobj
			for _, o := range model {
				if o.parent == sn.id {
					kids = append(kids, o)
				}
			}
			if len(kids) > 1 {
				break
			}
			delete(model, sn.id) // gone from its first step on
			for _, c := range kids {
				c.parent = sn.parent
			}
			if err := s.Delete(sn.id); err != nil {
				return false, fmt.Errorf("op %d: delete snapshot %d: %w", op, sn.id, err)
			}
		case r < 94 && m.parent != 0: // flatten: the same bytes throughout
			if err := v.Flatten(context.Background(), nil); err != nil {
				return false, fmt.Errorf("op %d: flatten: %w", op, err)
			}
			m.parent = 0
		default:
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

// TestCOWConcurrent races host writes of single blocks (so each first
// write to an inherited cluster is a partial copy on write) and reads
// against a flatten of the clone they write to, and against the delete
// (merge) of the snapshot the volume they write to reads through: each
// index is copied once (by whichever claims it first; the other waits
// for the claim and overwrites), the writes' bytes win, reads are never
// torn, and afterwards every block reads its last write or the origin's
// data, the forest is what the operation makes it, Check passes and the
// clusters mapped are exactly the origin's and the copies' (no second
// copy of an index, none leaked). In "merge-middle" the snapshot merged
// is the volume's grandparent, merged into the volume's parent (another
// snapshot, which the volume's deallocates look at meanwhile). Run it
// under -race.
func TestCOWConcurrent(t *testing.T) {
	seed := testSeed(t)
	for it := range iterations(t, 8, 2, 4) {
		for _, mode := range []string{"flatten", "merge", "merge-middle"} {
			if err := cowConcurrentOnce(seed+uint64(it), mode); err != nil {
				t.Fatalf("iteration %d, %s: %v\nreplay it alone with BLK_SEED=%d BLK_ITERS=1", it, mode, err, seed+uint64(it))
			}
		}
	}
}

func cowConcurrentOnce(seed uint64, mode string) error {
	const (
		C        = 16 << 10
		clusters = 48 // written by the writers
		tail     = 16 // deallocated whole by one more goroutine
		blocks   = clusters * C / BlockSize4K
		writers  = 4
	)
	s, err := Open(memConfig(vfs.NewMem(), NewMemArea(512*C, 512, 512)))
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	v1, err := s.Create(1, CreateOptions{SizeBytes: (clusters + tail) * C})
	if err != nil {
		return err
	}
	buf := alignedBuf(C, 4096)
	for c := range uint64(clusters + tail) {
		for i := range uint64(C / BlockSize4K) {
			fillTagged(buf[i*BlockSize4K:(i+1)*BlockSize4K], 0, c*4+i, 1)
		}
		if err := v1.Write(c*4, buf, 0); err != nil {
			return err
		}
	}
	if err := s.Snapshot(1, 2); err != nil {
		return err
	}
	target := ID(1)
	if mode == "merge-middle" {
		fillTagged(buf[:BlockSize4K], 0, 0, 1)
		if err := v1.Write(0, buf[:BlockSize4K], 0); err != nil { // one cluster of 4's own
			return err
		}
		if err := s.Snapshot(1, 4); err != nil {
			return err
		}
	}
	if mode == "flatten" {
		if err := s.Clone(2, 3); err != nil {
			return err
		}
		target = 3
	}
	tv, err := s.Volume(target)
	if err != nil {
		return err
	}
	last := make([]uint64, blocks) // per block: the last tag written (1: the origin's)
	for i := range last {
		last[i] = 1
	}
	errs := make(chan error, writers+3)
	var wg sync.WaitGroup
	freed := make([]bool, tail)
	var opDone atomic.Bool
	wg.Add(1)
	go func() { // whole-cluster deallocates of the tail: tombstones over the parent's clusters
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 99))
		b := alignedBuf(BlockSize4K, 4096)
		for k := 0; k < 40 || !opDone.Load(); k++ { // and on until the flatten or merge ended
			c := rng.IntN(tail)
			if rng.IntN(2) == 0 { // own it first (a copy on write): its deallocate then asks the parent
				lba := uint64(clusters+c) * C / BlockSize4K
				fillTagged(b, 0, lba, 1)
				if err := tv.Write(lba, b, 0); err != nil {
					errs <- err
					return
				}
			}
			if err := tv.Deallocate(uint64(clusters+c)*C/BlockSize4K, C/BlockSize4K); err != nil {
				errs <- err
				return
			}
			freed[c] = true
		}
	}()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			b := alignedBuf(BlockSize4K, 4096)
			for k := range 150 {
				lba := rng.Uint64N(blocks/writers)*writers + uint64(w) // the blocks of writer w
				tag := uint64(w+2) + uint64(k)*writers
				fillTagged(b, 0, lba, tag)
				if err := tv.Write(lba, b, 0); err != nil {
					errs <- err
					return
				}
				last[lba] = tag
				if rng.IntN(4) == 0 { // a read of another's block: whole, never torn
					o := rng.Uint64N(blocks)
					if err := tv.Read(o, b); err != nil {
						errs <- err
						return
					}
					if _, err := readTag(b, 0, o); err != nil {
						errs <- fmt.Errorf("block %d: %w", o, err)
						return
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		var err error
		if mode == "flatten" {
			err = tv.Flatten(context.Background(), nil)
		} else {
			err = s.Delete(2) // merged into 1 ("merge") or into 4 ("merge-middle")
		}
		opDone.Store(true)
		if err != nil {
			errs <- fmt.Errorf("%s: %w", mode, err)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	one := alignedBuf(BlockSize4K, 4096)
	for lba := range uint64(blocks) {
		if err := tv.Read(lba, one); err != nil {
			return err
		}
		if got, err := readTag(one, 0, lba); err != nil || got != last[lba] {
			return fmt.Errorf("volume %d block %d: tag %d (%v), want %d", target, lba, got, err, last[lba])
		}
	}
	for c := range uint64(tail) {
		lba := (clusters + c) * C / BlockSize4K
		if err := tv.Read(lba, one); err != nil {
			return err
		}
		want := map[bool]uint64{true: 0, false: 1}[freed[c]]
		if got, err := readTag(one, 0, lba); err != nil || got != want {
			return fmt.Errorf("volume %d tail cluster %d: tag %d (%v), want %d", target, c, got, err, want)
		}
	}
	if err := s.Check(); err != nil {
		return err
	}
	info, err := tv.Info()
	if err != nil {
		return err
	}
	st := s.Stats()
	switch mode {
	case "flatten": // the clone owns every cluster, once; the snapshot keeps its own
		sp, err := s.SpaceOf(3)
		if err != nil {
			return err
		}
		nfreed := uint64(0)
		for _, f := range freed {
			if f {
				nfreed++
			}
		}
		own := clusters + tail - nfreed
		if info.Parent != 0 || sp.OwnedBytes != own*C || sp.SharedBytes != 0 || st.Mapped != clusters+tail+own {
			return fmt.Errorf("after flatten: %+v, %+v, %d clusters mapped, want %d", info, sp, st.Mapped, clusters+tail+own)
		}
	case "merge": // the volume owns every cluster: its copies, and the snapshot's it had not hidden
		if _, err := s.Volume(2); !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("snapshot 2 after its delete: %v", err)
		}
		nfreed := uint64(0)
		for _, f := range freed {
			if f {
				nfreed++
			}
		}
		if info.Parent != 0 || st.Mapped != clusters+tail-nfreed {
			return fmt.Errorf("after merge: %+v, %d clusters mapped, want %d", info, st.Mapped, clusters+tail-nfreed)
		}
	case "merge-middle": // the volume reads through 4, now parentless, which keeps what it read
		if info.Parent != 4 {
			return fmt.Errorf("after merge: %+v, want parent 4", info)
		}
		snap, err := s.Volume(4)
		if err != nil {
			return err
		}
		for lba := uint64(0); lba < (clusters+tail)*C/BlockSize4K; lba += 3 {
			if err := snap.Read(lba, one); err != nil {
				return err
			}
			if got, err := readTag(one, 0, lba); err != nil || got != 1 {
				return fmt.Errorf("snapshot 4 block %d after the merge: tag %d (%v), want 1", lba, got, err)
			}
		}
	}
	return nil
}

// TestSnapshotSpace: a snapshot of a written volume (256 MiB, 64 KiB
// clusters) maps no cluster and grows pebble (flushed and compacted, the
// bytes on its filesystem) by under 0.1% of the volume's data (issue 24's
// goal; docs/snapshots.md §1.5): it is two records and the 'N' key. The
// snapshot owns what the volume owned and holds none of it exclusively
// until the volume rewrites clusters: after 10% of them, exactly 10%.
func TestSnapshotSpace(t *testing.T) {
	const (
		C    = 64 << 10
		size = 256 << 20
	)
	cfg := memConfig(vfs.NewMem(), NewMemArea(size+size/8, 512, 512))
	cfg.ClusterBytes, cfg.MaxTransferBytes = C, 1<<20
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, size/BlockSize4K, BlockSize4K)
	buf := alignedBuf(1<<20, 4096)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	for off := uint64(0); off < size; off += 1 << 20 {
		if err := v.Write(off/BlockSize4K, buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	pebbleBytes := func() uint64 {
		t.Helper()
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, false); err != nil {
			t.Fatal(err)
		}
		return s.db.Metrics().DiskSpaceUsage()
	}
	before, mapped := pebbleBytes(), s.Stats().Mapped
	if err := s.Snapshot(1, 2); err != nil {
		t.Fatal(err)
	}
	after := pebbleBytes()
	t.Logf("pebble: %d bytes before the snapshot, %d after (+%d; %.4f%% of the data)", before, after, int64(after-before), 100*float64(int64(after-before))/size)
	if after > before && after-before >= size/1000 {
		t.Errorf("a snapshot grew pebble by %d bytes, not under 0.1%% of %d", after-before, size)
	}
	if m := s.Stats().Mapped; m != mapped {
		t.Errorf("%d clusters mapped after the snapshot, %d before", m, mapped)
	}
	space := func(id ID) ObjectSpace {
		t.Helper()
		sp, err := s.SpaceOf(id)
		if err != nil {
			t.Fatal(err)
		}
		return sp
	}
	if sp := space(2); sp != (ObjectSpace{OwnedBytes: size}) {
		t.Errorf("the snapshot: %+v, want it to own the volume's %d bytes, none exclusively", sp, size)
	}
	if sp := space(1); sp != (ObjectSpace{SharedBytes: size}) {
		t.Errorf("the volume after the snapshot: %+v, want %d bytes shared, none owned", sp, size)
	}
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	n := size / C / 10
	for _, c := range rng.Perm(size / C)[:n] {
		if err := v.Write(uint64(c)*C/BlockSize4K, buf[:C], 0); err != nil {
			t.Fatal(err)
		}
	}
	if sp := space(2); sp.ExclusiveBytes != uint64(n)*C || sp.OwnedBytes != size {
		t.Errorf("the snapshot after the volume rewrote %d clusters: %+v, want %d bytes exclusive", n, sp, n*C)
	}
	if sp := space(1); sp.OwnedBytes != uint64(n)*C || sp.SharedBytes != size-uint64(n)*C || sp.ExclusiveBytes != sp.OwnedBytes {
		t.Errorf("the volume after rewriting %d clusters: %+v", n, sp)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotRecords: a store never used for snapshots writes version 1
// records only and no 'N' key, byte for byte what releases before
// snapshots read (docs/snapshots.md §1.2); a snapshot writes version 2
// for both objects and the counter; a flattened clone goes back to
// version 1. Version 2 round-trips, and bad records are ErrCorrupt.
func TestSnapshotRecords(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512)))
	raw := func(k []byte) []byte {
		t.Helper()
		v, closer, err := s.db.Get(k)
		if err != nil {
			return nil
		}
		defer closer.Close()
		return slices.Clone(v)
	}
	v := mustCreate(t, s, 7, 64, BlockSize4K)
	if r := raw(volumeKey(7)); len(r) != volumeRecordLen || r[0] != 1 {
		t.Fatalf("a plain volume's record: %x, want version 1 of %d bytes", r, volumeRecordLen)
	}
	if r := raw(nextMapKey); r != nil {
		t.Fatalf("'N' = %x in a store that never made a snapshot", r)
	}
	one := alignedBuf(BlockSize4K, 4096)
	fillTagged(one, 0, 3, 9)
	if err := v.Write(3, one, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(7, 8); err != nil {
		t.Fatal(err)
	}
	if err := s.Clone(8, 9); err != nil {
		t.Fatal(err)
	}
	for _, id := range []ID{7, 8, 9} {
		if r := raw(volumeKey(id)); len(r) != volumeRecordLenV2 || r[0] != 2 {
			t.Errorf("object %d's record: %x, want version 2", id, r)
		}
	}
	if r := raw(nextMapKey); len(r) != 8 {
		t.Errorf("'N' = %x after a snapshot and a clone", r)
	}
	c, err := s.Volume(9)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Flatten(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if r := raw(volumeKey(9)); len(r) != volumeRecordLen {
		t.Errorf("a flattened clone's record: %x, want version 1", r)
	}
	in := volumeRecord{info: Info{ID: 5, SizeBytes: 1 << 20, BlockSize: 512, State: StateReadOnly, Kind: KindSnapshot, Parent: 4}, mapID: firstMapID + 3, token: 77}
	out, err := decodeVolumeRecord(5, in.encode())
	if err != nil || out != in {
		t.Errorf("version 2 round trip: %+v, %v; want %+v", out, err, in)
	}
	for _, bad := range []volumeRecord{
		{info: Info{ID: 5, SizeBytes: 4096, BlockSize: 4096, State: StateOnline, Kind: KindSnapshot}, mapID: 5}, // a writable snapshot
		{info: Info{ID: 5, SizeBytes: 4096, BlockSize: 4096, State: StateOnline, Parent: 5}, mapID: 5},          // its own parent
		{info: Info{ID: 5, SizeBytes: 4096, BlockSize: 4096, State: StateOnline, Kind: 9}, mapID: 5},            // no such kind
	} {
		if _, err := decodeVolumeRecord(5, bad.encode()); !errors.Is(err, ErrCorrupt) {
			t.Errorf("record %+v decoded: %v, want ErrCorrupt", bad.info, err)
		}
	}
}

// TestSnapshotDirect: the direct path reads a clone's inherited clusters
// from the snapshot's clusters (one segment, no copy), and resolves a
// write that meets one as DirectSlow (the copy on write runs on a
// goroutine that may block, never on a poll group); once the clone owns
// the cluster, the write is DirectIO into its own cluster.
func TestSnapshotDirect(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 4096, 4096)))
	v := mustCreate(t, s, 1, 16, BlockSize4K)
	buf := alignedBuf(16<<10, 4096)
	for i := range uint64(4) {
		fillTagged(buf[i*4096:(i+1)*4096], 0, i, 5)
	}
	if err := v.Write(0, buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(1, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Clone(2, 3); err != nil {
		t.Fatal(err)
	}
	c, err := s.Volume(3)
	if err != nil {
		t.Fatal(err)
	}
	snapPhys := physOf(c.m.get(0))
	segs := make([]Segment, 4)
	n, k, err := c.BeginDirect(false, 1, buf[:4096], segs)
	if err != nil || k != DirectIO || n != 1 || segs[0].Off != int64(snapPhys<<14+4096) {
		t.Fatalf("direct read of an inherited cluster: %d segments %v, %v, %v; want one at %d", n, segs[:n], k, err, snapPhys<<14+4096)
	}
	if err := c.EndDirect(false, 1, 4096, nil); err != nil {
		t.Fatal(err)
	}
	fillTagged(buf[:4096], 0, 1, 6)
	// A 4 KiB write (one whole sub-block) into the inherited cluster is
	// redirected on the direct path: one segment into a new cluster, the
	// index claimed until EndDirect publishes the partial entry.
	n, k, err = c.BeginDirect(true, 1, buf[:4096], segs)
	if err != nil || k != DirectIO || n != 1 || segs[0].Off>>14 == int64(snapPhys) || segs[0].Off&(16<<10-1) != 4096 {
		t.Fatalf("direct write of a sub-block into an inherited cluster: %d %v, %v, %v; want one segment at offset 4096 of a new cluster", n, segs[:n], k, err)
	}
	if e := c.m.get(0); e&inherited == 0 {
		t.Fatalf("the entry before EndDirect: %#x, want still inherited", e)
	}
	if err := s.area.WriteAt(buf[:4096], segs[0].Off); err != nil { // the engine's part
		t.Fatal(err)
	}
	if err := c.EndDirect(true, 1, 4096, nil); err != nil {
		t.Fatal(err)
	}
	// A write over two clusters, one of them inherited, goes the slow way.
	if _, k, err := c.BeginDirect(true, 3, buf[:8192], segs); err != nil || k != DirectSlow {
		t.Fatalf("direct write over two clusters, one inherited: %v, %v; want DirectSlow", k, err)
	}
	// Writing its other sub-blocks makes it whole.
	for _, b := range []uint64{0, 2, 3} {
		fillTagged(buf[:4096], 0, b, 7)
		if err := c.Write(b, buf[:4096], 0); err != nil {
			t.Fatal(err)
		}
	}
	if e := c.m.get(0); !inPlace(e) {
		t.Fatalf("the clone's entry once every sub-block was written: %#x, want whole", e)
	}
	n, k, err = c.BeginDirect(true, 2, buf[:4096], segs)
	if err != nil || k != DirectIO || n != 1 || segs[0].Off == int64(snapPhys<<14+8192) {
		t.Fatalf("direct write to the clone's own copy: %d %v, %v, %v", n, segs[:n], k, err)
	}
	if err := c.EndDirect(true, 2, 4096, nil); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Volume(2)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := snap.BeginDirect(true, 0, buf[:4096], segs); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("direct write to a snapshot: %v, want ErrReadOnly", err)
	}
	if err := snap.Read(1, buf[:4096]); err != nil {
		t.Fatal(err)
	}
	if got, err := readTag(buf[:4096], 0, 1); err != nil || got != 5 {
		t.Fatalf("the snapshot after the clone's copy on write: tag %d (%v), want 5", got, err)
	}
}

// TestSnapshotUnderWrites takes snapshots (and clones of them) while
// writers rewrite their blocks: each block of a snapshot holds a value
// its writer had acknowledged by the time the snapshot returned, and
// none older than the last one acknowledged before Snapshot was called
// (crash-consistent: a point between the two); the snapshots never
// change afterwards, while the writers go on. Run it under -race.
func TestSnapshotUnderWrites(t *testing.T) {
	seed := testSeed(t)
	const (
		blocks  = 256 // 4 KiB: 64 clusters of 16 KiB
		writers = 4
		snaps   = 6
	)
	s := openStore(t, memConfig(vfs.NewMem(), NewMemArea(1024*(16<<10), 512, 512)))
	v := mustCreate(t, s, 1, blocks, BlockSize4K)
	var acked [blocks]atomic.Uint64    // per block: the last tag acknowledged
	var started [writers]atomic.Uint64 // per writer: the tag of its write in flight, or its last
	var nwrites atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			b := alignedBuf(BlockSize4K, 4096)
			for k := uint64(1); ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				lba := rng.Uint64N(blocks/writers)*writers + uint64(w)
				tag := k*writers + uint64(w)
				fillTagged(b, 0, lba, tag)
				started[w].Store(tag)
				if err := v.Write(lba, b, 0); err != nil {
					errs <- err
					return
				}
				acked[lba].Store(tag)
				nwrites.Add(1)
			}
		}()
	}
	type taken struct {
		id     ID
		before [blocks]uint64
		after  [writers]uint64
	}
	var got []*taken
	for i := range snaps {
		for n := nwrites.Load(); nwrites.Load() < n+300 && len(errs) == 0; { // let the writers move on
			runtime.Gosched()
		}
		tk := &taken{id: ID(100 + i)}
		for j := range blocks {
			tk.before[j] = acked[j].Load()
		}
		if err := s.Snapshot(1, tk.id); err != nil {
			t.Fatal(err)
		}
		for w := range writers {
			tk.after[w] = started[w].Load()
		}
		if i%2 == 0 {
			if err := s.Clone(tk.id, ID(200+i)); err != nil {
				t.Fatal(err)
			}
		}
		got = append(got, tk)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	one := alignedBuf(BlockSize4K, 4096)
	for _, tk := range got {
		ids := []ID{tk.id}
		if (tk.id-100)%2 == 0 {
			ids = append(ids, tk.id+100) // its clone reads the same
		}
		for _, id := range ids {
			sv, err := s.Volume(id)
			if err != nil {
				t.Fatal(err)
			}
			for j := range uint64(blocks) {
				if err := sv.Read(j, one); err != nil {
					t.Fatal(err)
				}
				tag, err := readTag(one, 0, j)
				// A writer's tags grow: the block holds one acknowledged
				// before the call or later, and none its writer started
				// after the snapshot returned.
				w := j % writers
				if err != nil || tag < tk.before[j] || tag > tk.after[w] || (tag != 0 && tag%writers != w) {
					t.Fatalf("object %d (snapshot %d) block %d: tag %d (%v); acknowledged before the call %d, its writer's last started by the return %d",
						id, tk.id, j, tag, err, tk.before[j], tk.after[w])
				}
			}
		}
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestKindJSON: an Info says its kind by name and reads back unchanged.
func TestKindJSON(t *testing.T) {
	in := Info{ID: 3, SizeBytes: 4096, BlockSize: 4096, State: StateReadOnly, Kind: KindSnapshot, Parent: 2}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"kind":"snapshot"`) || !strings.Contains(string(b), `"parent":2`) {
		t.Fatalf("JSON %s", b)
	}
	var out Info
	if err := json.Unmarshal(b, &out); err != nil || out != in {
		t.Fatalf("round trip: %+v, %v; want %+v", out, err, in)
	}
	b, _ = json.Marshal(Info{ID: 1, Kind: KindVolume})
	if !strings.Contains(string(b), `"kind":"volume"`) || strings.Contains(string(b), "parent") {
		t.Fatalf("a volume without a parent: %s", b)
	}
	if err := json.Unmarshal([]byte(`{"kind":"bogus"}`), &out); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bogus kind: %v", err)
	}
}

// TestSnapshotMergeReadOnly: a merge a crash interrupted is left as it is
// by a read-only open (its child reads through the merging snapshot, the
// same bytes), and finished by the next read-write open.
func TestSnapshotMergeReadOnly(t *testing.T) {
	fs := vfs.NewCrashableMem()
	area := NewMemArea(64*(16<<10), 512, 512)
	cfg := memConfig(fs, area)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 16, BlockSize4K)
	buf := alignedBuf(16*BlockSize4K, 4096)
	for i := range uint64(16) {
		fillTagged(buf[i*BlockSize4K:(i+1)*BlockSize4K], 0, i, 3)
	}
	if err := v.Write(0, buf, FUA); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(1, 2); err != nil {
		t.Fatal(err)
	}
	fillTagged(buf[:BlockSize4K], 0, 5, 4)
	if err := v.Write(5, buf[:BlockSize4K], FUA); err != nil {
		t.Fatal(err)
	}
	var fsClone vfs.FS
	var areaClone *MemArea
	s.testHook = func(p hookPoint) {
		if p == hookMergeChunk && fsClone == nil {
			fsClone = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
			areaClone = area.CrashClone(rand.New(rand.NewPCG(1, 1)), 0)
		}
	}
	if err := s.Delete(2); err != nil {
		t.Fatal(err)
	}
	s.testHook = nil
	_ = s.Close()
	if fsClone == nil {
		t.Fatal("the merge never reached hookMergeChunk")
	}
	check := func(s *Store) {
		t.Helper()
		infos, err := s.List()
		if err != nil || len(infos) != 1 || infos[0].ID != 1 {
			t.Fatalf("objects %+v, %v; want volume 1 alone", infos, err)
		}
		v, err := s.Volume(1)
		if err != nil {
			t.Fatal(err)
		}
		one := alignedBuf(BlockSize4K, 4096)
		for lba := range uint64(16) {
			if err := v.Read(lba, one); err != nil {
				t.Fatal(err)
			}
			want := uint64(3)
			if lba == 5 {
				want = 4
			}
			if got, err := readTag(one, 0, lba); err != nil || got != want {
				t.Fatalf("block %d: tag %d (%v), want %d", lba, got, err, want)
			}
		}
	}
	ro := cfg
	ro.FS, ro.Area, ro.ReadOnly = fsClone, areaClone, true
	s2, err := Open(ro)
	if err != nil {
		t.Fatal(err)
	}
	check(s2)
	_ = s2.Close()
	rw := cfg
	rw.FS, rw.Area = fsClone, areaClone
	s3 := openStore(t, rw)
	check(s3)
	if info, _ := s3.vols[1].Info(); info.Parent != 0 {
		t.Fatalf("after the merge finished: %+v, want no parent", info)
	}
	if err := s3.Check(); err != nil {
		t.Fatal(err)
	}
}
