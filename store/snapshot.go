package store

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// Snapshots and clones (docs/snapshots.md §1): a parent chain of maps.
// A snapshot takes its volume's map as it is, and the volume goes on with
// a new, empty map whose parent is the snapshot; a clone is a new, empty
// map whose parent is a snapshot. Every cluster still belongs to exactly
// one map key; sharing is the parent links, read through the in-memory
// table's shared pages (clustermap.go), so no count is kept per cluster
// and taking a snapshot visits none.

// owned says whether a map entry is a cluster of the map's own (the
// overwrite-in-place case): not 0, not a tombstone, not inherited. One
// compare: 0 wraps to the top, and both flags lie above tombstone-1.
func owned(e uint64) bool { return e-1 < tombstone-1 }

// Snapshot takes a read-only, crash-consistent copy of volume vol as
// snapshot snap, in O(1): no cluster is copied or visited. It waits for
// vol's requests in flight and flushes the store first, so every write
// acknowledged before the call is in the snapshot (and durable); then one
// synced batch writes snap's record (vol's map, vol's parent, vol's size,
// read-only), vol's record (a new map from the 'N' counter, parent snap)
// and the counter. Idempotent: nil if snap already is vol's parent
// snapshot; ErrExists if snap names any other object; ErrInvalid if vol
// is a snapshot or snap is 0 (a parent ID of 0 means none).
func (s *Store) Snapshot(vol, snap ID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.adminCheck(vol, "snapshot"); err != nil {
		return err
	}
	v, ok := s.vols[vol]
	if !ok {
		return fmt.Errorf("volume %d: snapshot: %w", vol, ErrNotFound)
	}
	if sv, ok := s.vols[snap]; ok {
		if sv.info.Kind == KindSnapshot && v.parent == sv {
			return nil
		}
		return fmt.Errorf("volume %d: snapshot %d: %v %d exists: %w", vol, snap, sv.info.Kind, snap, ErrExists)
	}
	if snap == 0 || snap == vol {
		return fmt.Errorf("volume %d: snapshot %d: %w", vol, snap, ErrInvalid)
	}
	if v.info.Kind != KindVolume {
		return fmt.Errorf("volume %d: snapshot %d: %d is a %v: %w", vol, snap, vol, v.info.Kind, ErrInvalid)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := s.flush(); err != nil {
		return fmt.Errorf("volume %d: snapshot %d: %w", vol, snap, err)
	}
	s.hook(hookSnapFlushed)
	b := s.db.NewBatch()
	m, err := s.takeMapID(b)
	if err != nil {
		_ = b.Close()
		return fmt.Errorf("volume %d: snapshot %d: %w", vol, snap, err)
	}
	sr := volumeRecord{info: Info{ID: snap, SizeBytes: v.info.SizeBytes, BlockSize: v.info.BlockSize,
		State: StateReadOnly, Kind: KindSnapshot, Parent: v.info.Parent}, mapID: v.mapID}
	vr := v.record()
	vr.mapID, vr.info.Parent = m, snap
	_ = b.Set(volumeKey(snap), sr.encode(), nil)
	_ = b.Set(volumeKey(vol), vr.encode(), nil)
	if err := s.commit(b, true); err != nil {
		return fmt.Errorf("volume %d: snapshot %d: %w", vol, snap, err)
	}
	s.hook(hookSnapCommitted)
	s.nextMap = m + 1
	sv := newVolume(s, sr)
	sv.m = v.m // its pages are owned by v's old map ID, now the snapshot's
	sv.setParent(v.parent)
	sv.allocated.Store(v.allocated.Load())
	v.m = v.m.share(m)
	v.mapID = m
	v.setParent(sv)
	v.setRecord(vr)
	v.allocated.Store(0)
	s.vols[snap] = sv
	return nil
}

// Clone makes clone a writable volume that reads what snapshot snap
// reads, sharing its clusters: one synced batch of clone's record (a new
// map, parent snap, snap's size and block size, online) and the 'N'
// counter; no cluster is visited. Idempotent: nil if clone already is a
// volume whose parent is snap; ErrExists if clone names any other object;
// ErrInvalid if snap is not a snapshot.
func (s *Store) Clone(snap, clone ID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.adminCheck(clone, "clone"); err != nil {
		return err
	}
	sv, ok := s.vols[snap]
	if !ok {
		return fmt.Errorf("volume %d: clone of %d: %w", clone, snap, ErrNotFound)
	}
	if cv, ok := s.vols[clone]; ok {
		if cv.info.Kind == KindVolume && cv.parent == sv {
			return nil
		}
		return fmt.Errorf("volume %d: clone of %d: %v %d exists: %w", clone, snap, cv.info.Kind, clone, ErrExists)
	}
	if sv.info.Kind != KindSnapshot {
		return fmt.Errorf("volume %d: clone of %d (a %v): %w", clone, snap, sv.info.Kind, ErrInvalid)
	}
	sv.mu.RLock()
	defer sv.mu.RUnlock()
	b := s.db.NewBatch()
	m, err := s.takeMapID(b)
	if err != nil {
		_ = b.Close()
		return fmt.Errorf("volume %d: clone of %d: %w", clone, snap, err)
	}
	r := volumeRecord{info: Info{ID: clone, SizeBytes: sv.info.SizeBytes, BlockSize: sv.info.BlockSize,
		State: StateOnline, Kind: KindVolume, Parent: snap}, mapID: m}
	_ = b.Set(volumeKey(clone), r.encode(), nil)
	if err := s.commit(b, true); err != nil {
		return fmt.Errorf("volume %d: clone of %d: %w", clone, snap, err)
	}
	s.hook(hookCloneCommitted)
	s.nextMap = m + 1
	cv := newVolume(s, r)
	cv.m = sv.m.share(m)
	cv.m.resize(cv.clusters())
	cv.setParent(sv)
	s.vols[clone] = cv
	return nil
}

// children returns the objects whose parent is v. Requires s.mu.
func (s *Store) children(v *Volume) []*Volume {
	var out []*Volume
	for _, c := range s.vols {
		if c.parent == v {
			out = append(out, c)
		}
	}
	return out
}

// takeMapID returns the next map ID and adds the counter's new value to
// b (the batch that first names the map); s.nextMap moves only once b is
// committed (the caller sets it past m). Requires s.mu.
func (s *Store) takeMapID(b *pebble.Batch) (uint64, error) {
	m := s.nextMap
	if m == 0 {
		return 0, fmt.Errorf("no map ID left: %w", ErrInvalid)
	}
	_ = b.Set(nextMapKey, putUint64(m+1), nil)
	return m, nil
}

func putUint64(x uint64) []byte {
	v := make([]byte, 8)
	putPhys(v, x)
	return v
}

// loadNextMap reads the 'N' counter (firstMapID when absent: a store
// that never made a map).
func (s *Store) loadNextMap() error {
	s.nextMap = firstMapID
	v, closer, err := s.db.Get(nextMapKey)
	if err == pebble.ErrNotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: read the next map ID: %w: %w", ErrIO, err)
	}
	n, ok := uint64(0), len(v) == 8
	if ok {
		n = binary.BigEndian.Uint64(v)
	}
	_ = closer.Close()
	if !ok || (n < firstMapID && n != 0) { // 0: every ID handed out
		return fmt.Errorf("store: next map ID %x: %w", v, ErrCorrupt)
	}
	s.nextMap = n
	return nil
}

// parentsFirst links each object to its parent and orders them so that a
// parent comes before its children (then by ID): ErrCorrupt if a parent
// is missing, is not a snapshot, is being deleted, or the links make a
// cycle.
func parentsFirst(all map[ID]*Volume) ([]*Volume, error) {
	depth := make(map[*Volume]int, len(all))
	for id, v := range all {
		p := v.info.Parent
		if p == 0 {
			continue
		}
		pv := all[p]
		if pv == nil || pv.info.Kind != KindSnapshot || pv.info.State == stateDeleting {
			return nil, fmt.Errorf("store: object %d: its parent %d is missing, not a snapshot, or being deleted: %w", id, p, ErrCorrupt)
		}
		v.setParent(pv)
	}
	out := make([]*Volume, 0, len(all))
	for id, v := range all {
		d := 0
		for a := v.parent; a != nil; a = a.parent {
			if d++; d > len(all) {
				return nil, fmt.Errorf("store: object %d: its parents make a cycle: %w", id, ErrCorrupt)
			}
		}
		depth[v] = d
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b *Volume) int {
		return cmp.Or(cmp.Compare(depth[a], depth[b]), cmp.Compare(a.id, b.id))
	})
	return out, nil
}

// scanMap calls fn for every key of map m, in index order.
func (s *Store) scanMap(m uint64, fn func(k, v []byte) error) error {
	lo, hi := make([]byte, mapKeyLen), make([]byte, mapKeyLen)
	putMapKey(lo, m, 0)
	putMapEnd(hi, m)
	return s.scanRange(lo, hi, fn)
}

// scanOrphanMaps calls fn for every map key whose map is none of known's,
// seeking past the known maps' ranges.
func (s *Store) scanOrphanMaps(known map[uint64]*Volume, fn func(k, v []byte) error) error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{familyMap}, UpperBound: []byte{familyMap + 1}})
	if err != nil {
		return fmt.Errorf("store: %w: %w", ErrIO, err)
	}
	end := make([]byte, mapKeyLen)
	for ok := it.First(); ok; {
		m, _, okk := parseMapKey(it.Key())
		if okk && known[m] != nil {
			putMapEnd(end, m)
			ok = it.SeekGE(end)
			continue
		}
		v, err := it.ValueAndErr()
		if err == nil {
			err = fn(it.Key(), v)
		} else {
			err = fmt.Errorf("store: %w: %w", ErrIO, err)
		}
		if err != nil {
			_ = it.Close()
			return err
		}
		ok = it.Next()
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: %w: %w", ErrIO, err)
	}
	return nil
}
