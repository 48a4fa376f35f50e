package target

import (
	"bytes"
	"sync"
	"time"

	"github.com/blk-project/blk/nvme"
)

// The I/O path. Each NVM command is checked here, then submitted to the
// namespace's AsyncBackend as an IO (async.go) and answered when the
// backend completes it: inline (Inline, a synchronous backend) or later
// on the submitting poll group. Flush, FUA writes and FUA Write Zeroes of
// a Blocking backend are submitted on the sync workers instead; plain
// writes of a binding's goroutine may be gathered in its Group. Nothing
// here allocates or takes a mutex on success: the controller's state,
// the namespace table and the namespace's reference count are atomics,
// and the backend's own locks are the backend's. Every IO is timed, from
// Submit to Done, into the namespace's latency histograms (two clock
// reads and two atomic adds).

// execIO serves an I/O queue.
func (q *Queue) execIO(r *Request) {
	c := q.ctrl.Load()
	c.sawCommand()
	cmd := &r.Cmd
	if cmd.Fuse() != 0 || r.PrevFuse == nvme.FlagFuseFirst {
		if q.fusedIO(c, r) { // fused.go
			return
		}
	}
	switch {
	case cmd.Fuse() != 0:
		q.complete(r, nvme.StatusInvalidField.WithDNR())
		return
	case cmd.IsFabrics():
		q.execFabrics(c, r)
		return
	case !psdtOK(cmd):
		q.complete(r, nvme.StatusInvalidField.WithDNR())
		return
	case !c.ready.Load() || c.dead.Load():
		if c.dead.Load() {
			q.complete(r, nvme.StatusAbortSQDeleted)
		} else {
			q.complete(r, nvme.StatusCommandSequenceError.WithDNR())
		}
		return
	}
	// ANA (ana.go): a path in a state that serves no I/O answers its
	// status before the backend, without DNR, so the host retries on
	// another path. One atomic load; 0 (served) without ANA.
	if st := nvme.Status(c.s.anaIO.Load()); st != nvme.StatusSuccess {
		q.complete(r, st)
		return
	}
	switch nvme.IOOpcode(cmd.Opcode) {
	case nvme.IORead:
		q.read(c, r)
	case nvme.IOWrite:
		q.write(c, r)
	case nvme.IOFlush:
		q.flush(c, r)
	case nvme.IOWriteZeroes:
		q.writeZeroes(c, r)
	case nvme.IODatasetManagement:
		q.dsm(c, r)
	case nvme.IOCompare:
		q.compare(c, r)
	case nvme.IOReservationRegister, nvme.IOReservationAcquire, nvme.IOReservationRelease, nvme.IOReservationReport:
		q.reservation(c, r) // resv_cmd.go
	default:
		q.complete(r, nvme.StatusInvalidOpcode.WithDNR())
	}
}

// finish releases the namespace and completes the request, counting a
// failure against the namespace.
func (q *Queue) finish(ns *namespace, r *Request, s nvme.Status) {
	if s != nvme.StatusSuccess {
		ns.c.errors.Add(1)
	}
	if r.hold.held != 0 {
		ns.locks.release(&r.hold) // rangelock.go
	}
	ns.release()
	q.complete(r, s)
}

// checkRange checks SLBA and the block count against the capacity.
func (ns *namespace) checkRange(slba, blocks uint64) nvme.Status {
	if n := ns.blocks.Load(); slba > n || blocks > n-slba {
		return nvme.StatusLBAOutOfRange.WithDNR()
	}
	return nvme.StatusSuccess
}

// checkData checks a Read, Write or Compare: the transfer within the
// controller's MaxTransfer (MDTS), the SGL length exactly (NLB+1)
// blocks, the range within the namespace. It returns the data buffer.
func (c *ctrl) checkData(ns *namespace, r *Request) ([]byte, nvme.Status) {
	n := uint64(r.Cmd.Blocks()) << ns.shift
	if n > uint64(c.lim.MaxTransfer) {
		return nil, nvme.StatusInvalidField.WithDNR()
	}
	data := r.data()
	if uint64(r.Len) != n || data == nil {
		return nil, nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	return data, ns.checkRange(r.Cmd.SLBA(), uint64(r.Cmd.Blocks()))
}

func (q *Queue) read(c *ctrl, r *Request) {
	ns := c.s.acquireNS(r.Cmd.NSID)
	if ns == nil {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
		return
	}
	if st := q.resvCheck(c, ns, r, false); st != nvme.StatusSuccess {
		q.finish(ns, r, st)
		return
	}
	data, st := c.checkData(ns, r)
	if st != nvme.StatusSuccess {
		q.finish(ns, r, st)
		return
	}
	r.io.set(OpRead, r.Cmd.SLBA(), uint64(len(data))>>ns.shift, data, false)
	q.submit(ns, r, LatencyRead)
}

func (q *Queue) write(c *ctrl, r *Request) {
	ns := c.s.acquireNS(r.Cmd.NSID)
	if ns == nil {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
		return
	}
	if st := q.resvCheck(c, ns, r, true); st != nvme.StatusSuccess {
		q.finish(ns, r, st)
		return
	}
	data, st := c.checkData(ns, r)
	if st == nvme.StatusSuccess && ns.readOnly.Load() {
		st = nvme.StatusNamespaceWriteProtect.WithDNR()
	}
	if st != nvme.StatusSuccess {
		q.finish(ns, r, st)
		return
	}
	if q.lockWrite(ns, r, r.Cmd.SLBA(), uint64(len(data))>>ns.shift) {
		q.writeLocked(ns, r, true)
	}
}

// writeLocked goes on with a write that holds its range shared; group:
// it may be gathered in the request's Group (not when resumed by the
// range lock, maybe on another goroutine).
func (q *Queue) writeLocked(ns *namespace, r *Request, group bool) {
	data := r.data()
	fua := r.Cmd.FUA()
	if fua && ns.blocking {
		r.ns = ns
		q.t.pool.submit(r)
		return
	}
	if group && !fua && r.Group != nil && r.Group.add(q, ns, r, data) {
		return // completed now, or by the group's Commit
	}
	r.io.set(OpWrite, r.Cmd.SLBA(), uint64(len(data))>>ns.shift, data, fua)
	lat := LatencyWrite
	if fua {
		lat = LatencyWriteFUA
	}
	q.submit(ns, r, lat)
}

// flush flushes one namespace, or all of them for NSID 0xFFFFFFFF: on a
// sync worker unless the backend's Flush does not block.
func (q *Queue) flush(c *ctrl, r *Request) {
	if r.Len != 0 {
		q.complete(r, nvme.StatusSGLInvalidDataLength.WithDNR())
		return
	}
	if r.Cmd.NSID != nvme.NSIDAll {
		ns := c.s.acquireNS(r.Cmd.NSID)
		if ns == nil {
			q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
			return
		}
		if st := q.resvCheck(c, ns, r, true); st != nvme.StatusSuccess {
			q.finish(ns, r, st)
			return
		}
		if !ns.blocking {
			r.io.set(OpFlush, 0, 0, nil, false)
			q.submit(ns, r, LatencyFlush)
			return
		}
		r.ns = ns
	} else if st := q.resvCheckAll(c, r); st != nvme.StatusSuccess {
		q.complete(r, st)
		return
	}
	q.t.pool.submit(r)
}

// writeZeroes zeroes a range. With DEAC (and no FUA) the range is
// deallocated, which reads back as zeros (DLFEAT).
func (q *Queue) writeZeroes(c *ctrl, r *Request) {
	ns := c.s.acquireNS(r.Cmd.NSID)
	if ns == nil {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
		return
	}
	if st := q.resvCheck(c, ns, r, true); st != nvme.StatusSuccess {
		q.finish(ns, r, st)
		return
	}
	st := nvme.StatusSGLInvalidDataLength.WithDNR()
	if r.Len == 0 {
		st = ns.checkRange(r.Cmd.SLBA(), uint64(r.Cmd.Blocks()))
	}
	if st == nvme.StatusSuccess && ns.readOnly.Load() {
		st = nvme.StatusNamespaceWriteProtect.WithDNR()
	}
	if st != nvme.StatusSuccess {
		q.finish(ns, r, st)
		return
	}
	if q.lockWrite(ns, r, r.Cmd.SLBA(), uint64(r.Cmd.Blocks())) {
		q.writeZeroesLocked(ns, r)
	}
}

// writeZeroesLocked goes on with a Write Zeroes that holds its range.
func (q *Queue) writeZeroesLocked(ns *namespace, r *Request) {
	fua := r.Cmd.FUA()
	if fua && ns.blocking {
		r.ns = ns
		q.t.pool.submit(r)
		return
	}
	slba, n := r.Cmd.SLBA(), uint64(r.Cmd.Blocks())
	if r.Cmd.DEAC() && !fua {
		r.io.set(OpDeallocate, slba, n, nil, false)
		q.submit(ns, r, LatencyDeallocate)
		return
	}
	r.io.set(OpWriteZeroes, slba, n, nil, fua)
	q.submit(ns, r, LatencyWriteZeroes)
}

// dsm serves Dataset Management: with AD, each of the NR+1 ranges is
// deallocated, one IO after the other (dsmNext); without, the hints are
// accepted and ignored. The data may be longer than the ranges (Linux
// always sends 4096 bytes).
func (q *Queue) dsm(c *ctrl, r *Request) {
	ns := c.s.acquireNS(r.Cmd.NSID)
	if ns == nil {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
		return
	}
	if st := q.resvCheck(c, ns, r, true); st != nvme.StatusSuccess {
		q.finish(ns, r, st)
		return
	}
	nr := r.Cmd.DSMRanges()
	data := r.data()
	if data == nil || len(data) < nr*nvme.DSMRangeSize {
		q.finish(ns, r, nvme.StatusSGLInvalidDataLength.WithDNR())
		return
	}
	if r.Cmd.CDW11&nvme.DSMAD == 0 {
		q.finish(ns, r, nvme.StatusSuccess)
		return
	}
	if ns.readOnly.Load() {
		q.finish(ns, r, nvme.StatusNamespaceWriteProtect.WithDNR())
		return
	}
	// Check every range before deallocating any.
	var rg nvme.DSMRange
	for i := range nr {
		_ = rg.Unmarshal(data[i*nvme.DSMRangeSize:])
		if st := ns.checkRange(rg.SLBA, uint64(rg.NLB)); st != nvme.StatusSuccess {
			q.finish(ns, r, st)
			return
		}
	}
	r.io.step = 0
	if !q.dsmNext(ns, r) {
		ns.c.deallocates.Add(1)
		q.finish(ns, r, nvme.StatusSuccess)
	}
}

// isDSM reports whether r is a Dataset Management (its IOs are its
// ranges').
func isDSM(r *Request) bool { return nvme.IOOpcode(r.Cmd.Opcode) == nvme.IODatasetManagement }

// dsmNext submits the deallocation of the next non-empty range from
// r.io.step on; false when none is left.
func (q *Queue) dsmNext(ns *namespace, r *Request) bool {
	data := r.data()
	var rg nvme.DSMRange
	for i := r.io.step; i < r.Cmd.DSMRanges(); i++ {
		_ = rg.Unmarshal(data[i*nvme.DSMRangeSize:])
		if rg.NLB == 0 {
			continue
		}
		r.io.step = i // if it parks, it is resumed at this range
		if r.hold.held == 0 && !q.lockWrite(ns, r, rg.SLBA, uint64(rg.NLB)) {
			return true // parked: r is the lock's now
		}
		r.io.step = i + 1
		r.io.set(OpDeallocate, rg.SLBA, uint64(rg.NLB), nil, false)
		q.submit(ns, r, LatencyDeallocate)
		return true
	}
	return false
}

// compare compares the command's data with the stored blocks: Compare
// Failure on the first difference. A backend with View is looked at in
// place; any other is read into a pooled buffer (ioDone compares).
func (q *Queue) compare(c *ctrl, r *Request) {
	ns := c.s.acquireNS(r.Cmd.NSID)
	if ns == nil {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
		return
	}
	if st := q.resvCheck(c, ns, r, false); st != nvme.StatusSuccess {
		q.finish(ns, r, st)
		return
	}
	data, st := c.checkData(ns, r)
	if st != nvme.StatusSuccess {
		q.finish(ns, r, st)
		return
	}
	if ns.viewer == nil {
		bp, _ := compareBufs.Get().(*[]byte)
		if bp == nil || cap(*bp) < len(data) {
			b := make([]byte, len(data))
			bp = &b
		}
		r.io.set(OpRead, r.Cmd.SLBA(), uint64(len(data))>>ns.shift, (*bp)[:len(data)], false)
		r.io.cmpBuf = bp
		q.submit(ns, r, LatencyRead)
		return
	}
	st = ns.view(r, r.Cmd.SLBA(), data)
	if st == nvme.StatusSuccess {
		ns.c.compares.Add(1)
		ns.c.readBytes.Add(uint64(len(data)))
	}
	q.finish(ns, r, st)
}

// compareBufs holds read buffers for Compare on backends without View.
var compareBufs sync.Pool

// compareStatus is Compare's outcome for stored blocks got and the
// command's data.
func compareStatus(got, data []byte) nvme.Status {
	if !bytes.Equal(got, data) {
		return nvme.StatusCompareFailure.WithDNR()
	}
	return nvme.StatusSuccess
}

// view compares data with the blocks at slba through the backend's
// Viewer, timed as a read (the comparison included). The visit function
// is r's (viewCmp), made once per request: none per command.
func (ns *namespace) view(r *Request, slba uint64, data []byte) nvme.Status {
	start := time.Now()
	defer ns.c.lat[LatencyRead].since(start)
	vc := r.viewCmp()
	vc.data, vc.slba, vc.bs, vc.same = data, slba, uint64(ns.bs), true
	err := ns.viewer.View(slba, uint64(len(data))>>ns.shift, vc.fn)
	same := vc.same
	vc.data = nil
	if err != nil {
		return statusOf(err)
	}
	if !same {
		return nvme.StatusCompareFailure.WithDNR()
	}
	return nvme.StatusSuccess
}

// viewCompare is a request's Compare through a Viewer: fn (its visit)
// compares each block the Viewer shows with the command's data.
type viewCompare struct {
	data     []byte
	slba, bs uint64
	same     bool
	fn       func(lba uint64, b []byte)
}

// viewCmp returns r's viewCompare, made on first use.
func (r *Request) viewCmp() *viewCompare {
	if r.vc == nil {
		r.vc = &viewCompare{}
		r.vc.fn = r.vc.visit
	}
	return r.vc
}

func (vc *viewCompare) visit(lba uint64, b []byte) {
	want := vc.data[(lba-vc.slba)*vc.bs : (lba-vc.slba+1)*vc.bs]
	if b == nil {
		for _, x := range want {
			vc.same = vc.same && x == 0
		}
	} else {
		vc.same = vc.same && bytes.Equal(b, want)
	}
}

// runSync submits a command handed to a sync worker (a Blocking
// backend's Flush or FUA, or a Flush of every namespace): the backend
// completes it on the worker.
func (t *Target) runSync(r *Request) {
	q, ns := r.q, r.ns
	r.ns = nil
	r.io.sync = true // not on the poll group: the backend may block, has no poller
	c := &r.Cmd
	switch nvme.IOOpcode(c.Opcode) {
	case nvme.IOWrite:
		data := r.data()
		r.io.set(OpWrite, c.SLBA(), uint64(len(data))>>ns.shift, data, true)
		q.submit(ns, r, LatencyWriteFUA)
	case nvme.IOWriteZeroes:
		r.io.set(OpWriteZeroes, c.SLBA(), uint64(c.Blocks()), nil, true)
		q.submit(ns, r, LatencyWriteZeroes)
	case nvme.IOFlush:
		if ns == nil {
			r.io.sync = false // no IO: ioDone will not reset it
			q.complete(r, q.ctrl.Load().s.flushAll())
			return
		}
		r.io.set(OpFlush, 0, 0, nil, false)
		q.submit(ns, r, LatencyFlush)
	default:
		q.finish(ns, r, nvme.StatusInternalError.WithDNR()) // not reached: only the above are queued
	}
}

// abortSync completes a queued command without running it (the target
// closed).
func (t *Target) abortSync(r *Request) {
	q, ns := r.q, r.ns
	r.ns = nil
	if r.pair != nil {
		q.pairEnd(ns, r, nvme.StatusAbortSQDeleted, nvme.StatusAbortSQDeleted) // fused.go
		return
	}
	if ns != nil && r.hold.held != 0 {
		ns.locks.release(&r.hold)
	}
	if ns != nil {
		ns.release()
	}
	q.complete(r, nvme.StatusAbortSQDeleted)
}

// flushAll flushes every namespace (Flush with NSID 0xFFFFFFFF). The
// first failure is the status.
func (s *Subsystem) flushAll() nvme.Status {
	st := nvme.StatusSuccess
	for _, ns := range s.table().list {
		if !ns.acquire() {
			continue
		}
		if fs := ns.flush(); fs != nvme.StatusSuccess {
			ns.c.errors.Add(1)
			if st == nvme.StatusSuccess {
				st = fs
			}
		} else {
			ns.c.flushes.Add(1)
		}
		ns.release()
	}
	return st
}

// flush flushes the namespace's backend and waits, timed: for a Flush
// of every namespace on a sync worker.
func (ns *namespace) flush() nvme.Status {
	start := time.Now()
	err := ns.flushWait()
	ns.c.lat[LatencyFlush].since(start)
	return statusOf(err)
}

// flushWait flushes the namespace's backend and waits for it: a sync
// backend's Flush, or an IO of its own (allocated: Flush of every
// namespace and a controller's shutdown are not the I/O path).
func (ns *namespace) flushWait() error {
	if ns.backend != nil {
		return ns.backend.Flush()
	}
	io := &IO{Op: OpFlush, wait: make(chan struct{}, 1)}
	io.phase.Store(ioSubmitting)
	ns.io.Submit(io)
	if io.phase.CompareAndSwap(ioSubmitting, ioAtBackend) {
		<-io.wait
	}
	return io.err
}
