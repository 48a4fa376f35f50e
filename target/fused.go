package target

import (
	"sync"
	"sync/atomic"

	"github.com/blk-project/blk/nvme"
)

// Fused Compare and Write (docs/reservations.md §2). The host submits a
// Compare with FUSE 01b and a Write with FUSE 10b adjacent in one
// submission queue: over fabrics two consecutive capsules. Their data
// may not come in that order (a binding executes a command when its data
// is in), and another command of the queue may execute between them, so
// the halves are paired by arrival: the binding stamps Request.Seq and
// Request.PrevFuse when the capsule arrives, and
//
//   - a second (10b) whose PrevFuse is not 01b has no first: Missing
//     Fused Command;
//   - a half whose partner (Seq ∓ 1) waits in Queue.fused runs the pair;
//     otherwise it waits there (request state reqFused);
//   - a command that is not a second but follows a first (PrevFuse 01b)
//     ends that first with Missing Fused Command: at once if it waits,
//     else by leaving a verdict for it in the table;
//   - a half refused on its own (Invalid Field for FUSE 11b, a first not
//     a Compare, a second not a Write, a refused state check) ends its
//     partner with Failed Fused Command, the same two ways.
//
// Every half pairs, or is ended by its partner's command, or by the
// queue's close: nothing waits forever. The pair then runs as one
// request of two, driven by the Write half: its range exclusive
// (rangelock.go), the Compare (the backend's View, or a read into a
// pooled buffer), then on a match the Write, then both completions in
// order, first then second.

// fusedSlot is one entry of Queue.fused: a half waiting for its partner
// (r set), or the verdict for the command of sequence number seq, which
// has not executed yet (r nil, st its status).
type fusedSlot struct {
	used bool
	seq  uint32
	r    *Request
	st   nvme.Status
}

// fusedTable is Queue.fused: sized at Connect by the queue's depth (each
// entry stands for a distinct command in flight, so it cannot fill),
// touched only by fused commands, the command right after a first and
// the queue's close. Its mutex is never held across a completion.
// Entries fill the lowest free slots and n counts them, so a look-up
// stops after the entries there are: with a pair's halves arriving
// together (the usual case) it looks at one slot or none, not at the
// queue's depth of them (a third of the pairing's cost, profiled).
type fusedTable struct {
	mu    sync.Mutex
	slots []fusedSlot
	n     int // entries used
}

// fusedCounters are the fused commands' counters (Stats).
type fusedCounters struct {
	pairs, miscompares, missing, failed atomic.Uint64
}

// initFused sizes the queue's table; I/O queues, at Connect.
func (q *Queue) initFused(depth int) {
	q.fused.slots = make([]fusedSlot, depth)
}

// take removes and returns the entry for seq (mu held).
func (t *fusedTable) take(seq uint32) (fusedSlot, bool) {
	seen := 0
	for i := 0; seen < t.n && i < len(t.slots); i++ {
		e := &t.slots[i]
		if !e.used {
			continue
		}
		if e.seq == seq {
			got := *e
			*e = fusedSlot{}
			t.n--
			return got, true
		}
		seen++
	}
	return fusedSlot{}, false
}

// put adds an entry (mu held). Full cannot happen (one entry per command
// in flight); should it, the oldest verdict goes (its command then waits
// for the queue's close), and a half that finds no room at all is
// refused: false.
func (t *fusedTable) put(e fusedSlot) bool {
	victim := -1
	for i := range t.slots {
		if !t.slots[i].used {
			t.slots[i] = e
			t.n++
			return true
		}
		if t.slots[i].r == nil && victim < 0 {
			victim = i
		}
	}
	if victim < 0 {
		return false
	}
	t.slots[victim] = e
	return true
}

// fusedIO handles an I/O command that is a fused half, or follows a
// first. It reports whether it took the request (completed it, queued it
// or ran its pair); false: the caller executes it as usual.
func (q *Queue) fusedIO(c *ctrl, r *Request) bool {
	if q.fused.slots == nil {
		return false // not sized (no I/O Connect): refused as unfused
	}
	switch r.Cmd.Fuse() {
	case nvme.FlagFuseFirst:
		q.fusedFirst(c, r)
	case nvme.FlagFuseSecond:
		q.fusedSecond(c, r)
	default:
		// Not a second, right after a first: the first has none — unless
		// that first was refused and left its verdict for this command
		// (then it is done; the verdict goes, so that nothing stale
		// stays in the table).
		t := &q.fused
		t.mu.Lock()
		v, ok := t.take(r.Seq)
		t.mu.Unlock()
		if !ok || v.r != nil || v.st != nvme.StatusAbortFusedFail {
			q.endHalf(r.Seq-1, nvme.StatusAbortFusedMissing)
		}
		if r.Cmd.Fuse() == 0 {
			return false
		}
		q.complete(r, nvme.StatusInvalidField.WithDNR()) // FUSE 11b
	}
	return true
}

// Refused tells the core that the binding answered r itself, without
// Execute (a bad SGL): if r came right after a fused first, that first
// has lost its second and completes with Missing Fused Command. A
// binding calls it on the goroutine that executes the queue's commands,
// for an I/O queue's command whose PrevFuse is 01b; anything else is
// ignored. (A binding that refuses a first itself stamps the next
// capsule's PrevFuse 0, so that its second finds no first.)
func (q *Queue) Refused(r *Request) {
	if r.PrevFuse != nvme.FlagFuseFirst || q.fused.slots == nil {
		return
	}
	q.endHalf(r.Seq-1, nvme.StatusAbortFusedMissing)
}

// endHalf ends the half of sequence number seq with st: at once if it
// waits, else when it executes.
func (q *Queue) endHalf(seq uint32, st nvme.Status) {
	t := &q.fused
	t.mu.Lock()
	e, ok := t.take(seq)
	if !ok || e.r == nil {
		t.put(fusedSlot{used: true, seq: seq, st: st})
	}
	t.mu.Unlock()
	if ok && e.r != nil {
		q.endWaiting(e.r, st)
	}
}

// endWaiting completes a half that waited in the table.
func (q *Queue) endWaiting(r *Request, st nvme.Status) {
	q.countFused(st)
	q.complete(r, st)
}

// countFused counts a half ended without its pair.
func (q *Queue) countFused(st nvme.Status) {
	switch st.Code() {
	case nvme.StatusAbortFusedMissing:
		q.t.stats.fused.missing.Add(1)
	case nvme.StatusAbortFusedFail:
		q.t.stats.fused.failed.Add(1)
	}
}

// halfStatus checks one half alone: what execIO checks of every command
// before its opcode, and the opcode the half must have.
func (q *Queue) halfStatus(c *ctrl, r *Request, op nvme.IOOpcode) nvme.Status {
	cmd := &r.Cmd
	switch {
	case cmd.IsFabrics() || !psdtOK(cmd) || nvme.IOOpcode(cmd.Opcode) != op:
		return nvme.StatusInvalidField.WithDNR()
	case c.dead.Load():
		return nvme.StatusAbortSQDeleted
	case !c.ready.Load():
		return nvme.StatusCommandSequenceError.WithDNR()
	}
	return nvme.Status(c.s.anaIO.Load()) // ANA: a path that serves no I/O (ana.go)
}

// fusedFirst handles a Compare with FUSE 01b.
func (q *Queue) fusedFirst(c *ctrl, r *Request) {
	if r.PrevFuse == nvme.FlagFuseFirst {
		q.endHalf(r.Seq-1, nvme.StatusAbortFusedMissing) // a first is not a second
	}
	st := q.halfStatus(c, r, nvme.IOCompare)
	t := &q.fused
	t.mu.Lock()
	if v, ok := t.take(r.Seq); ok {
		// The command after it executed first and left its verdict.
		t.mu.Unlock()
		q.endWaiting(r, v.st)
		return
	}
	if st != nvme.StatusSuccess {
		q.refuseHalf(r, st, r.Seq+1, true)
		return
	}
	if e, ok := t.take(r.Seq + 1); ok {
		t.mu.Unlock()
		if e.r == nil { // not reached: a verdict for a second comes from its first only
			q.endWaiting(r, nvme.StatusAbortFusedMissing)
			return
		}
		q.runPair(c, r, e.r)
		return
	}
	q.wait(r)
}

// fusedSecond handles a Write with FUSE 10b.
func (q *Queue) fusedSecond(c *ctrl, r *Request) {
	if r.PrevFuse != nvme.FlagFuseFirst {
		q.endWaiting(r, nvme.StatusAbortFusedMissing)
		return
	}
	st := q.halfStatus(c, r, nvme.IOWrite)
	t := &q.fused
	t.mu.Lock()
	if v, ok := t.take(r.Seq); ok {
		// Its first was refused, and said so.
		t.mu.Unlock()
		q.endWaiting(r, v.st)
		return
	}
	if st != nvme.StatusSuccess {
		q.refuseHalf(r, st, r.Seq-1, false)
		return
	}
	if e, ok := t.take(r.Seq - 1); ok {
		t.mu.Unlock()
		if e.r == nil { // not reached: a verdict for a first comes from its second only
			q.endWaiting(r, nvme.StatusAbortFusedMissing)
			return
		}
		q.runPair(c, e.r, r)
		return
	}
	q.wait(r)
}

// refuseHalf ends half r, refused with st before its pair could run
// (t.mu held, released here). Its partner, at sequence number partner,
// ends with Compare and Write Failed: at once if it waits in the table,
// else by the verdict left there for it. Of the two completions the
// first's (isFirst: r is the Compare) goes out before the second's.
func (q *Queue) refuseHalf(r *Request, st nvme.Status, partner uint32, isFirst bool) {
	t := &q.fused
	e, ok := t.take(partner)
	if !ok || e.r == nil {
		t.put(fusedSlot{used: true, seq: partner, st: nvme.StatusAbortFusedFail})
	}
	t.mu.Unlock()
	if isFirst {
		q.complete(r, st)
	}
	if ok && e.r != nil {
		q.endWaiting(e.r, nvme.StatusAbortFusedFail)
	}
	if !isFirst {
		q.complete(r, st)
	}
}

// wait puts a half in the table until its partner comes (t.mu held,
// released here).
func (q *Queue) wait(r *Request) {
	t := &q.fused
	if q.state.Load() == queueClosed {
		// Close already emptied the table: nothing would end it.
		t.mu.Unlock()
		q.complete(r, nvme.StatusAbortSQDeleted)
		return
	}
	if !t.put(fusedSlot{used: true, seq: r.Seq, r: r}) {
		t.mu.Unlock()
		q.complete(r, nvme.StatusInternalError.WithDNR())
		return
	}
	q.t.enter(r, reqFused)
	t.mu.Unlock()
}

// closeFused completes every half still waiting with Abort SQ Deleted
// (Close, after the queue's state became closed).
func (q *Queue) closeFused() {
	t := &q.fused
	for {
		var r *Request
		t.mu.Lock()
		for i := range t.slots {
			if e := &t.slots[i]; e.used {
				r = e.r
				*e = fusedSlot{}
				t.n--
				if r != nil {
					break
				}
			}
		}
		t.mu.Unlock()
		if r == nil {
			return
		}
		q.complete(r, nvme.StatusAbortSQDeleted)
	}
}

// Steps of a pair, in its Write half's fstep.
const (
	fusedIdle    uint8 = iota
	fusedLocking       // taking its range exclusive
	fusedReading       // the Compare's read at the backend
	fusedWriting       // the Write at the backend
)

// runPair checks a whole pair and runs it. The checks refuse the first
// with the status and the second with Failed Fused Command (an unequal
// range: both Invalid Field).
func (q *Queue) runPair(c *ctrl, first, second *Request) {
	f, s := &first.Cmd, &second.Cmd
	if f.NSID != s.NSID || f.SLBA() != s.SLBA() || f.Blocks() != s.Blocks() {
		q.complete(first, nvme.StatusInvalidField.WithDNR())
		q.complete(second, nvme.StatusInvalidField.WithDNR())
		return
	}
	ns := c.s.acquireNS(f.NSID)
	if ns == nil {
		q.refusePair(first, second, nvme.StatusInvalidNamespace.WithDNR())
		return
	}
	_, st := c.checkData(ns, first)
	if st == nvme.StatusSuccess {
		_, st = c.checkData(ns, second)
	}
	if st == nvme.StatusSuccess {
		st = q.pairAllowed(c, ns, first, second)
	}
	if st == nvme.StatusSuccess && ns.readOnly.Load() {
		st = nvme.StatusNamespaceWriteProtect.WithDNR()
	}
	if st != nvme.StatusSuccess {
		ns.release()
		ns.c.errors.Add(1)
		q.refusePair(first, second, st)
		return
	}
	second.pair, first.pair = first, second
	second.ns = ns
	second.fstep = fusedLocking
	second.hold.set(s.SLBA(), uint64(s.Blocks()), ns.shift, true)
	if ns.locks.lockExcl(second) {
		q.pairCompare(ns, second)
	}
}

// pairAllowed is the pair's reservation check (§2.2): the Compare in the
// read group, the Write in the write group. A refusal of either half is
// Reservation Conflict, answered on the first (refusePair then gives the
// second Failed Fused Command). Each half checked is counted for
// DrainHosts (resvCheck) until it is answered, so a preempt-and-abort
// waits for a pair of its victims that passed the check.
func (q *Queue) pairAllowed(c *ctrl, ns *namespace, first, second *Request) nvme.Status {
	if st := q.resvCheck(c, ns, first, false); st != nvme.StatusSuccess {
		return st
	}
	return q.resvCheck(c, ns, second, true)
}

// refusePair completes a pair refused before it ran: the first with st,
// the second with Failed Fused Command.
func (q *Queue) refusePair(first, second *Request, st nvme.Status) {
	q.complete(first, st)
	q.endWaiting(second, nvme.StatusAbortFusedFail)
}

// pairCompare runs the Compare of a pair that holds its range (the Write
// half's request carries the IOs).
func (q *Queue) pairCompare(ns *namespace, r *Request) {
	first := r.pair
	data := first.data()
	slba := r.Cmd.SLBA()
	if ns.viewer != nil {
		q.pairCompared(ns, r, ns.view(r, slba, data))
		return
	}
	bp, _ := compareBufs.Get().(*[]byte)
	if bp == nil || cap(*bp) < len(data) {
		b := make([]byte, len(data))
		bp = &b
	}
	r.fstep = fusedReading
	r.io.set(OpRead, slba, uint64(len(data))>>ns.shift, (*bp)[:len(data)], false)
	r.io.cmpBuf = bp
	q.submit(ns, r, LatencyRead)
}

// pairCompared goes on from the Compare's outcome: on a match the Write,
// else the pair ends.
func (q *Queue) pairCompared(ns *namespace, r *Request, st nvme.Status) {
	first := r.pair
	if st != nvme.StatusSuccess {
		if st.Code() == nvme.StatusCompareFailure {
			q.t.stats.fused.miscompares.Add(1)
		}
		q.pairEnd(ns, r, st, nvme.StatusAbortFusedFail)
		return
	}
	ns.c.compares.Add(1)
	ns.c.readBytes.Add(uint64(len(first.data())))
	r.fstep = fusedWriting
	data := r.data()
	fua := r.Cmd.FUA()
	if fua && ns.blocking {
		r.ns = ns
		q.t.pool.submit(r) // runSync submits the FUA write; ioDone comes back here
		return
	}
	r.io.set(OpWrite, r.Cmd.SLBA(), uint64(len(data))>>ns.shift, data, fua)
	lat := LatencyWrite
	if fua {
		lat = LatencyWriteFUA
	}
	q.submit(ns, r, lat)
}

// pairIODone takes back a pair's IO (from ioDone, which timed it).
func (q *Queue) pairIODone(ns *namespace, r *Request, st nvme.Status) {
	io := &r.io
	switch r.fstep {
	case fusedReading:
		bp := io.cmpBuf
		io.cmpBuf = nil
		if st.Code() == 0 {
			st = compareStatus((*bp)[:len(io.Data)], r.pair.data())
		}
		compareBufs.Put(bp)
		io.Data = nil
		q.pairCompared(ns, r, st)
	case fusedWriting:
		if st.Code() == 0 {
			ns.c.writes.Add(1)
			if io.FUA {
				ns.c.fuaWrites.Add(1)
			}
			ns.c.writeBytes.Add(uint64(len(io.Data)))
			q.t.stats.fused.pairs.Add(1)
		}
		io.Data = nil
		q.pairEnd(ns, r, nvme.StatusSuccess, st)
	default:
		q.pairEnd(ns, r, nvme.StatusInternalError.WithDNR(), nvme.StatusAbortFusedFail) // not reached
	}
}

// pairEnd releases the pair's range and namespace and completes the
// first with st1, then the second with st2.
func (q *Queue) pairEnd(ns *namespace, r *Request, st1, st2 nvme.Status) {
	first := r.pair
	ns.locks.release(&r.hold)
	r.hold = lockHold{}
	r.pair, first.pair = nil, nil
	r.fstep = fusedIdle
	r.ns = nil
	q.countFused(st2)
	q.complete(first, st1)
	q.finish(ns, r, st2)
}

// lockResume goes on with a request the range lock parked, now that it
// may (ioDone, state reqLockWait): a pair takes the rest of its stripes,
// a plain write all of them again, then each goes where it was going.
func (q *Queue) lockResume(r *Request) {
	ns := r.ns
	q.t.enter(r, reqExecuting)
	if r.pair != nil {
		if ns.locks.lockExcl(r) {
			q.pairCompare(ns, r)
		}
		return
	}
	if !ns.locks.lockShared(r) {
		return
	}
	q.locked(ns, r)
}
