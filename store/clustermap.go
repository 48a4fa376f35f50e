package store

import "sync/atomic"

// clusterMap is a volume's map in memory: cluster index -> physical
// cluster (0: not allocated; cluster 0 of the area is its header, so no
// volume maps it). Pebble holds the same map durably ('X' keys); this copy
// makes a lookup three loads and no pebble read on the data path.
//
// Three levels, so a thin volume of any size costs memory only where it
// was written: a leaf holds 512 entries (4 KiB), a mid 512 leaf pointers,
// the top one mid per 2^18 clusters (16 GiB at 64 KiB clusters). Lookups
// are lock-free atomic loads; set is serialised by the caller (the
// volume's allocation mutex or its exclusive lock), and top is replaced
// only under the volume's exclusive lock.
type clusterMap struct {
	top []atomic.Pointer[mid]
}

const (
	leafBits = 9
	leafLen  = 1 << leafBits
	midBits  = 9
	midLen   = 1 << midBits
	topShift = leafBits + midBits
)

type (
	leaf [leafLen]atomic.Uint64
	mid  [midLen]atomic.Pointer[leaf]
)

// resize sizes the top level for clusters entries. Entries past the new
// end must already be zero (released); their pages are dropped.
func (m *clusterMap) resize(clusters uint64) {
	n := int((clusters + (1 << topShift) - 1) >> topShift)
	if n == len(m.top) {
		return
	}
	top := make([]atomic.Pointer[mid], n)
	for i := range min(n, len(m.top)) {
		top[i].Store(m.top[i].Load())
	}
	m.top = top
}

func (m *clusterMap) get(i uint64) uint64 {
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

// set stores phys at i, making pages as needed (only on first writes).
func (m *clusterMap) set(i, phys uint64) {
	md := m.top[i>>topShift].Load()
	if md == nil {
		if phys == 0 {
			return
		}
		md = new(mid)
		m.top[i>>topShift].Store(md)
	}
	slot := &md[(i>>leafBits)&(midLen-1)]
	lf := slot.Load()
	if lf == nil {
		if phys == 0 {
			return
		}
		lf = new(leaf)
		slot.Store(lf)
	}
	lf[i&(leafLen-1)].Store(phys)
}

// each calls fn for every mapped entry with index in [from, to), in index
// order, skipping unmade pages.
func (m *clusterMap) each(from, to uint64, fn func(i, phys uint64)) {
	for i := from; i < to; {
		t := i >> topShift
		if t >= uint64(len(m.top)) {
			return
		}
		md := m.top[t].Load()
		if md == nil {
			i = (t + 1) << topShift
			continue
		}
		lf := md[(i>>leafBits)&(midLen-1)].Load()
		if lf == nil {
			i = (i>>leafBits + 1) << leafBits
			continue
		}
		end := min(to, (i>>leafBits+1)<<leafBits)
		for ; i < end; i++ {
			if p := lf[i&(leafLen-1)].Load(); p != 0 {
				fn(i, p)
			}
		}
	}
}

// nextRun returns the first run of consecutive mapped entries with index
// in [from, to): its first index and the index past its end (a run stops
// at to or at the first unmapped entry; physical contiguity does not
// matter). ok is false when no entry in [from, to) is mapped. Lock-free
// like get: an entry set or cleared meanwhile may or may not be seen.
func (m *clusterMap) nextRun(from, to uint64) (start, end uint64, ok bool) {
	i := from
	for i < to {
		t := i >> topShift
		if t >= uint64(len(m.top)) {
			return 0, 0, false
		}
		md := m.top[t].Load()
		if md == nil {
			i = (t + 1) << topShift
			continue
		}
		lf := md[(i>>leafBits)&(midLen-1)].Load()
		if lf == nil {
			i = (i>>leafBits + 1) << leafBits
			continue
		}
		if lf[i&(leafLen-1)].Load() != 0 {
			break
		}
		i++
	}
	if i >= to {
		return 0, 0, false
	}
	start = i
	for i++; i < to && m.get(i) != 0; i++ {
	}
	return start, i, true
}
