package soft

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft/wire"
)

// QP states.
const (
	stateIdle int32 = iota
	stateConnecting
	stateConnected
	stateError
	stateClosed
)

// sendWR is a slot of the send queue.
type sendWR struct {
	op     transport.OpType
	rdmap  uint8 // RDMAP opcode of sends
	flags  transport.PostFlags
	ctx    any
	n      uint8
	sges   [maxSge]transport.SGE
	length uint32
	inline []byte // FlagInline: the payload, copied at post time
	raddr  uint64
	rkey   uint32 // write/read: remote STag; send-with-invalidate: STag to invalidate
	mr     *mr
	key    uint32
	buf    []byte
	access transport.Access
}

// readWR is an RDMA read in flight (outbound read queue, ORQ).
type readWR struct {
	ctx    any
	length uint32
	silent bool
	// The sink: the only place a response to this read may land.
	stag uint32
	addr uint64
}

// pendingComp is a send-queue completion waiting for its bytes to be
// handed to TCP.
type pendingComp struct {
	ctx    any
	op     transport.OpType
	bytes  uint32
	silent bool
}

type qp struct {
	a     *Adapter
	pd    *pd
	ctx   any
	rcq   *cq
	icq   *cq
	srq   *srq
	rq    *recvQueue
	depth uint32
	inl   uint32
	sgeS  uint32

	state atomic.Int32

	// Send queue: producers fill slots under sqMu; the sender goroutine
	// consumes from sqHead without the lock.
	sqMu        sync.Mutex
	sq          []sendWR
	sqTail      atomic.Uint64
	sqBell      atomic.Uint64 // the doorbell: requests below it may start (FlagDefer)
	sqHead      atomic.Uint64
	sqClosed    bool
	outstanding atomic.Int32 // Q4: initiator requests posted and not completed
	kick        chan struct{}
	orderly     atomic.Bool // Disconnect: half-close and drain (see fail)

	// Connection, set before the goroutines start.
	conn       *net.TCPConn
	crc        bool
	maxSendPay int // payload bytes per untagged FPDU
	maxTagPay  int // payload bytes per tagged FPDU
	ird, ord   uint32
	delay      time.Duration

	// ORQ: reads in flight, pushed by the sender, completed by the receiver.
	orqMu     sync.Mutex
	orq       []readWR
	orqHead   uint32
	orqN      uint32
	orqClosed bool

	// IRQ: the peer's read requests, pushed by the receiver, served by the
	// sender.
	irqMu   sync.Mutex
	irq     []wire.ReadRequest
	irqHead uint32
	irqN    uint32

	wmu    sync.Mutex // socket writes (sender batches, receiver Terminates)
	done   chan struct{}
	errMu  sync.Mutex
	err    error
	closed atomic.Bool

	tx txState
	rx rxState

	// Poll-group mode: poll is the receive CQ's group, which then does
	// this QP's socket I/O in place of the two goroutines. pollNext and
	// pollQueued link it on the group's dirty stack; the rest is owned by
	// the group's thread.
	poll        *pollGroup
	pollNext    *qp
	pollQueued  atomic.Bool
	pollSlot    int32 // epoll slot, -1 until registered
	pollRetired bool  // the group let go of the QP
	// pollRecvWait: the next FPDU, a Send's first segment, waits in the
	// receive buffer for a receive on the empty SRQ; the socket is not
	// read meanwhile (EPOLLIN off). recvPosted is set by the SRQ's next
	// post, which marks the QP so its group looks again.
	pollRecvWait bool
	recvPosted   atomic.Bool
	pollOut      bool // EPOLLOUT interest: a write waits for room
	txDelayed    bool // FirstFPDUDelay: no FPDU before txAt
	pollDelayed  bool // on the group's list of delayed QPs
	txAt         time.Time
}

func (p *pd) CreateQP(cfg transport.QPConfig) (transport.QP, error) {
	info := p.a.info
	rcq, ok1 := cfg.ReceiveCQ.(*cq)
	icq, ok2 := cfg.InitiatorCQ.(*cq)
	if !ok1 || !ok2 || rcq == nil || icq == nil {
		return nil, fmt.Errorf("soft: QP needs receive and initiator CQs of this provider: %w", transport.ErrInvalidParameter)
	}
	var s *srq
	if cfg.SRQ != nil {
		var ok bool
		if s, ok = cfg.SRQ.(*srq); !ok {
			return nil, fmt.Errorf("soft: SRQ of another provider: %w", transport.ErrInvalidParameter)
		}
	}
	if s == nil && (cfg.ReceiveQueueDepth == 0 || cfg.ReceiveQueueDepth > info.MaxReceiveQueueDepth) {
		return nil, fmt.Errorf("soft: receive queue depth %d (max %d): %w", cfg.ReceiveQueueDepth, info.MaxReceiveQueueDepth, transport.ErrInvalidParameter)
	}
	if cfg.InitiatorQueueDepth == 0 || cfg.InitiatorQueueDepth > info.MaxInitiatorQueueDepth {
		return nil, fmt.Errorf("soft: initiator queue depth %d (max %d): %w", cfg.InitiatorQueueDepth, info.MaxInitiatorQueueDepth, transport.ErrInvalidParameter)
	}
	if s == nil && cfg.MaxReceiveRequestSge > info.MaxReceiveRequestSge {
		return nil, fmt.Errorf("soft: receive SGE limit %d (max %d): %w", cfg.MaxReceiveRequestSge, info.MaxReceiveRequestSge, transport.ErrInvalidParameter)
	}
	if cfg.MaxInitiatorRequestSge > info.MaxInitiatorRequestSge {
		return nil, fmt.Errorf("soft: initiator SGE limit %d (max %d): %w", cfg.MaxInitiatorRequestSge, info.MaxInitiatorRequestSge, transport.ErrInvalidParameter)
	}
	if cfg.InlineDataSize > info.MaxInlineDataSize {
		return nil, fmt.Errorf("soft: inline size %d (max %d): %w", cfg.InlineDataSize, info.MaxInlineDataSize, transport.ErrInvalidParameter)
	}
	if err := p.a.check(); err != nil {
		return nil, err
	}
	q := &qp{
		a:        p.a,
		pd:       p,
		ctx:      cfg.Context,
		rcq:      rcq,
		icq:      icq,
		srq:      s,
		depth:    cfg.InitiatorQueueDepth,
		inl:      cfg.InlineDataSize,
		sgeS:     max(cfg.MaxInitiatorRequestSge, 1),
		sq:       make([]sendWR, cfg.InitiatorQueueDepth),
		kick:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		poll:     rcq.group,
		pollSlot: -1,
	}
	if s == nil {
		q.rq = newRecvQueue(cfg.ReceiveQueueDepth, max(cfg.MaxReceiveRequestSge, 1))
	}
	if q.inl > 0 {
		backing := make([]byte, int(q.inl)*len(q.sq))
		for i := range q.sq {
			q.sq[i].inline = backing[i*int(q.inl) : i*int(q.inl) : (i+1)*int(q.inl)]
		}
	}
	p.a.track(q, true)
	return q, nil
}

func (q *qp) Context() any { return q.ctx }

func (q *qp) LocalAddr() net.Addr  { return asNet(q.connOrNil(), false) }
func (q *qp) RemoteAddr() net.Addr { return asNet(q.connOrNil(), true) }

func (q *qp) connOrNil() net.Conn {
	if q.state.Load() < stateConnected || q.conn == nil {
		return nil
	}
	return q.conn
}

func (q *qp) Done() <-chan struct{} { return q.done }

func (q *qp) Err() error {
	q.errMu.Lock()
	defer q.errMu.Unlock()
	return q.err
}

// PostReceive posts to the QP's own receive queue (not allowed on a QP
// created against an SRQ).
func (q *qp) PostReceive(ctx any, sges []transport.SGE) error {
	if q.rq == nil {
		return fmt.Errorf("soft: QP takes its receives from an SRQ: %w", transport.ErrInvalidDeviceState)
	}
	return q.rq.post(ctx, sges)
}

// reserve takes an initiator queue slot (Q4) or fails without blocking.
func (q *qp) reserve() error {
	if q.outstanding.Add(1) > int32(q.depth) {
		q.outstanding.Add(-1)
		return transport.ErrInsufficientResources
	}
	return nil
}

// enqueue validates the common parts and publishes w into the send queue.
// fill writes the request into its slot while the producer lock is held.
func (q *qp) enqueue(op transport.OpType, ctx any, sges []transport.SGE, flags transport.PostFlags, fill func(w *sendWR)) error {
	if uint32(len(sges)) > q.sgeS {
		return fmt.Errorf("soft: %v with %d SGEs (QP max %d): %w", op, len(sges), q.sgeS, transport.ErrInvalidParameter)
	}
	var total uint64
	for i := range sges {
		total += uint64(sges[i].Length)
	}
	if total > uint64(q.a.info.MaxTransferLength) {
		return fmt.Errorf("soft: %v of %d bytes (max %d): %w", op, total, q.a.info.MaxTransferLength, transport.ErrInvalidParameter)
	}
	if flags&transport.FlagInline != 0 && total > uint64(q.inl) {
		return fmt.Errorf("soft: inline %v of %d bytes (QP inline size %d): %w", op, total, q.inl, transport.ErrInvalidParameter)
	}
	if q.state.Load() != stateConnected {
		return fmt.Errorf("soft: post %v on a QP that is not connected: %w", op, transport.ErrInvalidDeviceState)
	}
	if err := q.reserve(); err != nil {
		return err
	}
	q.sqMu.Lock()
	if q.sqClosed {
		q.sqMu.Unlock()
		q.outstanding.Add(-1)
		return fmt.Errorf("soft: post %v on a QP that is not connected: %w", op, transport.ErrInvalidDeviceState)
	}
	tail := q.sqTail.Load()
	w := &q.sq[tail%uint64(len(q.sq))]
	w.op, w.flags, w.ctx = op, flags, ctx
	w.n = uint8(copy(w.sges[:], sges))
	w.length = uint32(total)
	w.mr, w.buf = nil, nil
	w.inline = w.inline[:0]
	if flags&transport.FlagInline != 0 {
		for i := range sges {
			b, pm, f := q.pd.pin(sges[i].LKey, sges[i].Addr, sges[i].Length, 0)
			if f != faultNone {
				q.sqMu.Unlock()
				q.outstanding.Add(-1)
				return fmt.Errorf("soft: inline SGE %d: %w", i, f.err())
			}
			w.inline = append(w.inline, b...)
			pm.unpin()
		}
	}
	if fill != nil {
		fill(w)
	}
	q.sqTail.Store(tail + 1)
	ring := flags&transport.FlagDefer == 0
	if ring {
		// Ring the doorbell: this request and every deferred one before
		// it may start.
		q.sqBell.Store(tail + 1)
	}
	q.sqMu.Unlock()
	if ring {
		q.wake()
	}
	return nil
}

func (q *qp) wake() {
	if q.poll != nil {
		q.poll.mark(q)
		return
	}
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

func (q *qp) Send(ctx any, sges []transport.SGE, flags transport.PostFlags) error {
	op := uint8(wire.OpSend)
	if flags&transport.FlagSolicitedEvent != 0 {
		op = wire.OpSendSolicited
	}
	return q.enqueueSend(ctx, sges, flags, op, 0)
}

func (q *qp) SendInvalidate(ctx any, sges []transport.SGE, remoteKey uint32, flags transport.PostFlags) error {
	op := uint8(wire.OpSendInvalidate)
	if flags&transport.FlagSolicitedEvent != 0 {
		op = wire.OpSendSolicitedInvalidate
	}
	return q.enqueueSend(ctx, sges, flags, op, remoteKey)
}

func (q *qp) enqueueSend(ctx any, sges []transport.SGE, flags transport.PostFlags, op uint8, inval uint32) error {
	return q.enqueue(transport.OpSend, ctx, sges, flags, func(w *sendWR) {
		w.rdmap = op
		w.rkey = inval
	})
}

func (q *qp) Write(ctx any, sges []transport.SGE, raddr uint64, rkey uint32, flags transport.PostFlags) error {
	return q.enqueue(transport.OpWrite, ctx, sges, flags, func(w *sendWR) {
		w.raddr, w.rkey = raddr, rkey
	})
}

func (q *qp) Read(ctx any, sink []transport.SGE, raddr uint64, rkey uint32, flags transport.PostFlags) error {
	if uint32(len(sink)) > q.a.info.MaxReadRequestSge || len(sink) == 0 {
		return fmt.Errorf("soft: read with %d sink SGEs (iWARP takes exactly %d): %w", len(sink), q.a.info.MaxReadRequestSge, transport.ErrInvalidParameter)
	}
	if flags&transport.FlagInline != 0 {
		return fmt.Errorf("soft: inline read: %w", transport.ErrInvalidParameter)
	}
	return q.enqueue(transport.OpRead, ctx, sink, flags, func(w *sendWR) {
		w.raddr, w.rkey = raddr, rkey
	})
}

func (q *qp) ownMR(m transport.MemoryRegion) (*mr, error) {
	r, ok := m.(*mr)
	if !ok || r.pd != q.pd {
		return nil, fmt.Errorf("soft: memory region of another protection domain: %w", transport.ErrInvalidParameter)
	}
	return r, nil
}

func (q *qp) FastRegister(ctx any, m transport.MemoryRegion, buf []byte, access transport.Access, flags transport.PostFlags) (uint32, error) {
	r, err := q.ownMR(m)
	if err != nil {
		return 0, err
	}
	if !r.frmr {
		return 0, fmt.Errorf("soft: fast-register a region not made by AllocateMR: %w", transport.ErrInvalidParameter)
	}
	if len(buf) == 0 || uint64(len(buf)) > uint64(r.max) {
		return 0, fmt.Errorf("soft: fast-register %d bytes into a region of at most %d: %w", len(buf), r.max, transport.ErrInvalidParameter)
	}
	key := r.nextKey()
	err = q.enqueue(transport.OpFastRegister, ctx, nil, flags&^transport.FlagInline, func(w *sendWR) {
		w.mr, w.key, w.buf, w.access = r, key, buf, access
	})
	return key, err
}

func (q *qp) Invalidate(ctx any, m transport.MemoryRegion, flags transport.PostFlags) error {
	r, err := q.ownMR(m)
	if err != nil {
		return err
	}
	return q.enqueue(transport.OpInvalidate, ctx, nil, flags&^transport.FlagInline, func(w *sendWR) {
		w.mr = r
	})
}

// Flush cancels every outstanding request; the connection ends.
func (q *qp) Flush() error {
	q.fail(transport.ErrCancelled)
	return nil
}

// Disconnect ends the connection; outstanding requests complete with
// ErrCancelled.
func (q *qp) Disconnect() error {
	if q.state.Load() < stateConnected {
		return fmt.Errorf("soft: disconnect a QP that is not connected: %w", transport.ErrInvalidDeviceState)
	}
	q.orderly.Store(true)
	q.fail(transport.ErrDisconnected)
	return nil
}

// disconnectLinger bounds how long an orderly disconnect waits for the
// peer's FIN, discarding what the peer still sends, before closing.
const disconnectLinger = time.Second

func (q *qp) Close() error {
	if q.closed.Swap(true) {
		return nil
	}
	q.fail(transport.ErrClosed)
	q.a.track(q, false)
	return nil
}

// fail moves the QP to the error state once: it records why, closes the
// socket (which stops both goroutines) and flushes what it owns. The
// goroutines flush their own state as they exit.
func (q *qp) fail(err error) {
	q.errMu.Lock()
	if q.err != nil {
		q.errMu.Unlock()
		return
	}
	q.err = err
	q.errMu.Unlock()
	prev := q.state.Swap(stateError)
	close(q.done)
	if q.conn != nil && prev >= stateConnected {
		if q.orderly.Load() {
			// Orderly: send our FIN now, and let the receiver discard
			// what the peer still sends until its FIN, so that the peer
			// sees a clean close rather than a reset from unread data.
			q.conn.CloseWrite()
			q.conn.SetReadDeadline(time.Now().Add(disconnectLinger))
		} else {
			q.conn.Close()
		}
	} else {
		// Never connected: no goroutine owns the send queue.
		q.flushSQ()
	}
	if q.rq != nil {
		for _, w := range q.rq.drain() {
			q.complete(q.rcq, &transport.Completion{Status: transport.ErrCancelled, QPContext: q.ctx, RequestContext: w.ctx, Type: transport.OpReceive}, false, nil)
		}
	}
	q.flushORQ(nil)
	if q.poll != nil && prev >= stateConnected {
		q.poll.mark(q) // the group flushes what it owns and lets go
	}
}

// complete pushes a completion; a CQ overrun fails the QP (C3). owner is
// set for initiator completions (see cq.push).
func (q *qp) complete(c *cq, comp *transport.Completion, solicited bool, owner *qp) {
	if !c.push(comp, solicited, owner) {
		if owner != nil {
			owner.outstanding.Add(-1)
		}
		q.errMu.Lock()
		already := q.err != nil
		q.errMu.Unlock()
		if !already {
			go q.fail(transport.ErrCQOverflow)
		}
	}
}

// completeSQ finishes an initiator request. Its queue slot is freed when
// the completion is polled; a silent success frees it at once.
func (q *qp) completeSQ(op transport.OpType, ctx any, bytes uint32, status error, silent bool) {
	if status == nil && silent {
		q.outstanding.Add(-1)
		return
	}
	q.complete(q.icq, &transport.Completion{Status: status, QPContext: q.ctx, RequestContext: ctx, Bytes: bytes, Type: op}, false, q)
}

// flushSQ cancels every request still in the send queue and closes it.
func (q *qp) flushSQ() {
	q.sqMu.Lock()
	q.sqClosed = true
	head, tail := q.sqHead.Load(), q.sqTail.Load()
	for ; head < tail; head++ {
		w := &q.sq[head%uint64(len(q.sq))]
		q.completeSQ(w.op, w.ctx, 0, transport.ErrCancelled, false)
		w.ctx = nil
	}
	q.sqHead.Store(head)
	q.sqMu.Unlock()
}

// flushORQ cancels the reads in flight; the oldest gets headErr if given.
func (q *qp) flushORQ(headErr error) {
	q.orqMu.Lock()
	q.orqClosed = true
	var reads []readWR
	for q.orqN > 0 {
		reads = append(reads, q.orq[q.orqHead])
		q.orq[q.orqHead] = readWR{}
		q.orqHead = (q.orqHead + 1) % uint32(len(q.orq))
		q.orqN--
	}
	q.orqMu.Unlock()
	for i, r := range reads {
		st := transport.ErrCancelled
		if i == 0 && headErr != nil {
			st = headErr
		}
		q.completeSQ(transport.OpRead, r.ctx, 0, st, false)
	}
}

// start binds an established connection and starts the goroutines.
func (q *qp) start(conn *net.TCPConn, crc bool, ird, ord uint32, delay time.Duration) {
	q.conn = conn
	q.crc = crc
	q.ird, q.ord = max(ird, 1), max(ord, 1)
	q.delay = delay
	fpdu := q.a.cfg.FPDUSize
	if fpdu == 0 {
		fpdu = tcpMSS(conn)
	}
	q.maxSendPay = wire.MaxPayload(fpdu, wire.UntaggedHeaderLen)
	q.maxTagPay = wire.MaxPayload(fpdu, wire.TaggedHeaderLen)
	q.orq = make([]readWR, q.ord)
	q.irq = make([]wire.ReadRequest, q.ird)
	q.tx.init(q)
	q.rx.init(conn, q.poll != nil)
	if !q.state.CompareAndSwap(stateConnecting, stateConnected) {
		conn.Close()
		q.flushSQ()
		return
	}
	if q.poll != nil {
		if !q.poll.adopt(q) {
			q.fail(fmt.Errorf("soft: the receive CQ is closed: %w", transport.ErrClosed))
			q.flushSQ()
		}
		return
	}
	go q.sender()
	go q.receiver()
}

// QPStats are a QP's data-path counters.
type QPStats struct {
	// TxCopiedBytes and RxCopiedBytes are payload bytes copied in user
	// space (small payloads next to their headers; payload that arrived in
	// the receive buffer with a header). The rest moved by reference
	// (writev from registered memory) or was read straight into it.
	TxCopiedBytes, RxCopiedBytes uint64
	// Writes counts writev calls, FPDUs the FPDUs sent, DirectReads the
	// payload reads straight into registered memory.
	Writes, FPDUs, DirectReads uint64
}

// QPStatsOf returns the counters of a QP created by this provider.
func QPStatsOf(tq transport.QP) (QPStats, bool) {
	q, ok := tq.(*qp)
	if !ok {
		return QPStats{}, false
	}
	return QPStats{
		TxCopiedBytes: q.tx.copied.Load(),
		RxCopiedBytes: q.rx.copied.Load(),
		Writes:        q.tx.writes.Load(),
		FPDUs:         q.tx.fpdus.Load(),
		DirectReads:   q.rx.direct.Load(),
	}, true
}

// sinkAccess is what an RDMA read's sink must grant (Config.StrictReadSink).
func (q *qp) sinkAccess() transport.Access {
	if q.a.cfg.StrictReadSink {
		return transport.AccessLocalWrite | transport.AccessRemoteWrite
	}
	return transport.AccessLocalWrite
}
