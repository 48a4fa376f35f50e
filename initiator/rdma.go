package initiator

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/transport"
)

// The NVMe/RDMA wire of a queue: one QP of the controller's transport
// engine (shared/docs/nvmeof-wire.md §6).
//
// Each request slot owns a region of a per-queue registered buffer,
// registered once with remote read and remote write access; the keyed SGL
// (0x40) names it with the region's static rkey, so no memory
// registration happens per I/O. Because keys are static, the target must
// answer with a plain Send: a Send with Invalidate is a protocol error.

// rdmaSlot is a slot's part of the registered region.
type rdmaSlot struct {
	sqeSGE   transport.SGE // the capsule's SQE
	dataAddr uint64        // virtual address of data[0]
	lkey     uint32
	rkey     uint32
	sges     [2]transport.SGE
}

// recvSlot is one receive of the admin queue's private receive queue.
type recvSlot struct {
	q   *queue
	sge [1]transport.SGE
	buf []byte
}

// rdmaWire is a queue's QP and its registered memory.
type rdmaWire struct {
	q    *queue
	eng  *transport.Engine
	qp   transport.QP
	core *transport.Core
	mr   transport.MemoryRegion
	mem  []byte

	recvMR transport.MemoryRegion // admin queue: private receives
	recvs  []recvSlot

	closeOnce sync.Once
	// pairMu keeps a fused pair's two SENDs adjacent (sendPair).
	pairMu sync.RWMutex
}

// newRDMAWire builds the queue's slots over one registered region laid
// out as [depth × 64-byte SQEs, padded to 4 KiB][depth × bufSize data].
// The region is provider-owned memory (PD.AllocateMemory), registered
// with remote read (the controller RDMA-READs write data) and remote
// write (it RDMA-WRITEs read data) once, for the life of the queue; it
// is given back only when no slot is held (see releaseMemory).
func newRDMAWire(q *queue, pd transport.PD, eng *transport.Engine) (*rdmaWire, error) {
	w := &rdmaWire{q: q, eng: eng}
	sqeArea := (q.depth*nvme.SQESize + 4095) &^ 4095
	size := sqeArea + q.depth*q.bufSize
	mr, err := pd.AllocateMemory(size, transport.AccessLocalWrite|transport.AccessRemoteRead|transport.AccessRemoteWrite)
	if err != nil {
		return nil, fmt.Errorf("register queue %d buffers (%d bytes): %w", q.qid, size, err)
	}
	w.mr = mr
	w.mem = mr.Bytes()
	base, lkey, rkey := mr.Addr(), mr.LKey(), mr.RKey()
	q.initSlots()
	for i := range q.slots {
		s := &q.slots[i]
		off := i * nvme.SQESize
		s.sqe = (*[nvme.SQESize]byte)(w.mem[off : off+nvme.SQESize])
		s.rdma.sqeSGE = transport.SGE{Addr: base + uint64(off), Length: nvme.SQESize, LKey: lkey}
		doff := sqeArea + i*q.bufSize
		s.data = w.mem[doff : doff+q.bufSize : doff+q.bufSize]
		s.rdma.dataAddr = base + uint64(doff)
		s.rdma.lkey, s.rdma.rkey = lkey, rkey
	}
	q.w = w
	return w, nil
}

// place decides where the data goes, as Linux's nvme_rdma_map_data does:
//
//   - no data: the keyed "no data" descriptor (0x40, all zero);
//   - host to controller, n ≤ the queue's in-capsule size: in the same
//     SEND as the SQE, SGL 0x01 at offset 0 (I/O queues only);
//   - otherwise a keyed SGL 0x40 naming the slot's buffer with the
//     region's static rkey; the controller RDMA-READs (writes) or
//     RDMA-WRITEs (reads) it.
func (w *rdmaWire) place(s *slot, dir nvme.Direction, n int) int {
	switch {
	case dir == nvme.DirNone:
		s.cmd.DPTR = noDataSGL
	case dir == nvme.DirHostToCtrl && n <= w.q.inCapsule:
		s.cmd.DPTR = nvme.InCapsuleSGL(0, uint32(n))
		return n
	default:
		s.cmd.DPTR = nvme.KeyedSGL(s.rdma.dataAddr, uint32(n), s.rdma.rkey, false)
	}
	return 0
}

// send posts one SEND: the SQE, then the in-capsule data if any.
func (w *rdmaWire) send(s *slot) error {
	w.pairMu.RLock()
	err := w.post(s, 0)
	w.pairMu.RUnlock()
	return err
}

// sendPair posts both SENDs with one doorbell (the first deferred), under
// pairMu held exclusive so that no other submitter's SEND lands between
// them; other sends hold it shared.
func (w *rdmaWire) sendPair(s1, s2 *slot) error {
	w.pairMu.Lock()
	defer w.pairMu.Unlock()
	if err := w.post(s1, transport.FlagDefer); err != nil {
		return err
	}
	return w.post(s2, 0)
}

// post posts slot s's capsule SEND.
func (w *rdmaWire) post(s *slot, flags transport.PostFlags) error {
	k := 1
	s.rdma.sges[0] = s.rdma.sqeSGE
	if s.inline > 0 {
		s.rdma.sges[1] = transport.SGE{Addr: s.rdma.dataAddr, Length: uint32(s.inline), LKey: s.rdma.lkey}
		k = 2
	}
	return w.qp.Send(s, s.rdma.sges[:k], flags)
}

func (w *rdmaWire) close() {
	w.closeOnce.Do(func() {
		if w.qp != nil && w.eng != nil {
			w.eng.CloseQP(w.qp)
		}
	})
}

func (w *rdmaWire) release() {
	if w.mr != nil {
		w.mr.Close()
	}
	if w.recvMR != nil {
		w.recvMR.Close()
	}
}

// connectRDMA creates queue q's QP (placed by the engine) and makes the
// RDMA CM connection with the NVMe/RDMA private data.
func (a *association) connectRDMA(ctx context.Context, q *queue, w *rdmaWire) error {
	c := a.c
	var err error
	if q.qid == 0 {
		if w.qp, w.core, err = c.eng.CreateQPWithReceiveQueue(q, c.sz.AdminInitiator, 0, c.sz.AdminRecv); err != nil {
			return fmt.Errorf("initiator: create admin QP: %w", err)
		}
		if err = w.postAdminReceives(c.pd, int(c.sz.AdminRecv)); err != nil {
			return err
		}
	} else if w.qp, w.core, err = c.eng.CreateQP(q, c.sz.IOInitiator, 0); err != nil {
		return fmt.Errorf("initiator: create QP for queue %d: %w", q.qid, err)
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	defer cancel()
	priv := cmRequest(q.qid, q.depth, a.cntlid)
	acc, err := c.cfg.Adapter.Connect(cctx, w.qp, c.addr, transport.ConnParams{PrivateData: priv[:]})
	if err != nil {
		var rej *transport.RejectError
		var r nvme.RDMACMReject
		if errors.As(err, &rej) && r.Unmarshal(rej.PrivateData) == nil {
			return fmt.Errorf("initiator: queue %d: RDMA CM connect rejected: %v (status %#x): %w", q.qid, r.Status, uint16(r.Status), err)
		}
		return fmt.Errorf("initiator: queue %d: RDMA CM connect to %s: %w", q.qid, c.addr, err)
	}
	var accept nvme.RDMACMAccept
	if accept.Unmarshal(acc) == nil && int(accept.CRQSize) < q.depth {
		// Linux ignores CRQSIZE; note it.
		c.logf("queue %d: controller receive queue %d smaller than depth %d", q.qid, accept.CRQSize, q.depth)
	}
	a.wg.Add(1)
	go a.watch(q, w)
	return nil
}

// postAdminReceives gives the admin QP its own receive buffers.
func (w *rdmaWire) postAdminReceives(pd transport.PD, n int) error {
	mr, err := pd.AllocateMemory(n*responseSize, transport.AccessLocalWrite)
	if err != nil {
		return fmt.Errorf("initiator: register admin receives: %w", err)
	}
	w.recvMR = mr
	mem := mr.Bytes()
	w.recvs = make([]recvSlot, n)
	for i := range w.recvs {
		r := &w.recvs[i]
		r.q = w.q
		r.buf = mem[i*responseSize : (i+1)*responseSize]
		r.sge[0] = mr.SGE(uint32(i*responseSize), responseSize)
		if err := w.qp.PostReceive(r, r.sge[:]); err != nil {
			return fmt.Errorf("initiator: post admin receive: %w", err)
		}
	}
	return nil
}

// watch fails the association when the queue's QP ends.
func (a *association) watch(q *queue, w *rdmaWire) {
	defer a.wg.Done()
	select {
	case <-w.qp.Done():
		err := w.qp.Err()
		if err == nil {
			err = transport.ErrDisconnected
		}
		a.fail(fmt.Errorf("queue %d: connection ended: %w", q.qid, err))
	case <-a.done:
	}
}

// onReceive handles a response capsule that arrived in msg. It returns the
// slot to complete (with its state) once the receive buffer has been given
// back, or nil.
func (q *queue) onReceive(comp *transport.Completion, msg []byte) (*slot, uint32) {
	if q.dead.Load() {
		return nil, 0
	}
	a := q.a
	switch {
	case comp.Status != nil:
		a.fail(fmt.Errorf("receive on queue %d: %w", q.qid, comp.Status))
		return nil, 0
	case comp.Invalidated:
		// Keys are static: nothing may be invalidated remotely.
		a.fail(fmt.Errorf("%w: queue %d: remote invalidation of key %#x, but no key was registered per command",
			ErrProtocol, q.qid, comp.InvalidatedKey))
		return nil, 0
	case len(msg) != responseSize:
		a.fail(fmt.Errorf("%w: queue %d: response capsule of %d bytes, want %d", ErrProtocol, q.qid, len(msg), responseSize))
		return nil, 0
	}
	var cqe nvme.Completion
	cqe.Unmarshal(msg)
	s, st := q.response(&cqe)
	if s == nil || st&flagSent == 0 {
		return nil, 0 // the send completion comes later
	}
	return s, st
}

// onSent handles the completion of a capsule's SEND. The send completion
// of a slot always comes before its reuse (a slot completes only once
// both events are in), so the slot's generation is current.
func (q *queue) onSent(s *slot, comp *transport.Completion) {
	if q.dead.Load() {
		return
	}
	if comp.Status != nil {
		q.a.fail(fmt.Errorf("send on queue %d: %w", q.qid, comp.Status))
		return
	}
	q.sent(s, uint8(s.state.Load()>>stateGenShift))
}

// repostAdmin gives an admin receive back to the QP's own receive queue.
func (q *queue) repostAdmin(r *recvSlot) {
	if q.dead.Load() {
		return
	}
	w := q.w.(*rdmaWire)
	if err := w.qp.PostReceive(r, r.sge[:]); err != nil && !q.dead.Load() {
		q.a.fail(fmt.Errorf("repost admin receive: %w", err))
	}
}

// HandleCompletion is the engine's Handler: it runs on the notification
// goroutine of the core the completion's QP is placed on, one completion
// at a time, and never blocks.
func (c *Controller) HandleCompletion(core *transport.Core, comp *transport.Completion) {
	switch comp.Type {
	case transport.OpReceive:
		if b := core.RecvBuf(comp); b != nil {
			var s *slot
			var st uint32
			q, _ := comp.QPContext.(*queue)
			if q != nil {
				s, st = q.onReceive(comp, b.Bytes()[:min(int(comp.Bytes), len(b.Bytes()))])
			}
			// Give the buffer back before the slot frees: see engineSizing.
			b.Repost()
			if s != nil {
				q.finish(s, st)
			}
			return
		}
		if r, ok := comp.RequestContext.(*recvSlot); ok {
			q := r.q
			s, st := q.onReceive(comp, r.buf[:min(int(comp.Bytes), len(r.buf))])
			if comp.Status == nil {
				q.repostAdmin(r)
			}
			if s != nil {
				q.finish(s, st)
			}
		}
	case transport.OpSend:
		if s, ok := comp.RequestContext.(*slot); ok {
			s.q.onSent(s, comp)
		}
	}
}

// HandleCQError fails the current association: the core's QPs fail.
func (c *Controller) HandleCQError(core *transport.Core, err error) {
	if a := c.assoc.Load(); a != nil {
		a.fail(fmt.Errorf("completion queue of core %d: %w", core.Index(), err))
	}
}
