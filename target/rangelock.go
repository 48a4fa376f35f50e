package target

import (
	"sync"
	"sync/atomic"

	"github.com/blk-project/blk/nvme"
)

// The namespace's striped range lock (docs/reservations.md §2.3): what
// makes a fused Compare and Write atomic against every other write to
// its blocks. Plain writes (Write, Write Zeroes, deallocations) hold the
// stripes of their range shared; a pair holds its stripes exclusive.
// It sits above every backend, so it covers the store, a replicated
// volume's backend and any other alike. Reads take nothing: a read
// overlapping a pair's Write may see some blocks old and some new, each
// block whole (Identify ACWU 0).
//
// A region of 64 KiB maps to stripe region % numStripes. A stripe is one
// cache line: a word (below) and a mutex-guarded FIFO of parked requests,
// used only when a pair is involved. A plain write costs one atomic add
// per stripe to take and one to give back (one stripe for any write
// within a region, at most 3 for 128 KiB); distinct regions never wait.
//
// Both sides take their stripes in increasing index order, so no wait
// cycle can form: a pair parks holding lower stripes only, and a plain
// write that finds a pair gives back everything it took before it parks.
// A pair announces itself (a waiter in the word) before it waits, which
// stops new plain writes from starving it.
//
// Parking never blocks a goroutine: the parked request is resumed by the
// releaser through the path an asynchronous backend's completion takes
// (IO.Done: the poll group's completion stack, or ioDone on the
// releasing goroutine), in request state reqLockWait, and ioDone
// resubmits it (lockResume).

// The stripe word: the plain writes holding it in the low 32 bits, the
// pairs waiting for it in bits 32–47, bit 62 when a pair holds it.
const (
	lockOneShared  uint64 = 1
	lockSharedMask uint64 = 1<<32 - 1
	lockOneWaiter  uint64 = 1 << 32
	lockWaiterMask uint64 = (1<<16 - 1) << 32
	lockExclusive  uint64 = 1 << 62
)

// numStripes and lockRegionShift: 256 stripes of 64 KiB regions, 16 KiB
// of stripes per namespace. 32 writes at QD32 on random blocks land on
// distinct stripes but for a few chance collisions, which cost an add,
// not a wait.
const (
	numStripes      = 256
	lockRegionShift = 16
)

type stripe struct {
	w          atomic.Uint64
	mu         sync.Mutex
	head, tail *Request // parked requests, oldest first (Request.lockNext)
	_          [64 - 32]byte
}

// rangeLocks is a namespace's striped range lock.
type rangeLocks struct {
	stripes [numStripes]stripe
}

// lockHold is the range a request locks: n stripes from first (in
// stripe index order, wrapping), held of them taken so far (a pair takes
// them one by one, parking in between).
type lockHold struct {
	first uint8
	excl  bool
	n     uint16 // 0: no range
	held  uint16
}

// set makes h the range of blocks [slba, slba+blocks) of a namespace of
// block size 1<<shift; blocks ≥ 1, and the range was checked against the
// capacity.
func (h *lockHold) set(slba, blocks uint64, shift uint8, excl bool) {
	r0 := slba << shift >> lockRegionShift
	r1 := (slba + blocks - 1) << shift >> lockRegionShift
	n := r1 - r0 + 1
	if n > numStripes || r1 < r0 {
		n = numStripes
	}
	*h = lockHold{first: uint8(r0 % numStripes), excl: excl, n: uint16(n)}
}

// stripeAt is the k-th stripe of h in increasing index order.
func (h *lockHold) stripeAt(k int) int {
	if wrap := int(h.first) + int(h.n) - numStripes; wrap > 0 {
		if k < wrap {
			return k
		}
		return int(h.first) + k - wrap
	}
	return int(h.first) + k
}

// lockShared takes r's range shared for a plain write. It reports false
// when r parked (a pair holds or waits for a stripe): r then belongs to
// the lock until it is resumed through IO.Done, and the caller must not
// touch it.
func (l *rangeLocks) lockShared(r *Request) bool {
	h := &r.hold
	for k := 0; k < int(h.n); k++ {
		s := &l.stripes[h.stripeAt(k)]
		if v := s.w.Add(lockOneShared); v&(lockExclusive|lockWaiterMask) == 0 {
			h.held++
			continue
		}
		s.unshare()
		l.release(h) // give back what was taken: never park holding stripes
		if s.park(r, true) {
			return false
		}
		k = -1 // the pair went meanwhile: start over
	}
	return true
}

// lockExcl takes the rest of r's range exclusive for a pair, from
// h.held on. It reports false when r parked waiting for a stripe (it
// holds the ones before): see lockShared.
func (l *rangeLocks) lockExcl(r *Request) bool {
	h := &r.hold
	for int(h.held) < int(h.n) {
		if !l.stripes[h.stripeAt(int(h.held))].takeExcl(r) {
			return false
		}
		h.held++
	}
	return true
}

// release gives back every stripe h holds, waking whoever waited for
// them, and clears h. It never blocks (a stripe's mutex guards only its
// list).
func (l *rangeLocks) release(h *lockHold) {
	for k := 0; k < int(h.held); k++ {
		s := &l.stripes[h.stripeAt(k)]
		if h.excl {
			s.unexcl()
		} else {
			s.unshare()
		}
	}
	h.held = 0
}

// unshare gives back one plain write's hold; the last one out wakes a
// waiting pair.
func (s *stripe) unshare() {
	v := s.w.Add(^uint64(0))
	if v&lockSharedMask == 0 && v&lockWaiterMask != 0 {
		s.dispatch()
	}
}

// unexcl gives back a pair's hold.
func (s *stripe) unexcl() {
	s.mu.Lock()
	s.w.Add(^(lockExclusive - 1)) // minus lockExclusive
	wake := s.grant()
	s.mu.Unlock()
	resumeParked(wake)
}

// dispatch hands the stripe to whoever may have it now.
func (s *stripe) dispatch() {
	s.mu.Lock()
	wake := s.grant()
	s.mu.Unlock()
	resumeParked(wake)
}

// takeExcl takes the stripe for a pair, or parks r on it.
func (s *stripe) takeExcl(r *Request) bool {
	s.mu.Lock()
	v := s.w.Add(lockOneWaiter) // from here on new plain writes park
	for v&(lockExclusive|lockSharedMask) == 0 {
		if s.w.CompareAndSwap(v, v-lockOneWaiter+lockExclusive) {
			s.mu.Unlock()
			return true
		}
		v = s.w.Load()
	}
	// A pair holds it, or plain writes do: the last of them out
	// dispatches, under the mutex, so it finds r on the list.
	s.append(r, false)
	s.mu.Unlock()
	return false
}

// park puts a plain write on the list unless the stripe is free of
// pairs by now (false: try again).
func (s *stripe) park(r *Request, shared bool) bool {
	s.mu.Lock()
	if s.w.Load()&(lockExclusive|lockWaiterMask) == 0 {
		s.mu.Unlock()
		return false
	}
	s.append(r, shared)
	s.mu.Unlock()
	return true
}

// append parks r (mutex held): from here the releaser may resume it.
func (s *stripe) append(r *Request, shared bool) {
	r.q.t.enter(r, reqLockWait)
	r.q.t.stats.lockWaits.Add(1)
	r.io.r = r
	r.io.phase.Store(ioAtBackend) // resumed with IO.Done, as a backend completes
	r.hold.excl = !shared
	r.lockNext = nil
	if s.tail == nil {
		s.head = r
	} else {
		s.tail.lockNext = r
	}
	s.tail = r
}

// grant (mutex held) takes off the list what may run now: the oldest
// parked pair, given the stripe, when no one holds it; else, when no
// pair waits, every parked plain write. It returns them linked by
// lockNext.
func (s *stripe) grant() *Request {
	for {
		v := s.w.Load()
		if v&lockExclusive != 0 {
			return nil
		}
		if v&lockWaiterMask != 0 {
			if v&lockSharedMask != 0 {
				return nil // the last plain write out dispatches again
			}
			p := s.firstPair()
			if p == nil {
				return nil // a pair between its Add and its CAS: it sees the stripe free
			}
			if !s.w.CompareAndSwap(v, v-lockOneWaiter+lockExclusive) {
				continue
			}
			s.unlink(p)
			p.hold.held++ // resumed holding this stripe
			return p
		}
		head := s.head
		s.head, s.tail = nil, nil
		return head
	}
}

// firstPair is the oldest parked pair.
func (s *stripe) firstPair() *Request {
	for p := s.head; p != nil; p = p.lockNext {
		if p.hold.excl {
			return p
		}
	}
	return nil
}

// unlink takes p off the list and leaves it alone.
func (s *stripe) unlink(p *Request) {
	var prev *Request
	for x := s.head; x != nil; prev, x = x, x.lockNext {
		if x != p {
			continue
		}
		if prev == nil {
			s.head = x.lockNext
		} else {
			prev.lockNext = x.lockNext
		}
		if s.tail == x {
			s.tail = prev
		}
		x.lockNext = nil
		return
	}
}

// resumeParked hands each request of the list back to its queue, as an
// asynchronous backend's completion would.
func resumeParked(r *Request) {
	for r != nil {
		next := r.lockNext
		r.lockNext = nil
		r.io.Done(nil)
		r = next
	}
}

// lockWrite takes the range [slba, slba+blocks) of a plain write shared
// (a Write, a Write Zeroes, one deallocated range). false: r parked, and
// lockResume calls locked when it may go on.
func (q *Queue) lockWrite(ns *namespace, r *Request, slba, blocks uint64) bool {
	r.ns = ns
	r.hold.set(slba, blocks, ns.shift, false)
	return ns.locks.lockShared(r)
}

// locked goes on with a plain write the range lock had parked.
func (q *Queue) locked(ns *namespace, r *Request) {
	switch nvme.IOOpcode(r.Cmd.Opcode) {
	case nvme.IOWrite:
		q.writeLocked(ns, r, false)
	case nvme.IOWriteZeroes:
		q.writeZeroesLocked(ns, r)
	case nvme.IODatasetManagement:
		if !q.dsmNext(ns, r) {
			q.finish(ns, r, nvme.StatusInternalError.WithDNR()) // not reached: it parked on a range
		}
	default:
		q.finish(ns, r, nvme.StatusInternalError.WithDNR()) // not reached: only those lock
	}
}
