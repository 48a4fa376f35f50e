package store

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
)

// Volume is the handle of one volume. Its methods are safe for concurrent
// use. Each request holds the volume's lock shared, only to exclude what
// changes the volume under it (Resize, SetState, Delete, Close, and frees
// of whole clusters, which must not race a pwrite into the cluster they
// free); first writes of clusters also take allocMu, briefly, to claim
// their cluster index and to publish its entry (firstWrite).
type Volume struct {
	s     *Store
	id    ID
	mapID uint64

	mu    sync.RWMutex
	info  Info       // guarded by mu
	shift uint8      // log2(block size), guarded by mu
	gone  error      // ErrNotFound after Delete, ErrClosed after Close; guarded by mu
	m     clusterMap // top replaced under mu held exclusively
	// parent is the snapshot this object reads through (nil: none);
	// token the record's revert token. Both change under s.mu and mu
	// held exclusively (Snapshot, Revert, the merge of a deleted parent).
	parent *Volume
	token  uint64
	// up is parent for readers that hold no lock of this object: a read
	// of a partial entry walks its descendant's chain up (readAs).
	up atomic.Pointer[Volume]

	// allocMu guards claims (the cluster indices whose first write is in
	// flight: claim) and serialises clusterMap.set for first writes;
	// claimDone (on allocMu) wakes first writes waiting for a claim.
	allocMu      sync.Mutex
	claims       []uint64
	directs      []directClaim // claims of redirects at the disk (partial.go); guarded by allocMu
	ndirect      atomic.Int32  // len(directs), read by EndDirect without allocMu
	claimDone    sync.Cond
	claimWaiters int        // first writes waiting for a claim (tests)
	serialMu     sync.Mutex // held across a first write with Store.serialFirstWrites (benchmarks)
	allocated    atomic.Int64

	c volumeCounters
}

type volumeCounters struct {
	reads, writes, readBytes, writeBytes, errors                atomic.Uint64
	fuaWrites, writeZeroes, deallocates, flushes, removedBlocks atomic.Uint64
}

// WriteFlags modify a write.
type WriteFlags uint8

// FUA: the write is durable when acknowledged.
const FUA WriteFlags = 1

func newVolume(s *Store, r volumeRecord) *Volume {
	v := &Volume{s: s, id: r.info.ID, mapID: r.mapID, token: r.token}
	v.m.id = r.mapID // the volume's pages are its own
	v.claimDone.L = &v.allocMu
	v.setRecord(r)
	v.m.resize(v.clusters())
	return v
}

// setParent sets parent (and up). Requires what parent requires.
func (v *Volume) setParent(p *Volume) {
	v.parent = p
	v.up.Store(p)
}

func (v *Volume) setRecord(r volumeRecord) {
	v.info = r.info
	v.shift = uint8(bits.TrailingZeros32(r.info.BlockSize))
}

func (v *Volume) record() volumeRecord {
	return volumeRecord{info: v.info, mapID: v.mapID, token: v.token}
}

// clusters is the number of clusters the volume's size spans.
func (v *Volume) clusters() uint64 { return (v.info.SizeBytes + v.s.cmask) >> v.s.cshift }

// ID returns the volume's ID.
func (v *Volume) ID() ID { return v.id }

// Info returns the volume's description.
func (v *Volume) Info() (Info, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.gone != nil {
		return Info{}, fmt.Errorf("volume %d: %w", v.id, v.gone)
	}
	return v.info, nil
}

// TryInfo is Info without waiting: ok is false, and nothing else is
// set, when the volume's lock is held or wanted by a writer (a
// Deallocate, a Write Zeroes of whole clusters, a resize, waiting for the
// direct I/Os in flight to end). A poll group asks it: the direct I/Os
// such a writer waits for may be its own, which it could never reap while
// blocked in Info.
func (v *Volume) TryInfo() (info Info, ok bool, err error) {
	if !v.mu.TryRLock() {
		return Info{}, false, nil
	}
	defer v.mu.RUnlock()
	if v.gone != nil {
		return Info{}, true, fmt.Errorf("volume %d: %w", v.id, v.gone)
	}
	return v.info, true, nil
}

// VolumeStats are a volume's counters (requests that succeeded, and
// those that failed) and its allocated space.
type VolumeStats struct {
	Reads, Writes, ReadBytes, WriteBytes, Errors uint64
	// FUAWrites are among Writes; RemovedBlocks: the blocks named by
	// WriteZeroes and Deallocate requests.
	FUAWrites, WriteZeroes, Deallocates, Flushes, RemovedBlocks uint64
	// AllocatedBytes: the clusters its own map names × cluster size
	// (exact). A snapshot taken of the volume owns what the volume had
	// (Store.SpaceOf says what it reads through its parent).
	AllocatedBytes uint64
}

// Stats returns the volume's counters.
func (v *Volume) Stats() VolumeStats {
	return VolumeStats{Reads: v.c.reads.Load(), Writes: v.c.writes.Load(), ReadBytes: v.c.readBytes.Load(),
		WriteBytes: v.c.writeBytes.Load(), Errors: v.c.errors.Load(),
		FUAWrites: v.c.fuaWrites.Load(), WriteZeroes: v.c.writeZeroes.Load(), Deallocates: v.c.deallocates.Load(),
		Flushes: v.c.flushes.Load(), RemovedBlocks: v.c.removedBlocks.Load(),
		AllocatedBytes: uint64(v.allocated.Load()) << v.s.cshift}
}

type op uint8

const (
	opRead op = iota
	opWrite
	opWriteZeroes
	opDeallocate
	opFlush
)

func (o op) String() string {
	return [...]string{"read", "write", "write-zeroes", "deallocate", "flush"}[o]
}

// check validates a request of length bytes (or, length < 0, n blocks) at
// lba and returns its blocks. Requires v.mu held.
func (v *Volume) check(o op, lba uint64, length int, n uint64) (uint64, error) {
	if v.gone != nil {
		return 0, v.fail(o, lba, v.gone)
	}
	if err := v.s.err(); err != nil {
		return 0, v.fail(o, lba, err)
	}
	if length >= 0 {
		if length&(int(v.info.BlockSize)-1) != 0 {
			return 0, v.fail(o, lba, fmt.Errorf("%d bytes: %w", length, ErrMisaligned))
		}
		if length > v.s.cfg.MaxTransferBytes {
			return 0, v.fail(o, lba, fmt.Errorf("%d bytes, maximum %d: %w", length, v.s.cfg.MaxTransferBytes, ErrTooLarge))
		}
		n = uint64(length) >> v.shift
	}
	if blocks := v.info.Blocks(); lba > blocks || n > blocks-lba {
		return 0, v.fail(o, lba, fmt.Errorf("%d blocks, capacity %d: %w", n, blocks, ErrOutOfRange))
	}
	if o != opRead && n > 0 && (v.info.State == StateReadOnly || v.s.cfg.ReadOnly) {
		return 0, v.fail(o, lba, fmt.Errorf("volume %v, store read-only %v: %w", v.info.State, v.s.cfg.ReadOnly, ErrReadOnly))
	}
	return n, nil
}

func (v *Volume) fail(o op, lba uint64, err error) error {
	v.c.errors.Add(1)
	return fmt.Errorf("volume %d: %v at LBA %d: %w", v.id, o, lba, err)
}

// dio returns an aligned buffer for p: p itself, or a bounce buffer from
// the store's pool (counted) when p's address is not aligned.
func (s *Store) dio(p []byte) ([]byte, *[]byte) {
	if isAligned(p, s.align) {
		return p, nil
	}
	s.c.bounces.Add(1)
	b := s.bounce.Get().(*[]byte)
	return (*b)[:len(p)], b
}

// Read fills buf with the blocks at lba. Unallocated clusters read as
// zeros without touching the disk; allocated ones straight from the area
// into buf (O_DIRECT), one read per run of physically contiguous clusters.
func (v *Volume) Read(lba uint64, buf []byte) error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	n, err := v.check(opRead, lba, len(buf), 0)
	if err != nil || n == 0 {
		return err
	}
	s := v.s
	dst, bounce := s.dio(buf)
	off := lba << v.shift
	end := off + uint64(len(buf))
	for pos := uint64(0); off < end; {
		idx, in := off>>s.cshift, off&s.cmask
		seg := min(s.cmask+1-in, end-off)
		p := v.m.get(idx)
		switch {
		case physOf(p) == 0:
			clear(dst[pos : pos+seg])
		case p&partial != 0:
			if err := v.readPartial(idx, in, dst[pos:pos+seg]); err != nil {
				if bounce != nil {
					s.bounce.Put(bounce)
				}
				return v.fail(opRead, lba, err)
			}
		default:
			seg = v.run(idx, p, off, seg, end)
			if err := s.area.ReadAt(dst[pos:pos+seg], int64(physOf(p)<<s.cshift+in)); err != nil {
				if bounce != nil {
					s.bounce.Put(bounce)
				}
				return v.fail(opRead, lba, fmt.Errorf("%w: %w", ErrIO, err))
			}
		}
		pos, off = pos+seg, off+seg
	}
	if bounce != nil {
		copy(buf, dst)
		s.bounce.Put(bounce)
	}
	v.c.reads.Add(1)
	v.c.readBytes.Add(uint64(len(buf)))
	return nil
}

// run extends a segment of seg bytes at off (in cluster idx, entry p)
// over the following clusters while they are allocated and physically
// contiguous, up to end, and returns its length. Entries are compared
// with their flags: a run of a write never extends from an own cluster
// into an inherited one.
func (v *Volume) run(idx, p, off, seg, end uint64) uint64 {
	s := v.s
	for off+seg < end {
		next := (off + seg) >> s.cshift
		if v.m.get(next) != p+(next-idx) {
			break
		}
		seg += min(s.cmask+1, end-off-seg)
	}
	return seg
}

// Write writes data at lba. Into allocated clusters in place (no
// metadata); a cluster not yet allocated gets one (firstWrite). With FUA,
// the area and then the WAL are synced before it returns.
func (v *Volume) Write(lba uint64, data []byte, flags WriteFlags) error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	n, err := v.check(opWrite, lba, len(data), 0)
	if err != nil || n == 0 {
		return err
	}
	s := v.s
	src, bounce := s.dio(data)
	if bounce != nil {
		copy(src, data)
		defer s.bounce.Put(bounce)
	}
	off := lba << v.shift
	end := off + uint64(len(data))
	for pos := uint64(0); off < end; {
		idx, in := off>>s.cshift, off&s.cmask
		seg := min(s.cmask+1-in, end-off)
		p := v.m.get(idx)
		if !inPlace(p) { // unallocated, a tombstone, a parent's cluster, or a partial one (redirect)
			n, err := v.firstWrite(idx, in, src[pos:])
			if err != nil {
				return v.fail(opWrite, lba, err)
			}
			if n > 0 {
				pos, off = pos+n, off+n
				continue
			}
			p = v.m.get(idx) // another write allocated it meanwhile
		}
		seg = v.run(idx, p, off, seg, end)
		if err := s.area.WriteAt(src[pos:pos+seg], int64(p<<s.cshift+in)); err != nil {
			return v.fail(opWrite, lba, fmt.Errorf("%w: %w", ErrIO, err))
		}
		pos, off = pos+seg, off+seg
	}
	s.seq.Add(1)
	s.markUnsynced()
	if flags&FUA != 0 {
		if err := s.flush(); err != nil {
			return v.fail(opWrite, lba, err)
		}
		v.c.fuaWrites.Add(1)
	}
	v.c.writes.Add(1)
	v.c.writeBytes.Add(uint64(len(data)))
	return nil
}

// maxRun bounds the clusters one first write claims and allocates
// together (their clusters held in an array on the stack): 32, a 2 MiB
// run at the default cluster size, above the default MaxTransferBytes.
const maxRun = 32

// firstWrite writes data, the rest of a request from offset in of
// cluster idx, which was not allocated when the caller looked, into the
// run of clusters from idx that are unallocated (at most maxRun): it
// claims their indices, takes ready clusters (zeros on durable media,
// their 'R' keys durable; as many as come physically contiguous, at
// least one), writes the data into them with one write, then commits
// {map keys, delete 'R' keys} in one unsynced batch and publishes the
// entries. n is the bytes of data written (from its start); 0 if another
// write allocated cluster idx first (the caller then overwrites). See
// docs/store.md, "Write path", for each crash.
//
// allocMu is held only to claim the indices and to publish: first writes
// of different clusters of the volume take their clusters, write their
// data and commit their map keys side by side (their disk writes overlap).
// A first write that finds cluster idx claimed waits for the claim's end,
// then overwrites what the claimant published (or, if the claimant
// failed, claims it itself); a run stops before an index claimed by
// another (no write waits while holding claims, so none can wait on
// another in a cycle): never two clusters for one index, never a write
// lost to a cluster nobody maps.
func (v *Volume) firstWrite(idx, in uint64, data []byte) (n uint64, err error) {
	s := v.s
	want := min((in+uint64(len(data))+s.cmask)>>s.cshift, maxRun)
	if s.serialFirstWrites {
		v.serialMu.Lock() // the old behaviour, a benchmark's baseline: one cluster at a time
		defer v.serialMu.Unlock()
		want = 1
	}
	claimed := v.claim(idx, want)
	if claimed == 0 {
		return 0, nil
	}
	var es [maxRun]uint64
	taken, fresh, err := v.allocate(idx, in, data, es[:claimed])
	v.unclaim(idx, claimed, es[:taken], fresh)
	if err != nil {
		return 0, err
	}
	if fresh > 0 {
		s.al.mu.Lock()
		s.al.mapped += uint64(fresh)
		s.al.mu.Unlock()
	}
	return min(uint64(len(data)), uint64(taken)<<s.cshift-in), nil
}

// allocate is a claimed first write of len(es) clusters from idx: it
// writes data into them and sets es[:taken] to the entries to publish,
// fresh of them new clusters (the others, a partial entry written again).
//
// An index that reads a parent's cluster and that data covers only partly
// is redirected (partial.go): alone, into a partial cluster. An own
// partial entry is written again (writePartial). Clusters covered whole
// take ready clusters (physically contiguous, as many as come) written
// from data, as any first write; their map keys commit at once, unless
// one of them replaces a parent's cluster: then they are deferred
// (deferred.go says why).
func (v *Volume) allocate(idx, in uint64, data []byte, es []uint64) (taken, fresh int, err error) {
	s := v.s
	if s.noSpace.Load() {
		return 0, 0, fmt.Errorf("filesystem of the metadata: %d bytes free, reserve %d: %w", s.freeBytes.Load(), s.reserve.Load(), ErrNoSpace)
	}
	C, k := s.cmask+1, uint64(len(es))
	end := in + uint64(len(data)) // past the data, from cluster idx's start
	e0 := v.m.get(idx)
	one := data[:min(uint64(len(data)), C-in)] // what goes into cluster idx
	if e0&(partial|inherited) == partial {     // claimed: nobody changes it
		if err := v.writePartial(idx, in, one, e0, es[:1]); err != nil {
			return 0, 0, err
		}
		return 1, 0, nil
	}
	if physOf(e0) != 0 && (in != 0 || end < C) {
		if err := v.redirect(idx, in, one, es[:1]); err != nil {
			return 0, 0, err
		}
		return 1, 1, nil
	}
	if k > 1 && end < k*C && physOf(v.m.get(idx+k-1)) != 0 {
		k-- // the last is partly covered: redirected by the caller's next round
	}
	ps := es[:k]
	p, err := s.takeCluster()
	if err != nil {
		return 0, 0, err
	}
	ps[0] = p
	taken = 1 + s.takeFollowing(p, ps[1:])
	ps = ps[:taken]
	n := min(uint64(len(data)), uint64(taken)<<s.cshift-in)
	if err := s.area.WriteAt(data[:n], int64(p<<s.cshift+in)); err != nil {
		s.toLimbo(ps...) // they may hold part of data now: zeroed before reuse
		return 0, 0, fmt.Errorf("%w: %w", ErrIO, err)
	}
	s.hook(hookDataWritten)
	replaces := false
	for i := range ps {
		replaces = replaces || physOf(v.m.get(idx+uint64(i))) != 0
	}
	if replaces {
		s.c.cows.Add(1)
		for i, p := range ps {
			s.deferKey(v.mapID, idx+uint64(i), p, p, false)
		}
	} else if err := v.commitMap(idx, ps); err != nil {
		return 0, 0, err
	}
	return taken, taken, nil
}

// commitMap commits {map keys idx+i -> ps[i], delete their 'R' keys} in
// one unsynced batch (clusters to limbo if it fails).
func (v *Volume) commitMap(idx uint64, ps []uint64) error {
	s := v.s
	b := s.db.NewBatch()
	var key [mapKeyLen]byte
	var val [8]byte
	for i, p := range ps {
		putMapKey(key[:], v.mapID, idx+uint64(i))
		putPhys(val[:], p)
		_ = b.Set(key[:], val[:], nil)
		putReservedKey(key[:], p)
		_ = b.Delete(key[:reservedKeyLen], nil)
	}
	// apply, not commit: a fresh cluster's key is independent of the
	// deferred ones (none names an index that reads no cluster).
	if err := s.apply(b, false); err != nil {
		s.toLimbo(ps...)
		return err
	}
	s.hook(hookMapCommitted)
	s.c.mapCommits.Add(1)
	return nil
}

// claim makes the caller the one first write of clusters [idx,
// idx+claimed), claimed at most want: 0 if cluster idx is allocated (now,
// or by the claimant the caller waited for). It waits only for idx; the
// run ends before the first index allocated or claimed by another. The
// claims are a short list (a few per first write in flight), searched
// under allocMu: no allocation once it has grown.
func (v *Volume) claim(idx, want uint64) (claimed uint64) {
	v.allocMu.Lock()
	defer v.allocMu.Unlock()
	for {
		if inPlace(v.m.get(idx)) {
			return 0
		}
		if !slices.Contains(v.claims, idx) {
			break
		}
		v.claimWaiters++
		v.claimDone.Wait()
		v.claimWaiters--
	}
	if owned(v.m.get(idx)) {
		want = 1 // an own partial entry: written again alone
	}
	for claimed = 1; claimed < want; claimed++ {
		i := idx + claimed
		if owned(v.m.get(i)) || slices.Contains(v.claims, i) {
			break
		}
	}
	for i := range claimed {
		v.claims = append(v.claims, idx+i)
	}
	return claimed
}

// unclaim ends the claims of clusters [idx, idx+claimed), publishing idx+i
// -> ps[i] for the clusters allocated (none if the first write failed) in
// the same critical section, and wakes the first writes waiting for a
// claim. The entries are set under allocMu: clusterMap.set makes pages,
// and two first writes making the same page at once would lose one's
// entry.
func (v *Volume) unclaim(idx, claimed uint64, es []uint64, fresh int) {
	v.allocMu.Lock()
	for i, e := range es {
		v.m.set(idx+uint64(i), e)
	}
	v.allocated.Add(int64(fresh))
	for i := range claimed {
		j := slices.Index(v.claims, idx+i)
		last := len(v.claims) - 1
		v.claims[j] = v.claims[last]
		v.claims = v.claims[:last]
	}
	v.allocMu.Unlock()
	v.claimDone.Broadcast() // cheap without waiters: an atomic load
}

// toLimbo puts taken clusters whose write failed into limbo: they still
// have their 'R' keys, and the next flush zeroes them.
func (s *Store) toLimbo(ps ...uint64) {
	s.al.mu.Lock()
	s.al.limbo = append(s.al.limbo, ps...)
	s.al.mu.Unlock()
}

// WriteZeroes makes n blocks at lba read zeros: whole clusters are freed,
// the blocks of partial ones zeroed in place. With FUA it is durable when
// it returns.
func (v *Volume) WriteZeroes(lba, n uint64, flags WriteFlags) error {
	return v.remove(opWriteZeroes, lba, n, flags&FUA != 0)
}

// Deallocate releases n blocks at lba; they read zeros afterwards. Same
// as WriteZeroes without FUA (the target reports DLFEAT "read zeros").
func (v *Volume) Deallocate(lba, n uint64) error { return v.remove(opDeallocate, lba, n, false) }

// freeChunk bounds the clusters freed by one pebble batch (two keys each).
const freeChunk = 1024

func (v *Volume) remove(o op, lba, n uint64, fua bool) error {
	s := v.s
	// Freeing whole clusters must exclude every request of the volume (a
	// pwrite in flight into a freed cluster could land after it is reused),
	// so it takes the lock exclusively; zeroing inside clusters does not.
	v.mu.RLock()
	shift := v.shift
	v.mu.RUnlock()
	off, end := lba<<shift, (lba+n)<<shift
	if lba+n < lba || end>>shift != lba+n {
		end = ^uint64(0) // overflowing: check refuses it
	}
	first, last := (off+s.cmask)>>s.cshift, end>>s.cshift // whole clusters [first, last)
	whole := first < last
	if whole {
		v.mu.Lock()
		defer v.mu.Unlock()
	} else {
		v.mu.RLock()
		defer v.mu.RUnlock()
	}
	if v.shift != shift { // cannot change while the volume exists; guards a stale read
		return v.fail(o, lba, fmt.Errorf("block size changed: %w", ErrInvalid))
	}
	if _, err := v.check(o, lba, -1, n); err != nil || n == 0 {
		return err
	}
	if !whole {
		if err := v.zeroIn(off, end); err != nil {
			return v.fail(o, lba, err)
		}
	} else {
		if err := v.zeroIn(off, first<<s.cshift); err != nil {
			return v.fail(o, lba, err)
		}
		if err := v.free(first, last); err != nil {
			return v.fail(o, lba, err)
		}
		if err := v.zeroIn(last<<s.cshift, end); err != nil {
			return v.fail(o, lba, err)
		}
	}
	s.seq.Add(1)
	s.markUnsynced()
	if fua {
		if err := s.flush(); err != nil {
			return v.fail(o, lba, err)
		}
	}
	if o == opDeallocate {
		v.c.deallocates.Add(1)
	} else {
		v.c.writeZeroes.Add(1)
	}
	v.c.removedBlocks.Add(n)
	return nil
}

// zeroIn zeroes bytes [off, end) of the volume: in place in its own
// clusters; a parent's cluster is copied on write with zeros over the
// range (its other bytes stay the parent's); the rest reads zeros
// already.
func (v *Volume) zeroIn(off, end uint64) error {
	s := v.s
	for off < end {
		idx, in := off>>s.cshift, off&s.cmask
		seg := min(s.cmask+1-in, end-off)
		switch e := v.m.get(idx); {
		case inPlace(e):
			if err := s.area.Zero(int64(e<<s.cshift+in), int64(seg)); err != nil {
				return fmt.Errorf("%w: %w", ErrIO, err)
			}
		case physOf(e) != 0:
			n, err := v.firstWrite(idx, in, s.zeroBuf[:seg])
			if err != nil {
				return err
			}
			if n == 0 {
				continue // another write made it own meanwhile: zero it in place
			}
		}
		off += seg
	}
	return nil
}

// free releases the clusters with index in [first, last): per chunk, one
// unsynced batch {delete map key, set 'R'}, then the entries are cleared
// and the clusters go to limbo, where the next flush zeroes them and
// syncs before they can be reused. In an object with a parent
// (docs/snapshots.md §1.3) an index must go on reading zeros, not the
// parent's cluster: its key becomes a tombstone (0) where the parent has
// an entry (a cluster or a tombstone, own or inherited), and a parent's
// cluster read there gets a tombstone too (no cluster freed: it is the
// parent's). A parent's tombstone would read zeros through a deleted key
// too, but the table's 0 must keep meaning "nothing here nor in any
// ancestor": Changes and SpaceOf tell an index the object hides from one
// it reads through by it. Requires v.mu exclusively.
func (v *Volume) free(first, last uint64) error {
	s := v.s
	type ent struct{ i, p uint64 } // p: own cluster freed, 0 if none
	var es []ent
	var tomb []bool // per es: the key becomes a tombstone
	v.m.each(first, last, func(i, e uint64) {
		switch {
		case owned(e):
			es = append(es, ent{i, physOf(e)})
			tomb = append(tomb, v.parent != nil && v.parent.m.get(i) != 0)
		case e&inherited != 0 && physOf(e) != 0:
			es = append(es, ent{i, 0})
			tomb = append(tomb, true)
		}
	})
	var key [mapKeyLen]byte
	var zero [8]byte
	for len(es) > 0 {
		k := min(len(es), freeChunk)
		b := s.db.NewBatch()
		var ps []uint64
		for j, e := range es[:k] {
			putMapKey(key[:], v.mapID, e.i)
			if tomb[j] {
				_ = b.Set(key[:], zero[:], nil)
			} else {
				_ = b.Delete(key[:], nil)
			}
			if e.p != 0 {
				ps = append(ps, e.p)
				putReservedKey(key[:], e.p)
				_ = b.Set(key[:reservedKeyLen], nil, nil)
			}
		}
		if err := s.commit(b, false); err != nil {
			return err
		}
		for j, e := range es[:k] {
			if tomb[j] {
				v.m.set(e.i, tombstone)
			} else {
				v.m.set(e.i, 0)
			}
		}
		v.allocated.Add(-int64(len(ps)))
		s.al.mu.Lock()
		s.al.limbo = append(s.al.limbo, ps...)
		s.al.mapped -= uint64(len(ps))
		s.al.mu.Unlock()
		s.c.frees.Add(1)
		s.hook(hookFreed)
		es, tomb = es[k:], tomb[k:]
	}
	return nil
}

// Flush makes every write acknowledged before it durable (the whole
// store: the area and the WAL are shared).
func (v *Volume) Flush() error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.gone != nil {
		return v.fail(opFlush, 0, v.gone)
	}
	if err := v.s.flush(); err != nil {
		return v.fail(opFlush, 0, err)
	}
	v.c.flushes.Add(1)
	return nil
}

// mappedBatch bounds the clusters Mapped looks at under the volume's lock
// at once, so a long walk never keeps a Resize or a Deallocate waiting
// for long.
const mappedBatch = 1 << 16

// Mapped calls fn, in LBA order, for each run of allocated clusters whose
// blocks meet [from, to) (its own and those it reads through its parent:
// everything it reads but holes and tombstones; MappedOwn gives its own): lba and blocks give the run clipped to [from,
// to) and to the volume's size (a long run may come in pieces: at most
// 65536 clusters are looked at per lock). Unallocated clusters (holes, which read
// as zeros) are skipped. It holds no lock while fn runs, so fn may read
// or write the volume; a cluster allocated or freed during the walk may
// or may not be reported (a replica rebuild re-checks each region under
// its own ordering, repl/rebuild.go). An error from fn stops the walk and
// is returned as is.
func (v *Volume) Mapped(from, to uint64, fn func(lba, blocks uint64) error) error {
	v.mu.RLock()
	if v.gone != nil {
		v.mu.RUnlock()
		return fmt.Errorf("volume %d: %w", v.id, v.gone)
	}
	cb := uint(v.s.cshift - v.shift) // log2 of blocks per cluster
	to = min(to, v.info.Blocks())
	v.mu.RUnlock()
	for from < to {
		v.mu.RLock()
		if v.gone != nil {
			v.mu.RUnlock()
			return fmt.Errorf("volume %d: %w", v.id, v.gone)
		}
		to = min(to, v.info.Blocks()) // a shrink meanwhile
		first, last := from>>cb, (to+(1<<cb)-1)>>cb
		limit := min(last, first+mappedBatch)
		start, end, ok := v.m.nextRun(first, limit)
		v.mu.RUnlock()
		if !ok {
			from = limit << cb
			continue
		}
		lba, stop := max(from, start<<cb), min(to, end<<cb)
		if lba < stop {
			if err := fn(lba, stop-lba); err != nil {
				return err
			}
		}
		from = stop
	}
	return nil
}
