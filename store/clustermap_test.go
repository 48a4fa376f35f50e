package store

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// newTestMap is a map with map ID id sized for clusters entries.
func newTestMap(id, clusters uint64) *clusterMap {
	m := &clusterMap{id: id}
	m.resize(clusters)
	return m
}

func TestClusterMapPlain(t *testing.T) {
	m := newTestMap(7, 3<<topShift)
	if m.get(5) != 0 || m.get(1<<40) != 0 {
		t.Fatal("an empty map reads non-zero")
	}
	m.set(5, 0) // makes nothing
	if m.top[0].p.Load() != nil {
		t.Fatal("set of 0 on an empty map made a page")
	}
	m.set(5, 42)
	m.set(2<<topShift+3, tombstone)
	if m.get(5) != 42 || m.get(2<<topShift+3) != tombstone || m.get(6) != 0 {
		t.Fatalf("get: %d %#x %d", m.get(5), m.get(2<<topShift+3), m.get(6))
	}
	var got [][2]uint64
	m.each(0, ^uint64(0), func(i, e uint64) { got = append(got, [2]uint64{i, e}) })
	if want := [][2]uint64{{5, 42}, {2<<topShift + 3, tombstone}}; !slices.Equal(got, want) {
		t.Fatalf("each: %v, want %v", got, want)
	}
	// A tombstone reads zeros: no run covers it.
	if s, e, ok := m.nextRun(0, 3<<topShift); !ok || s != 5 || e != 6 {
		t.Fatalf("nextRun: %d %d %v, want 5 6 true", s, e, ok)
	}
	if _, _, ok := m.nextRun(6, 3<<topShift); ok {
		t.Fatal("nextRun found a run past the only cluster")
	}
	m.set(5, 0)
	if m.get(5) != 0 {
		t.Fatal("set of 0 left the entry")
	}
}

func TestClusterMapShare(t *testing.T) {
	parent := newTestMap(1, 2<<topShift)
	for i := range uint64(leafLen) {
		parent.set(i, 100+i)
	}
	parent.set(leafLen+1, tombstone)
	parent.set(1<<topShift, 9)
	before := pageDump(parent)

	child := parent.share(2)
	for i := range uint64(leafLen) {
		if e := child.get(i); e != (100+i)|inherited {
			t.Fatalf("child.get(%d) = %#x, want %d inherited", i, e, 100+i)
		}
		if e := parent.get(i); e != 100+i {
			t.Fatalf("parent.get(%d) = %#x, want %d own", i, e, 100+i)
		}
	}
	if e := child.get(leafLen + 1); e != tombstone|inherited {
		t.Fatalf("child reads the parent's tombstone as %#x", e)
	}

	// The first write copies the mid and the leaf; the other entries of
	// the leaf stay inherited, and the parent's pages do not change.
	child.set(3, 500)
	child.set(4, tombstone)
	child.set(5, 0)
	if e := child.get(3); e != 500 {
		t.Fatalf("child.get(3) = %#x, want 500 own", e)
	}
	if e := child.get(4); e != tombstone {
		t.Fatalf("child.get(4) = %#x, want its own tombstone", e)
	}
	if e := child.get(5); e != 0 {
		t.Fatalf("child.get(5) = %#x, want 0", e)
	}
	if e := child.get(6); e != 106|inherited {
		t.Fatalf("child.get(6) = %#x, want 106 inherited", e)
	}
	if e := child.get(1 << topShift); e != 9|inherited {
		t.Fatalf("child.get of the second mid = %#x, want 9 inherited", e)
	}
	if after := pageDump(parent); !slices.Equal(before, after) {
		t.Fatal("a write to the child changed a page the parent reads")
	}
	if child.top[0].p.Load() == parent.top[0].p.Load() || child.top[1].p.Load() != parent.top[1].p.Load() {
		t.Fatal("set copied the wrong mids: want the written one copied, the other shared")
	}

	// A grandchild of the child: the child's own entries are inherited
	// there too, and a second share of the parent (a clone) is unaffected.
	grand := child.share(3)
	if e := grand.get(3); e != 500|inherited {
		t.Fatalf("grand.get(3) = %#x, want 500 inherited", e)
	}
	clone := parent.share(4)
	if e := clone.get(3); e != 103|inherited {
		t.Fatalf("clone.get(3) = %#x, want 103 inherited", e)
	}
}

// pageDump is every entry of m's pages as stored, with its page's owner.
func pageDump(m *clusterMap) []uint64 {
	var out []uint64
	for t := range m.top {
		md := m.top[t].p.Load()
		if md == nil {
			continue
		}
		out = append(out, uint64(t), m.top[t].owner.Load())
		for j := range md {
			lf := md[j].p.Load()
			if lf == nil {
				continue
			}
			out = append(out, uint64(j), md[j].owner.Load())
			for k := range lf {
				out = append(out, lf[k].Load())
			}
		}
	}
	return out
}

// TestClusterMapSharedModel runs seeded random set, share, get, each and
// nextRun on a forest of maps against a model of plain Go maps: each model
// map holds its own entries and a parent, and reads an index it has no
// entry for as its parent does, inherited. As the store will use them, a
// map that is shared freezes (it becomes a snapshot's) and only unfrozen
// maps are written; a frozen map may be shared again (a clone).
func TestClusterMapSharedModel(t *testing.T) {
	seed := testSeed(t)
	for it := range iterations(t, 20, 4, 4) {
		s := seed + uint64(it)
		if err := sharedModelOnce(s, 3000); err != nil {
			t.Fatalf("iteration %d: %v\nreplay it alone with BLK_SEED=%d BLK_ITERS=1", it, err, s)
		}
	}
}

type modelMap struct {
	m      *clusterMap
	own    map[uint64]uint64
	parent *modelMap
	frozen bool
	pages  []uint64 // pageDump when frozen: must never change
}

func (mm *modelMap) get(i uint64) uint64 {
	for x := mm; x != nil; x = x.parent {
		if e, ok := x.own[i]; ok {
			if x != mm && e != 0 {
				e |= inherited
			}
			return e
		}
	}
	return 0
}

const modelClusters = 3 << topShift

func sharedModelOnce(seed uint64, nops int) error {
	rng := rand.New(rand.NewPCG(seed, 0x5ba7e))
	// Indices crowd into a few leaves of each mid so that pages are shared,
	// copied and written after copying; some fall anywhere.
	index := func() uint64 {
		if rng.IntN(8) == 0 {
			return rng.Uint64N(modelClusters)
		}
		return rng.Uint64N(3)<<topShift | rng.Uint64N(3)<<leafBits | rng.Uint64N(leafLen)
	}
	nextID := uint64(10)
	maps := []*modelMap{{m: newTestMap(nextID, modelClusters), own: map[uint64]uint64{}}}
	for op := range nops {
		mm := maps[rng.IntN(len(maps))]
		switch r := rng.IntN(100); {
		case r < 70: // set, on a writable map
			if mm.frozen {
				continue
			}
			i := index()
			var e uint64
			switch rng.IntN(10) {
			case 0:
				e = tombstone
			case 1:
				e = 0
			default:
				e = 1 + rng.Uint64N(1<<30)
			}
			mm.m.set(i, e)
			mm.own[i] = e
		case r < 78 && len(maps) < 24: // share: a snapshot or a clone
			nextID++
			c := mm.m.share(nextID)
			if !mm.frozen {
				mm.frozen, mm.pages = true, pageDump(mm.m)
			}
			maps = append(maps, &modelMap{m: &c, own: map[uint64]uint64{}, parent: mm})
		default:
			if err := checkModelMap(rng, mm, index); err != nil {
				return fmt.Errorf("op %d, map %d: %w", op, mm.m.id, err)
			}
		}
	}
	for _, mm := range maps {
		if err := checkModelMap(rng, mm, index); err != nil {
			return fmt.Errorf("at the end, map %d: %w", mm.m.id, err)
		}
		if mm.frozen && !slices.Equal(mm.pages, pageDump(mm.m)) {
			return fmt.Errorf("map %d: a page of a shared map changed", mm.m.id)
		}
	}
	return nil
}

// checkModelMap compares get at some indices, each over a random range,
// and nextRun from a random index with the model.
func checkModelMap(rng *rand.Rand, mm *modelMap, index func() uint64) error {
	for range 64 {
		i := index()
		if got, want := mm.m.get(i), mm.get(i); got != want {
			return fmt.Errorf("get(%d) = %#x, want %#x", i, got, want)
		}
	}
	from := index()
	to := min(from+rng.Uint64N(2*leafLen), modelClusters)
	var got [][2]uint64
	mm.m.each(from, to, func(i, e uint64) { got = append(got, [2]uint64{i, e}) })
	var want [][2]uint64
	for i := from; i < to; i++ {
		if e := mm.get(i); e != 0 {
			want = append(want, [2]uint64{i, e})
		}
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("each(%d, %d) = %v, want %v", from, to, got, want)
	}
	from = index()
	to = min(from+rng.Uint64N(4*leafLen), modelClusters)
	gs, ge, gok := mm.m.nextRun(from, to)
	var ws, we uint64
	wok := false
	for i := from; i < to; i++ {
		if physOf(mm.get(i)) != 0 {
			ws, wok = i, true
			for we = i + 1; we < to && physOf(mm.get(we)) != 0; we++ {
			}
			break
		}
	}
	if gs != ws || ge != we || gok != wok {
		return fmt.Errorf("nextRun(%d, %d) = %d %d %v, want %d %d %v", from, to, gs, ge, gok, ws, we, wok)
	}
	return nil
}

// TestClusterMapCopyRace: a reader of an inherited entry never sees it as
// the map's own, nor as anything but the parent's cluster, while the map
// copies that entry's page on writes to its neighbours (the slot's
// pointer-then-owner order). Meaningful under -race and on weak orderings.
func TestClusterMapCopyRace(t *testing.T) {
	for range iterations(t, 50, 5, 5) {
		parent := newTestMap(1, 1<<topShift)
		for i := range uint64(leafLen) {
			parent.set(i, 1000+i)
		}
		child := parent.share(2)
		var stop atomic.Bool
		var wg sync.WaitGroup
		var bad atomic.Uint64
		for r := range 2 {
			wg.Go(func() {
				j := uint64(leafLen - 1 - r) // never written by the child
				for !stop.Load() {
					if e := child.get(j); e != (1000+j)|inherited {
						bad.Store(e | 1)
					}
				}
			})
		}
		for i := range uint64(leafLen - 2) {
			child.set(i, 5000+i)
		}
		stop.Store(true)
		wg.Wait()
		if e := bad.Load(); e != 0 {
			t.Fatalf("a reader saw an inherited entry as %#x", e&^1)
		}
	}
}

func TestClusterMapGetAllocs(t *testing.T) {
	parent := newTestMap(1, 1<<topShift)
	parent.set(3, 9)
	child := parent.share(2)
	child.set(4, 10) // copies the page: set allocates only then
	var sink uint64
	if n := testing.AllocsPerRun(100, func() {
		sink += parent.get(3) + child.get(3) + child.get(4)
		child.set(4, 11)
	}); n != 0 {
		t.Fatalf("get and set of a made page: %v allocs, want 0", n)
	}
	_ = sink
}

// plainMap is the clusterMap before ownership (three loads, no owner):
// the baseline BenchmarkClusterMapGet measures ownership's cost against,
// in the same run.
type plainMap struct {
	top []atomic.Pointer[[midLen]atomic.Pointer[leaf]]
}

func (m *plainMap) get(i uint64) uint64 {
	t := i >> topShift
	if t >= uint64(len(m.top)) {
		return 0
	}
	md := m.top[t].Load()
	if md == nil {
		return 0
	}
	lf := md[(i>>leafBits)&(midLen-1)].Load()
	if lf == nil {
		return 0
	}
	return lf[i&(leafLen-1)].Load()
}

func (m *plainMap) set(i, phys uint64) {
	md := m.top[i>>topShift].Load()
	if md == nil {
		md = new([midLen]atomic.Pointer[leaf])
		m.top[i>>topShift].Store(md)
	}
	lf := md[(i>>leafBits)&(midLen-1)].Load()
	if lf == nil {
		lf = new(leaf)
		md[(i>>leafBits)&(midLen-1)].Store(lf)
	}
	lf[i&(leafLen-1)].Store(phys)
}

// BenchmarkClusterMapGet: a lookup at a random index of a full map of
// 2^14 clusters (1 GiB at 64 KiB clusters, 128 KiB of leaves: in the L2
// cache) and of 2^20 (64 GiB, 8 MiB of leaves: past it, as a busy large
// volume's map is): the map before ownership (plain), a map that owns its
// pages (a volume without snapshots), and a map that shares every page (a
// clone just made).
//
//	go test ./store -run '^$' -bench ClusterMapGet -count 5
func BenchmarkClusterMapGet(b *testing.B) {
	for _, n := range []uint64{1 << 14, 1 << 20} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) { benchMapGet(b, n) })
	}
}

func benchMapGet(b *testing.B, n uint64) {
	plain := &plainMap{top: make([]atomic.Pointer[[midLen]atomic.Pointer[leaf]], (n+(1<<topShift)-1)>>topShift)}
	own := newTestMap(1, n)
	for i := range n {
		plain.set(i, i+1)
		own.set(i, i+1)
	}
	shared := own.share(2)
	rng := rand.New(rand.NewPCG(1, 2))
	idx := make([]uint64, 1<<16)
	for i := range idx {
		idx[i] = rng.Uint64N(n)
	}
	var sink uint64
	for _, c := range []struct {
		name string
		get  func(uint64) uint64
	}{{"plain", plain.get}, {"own", own.get}, {"shared", shared.get}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				sink += c.get(idx[i&(len(idx)-1)])
			}
		})
	}
	_ = sink
}
