package initiator

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/nvme"
)

// Callback receives the outcome of one asynchronous command. IODone is
// called exactly once for every submission that returned nil, with nil on
// success, a *StatusError for an error status, or an error matching
// ErrConnectionLost (or ErrClosed) when the association failed first. It
// runs on a transport notification goroutine (RDMA), a queue's receiver
// or sender goroutine (TCP), or the goroutine failing the association,
// and must not block; it may submit new commands. A
// pointer to a caller's preallocated struct, or a DoneChan, implements it
// without allocating.
type Callback interface {
	IODone(err error)
}

// DoneChan is a Callback that sends the outcome on the channel. It must
// be buffered for every command it is given at once (IODone must not
// block).
type DoneChan chan error

// IODone sends err on the channel.
func (d DoneChan) IODone(err error) { d <- err }

// Command identifiers, like Linux (nvme_cid): the low 12 bits are the
// slot (tag), the high 4 a generation counter bumped at every reuse of the
// slot and checked on completion, so that a late or duplicated completion
// of an earlier command on the same slot is caught rather than taken for
// the current one.
const (
	cidTagBits = 12
	cidTagMask = 1<<cidTagBits - 1
	cidGenMask = 0xF
)

func makeCID(tag uint16, gen uint8) uint16 {
	return uint16(gen&cidGenMask)<<cidTagBits | tag&cidTagMask
}

func splitCID(cid uint16) (tag uint16, gen uint8) { return cid & cidTagMask, uint8(cid >> cidTagBits) }

// Slot states. The low byte is the state; in slotInflight two flags record
// the two events a command waits for. The submitter moves a slot from
// slotFilling to slotInflight; after that only compare-and-swaps change it:
// the queue's core goroutine sets the flags and takes it to slotDone when
// both are set; a failure takes any in-flight slot to slotDone. Whoever
// takes it to slotDone completes it, exactly once.
const (
	slotFree     uint32 = iota // on the free list
	slotFilling                // owned by a submitter
	slotInflight               // posted: waiting for the send completion and the response
	slotDone                   // being completed and returned

	slotStateMask uint32 = 0xFF
	flagSent      uint32 = 1 << 8 // the capsule's SEND completed
	flagResp      uint32 = 1 << 9 // the response capsule arrived
	// The generation of the command in flight is kept in the state word
	// too (bits 15:12), so that the completion path checks it from the
	// same atomic load that tells it the slot is in flight.
	stateGenShift = 12
)

func inflightState(gen uint8) uint32 { return slotInflight | uint32(gen)<<stateGenShift }

// slot is one request slot of a queue, indexed by the CID's tag. Its
// capsule (SQE) and data buffer are fixed parts of the queue's memory
// (registered for RDMA), so a command allocates and registers nothing.
type slot struct {
	q     *queue
	tag   uint16
	gen   uint8
	state atomic.Uint32
	// deadline is when the command times out (monotonic ns, see
	// monoNow), 0 for none (AER); what packs opcode<<16 | CID for the
	// timeout message. Atomics: the monitor reads them while slots turn
	// over.
	deadline atomic.Int64
	what     atomic.Uint32

	cmd  nvme.Command
	cqe  nvme.Completion
	sqe  *[nvme.SQESize]byte // in the wire's memory: where the SQE is encoded
	data []byte              // the queue's bufSize bytes of data buffer

	// What the command in flight moves, set by submit: direction, data
	// bytes, and how many of them travel inside the capsule.
	dir    nvme.Direction
	n      int
	inline int

	rdma rdmaSlot // the NVMe/RDMA wire's part
	tcp  tcpSlot  // the NVMe/TCP wire's part

	// Where the outcome goes.
	cb  Callback
	res *nvme.Completion // if set, receives the CQE before cb runs
	dst []byte           // read: data is copied here on success
}

// queue is one NVMe queue pair on one wire (an RDMA QP or a TCP
// connection): the admin queue (QID 0) or an I/O queue. It belongs to one
// association and dies with it; a reconnect builds new queues.
type queue struct {
	a         *association
	qid       uint16
	depth     int
	bufSize   int // bytes of each slot's data buffer
	inCapsule int // most in-capsule data bytes (0: all data keyed)
	timeout   time.Duration

	w wire

	slots []slot
	free  chan uint16 // free tags; capacity depth, so pushing never blocks
	dead  atomic.Bool
	// pairMu lets one waiter at a time hold one slot while it waits for
	// a second (CompareAndWrite), so that waiters never hold every slot.
	pairMu sync.Mutex
}

// monoNow is a monotonic clock in nanoseconds since the package started.
func monoNow() int64 { return int64(time.Since(epoch)) }

var epoch = time.Now()

// initSlots builds the queue's slots and free list; the wire then gives
// each its SQE and data buffer.
func (q *queue) initSlots() {
	q.slots = make([]slot, q.depth)
	q.free = make(chan uint16, q.depth)
	for i := range q.slots {
		s := &q.slots[i]
		s.q = q
		s.tag = uint16(i)
		q.free <- uint16(i)
	}
}

// tryAcquire takes a free slot without waiting, or returns nil.
func (q *queue) tryAcquire() *slot {
	select {
	case tag := <-q.free:
		return q.take(tag)
	default:
		return nil
	}
}

// acquire waits for a free slot until the association fails or ctx ends.
func (q *queue) acquire(ctx context.Context) (*slot, error) {
	select {
	case tag := <-q.free:
		return q.taken(q.take(tag))
	default:
	}
	select {
	case tag := <-q.free:
		return q.taken(q.take(tag))
	case <-q.a.done:
		return nil, q.a.lostErr()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// take takes slot tag off the free list, or returns nil when the queue
// is dead: the slot is then never filled. Taking it (the CAS) before
// looking at dead pairs with teardown, which marks the queue dead before
// it waits for every slot to be free (releaseMemory): either this sees
// dead, or teardown sees the slot held and waits for its release.
// taken is acquire's answer for a slot take returned.
func (q *queue) taken(s *slot) (*slot, error) {
	if s == nil {
		return nil, q.a.lostErr()
	}
	return s, nil
}

func (q *queue) take(tag uint16) *slot {
	s := &q.slots[tag]
	if !s.state.CompareAndSwap(slotFree, slotFilling) {
		panic(fmt.Sprintf("initiator: queue %d slot %d on the free list in state %#x", q.qid, tag, s.state.Load()))
	}
	if q.dead.Load() {
		s.state.Store(slotFree)
		return nil
	}
	return s
}

// idle says whether no slot is held: none is being filled, in flight, or
// being finished. Only meaningful once the queue is dead (no new slot is
// taken then).
func (q *queue) idle() bool {
	for i := range q.slots {
		if q.slots[i].state.Load() != slotFree {
			return false
		}
	}
	return true
}

// release returns a completed slot to the free list.
func (q *queue) release(s *slot) {
	s.cb, s.res, s.dst = nil, nil, nil
	s.gen = (s.gen + 1) & cidGenMask // the next command on the slot gets a new CID
	s.deadline.Store(0)
	s.state.Store(slotFree)
	if q.dead.Load() {
		// A dead queue's slots are never reused: a submitter that raced
		// with the failure may still be reading this one's SGEs.
		return
	}
	q.free <- s.tag
}

// abandon returns a slot that was never submitted.
func (q *queue) abandon(s *slot) {
	s.state.Store(slotDone)
	q.release(s)
}

// submit sends the command in s.cmd (the caller filled it, except CID and
// DPTR, and set s.cb, s.res, s.dst) with n bytes of data in direction dir.
// Write data must already be in s.data[:n]. The wire decides where the
// data goes (wire.place: in the capsule, keyed, or in TCP data PDUs) and
// posts the capsule.
//
// It returns nil if the command was posted (Callback then runs exactly
// once), or an error, and then the callback never runs.
func (q *queue) submit(s *slot, dir nvme.Direction, n int, timeout time.Duration) error {
	if err := q.prepare(s, dir, n, timeout); err != nil {
		q.abandon(s)
		return err
	}
	// Publish, then look at the queue: a failure that marked it dead
	// before this store is seen below; one after it finds the slot in
	// flight and completes it.
	st := inflightState(s.gen)
	s.state.Store(st)
	if q.dead.Load() {
		if s.state.CompareAndSwap(st, slotDone) {
			q.release(s)
			return q.a.lostErr()
		}
		return nil // the failure completed it through the callback
	}
	if err := q.w.send(s); err != nil {
		q.a.fail(fmt.Errorf("post send on queue %d: %w", q.qid, err))
		if s.state.CompareAndSwap(st, slotDone) {
			q.release(s)
			return q.a.lostErr()
		}
		return nil
	}
	return nil
}

// prepare places s's data, gives it its CID and encodes its SQE.
func (q *queue) prepare(s *slot, dir nvme.Direction, n int, timeout time.Duration) error {
	if n == 0 {
		dir = nvme.DirNone
	}
	s.dir, s.n = dir, n
	s.inline = q.w.place(s, dir, n)
	s.cmd.CID = makeCID(s.tag, s.gen)
	if err := s.cmd.Marshal(s.sqe); err != nil {
		return fmt.Errorf("initiator: encode command: %w", err)
	}
	s.what.Store(uint32(s.cmd.Opcode)<<16 | uint32(s.cmd.CID))
	if timeout > 0 {
		s.deadline.Store(monoNow() + int64(timeout))
	}
	return nil
}

// exec runs one command synchronously (admin commands and setup; not the
// I/O path): wdata is written, rdst read, the completion returned. A
// command that ends with an error status returns the CQE and a
// *StatusError. ctx ending fails the association (the command's fate is
// unknown, as with a timeout).
func (q *queue) exec(ctx context.Context, cmd *nvme.Command, wdata, rdst []byte, timeout time.Duration) (nvme.Completion, error) {
	s, err := q.acquire(ctx)
	if err != nil {
		return nvme.Completion{}, err
	}
	s.cmd = *cmd
	dir, n := nvme.DirNone, 0
	switch {
	case len(wdata) > 0:
		dir, n = nvme.DirHostToCtrl, copy(s.data, wdata)
	case len(rdst) > 0:
		dir, n = nvme.DirCtrlToHost, min(len(rdst), q.bufSize)
		s.dst = rdst[:n]
	}
	w := &waiter{ch: make(chan error, 1)}
	s.cb, s.res = w, &w.cqe
	if err := q.submit(s, dir, n, timeout); err != nil {
		return nvme.Completion{}, err
	}
	select {
	case err = <-w.ch:
	case <-ctx.Done():
		q.a.fail(fmt.Errorf("%s on queue %d abandoned: %w", commandName(cmd, q.qid), q.qid, context.Cause(ctx)))
		err = <-w.ch
	}
	return w.cqe, err
}

// waiter is the Callback of a synchronous command.
type waiter struct {
	ch  chan error
	cqe nvme.Completion
}

func (w *waiter) IODone(err error) { w.ch <- err }

// response handles the completion queue entry of a response capsule
// (NVMe/TCP: also the end of a C2HData with SUCCESS). It returns the slot
// it answered, in flight with flagResp now set, and that state; the
// caller completes it (finish) if flagSent is set too. Everything it
// finds wrong is a protocol error that fails the association, as the
// Linux host's error recovery does; it then returns nil.
func (q *queue) response(cqe *nvme.Completion) (*slot, uint32) {
	a := q.a
	tag, gen := splitCID(cqe.CID)
	if int(tag) >= q.depth {
		a.fail(fmt.Errorf("%w: queue %d: response for CID %#x, tag beyond depth %d", ErrProtocol, q.qid, cqe.CID, q.depth))
		return nil, 0
	}
	s := &q.slots[tag]
	for {
		st := s.state.Load()
		if st&slotStateMask != slotInflight || st&flagResp != 0 || st>>stateGenShift != uint32(gen) {
			if st&slotStateMask == slotDone || q.dead.Load() {
				return nil, 0 // raced with a failure
			}
			a.fail(fmt.Errorf("%w: queue %d: response for CID %#x that is not in flight (slot state %#x)",
				ErrProtocol, q.qid, cqe.CID, st))
			return nil, 0
		}
		s.cqe = *cqe
		if s.state.CompareAndSwap(st, st|flagResp) {
			return s, st | flagResp
		}
		// Only the sent flag or a failure can have changed it: look again.
	}
}

// sent records that the wire is done with slot s's capsule and data
// (the SEND completed; on TCP the sender goroutine wrote the last byte of
// it), for the command of generation gen. It completes the slot when its
// response came first. A slot no longer in flight with that generation
// (failed, or already marked) is left alone.
func (q *queue) sent(s *slot, gen uint8) {
	for {
		st := s.state.Load()
		if st&slotStateMask != slotInflight || st&flagSent != 0 || st>>stateGenShift != uint32(gen) {
			return
		}
		if s.state.CompareAndSwap(st, st|flagSent) {
			if st&flagResp != 0 {
				q.finish(s, st|flagSent)
			}
			return
		}
	}
}

// finish completes a slot whose send and response are both done (state
// st): copies read data out, releases the slot, then runs the callback
// (which may reuse the slot at once).
func (q *queue) finish(s *slot, st uint32) {
	if !s.state.CompareAndSwap(st, slotDone) {
		return
	}
	var err error
	if !s.cqe.Status.Success() {
		err = statusError(commandName(&s.cmd, q.qid), q.qid, &s.cqe)
	} else if s.dst != nil {
		copy(s.dst, s.data)
	}
	if s.res != nil {
		*s.res = s.cqe
	}
	cb := s.cb
	q.release(s)
	cb.IODone(err)
}

// failAll completes every command in flight with err. The queue is dead
// already, so no completion of its QP is taken any more.
func (q *queue) failAll(err error) {
	for i := range q.slots {
		s := &q.slots[i]
		for {
			st := s.state.Load()
			if st&slotStateMask != slotInflight {
				break
			}
			if s.state.CompareAndSwap(st, slotDone) {
				cb := s.cb
				q.release(s)
				cb.IODone(err)
				break
			}
		}
	}
}

// expired returns a description of the first command in flight past its
// deadline, or "".
func (q *queue) expired(now int64) string {
	for i := range q.slots {
		s := &q.slots[i]
		if s.state.Load()&slotStateMask != slotInflight {
			continue
		}
		if d := s.deadline.Load(); d != 0 && now > d {
			w := s.what.Load()
			c := nvme.Command{Opcode: uint8(w >> 16)}
			return fmt.Sprintf("%s (CID %#x) on queue %d", commandName(&c, q.qid), uint16(w), q.qid)
		}
	}
	return ""
}
