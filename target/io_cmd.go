package target

import (
	"bytes"
	"sync"
	"time"

	"github.com/blk-project/blk/nvme"
)

// The I/O path. Reads, plain writes, Write Zeroes and Dataset Management
// without FUA, and Compare run inline on the binding's goroutine; Flush,
// FUA writes and FUA Write Zeroes go to the sync workers. Nothing here
// allocates or takes a mutex on success: the controller's state, the
// namespace table and the namespace's reference count are atomics, and
// the backend's own locks are the backend's (a volume takes its RWMutex
// shared). Every backend call is timed into the namespace's latency
// histograms (two clock reads and two atomic adds).

// execIO serves an I/O queue.
func (q *Queue) execIO(r *Request) {
	c := q.ctrl.Load()
	c.sawCommand()
	cmd := &r.Cmd
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
	data, st := c.checkData(ns, r)
	if st == nvme.StatusSuccess {
		start := time.Now()
		err := ns.backend.Read(r.Cmd.SLBA(), data)
		ns.c.lat[LatencyRead].since(start)
		st = statusOf(err)
		if st == nvme.StatusSuccess {
			ns.c.reads.Add(1)
			ns.c.readBytes.Add(uint64(len(data)))
		}
	}
	q.finish(ns, r, st)
}

func (q *Queue) write(c *ctrl, r *Request) {
	ns := c.s.acquireNS(r.Cmd.NSID)
	if ns == nil {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
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
	if r.Cmd.FUA() {
		r.ns = ns
		q.t.pool.submit(r)
		return
	}
	if r.Group != nil && r.Group.add(q, ns, r, data) {
		return // completed now, or by the group's Commit
	}
	start := time.Now()
	err := ns.backend.Write(r.Cmd.SLBA(), data, false)
	ns.c.lat[LatencyWrite].since(start)
	st = statusOf(err)
	if st == nvme.StatusSuccess {
		ns.c.writes.Add(1)
		ns.c.writeBytes.Add(uint64(len(data)))
	}
	q.finish(ns, r, st)
}

// flush flushes one namespace, or all of them for NSID 0xFFFFFFFF, on a
// sync worker.
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
		r.ns = ns
	}
	q.t.pool.submit(r)
}

// writeZeroes zeroes a range: inline unless FUA. With DEAC (and no FUA)
// the range is deallocated, which reads back as zeros (DLFEAT).
func (q *Queue) writeZeroes(c *ctrl, r *Request) {
	ns := c.s.acquireNS(r.Cmd.NSID)
	if ns == nil {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
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
	if r.Cmd.FUA() {
		r.ns = ns
		q.t.pool.submit(r)
		return
	}
	slba, n := r.Cmd.SLBA(), uint64(r.Cmd.Blocks())
	start := time.Now()
	if r.Cmd.DEAC() {
		err := ns.backend.Deallocate(slba, n)
		ns.c.lat[LatencyDeallocate].since(start)
		st = statusOf(err)
		if st == nvme.StatusSuccess {
			ns.c.deallocates.Add(1)
			ns.c.deallocBlocks.Add(n)
		}
	} else {
		err := ns.backend.WriteZeroes(slba, n, false)
		ns.c.lat[LatencyWriteZeroes].since(start)
		st = statusOf(err)
		if st == nvme.StatusSuccess {
			ns.c.writeZeroes.Add(1)
		}
	}
	q.finish(ns, r, st)
}

// dsm serves Dataset Management: with AD, each of the NR+1 ranges is
// deallocated; without, the hints are accepted and ignored. The data may
// be longer than the ranges (Linux always sends 4096 bytes).
func (q *Queue) dsm(c *ctrl, r *Request) {
	ns := c.s.acquireNS(r.Cmd.NSID)
	if ns == nil {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
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
	for i := range nr {
		_ = rg.Unmarshal(data[i*nvme.DSMRangeSize:])
		if rg.NLB == 0 {
			continue
		}
		start := time.Now()
		err := ns.backend.Deallocate(rg.SLBA, uint64(rg.NLB))
		ns.c.lat[LatencyDeallocate].since(start)
		if st := statusOf(err); st != nvme.StatusSuccess {
			q.finish(ns, r, st)
			return
		}
		ns.c.deallocBlocks.Add(uint64(rg.NLB))
	}
	ns.c.deallocates.Add(1)
	q.finish(ns, r, nvme.StatusSuccess)
}

// compare compares the command's data with the stored blocks: Compare
// Failure on the first difference.
func (q *Queue) compare(c *ctrl, r *Request) {
	ns := c.s.acquireNS(r.Cmd.NSID)
	if ns == nil {
		q.complete(r, nvme.StatusInvalidNamespace.WithDNR())
		return
	}
	data, st := c.checkData(ns, r)
	if st == nvme.StatusSuccess {
		st = ns.compare(r.Cmd.SLBA(), data)
		if st == nvme.StatusSuccess {
			ns.c.compares.Add(1)
			ns.c.readBytes.Add(uint64(len(data)))
		}
	}
	q.finish(ns, r, st)
}

// compareBufs holds read buffers for Compare on backends without View.
var compareBufs sync.Pool

// compare compares data with the blocks at slba, timed as a read (the
// comparison, a memcmp beside the backend's read, included).
func (ns *namespace) compare(slba uint64, data []byte) nvme.Status {
	start := time.Now()
	defer ns.c.lat[LatencyRead].since(start)
	if ns.viewer != nil {
		same := true
		bs := uint64(ns.bs)
		err := ns.viewer.View(slba, uint64(len(data))>>ns.shift, func(lba uint64, b []byte) {
			want := data[(lba-slba)*bs : (lba-slba+1)*bs]
			if b == nil {
				for _, x := range want {
					same = same && x == 0
				}
			} else {
				same = same && bytes.Equal(b, want)
			}
		})
		if err != nil {
			return statusOf(err)
		}
		if !same {
			return nvme.StatusCompareFailure.WithDNR()
		}
		return nvme.StatusSuccess
	}
	bp, _ := compareBufs.Get().(*[]byte)
	if bp == nil || cap(*bp) < len(data) {
		b := make([]byte, len(data))
		bp = &b
	}
	defer compareBufs.Put(bp)
	buf := (*bp)[:len(data)]
	if err := ns.backend.Read(slba, buf); err != nil {
		return statusOf(err)
	}
	if !bytes.Equal(buf, data) {
		return nvme.StatusCompareFailure.WithDNR()
	}
	return nvme.StatusSuccess
}

// runSync executes a command handed to a sync worker and completes it.
func (t *Target) runSync(r *Request) {
	q, ns := r.q, r.ns
	r.ns = nil
	c := &r.Cmd
	var st nvme.Status
	switch nvme.IOOpcode(c.Opcode) {
	case nvme.IOWrite:
		data := r.data()
		start := time.Now()
		err := ns.backend.Write(c.SLBA(), data, true)
		ns.c.lat[LatencyWriteFUA].since(start)
		st = statusOf(err)
		if st == nvme.StatusSuccess {
			ns.c.writes.Add(1)
			ns.c.fuaWrites.Add(1)
			ns.c.writeBytes.Add(uint64(len(data)))
		}
	case nvme.IOWriteZeroes:
		start := time.Now()
		err := ns.backend.WriteZeroes(c.SLBA(), uint64(c.Blocks()), true)
		ns.c.lat[LatencyWriteZeroes].since(start)
		st = statusOf(err)
		if st == nvme.StatusSuccess {
			ns.c.writeZeroes.Add(1)
		}
	case nvme.IOFlush:
		if ns == nil {
			st = q.ctrl.Load().s.flushAll()
			q.complete(r, st)
			return
		}
		st = ns.flush()
		if st == nvme.StatusSuccess {
			ns.c.flushes.Add(1)
		}
	default:
		st = nvme.StatusInternalError.WithDNR() // not reached: only the above are queued
	}
	q.finish(ns, r, st)
}

// abortSync completes a queued command without running it (the target
// closed).
func (t *Target) abortSync(r *Request) {
	q, ns := r.q, r.ns
	r.ns = nil
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

// flush flushes the namespace's backend, timed.
func (ns *namespace) flush() nvme.Status {
	start := time.Now()
	err := ns.backend.Flush()
	ns.c.lat[LatencyFlush].since(start)
	return statusOf(err)
}
