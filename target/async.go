package target

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
)

// The asynchronous backend contract (issue 22). The core hands a checked
// command to its namespace's AsyncBackend as an IO and returns; the
// backend completes it later with IO.Done, from any goroutine, and the
// core answers the host then. So a poll group never waits for the disk,
// and a queue depth of 32 means 32 I/Os at the disk — SPDK's bdev
// (submit_request, then spdk_bdev_io_complete on the submitting thread)
// and the kernel's bio (submit_bio, then bi_end_io) are the models.
//
// Where the completion runs. A request executed on a binding's poll
// group (Request.Group set, and the binding gave the Group its wake with
// SetWake) is completed on that poll group's goroutine: IO.Done from
// another goroutine pushes it on the Group's lock-free completion stack
// and wakes the group, whose loop calls Group.Reap. One push, one
// wake of a sleeping loop, no lock, no allocation. A Done called while
// Submit is still running (an inline completion, the Inline adapter's
// always) is finished by the submitting goroutine as soon as Submit
// returns, without the stack. A request without a woken Group (the sync
// workers', a binding that has no wake) is finished on the goroutine
// that calls Done; Responder.Complete allows any goroutine.
//
// Ownership. From Submit until Done the IO and its Data belong to the
// backend (the disk may be writing into them). The request is "at the
// backend" (Stats.AtBackend) and counted in its queue's in-flight
// requests, so a queue or connection torn down meanwhile keeps its
// buffers until the completion comes (Queue.Drained, and each binding's
// reclaim, wait for it) and never answers on a closed connection.
//
// Ordering. The backend's Flush makes durable every write whose Done was
// called before the Flush was submitted (the core acknowledges a write
// only after its Done, so every write a host saw complete is covered); a
// FUA write is durable when its Done is called. Writes gathered in a
// write group are committed synchronously by Group.Commit on the poll
// group, as before. A backend that does not say otherwise (Inline)
// blocks in Flush and FUA: the core then submits those on its sync
// workers, so the poll group never waits for a sync.

// IOOp is what an IO asks of the backend.
type IOOp uint8

// The operations of an IO.
const (
	// OpRead fills Data (a whole number of blocks) from LBA.
	OpRead IOOp = iota + 1
	// OpWrite writes Data (a whole number of blocks) at LBA; with FUA it
	// is durable when Done is called.
	OpWrite
	// OpWriteZeroes makes Blocks blocks at LBA read as zeros; with FUA
	// durably.
	OpWriteZeroes
	// OpDeallocate releases Blocks blocks at LBA; they read as zeros
	// afterwards.
	OpDeallocate
	// OpFlush makes durable every write completed before it was
	// submitted.
	OpFlush
)

// IO is one backend operation. It is part of the Request (nothing is
// allocated per command); the backend reads its exported fields and
// must not change them.
type IO struct {
	Op     IOOp
	LBA    uint64
	Blocks uint64 // OpWriteZeroes, OpDeallocate; len(Data) >> shift otherwise
	Data   []byte // OpRead: filled by the backend; OpWrite: the data
	FUA    bool

	// Resv is the reservation command of an OpReservation IO (resv.go):
	// what a ReservationKeeper executes. ResvStatus is the keeper's
	// answer, the one field it writes, before Done.
	Resv       resv.Command
	ResvStatus nvme.Status

	// core-private
	r     *Request
	phase atomic.Uint32
	err   error
	start time.Time
	lat   LatencyOp // the latency histogram the IO is timed into
	next  *Request  // Group's completion stack
	// step is the continuation's position: the DSM range being
	// deallocated.
	step int
	// cmpBuf is Compare's read buffer (compareBufs) while it is read.
	cmpBuf *[]byte
	// wait, for an IO of no request (flushWait), is signalled by Done.
	wait chan struct{}
	// parts and partErr: a backend's bookkeeping of an IO it splits
	// (the store's segments): pieces still at the disk, the first error.
	parts   int32
	partErr error
	// sync: submitted by a sync worker, not on the request's poll group
	// (IO.Poller gives none).
	sync bool
	// complete, for an IO a backend submits on its own behalf
	// (SetComplete), is called by Done in place of the core's path;
	// parent is the IO it serves (Inherit): its poll group's pollers.
	complete func(*IO, error)
	parent   *IO
	// drain is the request's DrainHosts epoch + 1 on its queue, 0 when
	// not counted (resv.go).
	drain uint8
}

// SetComplete makes io an IO of no request, owned by a backend that
// submits it to another backend on its own behalf (a replicating
// backend's local leg): Done then calls fn(io, err) on the goroutine that
// calls Done — inside the other backend's Submit or later — and nothing
// of the core. fn must not block. Set it once, before the IO's first
// Submit; the owner keeps the IO and reuses it once fn ran. Unlike a
// request's IO, Done does not check that it is called once per Submit:
// the owner's bookkeeping must.
func (io *IO) SetComplete(fn func(*IO, error)) { io.complete = fn }

// Inherit prepares io, a SetComplete IO, for a Submit made inside
// parent's Submit, on parent's goroutine: the backend it goes to then
// finds parent's poll group through io.Poller (its disk engine reaped on
// that group, as parent's own would be) and knows whether parent came
// from a sync worker. Call it before each such Submit; parent must still
// be at the backend (its Done not called) while io's Submit runs.
func (io *IO) Inherit(parent *IO) {
	io.parent = parent
	io.sync = parent.sync
}

// set fills the IO's operation.
func (io *IO) set(op IOOp, lba, blocks uint64, data []byte, fua bool) {
	io.Op, io.LBA, io.Blocks, io.Data, io.FUA = op, lba, blocks, data, fua
}

// IO phases.
const (
	ioIdle       uint32 = iota // not at the backend
	ioSubmitting               // inside Submit
	ioDoneInline               // Done called inside Submit
	ioAtBackend                // Submit returned; Done is due
)

// Done completes the IO with the backend's outcome (nil, or an error
// whose status statusOf reads). A backend calls it exactly once per
// Submit, from any goroutine, and must not touch the IO or its Data
// afterwards.
func (io *IO) Done(err error) {
	if fn := io.complete; fn != nil {
		fn(io, err) // a backend's own IO (SetComplete)
		return
	}
	io.err = err
	if io.phase.CompareAndSwap(ioSubmitting, ioDoneInline) {
		return // the submitter finishes it when Submit returns
	}
	if !io.phase.CompareAndSwap(ioAtBackend, ioIdle) {
		panic("target: IO.Done called twice, or without Submit")
	}
	if io.wait != nil {
		io.wait <- struct{}{}
		return
	}
	r := io.r
	if g := r.Group; g != nil && g.wake != nil {
		g.doneq.Push(r, &r.io.next)
		g.wake()
		return
	}
	r.q.ioDone(r)
}

// AsyncBackend is a namespace's storage as the core calls it: Submit an
// IO, then IO.Done. Submit may be called from any goroutine, for IOs of
// any queue, concurrently; it must not block for long (a backend that
// does — Inline — says so with Blocking). The backend translates its
// own errors into NVMe status as Backend's do (WithStatus; anything else
// is an Internal Error).
type AsyncBackend interface {
	// Geometry returns the block size, capacity and write protection.
	Geometry() (Geometry, error)
	// Submit starts io; the backend calls io.Done exactly once, inside
	// Submit or later from any goroutine.
	Submit(io *IO)
	// Blocking reports whether Submit of a Flush, a FUA write or a FUA
	// Write Zeroes may wait for a disk sync: the core then submits those
	// on its sync workers rather than on a poll group.
	Blocking() bool
	// NewWriteGroup is Backend.NewWriteGroup: plain writes the core
	// gathers per poll group and commits together (nil: none).
	NewWriteGroup() WriteGroup
}

// GeometryTrier is an optional extension of AsyncBackend: Geometry
// without waiting, for Identify Namespace, which runs on a poll group. A
// backend whose Geometry can wait for I/Os only a poll group completes (a
// store volume's lock, wanted by a Deallocate waiting for the direct
// I/Os in flight) implements it; ok false means "busy, ask later": the
// namespace then keeps the geometry it has. RevalidateNamespace, called
// off the poll groups, still uses Geometry and waits.
type GeometryTrier interface {
	TryGeometry() (g Geometry, ok bool, err error)
}

// Inline adapts a synchronous Backend to the asynchronous contract: each
// IO is served by the matching method and completed before Submit
// returns. It is Blocking (Flush and FUA go to the sync workers, as they
// always did) and keeps the backend's write groups. A namespace given a
// Backend (NamespaceConfig.Backend) is wrapped with it by the core.
func Inline(b Backend) AsyncBackend { return inline{b} }

type inline struct{ b Backend }

func (a inline) Geometry() (Geometry, error) { return a.b.Geometry() }
func (a inline) Blocking() bool              { return true }
func (a inline) NewWriteGroup() WriteGroup   { return a.b.NewWriteGroup() }

func (a inline) Submit(io *IO) { io.Done(a.do(io)) }

// do serves io with the synchronous backend's matching method.
func (a inline) do(io *IO) error {
	var err error
	switch io.Op {
	case OpRead:
		err = a.b.Read(io.LBA, io.Data)
	case OpWrite:
		err = a.b.Write(io.LBA, io.Data, io.FUA)
	case OpWriteZeroes:
		err = a.b.WriteZeroes(io.LBA, io.Blocks, io.FUA)
	case OpDeallocate:
		err = a.b.Deallocate(io.LBA, io.Blocks)
	case OpFlush:
		err = a.b.Flush()
	default:
		err = errBadOp
	}
	return err
}

// errBadOp: an IO of no known operation (a core bug).
var errBadOp = WithStatus(errors.New("target: unknown backend operation"), nvme.StatusInternalError.WithDNR())

// submit hands r.io to ns's backend, timed into histogram lat, and — when
// the backend completed it inline — finishes it at once. Otherwise the
// completion comes through IO.Done.
func (q *Queue) submit(ns *namespace, r *Request, lat LatencyOp) {
	io := &r.io
	io.r = r
	io.err = nil
	io.lat = lat
	io.start = time.Now()
	r.ns = ns
	if ns.inline != nil {
		// A synchronous backend: served by a direct call, without the
		// completion handshake (what Inline.Submit does, minus the
		// atomics), so wrapping costs the inline path nothing.
		io.err = ns.inline.do(io)
		q.ioDone(r)
		return
	}
	q.t.enter(r, reqBackend)
	if io.submit(ns.io, "target: IO completed twice") {
		q.ioDone(r)
	}
}

// submit hands io to s (an AsyncBackend, a ReservationKeeper). It
// reports whether s completed it before returning (the caller goes on
// with it at once); false: Done comes later and goes on from there.
// what is the panic of an IO completed twice.
func (io *IO) submit(s interface{ Submit(io *IO) }, what string) bool {
	io.phase.Store(ioSubmitting)
	s.Submit(io)
	if io.phase.CompareAndSwap(ioSubmitting, ioAtBackend) {
		return false // Done comes later
	}
	if io.phase.Load() != ioDoneInline {
		panic(what)
	}
	io.phase.Store(ioIdle)
	return true
}

// ioDone takes a completed IO back: counters, the next step of a command
// made of several IOs, or the response.
func (q *Queue) ioDone(r *Request) {
	if r.state == reqLockWait {
		q.lockResume(r) // the range lock let it go on (rangelock.go)
		return
	}
	io := &r.io
	if io.Op == OpReservation {
		q.keeperDone(r) // a keeper's (resv_cmd.go): not timed, no counters
		return
	}
	ns := r.ns
	ns.c.lat[io.lat].since(io.start)
	st := statusOf(io.err)
	io.err = nil
	io.sync = false
	if r.pair != nil {
		q.pairIODone(ns, r, st) // a fused pair's read or write (fused.go)
		return
	}
	ok := st.Code() == 0
	switch io.Op {
	case OpRead:
		if bp := io.cmpBuf; bp != nil {
			io.cmpBuf = nil
			if ok {
				st = compareStatus((*bp)[:len(io.Data)], r.data())
				ok = st.Code() == 0
			}
			compareBufs.Put(bp)
			if ok {
				ns.c.compares.Add(1)
				ns.c.readBytes.Add(uint64(len(io.Data)))
			}
			break
		}
		if ok {
			ns.c.reads.Add(1)
			ns.c.readBytes.Add(uint64(len(io.Data)))
		}
	case OpWrite:
		if ok {
			ns.c.writes.Add(1)
			if io.FUA {
				ns.c.fuaWrites.Add(1)
			}
			ns.c.writeBytes.Add(uint64(len(io.Data)))
		}
	case OpWriteZeroes:
		if ok {
			ns.c.writeZeroes.Add(1)
		}
	case OpDeallocate:
		if isDSM(r) {
			ns.locks.release(&r.hold) // each range holds its own
			if !ok {
				break
			}
			ns.c.deallocBlocks.Add(io.Blocks)
			if q.dsmNext(ns, r) {
				return // the next range is at the backend
			}
			ns.c.deallocates.Add(1)
			break
		}
		if ok {
			ns.c.deallocates.Add(1)
			ns.c.deallocBlocks.Add(io.Blocks)
		}
	case OpFlush:
		if ok {
			ns.c.flushes.Add(1)
		}
	}
	io.Data = nil
	r.ns = nil
	q.finish(ns, r, st)
}
