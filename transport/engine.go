package transport

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Engine is the layer the target and the initiator build on: given an
// adapter and a protection domain it builds, per core,
//
//   - one CQ, its notifications pinned to the core (Affinity), used as both
//     the receive and the initiator CQ of the core's QPs;
//   - one SRQ shared by those QPs, with the same affinity;
//   - one registered region sliced into Buffers fixed-size receive buffers,
//     all posted to the SRQ, given back by the handler (Repost / Release)
//     and replenished from the SRQ threshold notification;
//   - an adaptive interrupt moderation controller (Moderator);
//
// and it places each new QP on a core in one function (PlaceQP).
//
// Steady state (a completion handled, a buffer given back) allocates
// nothing and takes no lock: completions are drained into a preallocated
// array, receive buffers are preallocated structs whose pointers travel as
// request contexts, the free list is lock-free, and counters are atomics
// added once per notification (and once per Repost or Release).
//
// The engine relies on the API's promise that a CQ's notifications run on
// that CQ's own goroutine, one at a time: the completion array, the
// moderation controller and ControlInterruptModeration (M13) are touched
// by that goroutine only. A core with a poll set (a PollHandler,
// core_poll.go) keeps the promise by serializing: its CQ's notifications
// and its poll set's events are handled one at a time by whichever
// goroutine holds the core's run token.
type Engine struct {
	adapter Adapter
	pd      PD
	info    AdapterInfo
	cfg     EngineConfig
	cores   []*Core

	// mu guards QP placement (Core.qps, Core.nqps) and closed. It is
	// never taken on the completion path.
	mu     sync.Mutex
	closed bool
}

// Handler receives every completion of the engine's CQs.
type Handler interface {
	// HandleCompletion runs on core's notification goroutine (with a
	// poll set: serialized with the core's other handler calls, see
	// PollHandler), once per completion, in CQ order. c points into the core's completion array
	// and is valid only during the call. For a receive completion of an
	// engine buffer (core.RecvBuf(c) != nil), the handler owns the buffer
	// from then on, whatever c.Status says, and must give it back with
	// Repost or Release, now or later, from any goroutine. It must not
	// block and must not call Engine.Close.
	HandleCompletion(core *Core, c *Completion)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(core *Core, c *Completion)

// HandleCompletion calls f(core, c).
func (f HandlerFunc) HandleCompletion(core *Core, c *Completion) { f(core, c) }

// ErrorHandler is an optional extension of Handler: when the handler also
// implements it, it learns of CQ failures (ErrCQOverflow, or a failed
// re-arm) on the core's notification goroutine. The core's QPs fail
// afterwards; the engine counts the error in Stats.CQErrors either way.
type ErrorHandler interface {
	HandleCQError(core *Core, err error)
}

// BatchHandler is an optional extension of Handler: when the handler
// also implements it, HandleBatchEnd runs on a core's notification
// goroutine after every notification that handed completions to
// HandleCompletion — the point where work gathered from those completions
// (writes to commit together, doorbells to ring) should be done.
type BatchHandler interface {
	HandleBatchEnd(core *Core)
}

// NewEngine builds the per-core queues and buffer pools on adapter a and
// protection domain pd. cfg is completed with WithDefaults for a.Info() and
// must pass ValidateFor. h receives every completion.
func NewEngine(a Adapter, pd PD, cfg EngineConfig, h Handler) (*Engine, error) {
	if a == nil || pd == nil || h == nil {
		return nil, fmt.Errorf("%w: NewEngine needs an adapter, a PD and a handler", ErrInvalidParameter)
	}
	info := a.Info()
	cfg = cfg.WithDefaults(info)
	if err := cfg.ValidateFor(info); err != nil {
		return nil, err
	}
	e := &Engine{adapter: a, pd: pd, info: info, cfg: cfg}
	cpus := info.Cores
	if cpus <= 0 {
		cpus = runtime.NumCPU()
	}
	moderate := !cfg.Moderation.Off && info.Flags&FlagCQInterruptModerationSupported != 0
	eh, _ := h.(ErrorHandler)
	for i := 0; i < cfg.Cores; i++ {
		cpu := i % cpus
		if cfg.NoPin {
			cpu = -1
		}
		c, err := newCore(e, i, cpu, h, eh, moderate)
		if err != nil {
			e.closeCores()
			return nil, fmt.Errorf("engine core %d: %w", i, err)
		}
		e.cores = append(e.cores, c)
	}
	return e, nil
}

// Config returns the completed configuration the engine runs with.
func (e *Engine) Config() EngineConfig {
	c := e.cfg
	c.Moderation.Profile = append([]ModerationLevel(nil), c.Moderation.Profile...)
	return c
}

// Adapter returns the engine's adapter (to Listen and Connect with).
func (e *Engine) Adapter() Adapter { return e.adapter }

// PD returns the engine's protection domain.
func (e *Engine) PD() PD { return e.pd }

// Cores returns the engine's cores, indexed by core number. The slice must
// not be modified.
func (e *Engine) Cores() []*Core { return e.cores }

// PlaceQP is the one function that decides where a new QP goes: the core
// with the fewest QPs, ties to the lowest index, among cores below
// QPsPerCore (their CQ is sized for no more, see CQDepth). It returns nil
// when every core is full or the engine is closed. The answer is only a
// prediction for a later CreateQP if no other QP is created or closed in
// between; CreateQP decides and reserves under one lock.
func (e *Engine) PlaceQP() *Core {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.placeLocked()
}

// placeLocked is PlaceQP's body; e.mu is held.
func (e *Engine) placeLocked() *Core {
	if e.closed {
		return nil
	}
	var best *Core
	for _, c := range e.cores {
		if c.nqps >= e.cfg.QPsPerCore {
			continue
		}
		if best == nil || c.nqps < best.nqps {
			best = c
		}
	}
	return best
}

// CreateQP creates a QP on the core PlaceQP chooses, against that core's
// CQ (receive and initiator) and SRQ. ctx is the QP context every
// completion carries (Q3). initiatorDepth 0 takes the configured
// InitiatorDepth; more than it is refused, because the CQ is sized for it.
// inline is the QP's inline data size (checked by the provider, Q2). The
// QP must be closed with Core.CloseQP (or Engine.CloseQP) so that the
// core's QP count drops; Close closes any left.
func (e *Engine) CreateQP(ctx any, initiatorDepth, inline uint32) (QP, *Core, error) {
	return e.createQP(ctx, initiatorDepth, inline, 0)
}

// CreateQPWithReceiveQueue is CreateQP for a QP that must never wait for
// the core's shared buffers: it gets its own receive queue of recvDepth
// requests, which the caller fills with its own registered buffers (their
// completions reach the Handler with Core.RecvBuf returning nil). It is
// meant for low-rate control queues (an NVMe admin queue) that must stay
// reachable while data queues exhaust the SRQ. The QP's receive and
// initiator completions share the CQ slots CQDepth reserves for one QP, so
// initiatorDepth + recvDepth must not exceed InitiatorDepth.
func (e *Engine) CreateQPWithReceiveQueue(ctx any, initiatorDepth, inline, recvDepth uint32) (QP, *Core, error) {
	if recvDepth == 0 {
		return nil, nil, fmt.Errorf("%w: a private receive queue needs a depth", ErrInvalidParameter)
	}
	if initiatorDepth == 0 {
		initiatorDepth = e.cfg.InitiatorDepth - min(recvDepth, e.cfg.InitiatorDepth)
	}
	if uint64(initiatorDepth)+uint64(recvDepth) > uint64(e.cfg.InitiatorDepth) {
		return nil, nil, fmt.Errorf("%w: initiator depth %d + receive depth %d exceed the engine's InitiatorDepth %d that its CQs reserve per QP",
			ErrInvalidParameter, initiatorDepth, recvDepth, e.cfg.InitiatorDepth)
	}
	return e.createQP(ctx, initiatorDepth, inline, recvDepth)
}

func (e *Engine) createQP(ctx any, initiatorDepth, inline, recvDepth uint32) (QP, *Core, error) {
	if initiatorDepth == 0 {
		initiatorDepth = e.cfg.InitiatorDepth
	}
	if initiatorDepth > e.cfg.InitiatorDepth {
		return nil, nil, fmt.Errorf("%w: initiator depth %d exceeds the engine's InitiatorDepth %d that its CQs are sized for",
			ErrInvalidParameter, initiatorDepth, e.cfg.InitiatorDepth)
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, nil, fmt.Errorf("engine: %w", ErrClosed)
	}
	c := e.placeLocked()
	if c == nil {
		e.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: every core holds QPsPerCore (%d) QPs", ErrInsufficientResources, e.cfg.QPsPerCore)
	}
	c.nqps++ // reserve the slot while the provider creates the QP
	e.mu.Unlock()

	qc := QPConfig{
		ReceiveCQ:              c.cq,
		InitiatorCQ:            c.cq,
		SRQ:                    c.srq,
		Context:                ctx,
		MaxReceiveRequestSge:   1,
		InitiatorQueueDepth:    initiatorDepth,
		MaxInitiatorRequestSge: e.cfg.InitiatorSGE,
		InlineDataSize:         inline,
	}
	if recvDepth > 0 {
		qc.SRQ = nil
		qc.ReceiveQueueDepth = recvDepth
	}
	qp, err := e.pd.CreateQP(qc)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		c.nqps--
		return nil, nil, err
	}
	if e.closed {
		c.nqps--
		qp.Close()
		return nil, nil, fmt.Errorf("engine: %w", ErrClosed)
	}
	c.qps[qp] = struct{}{}
	return qp, c, nil
}

// SetFixedModeration pins every core's CQ moderation to interval (µs) and
// count (M3–M8; 0, 0 turns moderation off) and stops the adaptive
// controller; SetAdaptiveModeration gives control back to it. The change
// is applied by each core's notification goroutine (M13) at its next
// notification. This is how an upper layer maps a protocol's interrupt
// coalescing setting (NVMe Set Features Interrupt Coalescing) onto the
// transport: the CQ is shared by every QP of a core, so the setting is
// per engine, not per connection.
func (e *Engine) SetFixedModeration(interval, count uint32) {
	for _, c := range e.cores {
		c.fixed.Store(&modRequest{fixed: true, interval: interval, count: count})
	}
}

// SetAdaptiveModeration undoes SetFixedModeration.
func (e *Engine) SetAdaptiveModeration() {
	for _, c := range e.cores {
		c.fixed.Store(&modRequest{})
	}
}

// modRequest is a pending SetFixedModeration (fixed) or
// SetAdaptiveModeration (!fixed); rare, so one allocation each is fine.
type modRequest struct {
	fixed           bool
	interval, count uint32
}

// CloseQP closes a QP created by CreateQP on any core.
func (e *Engine) CloseQP(qp QP) error {
	e.mu.Lock()
	for _, c := range e.cores {
		if _, ok := c.qps[qp]; ok {
			e.mu.Unlock()
			return c.CloseQP(qp)
		}
	}
	e.mu.Unlock()
	return fmt.Errorf("%w: QP not created by this engine, or already closed", ErrInvalidParameter)
}

// Stats sums the counters of every core.
func (e *Engine) Stats() Stats {
	var s Stats
	for i, c := range e.cores {
		cs := c.Stats()
		if i == 0 {
			s.Moderation = cs.Moderation
		}
		s.add(cs)
	}
	return s
}

// Close closes every QP the engine created and still holds, then each
// core's SRQ, CQ and buffer region. Handlers that are running finish first;
// none runs after Close returns. It must not be called from a Handler.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	return e.closeCores()
}

func (e *Engine) closeCores() error {
	var errs []error
	for _, c := range e.cores {
		c.stopCallbacks()
	}
	for _, c := range e.cores {
		errs = append(errs, c.close())
	}
	return errors.Join(errs...)
}

// Core is one core's group: a CQ, an SRQ, a pool of receive buffers, the
// QPs placed on it and a moderation controller. Its notification callbacks
// run on the CQ's and the SRQ's goroutines, pinned to CPU() where the
// provider can.
type Core struct {
	e     *Engine
	index int
	cpu   int

	cq        CQ
	srq       SRQ
	mr        MemoryRegion
	threshold uint32

	h  Handler
	eh ErrorHandler
	bh BatchHandler
	ph PollHandler // nil: no poll set (core_poll.go)

	// The poll set (core_poll.go): ps and psDone are set by newCore and
	// not changed until close; sched is the run token serializing the
	// handler calls; cqErr a CQ failure for the token's holder to report.
	ps     *pollSet
	psDone chan struct{}
	sched  atomic.Uint32
	cqErr  atomic.Pointer[error]

	// Owned by the CQ's notification goroutine.
	batch    []Completion
	mod      Moderator
	moderate bool
	lastNote time.Time
	// fixed carries a SetFixedModeration / SetAdaptiveModeration request
	// to the notification goroutine (fixedNone: nothing pending).
	fixed  atomic.Pointer[modRequest]
	pinned bool // moderation fixed by SetFixedModeration

	bufs []RecvBuf
	// The free list: a lock-free stack of buffer indexes (plus one; 0 is
	// empty) linked through freeNext. Only push and take-all are used, so
	// it has no ABA problem.
	freeHead atomic.Int32
	freeNext []int32
	srqState atomic.Uint32

	// gate counts callbacks in flight; gateClosed is set by Close.
	gate atomic.Int64
	// handling is odd while the CQ notification (the one callback that
	// calls the Handler) runs, and advances by two per notification:
	// Quiesce waits on it.
	handling atomic.Uint64

	// Guarded by e.mu.
	qps  map[QP]struct{}
	nqps uint32

	st coreCounters
}

const gateClosed = int64(1) << 40

// receivePage is the alignment of a split receive's payload
// (EngineConfig.HeaderSize): the page O_DIRECT I/O wants its buffers on.
const receivePage = 4096

// recvSGEs is the SGEs of one receive: two when split.
func recvSGEs(cfg *EngineConfig) uint32 {
	if cfg.HeaderSize != 0 {
		return 2
	}
	return 1
}

// SRQ refill states; refill owns the transitions (see refill).
const (
	srqArmed     uint32 = iota // threshold notification armed
	srqRefilling               // a refill is running
	srqStarved                 // below threshold with no free buffer; not armed
	srqClosed
)

// Receive buffer states; every transition is a compare-and-swap so that a
// buffer given back twice, or a completion for a buffer that was not
// posted, is caught at once (it would corrupt the data of another I/O).
const (
	bufPosted uint32 = iota // queued on the SRQ
	bufHeld                 // its completion was handed to the Handler
	bufFree                 // on the free list, waiting for a refill
)

func newCore(e *Engine, index, cpu int, h Handler, eh ErrorHandler, moderate bool) (c *Core, err error) {
	bh, _ := h.(BatchHandler)
	ph, _ := h.(PollHandler)
	cfg := &e.cfg
	c = &Core{
		e: e, index: index, cpu: cpu,
		threshold: cfg.RefillThreshold,
		h:         h, eh: eh,
		bh:       bh,
		batch:    make([]Completion, cfg.PollBatch),
		moderate: moderate,
		bufs:     make([]RecvBuf, cfg.Buffers),
		freeNext: make([]int32, cfg.Buffers),
		qps:      make(map[QP]struct{}),
	}
	c.mod.init(cfg.Moderation)
	defer func() {
		if err != nil {
			c.stopCallbacks()
			c.close()
		}
	}()
	c.cq, err = e.adapter.CreateCQ(CQConfig{
		Depth:    uint32(cfg.CQDepth()),
		Notify:   notifyCQ,
		Context:  c,
		Affinity: cpu,
	})
	if err != nil {
		return c, fmt.Errorf("create CQ: %w", err)
	}
	// Created unarmed: the queue is empty until the buffers are posted,
	// and arming it now could fire at once.
	c.srq, err = e.pd.CreateSRQ(SRQConfig{
		Depth:    cfg.SRQDepth,
		MaxSge:   recvSGEs(cfg),
		Notify:   notifySRQ,
		Context:  c,
		Affinity: cpu,
	})
	if err != nil {
		return c, fmt.Errorf("create SRQ: %w", err)
	}
	// Provider-owned: the buffers live as long as the core (closed in
	// close, after the QPs and the callbacks that hand them out).
	// Split (HeaderSize): the payloads first, a whole number of pages
	// each from the region's first page boundary (its start, where the
	// provider maps it; one page is added in case it does not), then the
	// headers packed after them.
	size, hdr := cfg.BufferSize, cfg.HeaderSize
	pay := size - hdr
	c.mr, err = e.pd.AllocateMemory(int(cfg.ReceiveBytes()), AccessLocalWrite)
	if err != nil {
		return c, fmt.Errorf("register receive buffers: %w", err)
	}
	reg := c.mr.Bytes()
	var skip uint32 // to the region's first page boundary
	if hdr != 0 {
		skip = uint32(-uintptr(unsafe.Pointer(unsafe.SliceData(reg))) % receivePage)
	}
	for i := range c.bufs {
		b := &c.bufs[i]
		b.core = c
		b.index = uint32(i)
		if hdr == 0 {
			off := uint32(i) * size
			b.data = reg[off : off+size : off+size]
			b.sge[0] = c.mr.SGE(off, size)
			b.nsge = 1
		} else {
			off := skip + uint32(i)*pay
			b.payload = reg[off : off+pay : off+pay]
			b.sge[1] = c.mr.SGE(off, pay)
			off = skip + cfg.Buffers*pay + uint32(i)*hdr
			b.data = reg[off : off+hdr : off+hdr]
			b.sge[0] = c.mr.SGE(off, hdr)
			b.nsge = 2
		}
		b.state.Store(bufPosted)
		if err = c.srq.PostReceive(b, b.sge[:b.nsge]); err != nil {
			return c, fmt.Errorf("post receive buffer %d: %w", i, err)
		}
	}
	c.srqState.Store(srqArmed)
	if err = c.srq.Modify(0, c.threshold); err != nil {
		return c, fmt.Errorf("arm SRQ threshold: %w", err)
	}
	if ph != nil {
		if err = c.openPollSet(ph); err != nil {
			return c, fmt.Errorf("core poll set: %w", err)
		}
	}
	if err = c.cq.Arm(NotifyAny); err != nil {
		return c, fmt.Errorf("arm CQ: %w", err)
	}
	return c, nil
}

// openPollSet gives the core its poll set and starts its goroutine
// (core_poll.go); where there is no epoll the core simply has none.
func (c *Core) openPollSet(ph PollHandler) error {
	ps, err := newPollSet()
	if errors.Is(err, errNoPollSet) {
		return nil
	}
	if err != nil {
		return err
	}
	c.ph, c.ps, c.psDone = ph, ps, make(chan struct{})
	go c.pollLoop()
	return nil
}

// Index is the core's number in Engine.Cores.
func (c *Core) Index() int { return c.index }

// CPU is the processor the core's notifications are pinned to, or -1
// (EngineConfig.NoPin).
func (c *Core) CPU() int { return c.cpu }

// Engine returns the core's engine.
func (c *Core) Engine() *Engine { return c.e }

// CQ is the core's completion queue (the receive and initiator CQ of its
// QPs). Only the engine polls and arms it.
func (c *Core) CQ() CQ { return c.cq }

// SRQ is the core's shared receive queue. Only the engine posts to it.
func (c *Core) SRQ() SRQ { return c.srq }

// QPs returns the number of QPs placed on the core.
func (c *Core) QPs() int {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return int(c.nqps)
}

// CloseQP closes a QP that CreateQP placed on this core and frees its slot.
// Completions of the QP that are already on the CQ (including flushed
// ones) are still handed to the Handler afterwards.
func (c *Core) CloseQP(qp QP) error {
	c.e.mu.Lock()
	if _, ok := c.qps[qp]; !ok {
		c.e.mu.Unlock()
		return fmt.Errorf("%w: QP not placed on core %d, or already closed", ErrInvalidParameter, c.index)
	}
	delete(c.qps, qp)
	c.nqps--
	c.e.mu.Unlock()
	return qp.Close()
}

// Quiesce returns once the Handler calls of this core that were running
// when it was called have returned. Handler calls that start later see
// whatever the caller stored before calling it. A consumer that closed a
// QP calls it, after marking the QP's state dead, before giving back
// memory that a completion still on the CQ could have led a running
// Handler call to touch (Completions of a closed QP are still handed to
// the Handler: see CloseQP). It never calls into the provider; it must
// not be called from a Handler (it would wait for itself).
func (c *Core) Quiesce() {
	s := c.handling.Load()
	if s&1 == 0 {
		return
	}
	for c.handling.Load() == s {
		time.Sleep(50 * time.Microsecond)
	}
}

// notifyCQ and notifySRQ are the NotifyFuncs of every core: static
// functions, so that no closure is created per core or per call.
func notifyCQ(ctx any, status error)  { ctx.(*Core).cqNotified(status) }
func notifySRQ(ctx any, status error) { ctx.(*Core).srqNotified(status) }

// enter admits a callback unless the core is closing.
func (c *Core) enter() bool {
	if c.gate.Add(1)&gateClosed != 0 {
		c.gate.Add(-1)
		return false
	}
	return true
}

func (c *Core) exit() { c.gate.Add(-1) }

// stopCallbacks refuses new callbacks and waits for running ones (which
// never block) to return.
func (c *Core) stopCallbacks() {
	c.gate.Or(gateClosed)
	c.srqState.Store(srqClosed)
	c.stopPollSet()
	for c.gate.Load() != gateClosed {
		time.Sleep(50 * time.Microsecond)
	}
}

// cqNotified is the CQ notification: drain, moderate, arm, drain again.
// A core with a poll set hands it to the run token (core_poll.go).
func (c *Core) cqNotified(status error) {
	if !c.enter() {
		return
	}
	defer c.exit()
	if c.ph != nil {
		switch {
		case status == nil:
			c.schedule(runCQ)
		case !errors.Is(status, ErrClosed):
			// A copy: the parameter's address would move it to the heap
			// on every notification.
			err := status
			c.cqErr.Store(&err)
			c.schedule(runCQFail)
		}
		return
	}
	c.handling.Add(1)
	defer c.handling.Add(1)
	if status != nil {
		if !errors.Is(status, ErrClosed) {
			c.cqFailed(status)
		}
		return
	}
	c.handleCQ(true)
}

// handleCQ drains the CQ into the handler, re-arms it and moderates: the
// body of a CQ notification (notified), or a look at the CQ by a core
// that keeps polling (core_poll.go), which counts as a notification only
// when it finds completions. On the core's notification goroutine.
func (c *Core) handleCQ(notified bool) {
	now := time.Now()
	n, recvs := c.drain()
	// Arm, then poll once more: a completion that landed between the
	// last empty poll and the arm may not fire the new arm on every
	// provider, so it is taken now. One that the arm did see will fire a
	// notification that finds the CQ empty (counted as empty).
	if err := c.cq.Arm(NotifyAny); err != nil {
		if !errors.Is(err, ErrClosed) {
			c.cqFailed(fmt.Errorf("re-arm CQ: %w", err))
		}
		return
	}
	n2, recvs2 := c.drain()
	n += n2
	recvs += recvs2
	if n > 0 && c.bh != nil {
		c.bh.HandleBatchEnd(c)
	}

	if notified || n > 0 {
		c.st.notifications.Add(1)
	}
	if f := c.fixed.Swap(nil); f != nil {
		c.applyFixed(f)
	}
	if n == 0 {
		if notified {
			c.st.emptyNotifications.Add(1)
		}
		return
	}
	c.st.completions.Add(uint64(n))
	if recvs > 0 {
		c.st.receives.Add(uint64(recvs))
	}
	if !c.moderate || c.pinned {
		return
	}
	var gap time.Duration
	if !c.lastNote.IsZero() {
		gap = now.Sub(c.lastNote)
	}
	c.lastNote = now
	if l, changed := c.mod.Observe(uint32(min(n, int(MaxUint32))), gap); changed {
		// Only this goroutine calls it, so never concurrently (M13).
		if err := c.cq.ControlInterruptModeration(l.Interval, l.Count); err != nil {
			c.st.moderationErrors.Add(1)
			c.mod.SetLevel(int(c.st.moderationLevel.Load()))
			return
		}
		c.st.moderationChanges.Add(1)
		ms := c.mod.Stats()
		c.st.moderationUps.Store(ms.Ups)
		c.st.moderationDowns.Store(ms.Downs)
		c.st.moderationFailedProbes.Store(ms.FailedProbes)
		c.st.moderationIdleResets.Store(ms.IdleResets)
		c.st.moderationLevel.Store(uint32(c.mod.Level()))
		c.st.moderationInterval.Store(l.Interval)
		c.st.moderationCount.Store(l.Count)
	}
}

// applyFixed applies a moderation request of SetFixedModeration or
// SetAdaptiveModeration on the notification goroutine.
func (c *Core) applyFixed(f *modRequest) {
	interval, count := f.interval, f.count
	c.pinned = f.fixed
	if !f.fixed {
		l := c.mod.cfg.Profile[c.mod.Level()]
		interval, count = l.Interval, l.Count
	}
	if c.e.info.Flags&FlagCQInterruptModerationSupported == 0 {
		return
	}
	if err := c.cq.ControlInterruptModeration(interval, count); err != nil {
		c.st.moderationErrors.Add(1)
		return
	}
	c.st.moderationChanges.Add(1)
	c.st.moderationInterval.Store(interval)
	c.st.moderationCount.Store(count)
}

func (c *Core) cqFailed(err error) {
	c.st.cqErrors.Add(1)
	if c.eh != nil {
		c.eh.HandleCQError(c, err)
	}
}

// drain polls the CQ until it is empty and hands every completion to the
// handler. It returns the completions and the receive completions of
// engine buffers among them.
func (c *Core) drain() (n, recvs int) {
	batch := c.batch
	for {
		k := c.cq.Poll(batch)
		for i := 0; i < k; i++ {
			comp := &batch[i]
			if comp.Type == OpReceive {
				if b, ok := comp.RequestContext.(*RecvBuf); ok && b.core == c {
					if !b.state.CompareAndSwap(bufPosted, bufHeld) {
						panic(fmt.Sprintf("transport: engine core %d: receive completion for buffer %d that is not posted (state %d)", c.index, b.index, b.state.Load()))
					}
					recvs++
				}
			}
			c.h.HandleCompletion(c, comp)
		}
		clear(batch[:k]) // drop references to contexts and errors
		n += k
		if k < len(batch) {
			return n, recvs
		}
	}
}

// RecvBuf is one receive buffer of a core's pool: a slice of the core's
// registered region and the SGE that names it. Its pointer is the request
// context of the receive that uses it, so a receive completion leads back
// to it without a lookup or an allocation.
type RecvBuf struct {
	core    *Core
	index   uint32
	state   atomic.Uint32
	nsge    uint8
	sge     [2]SGE // the buffer; split: the header, then the payload
	data    []byte
	payload []byte
}

// Bytes is the whole buffer (BufferSize bytes); with a split receive
// (EngineConfig.HeaderSize), the header: a message's first HeaderSize
// bytes.
func (b *RecvBuf) Bytes() []byte { return b.data }

// Payload is, with a split receive (EngineConfig.HeaderSize), the rest
// of the buffer: a message's bytes past its header, starting on a page.
// Nil without one.
func (b *RecvBuf) Payload() []byte { return b.payload }

// SGE names the first n bytes of the buffer (at most BufferSize; split,
// at most HeaderSize: of the header), so that
// a handler can send or write straight from a received buffer while it
// holds it (and give it back when that request completes).
func (b *RecvBuf) SGE(n uint32) SGE {
	s := b.sge[0]
	s.Length = min(n, s.Length)
	return s
}

// Index is the buffer's number in its core's pool.
func (b *RecvBuf) Index() int { return int(b.index) }

// Core is the core that owns the buffer.
func (b *RecvBuf) Core() *Core { return b.core }

// Repost gives the buffer back to its core's SRQ now (Core.Repost).
func (b *RecvBuf) Repost() error { return b.core.Repost(b) }

// Release gives the buffer back for the next refill (Core.Release).
func (b *RecvBuf) Release() { b.core.Release(b) }

// RecvBuf returns the engine buffer that the receive completion comp
// consumed, or nil if comp is not a receive of one of this core's buffers.
func (c *Core) RecvBuf(comp *Completion) *RecvBuf {
	if comp.Type != OpReceive {
		return nil
	}
	if b, ok := comp.RequestContext.(*RecvBuf); ok && b.core == c {
		return b
	}
	return nil
}

// RecvBuffer returns the message a receive completion delivered: the first
// comp.Bytes bytes of its buffer (split: of its header; the rest is in
// Payload), or nil if comp is not a receive of one of
// this core's buffers. The bytes stay valid until the buffer is given back.
func (c *Core) RecvBuffer(comp *Completion) []byte {
	b := c.RecvBuf(comp)
	if b == nil {
		return nil
	}
	return b.data[:min(int(comp.Bytes), len(b.data))]
}

// Repost gives a received buffer back to the SRQ at once; it may be called
// from any goroutine. If the SRQ refuses it (closed, or out of resources),
// the buffer goes to the free list for the next refill and the error is
// returned. Giving a buffer back twice panics.
func (c *Core) Repost(b *RecvBuf) error {
	c.checkOwn(b)
	if !b.state.CompareAndSwap(bufHeld, bufPosted) {
		panic(fmt.Sprintf("transport: engine core %d: buffer %d given back twice or never received (state %d)", c.index, b.index, b.state.Load()))
	}
	if err := c.srq.PostReceive(b, b.sge[:b.nsge]); err != nil {
		b.state.Store(bufFree)
		c.pushFree(b)
		c.st.repostFailures.Add(1)
		c.kick()
		return err
	}
	c.st.reposts.Add(1)
	if c.srqState.Load() == srqStarved {
		c.kick()
	}
	return nil
}

// Release gives a received buffer back to the core's free list; it may be
// called from any goroutine. Free buffers are posted in a batch by the next
// SRQ refill (when the SRQ falls below RefillThreshold), or at once if the
// SRQ is already starved. Use it to batch reposts; use Repost to keep the
// SRQ as full as possible. Giving a buffer back twice panics.
func (c *Core) Release(b *RecvBuf) {
	c.checkOwn(b)
	if !b.state.CompareAndSwap(bufHeld, bufFree) {
		panic(fmt.Sprintf("transport: engine core %d: buffer %d given back twice or never received (state %d)", c.index, b.index, b.state.Load()))
	}
	c.pushFree(b)
	c.st.releases.Add(1)
	if c.srqState.Load() == srqStarved {
		c.kick()
	}
}

func (c *Core) checkOwn(b *RecvBuf) {
	if b.core != c {
		panic("transport: engine: receive buffer given back to a core that does not own it")
	}
}

func (c *Core) pushFree(b *RecvBuf) {
	v := int32(b.index) + 1
	for {
		h := c.freeHead.Load()
		c.freeNext[b.index] = h
		if c.freeHead.CompareAndSwap(h, v) {
			return
		}
	}
}

// postFree takes the whole free list and posts it to the SRQ. A buffer the
// SRQ refuses goes back on the list with the ones after it. It returns the
// number posted.
func (c *Core) postFree() int {
	v := c.freeHead.Swap(0)
	n := 0
	for v != 0 {
		b := &c.bufs[v-1]
		v = c.freeNext[b.index]
		b.state.Store(bufPosted)
		if err := c.srq.PostReceive(b, b.sge[:b.nsge]); err != nil {
			b.state.Store(bufFree)
			c.pushFree(b)
			for v != 0 {
				r := &c.bufs[v-1]
				v = c.freeNext[r.index]
				c.pushFree(r)
			}
			return n
		}
		n++
	}
	return n
}

// srqNotified is the SRQ threshold notification: fewer than
// RefillThreshold receives are queued.
func (c *Core) srqNotified(status error) {
	if !c.enter() {
		return
	}
	defer c.exit()
	if status != nil {
		return // ErrClosed: the SRQ is going away
	}
	c.st.srqNotifications.Add(1)
	if !c.srqState.CompareAndSwap(srqArmed, srqRefilling) {
		return // closed (or a spurious notification while refilling)
	}
	c.refill()
}

// kick runs a refill on the caller's goroutine if the SRQ is starved.
func (c *Core) kick() {
	if c.srqState.CompareAndSwap(srqStarved, srqRefilling) {
		c.refill()
	}
}

// refill posts every free buffer and re-arms the threshold notification.
// It runs in state srqRefilling, entered by exactly one goroutine (the SRQ
// notification from srqArmed, or kick from srqStarved). If the SRQ is still
// below the threshold afterwards — every other buffer is held by handlers —
// re-arming would fire at once and spin, so the state becomes srqStarved
// instead, and the next Repost or Release kicks a new refill. The free list
// is checked again after entering srqStarved, so a buffer released just
// before cannot be stranded (its Release either sees srqStarved and kicks,
// or pushed before our check and is seen by it).
func (c *Core) refill() {
	for {
		if n := c.postFree(); n > 0 {
			c.st.srqRefills.Add(1)
			c.st.srqRefillBuffers.Add(uint64(n))
		}
		if c.srq.Queued() >= int(c.threshold) {
			if !c.srqState.CompareAndSwap(srqRefilling, srqArmed) {
				return // closed meanwhile
			}
			// Fires at once if the SRQ fell below again meanwhile (S4).
			c.srq.Modify(0, c.threshold)
			return
		}
		if !c.srqState.CompareAndSwap(srqRefilling, srqStarved) {
			return
		}
		c.st.srqStarved.Add(1)
		if c.freeHead.Load() == 0 || !c.srqState.CompareAndSwap(srqStarved, srqRefilling) {
			return
		}
	}
}

// close releases the core's objects: QPs, SRQ, CQ, then the region. The
// callbacks must already be stopped.
func (c *Core) close() error {
	var errs []error
	c.e.mu.Lock()
	qps := make([]QP, 0, len(c.qps))
	for qp := range c.qps {
		qps = append(qps, qp)
	}
	clear(c.qps)
	c.nqps = 0
	c.e.mu.Unlock()
	for _, qp := range qps {
		errs = append(errs, ignoreClosed(qp.Close()))
	}
	if c.srq != nil {
		errs = append(errs, ignoreClosed(c.srq.Close()))
	}
	if c.cq != nil {
		errs = append(errs, ignoreClosed(c.cq.Close()))
	}
	if c.mr != nil {
		errs = append(errs, ignoreClosed(c.mr.Close()))
	}
	return errors.Join(errs...)
}

func ignoreClosed(err error) error {
	if errors.Is(err, ErrClosed) {
		return nil
	}
	return err
}

// coreCounters are a core's plain counters: atomics, so that Stats can
// read them from any goroutine, added once per notification (not per
// completion) on the completion path.
type coreCounters struct {
	completions, notifications, emptyNotifications, receives   atomic.Uint64
	reposts, releases, repostFailures                          atomic.Uint64
	srqNotifications, srqRefills, srqRefillBuffers, srqStarved atomic.Uint64
	moderationChanges, moderationErrors, cqErrors              atomic.Uint64
	// The controller's own counters, copied at each change (every
	// decision they count causes one).
	moderationUps, moderationDowns                       atomic.Uint64
	moderationFailedProbes, moderationIdleResets         atomic.Uint64
	moderationLevel, moderationInterval, moderationCount atomic.Uint32
	pollSetCounters
}

// Stats are an engine's or a core's counters.
type Stats struct {
	// Completions handed to the Handler; Receives among them that
	// consumed an engine buffer.
	Completions, Receives uint64
	// Notifications is CQ notifications handled; EmptyNotifications
	// among them found the CQ empty (the arm-then-poll had taken the
	// completion that fired them).
	Notifications, EmptyNotifications uint64
	// Reposts: buffers given back with Repost and posted at once;
	// Releases: buffers given back with Release; RepostFailures: Reposts
	// the SRQ refused (the buffer went to the free list).
	Reposts, Releases, RepostFailures uint64
	// SRQNotifications: threshold notifications. SRQRefills: refills that
	// posted at least one buffer; SRQRefillBuffers: buffers they posted.
	// SRQStarved: times the SRQ stayed below the threshold with no free
	// buffer (every other buffer held by handlers).
	SRQNotifications, SRQRefills, SRQRefillBuffers, SRQStarved uint64
	// ModerationChanges: successful ControlInterruptModeration calls;
	// ModerationErrors: refused ones. Among the controller's decisions
	// behind them: probes up, timer-driven steps down, probes undone and
	// returns to off after a silence (see Moderator).
	ModerationChanges, ModerationErrors          uint64
	ModerationUps, ModerationDowns               uint64
	ModerationFailedProbes, ModerationIdleResets uint64
	// CQErrors: CQ overruns and failed re-arms.
	CQErrors uint64
	// PollWakes: times a core's poll set woke its goroutine (a watched
	// descriptor fired, or Wake found the core idle); see PollHandler.
	PollWakes uint64
	// QPs placed (engine: on all cores).
	QPs int
	// Moderation is the core's current setting (engine: of core 0).
	Moderation ModerationLevel
	// SRQQueued is the receives queued on the SRQ(s) now.
	SRQQueued int
}

// CompletionsPerNotification is Completions / Notifications (0 if none).
func (s Stats) CompletionsPerNotification() float64 {
	if s.Notifications == 0 {
		return 0
	}
	return float64(s.Completions) / float64(s.Notifications)
}

// add sums every counter of o into s (not Moderation).
func (s *Stats) add(o Stats) {
	s.Completions += o.Completions
	s.Receives += o.Receives
	s.Notifications += o.Notifications
	s.EmptyNotifications += o.EmptyNotifications
	s.Reposts += o.Reposts
	s.Releases += o.Releases
	s.RepostFailures += o.RepostFailures
	s.SRQNotifications += o.SRQNotifications
	s.SRQRefills += o.SRQRefills
	s.SRQRefillBuffers += o.SRQRefillBuffers
	s.SRQStarved += o.SRQStarved
	s.ModerationChanges += o.ModerationChanges
	s.ModerationErrors += o.ModerationErrors
	s.ModerationUps += o.ModerationUps
	s.ModerationDowns += o.ModerationDowns
	s.ModerationFailedProbes += o.ModerationFailedProbes
	s.ModerationIdleResets += o.ModerationIdleResets
	s.CQErrors += o.CQErrors
	s.PollWakes += o.PollWakes
	s.QPs += o.QPs
	s.SRQQueued += o.SRQQueued
}

// Stats returns the core's counters.
func (c *Core) Stats() Stats {
	s := Stats{
		Completions:            c.st.completions.Load(),
		Receives:               c.st.receives.Load(),
		Notifications:          c.st.notifications.Load(),
		EmptyNotifications:     c.st.emptyNotifications.Load(),
		Reposts:                c.st.reposts.Load(),
		Releases:               c.st.releases.Load(),
		RepostFailures:         c.st.repostFailures.Load(),
		SRQNotifications:       c.st.srqNotifications.Load(),
		SRQRefills:             c.st.srqRefills.Load(),
		SRQRefillBuffers:       c.st.srqRefillBuffers.Load(),
		SRQStarved:             c.st.srqStarved.Load(),
		ModerationChanges:      c.st.moderationChanges.Load(),
		ModerationErrors:       c.st.moderationErrors.Load(),
		ModerationUps:          c.st.moderationUps.Load(),
		ModerationDowns:        c.st.moderationDowns.Load(),
		ModerationFailedProbes: c.st.moderationFailedProbes.Load(),
		ModerationIdleResets:   c.st.moderationIdleResets.Load(),
		CQErrors:               c.st.cqErrors.Load(),
		PollWakes:              c.st.pollWakes.Load(),
		QPs:                    c.QPs(),
		Moderation: ModerationLevel{
			Interval: c.st.moderationInterval.Load(),
			Count:    c.st.moderationCount.Load(),
		},
	}
	if c.srq != nil && c.srqState.Load() != srqClosed {
		s.SRQQueued = c.srq.Queued()
	}
	return s
}
