package initiator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/transport"
)

// ErrTimeout is the cause of a failure when a command (Keep Alive
// included) was not answered within its timeout. It is found with
// errors.Is on the ErrConnectionLost errors it leads to.
var ErrTimeout = errors.New("initiator: command timed out")

// State is a Controller's state. Transitions: Live → Reconnecting (the
// association failed) → Live (reconnected) or Lost (CtrlLossTimeout
// passed, or a Connect refused with DNR); any → Closed (Close).
type State int32

const (
	StateLive State = iota + 1
	StateReconnecting
	StateLost
	StateClosed
)

func (s State) String() string {
	switch s {
	case StateLive:
		return "live"
	case StateReconnecting:
		return "reconnecting"
	case StateLost:
		return "lost"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("state(%d)", int32(s))
}

// Controller is a connected NVMe-oF controller: its admin queue, its I/O
// queues and its namespaces. It survives failures of its association by
// reconnecting (see package doc). Its methods are safe for concurrent use.
type Controller struct {
	cfg       Config
	addr      string
	subNQN    string
	discovery bool
	// discNotice, on a persistent discovery controller (WatchDiscovery),
	// gets a value for each discovery log change notice; nil otherwise.
	discNotice chan struct{}
	// tcp: the queues are NVMe/TCP connections (Config.Transport); no
	// adapter, engine or protection domain then (info, sz, pd and eng
	// are zero).
	tcp  bool
	info transport.AdapterInfo
	sz   sizing
	pd   transport.PD
	eng  *transport.Engine
	// authTID numbers the DH-HMAC-CHAP transactions of the controller.
	authTID atomic.Uint32

	// assoc is the installed association (live, or failed and about to
	// be replaced). The I/O path reads it without a lock.
	assoc atomic.Pointer[association]
	rr    atomic.Uint32 // round-robin queue choice

	mu      sync.Mutex
	state   State
	liveCh  chan struct{} // closed when StateReconnecting ends
	lostErr error         // why the controller is Lost
	nss     map[uint32]*Namespace

	kick    chan struct{} // wakes the supervisor: an association failed
	closing chan struct{}
	wg      sync.WaitGroup

	st ctrlCounters
}

type ctrlCounters struct {
	associations, failures, reconnectAttempts, connectRetries, queueFull atomic.Uint64
	dataDigestErrors                                                     atomic.Uint64
}

// Stats are a controller's counters.
type Stats struct {
	// Associations established (the first connect and every reconnect).
	Associations uint64
	// Failures of an association (each starts a reconnect).
	Failures uint64
	// ReconnectAttempts made, successful or not.
	ReconnectAttempts uint64
	// ConnectRetries: associations made anew because a queue's Fabrics
	// Connect went unanswered (see connectAnswerTimeout).
	ConnectRetries uint64
	// QueueFull: asynchronous submissions refused with ErrQueueFull.
	QueueFull uint64
	// DataDigestErrors: NVMe/TCP commands failed with Data Transfer
	// Error because a C2HData's data digest did not match.
	DataDigestErrors uint64
}

// Stats returns the controller's counters.
func (c *Controller) Stats() Stats {
	return Stats{
		Associations:      c.st.associations.Load(),
		Failures:          c.st.failures.Load(),
		ReconnectAttempts: c.st.reconnectAttempts.Load(),
		ConnectRetries:    c.st.connectRetries.Load(),
		QueueFull:         c.st.queueFull.Load(),
		DataDigestErrors:  c.st.dataDigestErrors.Load(),
	}
}

// association is one life of the controller: a CNTLID, its queues, what
// Identify said. It is built by establish, fails once, and is torn down;
// reconnecting builds a new one.
type association struct {
	c *Controller

	mu       sync.Mutex
	queues   []*queue // every queue created so far, admin first
	err      error    // why it failed
	failed   atomic.Bool
	tornDown atomic.Bool
	done     chan struct{} // closed when it fails
	wg       sync.WaitGroup

	admin     *queue
	io        []*queue // immutable once installed
	cntlid    uint16
	cap       nvme.CAP
	cc        nvme.CC
	vs        nvme.Version
	id        ctrlIdentity
	depth     int // I/O queue entries
	maxXfer   int // largest transfer of one I/O command
	inCapsule int // I/O in-capsule data bytes

	connectAnswer time.Duration // how long a queue's Connect waits for its answer

	kaOn  atomic.Bool // keep-alive running (after enable)
	kaOut atomic.Bool // a Keep Alive is in flight
	ka    kaCallback
	aer   aerCallback
	aerCh chan uint32
}

// Connect connects to subsystem subNQN at addr ("host:port"; port 4420 if
// absent) over the transport Config.Transport names (NVMe/RDMA through
// Config.Adapter by default, or NVMe/TCP): the admin queue, the enable
// handshake, Identify, the I/O
// queues and the namespace scan, in the order of the Linux host
// (shared/docs/nvmeof-wire.md §8). Any failure fails the connect (it is
// not retried, as in Linux); ctx bounds it. Once connected, failures are
// recovered by reconnecting.
func Connect(ctx context.Context, cfg Config, addr, subNQN string) (*Controller, error) {
	if err := nvme.ValidateNQN(subNQN); err != nil {
		return nil, fmt.Errorf("%w: subsystem NQN %q: %v", ErrInvalidConfig, subNQN, err)
	}
	c, err := newController(cfg, addr, subNQN, false)
	if err != nil {
		return nil, err
	}
	a, err := c.establish(ctx)
	if err != nil {
		c.closeEngine()
		return nil, err
	}
	c.state = StateLive
	c.install(a)
	c.wg.Add(1)
	go c.supervise()
	return c, nil
}

func newController(cfg Config, addr, subNQN string, discovery bool) (*Controller, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tcp := cfg.Transport == TransportTCP
	port := DefaultPort
	if tcp && discovery {
		port = nvme.TCPDiscoveryPort
	}
	addr = withDefaultPort(addr, port)
	c := &Controller{
		cfg:       cfg,
		addr:      addr,
		subNQN:    subNQN,
		discovery: discovery,
		tcp:       tcp,
		nss:       make(map[uint32]*Namespace),
		kick:      make(chan struct{}, 1),
		closing:   make(chan struct{}),
	}
	if tcp {
		return c, nil // one TCP connection per queue: nothing shared to set up
	}
	c.info = cfg.Adapter.Info()
	queues, depth := cfg.Queues, cfg.QueueDepth
	if discovery {
		queues = 0
	}
	var err error
	if c.sz, err = engineSizing(c.info, queues, depth); err != nil {
		return nil, err
	}
	c.sz.Engine.NoPin = !cfg.PinCores
	if c.pd, err = cfg.Adapter.CreatePD(); err != nil {
		return nil, fmt.Errorf("initiator: create protection domain: %w", err)
	}
	if c.eng, err = transport.NewEngine(cfg.Adapter, c.pd, c.sz.Engine, c); err != nil {
		c.pd.Close()
		return nil, fmt.Errorf("initiator: create transport engine: %w", err)
	}
	return c, nil
}

func withDefaultPort(addr, port string) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	return net.JoinHostPort(addr, port)
}

// adminInCapsule is the admin queue's in-capsule data size: none on RDMA
// (Linux sends admin data keyed), 8192 bytes on TCP (NVME_TCP_ADMIN_CCSZ).
func (c *Controller) adminInCapsule() int {
	if c.tcp {
		return nvme.TCPAdminInCapsule
	}
	return 0
}

func (c *Controller) logf(format string, args ...any) {
	c.cfg.Logf("initiator %s %s: "+format, append([]any{c.addr, c.subNQN}, args...)...)
}

func (c *Controller) closeEngine() {
	if c.eng != nil {
		c.eng.Close()
	}
	if c.pd != nil {
		c.pd.Close()
	}
}

// State returns the controller's current state.
func (c *Controller) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// CNTLID returns the controller ID of the current association.
func (c *Controller) CNTLID() uint16 {
	if a := c.assoc.Load(); a != nil {
		return a.cntlid
	}
	return 0
}

// Info describes the controller as the current association found it.
type Info struct {
	CNTLID       uint16
	SerialNumber string
	Model        string
	Firmware     string
	Version      nvme.Version
	SubNQN       string
	// IOQueues and QueueDepth are what was granted and clamped.
	IOQueues, QueueDepth int
	// MaxTransfer is the largest transfer of one I/O command, in bytes.
	MaxTransfer int
	// InCapsule is the largest write sent inside the command capsule.
	InCapsule int
	// VolatileWriteCache: Flush and FUA matter.
	VolatileWriteCache bool
	// Transport is TransportRDMA or TransportTCP.
	Transport string
}

// Info returns what the current association found.
func (c *Controller) Info() Info {
	a := c.assoc.Load()
	if a == nil {
		return Info{}
	}
	return Info{
		CNTLID: a.cntlid, SerialNumber: a.id.SerialNumber, Model: a.id.Model, Firmware: a.id.Firmware,
		Version: a.vs, SubNQN: a.id.SubNQN, IOQueues: len(a.io), QueueDepth: a.depth,
		MaxTransfer: a.maxXfer, InCapsule: a.inCapsule, VolatileWriteCache: a.id.VWC&vwcPresent != 0,
		Transport: c.cfg.Transport,
	}
}

// install makes a the current association.
func (c *Controller) install(a *association) {
	c.assoc.Store(a)
	c.st.associations.Add(1)
	if a.failed.Load() {
		c.kickSupervisor() // it failed while being installed
	}
}

func (c *Controller) kickSupervisor() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Down returns a channel that is closed when the association in use now
// fails: the controller is then reconnecting, lost or closed (State says
// which). It lets a caller that follows a volume across nodes learn of a
// failure that the blocking calls wait out (they wait for the reconnect).
// After a reconnect, call it again for the new association.
func (c *Controller) Down() <-chan struct{} { return c.assoc.Load().done }

// errReconnecting is what the asynchronous path returns while there is no
// live association.
var errReconnecting = fmt.Errorf("%w: controller is reconnecting", ErrConnectionLost)

// liveAssoc returns the live association for a non-blocking submission,
// or why there is none.
func (c *Controller) liveAssoc() (*association, error) {
	if a := c.assoc.Load(); a != nil && !a.failed.Load() {
		return a, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.state {
	case StateLost:
		return nil, c.lostErr
	case StateClosed:
		return nil, ErrClosed
	}
	return nil, errReconnecting
}

// waitLive returns the live association, waiting while the controller
// reconnects (bounded by CtrlLossTimeout: the controller is Lost then).
func (c *Controller) waitLive(ctx context.Context) (*association, error) {
	for {
		if a := c.assoc.Load(); a != nil && !a.failed.Load() {
			return a, nil
		}
		c.mu.Lock()
		switch c.state {
		case StateLost:
			c.mu.Unlock()
			return nil, c.lostErr
		case StateClosed:
			c.mu.Unlock()
			return nil, ErrClosed
		}
		ch := c.liveCh
		c.mu.Unlock()
		if ch == nil {
			// Failed but the supervisor has not moved to Reconnecting
			// yet: wait for it briefly.
			ch = make(chan struct{})
			time.AfterFunc(time.Millisecond, func() { close(ch) })
		}
		select {
		case <-ch:
		case <-c.closing:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// supervise runs for the life of the controller: when the installed
// association fails it tears it down and reconnects.
func (c *Controller) supervise() {
	defer c.wg.Done()
	for {
		select {
		case <-c.kick:
		case <-c.closing:
			return
		}
		a := c.assoc.Load()
		if a == nil || !a.failed.Load() || a.tornDown.Load() {
			continue
		}
		c.st.failures.Add(1)
		c.logf("association (CNTLID %#x) failed: %v; reconnecting", a.cntlid, a.lostErr())
		c.mu.Lock()
		if c.state != StateLive {
			c.mu.Unlock()
			c.teardown(a)
			return
		}
		if c.cfg.NoReconnect {
			c.mu.Unlock()
			c.teardown(a)
			c.lose(fmt.Errorf("%w: association failed and reconnecting is off (Config.NoReconnect): %w", ErrControllerLost, a.lostErr()))
			return
		}
		c.state = StateReconnecting
		c.liveCh = make(chan struct{})
		c.mu.Unlock()
		c.teardown(a)
		if !c.reconnect() {
			return
		}
	}
}

// reconnect re-establishes the association with exponential backoff
// until CtrlLossTimeout. It returns false when the controller ended (Lost
// or Closed).
func (c *Controller) reconnect() bool {
	deadline := time.Now().Add(c.cfg.CtrlLossTimeout)
	delay := c.cfg.ReconnectDelay
	var last error
	for {
		wait := min(delay, time.Until(deadline))
		if wait <= 0 {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.closing:
			t.Stop()
			return false
		}
		c.st.reconnectAttempts.Add(1)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		go func() {
			select {
			case <-c.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		a, err := c.establish(ctx)
		cancel()
		if err == nil {
			c.mu.Lock()
			if c.state == StateClosed {
				c.mu.Unlock()
				c.teardown(a)
				return false
			}
			c.state = StateLive
			close(c.liveCh)
			c.liveCh = nil
			c.install(a)
			c.mu.Unlock()
			c.logf("reconnected: CNTLID %#x, %d I/O queues", a.cntlid, len(a.io))
			return true
		}
		last = err
		c.logf("reconnect failed: %v", err)
		if isConnectDNR(err) {
			c.lose(fmt.Errorf("%w: reconnect refused: %w", ErrControllerLost, err))
			return false
		}
		delay = min(2*delay, c.cfg.MaxReconnectDelay)
	}
	c.lose(fmt.Errorf("%w: not reconnected within %v: %w", ErrControllerLost, c.cfg.CtrlLossTimeout, last))
	return false
}

// lose makes the controller Lost for good.
func (c *Controller) lose(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == StateClosed {
		return
	}
	c.state = StateLost
	c.lostErr = err
	if c.liveCh != nil {
		close(c.liveCh)
		c.liveCh = nil
	}
	for _, ns := range c.nss {
		ns.markRemoved()
	}
	c.logf("%v", err)
}

// Close shuts the controller down (CC.SHN = normal, waiting for
// CSTS.SHST = complete up to ShutdownTimeout), disconnects every queue and
// releases the transport resources. Commands still in flight complete
// with an error matching ErrClosed. It does not close the Adapter.
func (c *Controller) Close() error {
	c.mu.Lock()
	if c.state == StateClosed {
		c.mu.Unlock()
		return nil
	}
	c.state = StateClosed
	if c.liveCh != nil {
		close(c.liveCh)
		c.liveCh = nil
	}
	close(c.closing)
	c.mu.Unlock()
	c.wg.Wait() // the supervisor is gone: nothing installs or tears down now
	var err error
	if a := c.assoc.Load(); a != nil {
		if !a.failed.Load() {
			// Bounded as a whole by the shutdown timeout, so that Close
			// returns in time even from a controller that stopped
			// answering.
			st := c.shutdownTimeout(a)
			ctx, cancel := context.WithTimeoutCause(context.Background(), st,
				fmt.Errorf("%w: shutdown not complete within %v", ErrClosed, st))
			err = a.shutdown(ctx)
			cancel()
		}
		a.fail(ErrClosed)
		c.teardown(a)
	}
	c.closeEngine()
	return err
}

// teardown disconnects the association's queues (QPs or TCP
// connections), waits for its goroutines and releases its memory. The
// association has failed (or fails now).
func (c *Controller) teardown(a *association) {
	a.fail(fmt.Errorf("%w: association torn down", ErrConnectionLost))
	if !a.tornDown.CompareAndSwap(false, true) {
		return
	}
	a.mu.Lock()
	qs := a.queues
	a.mu.Unlock()
	for _, q := range qs {
		q.w.close()
	}
	a.wg.Wait()
	c.releaseMemory(qs)
}

// memoryIdleTimeout bounds how long teardown waits for the slots of a
// dead association to be given back before it leaks their memory
// instead: a slot is held only while a submitter fills it or a completion
// finishes it, both short and non-blocking, so reaching it is a bug.
const memoryIdleTimeout = 10 * time.Second

// releaseMemory gives the dead association's queue memory back to the
// provider. It is provider-owned (PD.AllocateMemory): after Close any
// access faults, so it goes back only when nothing can touch it. Every
// queue is dead (a.fail), so handler calls that start now find it dead
// and touch nothing, and a slot taken now is put back unfilled (take);
// what remains is handler calls already running (Quiesce on every core)
// and slots still held: being filled by a submitter, in flight until
// failAll or submit completes them, or being finished (idle).
//
// TCP queues have no handler calls: their goroutines have ended (a.wg)
// before this runs, and their memory is the garbage collector's; the
// idle wait still keeps the rule that memory goes only when no slot is
// held.
func (c *Controller) releaseMemory(qs []*queue) {
	if c.eng != nil {
		for _, core := range c.eng.Cores() {
			core.Quiesce()
		}
	}
	deadline := time.Now().Add(memoryIdleTimeout)
	for _, q := range qs {
		for !q.idle() {
			if time.Now().After(deadline) {
				c.logf("queue %d: slots still held %v after the association ended: its memory is leaked, not freed under them", q.qid, memoryIdleTimeout)
				return
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	for _, q := range qs {
		q.w.release()
	}
}

func newAssociation(c *Controller) *association {
	a := &association{c: c, done: make(chan struct{}), aerCh: make(chan uint32, 1)}
	a.ka.a = a
	a.aer.a = a
	return a
}

// fail ends the association once: every queue is marked dead, every
// command in flight completes with the error (matching ErrConnectionLost
// and cause; or ErrClosed), and the supervisor is woken. It never blocks,
// so the completion path may call it.
func (a *association) fail(cause error) {
	a.mu.Lock()
	if a.failed.Load() {
		a.mu.Unlock()
		return
	}
	var err error = &lostError{cause: cause}
	if errors.Is(cause, ErrClosed) || errors.Is(cause, ErrConnectionLost) {
		err = cause
	}
	a.err = err
	a.failed.Store(true)
	qs := a.queues
	a.mu.Unlock()
	for _, q := range qs {
		q.dead.Store(true)
	}
	close(a.done)
	for _, q := range qs {
		q.failAll(err)
	}
	if a.c.assoc.Load() == a {
		a.c.kickSupervisor()
	}
}

// lostErr is the error of a failed association.
func (a *association) lostErr() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err == nil {
		return errReconnecting
	}
	return a.err
}

// applyScan updates the controller's namespaces: new ones appear, known
// ones take their new size, missing ones are marked removed.
func (c *Controller) applyScan(found []scanned) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[uint32]bool, len(found))
	for _, f := range found {
		seen[f.nsid] = true
		ns := c.nss[f.nsid]
		if ns == nil {
			ns = &Namespace{c: c, id: f.nsid}
			c.nss[f.nsid] = ns
		}
		ns.set(f.ident)
	}
	for id, ns := range c.nss {
		if !seen[id] {
			ns.markRemoved()
		}
	}
}

// Namespaces returns the namespaces found by the last scan, by NSID
// (removed ones excluded).
func (c *Controller) Namespaces() []*Namespace {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Namespace
	for _, ns := range c.nss {
		if !ns.Removed() {
			out = append(out, ns)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// Namespace returns namespace nsid, or nil if no scan found it (or it
// was removed).
func (c *Controller) Namespace(nsid uint32) *Namespace {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ns := c.nss[nsid]; ns != nil && !ns.Removed() {
		return ns
	}
	return nil
}

// Rescan scans the namespaces again (as after a namespace-changed event).
func (c *Controller) Rescan(ctx context.Context) error {
	a, err := c.liveAssoc()
	if err != nil {
		return err
	}
	found, err := a.scan(ctx)
	if err != nil {
		return err
	}
	c.applyScan(found)
	return nil
}
