package initiator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/blk-project/blk/nvme"
)

// Fused Compare and Write (docs/reservations.md §2.5): a Compare with
// FUSE 01b and a Write with FUSE 10b of the same blocks, adjacent in one
// I/O queue. The controller writes only if the blocks equal the compare
// data, atomically against every other write to them.

// cawPair is one Compare and Write in flight: its two halves' outcomes,
// gathered into the caller's one callback. Pooled: none is allocated in
// the steady state.
type cawPair struct {
	half    [2]cawHalf
	pending atomic.Int32
	cb      Callback
}

type cawHalf struct {
	p   *cawPair
	err error
}

var cawPool = sync.Pool{New: func() any {
	p := &cawPair{}
	p.half[0].p, p.half[1].p = p, p
	return p
}}

// IODone gathers one half; the last one in calls the pair's callback with
// the first's error if it failed (Compare Failure: the data differed),
// else the second's.
func (h *cawHalf) IODone(err error) {
	h.err = err
	p := h.p
	if p.pending.Add(-1) != 0 {
		return
	}
	err = p.half[0].err
	if err == nil {
		err = p.half[1].err
	}
	cb := p.cb
	p.cb, p.half[0].err, p.half[1].err = nil, nil, nil
	cawPool.Put(p)
	cb.IODone(err)
}

// IsCompareFailure reports whether err is a Compare and Write's (or a
// Compare's) Compare Failure: the blocks did not hold the compare data,
// and nothing was written.
func IsCompareFailure(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Status.Code() == nvme.StatusCompareFailure
}

// CompareAndWriteAsync compares the blocks at lba with cmp and, only if
// they are equal, writes data there, atomically against every other
// write to those blocks (a fused Compare and Write; the controller must
// say it supports one: Identify FUSES bit 0, else ErrNotSupported). cmp
// and data are as long as each other, a multiple of the block size, at
// most MaxTransfer bytes; both are copied before it returns. cb runs once:
// nil when the data was written, an error IsCompareFailure recognizes
// when the blocks differed, another error otherwise. With no two free
// slots on one I/O queue it returns ErrQueueFull.
func (ns *Namespace) CompareAndWriteAsync(lba uint64, cmp, data []byte, flags IOFlags, cb Callback) error {
	blocks, err := ns.cawBlocks(lba, cmp, data)
	if err != nil {
		return err
	}
	a, err := ns.c.liveAssoc()
	if err != nil {
		return err
	}
	if err := cawSupported(a, len(data)); err != nil {
		return err
	}
	q, s1, err := ns.c.acquireIO(a, false)
	if err != nil {
		return err
	}
	s2 := q.tryAcquire()
	if s2 == nil {
		q.abandon(s1)
		ns.c.st.queueFull.Add(1)
		return ErrQueueFull
	}
	return ns.submitCAW(q, s1, s2, lba, blocks, cmp, data, flags, cb)
}

// cawBlocks checks a pair's buffers (as long as each other, whole blocks
// from lba within the namespace) and returns how many blocks they are.
func (ns *Namespace) cawBlocks(lba uint64, cmp, data []byte) (uint32, error) {
	if len(cmp) != len(data) {
		return 0, fmt.Errorf("%w: compare %d bytes, write %d", ErrNotAligned, len(cmp), len(data))
	}
	return ns.info.Load().blocksFor(lba, len(data))
}

// cawSupported checks that association a carries a pair of n bytes
// each: the controller supports Compare and Write, n is at most its
// MaxTransfer.
func cawSupported(a *association, n int) error {
	if a.id.FUSES&1 == 0 {
		return fmt.Errorf("%w: Compare and Write (FUSES %#x)", ErrNotSupported, a.id.FUSES)
	}
	if n > a.maxXfer {
		return fmt.Errorf("%w: %d bytes, MaxTransfer %d", ErrTooLarge, n, a.maxXfer)
	}
	return nil
}

// submitCAW fills the pair into slots s1 and s2 of q and posts them.
func (ns *Namespace) submitCAW(q *queue, s1, s2 *slot, lba uint64, blocks uint32, cmp, data []byte, flags IOFlags, cb Callback) error {
	p := cawPool.Get().(*cawPair)
	p.cb = cb
	p.pending.Store(2)
	rwCmd(&s1.cmd, nvme.IOCompare, ns.id, lba, blocks, false)
	s1.cmd.Flags |= nvme.FlagFuseFirst
	copy(s1.data, cmp)
	s1.cb = &p.half[0]
	rwCmd(&s2.cmd, nvme.IOWrite, ns.id, lba, blocks, flags&FUA != 0)
	s2.cmd.Flags |= nvme.FlagFuseSecond
	copy(s2.data, data)
	s2.cb = &p.half[1]
	if err := q.submitPair(s1, s2, len(data)); err != nil {
		p.cb = nil
		cawPool.Put(p)
		return err
	}
	return nil
}

// submitPair posts two prepared slots (their commands filled, each
// moving n bytes to the controller) back to back. It returns nil once
// both are published (each callback then runs exactly once, a failure
// meanwhile included), or an error before either is.
func (q *queue) submitPair(s1, s2 *slot, n int) error {
	for _, s := range []*slot{s1, s2} {
		if err := q.prepare(s, nvme.DirHostToCtrl, n, q.timeout); err != nil {
			q.abandon(s1)
			q.abandon(s2)
			return err
		}
	}
	st1, st2 := inflightState(s1.gen), inflightState(s2.gen)
	s1.state.Store(st1)
	s2.state.Store(st2)
	var err error
	if q.dead.Load() {
		err = q.a.lostErr()
	} else if err = q.w.sendPair(s1, s2); err != nil {
		q.a.fail(fmt.Errorf("post fused pair on queue %d: %w", q.qid, err))
		err = q.a.lostErr()
	}
	if err != nil {
		// Whatever a failure did not complete already is completed here,
		// through its callback: each half exactly once.
		q.failSlot(s1, st1, err)
		q.failSlot(s2, st2, err)
	}
	return nil
}

// failSlot completes slot s, in flight in state st, with err unless
// someone else completed it.
func (q *queue) failSlot(s *slot, st uint32, err error) {
	if s.state.CompareAndSwap(st, slotDone) {
		cb := s.cb
		q.release(s)
		cb.IODone(err)
	}
}

// CompareAndWrite is CompareAndWriteAsync, waiting for a free pair of
// slots and for the outcome; ctx bounds the wait for slots only (a pair
// posted is always answered or failed with the association). It returns
// nil when the data was written and an error IsCompareFailure recognizes
// when the blocks differed.
func (ns *Namespace) CompareAndWrite(ctx context.Context, lba uint64, cmp, data []byte, flags IOFlags) error {
	blocks, err := ns.cawBlocks(lba, cmp, data)
	if err != nil {
		return err
	}
	a, err := ns.c.waitLive(ctx)
	if err != nil {
		return err
	}
	if err := cawSupported(a, len(data)); err != nil {
		return err
	}
	if len(a.io) == 0 {
		return fmt.Errorf("%w: no I/O queues", ErrNotSupported)
	}
	q := a.io[ns.c.rr.Add(1)%uint32(len(a.io))]
	s1, s2, err := q.acquirePair(ctx)
	if err != nil {
		return err
	}
	done := make(DoneChan, 1)
	if err := ns.submitCAW(q, s1, s2, lba, blocks, cmp, data, flags, done); err != nil {
		return err
	}
	return <-done
}

// acquirePair waits for two slots of q. One waiter at a time holds one
// while it waits for the other (pairMu): waiters holding a slot each
// could otherwise take every slot and wait for ever.
func (q *queue) acquirePair(ctx context.Context) (*slot, *slot, error) {
	q.pairMu.Lock()
	defer q.pairMu.Unlock()
	s1, err := q.acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	s2, err := q.acquire(ctx)
	if err != nil {
		q.abandon(s1)
		return nil, nil, err
	}
	return s1, s2, nil
}
