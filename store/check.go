package store

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// Check recomputes the allocator from pebble (every map key and
// reservation) and compares it with the running store: no cluster mapped
// twice, every map key in its volume's in-memory map and nothing else
// there, every cluster free, ready, in limbo or mapped and in exactly one
// of them (none leaked), the counts, and the zeroed watermark (the 'Z'
// key of a lazily zeroed area equals the allocator's, which is the
// area's end on any other; no cluster at or past it is anything but
// free); and for snapshots and clones (docs/snapshots.md §1.4): every
// inherited entry is what the parent reads there, tombstones only in
// maps with a parent, every parent a live snapshot no larger than its
// child, every map ID from the 'N' counter below it. It reads every key of the
// store: for tests and for an operator's fsck, not for the data path.
// Call it while no request is in flight (a first write between its pop
// and its map commit would show as leaked); it waits for a refill that is
// reserving (the background refill's, say).
func (s *Store) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.drainDeferred(); err != nil {
		return err
	}
	s.al.mu.Lock()
	defer s.al.mu.Unlock()
	for s.al.refilling { // a refill's picked clusters are neither free nor ready yet
		s.al.refillEnd.Wait()
	}
	var errs []error
	bad := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf("store: check: "+format+": %w", append(args, ErrCorrupt)...))
		}
	}
	const (
		stFree = iota
		stMapped
		stReserved
	)
	state := make([]uint8, s.al.clusters)
	byMap := map[uint64]*Volume{}
	counts := map[*Volume]int64{}
	for _, v := range s.vols {
		byMap[v.mapID] = v
	}
	err := s.scan(familyMap, func(k, val []byte) error {
		m, idx, _ := parseMapKey(k)
		e, ok := parsePhys(val)
		if !ok {
			bad("map %d index %d: value %x", m, idx, val)
			return nil
		}
		p := physOf(e)
		v := byMap[m]
		if s.badPartial(e) {
			bad("map %d index %d: partial entry %#x, a store of %d sub-blocks", m, idx, e, bits.OnesCount64(s.fullMask))
		}
		if e == 0 { // a tombstone: only in a map with a parent
			switch {
			case v == nil:
				bad("map %d index %d: no volume has this map", m, idx)
			case v.parent == nil && v.info.Kind == KindVolume:
				// (A snapshot keeps its tombstones when a merge leaves it
				// with no parent: its children read its table.)
				bad("volume %d index %d: a tombstone in a map with no parent", v.id, idx)
			case v.m.get(idx) != tombstone:
				bad("volume %d index %d: pebble says tombstone, memory %#x", v.id, idx, v.m.get(idx))
			}
			return nil
		}
		switch {
		case p >= s.al.clusters:
			bad("map %d index %d names cluster %d, outside the area", m, idx, p)
		case state[p] != stFree:
			bad("cluster %d mapped twice (again by map %d index %d)", p, m, idx)
		default:
			state[p] = stMapped
		}
		switch {
		case v == nil:
			bad("map %d index %d: no volume has this map", m, idx)
		case v.m.get(idx) != e:
			bad("volume %d index %d: pebble says %#x, memory %#x", v.id, idx, e, v.m.get(idx))
		default:
			counts[v]++
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, v := range s.vols {
		var n int64
		v.m.each(0, ^uint64(0), func(i, e uint64) {
			switch {
			case owned(e):
				n++
			case e&inherited != 0 && v.parent == nil:
				bad("volume %d index %d: inherited entry %#x, and no parent", v.id, i, e)
			case e&inherited != 0 && physOf(v.parent.m.get(i)) != physOf(e):
				// Compared by what they read: a merge leaves a child of the
				// merged child reading a tombstone where its parent reads 0.
				bad("volume %d index %d: inherited entry %#x, its parent %d reads %#x", v.id, i, e, v.parent.id, v.parent.m.get(i))
			}
		})
		if n != counts[v] || n != v.allocated.Load() {
			bad("volume %d: %d entries in memory, %d map keys, %d counted allocated", v.id, n, counts[v], v.allocated.Load())
		}
		if v.mapID >= firstMapID && v.mapID >= s.nextMap && s.nextMap != 0 {
			bad("volume %d: map %d, not below the next map ID %d", v.id, v.mapID, s.nextMap)
		}
		if p := v.parent; p != nil {
			switch {
			case s.vols[p.id] != p || p.info.Kind != KindSnapshot || v.info.Parent != p.id:
				bad("volume %d: parent %d (record %d) is not a live snapshot", v.id, p.id, v.info.Parent)
			case v.info.SizeBytes < p.info.SizeBytes:
				bad("volume %d of %d bytes is smaller than its parent %d (%d)", v.id, v.info.SizeBytes, p.id, p.info.SizeBytes)
			}
		} else if v.info.Parent != 0 {
			bad("volume %d: record names parent %d, memory none", v.id, v.info.Parent)
		}
	}
	err = s.scan(familyReserved, func(k, _ []byte) error {
		p, _ := parseReservedKey(k)
		switch {
		case p == 0 || p >= s.al.clusters:
			bad("reservation of cluster %d, outside the area", p)
		case state[p] != stFree:
			bad("cluster %d both mapped and reserved", p)
		default:
			state[p] = stReserved
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := s.checkZeroed(bad); err != nil {
		return err
	}
	for p := s.al.zeroed; p < s.al.clusters; p++ {
		if state[p] != stFree || s.al.isUsed(p) {
			bad("cluster %d is in use (reserved, mapped or taken) at or past the zeroed watermark %d: it was never zeroed", p, s.al.zeroed)
		}
	}
	held := append(slices.Clone(s.al.ready[s.al.head:]), s.al.limbo...)
	seen := map[uint64]bool{}
	for _, p := range held {
		if seen[p] {
			bad("cluster %d twice in the ready pool and limbo", p)
		}
		seen[p] = true
		if p >= s.al.clusters || state[p] != stReserved {
			bad("cluster %d ready or in limbo without a reservation", p)
		}
	}
	var mapped, free uint64
	for p := uint64(1); p < s.al.clusters; p++ {
		switch {
		case state[p] == stMapped:
			mapped++
			if !s.al.isUsed(p) {
				bad("cluster %d mapped but free in the allocator", p)
			}
		case state[p] == stReserved && !seen[p]:
			bad("cluster %d reserved but neither ready nor in limbo: leaked until the next open", p)
		case state[p] == stFree:
			free++
			if s.al.isUsed(p) {
				bad("cluster %d named by nothing but not free in the allocator: leaked", p)
			}
		}
	}
	if mapped != s.al.mapped || free != s.al.free {
		bad("counts: %d mapped, %d free; the allocator says %d and %d", mapped, free, s.al.mapped, s.al.free)
	}
	return errors.Join(errs...)
}

// checkZeroed compares the allocator's zeroed watermark with pebble's.
func (s *Store) checkZeroed(bad func(string, ...any)) error {
	v, closer, err := s.db.Get(zeroedKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		if s.format.lazy {
			bad("a lazily zeroed area has no zeroed watermark")
		} else if s.al.zeroed != s.al.clusters {
			bad("zeroed watermark %d in memory, the area's end %d on an area that reads zeros", s.al.zeroed, s.al.clusters)
		}
		return nil
	case err != nil:
		return fmt.Errorf("store: check: %w: %w", ErrIO, err)
	}
	w, ok := parseZeroed(v)
	_ = closer.Close()
	switch {
	case !s.format.lazy:
		bad("a zeroed watermark (%x) in a store whose area reads zeros", v)
	case !ok || w < 1 || w > s.al.clusters:
		bad("zeroed watermark %x outside the area of %d clusters", v, s.al.clusters)
	case w != s.al.zeroed:
		bad("zeroed watermark %d in pebble, %d in memory", w, s.al.zeroed)
	}
	return nil
}
