//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/blk-project/blk/transport"
	"golang.org/x/sys/unix"
)

// QP states; the transitions are in Connect/Accept (idle → connecting →
// connected, back to idle on failure), fail (→ dead) and Close (→ closed).
const (
	qpIdle int32 = iota
	qpConnecting
	qpConnected
	qpDead
	qpClosed
)

// sendSlot is what the provider remembers of an initiator request until
// its completion is polled.
type sendSlot struct {
	ctx    any
	n      uint32
	op     transport.OpType
	silent bool
}

// qp is an RC queue pair.
//
// Every initiator request is posted signaled, whatever FlagSilentSuccess
// says, and a silent success is dropped when polled: a request then holds
// its slot and one entry of its CQ until its own completion is polled (Q4,
// C3), exactly, which unsignaled verbs requests cannot give (their slots
// free only when a later signaled request completes).
//
// Requests live in per-queue slot tables: the ibv_send_wr / ibv_recv_wr
// and its SGE array in C memory, the context in a Go slice, the slot index
// in the low 32 bits of wr_id. FlagDefer requests are linked into a chain
// posted with the next request without it (one doorbell for the batch).
type qp struct {
	a     *Adapter
	pd    *pd
	hw    *C.struct_ibv_qp
	num   uint32
	gen   uint32
	ctx   any
	rcq   *cq
	icq   *cq
	srq   *srq
	state atomic.Int32
	// sendOK: the QP may take initiator requests while still connecting
	// (accepted: InfiniBand/RoCE moved it to RTS, iWARP's CM does before
	// the peer can send).
	sendOK atomic.Bool

	idepth, rdepth, isge, rsge, inline uint32

	smu       sync.Mutex
	swrs      []C.struct_ibv_send_wr
	ssges     []C.struct_ibv_sge
	sslots    []sendSlot
	sfree     []uint32
	sclosed   bool
	deferHead *C.struct_ibv_send_wr
	deferTail *C.struct_ibv_send_wr
	deferred  []uint32
	nposted   *C.int
	bounce    unsafe.Pointer
	bounceMR  *C.struct_ibv_mr

	rmu     sync.Mutex
	rwrs    []C.struct_ibv_recv_wr
	rsges   []C.struct_ibv_sge
	rctx    []any
	rfree   []uint32
	rclosed bool

	cmem unsafe.Pointer // the C allocation behind the slices above

	// Connection: id and the events of its setup, guarded by cmMu.
	cmMu        sync.Mutex
	id          *C.struct_rdma_cm_id
	evc         chan cmEvent
	cmConnected bool
	local       net.Addr
	remote      net.Addr

	failMu sync.Mutex
	err    error
	ended  bool
	done   chan struct{}

	closeOnce sync.Once
}

// CreateQP creates an RC QP (Q1, Q2) and moves it to INIT, so receives can
// be posted before it connects.
func (p *pd) CreateQP(cfg transport.QPConfig) (transport.QP, error) {
	a := p.a
	info := &a.info
	rcq, ok1 := cfg.ReceiveCQ.(*cq)
	icq, ok2 := cfg.InitiatorCQ.(*cq)
	if !ok1 || !ok2 || rcq.a != a || icq.a != a {
		return nil, fmt.Errorf("verbs: CreateQP: CQs %w: %w", errWrongAdapter, transport.ErrInvalidParameter)
	}
	var s *srq
	if cfg.SRQ != nil {
		var ok bool
		if s, ok = cfg.SRQ.(*srq); !ok || s.pd != p {
			return nil, fmt.Errorf("verbs: CreateQP: SRQ of another PD: %w", transport.ErrInvalidParameter)
		}
		cfg.ReceiveQueueDepth, cfg.MaxReceiveRequestSge = 0, 0
	}
	bad := func(what string, v, limit uint32) error {
		return fmt.Errorf("verbs: CreateQP: %s %d > adapter limit %d: %w", what, v, limit, transport.ErrInvalidParameter)
	}
	switch {
	case cfg.ReceiveQueueDepth > info.MaxReceiveQueueDepth:
		return nil, bad("ReceiveQueueDepth", cfg.ReceiveQueueDepth, info.MaxReceiveQueueDepth)
	case cfg.InitiatorQueueDepth > info.MaxInitiatorQueueDepth:
		return nil, bad("InitiatorQueueDepth", cfg.InitiatorQueueDepth, info.MaxInitiatorQueueDepth)
	case cfg.MaxReceiveRequestSge > info.MaxReceiveRequestSge:
		return nil, bad("MaxReceiveRequestSge", cfg.MaxReceiveRequestSge, info.MaxReceiveRequestSge)
	case cfg.MaxInitiatorRequestSge > info.MaxInitiatorRequestSge:
		return nil, bad("MaxInitiatorRequestSge", cfg.MaxInitiatorRequestSge, info.MaxInitiatorRequestSge)
	case cfg.InlineDataSize > info.MaxInlineDataSize:
		return nil, bad("InlineDataSize", cfg.InlineDataSize, info.MaxInlineDataSize)
	}
	q := &qp{
		a: a, pd: p, ctx: cfg.Context, rcq: rcq, icq: icq, srq: s,
		idepth: max(cfg.InitiatorQueueDepth, 1), rdepth: cfg.ReceiveQueueDepth,
		isge: max(cfg.MaxInitiatorRequestSge, 1), rsge: max(cfg.MaxReceiveRequestSge, 1),
		inline: cfg.InlineDataSize,
		done:   make(chan struct{}),
		gen:    qpGen.Add(1) & genMask,
	}
	if err := p.ref(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			q.freeC()
			p.unref()
		}
	}()
	if err := rcq.ref(q); err != nil {
		return nil, err
	}
	defer func() {
		if !ok {
			rcq.unref(q)
		}
	}()
	if err := icq.ref(q); err != nil {
		return nil, err
	}
	defer func() {
		if !ok {
			icq.unref(q)
		}
	}()
	if s != nil {
		if err := s.ref(); err != nil {
			return nil, err
		}
		defer func() {
			if !ok {
				s.unref()
			}
		}()
	}
	if err := q.allocC(); err != nil {
		return nil, err
	}
	var attr C.struct_ibv_qp_init_attr
	attr.send_cq = icq.hw
	attr.recv_cq = rcq.hw
	attr.qp_type = C.IBV_QPT_RC
	attr.sq_sig_all = 1
	attr.cap.max_send_wr = C.uint32_t(q.idepth)
	attr.cap.max_send_sge = C.uint32_t(q.isge)
	if s != nil {
		attr.srq = s.hw
	} else {
		attr.cap.max_recv_wr = C.uint32_t(max(q.rdepth, 1))
		attr.cap.max_recv_sge = C.uint32_t(q.rsge)
	}
	q.hw = C.ibv_create_qp(p.hw, &attr)
	if q.hw == nil {
		return nil, fmt.Errorf("verbs: ibv_create_qp: %w", errnoErr(C.blk_errno()))
	}
	q.num = uint32(q.hw.qp_num)
	if rc := C.blk_modify_qp_init(q.hw, a.port); rc != 0 {
		C.ibv_destroy_qp(q.hw)
		return nil, fmt.Errorf("verbs: QP to INIT: %w", errnoErr(rc))
	}
	if q.inline > 0 {
		n := C.size_t(q.idepth) * C.size_t(q.inline)
		q.bounce = C.calloc(1, n)
		q.bounceMR = C.blk_reg_mr(p.hw, q.bounce, n, C.IBV_ACCESS_LOCAL_WRITE)
		if q.bounceMR == nil {
			err := errnoErr(C.blk_errno())
			C.ibv_destroy_qp(q.hw)
			return nil, fmt.Errorf("verbs: register inline buffers: %w", err)
		}
	}
	a.addQP(q)
	ok = true
	return q, nil
}

// allocC allocates the slot tables: work requests and SGEs in one C block.
func (q *qp) allocC() error {
	swr := C.size_t(unsafe.Sizeof(C.struct_ibv_send_wr{}))
	rwr := C.size_t(unsafe.Sizeof(C.struct_ibv_recv_wr{}))
	sge := C.size_t(unsafe.Sizeof(C.struct_ibv_sge{}))
	rd := q.rdepth
	if q.srq != nil {
		rd = 0
	}
	size := C.size_t(q.idepth)*(swr+C.size_t(q.isge)*sge) + C.size_t(rd)*(rwr+C.size_t(q.rsge)*sge) + 64
	q.cmem = C.calloc(1, size)
	if q.cmem == nil {
		return fmt.Errorf("verbs: %w: QP slot tables (%d bytes)", transport.ErrInsufficientResources, size)
	}
	base := q.cmem
	q.nposted = (*C.int)(base)
	base = unsafe.Add(base, 64)
	q.swrs = unsafe.Slice((*C.struct_ibv_send_wr)(base), q.idepth)
	base = unsafe.Add(base, uintptr(q.idepth)*uintptr(swr))
	q.ssges = unsafe.Slice((*C.struct_ibv_sge)(base), q.idepth*q.isge)
	base = unsafe.Add(base, uintptr(q.idepth*q.isge)*uintptr(sge))
	if rd > 0 {
		q.rwrs = unsafe.Slice((*C.struct_ibv_recv_wr)(base), rd)
		base = unsafe.Add(base, uintptr(rd)*uintptr(rwr))
		q.rsges = unsafe.Slice((*C.struct_ibv_sge)(base), rd*q.rsge)
	}
	q.sslots = make([]sendSlot, q.idepth)
	q.sfree = make([]uint32, q.idepth)
	for i := range q.sfree {
		q.sfree[i] = q.idepth - 1 - uint32(i)
	}
	q.deferred = make([]uint32, 0, q.idepth)
	q.rctx = make([]any, rd)
	q.rfree = make([]uint32, rd)
	for i := range q.rfree {
		q.rfree[i] = rd - 1 - uint32(i)
	}
	return nil
}

func (q *qp) freeC() {
	if q.bounceMR != nil {
		C.ibv_dereg_mr(q.bounceMR)
		q.bounceMR = nil
	}
	if q.bounce != nil {
		C.free(q.bounce)
		q.bounce = nil
	}
	if q.cmem != nil {
		C.free(q.cmem)
		q.cmem = nil
	}
}

func (q *qp) Context() any { return q.ctx }

// setRecvWR fills a preallocated receive work request and its SGE array
// (C memory, one slot's worth) for sges, with the given wr_id: the same
// for a QP's receive queue and an SRQ.
func setRecvWR(wr *C.struct_ibv_recv_wr, sgl []C.struct_ibv_sge, sges []transport.SGE, id C.uint64_t) {
	for i, s := range sges {
		sgl[i].addr, sgl[i].length, sgl[i].lkey = C.uint64_t(s.Addr), C.uint32_t(s.Length), C.uint32_t(s.LKey)
	}
	wr.wr_id = id
	wr.next = nil
	wr.sg_list = &sgl[0]
	wr.num_sge = C.int(len(sges))
}

// PostReceive posts a receive on the QP's own receive queue.
func (q *qp) PostReceive(requestContext any, sges []transport.SGE) error {
	if q.srq != nil {
		return fmt.Errorf("verbs: PostReceive on a QP that takes its receives from an SRQ: %w", transport.ErrInvalidParameter)
	}
	if uint32(len(sges)) > q.rsge {
		return transport.ErrInvalidParameter
	}
	switch q.state.Load() {
	case qpDead:
		return transport.ErrInvalidDeviceState
	case qpClosed:
		return transport.ErrClosed
	}
	if err := q.pd.checkSGEs(sges); err != nil {
		return err
	}
	if !q.rcq.reserve() {
		return transport.ErrInsufficientResources
	}
	q.rmu.Lock()
	if q.rclosed || len(q.rfree) == 0 || q.rdepth == 0 {
		q.rmu.Unlock()
		q.rcq.unreserve(1)
		return transport.ErrInsufficientResources
	}
	slot := q.rfree[len(q.rfree)-1]
	q.rfree = q.rfree[:len(q.rfree)-1]
	wr := &q.rwrs[slot]
	setRecvWR(wr, q.rsges[slot*q.rsge:(slot+1)*q.rsge], sges, wrID(kindRecv, q.gen, slot))
	q.rctx[slot] = requestContext
	rc := C.blk_post_recv(q.hw, wr)
	if rc != 0 {
		q.rctx[slot] = nil
		q.rfree = append(q.rfree, slot)
		q.rmu.Unlock()
		q.rcq.unreserve(1)
		return postErr(rc)
	}
	q.rmu.Unlock()
	return nil
}

func postErr(rc C.int) error {
	if syscall.Errno(rc) == unix.ENOMEM {
		return transport.ErrInsufficientResources
	}
	return fmt.Errorf("%w: post: %v", transport.ErrInvalidDeviceState, syscall.Errno(rc))
}

// releaseRecv frees a receive slot when its completion is polled.
func (q *qp) releaseRecv(slot uint32) (any, bool) {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if q.rclosed || slot >= uint32(len(q.rctx)) {
		return nil, false
	}
	ctx := q.rctx[slot]
	q.rctx[slot] = nil
	q.rfree = append(q.rfree, slot)
	return ctx, true
}

// releaseSend frees an initiator slot when its completion is polled.
func (q *qp) releaseSend(slot uint32) (sendSlot, bool) {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.sclosed || slot >= q.idepth {
		return sendSlot{}, false
	}
	s := q.sslots[slot]
	q.sslots[slot] = sendSlot{}
	q.sfree = append(q.sfree, slot)
	return s, true
}

func (q *qp) Send(requestContext any, sges []transport.SGE, flags transport.PostFlags) error {
	return q.post(requestContext, sges, transport.OpSend, C.IBV_WR_SEND, 0, 0, 0, flags)
}

func (q *qp) SendInvalidate(requestContext any, sges []transport.SGE, remoteKey uint32, flags transport.PostFlags) error {
	return q.post(requestContext, sges, transport.OpSend, C.IBV_WR_SEND_WITH_INV, 0, 0, remoteKey, flags)
}

func (q *qp) Write(requestContext any, sges []transport.SGE, remoteAddr uint64, remoteKey uint32, flags transport.PostFlags) error {
	return q.post(requestContext, sges, transport.OpWrite, C.IBV_WR_RDMA_WRITE, remoteAddr, remoteKey, 0, flags)
}

func (q *qp) Read(requestContext any, sink []transport.SGE, remoteAddr uint64, remoteKey uint32, flags transport.PostFlags) error {
	if uint32(len(sink)) > q.a.maxReadSge {
		return fmt.Errorf("verbs: read into %d SGEs > MaxReadRequestSge %d: %w", len(sink), q.a.maxReadSge, transport.ErrInvalidParameter)
	}
	if flags&transport.FlagInline != 0 {
		return fmt.Errorf("verbs: inline read: %w", transport.ErrInvalidParameter)
	}
	return q.post(requestContext, sink, transport.OpRead, C.IBV_WR_RDMA_READ, remoteAddr, remoteKey, 0, flags)
}

// post is every initiator request. It allocates nothing: the work request
// and its SGEs are written into the slot's C memory.
func (q *qp) post(ctx any, sges []transport.SGE, op transport.OpType, opcode uint32, raddr uint64, rkey, inv uint32, flags transport.PostFlags) error {
	if uint32(len(sges)) > q.isge {
		return fmt.Errorf("verbs: %d SGEs > the QP's MaxInitiatorRequestSge %d: %w", len(sges), q.isge, transport.ErrInvalidParameter)
	}
	var total uint64
	for _, s := range sges {
		total += uint64(s.Length)
	}
	if total > uint64(q.a.info.MaxTransferLength) {
		return fmt.Errorf("verbs: %d bytes > MaxTransferLength %d: %w", total, q.a.info.MaxTransferLength, transport.ErrInvalidParameter)
	}
	inline := flags&transport.FlagInline != 0
	if inline && total > uint64(q.inline) {
		return fmt.Errorf("verbs: inline payload of %d bytes > the QP's InlineDataSize %d: %w", total, q.inline, transport.ErrInvalidParameter)
	}
	switch q.state.Load() {
	case qpConnected:
	case qpConnecting:
		// The passive side's QP is ready to send once accepted: the peer
		// may send (and the consumer answer) before ESTABLISHED arrives.
		if !q.sendOK.Load() {
			return transport.ErrInvalidDeviceState
		}
	case qpClosed:
		return transport.ErrClosed
	default:
		return transport.ErrInvalidDeviceState
	}
	if err := q.pd.checkSGEs(sges); err != nil {
		return err
	}
	if !q.icq.reserve() {
		return transport.ErrInsufficientResources
	}
	q.smu.Lock()
	if q.sclosed || len(q.sfree) == 0 {
		q.smu.Unlock()
		q.icq.unreserve(1)
		return transport.ErrInsufficientResources
	}
	slot := q.sfree[len(q.sfree)-1]
	q.sfree = q.sfree[:len(q.sfree)-1]
	wr := &q.swrs[slot]
	sgl := q.ssges[slot*q.isge : (slot+1)*q.isge]
	nsge := len(sges)
	if inline {
		dst := unsafe.Slice((*byte)(unsafe.Add(q.bounce, uintptr(slot)*uintptr(q.inline))), q.inline)
		off := 0
		for _, s := range sges {
			m := q.pd.lookup(s.LKey)
			o := s.Addr - m.addr
			off += copy(dst[off:], m.buf[o:o+uint64(s.Length)])
		}
		nsge = 0
		if off > 0 {
			sgl[0].addr = C.uint64_t(uintptr(unsafe.Pointer(&dst[0])))
			sgl[0].length = C.uint32_t(off)
			sgl[0].lkey = q.bounceMR.lkey
			nsge = 1
		}
	} else {
		for i, s := range sges {
			sgl[i].addr, sgl[i].length, sgl[i].lkey = C.uint64_t(s.Addr), C.uint32_t(s.Length), C.uint32_t(s.LKey)
		}
	}
	wr.wr_id = wrID(kindSend, q.gen, slot)
	wr.next = nil
	wr.sg_list = &sgl[0]
	wr.num_sge = C.int(nsge)
	wr.opcode = opcode
	sf := C.uint(C.IBV_SEND_SIGNALED)
	if flags&transport.FlagSolicitedEvent != 0 {
		sf |= C.IBV_SEND_SOLICITED
	}
	if flags&transport.FlagReadFence != 0 {
		sf |= C.IBV_SEND_FENCE
	}
	wr.send_flags = sf
	switch opcode {
	case C.IBV_WR_RDMA_WRITE, C.IBV_WR_RDMA_READ:
		C.blk_wr_rdma(wr, C.uint64_t(raddr), C.uint32_t(rkey))
	case C.IBV_WR_SEND_WITH_INV:
		C.blk_wr_invalidate(wr, C.uint32_t(inv))
	}
	q.sslots[slot] = sendSlot{ctx: ctx, n: uint32(total), op: op, silent: flags&transport.FlagSilentSuccess != 0}
	if flags&transport.FlagDefer != 0 {
		if q.deferHead == nil {
			q.deferHead = wr
		} else {
			q.deferTail.next = wr
		}
		q.deferTail = wr
		q.deferred = append(q.deferred, slot)
		q.smu.Unlock()
		return nil
	}
	head := wr
	if q.deferHead != nil {
		q.deferTail.next = wr
		head = q.deferHead
	}
	rc := C.blk_post_send(q.hw, head, q.nposted)
	if rc != 0 {
		// The requests from the refused one on never reached the device.
		n := int(*q.nposted)
		unposted := int64(0)
		i := 0
		for w := head; w != nil; w = w.next {
			if i >= n {
				s := uint32(uint64(w.wr_id))
				q.sslots[s] = sendSlot{}
				q.sfree = append(q.sfree, s)
				unposted++
			}
			i++
		}
		q.deferHead, q.deferTail, q.deferred = nil, nil, q.deferred[:0]
		q.smu.Unlock()
		q.icq.unreserve(unposted)
		return postErr(rc)
	}
	q.deferHead, q.deferTail, q.deferred = nil, nil, q.deferred[:0]
	q.smu.Unlock()
	return nil
}

// Flush cancels every outstanding request: the QP goes to the error state
// (the device flushes what it holds with IBV_WC_WR_FLUSH_ERR, reported as
// ErrCancelled) and deferred requests that never reached the device are
// completed by the provider with ErrCancelled. A verbs QP cannot leave the
// error state, so the connection ends too.
func (q *qp) Flush() error {
	q.fail(fmt.Errorf("%w: flushed", transport.ErrCancelled))
	return nil
}

// Disconnect ends the connection in order: both sides end with
// ErrDisconnected and their outstanding requests complete with
// ErrCancelled.
func (q *qp) Disconnect() error {
	q.fail(transport.ErrDisconnected)
	return nil
}

func (q *qp) Done() <-chan struct{} { return q.done }

func (q *qp) Err() error {
	q.failMu.Lock()
	defer q.failMu.Unlock()
	return q.err
}

func (q *qp) LocalAddr() net.Addr {
	q.cmMu.Lock()
	defer q.cmMu.Unlock()
	return q.local
}

func (q *qp) RemoteAddr() net.Addr {
	q.cmMu.Lock()
	defer q.cmMu.Unlock()
	return q.remote
}

// failAsync fails the QP from the completion path, which must not block.
func (q *qp) failAsync(err error) {
	q.failMu.Lock()
	ended := q.ended
	q.failMu.Unlock()
	if !ended {
		go q.fail(err)
	}
}

// fail ends the QP once: records why, moves the QP to the error state
// (flushing what the device holds), completes never-posted deferred
// requests with ErrCancelled, tells the peer (rdma_disconnect) and closes
// Done.
func (q *qp) fail(err error) {
	q.failMu.Lock()
	if q.ended {
		q.failMu.Unlock()
		return
	}
	q.ended = true
	q.err = err
	q.failMu.Unlock()
	prev := q.state.Load()
	if prev != qpClosed {
		q.state.Store(qpDead)
	}
	C.blk_modify_qp_err(q.hw)
	q.flushDeferred()
	q.cmMu.Lock()
	if q.id != nil && prev == qpConnected {
		C.rdma_disconnect(q.id)
	}
	q.cmMu.Unlock()
	close(q.done)
}

// flushDeferred completes the deferred requests that never reached the
// device with ErrCancelled.
func (q *qp) flushDeferred() {
	q.smu.Lock()
	if len(q.deferred) == 0 {
		q.smu.Unlock()
		return
	}
	slots := make([]sendSlot, 0, len(q.deferred))
	for _, s := range q.deferred {
		slots = append(slots, q.sslots[s])
		q.sslots[s] = sendSlot{}
		q.sfree = append(q.sfree, s)
	}
	q.deferHead, q.deferTail, q.deferred = nil, nil, q.deferred[:0]
	q.smu.Unlock()
	for _, s := range slots {
		q.icq.addSW(transport.Completion{Status: transport.ErrCancelled, QPContext: q.ctx, RequestContext: s.ctx, Type: s.op})
	}
}

// cmEvent takes the rdma_cm events of the QP's connection: during setup
// they go to Connect or Accept; afterwards a disconnect ends the QP.
func (q *qp) cmEvent(ev cmEvent) {
	q.cmMu.Lock()
	if !q.cmConnected {
		select {
		case q.evc <- ev:
		default:
		}
		q.cmMu.Unlock()
		return
	}
	switch ev.typ {
	case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
		// Answer the peer's disconnect request (InfiniBand DREP) and end.
		// The id is used under cmMu: Close destroys it under the same lock.
		if q.id != nil {
			C.rdma_disconnect(q.id)
		}
		q.cmMu.Unlock()
		go q.fail(transport.ErrDisconnected)
		return
	}
	q.cmMu.Unlock()
}

// connected publishes a finished setup; an end that arrived meanwhile is
// handled now.
func (q *qp) connected(id *C.struct_rdma_cm_id) {
	q.cmMu.Lock()
	q.id = id
	q.local = goAddr(C.blk_local_addr(id))
	q.remote = goAddr(C.blk_peer_addr(id))
	q.cmConnected = true
	var ended bool
	for more := true; more; {
		select {
		case ev := <-q.evc:
			if ev.typ == C.RDMA_CM_EVENT_DISCONNECTED || ev.typ == C.RDMA_CM_EVENT_DEVICE_REMOVAL {
				ended = true
			}
		default:
			more = false
		}
	}
	q.cmMu.Unlock()
	q.state.Store(qpConnected)
	if ended {
		C.rdma_disconnect(id)
		go q.fail(transport.ErrDisconnected)
	}
}

// Close disconnects if connected, destroys the QP and its connection, and
// releases its CQ reserves. Completions of the QP still on a CQ are dropped.
func (q *qp) Close() error {
	q.closeOnce.Do(func() {
		if q.state.Load() == qpConnected {
			q.fail(transport.ErrDisconnected)
		} else {
			q.fail(transport.ErrClosed)
		}
		// A fail that another goroutine began first may still be using the
		// QP and its id: it closes done when it is through.
		<-q.done
		q.state.Store(qpClosed)
		q.a.removeQP(q)
		q.smu.Lock()
		q.sclosed = true
		outS := int64(int(q.idepth) - len(q.sfree))
		q.smu.Unlock()
		q.rmu.Lock()
		q.rclosed = true
		outR := int64(len(q.rctx) - len(q.rfree))
		q.rmu.Unlock()
		q.icq.unreserve(outS)
		q.rcq.unreserve(outR)
		q.cmMu.Lock()
		id := q.id
		q.id = nil
		q.cmMu.Unlock()
		if id != nil {
			// Unregistered first: no event reaches the QP after this, and
			// one being handled holds cmMu, which the nil id above waited
			// for.
			q.a.cm.unregister(id)
			C.rdma_destroy_id(id)
		}
		C.ibv_destroy_qp(q.hw)
		q.freeC()
		q.rcq.unref(q)
		q.icq.unref(q)
		if q.srq != nil {
			q.srq.unref()
		}
		q.pd.unref()
	})
	return nil
}
