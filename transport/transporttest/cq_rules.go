package transporttest

import (
	"errors"
	"time"

	"github.com/blk-project/blk/transport"
)

// C1. CreateCQ takes depth, callback, context and affinity and returns the
// CQ; the CQ reports its depth, takes completions and can be armed; after
// Close, Arm refuses.
func testC1(t *T) {
	a := t.adapter()
	info := a.Info()
	t.skipUnless(info.MaxCqDepth > 0, "adapter reports MaxCqDepth 0")
	depth := min(32, info.MaxCqDepth)
	n := newNotifier("c1")
	c, err := a.CreateCQ(transport.CQConfig{Depth: depth, Notify: n.notify, Context: n.ctx, Affinity: -1})
	if err != nil {
		t.Fatalf("CreateCQ(depth %d): %v", depth, err)
	}
	if c.Depth() != depth {
		t.Errorf("Depth() = %d, want the requested %d", c.Depth(), depth)
	}
	if got := c.Poll(make([]transport.Completion, 4)); got != 0 {
		t.Errorf("a new CQ polled %d completions", got)
	}
	if err := c.Arm(transport.NotifyAny); err != nil {
		t.Errorf("Arm on a new CQ: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := c.Arm(transport.NotifyAny); err == nil {
		t.Errorf("Arm after Close succeeded, want ErrClosed or ErrInvalidDeviceState")
	} else if !errors.Is(err, transport.ErrClosed) && !errors.Is(err, transport.ErrInvalidDeviceState) {
		t.Errorf("Arm after Close: %v, want ErrClosed or ErrInvalidDeviceState", err)
	}

	// The CQ created here serves a QP: its completions come back on it.
	p := t.newPair(pairOpts{cli: epOpts{cqDepth: depth}})
	mr := t.register(p.srv.pd, 64, allAccess)
	src := t.register(p.cli.pd, 64, allAccess)
	t.postRecvs(p.srv.qp, mr, 1, 64, 0)
	if err := p.cli.qp.Send("s", []transport.SGE{src.SGE(0, 64)}, 0); err != nil {
		t.Fatalf("Send: %v", err)
	}
	t.checkOK(t.waitN(p.cli.icq, 1, "send completion"), transport.OpSend, p.cli.tag, "send")
	t.checkOK(t.waitN(p.srv.rcq, 1, "receive completion"), transport.OpReceive, p.srv.tag, "receive")
}

// C2. A depth above MaxCqDepth fails with ErrInvalidParameter; the maximum
// itself is accepted.
func testC2(t *T) {
	a := t.adapter()
	info := a.Info()
	n := newNotifier("c2")
	if info.MaxCqDepth == transport.MaxUint32 {
		t.Log("MaxCqDepth is MaxUint32: no depth above it to try")
	} else {
		c, err := a.CreateCQ(transport.CQConfig{Depth: info.MaxCqDepth + 1, Notify: n.notify, Context: n.ctx, Affinity: -1})
		if err == nil {
			c.Close()
			t.Fatalf("CreateCQ(depth MaxCqDepth+1 = %d) succeeded, want ErrInvalidParameter", info.MaxCqDepth+1)
		}
		if !errors.Is(err, transport.ErrInvalidParameter) {
			t.Fatalf("CreateCQ(depth MaxCqDepth+1 = %d): %v, want ErrInvalidParameter", info.MaxCqDepth+1, err)
		}
	}
	// The limit is truthful: MaxCqDepth itself works (when it is small
	// enough to allocate in a test).
	if info.MaxCqDepth <= 1<<20 {
		c, err := a.CreateCQ(transport.CQConfig{Depth: info.MaxCqDepth, Notify: n.notify, Context: n.ctx, Affinity: -1})
		if err != nil {
			t.Fatalf("CreateCQ(depth MaxCqDepth = %d): %v", info.MaxCqDepth, err)
		}
		if c.Depth() != info.MaxCqDepth {
			t.Errorf("Depth() = %d, want %d", c.Depth(), info.MaxCqDepth)
		}
		c.Close()
	} else {
		t.Logf("MaxCqDepth %d too large to allocate here; the maximum itself is not created", info.MaxCqDepth)
	}
}

// C3. A CQ of depth D holds D completions; more are never delivered
// silently: the overrun is reported (ErrCQOverflow to the notification
// callback, from Arm, as a completion status, or as the QP's error) and the
// CQ never yields more than D completions. errors.go adds that the QPs using
// an overrun CQ fail.
func testC3(t *T) {
	const depth = 4
	const extra = 4
	p := t.newPair(pairOpts{
		cli: epOpts{cqDepth: depth, qp: func(c *transport.QPConfig) {
			c.InitiatorQueueDepth = min(16, c.InitiatorQueueDepth)
			c.ReceiveQueueDepth = 1
		}},
	})
	t.skipUnless(p.cli.cfg.InitiatorQueueDepth > depth+extra, "adapter's initiator queue too shallow to overrun a CQ")
	rmr := t.register(p.srv.pd, 64*16, allAccess)
	src := t.register(p.cli.pd, 64, allAccess)
	t.postRecvs(p.srv.qp, rmr, 16, 64, 0)

	// Exactly D completions fit.
	for i := range depth {
		if err := p.cli.qp.Send(i, []transport.SGE{src.SGE(0, 64)}, 0); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
	}
	t.waitN(p.srv.rcq, depth, "receives of the first D sends")
	time.Sleep(quiet) // let the send completions land before looking
	got := t.pollUntil(p.cli.icq, depth, "D completions on a CQ of depth D")
	t.checkOK(got, transport.OpSend, p.cli.tag, "first D sends")
	if p.cli.icq.sawError(transport.ErrCQOverflow) {
		t.Fatalf("overflow reported on a CQ holding exactly its depth (%d) of completions", depth)
	}
	select {
	case <-p.cli.qp.Done():
		t.Fatalf("QP failed after exactly D completions: %v", p.cli.qp.Err())
	default:
	}

	// D+extra completions without polling: the CQ overruns.
	if err := p.cli.icq.Arm(transport.NotifyAny); err != nil {
		t.Fatalf("Arm: %v", err)
	}
	accepted := 0
	for i := range depth + extra {
		err := p.cli.qp.Send(100+i, []transport.SGE{src.SGE(0, 64)}, 0)
		if err == nil {
			accepted++
			continue
		}
		if !errors.Is(err, transport.ErrInsufficientResources) && !errors.Is(err, transport.ErrInvalidDeviceState) {
			t.Fatalf("Send %d past the CQ's depth: %v, want success, ErrInsufficientResources or (QP already failed) ErrInvalidDeviceState", i, err)
		}
	}
	if accepted <= depth {
		// The provider refused requests that had no room on the CQ: no
		// completion was lost, which C3 allows; every accepted one must
		// then arrive.
		t.Logf("provider accepted only %d of %d sends on a CQ of depth %d", accepted, depth+extra, depth)
		t.checkOK(t.pollUntil(p.cli.icq, accepted, "accepted sends"), transport.OpSend, p.cli.tag, "accepted sends")
		return
	}
	// Wait for the overrun to be reported by the callback or the QP; a
	// provider that reports it only through Poll gets the bounded wait.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if p.cli.icq.sawError(transport.ErrCQOverflow) || errors.Is(p.cli.qp.Err(), transport.ErrCQOverflow) {
			break
		}
		select {
		case <-p.cli.icq.notes:
		case <-time.After(20 * time.Millisecond):
		}
	}
	all := pollAll(p.cli.icq)
	var how []string
	if p.cli.icq.sawError(transport.ErrCQOverflow) {
		how = append(how, "notification callback")
	}
	if errors.Is(p.cli.qp.Err(), transport.ErrCQOverflow) {
		how = append(how, "QP error")
	}
	real := 0
	for _, c := range all {
		if errors.Is(c.Status, transport.ErrCQOverflow) {
			how = append(how, "completion status")
			continue
		}
		real++
	}
	if err := p.cli.icq.Arm(transport.NotifyAny); errors.Is(err, transport.ErrCQOverflow) {
		how = append(how, "Arm")
	}
	reported := len(how) > 0
	t.Logf("%d sends on a CQ of depth %d: %d completions polled, overrun reported by %v", accepted, depth, real, how)
	if real > depth {
		t.Errorf("CQ of depth %d yielded %d completions without polling in between (C3: it holds at most its depth):%s", depth, real, describe(all))
	}
	if !reported {
		t.Fatalf("%d completions on a CQ of depth %d: overrun not reported (no ErrCQOverflow to the callback, from Arm, in a completion or as the QP's error); callback errors %v, QP error %v, polled:%s",
			accepted, depth, p.cli.icq.errors(), p.cli.qp.Err(), describe(all))
	}
	t.waitDone(p.cli.qp, "QP on an overrun CQ (errors.go: the QPs using it fail)")
}

// C4. Without Arm no notification; one Arm gives one notification however
// many completions arrive; Arm with completions already on the CQ fires at
// once; NotifySolicited and NotifyErrors fire only for their completions.
func testC4(t *T) {
	p := t.newPair(pairOpts{})
	cut := p.srv.rcq // the CQ under test: only this test arms it
	const recvs = 48
	rmr := t.register(p.srv.pd, 64*recvs, allAccess)
	src := t.register(p.cli.pd, 64, allAccess)
	t.postRecvs(p.srv.qp, rmr, recvs, 64, 0)
	sent := 0
	send := func(k int, flags transport.PostFlags) {
		t.Helper()
		for range k {
			if err := p.cli.qp.Send(sent, []transport.SGE{src.SGE(0, 64)}, flags); err != nil {
				t.Fatalf("Send %d: %v", sent, err)
			}
			sent++
		}
		t.checkOK(t.waitN(p.cli.icq, k, "send completions"), transport.OpSend, p.cli.tag, "sends")
	}
	expectCount := func(want int64, what string) {
		t.Helper()
		time.Sleep(quiet)
		if got := cut.normal.Load(); got != want {
			t.Fatalf("%s: %d notifications, want %d (C4)", what, got, want)
		}
	}
	waitCount := func(want int64, what string) {
		t.Helper()
		deadline := time.After(waitTimeout)
		for cut.normal.Load() < want {
			select {
			case <-cut.notes:
			case <-deadline:
				t.Fatalf("%s: no notification within %v (have %d, want %d)", what, waitTimeout, cut.normal.Load(), want)
			}
		}
		expectCount(want, what+" (exactly one per arm)")
	}

	// No arm: completions land, nothing is notified.
	send(4, 0)
	expectCount(0, "4 completions, CQ never armed")
	// Arm with completions already there: one notification.
	if err := cut.Arm(transport.NotifyAny); err != nil {
		t.Fatalf("Arm: %v", err)
	}
	waitCount(1, "Arm with 4 completions already on the CQ")
	// More completions, no new arm: no more notifications.
	send(8, 0)
	t.pollUntil(cut, 12, "the 12 receives")
	expectCount(1, "8 more completions after the one arm was used")
	// Arm on an empty CQ: nothing until a completion; then exactly one.
	if err := cut.Arm(transport.NotifyAny); err != nil {
		t.Fatalf("Arm: %v", err)
	}
	expectCount(1, "armed, empty CQ")
	send(3, 0)
	waitCount(2, "armed, then 3 completions")
	t.pollUntil(cut, 3, "3 receives")

	// NotifySolicited: unsolicited completions do not satisfy it. An
	// adapter without FlagSolicitedNotifySupported refuses the arm with
	// ErrNotSupported (M9's pattern) and must then stay unarmed.
	if p.srv.info.Flags&transport.FlagSolicitedNotifySupported != 0 {
		if err := cut.Arm(transport.NotifySolicited); err != nil {
			t.Fatalf("Arm(NotifySolicited): %v", err)
		}
		send(2, 0)
		t.pollUntil(cut, 2, "2 unsolicited receives")
		expectCount(2, "armed for solicited, 2 unsolicited receives")
		send(1, transport.FlagSolicitedEvent)
		waitCount(3, "armed for solicited, 1 solicited receive")
		t.pollUntil(cut, 1, "the solicited receive")
	} else {
		err := cut.Arm(transport.NotifySolicited)
		if !errors.Is(err, transport.ErrNotSupported) {
			t.Fatalf("Arm(NotifySolicited) on an adapter without FlagSolicitedNotifySupported: %v, want ErrNotSupported", err)
		}
		t.Logf("adapter without FlagSolicitedNotifySupported: Arm(NotifySolicited) answered %v", err)
		send(2, 0)
		send(1, transport.FlagSolicitedEvent)
		t.pollUntil(cut, 3, "3 receives after a refused solicited arm")
		expectCount(2, "refused solicited arm, then 2 unsolicited and 1 solicited receive")
		// The count the rest of the test expects: as if the arm had fired.
		if err := cut.Arm(transport.NotifyAny); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		send(1, 0)
		waitCount(3, "armed, 1 receive")
		t.pollUntil(cut, 1, "1 receive")
	}

	// NotifyErrors: successes do not satisfy it, an error completion does.
	if err := cut.Arm(transport.NotifyErrors); err != nil {
		t.Fatalf("Arm(NotifyErrors): %v", err)
	}
	send(2, 0)
	t.pollUntil(cut, 2, "2 successful receives")
	expectCount(3, "armed for errors, 2 successful receives")
	// Disconnect: the server's remaining receives flush with errors.
	if err := p.cli.qp.Disconnect(); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	waitCount(4, "armed for errors, receives flushed by a disconnect")
	flushed := t.pollUntil(cut, recvs-sent, "flushed receives")
	for _, c := range flushed {
		if c.Status == nil {
			t.Fatalf("receive %v completed without error after the disconnect", c.RequestContext)
		}
	}
	if w := cut.wrongCtx.Load(); w != 0 {
		t.Errorf("%d notifications carried the wrong context (C5)", w)
	}
}

// C5. The context given at creation comes back with every notification,
// including the ErrClosed one of Close.
func testC5(t *T) {
	p := t.newPair(pairOpts{})
	rmr := t.register(p.srv.pd, 64, allAccess)
	src := t.register(p.cli.pd, 64, allAccess)
	t.postRecvs(p.srv.qp, rmr, 1, 64, 0)
	for _, c := range []*cq{p.srv.rcq, p.cli.icq} {
		if err := c.Arm(transport.NotifyAny); err != nil {
			t.Fatalf("Arm %s: %v", c.name, err)
		}
	}
	if err := p.cli.qp.Send(0, []transport.SGE{src.SGE(0, 64)}, 0); err != nil {
		t.Fatalf("Send: %v", err)
	}
	for _, c := range []*cq{p.srv.rcq, p.cli.icq} {
		select {
		case n := <-c.notes:
			if n.ctx != any(c.ctx) {
				t.Errorf("CQ %s notified with context %v, want %v", c.name, n.ctx, c.ctx)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("CQ %s: no notification within %v", c.name, waitTimeout)
		}
	}
	// Close: the callback is told ErrClosed, with the same context.
	p.srv.qp.Close()
	p.srv.rcq.drainNotes()
	if err := p.srv.rcq.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	deadline := time.After(waitTimeout)
	for !p.srv.rcq.sawError(transport.ErrClosed) {
		select {
		case <-p.srv.rcq.notes:
		case <-deadline:
			t.Fatalf("Close: the callback was not called with ErrClosed within %v (NotifyFunc contract)", waitTimeout)
		}
	}
	for _, c := range []*cq{p.srv.rcq, p.cli.icq} {
		if w := c.wrongCtx.Load(); w != 0 {
			t.Errorf("CQ %s: %d notifications carried another context than the one given at creation", c.name, w)
		}
	}
}

// C6. Affinity is a preference: -1 and every valid core are accepted and
// notifications still arrive. Where they run is not observable through the
// API, so it is not asserted.
func testC6(t *T) {
	a := t.adapter()
	info := a.Info()
	affs := []int{-1, 0}
	if info.Cores > 1 {
		affs = append(affs, info.Cores-1)
	}
	for _, aff := range affs {
		c := t.newCQ(a, "c6", min(16, info.MaxCqDepth), aff)
		if c.Depth() != min(16, info.MaxCqDepth) {
			t.Errorf("affinity %d: Depth() = %d", aff, c.Depth())
		}
	}
	core := max(info.Cores-1, 0)
	p := t.newPair(pairOpts{
		cli: epOpts{affSet: true, affinity: core},
		srv: epOpts{affSet: true, affinity: 0},
	})
	rmr := t.register(p.srv.pd, 64, allAccess)
	src := t.register(p.cli.pd, 64, allAccess)
	t.postRecvs(p.srv.qp, rmr, 1, 64, 0)
	if err := p.srv.rcq.Arm(transport.NotifyAny); err != nil {
		t.Fatalf("Arm: %v", err)
	}
	if err := p.cli.qp.Send(0, []transport.SGE{src.SGE(0, 64)}, 0); err != nil {
		t.Fatalf("Send: %v", err)
	}
	t.checkOK(t.waitN(p.cli.icq, 1, "send on a CQ with affinity"), transport.OpSend, p.cli.tag, "send")
	select {
	case <-p.srv.rcq.notes:
	case <-time.After(waitTimeout):
		t.Fatalf("no notification within %v on a CQ with affinity 0", waitTimeout)
	}
}

// C7. Resource exhaustion fails with ErrInsufficientResources. The API has
// no way to make a provider run out, so the test creates many CQs and
// checks that any failure is that error and that closing frees the
// resources again.
func testC7(t *T) {
	a := t.adapter()
	depth := min(64, a.Info().MaxCqDepth)
	var made []transport.CQ
	defer func() {
		for _, c := range made {
			c.Close()
		}
	}()
	n := newNotifier("c7")
	failed := false
	for i := range 256 {
		c, err := a.CreateCQ(transport.CQConfig{Depth: depth, Notify: n.notify, Context: n.ctx, Affinity: -1})
		if err != nil {
			if !errors.Is(err, transport.ErrInsufficientResources) {
				t.Fatalf("CreateCQ #%d of valid CQs: %v, want success or ErrInsufficientResources", i, err)
			}
			t.Logf("provider ran out after %d CQs", i)
			failed = true
			break
		}
		made = append(made, c)
	}
	if !failed {
		t.Logf("created %d CQs without exhausting the provider; C7's error path is not reachable through the API", len(made))
	}
	for _, c := range made {
		c.Close()
	}
	made = nil
	c, err := a.CreateCQ(transport.CQConfig{Depth: depth, Notify: n.notify, Context: n.ctx, Affinity: -1})
	if err != nil {
		t.Fatalf("CreateCQ after closing every other CQ: %v", err)
	}
	c.Close()
}
