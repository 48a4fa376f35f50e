package transporttest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/transport"
)

// tag is a context value (CQ, SRQ or QP context): a distinct pointer per
// object, so a context passed back can be compared by identity.
type tag struct {
	name string
	i    int
}

func (g *tag) String() string {
	if g == nil {
		return "<nil tag>"
	}
	return fmt.Sprintf("%s#%d", g.name, g.i)
}

// note is one call of a notification callback, as the test saw it.
type note struct {
	ctx    any
	status error
	at     time.Time
}

// notifier is the test's side of a CQ or SRQ notification callback. The
// callback runs on the provider's goroutine and must not block: it counts,
// records and does a non-blocking send on a buffered channel.
type notifier struct {
	ctx      *tag
	notes    chan note
	normal   atomic.Int64 // calls with a nil status
	lastAt   atomic.Int64 // time of the last nil-status call, UnixNano
	wrongCtx atomic.Int64 // calls whose context was not ctx

	mu   sync.Mutex
	errs []error // non-nil statuses, in order
}

func newNotifier(name string) *notifier {
	return &notifier{ctx: &tag{name: name}, notes: make(chan note, 4096)}
}

func (n *notifier) notify(ctx any, status error) {
	if ctx != any(n.ctx) {
		n.wrongCtx.Add(1)
	}
	if status == nil {
		n.lastAt.Store(time.Now().UnixNano())
		n.normal.Add(1)
	} else {
		n.mu.Lock()
		n.errs = append(n.errs, status)
		n.mu.Unlock()
	}
	select {
	case n.notes <- note{ctx: ctx, status: status, at: time.Now()}:
	default: // the count above is what tests rely on; the channel only wakes
	}
}

// sawError says whether a notification carried an error matching target.
func (n *notifier) sawError(target error) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.errs {
		if errors.Is(e, target) {
			return true
		}
	}
	return false
}

func (n *notifier) errors() []error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.errs)
}

// drainNotes empties the wake-up channel (the counters stay).
func (n *notifier) drainNotes() {
	for {
		select {
		case <-n.notes:
		default:
			return
		}
	}
}

// cq is a CQ with the test's notification callback.
type cq struct {
	transport.CQ
	*notifier
	name string
}

// newCQ creates a CQ whose notifications are recorded. depth 0 means 256
// clamped to the adapter's MaxCqDepth.
func (t *T) newCQ(a transport.Adapter, name string, depth uint32, affinity int) *cq {
	t.Helper()
	if depth == 0 {
		depth = min(256, a.Info().MaxCqDepth)
	}
	n := newNotifier(name)
	c, err := a.CreateCQ(transport.CQConfig{Depth: depth, Notify: n.notify, Context: n.ctx, Affinity: affinity})
	if err != nil {
		t.Fatalf("CreateCQ(%s, depth %d, affinity %d): %v", name, depth, affinity, err)
	}
	if c == nil {
		t.Fatalf("CreateCQ(%s) returned a nil CQ and no error", name)
	}
	t.Cleanup(func() { c.Close() })
	return &cq{CQ: c, notifier: n, name: name}
}

// describe summarises completions for a failure message.
func describe(cs []transport.Completion) string {
	var b strings.Builder
	for i, c := range cs {
		if i == 12 {
			fmt.Fprintf(&b, " …(%d more)", len(cs)-i)
			break
		}
		fmt.Fprintf(&b, " [%v ctx=%v status=%v bytes=%d]", c.Type, c.RequestContext, c.Status, c.Bytes)
	}
	return b.String()
}

// waitN waits for exactly n completions on c, polling, arming and waking on
// the CQ's notification (with a bounded periodic poll as a fallback, so
// that a notification bug shows up in C4, not as a hang everywhere). It
// never polls more than n, so later completions stay on the CQ.
func (t *T) waitN(c *cq, n int, what string) []transport.Completion {
	t.Helper()
	got := make([]transport.Completion, 0, n)
	if n == 0 {
		return got
	}
	buf := make([]transport.Completion, n)
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	canArm := true
	for {
		got = append(got, buf[:c.Poll(buf[:n-len(got)])]...)
		if len(got) == n {
			return got
		}
		if canArm {
			if err := c.Arm(transport.NotifyAny); err != nil {
				canArm = false // CQ in error or closed: keep polling until the deadline
			}
			// A completion that landed between the poll and the arm
			// satisfies the arm at once; poll again anyway.
			got = append(got, buf[:c.Poll(buf[:n-len(got)])]...)
			if len(got) == n {
				return got
			}
		}
		select {
		case <-c.notes:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s: %d of %d completions on CQ %s after %v; got:%s; CQ notification errors: %v",
				what, len(got), n, c.name, waitTimeout, describe(got), c.errors())
		}
	}
}

// pollUntil polls c (without arming it) until n completions arrived or the
// deadline passed; it never polls more than n.
func (t *T) pollUntil(c *cq, n int, what string) []transport.Completion {
	t.Helper()
	got := make([]transport.Completion, 0, n)
	buf := make([]transport.Completion, max(n, 1))
	deadline := time.Now().Add(waitTimeout)
	for len(got) < n {
		got = append(got, buf[:c.Poll(buf[:n-len(got)])]...)
		if len(got) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d completions on CQ %s after %v (polling, not armed); got:%s",
				what, len(got), n, c.name, waitTimeout, describe(got))
		}
		time.Sleep(2 * time.Millisecond)
	}
	return got
}

// pollAll polls whatever is on c now.
func pollAll(c transport.CQ) []transport.Completion {
	var got []transport.Completion
	buf := make([]transport.Completion, 64)
	for {
		k := c.Poll(buf)
		if k == 0 {
			return got
		}
		got = append(got, buf[:k]...)
	}
}

// expectNoMore watches c for quiet and fails if a completion shows up.
func (t *T) expectNoMore(c *cq, what string) {
	t.Helper()
	time.Sleep(quiet)
	if extra := pollAll(c); len(extra) > 0 {
		t.Errorf("%s: %d unexpected completions on CQ %s:%s", what, len(extra), c.name, describe(extra))
	}
}

// checkOK fails unless every completion succeeded with the given type and
// QP context.
func (t *T) checkOK(cs []transport.Completion, typ transport.OpType, qpctx any, what string) {
	t.Helper()
	for i, c := range cs {
		if c.Status != nil {
			t.Fatalf("%s: completion %d (ctx %v) failed: %v", what, i, c.RequestContext, c.Status)
		}
		if c.Type != typ {
			t.Fatalf("%s: completion %d (ctx %v) has type %v, want %v", what, i, c.RequestContext, c.Type, typ)
		}
		if qpctx != nil && c.QPContext != qpctx {
			t.Fatalf("%s: completion %d (ctx %v) carries QP context %v, want %v (Q3)", what, i, c.RequestContext, c.QPContext, qpctx)
		}
	}
}

// waitDone waits for a QP's connection to end.
func (t *T) waitDone(qp transport.QP, what string) {
	t.Helper()
	select {
	case <-qp.Done():
	case <-time.After(waitTimeout):
		t.Fatalf("%s: the QP's Done() did not close within %v (Err()=%v)", what, waitTimeout, qp.Err())
	}
}

// endpoint is one side of a connection: adapter, PD, CQs and QP.
type endpoint struct {
	name     string
	a        transport.Adapter
	info     transport.AdapterInfo
	pd       transport.PD
	rcq, icq *cq
	qp       transport.QP
	tag      *tag
	cfg      transport.QPConfig
}

// epOpts shape an endpoint. Zero values mean the defaults.
type epOpts struct {
	pd       transport.PD // share a PD
	rcq, icq *cq          // share CQs
	sameCQ   bool         // one CQ for receive and initiator
	cqDepth  uint32       // depth of the CQs created here
	affinity int          // CQ affinity, used when affSet (else -1, no preference)
	affSet   bool
	srq      transport.SRQ
	index    int
	qp       func(*transport.QPConfig) // adjust the QP's sizes
}

// defaultQPConfig returns modest sizes within the adapter's limits.
func defaultQPConfig(info transport.AdapterInfo) transport.QPConfig {
	return transport.QPConfig{
		ReceiveQueueDepth:      min(64, info.MaxReceiveQueueDepth),
		InitiatorQueueDepth:    min(64, info.MaxInitiatorQueueDepth),
		MaxReceiveRequestSge:   min(4, info.MaxReceiveRequestSge),
		MaxInitiatorRequestSge: min(4, info.MaxInitiatorRequestSge),
		InlineDataSize:         min(64, info.MaxInlineDataSize),
	}
}

func (t *T) newPD(a transport.Adapter) transport.PD {
	t.Helper()
	pd, err := a.CreatePD()
	if err != nil {
		t.Fatalf("CreatePD: %v", err)
	}
	t.Cleanup(func() { pd.Close() })
	return pd
}

// newEndpoint creates a QP (not connected) with its own or shared CQs.
func (t *T) newEndpoint(a transport.Adapter, name string, o epOpts) *endpoint {
	t.Helper()
	e := &endpoint{name: name, a: a, info: a.Info(), pd: o.pd}
	if e.pd == nil {
		e.pd = t.newPD(a)
	}
	aff := -1
	if o.affSet {
		aff = o.affinity
	}
	e.rcq, e.icq = o.rcq, o.icq
	if e.rcq == nil {
		e.rcq = t.newCQ(a, name+".rcq", o.cqDepth, aff)
	}
	if e.icq == nil {
		if o.sameCQ {
			e.icq = e.rcq
		} else {
			e.icq = t.newCQ(a, name+".icq", o.cqDepth, aff)
		}
	}
	e.tag = &tag{name: name, i: o.index}
	e.cfg = defaultQPConfig(e.info)
	e.cfg.ReceiveCQ, e.cfg.InitiatorCQ, e.cfg.SRQ, e.cfg.Context = e.rcq.CQ, e.icq.CQ, o.srq, e.tag
	if o.qp != nil {
		o.qp(&e.cfg)
	}
	qp, err := e.pd.CreateQP(e.cfg)
	if err != nil {
		t.Fatalf("CreateQP(%s, %+v): %v", name, e.cfg, err)
	}
	t.Cleanup(func() { qp.Close() })
	e.qp = qp
	return e
}

// register registers n bytes of random memory with the given access.
func (t *T) register(pd transport.PD, n int, acc transport.Access) transport.MemoryRegion {
	t.Helper()
	buf := make([]byte, n)
	t.fill(buf)
	mr, err := pd.RegisterMemory(buf, acc)
	if err != nil {
		t.Fatalf("RegisterMemory(%d bytes, access %#x): %v", n, acc, err)
	}
	t.Cleanup(func() { mr.Close() })
	if got := mr.Bytes(); len(got) != n {
		t.Fatalf("RegisterMemory(%d bytes): Bytes() has %d bytes", n, len(got))
	}
	return mr
}

const allAccess = transport.AccessLocalWrite | transport.AccessRemoteRead | transport.AccessRemoteWrite

// fill fills b with random bytes from the subtest's seed.
func (t *T) fill(b []byte) {
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(w[:], t.rng.Uint64())
		copy(b[i:], w[:])
	}
}

// randSize draws a size in [1, limit], log-uniform so that small, page
// sized and large messages all appear.
func (t *T) randSize(limit int) int {
	if limit <= 1 {
		return 1
	}
	e := t.rng.IntN(bitLen(limit))
	n := 1<<e + t.rng.IntN(1<<e)
	return min(max(n, 1), limit)
}

func bitLen(n int) int {
	b := 0
	for n > 0 {
		b++
		n >>= 1
	}
	return b
}

// split returns SGEs covering mr's bytes [off, off+n) in at most k pieces
// cut at random places.
func (t *T) split(mr transport.MemoryRegion, off, n uint32, k int) []transport.SGE {
	k = max(1, min(k, int(n)))
	cuts := []uint32{0, n}
	for len(cuts) < k+1 {
		c := 1 + uint32(t.rng.IntN(int(n-1)))
		if !slices.Contains(cuts, c) {
			cuts = append(cuts, c)
		}
	}
	slices.Sort(cuts)
	sges := make([]transport.SGE, 0, k)
	for i := 0; i+1 < len(cuts); i++ {
		sges = append(sges, mr.SGE(off+cuts[i], cuts[i+1]-cuts[i]))
	}
	return sges
}

// listen opens a listener at the harness's address.
func (t *T) listen(a transport.Adapter) transport.Listener {
	t.Helper()
	ln, err := a.Listen(t.h.ListenAddr)
	if err != nil {
		t.Fatalf("Listen(%q): %v", t.h.ListenAddr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// connect connects cli (on cliA) to the next request on ln, accepted onto
// srv. It fails the test on any error.
func (t *T) connect(ln transport.Listener, cliA transport.Adapter, cli, srv transport.QP, cp, ap transport.ConnParams) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	accErr := make(chan error, 1)
	go func() {
		req, err := ln.GetConnectionRequest(ctx)
		if err != nil {
			accErr <- fmt.Errorf("GetConnectionRequest: %w", err)
			return
		}
		if err := req.Accept(ctx, srv, ap); err != nil {
			accErr <- fmt.Errorf("Accept: %w", err)
			return
		}
		accErr <- nil
	}()
	_, err := cliA.Connect(ctx, cli, ln.Addr().String(), cp)
	if err != nil {
		cancel()
	}
	aerr := <-accErr
	if err != nil || aerr != nil {
		t.Fatalf("connect to %v: Connect: %v; passive side: %v", ln.Addr(), err, aerr)
	}
}

// pair is a connected client and server.
type pair struct {
	cli, srv *endpoint
	ln       transport.Listener
}

type pairOpts struct {
	loopback bool // one adapter for both sides
	cli, srv epOpts
	cp, ap   transport.ConnParams
}

// newPair opens adapters (two, or one when loopback), creates an endpoint on
// each and connects them.
func (t *T) newPair(o pairOpts) *pair {
	t.Helper()
	srvA := t.adapter()
	cliA := srvA
	if !o.loopback {
		cliA = t.adapter()
	}
	srv := t.newEndpoint(srvA, "server", o.srv)
	cli := t.newEndpoint(cliA, "client", o.cli)
	ln := t.listen(srvA)
	t.connect(ln, cliA, cli.qp, srv.qp, o.cp, o.ap)
	return &pair{cli: cli, srv: srv, ln: ln}
}

// postRecvs posts n receives of size bytes each from mr (which must hold
// n*size bytes), with request contexts base, base+1, ….
func (t *T) postRecvs(qp transport.QP, mr transport.MemoryRegion, n, size, base int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if err := qp.PostReceive(base+i, []transport.SGE{mr.SGE(uint32(i*size), uint32(size))}); err != nil {
			t.Fatalf("PostReceive %d of %d: %v", i, n, err)
		}
	}
}

// seenOnce records request contexts and fails on a duplicate.
type seenOnce map[any]int

func (s seenOnce) add(t *T, cs []transport.Completion, what string) {
	t.Helper()
	for _, c := range cs {
		s[c.RequestContext]++
		if s[c.RequestContext] > 1 {
			t.Fatalf("%s: request %v completed %d times", what, c.RequestContext, s[c.RequestContext])
		}
	}
}

// fakeMW is a memory window no provider created, for checking that Bind
// refuses without touching it.
type fakeMW struct{}

func (fakeMW) RKey() uint32 { return 0 }
func (fakeMW) Close() error { return nil }

// within runs f on a goroutine and fails if it does not return within d:
// for calls that must never block.
func (t *T) within(d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v: a post or control call blocked", what, d)
	}
}

// skipUnless skips when cond is false, saying why.
func (t *T) skipUnless(cond bool, why string) {
	t.Helper()
	if !cond {
		t.Skip(why)
	}
}
