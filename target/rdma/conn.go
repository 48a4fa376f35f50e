package rdma

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/transport"
)

// conn is one accepted QP: one NVMe queue. It is the core's Responder.
type conn struct {
	port    *Port
	qp      transport.QP
	core    *coreState
	q       *target.Queue
	admin   bool
	qid     uint16
	entries uint32
	remote  string // the host's address

	// closedBy is the reason the target gave when it disconnected the
	// connection; nil while it has not (the host closed, or the
	// connection failed).
	closedBy atomic.Pointer[error]

	// sqhd is the SQ head reported in completions: incremented per
	// completion, modulo the queue size, as the Linux target does (hosts
	// ignore it on fabrics).
	sqhd atomic.Uint32
	dead atomic.Bool

	// seq and prevFuse stamp each capsule, on the conn's core
	// (target.Request.Seq and PrevFuse).
	seq      uint32
	prevFuse uint8
	// firstRun has bit Seq mod its length set for a fused first that
	// has executed (its second may take a buffer; fused.go), cleared
	// when the next capsule of that bit arrives. The conn's core only.
	firstRun target.FirstRun

	// Admin queues only: private receive buffers and their requests.
	amr  transport.MemoryRegion
	areq []req

	disconnectOnce sync.Once
	teardownOnce   sync.Once
}

// createAdminQP creates an admin queue's QP with a private receive queue
// of AdminQueueEntries buffers, so that an admin queue never competes with
// data queues for the core's SRQ (a connecting host always gets its
// Connect through), and posts the buffers.
func (p *Port) createAdminQP(c *conn) (transport.QP, *coreState, error) {
	qp, core, err := p.engine.CreateQPWithReceiveQueue(c, p.size.SendSlots*AdminQueueEntries, nvme.CQESize, AdminQueueEntries)
	if err != nil {
		return nil, nil, err
	}
	cs := p.cores[core.Index()]
	size := p.size.AdminBufferSize
	// Provider-owned: closed in teardown once the queue has drained (or
	// in destroy, when no command ever ran), never while a command's
	// response may still be built in it.
	mr, err := p.engine.PD().AllocateMemory(AdminQueueEntries*int(size), transport.AccessLocalWrite)
	if err != nil {
		core.CloseQP(qp)
		return nil, nil, fmt.Errorf("register admin buffers: %w", err)
	}
	c.amr = mr
	c.areq = make([]req, AdminQueueEntries)
	reg := mr.Bytes()
	for i := range c.areq {
		r := &c.areq[i]
		off := uint32(i) * size
		r.init(cs)
		r.buf = reg[off : off+size : off+size]
		r.inl = r.buf[capsuleSize:]
		r.sge[0] = mr.SGE(off, size)
		r.ownRQ = true
		if err := qp.PostReceive(r, r.sge[:]); err != nil {
			core.CloseQP(qp)
			mr.Close()
			return nil, nil, fmt.Errorf("post admin receive: %w", err)
		}
	}
	return qp, cs, nil
}

// Complete implements target.Responder: RDMA WRITE of read data (if the
// command succeeded and reads), then the response capsule, sent inline so
// that the receive buffer it is built in is reposted at once.
func (c *conn) Complete(tr *target.Request) {
	r := tr.Binding.(*req)
	r.complete()
}

// Disconnect implements target.Responder.
func (c *conn) Disconnect(reason error) {
	c.disconnectOnce.Do(func() {
		c.port.textf("rdma: queue %d on %s: disconnect: %v", c.qid, c.port.ln.Addr(), reason)
		c.closedBy.Store(&reason)
		c.dead.Store(true)
		// An orderly disconnect drains the socket; never on the
		// caller's goroutine (a core's notification goroutine).
		go c.qp.Disconnect()
	})
}

// fail drops the connection after a protocol error.
func (c *conn) fail(err error) {
	c.core.st.protocolErrors.Add(1)
	c.Disconnect(err)
}

// watch waits for the connection to end, then tears it down.
func (c *conn) watch() {
	go func() {
		<-c.qp.Done()
		c.dead.Store(true)
		c.logClosed()
		c.teardown()
		c.port.conns.Remove(c)
	}()
}

// teardown closes the core's queue (it completes whatever it holds; those
// completions find the QP gone and only reclaim their buffers), then the
// QP. Completions of the QP still on the CQ find the conn dead and are
// only reclaimed.
func (c *conn) teardown() {
	c.teardownOnce.Do(func() {
		c.dead.Store(true)
		if c.q == nil {
			c.destroy()
			return
		}
		c.q.Close()
		if err := c.core.core.CloseQP(c.qp); err != nil && !errors.Is(err, transport.ErrClosed) {
			c.port.logf("rdma: close QP of queue %d: %v", c.qid, err)
		}
		// Commands still running in the core (a flush on a sync worker)
		// complete later; their responses find the QP closed and only
		// give their buffers back. The admin queue's buffers are freed
		// once the last of them has.
		<-c.q.Drained()
		c.closeAdminBuffers()
	})
}

// destroy closes the QP (flushing what it holds) and the admin buffers.
func (c *conn) destroy() {
	if err := c.core.core.CloseQP(c.qp); err != nil && !errors.Is(err, transport.ErrClosed) {
		c.port.logf("rdma: close QP of queue %d: %v", c.qid, err)
	}
	c.closeAdminBuffers()
}

// closeAdminBuffers gives the admin queue's receive buffers back to the
// provider (they are provider-owned: unmapped, not garbage). The conn is
// dead and its queue drained, so a completion of the closed QP still on
// the CQ is only reclaimed; a Handler call that looked at the conn before
// it died may still be reading a capsule, and Quiesce waits for it.
func (c *conn) closeAdminBuffers() {
	if c.amr == nil {
		return
	}
	c.core.core.Quiesce()
	c.amr.Close()
}
