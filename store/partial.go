package store

import (
	"fmt"
	"slices"
)

// Sub-cluster redirect (docs/snapshots.md §1.3).
//
// A first write into a cluster an object reads through its parent does
// not copy the cluster: it takes a new cluster, writes only the
// sub-blocks (a 16th of a cluster, at least 4 KiB) its data covers, and
// the entry becomes partial: the cluster plus a mask of the sub-blocks
// it holds; the others read what the map owning the entry reads through
// its own parent. Later writes to the index write their sub-blocks into
// the same cluster and widen the mask; once every bit is set the entry
// is whole again. A partial entry is own (its map owns the cluster; it
// is freed, moved, counted as any own cluster) but never overwritten in
// place without its claim: writes to it go the first write's way
// (inPlace is false), and reads of it go through readAs.
//
// The keys of redirects and mask changes are deferred (deferred.go): no
// sync on the write's path. What may free a cluster a partial entry
// reads through is the merge of a snapshot into its child (the only
// free of a snapshot's cluster while objects read through it); the merge
// fills the child's partial entries there first, and waits on gate for
// the reads that looked at them before.

// sub returns the sub-block range [a, b) that bytes [in, end) of a
// cluster meet.
func (s *Store) sub(in, end uint64) (a, b uint64) {
	return in >> s.sbShift, (end + 1<<s.sbShift - 1) >> s.sbShift
}

// subMask is the mask of sub-blocks [a, b).
func subMask(a, b uint64) uint64 { return (1<<b - 1) &^ (1<<a - 1) }

// badPartial says whether e, a map value, is a partial entry whose mask
// this store cannot hold: bits past its sub-blocks, or all of them (a
// whole cluster is never partial). Open and Check refuse it.
func (s *Store) badPartial(e uint64) bool {
	m := maskOf(e)
	return e&partial != 0 && (m&^s.fullMask != 0 || m == s.fullMask)
}

// partialEntry is the entry of cluster p holding the sub-blocks of mask:
// p alone once mask is full.
func (s *Store) partialEntry(p, mask uint64) uint64 {
	if mask == s.fullMask {
		return p
	}
	return p | partial | mask<<maskShift
}

// readAs reads bytes [in, in+len(buf)) of cluster idx as object o reads
// them: zeros for nothing or a tombstone, the cluster's bytes, or for a
// partial entry the sub-blocks it holds and, for the others, what the
// entry's owner reads through its parent (recursively). It takes no
// lock: the caller holds o's lock shared (or o is a snapshot, whose table
// only a merge into it changes), and gate shared when the entry may be
// partial. The mask is the owner's current one, not the one a path copy
// left in a descendant's page (a merge may have filled it since).
func (s *Store) readAs(o *Volume, idx, in uint64, buf []byte) error {
	for o != nil && len(buf) > 0 {
		e := o.m.get(idx)
		p := physOf(e)
		if p == 0 {
			break
		}
		if e&partial == 0 {
			return s.readCluster(p, in, buf)
		}
		// The owner: the topmost object on o's chain whose entry names p.
		own := o
		for {
			up := own.up.Load()
			if up == nil || physOf(up.m.get(idx)) != p {
				break
			}
			own = up
		}
		cur := own.m.get(idx)
		if physOf(cur) != p || cur&partial == 0 {
			return s.readCluster(p, in, buf)
		}
		mask := maskOf(cur)
		parent := own.up.Load()
		for len(buf) > 0 {
			j := in >> s.sbShift
			have := mask>>j&1 != 0
			// The run of sub-blocks from j alike in the mask.
			end := in + uint64(len(buf))
			k := j + 1
			for k<<s.sbShift < end && (mask>>k&1 != 0) == have {
				k++
			}
			n := min(end, k<<s.sbShift) - in
			var err error
			if have {
				err = s.readCluster(p, in, buf[:n])
			} else {
				err = s.readAs(parent, idx, in, buf[:n])
			}
			if err != nil {
				return err
			}
			buf, in = buf[n:], in+n
		}
		return nil
	}
	clear(buf)
	return nil
}

// readCluster reads bytes [in, in+len(buf)) of cluster p.
func (s *Store) readCluster(p, in uint64, buf []byte) error {
	if err := s.area.ReadAt(buf, int64(p<<s.cshift+in)); err != nil {
		return fmt.Errorf("read cluster %d: %w: %w", p, ErrIO, err)
	}
	return nil
}

// readPartial is readAs as v reads cluster idx, under gate: for every
// read that may meet a partial entry (Read's segment of one, a redirect's
// sub-blocks to merge, writtenPast).
func (v *Volume) readPartial(idx, in uint64, buf []byte) error {
	s := v.s
	s.gate.RLock()
	defer s.gate.RUnlock()
	return s.readAs(v, idx, in, buf)
}

// redirect is a claimed first write of data at offset in of cluster idx,
// which v reads through its parent: take a cluster, write the sub-blocks
// data meets (a sub-block data covers only partly gets the rest from
// what v reads there now), defer the key. No data (a flatten) copies the
// whole cluster. A store without sub-blocks copies the whole cluster
// with the data in it. es[0] is set to the new entry.
func (v *Volume) redirect(idx, in uint64, data []byte, es []uint64) error {
	s := v.s
	p, err := s.takeCluster()
	if err != nil {
		return err
	}
	C := s.cmask + 1
	end := in + uint64(len(data))
	mask := s.fullMask
	if len(data) == 0 || !s.partials() {
		err = v.copyCluster(idx, p, 0, C, in, data)
	} else {
		a, b := s.sub(in, end)
		mask = subMask(a, b)
		err = v.copyCluster(idx, p, a<<s.sbShift, b<<s.sbShift, in, data)
	}
	if err != nil {
		s.toLimbo(p)
		return err
	}
	s.hook(hookDataWritten)
	s.c.redirects.Add(1)
	e := s.partialEntry(p, mask)
	s.deferKey(v.mapID, idx, e, p, false)
	es[0] = e
	return nil
}

// copyCluster writes bytes [from, to) of cluster idx into cluster p: data
// at in (within [from, to)), the rest what v reads there now. Data
// covering the range whole is written as it is (no read, no copy).
func (v *Volume) copyCluster(idx, p, from, to, in uint64, data []byte) error {
	s := v.s
	if in == from && in+uint64(len(data)) == to {
		if err := s.area.WriteAt(data, int64(p<<s.cshift+in)); err != nil {
			return fmt.Errorf("redirect: %w: %w", ErrIO, err)
		}
		return nil
	}
	bp := s.cowBufs.Get().(*[]byte)
	defer s.cowBufs.Put(bp)
	buf := (*bp)[:to-from]
	// Only the sub-blocks data leaves uncovered need reading; reading the
	// range whole is one I/O instead of two.
	if err := v.readPartial(idx, from, buf); err != nil {
		return fmt.Errorf("redirect: %w", err)
	}
	copy(buf[in-from:], data)
	if err := s.area.WriteAt(buf, int64(p<<s.cshift+from)); err != nil {
		return fmt.Errorf("redirect: %w: %w", ErrIO, err)
	}
	return nil
}

// writePartial is a claimed write of data at offset in of cluster idx,
// whose own entry e is partial: the sub-blocks it meets are written into
// e's cluster (one it holds only partly covered keeps its other bytes;
// one it lacks gets them from what v reads there), and the mask widens
// (its key deferred). No data (a flatten, a merge) fills every sub-block
// it lacks. es[0] is set to the entry.
func (v *Volume) writePartial(idx, in uint64, data []byte, e uint64, es []uint64) error {
	s := v.s
	p, mask := physOf(e), maskOf(e)
	var from, to uint64
	if len(data) == 0 {
		from, to, mask = 0, s.cmask+1, s.fullMask
	} else {
		end := in + uint64(len(data))
		a, b := s.sub(in, end)
		from, to = in, end
		if in&(1<<s.sbShift-1) != 0 && mask>>a&1 == 0 {
			from = a << s.sbShift
		}
		if end&(1<<s.sbShift-1) != 0 && mask>>(b-1)&1 == 0 {
			to = b << s.sbShift
		}
		mask |= subMask(a, b)
	}
	if err := v.copyCluster(idx, p, from, to, in, data); err != nil {
		return err
	}
	ne := s.partialEntry(p, mask)
	es[0] = ne
	if ne != e {
		s.hook(hookDataWritten)
		s.deferKey(v.mapID, idx, ne, 0, false)
	}
	return nil
}

// The direct path's redirect. A write of whole sub-blocks within one
// cluster that v reads through its parent, or into v's own partial
// cluster, needs no read and no metadata but its deferred key: BeginDirect
// claims the index, takes a ready cluster (a redirect) without waiting,
// and hands the write to the disk engine as one segment; EndDirect
// publishes the entry and defers its key, or on an error gives the
// cluster back (to limbo: it may hold part of the write). Anything else
// (no ready cluster, the index claimed, the store out of space) goes the
// slow way.

// directClaim is a claimed index whose write is at the disk: the entry
// to publish once it lands; fresh, the cluster it took (0: none).
type directClaim struct{ idx, e, fresh uint64 }

// redirectable says whether a write of n bytes at offset in of a cluster
// whose entry is e may be redirected on the direct path.
func (v *Volume) redirectable(e, in, n uint64) bool {
	s := v.s
	sb := uint64(1)<<s.sbShift - 1
	return s.partials() && in&sb == 0 && n&sb == 0 &&
		(e&(partial|inherited) == partial || (e&inherited != 0 && physOf(e) != 0))
}

// beginRedirect claims index idx (entry e when looked at) for a direct
// write of n bytes at in and sets segs[0]; false if it cannot without
// waiting. Requires v.mu shared.
func (v *Volume) beginRedirect(idx, in, n, e uint64, segs []Segment) bool {
	s := v.s
	if len(segs) == 0 || s.noSpace.Load() {
		return false
	}
	a, b := s.sub(in, in+n)
	v.allocMu.Lock()
	defer v.allocMu.Unlock()
	if v.m.get(idx) != e || slices.Contains(v.claims, idx) {
		return false
	}
	var q, fresh uint64
	if e&inherited != 0 {
		// Tried, not waited for: a refill holds it across its synced
		// commit. The cluster counts as mapped from here (an I/O error
		// sends it to limbo and takes it off).
		if !s.al.mu.TryLock() {
			return false
		}
		p, ok := s.al.popReady()
		if ok {
			s.kickRefill()
			s.al.mapped++
		}
		s.al.mu.Unlock()
		if !ok {
			return false
		}
		q, fresh = p, p
		e = s.partialEntry(q, subMask(a, b))
	} else {
		q = physOf(e)
		e = s.partialEntry(q, maskOf(e)|subMask(a, b))
	}
	v.claims = append(v.claims, idx)
	v.directs = append(v.directs, directClaim{idx, e, fresh})
	v.ndirect.Add(1)
	segs[0] = Segment{Off: int64(q<<s.cshift + in), Pos: 0, Len: int(n)}
	return true
}

// endRedirect ends the direct claim of the cluster lba lies in, if there
// is one (the write may be an ordinary one: nothing to do). Requires v.mu
// shared.
func (v *Volume) endRedirect(lba uint64, ioErr error) {
	s := v.s
	idx := (lba << v.shift) >> s.cshift
	v.allocMu.Lock()
	j := slices.IndexFunc(v.directs, func(d directClaim) bool { return d.idx == idx })
	if j < 0 {
		v.allocMu.Unlock()
		return
	}
	d := v.directs[j]
	v.directs = slices.Delete(v.directs, j, j+1)
	v.ndirect.Add(-1)
	v.allocMu.Unlock()
	if ioErr != nil {
		if d.fresh != 0 {
			s.al.mu.Lock() // an I/O error: rare enough to wait on a poll group
			s.al.limbo = append(s.al.limbo, d.fresh)
			s.al.mapped--
			s.al.mu.Unlock()
		}
		v.unclaim(idx, 1, nil, 0)
		return
	}
	if d.fresh != 0 {
		s.c.redirects.Add(1)
	}
	if old := v.m.get(idx); old != d.e { // a mask widened, or a redirect
		s.deferKey(v.mapID, idx, d.e, d.fresh, true)
	}
	fresh := 0
	if d.fresh != 0 {
		fresh = 1
	}
	v.unclaim(idx, 1, []uint64{d.e}, fresh)
}
