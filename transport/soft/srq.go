package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/blk-project/blk/transport"
)

// recvWR is a posted receive.
type recvWR struct {
	ctx  any
	n    uint8
	sges [maxSge]transport.SGE
}

// recvQueue is a ring of posted receives: a QP's own receive queue or an
// SRQ. Posts come from the consumer, takes from QP receiver goroutines.
type recvQueue struct {
	mu     sync.Mutex
	ring   []recvWR
	head   uint32
	n      uint32
	depth  uint32
	maxSge uint32
	closed bool
	// SRQ threshold (S4): armed when threshold > 0 and not yet fired.
	threshold uint32
	armed     bool
	onLow     func() // called (without mu) when the level falls below threshold
	// posted, when not nil, is closed by the next post (or close): the
	// receivers waiting for a receive (takeWait) sleep on it. Made only
	// when one must wait, so it costs nothing while receives are queued.
	posted chan struct{}
	// pollWaiters are poll-group QPs whose next message waits for a
	// receive (takeOrPark); the next post marks them. Grown only when
	// the queue runs empty, which is when it may allocate.
	pollWaiters []*qp
}

func newRecvQueue(depth, maxSge uint32) *recvQueue {
	return &recvQueue{ring: make([]recvWR, depth), depth: depth, maxSge: maxSge}
}

func (q *recvQueue) post(ctx any, sges []transport.SGE) error {
	if uint32(len(sges)) > q.maxSge {
		return fmt.Errorf("soft: receive with %d SGEs (max %d): %w", len(sges), q.maxSge, transport.ErrInvalidParameter)
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return transport.ErrInvalidDeviceState
	}
	if q.n == q.depth {
		q.mu.Unlock()
		return transport.ErrInsufficientResources
	}
	i := q.head + q.n
	if i >= q.depth {
		i -= q.depth
	}
	w := &q.ring[i]
	w.ctx = ctx
	w.n = uint8(copy(w.sges[:], sges))
	q.n++
	parked := q.wakeWaiters()
	q.mu.Unlock()
	markParked(parked)
	return nil
}

// takeOrPark is take for a poll-group QP: with no receive queued it
// parks w, whose group looks again after the next post (parked). Neither
// taken nor parked: the queue is closed.
func (q *recvQueue) takeOrPark(out *recvWR, w *qp) (taken, parked bool) {
	for {
		if q.take(out) {
			return true, false
		}
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return false, false
		}
		if q.n > 0 { // posted between take and here
			q.mu.Unlock()
			continue
		}
		q.pollWaiters = append(q.pollWaiters, w)
		q.mu.Unlock()
		return false, true
	}
}

// wakeWaiters wakes the receiver goroutines waiting for a receive
// (takeWait) and hands back the parked poll-group QPs (takeOrPark), for
// markParked once q.mu is released. Requires q.mu.
func (q *recvQueue) wakeWaiters() []*qp {
	if q.posted != nil {
		close(q.posted)
		q.posted = nil
	}
	parked := q.pollWaiters
	q.pollWaiters = nil
	return parked
}

// markParked tells each parked QP's group to look again.
func markParked(parked []*qp) {
	for _, w := range parked {
		w.recvPosted.Store(true)
		w.poll.mark(w)
	}
}

// takeWait is take for a QP on an SRQ (transport.FlagSRQReceiverWait):
// with no receive queued it waits until one is posted, or until done
// closes or the queue is closed (false).
func (q *recvQueue) takeWait(out *recvWR, done <-chan struct{}) bool {
	for {
		if q.take(out) {
			return true
		}
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return false
		}
		if q.n > 0 { // posted between take and here
			q.mu.Unlock()
			continue
		}
		if q.posted == nil {
			q.posted = make(chan struct{})
		}
		posted := q.posted
		q.mu.Unlock()
		select {
		case <-posted:
		case <-done:
			return false
		}
	}
}

// take removes the oldest receive into out; false when none is queued.
func (q *recvQueue) take(out *recvWR) bool {
	q.mu.Lock()
	if q.n == 0 || q.closed {
		q.mu.Unlock()
		return false
	}
	w := &q.ring[q.head]
	*out = *w
	w.ctx = nil
	q.head++
	if q.head == q.depth {
		q.head = 0
	}
	q.n--
	fire := q.armed && q.n < q.threshold
	if fire {
		q.armed = false
	}
	q.mu.Unlock()
	if fire {
		q.onLow()
	}
	return true
}

// drain closes the queue and returns what was queued (to flush).
func (q *recvQueue) drain() []recvWR {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	defer markParked(q.wakeWaiters()) // runs after the unlock
	out := make([]recvWR, 0, q.n)
	for q.n > 0 {
		out = append(out, q.ring[q.head])
		q.ring[q.head] = recvWR{}
		q.head++
		if q.head == q.depth {
			q.head = 0
		}
		q.n--
	}
	return out
}

// srq is a shared receive queue with a threshold notification goroutine.
type srq struct {
	pd     *pd
	q      *recvQueue
	notify transport.NotifyFunc
	nctx   any
	cpu    int
	kick   chan struct{}
	stop   chan struct{}
	closed atomic.Bool
}

func (p *pd) CreateSRQ(cfg transport.SRQConfig) (transport.SRQ, error) {
	info := p.a.info
	if cfg.Depth == 0 || cfg.Depth > info.MaxSrqDepth {
		return nil, fmt.Errorf("soft: SRQ depth %d (max %d): %w", cfg.Depth, info.MaxSrqDepth, transport.ErrInvalidParameter)
	}
	if cfg.MaxSge > info.MaxReceiveRequestSge {
		return nil, fmt.Errorf("soft: SRQ SGE limit %d (max %d): %w", cfg.MaxSge, info.MaxReceiveRequestSge, transport.ErrInvalidParameter)
	}
	if cfg.NotifyThreshold > cfg.Depth {
		return nil, fmt.Errorf("soft: SRQ threshold %d above depth %d: %w", cfg.NotifyThreshold, cfg.Depth, transport.ErrInvalidParameter)
	}
	if err := p.a.check(); err != nil {
		return nil, err
	}
	sge := cfg.MaxSge
	if sge == 0 {
		sge = 1
	}
	s := &srq{
		pd:     p,
		q:      newRecvQueue(cfg.Depth, sge),
		notify: cfg.Notify,
		nctx:   cfg.Context,
		cpu:    cfg.Affinity,
		kick:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	s.q.onLow = s.wake
	s.q.threshold = cfg.NotifyThreshold
	s.q.armed = cfg.NotifyThreshold > 0
	started := make(chan struct{})
	go s.run(started)
	<-started
	// S4: an SRQ created empty with a threshold is already below it.
	if s.q.armed && s.q.n < s.q.threshold {
		s.q.armed = false
		s.wake()
	}
	return s, nil
}

func (s *srq) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *srq) run(started chan<- struct{}) {
	pinThread(s.cpu)
	close(started)
	for {
		select {
		case <-s.kick:
			if s.notify != nil {
				s.notify(s.nctx, nil)
			}
		case <-s.stop:
			return
		}
	}
}

func (s *srq) PostReceive(ctx any, sges []transport.SGE) error {
	return s.q.post(ctx, sges)
}

// Modify changes the depth (growing only; 0 keeps it) and re-arms the
// threshold notification, firing at once when already below it (S4).
func (s *srq) Modify(depth, threshold uint32) error {
	if s.closed.Load() {
		return transport.ErrClosed
	}
	q := s.q
	q.mu.Lock()
	if depth != 0 && depth != q.depth {
		if depth > s.pd.a.info.MaxSrqDepth || depth < q.n {
			q.mu.Unlock()
			return fmt.Errorf("soft: SRQ depth %d (queued %d, max %d): %w", depth, q.n, s.pd.a.info.MaxSrqDepth, transport.ErrInvalidParameter)
		}
		ring := make([]recvWR, depth)
		for j := uint32(0); j < q.n; j++ {
			i := q.head + j
			if i >= q.depth {
				i -= q.depth
			}
			ring[j] = q.ring[i]
		}
		q.ring, q.head, q.depth = ring, 0, depth
	}
	if threshold > q.depth {
		q.mu.Unlock()
		return fmt.Errorf("soft: SRQ threshold %d above depth %d: %w", threshold, q.depth, transport.ErrInvalidParameter)
	}
	q.threshold = threshold
	q.armed = threshold > 0
	fire := q.armed && q.n < threshold
	if fire {
		q.armed = false
	}
	q.mu.Unlock()
	if fire {
		s.wake()
	}
	return nil
}

func (s *srq) Queued() int {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	return int(s.q.n)
}

func (s *srq) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.q.mu.Lock()
	s.q.closed = true
	parked := s.q.wakeWaiters()
	s.q.mu.Unlock()
	markParked(parked)
	close(s.stop)
	return nil
}
