package store

import "fmt"

// The direct path: reads and overwrites handed to an asynchronous engine
// (store/aio on a poll group) instead of a blocking pread/pwrite. The
// caller asks BeginDirect how a request resolves; for DirectIO it submits
// one I/O per segment (a run of physically contiguous clusters) and, when
// the engine has completed them all, calls EndDirect exactly once.
// Between the two the volume is pinned as a synchronous Read or Write
// pins it (its lock held shared), so nothing frees, reuses or zeroes a
// cluster under the I/O: Deallocate, WriteZeroes of whole clusters,
// Resize, Delete and Close wait for EndDirect.
//
// BeginDirect never blocks: it only tries the lock (a request that finds
// a writer waiting for it, a Deallocate say, is DirectSlow), so a poll
// group that calls it can never wait for an EndDirect that only it will
// call. DirectSlow requests go through Read or Write on a goroutine that
// may block (a first write allocates a cluster and commits its map key).

// DirectKind says how BeginDirect resolved a request.
type DirectKind uint8

const (
	// DirectSlow: serve it with Read or Write, on a goroutine that may
	// block. Nothing is pinned.
	DirectSlow DirectKind = iota
	// DirectDone: already served (a read of unallocated clusters: buf
	// zeroed; an empty request). Nothing is pinned.
	DirectDone
	// DirectIO: submit the returned segments' I/Os, then call EndDirect
	// once they all completed. The volume is pinned until then.
	DirectIO
)

// Segment is one I/O of a DirectIO request: Len bytes of the caller's
// buffer from Pos, at area offset Off. A request makes one segment per
// run of physically contiguous clusters.
type Segment struct {
	Off      int64
	Pos, Len int
}

// DirectAlign is the alignment the direct path needs of a buffer's
// address, the area offset and the length: store/aio's (4096). Anything
// else is DirectSlow.
const DirectAlign = 4096

// DirectFD returns the data area's file descriptor and path for an
// asynchronous engine; ok is false when the area is not a file the store
// opened (a test's memory area): use Read and Write then.
func (s *Store) DirectFD() (fd int, path string, ok bool) {
	a, isFile := s.area.(*fileArea)
	if !isFile {
		return -1, "", false
	}
	return a.fd, a.path, true
}

// BeginDirect resolves a read (write false) into buf, or a write of buf,
// at lba, into at most len(segs) segments written to segs (n of them).
// A read's unallocated clusters are zeroed in buf here and make no
// segment. A write must find every cluster allocated and the volume's
// own (a first write, and a copy on write of a parent's cluster, are
// DirectSlow). More segments than segs holds is DirectSlow. err is the
// request's error (range, alignment of the block size, read-only, a
// closed or deleted volume), counted as Read and Write count theirs; then
// nothing is pinned.
func (v *Volume) BeginDirect(write bool, lba uint64, buf []byte, segs []Segment) (n int, k DirectKind, err error) {
	if len(buf)&(DirectAlign-1) != 0 || !isAligned(buf, DirectAlign) {
		return 0, DirectSlow, nil
	}
	if !v.mu.TryRLock() {
		return 0, DirectSlow, nil
	}
	o := opRead
	if write {
		o = opWrite
	}
	blocks, err := v.check(o, lba, len(buf), 0)
	if err != nil || blocks == 0 {
		v.mu.RUnlock()
		return 0, DirectDone, err
	}
	s := v.s
	off := lba << v.shift
	end := off + uint64(len(buf))
	for pos := uint64(0); off < end; {
		idx, in := off>>s.cshift, off&s.cmask
		seg := min(s.cmask+1-in, end-off)
		p := v.m.get(idx)
		switch {
		case write && !inPlace(p) && pos == 0 && off+seg == end && v.redirectable(p, in, seg):
			// A write of whole sub-blocks into one cluster the volume
			// reads through its parent, or into its own partial one: a
			// redirect at the disk like any write (partial.go).
			if !v.beginRedirect(idx, in, seg, p, segs) {
				v.mu.RUnlock()
				return 0, DirectSlow, nil
			}
			return 1, DirectIO, nil
		case write && !inPlace(p), p&partial != 0:
			// A first write, a redirect of a parent's cluster, or a
			// partial cluster (docs/snapshots.md §1.3), read or written:
			// on a goroutine that may block, never on a poll group.
			v.mu.RUnlock()
			return 0, DirectSlow, nil
		case physOf(p) == 0: // a read of a hole or a tombstone
		default:
			seg = v.run(idx, p, off, seg, end)
			phys := physOf(p)<<s.cshift + in
			if n == len(segs) || phys&(DirectAlign-1) != 0 || seg&(DirectAlign-1) != 0 {
				v.mu.RUnlock()
				return 0, DirectSlow, nil
			}
			segs[n] = Segment{Off: int64(phys), Pos: int(pos), Len: int(seg)}
			n++
		}
		pos, off = pos+seg, off+seg
	}
	if n == 0 {
		// All unallocated: zeros, no disk. (A read with some segments
		// zeroes its holes below, once it is sure to go direct.)
		clear(buf)
		v.c.reads.Add(1)
		v.c.readBytes.Add(uint64(len(buf)))
		v.mu.RUnlock()
		return 0, DirectDone, nil
	}
	if !write {
		// Zero the holes between the segments.
		pos := 0
		for _, sg := range segs[:n] {
			clear(buf[pos:sg.Pos])
			pos = sg.Pos + sg.Len
		}
		clear(buf[pos:])
	}
	return n, DirectIO, nil
}

// EndDirect ends a DirectIO request of n bytes at lba whose segments the
// engine completed, ioErr the first error among them: it unpins the
// volume and counts the request; a write is then covered by the next
// Flush (and the background syncer).
// It returns the request's error: nil, or ioErr as an ErrIO.
func (v *Volume) EndDirect(write bool, lba uint64, n int, ioErr error) error {
	defer v.mu.RUnlock()
	if write && v.ndirect.Load() != 0 {
		v.endRedirect(lba, ioErr)
	}
	if ioErr != nil {
		o := opRead
		if write {
			o = opWrite
		}
		return v.fail(o, lba, fmt.Errorf("%w: %w", ErrIO, ioErr))
	}
	if write {
		// Counted after the write completed, as Write counts it: a Flush
		// that reads seq covers it from then on.
		v.s.seq.Add(1)
		v.s.markUnsynced()
		v.c.writes.Add(1)
		v.c.writeBytes.Add(uint64(n))
		return nil
	}
	v.c.reads.Add(1)
	v.c.readBytes.Add(uint64(n))
	return nil
}
