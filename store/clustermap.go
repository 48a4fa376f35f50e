package store

import "sync/atomic"

// clusterMap is a volume's map in memory: cluster index -> entry, an entry
// being a physical cluster and two flags (below; 0: nothing here nor in
// any ancestor; cluster 0 of the area is its header, so no map names it).
// Pebble holds the same map durably ('X' keys); this copy makes a lookup
// four loads and no pebble read on the data path.
//
// Three levels, so a thin volume of any size costs memory only where it
// was written: a leaf holds 512 entries (4 KiB), a mid 512 leaf slots,
// the top one mid slot per 2^18 clusters (16 GiB at 64 KiB clusters).
// Lookups are lock-free atomic loads; set is serialised by the caller (the
// volume's allocation mutex or its exclusive lock), and top is replaced
// (resize, share) only under the volume's exclusive lock.
//
// Pages are shared between maps (docs/snapshots.md §1.2): share gives a
// new map a copy of top only, so a snapshot or a clone costs one slot per
// 16 GiB, not a visit per cluster. Each page has an owner, the map ID
// that made it, kept in the slot that points to it: a leaf's in its mid
// (a leaf stays 4 KiB, one size class), a mid's in top. A map reads a
// page it does not own as its parent's: get sets inherited on what such a
// page holds. A map writes only pages it owns: set copies a shared path
// (mid, then leaf) into pages of its own first, every entry marked
// inherited, and publishes each copy with one pointer store, so a map
// that still shares the old page never sees it change. The owner of a
// shared page is a snapshot, which never writes.
type clusterMap struct {
	top []slot[mid]
	id  uint64 // the map ID: pages with this owner are this map's own
}

const (
	leafBits = 9
	leafLen  = 1 << leafBits
	midBits  = 9
	midLen   = 1 << midBits
	topShift = leafBits + midBits
)

// Entry flags. Bits 0-43 are the physical cluster, which leaves 2^44
// clusters (a PiB of 64 KiB clusters; Open refuses a larger area); bits
// 44-59 the sub-blocks a partial cluster holds (docs/snapshots.md §1.3,
// "Sub-cluster redirect").
const (
	// inherited: the entry is an ancestor's (the map owns no key here).
	// Only get, each and the copies set makes carry it.
	inherited uint64 = 1 << 63
	// tombstone alone is an own entry that reads zeros and hides the
	// parent's cluster (its pebble key holds 0); with inherited, an
	// ancestor's tombstone: it reads zeros too.
	tombstone uint64 = 1 << 62
	// partial: the cluster holds only the sub-blocks of the mask (bits
	// maskShift up); the others read what the map owning the entry reads
	// through its parent. Its pebble value carries the flag and the mask.
	partial   uint64 = 1 << 60
	maskShift        = 44
	physMask  uint64 = 1<<maskShift - 1
	maskBits  uint64 = 0xffff << maskShift
)

// physOf is the physical cluster an entry reads (0: zeros, a tombstone
// or nothing).
func physOf(e uint64) uint64 { return e & physMask }

// maskOf is the sub-block mask of a partial entry.
func maskOf(e uint64) uint64 { return (e & maskBits) >> maskShift }

// inPlace says whether a write may overwrite e's cluster in place: an own
// cluster that is whole (not inherited, not a tombstone, not partial).
// One compare: 0 wraps to the top, every flag lies above physMask.
func inPlace(e uint64) bool { return e-1 < physMask }

type (
	leaf [leafLen]atomic.Uint64
	mid  [midLen]slot[leaf]
)

// slot points to a page and names its owner. The owner is the pointer's
// second word, so a reader can see the two from different moments. A page
// changes owner only one way, from another map to the slot's own map, when
// set copies it; set stores the pointer, then the owner, and get loads the
// owner, then the pointer. A reader that sees the new owner therefore sees
// the new page; one that sees the old owner takes whichever page as
// inherited, which errs to the safe side: a writer that finds an entry
// inherited goes the first write's way, which looks again under the
// allocation mutex, never overwrites in place a cluster it does not own.
type slot[T any] struct {
	owner atomic.Uint64
	p     atomic.Pointer[T]
}

// publish points s at page p, owned by owner (see slot: pointer first).
func (s *slot[T]) publish(p *T, owner uint64) {
	s.p.Store(p)
	s.owner.Store(owner)
}

// resize sizes the top level for clusters entries. Entries past the new
// end must already be zero (released); their pages are dropped.
func (m *clusterMap) resize(clusters uint64) {
	n := int((clusters + (1 << topShift) - 1) >> topShift)
	if n == len(m.top) {
		return
	}
	top := make([]slot[mid], n)
	for i := range min(n, len(m.top)) {
		top[i].publish(m.top[i].p.Load(), m.top[i].owner.Load())
	}
	m.top = top
}

// share returns a map with map ID id that reads what m reads, its every
// entry inherited: it copies top (one slot per 2^18 clusters) and no page.
// m must not be written afterwards while the new map reads it (it becomes
// a snapshot's), and id must not own any of m's pages.
func (m *clusterMap) share(id uint64) clusterMap {
	c := clusterMap{id: id}
	c.resize(uint64(len(m.top)) << topShift)
	for i := range m.top {
		c.top[i].publish(m.top[i].p.Load(), m.top[i].owner.Load())
	}
	return c
}

// get returns the entry at i, with inherited set if its leaf is another
// map's. The owner compare costs one load from the slot's cache line
// (docs/snapshots.md §1.2 gives the measured figure).
func (m *clusterMap) get(i uint64) uint64 {
	t := i >> topShift
	if t >= uint64(len(m.top)) {
		return 0
	}
	md := m.top[t].p.Load()
	if md == nil {
		return 0
	}
	s := &md[(i>>leafBits)&(midLen-1)]
	owner := s.owner.Load()
	lf := s.p.Load()
	if lf == nil {
		return 0
	}
	e := lf[i&(leafLen-1)].Load()
	if e != 0 && owner != m.id {
		e |= inherited
	}
	return e
}

// set stores the own entry e (a cluster or tombstone, never inherited) at
// i, making pages as needed (only on first writes) and copying pages m
// shares (only on the first write to each after share). Setting 0 where m
// already reads 0 makes and copies nothing.
func (m *clusterMap) set(i, e uint64) {
	if e == 0 && m.get(i) == 0 {
		return
	}
	ts := &m.top[i>>topShift]
	md := ts.p.Load()
	switch {
	case md == nil:
		md = new(mid)
		ts.publish(md, m.id)
	case ts.owner.Load() != m.id:
		c := new(mid)
		for j := range md {
			c[j].publish(md[j].p.Load(), md[j].owner.Load())
		}
		md = c
		ts.publish(md, m.id)
	}
	s := &md[(i>>leafBits)&(midLen-1)]
	lf := s.p.Load()
	switch {
	case lf == nil:
		lf = new(leaf)
		s.publish(lf, m.id)
	case s.owner.Load() != m.id:
		c := new(leaf)
		for j := range lf {
			if v := lf[j].Load(); v != 0 {
				c[j].Store(v | inherited)
			}
		}
		lf = c
		s.publish(lf, m.id)
	}
	lf[i&(leafLen-1)].Store(e)
}

// each calls fn for every non-zero entry with index in [from, to), in
// index order, skipping unmade pages; e is what get returns (flags
// included: a caller freeing clusters must skip inherited entries, and
// tombstones name no cluster).
func (m *clusterMap) each(from, to uint64, fn func(i, e uint64)) {
	for i := from; i < to; {
		t := i >> topShift
		if t >= uint64(len(m.top)) {
			return
		}
		md := m.top[t].p.Load()
		if md == nil {
			i = (t + 1) << topShift
			continue
		}
		s := &md[(i>>leafBits)&(midLen-1)]
		owner := s.owner.Load()
		lf := s.p.Load()
		if lf == nil {
			i = (i>>leafBits + 1) << leafBits
			continue
		}
		var flag uint64
		if owner != m.id {
			flag = inherited
		}
		end := min(to, (i>>leafBits+1)<<leafBits)
		for ; i < end; i++ {
			if e := lf[i&(leafLen-1)].Load(); e != 0 {
				fn(i, e|flag)
			}
		}
	}
}

// nextRun returns the first run of consecutive entries that read a
// cluster (own or inherited; tombstones read zeros and end a run like
// unmapped entries) with index in [from, to): its first index and the
// index past its end (a run stops at to; physical contiguity does not
// matter). ok is false when no entry in [from, to) reads a cluster.
// Lock-free like get: an entry set or cleared meanwhile may or may not be
// seen.
func (m *clusterMap) nextRun(from, to uint64) (start, end uint64, ok bool) {
	i := from
	for i < to {
		t := i >> topShift
		if t >= uint64(len(m.top)) {
			return 0, 0, false
		}
		md := m.top[t].p.Load()
		if md == nil {
			i = (t + 1) << topShift
			continue
		}
		lf := md[(i>>leafBits)&(midLen-1)].p.Load()
		if lf == nil {
			i = (i>>leafBits + 1) << leafBits
			continue
		}
		if physOf(lf[i&(leafLen-1)].Load()) != 0 {
			break
		}
		i++
	}
	if i >= to {
		return 0, 0, false
	}
	start = i
	for i++; i < to && physOf(m.get(i)) != 0; i++ {
	}
	return start, i, true
}
