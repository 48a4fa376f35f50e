package store

import (
	"context"
	"fmt"
)

// The operations of docs/snapshots.md §8 step 3: what a snapshot's space
// is, what changed between two objects, an object's own clusters, and
// revert, delete (merge into the one child) and flatten.

// ObjectSpace is an object's space, in bytes of whole clusters.
type ObjectSpace struct {
	// OwnedBytes: the clusters its own map names (what it adds to the
	// store's Stats().Mapped; the sum over all objects is that figure).
	OwnedBytes uint64 `json:"owned_bytes"`
	// SharedBytes: the clusters it reads through its parent (0 without
	// one).
	SharedBytes uint64 `json:"shared_bytes"`
	// ExclusiveBytes: the owned clusters nothing else reads, which is what
	// deleting the object frees: all of OwnedBytes for a volume; for a
	// snapshot, the clusters every child hides (with its own cluster or a
	// tombstone) or lies past the end of.
	ExclusiveBytes uint64 `json:"exclusive_bytes"`
}

// SpaceOf returns an object's space (docs/snapshots.md §1.5), computed
// from the in-memory tables (no pebble read): a walk of the object's
// table and, for a snapshot, of its children's at its own indices; about
// a millisecond per 16 GiB written. (Named SpaceOf, not Space: Store.Space
// is the store's filesystem space.)
func (s *Store) SpaceOf(id ID) (ObjectSpace, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ObjectSpace{}, fmt.Errorf("volume %d: space: %w", id, ErrClosed)
	}
	v, ok := s.vols[id]
	if !ok {
		return ObjectSpace{}, fmt.Errorf("volume %d: space: %w", id, ErrNotFound)
	}
	kids := s.children(v)
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, c := range kids {
		c.mu.RLock()
		defer c.mu.RUnlock()
	}
	var sp ObjectSpace
	var owned1, shared, excl uint64
	v.m.each(0, ^uint64(0), func(i, e uint64) {
		switch {
		case owned(e):
			owned1++
			for _, c := range kids {
				if i < c.clusters() && c.m.get(i)&inherited != 0 {
					return
				}
			}
			excl++
		case e&inherited != 0 && physOf(e) != 0:
			shared++
		}
	})
	sp.OwnedBytes, sp.SharedBytes, sp.ExclusiveBytes = owned1<<s.cshift, shared<<s.cshift, excl<<s.cshift
	return sp, nil
}

// MappedOwn calls fn, in LBA order, for each run of the volume's own
// entries whose blocks meet [from, to): clusters (zero false) and
// tombstones (zero true: the object reads zeros there and hides its
// parent's cluster), clipped as Mapped clips; entries read through the
// parent are skipped. A rebuild that carries snapshots copies these
// (docs/snapshots.md §1.9). Like Mapped, it holds no lock while fn runs
// and looks at mappedBatch clusters per lock.
func (v *Volume) MappedOwn(from, to uint64, fn func(lba, blocks uint64, zero bool) error) error {
	type run struct {
		start, end uint64
		zero       bool
	}
	var runs []run
	for {
		v.mu.RLock()
		if v.gone != nil {
			v.mu.RUnlock()
			return fmt.Errorf("volume %d: %w", v.id, v.gone)
		}
		cb := uint(v.s.cshift - v.shift)
		to = min(to, v.info.Blocks())
		if from >= to {
			v.mu.RUnlock()
			return nil
		}
		first, last := from>>cb, (to+(1<<cb)-1)>>cb
		limit := min(last, first+mappedBatch)
		runs = runs[:0]
		v.m.each(first, limit, func(i, e uint64) {
			if e&inherited != 0 {
				return
			}
			z := e == tombstone
			if n := len(runs); n > 0 && runs[n-1].end == i && runs[n-1].zero == z {
				runs[n-1].end++
				return
			}
			runs = append(runs, run{i, i + 1, z})
		})
		v.mu.RUnlock()
		for _, r := range runs {
			lba, stop := max(from, r.start<<cb), min(to, r.end<<cb)
			if lba < stop {
				if err := fn(lba, stop-lba, r.zero); err != nil {
					return err
				}
			}
		}
		from = max(from, limit<<cb)
	}
}

// Changes calls fn, in LBA order with runs merged, for the blocks of
// object to that differ from what its ancestor from reads, as far as the
// maps say (docs/snapshots.md §5.1): every index some object on the path
// from to up to, not including, from owns; zero says the newest owner
// holds a tombstone there (reads zeros). from 0 is the empty root: every
// block to reads data at (tombstones are no change from it). No data is
// read; the runs are found before fn is first called, so the caller knows
// the total up front if it counts them. ErrNotAncestor if from is neither
// 0, to, nor an ancestor of to.
func (s *Store) Changes(from, to ID, fn func(lba, blocks uint64, zero bool) error) error {
	type run struct {
		start, end uint64
		zero       bool
	}
	var runs []run
	var cb uint
	var blocks uint64
	err := func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return fmt.Errorf("volume %d: changes: %w", to, ErrClosed)
		}
		tv, ok := s.vols[to]
		if !ok {
			return fmt.Errorf("volume %d: changes: %w", to, ErrNotFound)
		}
		var fv *Volume
		if from != 0 {
			if fv, ok = s.vols[from]; !ok {
				return fmt.Errorf("volume %d: changes since %d: %w", to, from, ErrNotFound)
			}
			a := tv
			for a != nil && a != fv {
				a = a.parent
			}
			if a == nil {
				return fmt.Errorf("volume %d: changes since %d: %w", to, from, ErrNotAncestor)
			}
			if fv == tv {
				return nil // no change from itself
			}
		}
		tv.mu.RLock()
		defer tv.mu.RUnlock()
		cb, blocks = uint(s.cshift-tv.shift), tv.info.Blocks()
		tv.m.each(0, tv.clusters(), func(i, e uint64) {
			o := tv
			for e&inherited != 0 {
				if o = o.parent; o == nil || o == fv {
					return // read through from (or nothing): unchanged
				}
				e = o.m.get(i)
			}
			if e == 0 || (fv == nil && e == tombstone) {
				// Nothing there nor above (a merge can leave a child of
				// the merged child a tombstone inherited from the merged
				// snapshot's page where its parent now has nothing: zeros
				// both), or zeros from the empty root too.
				return
			}
			z := e == tombstone
			if n := len(runs); n > 0 && runs[n-1].end == i && runs[n-1].zero == z {
				runs[n-1].end++
				return
			}
			runs = append(runs, run{i, i + 1, z})
		})
		return nil
	}()
	if err != nil {
		return err
	}
	for _, r := range runs {
		lba, stop := r.start<<cb, min(blocks, r.end<<cb)
		if lba < stop {
			if err := fn(lba, stop-lba, r.zero); err != nil {
				return err
			}
		}
	}
	return nil
}

// Revert makes volume vol read what snapshot snap reads (docs/snapshots.md
// §1.7; snap is any snapshot of vol's block size: one of its ancestors,
// or one a revert left off its chain): one synced batch gives vol a new, empty
// map whose parent is snap, snap's size and the revert token; then the
// clusters of vol's old map are released (zeroed, synced, its keys
// deleted in one synced batch; a crash in between leaves keys of no
// object, which Open releases). The snapshots between snap and vol stay
// as they are. Idempotent by token: a token at or below the one the
// record holds was applied already and is a no-op; token 0 is always
// applied and leaves the record's token as it was (a rebuild's local
// revert). It waits for vol's requests in flight; the host must not be
// connected (the registry checks). ErrInvalid if vol is not a volume, snap
// not a snapshot, or their block sizes differ.
func (s *Store) Revert(vol, snap ID, token uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.adminCheck(vol, "revert"); err != nil {
		return err
	}
	v, ok := s.vols[vol]
	if !ok {
		return fmt.Errorf("volume %d: revert: %w", vol, ErrNotFound)
	}
	if token != 0 && token <= v.token {
		return nil
	}
	sv, ok := s.vols[snap]
	if !ok {
		return fmt.Errorf("volume %d: revert to %d: %w", vol, snap, ErrNotFound)
	}
	// Any snapshot will do, not only an ancestor: after a revert to s1,
	// the snapshot s2 taken after s1 is no longer on the volume's chain,
	// and a revert to s2 (the registry allows the volume's own
	// snapshots) must still be carried out, or the volume would fail on
	// every reconcile. The volume becomes one more child of snap.
	if v.info.Kind != KindVolume || sv.info.Kind != KindSnapshot {
		return fmt.Errorf("volume %d: revert to %d: a %v cannot revert to a %v: %w", vol, snap, v.info.Kind, sv.info.Kind, ErrInvalid)
	}
	if sv.info.BlockSize != v.info.BlockSize {
		return fmt.Errorf("volume %d: revert to %d: %d-byte blocks, the snapshot has %d: %w", vol, snap, v.info.BlockSize, sv.info.BlockSize, ErrInvalid)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	b := s.db.NewBatch()
	m, err := s.takeMapID(b)
	if err != nil {
		_ = b.Close()
		return fmt.Errorf("volume %d: revert to %d: %w", vol, snap, err)
	}
	r := v.record()
	oldMap := r.mapID
	r.mapID, r.info.Parent, r.info.SizeBytes = m, snap, sv.info.SizeBytes
	if token != 0 {
		r.token = token
	}
	_ = b.Set(volumeKey(vol), r.encode(), nil)
	if err := s.commit(b, true); err != nil {
		return fmt.Errorf("volume %d: revert to %d: %w", vol, snap, err)
	}
	s.hook(hookRevertCommitted)
	s.nextMap = m + 1
	var ps []uint64
	v.m.each(0, ^uint64(0), func(_, e uint64) {
		if owned(e) {
			ps = append(ps, physOf(e))
		}
	})
	v.mapID, v.token = m, r.token
	v.setParent(sv)
	v.setRecord(r)
	v.m = sv.m.share(m)
	v.m.resize(v.clusters())
	v.allocated.Store(0)
	if err := s.releaseMap(oldMap, ps); err != nil {
		return fmt.Errorf("volume %d: revert to %d (its old clusters are released at the next open): %w", vol, snap, err)
	}
	return nil
}

// releaseMap frees ps, the clusters of map m, which no object names any
// more (its keys are orphans): zero them, sync the area, delete the map's
// keys in one synced batch, and they are free.
func (s *Store) releaseMap(m uint64, ps []uint64) error {
	if len(ps) > 0 {
		if err := s.zeroClusters(append([]uint64(nil), ps...)); err != nil {
			return err
		}
		if err := s.syncArea(); err != nil {
			return err
		}
	}
	b := s.db.NewBatch()
	var lo, hi [mapKeyLen]byte
	putMapKey(lo[:], m, 0)
	putMapEnd(hi[:], m)
	_ = b.DeleteRange(lo[:], hi[:], nil)
	if err := s.commit(b, true); err != nil {
		return err
	}
	s.al.mu.Lock()
	for _, p := range ps {
		s.al.release(p)
	}
	s.al.mapped -= uint64(len(ps))
	s.al.mu.Unlock()
	return nil
}

// merge deletes snapshot sv into its one child c (docs/snapshots.md §1.6):
// sv's record is already stateMerging (durable) and sv out of s.vols. In
// chunks of freeChunk of sv's own indices, each one unsynced batch under
// c's exclusive lock (c's I/O waits for one chunk, not the merge): where c
// owns the index, sv's cluster is freed ('R', limbo); where c reads it
// through sv, the key moves to c's map. c reads the same bytes after each
// chunk. Last, one synced batch deletes sv's record and gives c sv's
// parent. Open runs what a crash left of it. Requires s.mu.
func (s *Store) merge(sv, c *Volume) error {
	var es []mergeEnt
	sv.m.each(0, ^uint64(0), func(i, e uint64) {
		if e&inherited == 0 {
			es = append(es, mergeEnt{i, e})
		}
	})
	var key [mapKeyLen]byte
	var val [8]byte
	for len(es) > 0 {
		k := min(len(es), freeChunk)
		if err := s.mergeChunk(sv, c, es[:k], key[:], val[:]); err != nil {
			return err
		}
		s.hook(hookMergeChunk)
		es = es[k:]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.record()
	r.info.Parent = sv.info.Parent
	b := s.db.NewBatch()
	_ = b.Delete(volumeKey(sv.id), nil)
	_ = b.Set(volumeKey(c.id), r.encode(), nil)
	if err := s.commit(b, true); err != nil {
		return err
	}
	s.hook(hookMergeDone)
	c.setParent(sv.parent)
	c.setRecord(r)
	if c.parent == nil && c.info.Kind == KindVolume {
		// Not a snapshot's: its children read its table (free looks at
		// their parent's) without its lock. Its tombstones read zeros as
		// holes would; Open trims their keys.
		c.unshare()
	}
	return nil
}

// mergeEnt is an own entry of a snapshot being merged: index, entry.
type mergeEnt struct{ i, e uint64 }

// mergeChunk is one chunk of merge: one unsynced batch, then the tables.
func (s *Store) mergeChunk(sv, c *Volume, es []mergeEnt, key, val []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	// c's partial entries where sv owns an entry read sv's bytes for the
	// sub-blocks they lack: filled first (their keys deferred, committed
	// with this chunk's batch after an area sync), and the reads of c's
	// children that saw them partial are waited for (gate) before sv's
	// cluster is freed.
	filled := false
	for _, x := range es {
		if c.m.get(x.i)&(partial|inherited) == partial {
			if _, err := c.firstWrite(x.i, 0, nil); err != nil {
				return fmt.Errorf("fill partial cluster %d of %d: %w", x.i, c.id, err)
			}
			filled = true
		}
	}
	if filled {
		s.gate.Lock()
		s.gate.Unlock() //nolint:staticcheck // a barrier: the readers before it are done
	}
	b := s.db.NewBatch()
	var freed []uint64
	moved := 0
	for _, x := range es {
		putMapKey(key, sv.mapID, x.i)
		_ = b.Delete(key, nil)
		ce := c.m.get(x.i)
		if ce&inherited == 0 && ce != 0 { // c hides it: sv's cluster is nobody's now
			if owned(x.e) {
				freed = append(freed, physOf(x.e))
				putReservedKey(key, physOf(x.e))
				_ = b.Set(key[:reservedKeyLen], nil, nil)
			}
			continue
		}
		if x.e == tombstone && sv.parent == nil {
			continue // zeros in c with no parent: nothing to keep
		}
		putMapKey(key, c.mapID, x.i)
		putPhys(val, x.e&^(inherited|tombstone)) // a tombstone's key holds 0; a partial one's its mask
		_ = b.Set(key, val, nil)
		if owned(x.e) {
			moved++
		}
	}
	if err := s.commit(b, false); err != nil {
		return err
	}
	for _, x := range es {
		ce := c.m.get(x.i)
		switch {
		case ce&inherited == 0 && ce != 0:
		case x.e == tombstone && sv.parent == nil:
			c.m.set(x.i, 0)
		default:
			c.m.set(x.i, x.e)
		}
		// sv's pages stay as they are: c's children (if c is a snapshot)
		// may still read through them, and they name the same clusters.
	}
	c.allocated.Add(int64(moved))
	sv.allocated.Add(-int64(moved + len(freed)))
	s.al.mu.Lock()
	s.al.limbo = append(s.al.limbo, freed...)
	s.al.mapped -= uint64(len(freed))
	s.al.mu.Unlock()
	return nil
}

// unshare rebuilds v's table from its own entries only, dropping its
// tombstones, once it has no parent (after a merge into a parentless
// snapshot's child, or a flatten): what it shared read only inherited
// tombstones and holes, which are holes now. Its tombstone keys are
// deleted (unsynced: Open trims what a crash leaves of them). Requires
// v.mu exclusively.
func (v *Volume) unshare() {
	s := v.s
	var own, tombs []uint64
	v.m.each(0, ^uint64(0), func(i, e uint64) {
		switch {
		case owned(e):
			own = append(own, i, e)
		case e == tombstone:
			tombs = append(tombs, i)
		}
	})
	m := clusterMap{id: v.mapID}
	m.resize(v.clusters())
	for j := 0; j < len(own); j += 2 {
		m.set(own[j], own[j+1])
	}
	v.m = m
	if len(tombs) == 0 {
		return
	}
	b := s.db.NewBatch()
	var key [mapKeyLen]byte
	for _, i := range tombs {
		putMapKey(key[:], v.mapID, i)
		_ = b.Delete(key[:], nil)
	}
	if err := s.commit(b, false); err != nil {
		s.log.Errorf("store: volume %d: delete %d tombstones (the next open does): %v", v.id, len(tombs), err)
	}
}

// Flatten copies into the volume every cluster it reads through its
// parent, then detaches it (docs/snapshots.md §1.8): each cluster is a
// copy on write of the whole cluster (claimed as a host's first write
// claims it, so a host write and the flatten copy it once between them),
// in index order, under the volume's shared lock per batch of at most
// flattenCopies; last, one
// synced batch drops the parent from the record. progress, if not nil,
// is called after each batch with the clusters copied and the total (the
// inherited clusters at the start). A cancelled ctx stops it between
// clusters (the copies made stay: the volume reads the same bytes). A
// volume with no parent is flat: nil at once.
func (v *Volume) Flatten(ctx context.Context, progress func(done, total uint64)) error {
	s := v.s
	if s.cfg.ReadOnly {
		return fmt.Errorf("volume %d: flatten: store opened read-only: %w", v.id, ErrReadOnly)
	}
	var total, done uint64
	v.mu.RLock()
	if v.gone != nil {
		v.mu.RUnlock()
		return fmt.Errorf("volume %d: flatten: %w", v.id, v.gone)
	}
	if v.info.Kind != KindVolume {
		v.mu.RUnlock()
		return fmt.Errorf("volume %d: flatten: a %v: %w", v.id, v.info.Kind, ErrInvalid)
	}
	v.m.each(0, ^uint64(0), func(_, e uint64) {
		if e&inherited != 0 && physOf(e) != 0 {
			total++
		}
	})
	v.mu.RUnlock()
	for from := uint64(0); ; {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("volume %d: flatten: %w", v.id, err)
		}
		next, n, err := v.flattenBatch(ctx, from)
		done += n
		if progress != nil && n > 0 {
			progress(done, total)
		}
		if err != nil {
			return fmt.Errorf("volume %d: flatten: %w", v.id, err)
		}
		if next == ^uint64(0) {
			break
		}
		from = next
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.adminCheck(v.id, "flatten"); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.gone != nil {
		return fmt.Errorf("volume %d: flatten: %w", v.id, v.gone)
	}
	if v.parent == nil {
		return nil
	}
	left := false
	v.m.each(0, ^uint64(0), func(_, e uint64) { left = left || flattens(e) })
	if left {
		// A revert or a merge moved the volume meanwhile: run again.
		return fmt.Errorf("volume %d: flatten: its parent changed while it ran; run it again: %w", v.id, ErrInvalid)
	}
	r := v.record()
	r.info.Parent = 0
	if err := s.putRecord(r); err != nil {
		return fmt.Errorf("volume %d: flatten: %w", v.id, err)
	}
	s.hook(hookFlattenDone)
	v.setParent(nil)
	v.setRecord(r)
	v.unshare()
	return nil
}

// flattens says whether a flatten copies entry e: a cluster read through
// the parent, or an own partial one (it reads its missing sub-blocks
// there).
func flattens(e uint64) bool {
	return (e&inherited != 0 && physOf(e) != 0) || e&(partial|inherited) == partial
}

// flattenCopies bounds the clusters one flattenBatch copies under the
// volume's shared lock (2 MiB at 64 KiB clusters): a Deallocate, a
// Resize, a snapshot or a merge chunk waiting for the exclusive lock, and
// the host's requests queued behind it, wait for that many copies at
// most, not a batch of mappedBatch.
const flattenCopies = 32

// flattenBatch copies the inherited clusters of up to mappedBatch indices
// from from, at most flattenCopies of them, under v's shared lock; next
// is where the next batch starts (^0: done).
func (v *Volume) flattenBatch(ctx context.Context, from uint64) (next, n uint64, err error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.gone != nil {
		return 0, 0, v.gone
	}
	end := v.clusters()
	limit := min(end, from+mappedBatch)
	var idx []uint64
	var fill []bool // an own partial cluster: filled, not counted as a copy
	v.m.each(from, limit, func(i, e uint64) {
		if flattens(e) {
			idx, fill = append(idx, i), append(fill, e&inherited == 0)
		}
	})
	for j, i := range idx {
		if err := ctx.Err(); err != nil {
			return 0, n, err
		}
		// A whole-cluster copy: no data of the caller's, the parent's
		// cluster read whole (redirect), or an own partial cluster
		// filled (writePartial).
		if _, err := v.firstWrite(i, 0, nil); err != nil {
			return 0, n, err
		}
		if fill[j] {
			continue
		}
		n++
		v.s.hook(hookFlattenChunk)
		if n == flattenCopies {
			return i + 1, n, nil
		}
	}
	if limit >= end {
		return ^uint64(0), n, nil
	}
	return limit, n, nil
}

// deleteMerging is Delete of snapshot sv with one child c: sv's record
// goes stateMerging (synced) and sv out of sight (its handles fail with
// ErrNotFound once its readers in flight are done), then merge. A failure
// after the first step is finished by the next Open. Requires s.mu.
func (s *Store) deleteMerging(sv, c *Volume) error {
	sv.mu.Lock()
	r := sv.record()
	r.info.State = stateMerging
	if err := s.putRecord(r); err != nil {
		sv.mu.Unlock()
		return fmt.Errorf("volume %d: delete: %w", sv.id, err)
	}
	sv.info.State = stateMerging
	sv.gone = ErrNotFound
	delete(s.vols, sv.id)
	sv.mu.Unlock()
	if err := s.merge(sv, c); err != nil {
		return fmt.Errorf("volume %d: delete (merge into %d, finished at the next open): %w", sv.id, c.id, err)
	}
	return nil
}

// finishMerges runs what a crash left of the merges of deleted snapshots
// into their one child (Open, after its repairs; a read-only store leaves
// them, its children reading through them as before).
func (s *Store) finishMerges(merging []*Volume, all map[ID]*Volume) error {
	if s.cfg.ReadOnly {
		return nil
	}
	for _, sv := range merging {
		var kids []*Volume
		for _, c := range all {
			if c.parent == sv {
				kids = append(kids, c)
			}
		}
		if len(kids) != 1 {
			return fmt.Errorf("store: snapshot %d was being merged into its one child, and has %d: %w", sv.id, len(kids), ErrCorrupt)
		}
		sv.gone = ErrNotFound
		if err := s.merge(sv, kids[0]); err != nil {
			return fmt.Errorf("store: open: finish the delete of snapshot %d (merge into %d): %w", sv.id, kids[0].id, err)
		}
		s.log.Infof("store: open: the delete of snapshot %d finished (merged into %d)", sv.id, kids[0].id)
	}
	return nil
}
