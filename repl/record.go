package repl

import (
	"errors"
	"math/bits"
	"sync/atomic"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/target"
)

// record carries one host I/O over its legs: preallocated (Config.Depth),
// taken from the free list at Submit, returned before the host's Done.
type record struct {
	b     *Backend
	host  *target.IO
	local target.IO // the local leg: a SetComplete IO
	legs  [MaxPeers]leg
	// pending counts what the record waits for: the local leg, each
	// remote leg sent, and the submitter (so nothing finishes it while
	// Submit still sends legs).
	pending atomic.Int32
	// missed has bit i set when legs[i]'s peer lacks this write (its leg
	// failed, or it was failing already and was skipped): the host waits
	// for that peer's verdict.
	missed atomic.Uint32
	// reached has bit i set when legs[i] completed without error: the
	// write is on that replica. set is the leg set the record started
	// with, drls the dirty-region logs it saw then (drl.go: which logs
	// it marks).
	reached  atomic.Uint32
	set      *legSet
	drls     *dirtySet
	localErr error
	solo     bool    // started with no peer: a local failure is the host's alone
	next     *record // a peer's waiting stack
	// uses is odd while the record carries a host I/O (get to put): a
	// rebuild's copier waits for the records in use when it sets a
	// window (Rebuild.quiesce). deferredOn is the window one of its legs
	// waits on (Rebuild.hold), so that wait skips it.
	uses       atomic.Uint32
	deferredOn atomic.Pointer[window]

	idx      uint32
	nextFree atomic.Uint32 // free list: index+1 of the next free record
	pooled   bool          // in b.recs (false: an overflow, left to the GC)
}

// leg is one remote leg of a record: its initiator.Callback.
type leg struct {
	r    *record
	bit  uint32
	p    *peer
	sent atomic.Int32 // commands of the leg not yet completed
	fail atomic.Bool  // one of them failed
	// flushAfter: a FUA Write Zeroes, which the initiator sends without
	// FUA; a Flush after its commands makes it durable.
	flushAfter bool
	rng        [1]initiator.Range
	// What is left to send, read and written by the leg's owner only:
	// its submitter, then whoever takes it off the backlog (p.park,
	// p.kick), or the completion that ended its commands (flushAfter).
	op     target.IOOp // the host's, or OpFlush for the flush after
	k, n   uint64      // the next command to send, of n
	parked int64       // when it entered the backlog (Backend.now)
	nextBL *leg        // the backlog's link
	nextRB *leg        // a rebuild window's held legs (Rebuild.hold)
}

func (r *record) init(b *Backend) {
	r.b = b
	r.local.SetComplete(r.localDone)
	for i := range r.legs {
		r.legs[i].r = r
		r.legs[i].bit = 1 << i
	}
}

// start sends io's remote legs, then its local one, which inherits
// parent's poll group (io's, or offGroup's none: Backend.submit).
func (r *record) start(io *target.IO, s *legSet, parent *target.IO) {
	r.host = io
	r.localErr = nil
	r.solo = len(s.peers) == 0
	r.missed.Store(0)
	r.reached.Store(0)
	r.set = s
	r.pending.Store(2) // the local leg and the submitter
	for i, p := range s.peers {
		l := &r.legs[i]
		l.p = p
		switch p.state.Load() {
		case peerInSync, peerPromoting:
			r.pending.Add(1)
			l.send(io)
		case peerRebuilding:
			r.pending.Add(1)
			if !p.rb.hold(l, io) {
				l.send(io)
			}
		case peerFailing, peerRefused:
			r.missed.Or(l.bit) // it will not have this write: wait for its verdict
		}
	}
	lo := &r.local
	lo.Op, lo.LBA, lo.Blocks, lo.Data, lo.FUA = io.Op, io.LBA, io.Blocks, io.Data, io.FUA
	lo.Inherit(parent)
	r.b.local.Submit(lo)
	r.release()
}

func (r *record) localDone(_ *target.IO, err error) {
	r.localErr = err
	r.release()
}

func (r *record) release() {
	n := r.pending.Add(-1)
	if n == 0 {
		r.finish()
	} else if n < 0 {
		panic("repl: a leg completed twice")
	}
}

// finish runs once every leg completed: the write is marked in the
// dirty-region logs of the replicas that may lack it (before its use
// ends: a rebuild's copier waits for that), then completed.
func (r *record) finish() {
	if s := r.b.drls.Load(); s != nil {
		r.markDirty(s)
	}
	if err := r.localErr; err != nil {
		if !r.solo { // with no peer it is a plain local backend
			r.b.localFailure(err)
		}
		r.complete(err)
		return
	}
	if r.missed.Load() == 0 {
		r.complete(nil)
		return
	}
	r.settle()
}

// settle completes a write some peers missed once each one's verdict is
// known: acknowledged if every one was confirmed out of sync, failed
// with the path status as soon as one was not; until then it is held on
// a peer still waiting for its verdict.
func (r *record) settle() {
	var wait *peer
	for m := r.missed.Load(); m != 0; m &= m - 1 {
		p := r.legs[bits.TrailingZeros32(m)].p
		switch p.state.Load() {
		case peerRefused:
			r.complete(errUnconfirmed)
			return
		case peerFailing:
			wait = p
		}
	}
	if wait != nil {
		wait.hold(r)
		return
	}
	r.complete(nil)
}

// complete frees the record, then completes the host's I/O.
func (r *record) complete(err error) {
	io := r.host
	r.host = nil
	r.set, r.drls = nil, nil
	r.local.Data = nil
	r.uses.Add(1) // even: free (a copier's wait ends)
	r.b.put(r)
	io.Done(err)
}

// send starts the leg's commands for io.
func (l *leg) send(io *target.IO) {
	p := l.p
	p.writes.Add(1)
	l.fail.Store(false)
	l.flushAfter = false
	l.op = io.Op
	var n uint64
	switch io.Op {
	case target.OpWrite:
		n = (uint64(len(io.Data))>>l.r.b.shift + p.maxBlocks - 1) / p.maxBlocks
	case target.OpWriteZeroes:
		l.flushAfter = io.FUA
		n = (io.Blocks + maxLegZeroes - 1) / maxLegZeroes
	case target.OpDeallocate:
		n = (io.Blocks + maxLegDeallocate - 1) / maxLegDeallocate
	case target.OpFlush:
		n = 1
	}
	if n == 0 {
		l.sent.Store(0)
		l.end()
		return
	}
	l.k, l.n = 0, n
	l.sent.Store(int32(n))
	l.run()
}

// run sends what the leg has left, or parks it in its peer's backlog:
// at once if the backlog holds anything (so nothing overtakes a waiting
// leg), or when the connection turns out full. The caller owns the leg
// (its submitter, or the completion that ended its commands).
func (l *leg) run() {
	p := l.p
	if p.queued.Load() != 0 || !l.resume() {
		p.park(l)
	}
}

// resume submits the leg's commands from l.k on. It returns false when
// the connection was full (l.k is then the first unsent one and the
// caller still owns the leg); true when every command was submitted or
// the leg failed. After its last submit it touches nothing of the leg:
// the completion may have ended it and its record may be reused.
func (l *leg) resume() bool {
	p := l.p
	op, n := l.op, l.n
	for k := l.k; k < n; k++ {
		p.inflight.Add(1)
		err := l.command(op, k)
		if err == nil {
			continue
		}
		p.inflight.Add(-1)
		if errors.Is(err, initiator.ErrQueueFull) {
			l.k = k
			return false
		}
		l.abort(int32(n-k), err)
		return true
	}
	return true
}

// command submits the leg's k-th command of op.
func (l *leg) command(op target.IOOp, k uint64) error {
	p := l.p
	switch op {
	case target.OpWrite:
		io := l.r.host
		flags := initiator.IOFlags(0)
		if io.FUA {
			flags = initiator.FUA
		}
		shift := l.r.b.shift
		lo := k * p.maxBlocks << shift
		hi := min(lo+p.maxBlocks<<shift, uint64(len(io.Data)))
		return p.ns.WriteAsync(io.LBA+k*p.maxBlocks, io.Data[lo:hi], flags, l)
	case target.OpWriteZeroes:
		io := l.r.host
		c := min(maxLegZeroes, io.Blocks-k*maxLegZeroes)
		return p.ns.WriteZeroesAsync(io.LBA+k*maxLegZeroes, uint32(c), l)
	case target.OpDeallocate:
		io := l.r.host
		// DeallocateAsync copies the range before it returns.
		l.rng[0] = initiator.Range{LBA: io.LBA + k*maxLegDeallocate, Blocks: uint32(min(maxLegDeallocate, io.Blocks-k*maxLegDeallocate))}
		return p.ns.DeallocateAsync(l.rng[:], l)
	default: // the host's flush, or the one after a FUA Write Zeroes
		return p.ns.FlushAsync(l)
	}
}

// abort accounts for unsent commands that will never complete: err, the
// submit's error, fails the leg.
func (l *leg) abort(unsent int32, err error) {
	if err != nil {
		l.failed(err)
	}
	if l.sent.Add(-unsent) == 0 {
		l.end()
	}
}

// skip drops the unsent commands of a leg taken off the backlog of a
// peer that failed meanwhile: the replica lacks the write, as it lacks
// those of the writes that skipped it, so the record waits for its
// verdict (end sets the missed bit). Not counted as the peer's failure.
func (l *leg) skip() {
	l.fail.Store(true)
	if l.sent.Add(-int32(l.n-l.k)) == 0 {
		l.end()
	}
}

// IODone implements initiator.Callback: one command of the leg
// completed. Its slot is free by now (the initiator releases it before
// the callback), so the peer's backlog gets it after the leg's own
// bookkeeping.
func (l *leg) IODone(err error) {
	p := l.p // the record may be reused once the leg ended
	if err != nil {
		l.failed(err)
	}
	if l.sent.Add(-1) == 0 {
		l.end()
	}
	p.inflight.Add(-1)
	if p.queued.Load() != 0 {
		p.kick()
	}
}

func (l *leg) failed(err error) {
	if l.fail.CompareAndSwap(false, true) {
		l.p.missed(err)
	}
}

// end runs when every command of the leg completed.
func (l *leg) end() {
	if l.flushAfter && !l.fail.Load() {
		l.flushAfter = false
		l.op, l.k, l.n = target.OpFlush, 0, 1
		l.sent.Store(1)
		l.run()
		return
	}
	if l.fail.Load() {
		l.r.missed.Or(l.bit)
	} else {
		l.r.reached.Or(l.bit)
	}
	l.r.release()
}

// freeList is a lock-free stack of the preallocated records, by index:
// the low 32 bits of top are the top record's index+1 (0: empty), the
// high 32 a count of changes, so that a pop that read a stale next
// (another goroutine popped the top and pushed it back meanwhile) fails
// its compare-and-swap: the ABA problem lfstack avoids by having no
// single pop. The count wraps after 2^32 changes, which one stalled pop
// would have to sleep through.
type freeList struct {
	top atomic.Uint64
}

// get takes a free record, or allocates one beyond Depth (counted): a
// submit on a poll group must neither wait (the local legs it would wait
// for may be reaped by that very group) nor refuse the host (Linux
// retries a busy status at once, five times, then fails the I/O).
func (b *Backend) get() *record {
	for {
		old := b.free.top.Load()
		i := uint32(old)
		if i == 0 {
			b.overflows.Add(1)
			r := &record{}
			r.init(b)
			r.uses.Store(1)
			b.overMu.Lock()
			b.over[r] = struct{}{}
			b.overMu.Unlock()
			return r
		}
		r := &b.recs[i-1]
		next := r.nextFree.Load()
		if b.free.top.CompareAndSwap(old, (old>>32+1)<<32|uint64(next)) {
			r.uses.Add(1)
			return r
		}
	}
}

// put returns a pooled record to the free list.
func (b *Backend) put(r *record) {
	if !r.pooled {
		b.overMu.Lock()
		delete(b.over, r)
		b.overMu.Unlock()
		return
	}
	for {
		old := b.free.top.Load()
		r.nextFree.Store(uint32(old))
		if b.free.top.CompareAndSwap(old, (old>>32+1)<<32|uint64(r.idx+1)) {
			return
		}
	}
}
