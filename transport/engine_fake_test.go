package transport

import (
	"context"
	"net"
	"sync"
)

// A deterministic in-memory provider for the engine's unit tests: nothing
// runs on its own. The test pushes completions and fires notifications
// synchronously, so every interleaving is chosen by the test. It allocates
// nothing on the push/poll/post paths, so the engine's allocation guard
// measures the engine alone.

type fakeAdapter struct {
	info AdapterInfo
	mu   sync.Mutex
	cqs  []*fakeCQ
	pds  []*fakePD
}

func newFakeAdapter(cores int, moderation bool) *fakeAdapter {
	info := AdapterInfo{
		MaxRegistrationSize:    1 << 32,
		MaxInitiatorRequestSge: 4,
		MaxReceiveRequestSge:   4,
		MaxTransferLength:      1 << 20,
		MaxInlineDataSize:      64,
		MaxReceiveQueueDepth:   1024,
		MaxInitiatorQueueDepth: 1024,
		MaxSrqDepth:            1 << 14,
		MaxCqDepth:             1 << 16,
		Cores:                  cores,
	}
	if moderation {
		info.Flags |= FlagCQInterruptModerationSupported
	}
	return &fakeAdapter{info: info}
}

func (a *fakeAdapter) Info() AdapterInfo { return a.info }

func (a *fakeAdapter) CreatePD() (PD, error) {
	p := &fakePD{a: a}
	a.mu.Lock()
	a.pds = append(a.pds, p)
	a.mu.Unlock()
	return p, nil
}

func (a *fakeAdapter) CreateCQ(cfg CQConfig) (CQ, error) {
	if cfg.Depth > a.info.MaxCqDepth {
		return nil, ErrInvalidParameter
	}
	c := &fakeCQ{cfg: cfg, ring: make([]Completion, cfg.Depth)}
	a.mu.Lock()
	a.cqs = append(a.cqs, c)
	a.mu.Unlock()
	return c, nil
}

func (a *fakeAdapter) Listen(string) (Listener, error) { return nil, ErrNotSupported }
func (a *fakeAdapter) Connect(context.Context, QP, string, ConnParams) ([]byte, error) {
	return nil, ErrNotSupported
}
func (a *fakeAdapter) Close() error { return nil }

type fakePD struct {
	a    *fakeAdapter
	mu   sync.Mutex
	srqs []*fakeSRQ
	qps  []*fakeQP
	mrs  []*fakeMR
}

func (p *fakePD) RegisterMemory(buf []byte, access Access) (MemoryRegion, error) {
	m := &fakeMR{buf: buf, key: uint32(len(p.mrs) + 1)}
	p.mu.Lock()
	p.mrs = append(p.mrs, m)
	p.mu.Unlock()
	return m, nil
}

func (p *fakePD) AllocateMemory(length int, access Access) (MemoryRegion, error) {
	return p.RegisterMemory(make([]byte, length), access)
}

func (p *fakePD) CreateQP(cfg QPConfig) (QP, error) {
	if cfg.InitiatorQueueDepth > p.a.info.MaxInitiatorQueueDepth || cfg.InlineDataSize > p.a.info.MaxInlineDataSize {
		return nil, ErrInvalidParameter
	}
	q := &fakeQP{cfg: cfg}
	p.mu.Lock()
	p.qps = append(p.qps, q)
	p.mu.Unlock()
	return q, nil
}

func (p *fakePD) CreateSRQ(cfg SRQConfig) (SRQ, error) {
	if cfg.Depth > p.a.info.MaxSrqDepth {
		return nil, ErrInvalidParameter
	}
	s := &fakeSRQ{cfg: cfg, ring: make([]fakeRecv, cfg.Depth), threshold: cfg.NotifyThreshold, armed: cfg.NotifyThreshold > 0}
	p.mu.Lock()
	p.srqs = append(p.srqs, s)
	p.mu.Unlock()
	return s, nil
}
func (p *fakePD) Close() error { return nil }

type fakeMR struct {
	buf    []byte
	key    uint32
	closed bool
}

func (m *fakeMR) LKey() uint32  { return m.key }
func (m *fakeMR) RKey() uint32  { return m.key }
func (m *fakeMR) Addr() uint64  { return 0x1000 }
func (m *fakeMR) Bytes() []byte { return m.buf }
func (m *fakeMR) SGE(off, n uint32) SGE {
	return SGE{Addr: 0x1000 + uint64(off), Length: n, LKey: m.key}
}
func (m *fakeMR) Close() error { m.closed = true; return nil }

// fakeCQ is a ring; Fire runs the notification if armed.
type fakeCQ struct {
	mu      sync.Mutex
	cfg     CQConfig
	ring    []Completion
	head, n int
	armed   bool
	closed  bool
	arms    int
	// onArm, if set, runs after each Arm (outside the lock): it lets a
	// test land a completion between the arm and the post-arm poll.
	onArm func()
	mods  []ModerationLevel
}

func (c *fakeCQ) push(comp Completion) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == len(c.ring) {
		panic("fake CQ overrun")
	}
	c.ring[(c.head+c.n)%len(c.ring)] = comp
	c.n++
}

// fire delivers the notification if the CQ is armed and not empty, as a
// provider's notification goroutine would; it reports whether it did.
func (c *fakeCQ) fire() bool {
	c.mu.Lock()
	if !c.armed || c.n == 0 || c.closed {
		c.mu.Unlock()
		return false
	}
	c.armed = false
	c.mu.Unlock()
	c.cfg.Notify(c.cfg.Context, nil)
	return true
}

// fireForce delivers a notification whatever the state (a spurious one,
// or one with a status).
func (c *fakeCQ) fireStatus(status error) {
	c.mu.Lock()
	c.armed = false
	c.mu.Unlock()
	c.cfg.Notify(c.cfg.Context, status)
}

func (c *fakeCQ) Poll(out []Completion) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := min(c.n, len(out))
	for i := 0; i < k; i++ {
		out[i] = c.ring[c.head]
		c.ring[c.head] = Completion{}
		c.head = (c.head + 1) % len(c.ring)
	}
	c.n -= k
	return k
}

func (c *fakeCQ) Arm(ArmType) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.armed = true
	c.arms++
	hook := c.onArm
	c.mu.Unlock()
	if hook != nil {
		hook()
	}
	return nil
}

func (c *fakeCQ) ControlInterruptModeration(interval, count uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mods = append(c.mods, ModerationLevel{Interval: interval, Count: count})
	return nil
}
func (c *fakeCQ) Depth() uint32 { return c.cfg.Depth }
func (c *fakeCQ) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}

type fakeRecv struct {
	ctx any
	sge SGE
}

// fakeSRQ is a ring of receives; a threshold crossing sets pending, and
// pump delivers the notification (as the SRQ's goroutine would).
type fakeSRQ struct {
	mu        sync.Mutex
	cfg       SRQConfig
	ring      []fakeRecv
	head, n   int
	threshold uint32
	armed     bool
	pending   bool
	closed    bool
	failPost  bool
	modifies  int
}

func (s *fakeSRQ) PostReceive(ctx any, sges []SGE) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrInvalidDeviceState
	}
	if s.failPost || s.n == len(s.ring) {
		return ErrInsufficientResources
	}
	s.ring[(s.head+s.n)%len(s.ring)] = fakeRecv{ctx: ctx, sge: sges[0]}
	s.n++
	return nil
}

// take consumes the oldest receive, as an arriving message would.
func (s *fakeSRQ) take() (fakeRecv, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return fakeRecv{}, false
	}
	r := s.ring[s.head]
	s.ring[s.head] = fakeRecv{}
	s.head = (s.head + 1) % len(s.ring)
	s.n--
	if s.armed && uint32(s.n) < s.threshold {
		s.armed = false
		s.pending = true
	}
	return r, true
}

// pump delivers a pending threshold notification.
func (s *fakeSRQ) pump() bool {
	s.mu.Lock()
	p := s.pending
	s.pending = false
	s.mu.Unlock()
	if p {
		s.cfg.Notify(s.cfg.Context, nil)
	}
	return p
}

func (s *fakeSRQ) Modify(depth, threshold uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.modifies++
	s.threshold = threshold
	s.armed = threshold > 0
	if s.armed && uint32(s.n) < threshold {
		s.armed = false
		s.pending = true
	}
	return nil
}

func (s *fakeSRQ) Queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *fakeSRQ) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

type fakeQP struct {
	cfg    QPConfig
	closed bool
}

func (q *fakeQP) Context() any                     { return q.cfg.Context }
func (q *fakeQP) PostReceive(any, []SGE) error     { return ErrNotSupported }
func (q *fakeQP) Send(any, []SGE, PostFlags) error { return nil }
func (q *fakeQP) SendInvalidate(any, []SGE, uint32, PostFlags) error {
	return nil
}
func (q *fakeQP) Write(any, []SGE, uint64, uint32, PostFlags) error { return nil }
func (q *fakeQP) Read(any, []SGE, uint64, uint32, PostFlags) error  { return nil }
func (q *fakeQP) Disconnect() error                                 { return nil }
func (q *fakeQP) Done() <-chan struct{}                             { return nil }
func (q *fakeQP) Err() error                                        { return nil }
func (q *fakeQP) LocalAddr() net.Addr                               { return nil }
func (q *fakeQP) RemoteAddr() net.Addr                              { return nil }
func (q *fakeQP) Close() error                                      { q.closed = true; return nil }

var (
	_ Adapter = (*fakeAdapter)(nil)
	_ QP      = (*fakeQP)(nil)
)
