package transporttest

import (
	"errors"
	"fmt"
	"time"

	"github.com/blk-project/blk/transport"
)

// reqID is a structured request context: which side, which QP, which
// request.
type reqID struct {
	side string
	qp   int
	n    int
}

func (r reqID) String() string { return fmt.Sprintf("%s%d.%d", r.side, r.qp, r.n) }

// Q1. CreateQP takes a PD, a receive CQ and an initiator CQ (the same or
// different), a context and five sizes; the QP reports its context and
// works with either CQ arrangement.
func testQ1(t *T) {
	p := t.newPair(pairOpts{cli: epOpts{sameCQ: true}})
	if p.cli.qp.Context() != any(p.cli.tag) || p.srv.qp.Context() != any(p.srv.tag) {
		t.Fatalf("Context() = %v / %v, want %v / %v", p.cli.qp.Context(), p.srv.qp.Context(), p.cli.tag, p.srv.tag)
	}
	cmr := t.register(p.cli.pd, 128, allAccess)
	smr := t.register(p.srv.pd, 128, allAccess)
	if err := p.cli.qp.PostReceive("c.r", []transport.SGE{cmr.SGE(0, 64)}); err != nil {
		t.Fatalf("client PostReceive: %v", err)
	}
	if err := p.srv.qp.PostReceive("s.r", []transport.SGE{smr.SGE(0, 64)}); err != nil {
		t.Fatalf("server PostReceive: %v", err)
	}
	if err := p.cli.qp.Send("c.s", []transport.SGE{cmr.SGE(64, 64)}, 0); err != nil {
		t.Fatalf("client Send: %v", err)
	}
	if err := p.srv.qp.Send("s.s", []transport.SGE{smr.SGE(64, 64)}, 0); err != nil {
		t.Fatalf("server Send: %v", err)
	}
	// Client: one CQ gets both its send and its receive.
	got := t.waitN(p.cli.rcq, 2, "client send and receive on one CQ")
	types := map[any]transport.OpType{}
	for _, c := range got {
		if c.Status != nil || c.QPContext != any(p.cli.tag) {
			t.Fatalf("client completion %v: status %v, QP context %v", c.RequestContext, c.Status, c.QPContext)
		}
		types[c.RequestContext] = c.Type
	}
	if types["c.r"] != transport.OpReceive || types["c.s"] != transport.OpSend {
		t.Fatalf("client completions %v, want c.r receive and c.s send", types)
	}
	t.checkOK(t.waitN(p.srv.rcq, 1, "server receive"), transport.OpReceive, p.srv.tag, "server receive")
	t.checkOK(t.waitN(p.srv.icq, 1, "server send"), transport.OpSend, p.srv.tag, "server send")

	// The smallest sizes are accepted too.
	q, err := p.srv.pd.CreateQP(transport.QPConfig{
		ReceiveCQ: p.srv.rcq.CQ, InitiatorCQ: p.srv.icq.CQ, Context: "tiny",
		ReceiveQueueDepth: 1, InitiatorQueueDepth: 1, MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1,
	})
	if err != nil {
		t.Fatalf("CreateQP with every size 1 and no inline data: %v", err)
	}
	if q.Context() != "tiny" {
		t.Errorf("Context() = %v, want tiny", q.Context())
	}
	q.Close()
}

// Q2. Each of the five sizes above its adapter limit fails with
// ErrInvalidParameter; at the limit it is accepted (checked when the limit
// is small enough to allocate in a test). With an SRQ the receive sizes are
// ignored (QPConfig contract).
func testQ2(t *T) {
	a := t.adapter()
	info := a.Info()
	pd := t.newPD(a)
	c := t.newCQ(a, "q2", 0, -1)
	base := transport.QPConfig{
		ReceiveCQ: c.CQ, InitiatorCQ: c.CQ,
		ReceiveQueueDepth: 1, InitiatorQueueDepth: 1, MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1,
	}
	fields := []struct {
		name  string
		limit uint32
		set   func(*transport.QPConfig, uint32)
	}{
		{"ReceiveQueueDepth", info.MaxReceiveQueueDepth, func(c *transport.QPConfig, v uint32) { c.ReceiveQueueDepth = v }},
		{"InitiatorQueueDepth", info.MaxInitiatorQueueDepth, func(c *transport.QPConfig, v uint32) { c.InitiatorQueueDepth = v }},
		{"MaxReceiveRequestSge", info.MaxReceiveRequestSge, func(c *transport.QPConfig, v uint32) { c.MaxReceiveRequestSge = v }},
		{"MaxInitiatorRequestSge", info.MaxInitiatorRequestSge, func(c *transport.QPConfig, v uint32) { c.MaxInitiatorRequestSge = v }},
		{"InlineDataSize", info.MaxInlineDataSize, func(c *transport.QPConfig, v uint32) { c.InlineDataSize = v }},
	}
	for _, f := range fields {
		if f.limit == transport.MaxUint32 {
			t.Logf("%s limit is MaxUint32: nothing above it", f.name)
		} else {
			cfg := base
			f.set(&cfg, f.limit+1)
			q, err := pd.CreateQP(cfg)
			if err == nil {
				q.Close()
				t.Errorf("CreateQP(%s = limit+1 = %d) succeeded, want ErrInvalidParameter", f.name, f.limit+1)
			} else if !errors.Is(err, transport.ErrInvalidParameter) {
				t.Errorf("CreateQP(%s = limit+1 = %d): %v, want ErrInvalidParameter", f.name, f.limit+1, err)
			}
		}
		if f.limit <= 1<<16 && f.limit > 0 {
			cfg := base
			f.set(&cfg, f.limit)
			q, err := pd.CreateQP(cfg)
			if err != nil {
				t.Errorf("CreateQP(%s = limit = %d): %v (the adapter's limits must be truthful)", f.name, f.limit, err)
			} else {
				q.Close()
			}
		}
	}
	if info.MaxSrqDepth == 0 || info.MaxReceiveQueueDepth == transport.MaxUint32 || info.MaxReceiveRequestSge == transport.MaxUint32 {
		return
	}
	srq, err := pd.CreateSRQ(transport.SRQConfig{Depth: min(16, info.MaxSrqDepth), MaxSge: 1, Affinity: -1})
	if err != nil {
		t.Fatalf("CreateSRQ: %v", err)
	}
	defer srq.Close()
	cfg := base
	cfg.SRQ = srq
	cfg.ReceiveQueueDepth = info.MaxReceiveQueueDepth + 1
	cfg.MaxReceiveRequestSge = info.MaxReceiveRequestSge + 1
	q, err := pd.CreateQP(cfg)
	if err != nil {
		t.Errorf("CreateQP with an SRQ and receive sizes above the limits: %v (QPConfig: they are ignored with an SRQ)", err)
	} else {
		q.Close()
	}
}

// Q3. Every completion of a request posted on a QP carries that QP's
// context: sends, receives, writes, reads and flushed requests, also when
// two QPs share their CQs.
func testQ3(t *T) {
	srvA, cliA := t.adapter(), t.adapter()
	spd := t.newPD(srvA)
	srcq, sicq := t.newCQ(srvA, "srv.rcq", 0, -1), t.newCQ(srvA, "srv.icq", 0, -1)
	ln := t.listen(srvA)
	smr := t.register(spd, 4096, allAccess)
	var srv, cli [2]*endpoint
	var cmr [2]transport.MemoryRegion
	for i := range 2 {
		srv[i] = t.newEndpoint(srvA, "server", epOpts{pd: spd, rcq: srcq, icq: sicq, index: i})
		cli[i] = t.newEndpoint(cliA, "client", epOpts{index: i})
		t.connect(ln, cliA, cli[i].qp, srv[i].qp, transport.ConnParams{}, transport.ConnParams{})
		cmr[i] = t.register(cli[i].pd, 1024, allAccess)
	}
	for i := range 2 {
		for j := range 3 {
			if err := srv[i].qp.PostReceive(reqID{"s", i, j}, []transport.SGE{smr.SGE(uint32(i*1024+j*64), 64)}); err != nil {
				t.Fatalf("server %d PostReceive: %v", i, err)
			}
		}
		for j := range 2 {
			if err := cli[i].qp.PostReceive(reqID{"cr", i, j}, []transport.SGE{cmr[i].SGE(uint32(j*64), 64)}); err != nil {
				t.Fatalf("client %d PostReceive: %v", i, err)
			}
		}
	}
	for i := range 2 {
		q := cli[i].qp
		for j := range 2 {
			if err := q.Send(reqID{"cs", i, j}, []transport.SGE{cmr[i].SGE(256, 64)}, 0); err != nil {
				t.Fatalf("client %d Send: %v", i, err)
			}
		}
		if err := q.Write(reqID{"cw", i, 0}, []transport.SGE{cmr[i].SGE(320, 64)}, smr.Addr()+uint64(2048+i*256), smr.RKey(), 0); err != nil {
			t.Fatalf("client %d Write: %v", i, err)
		}
		if err := q.Read(reqID{"cd", i, 0}, []transport.SGE{cmr[i].SGE(512, 64)}, smr.Addr()+3072, smr.RKey(), 0); err != nil {
			t.Fatalf("client %d Read: %v", i, err)
		}
		if err := srv[i].qp.Send(reqID{"ss", i, 0}, []transport.SGE{smr.SGE(3584, 64)}, 0); err != nil {
			t.Fatalf("server %d Send: %v", i, err)
		}
	}
	check := func(cs []transport.Completion, tags func(int) *tag, what string) {
		t.Helper()
		for _, c := range cs {
			id, ok := c.RequestContext.(reqID)
			if !ok {
				t.Fatalf("%s: request context %v (%T) is not the one posted", what, c.RequestContext, c.RequestContext)
			}
			if c.Status != nil {
				t.Fatalf("%s: %v failed: %v", what, id, c.Status)
			}
			if want := tags(id.qp); c.QPContext != any(want) {
				t.Fatalf("%s: %v carries QP context %v, want %v", what, id, c.QPContext, want)
			}
		}
	}
	srvTag := func(i int) *tag { return srv[i].tag }
	check(t.waitN(srcq, 4, "server receives (shared CQ)"), srvTag, "server receives")
	check(t.waitN(sicq, 2, "server sends (shared CQ)"), srvTag, "server sends")
	for i := range 2 {
		cliTag := func(int) *tag { return cli[i].tag }
		check(t.waitN(cli[i].icq, 4, "client sends, write and read"), cliTag, "client initiator")
		check(t.waitN(cli[i].rcq, 1, "client receive"), cliTag, "client receive")
	}
	// Flushed requests carry the context too.
	if err := cli[0].qp.Disconnect(); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	for _, c := range t.waitN(cli[0].rcq, 1, "client 0's flushed receive") {
		if c.Status == nil || c.QPContext != any(cli[0].tag) || c.RequestContext != any(reqID{"cr", 0, 1}) {
			t.Fatalf("flushed receive: status %v, QP context %v, request %v; want an error, %v, cr0.1", c.Status, c.QPContext, c.RequestContext, cli[0].tag)
		}
	}
	for _, c := range t.waitN(srcq, 1, "server 0's flushed receive") {
		if c.Status == nil || c.QPContext != any(srv[0].tag) || c.RequestContext != any(reqID{"s", 0, 2}) {
			t.Fatalf("flushed receive: status %v, QP context %v, request %v; want an error, %v, s0.2", c.Status, c.QPContext, c.RequestContext, srv[0].tag)
		}
	}
}

// fillResult is what a burst of posts saw.
type fillResult struct {
	accepted int
	refused  []error
	firstBad error // an error other than ErrInsufficientResources
}

// burst posts n requests back to back with post(i) and records the results.
// It must not block: the caller runs it under t.within.
func burst(n int, post func(i int) error) fillResult {
	var r fillResult
	for i := range n {
		err := post(i)
		switch {
		case err == nil:
			r.accepted++
		case errors.Is(err, transport.ErrInsufficientResources):
			r.refused = append(r.refused, err)
		default:
			if r.firstBad == nil {
				r.firstBad = fmt.Errorf("post %d: %w", i, err)
			}
		}
	}
	return r
}

// Q4. At most ReceiveQueueDepth receives and InitiatorQueueDepth initiator
// requests are outstanding: the one past the limit is refused with
// ErrInsufficientResources, and the slot comes back once a request is done.
func testQ4(t *T) {
	const rdepth, idepth = 8, 4
	p := t.newPair(pairOpts{cli: epOpts{qp: func(c *transport.QPConfig) {
		c.ReceiveQueueDepth = min(rdepth, c.ReceiveQueueDepth)
		c.InitiatorQueueDepth = min(idepth, c.InitiatorQueueDepth)
	}}})
	rd := int(p.cli.cfg.ReceiveQueueDepth)
	cmr := t.register(p.cli.pd, 64*(rd+1), allAccess)
	for i := range rd {
		if err := p.cli.qp.PostReceive(i, []transport.SGE{cmr.SGE(uint32(64*i), 64)}); err != nil {
			t.Fatalf("PostReceive %d of %d (depth %d): %v", i+1, rd, rd, err)
		}
	}
	err := p.cli.qp.PostReceive(rd, []transport.SGE{cmr.SGE(uint32(64*rd), 64)})
	if !errors.Is(err, transport.ErrInsufficientResources) {
		t.Fatalf("PostReceive past ReceiveQueueDepth %d: %v, want ErrInsufficientResources", rd, err)
	}
	smr := t.register(p.srv.pd, 64, allAccess)
	if err := p.srv.qp.Send("s", []transport.SGE{smr.SGE(0, 64)}, 0); err != nil {
		t.Fatalf("server Send: %v", err)
	}
	t.checkOK(t.waitN(p.cli.rcq, 1, "one receive"), transport.OpReceive, p.cli.tag, "receive")
	if err := p.cli.qp.PostReceive(rd, []transport.SGE{cmr.SGE(uint32(64*rd), 64)}); err != nil {
		t.Fatalf("PostReceive after one receive completed and was polled: %v (its slot must come back)", err)
	}

	// Initiator queue: large writes posted back to back outrun the wire.
	id := int(p.cli.cfg.InitiatorQueueDepth)
	size := min(256<<10, int(p.cli.info.MaxTransferLength))
	src := t.register(p.cli.pd, size, allAccess)
	dst := t.register(p.srv.pd, size, allAccess)
	var r fillResult
	t.within(5*time.Second, "posting writes", func() {
		r = burst(16*id, func(i int) error {
			return p.cli.qp.Write(i, []transport.SGE{src.SGE(0, uint32(size))}, dst.Addr(), dst.RKey(), 0)
		})
	})
	if r.firstBad != nil {
		t.Fatalf("writes past InitiatorQueueDepth: %v, want ErrInsufficientResources", r.firstBad)
	}
	if r.accepted < id {
		t.Fatalf("only %d writes accepted on an empty initiator queue of depth %d", r.accepted, id)
	}
	if len(r.refused) == 0 {
		t.Fatalf("%d writes of %d bytes posted back to back on an initiator queue of depth %d: none refused with ErrInsufficientResources (Q4)", 16*id, size, id)
	}
	t.checkOK(t.waitN(p.cli.icq, r.accepted, "accepted writes"), transport.OpWrite, p.cli.tag, "writes")
	if err := p.cli.qp.Write("again", []transport.SGE{src.SGE(0, 64)}, dst.Addr(), dst.RKey(), 0); err != nil {
		t.Fatalf("Write after the queue drained: %v", err)
	}
	t.checkOK(t.waitN(p.cli.icq, 1, "write after drain"), transport.OpWrite, p.cli.tag, "write")

	// Deterministically: requests posted with FlagDefer are not started
	// (PostFlags contract), so they stay outstanding; one past the depth is
	// refused. Flush (or, from a provider without transport.FlushQP,
	// Disconnect) then cancels every outstanding request.
	for i := range id {
		if err := p.cli.qp.Write(reqID{"defer", 0, i}, []transport.SGE{src.SGE(0, 64)}, dst.Addr(), dst.RKey(), transport.FlagDefer); err != nil {
			t.Fatalf("deferred Write %d of %d on an empty initiator queue: %v", i+1, id, err)
		}
	}
	err = p.cli.qp.Write("one-too-many", []transport.SGE{src.SGE(0, 64)}, dst.Addr(), dst.RKey(), transport.FlagDefer)
	if !errors.Is(err, transport.ErrInsufficientResources) {
		t.Fatalf("Write past InitiatorQueueDepth %d with %d deferred (never started) requests outstanding: %v, want ErrInsufficientResources", id, id, err)
	}
	cancel := "Flush"
	if fq, ok := p.cli.qp.(transport.FlushQP); ok {
		if err := fq.Flush(); err != nil {
			t.Fatalf("Flush: %v", err)
		}
	} else {
		cancel = "Disconnect (the provider's QP is not a transport.FlushQP)"
		if err := p.cli.qp.Disconnect(); err != nil {
			t.Fatalf("Disconnect: %v", err)
		}
	}
	for _, c := range t.waitN(p.cli.icq, id, "deferred writes after "+cancel) {
		if !errors.Is(c.Status, transport.ErrCancelled) || c.QPContext != any(p.cli.tag) {
			t.Fatalf("deferred write %v after %s: status %v, QP context %v; want ErrCancelled, %v", c.RequestContext, cancel, c.Status, c.QPContext, p.cli.tag)
		}
	}
	for _, c := range t.waitN(p.cli.rcq, rd, "receives after "+cancel) {
		if !errors.Is(c.Status, transport.ErrCancelled) {
			t.Fatalf("receive %v after %s: %v, want ErrCancelled", c.RequestContext, cancel, c.Status)
		}
	}
	t.expectNoMore(p.cli.icq, "after "+cancel)
}

// Q5. Receives complete on the receive CQ, initiator requests (send,
// write, read, fast-register, invalidate, bind) on the initiator CQ, each
// with its type.
func testQ5(t *T) {
	p := t.newPair(pairOpts{})
	cmr := t.register(p.cli.pd, 4096, allAccess)
	smr := t.register(p.srv.pd, 4096, allAccess)
	if err := p.cli.qp.PostReceive("recv", []transport.SGE{cmr.SGE(0, 64)}); err != nil {
		t.Fatalf("PostReceive: %v", err)
	}
	t.postRecvs(p.srv.qp, smr, 1, 64, 0)
	want := map[any]transport.OpType{}
	post := func(ctx string, typ transport.OpType, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", ctx, err)
		}
		want[ctx] = typ
	}
	q := p.cli.qp
	post("send", transport.OpSend, q.Send("send", []transport.SGE{cmr.SGE(64, 64)}, 0))
	post("write", transport.OpWrite, q.Write("write", []transport.SGE{cmr.SGE(128, 64)}, smr.Addr()+1024, smr.RKey(), 0))
	post("read", transport.OpRead, q.Read("read", []transport.SGE{cmr.SGE(256, 64)}, smr.Addr()+2048, smr.RKey(), 0))
	// The optional requests are posted where the provider has them (a
	// provider without one must advertise none of it: checked here).
	if t.hasFastRegister(p.cli) {
		fr, err := p.cli.pd.(transport.FastRegisterPD).AllocateMR(4096)
		if err != nil {
			t.Fatalf("AllocateMR: %v", err)
		}
		t.Cleanup(func() { fr.Close() })
		fq := q.(transport.FastRegisterQP)
		_, err = fq.FastRegister("fastreg", fr, make([]byte, 512), allAccess, transport.FlagAllowRemoteRead|transport.FlagAllowRemoteWrite)
		post("fastreg", transport.OpFastRegister, err)
		post("invalidate", transport.OpInvalidate, fq.Invalidate("invalidate", fr, 0))
	}
	if t.hasMemoryWindows(p.cli) {
		mw, err := p.cli.pd.(transport.MemoryWindowPD).CreateMemoryWindow()
		if err != nil {
			t.Fatalf("CreateMemoryWindow: %v", err)
		}
		t.Cleanup(func() { mw.Close() })
		bmr := t.register(p.cli.pd, 4096, allAccess|transport.AccessMWBind)
		post("bind", transport.OpBind, q.(transport.BindQP).Bind("bind", bmr, mw, bmr.Bytes()[:1024], transport.AccessRemoteRead, 0))
	}
	if err := p.srv.qp.Send("peer", []transport.SGE{smr.SGE(3072, 64)}, 0); err != nil {
		t.Fatalf("server Send: %v", err)
	}
	for _, c := range t.waitN(p.cli.icq, len(want), "initiator completions") {
		if c.Status != nil {
			t.Fatalf("%v failed: %v", c.RequestContext, c.Status)
		}
		if w, ok := want[c.RequestContext]; !ok || c.Type != w {
			t.Fatalf("initiator CQ: completion %v of type %v, want type %v (known: %v)", c.RequestContext, c.Type, w, ok)
		}
		delete(want, c.RequestContext)
	}
	t.checkOK(t.waitN(p.cli.rcq, 1, "the receive"), transport.OpReceive, p.cli.tag, "receive")
	time.Sleep(quiet)
	if extra := pollAll(p.cli.rcq); len(extra) > 0 {
		t.Fatalf("receive CQ got initiator completions:%s", describe(extra))
	}
	if extra := pollAll(p.cli.icq); len(extra) > 0 {
		t.Fatalf("initiator CQ got extra completions:%s", describe(extra))
	}
}

// Q6. A send or write carries at most InlineDataSize bytes inline and a
// request at most the QP's SGE limit (reads: the adapter's
// MaxReadRequestSge); past either the post fails with ErrInvalidParameter.
func testQ6(t *T) {
	p := t.newPair(pairOpts{cli: epOpts{qp: func(c *transport.QPConfig) {
		c.InlineDataSize = min(32, c.InlineDataSize)
		c.MaxInitiatorRequestSge = min(2, c.MaxInitiatorRequestSge)
		c.MaxReceiveRequestSge = min(2, c.MaxReceiveRequestSge)
	}}})
	cfg, info := p.cli.cfg, p.cli.info
	cmr := t.register(p.cli.pd, 4096, allAccess)
	smr := t.register(p.srv.pd, 4096, allAccess)
	t.postRecvs(p.srv.qp, smr, 8, 256, 0)
	q := p.cli.qp
	ok := 0
	mustFail := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, transport.ErrInvalidParameter) {
			t.Errorf("%s: %v, want ErrInvalidParameter", what, err)
		}
	}
	mustOK := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		ok++
	}
	L := cfg.InlineDataSize
	if L > 0 {
		mustOK("inline send of InlineDataSize bytes", q.Send("inl", []transport.SGE{cmr.SGE(0, L)}, transport.FlagInline))
		mustOK("inline write of InlineDataSize bytes", q.Write("inlw", []transport.SGE{cmr.SGE(0, L)}, smr.Addr()+2048, smr.RKey(), transport.FlagInline))
	}
	mustFail(fmt.Sprintf("inline send of InlineDataSize+1 = %d bytes", L+1), q.Send("inl+", []transport.SGE{cmr.SGE(0, L+1)}, transport.FlagInline))
	mustFail(fmt.Sprintf("inline write of InlineDataSize+1 = %d bytes", L+1), q.Write("inlw+", []transport.SGE{cmr.SGE(0, L+1)}, smr.Addr()+2048, smr.RKey(), transport.FlagInline))

	sges := func(k uint32) []transport.SGE {
		s := make([]transport.SGE, k)
		for i := range s {
			s[i] = cmr.SGE(uint32(i*16), 16)
		}
		return s
	}
	k := cfg.MaxInitiatorRequestSge
	mustOK("send with MaxInitiatorRequestSge SGEs", q.Send("sge", sges(k), 0))
	mustFail(fmt.Sprintf("send with %d SGEs on a QP of MaxInitiatorRequestSge %d", k+1, k), q.Send("sge+", sges(k+1), 0))
	mustFail(fmt.Sprintf("write with %d SGEs on a QP of MaxInitiatorRequestSge %d", k+1, k), q.Write("wsge+", sges(k+1), smr.Addr(), smr.RKey(), 0))
	mustFail(fmt.Sprintf("receive with %d SGEs on a QP of MaxReceiveRequestSge %d", cfg.MaxReceiveRequestSge+1, cfg.MaxReceiveRequestSge),
		q.PostReceive("rsge+", sges(cfg.MaxReceiveRequestSge+1)))
	rl := min(info.MaxReadRequestSge, k)
	mustFail(fmt.Sprintf("read into %d SGEs (MaxReadRequestSge %d, QP's MaxInitiatorRequestSge %d)", rl+1, info.MaxReadRequestSge, k),
		q.Read("dsge+", sges(rl+1), smr.Addr(), smr.RKey(), 0))
	cs := t.waitN(p.cli.icq, ok, "the accepted posts")
	for _, c := range cs {
		if c.Status != nil {
			t.Fatalf("%v failed: %v", c.RequestContext, c.Status)
		}
	}
	t.expectNoMore(p.cli.icq, "after the refused posts")
	select {
	case <-q.Done():
		t.Fatalf("connection failed after posts refused locally: %v", q.Err())
	default:
	}
}

// Q7. Resource exhaustion fails with ErrInsufficientResources. As for C7,
// the API cannot force a provider to run out; many QPs are created and any
// failure must be that error.
func testQ7(t *T) {
	a := t.adapter()
	pd := t.newPD(a)
	c := t.newCQ(a, "q7", 0, -1)
	cfg := defaultQPConfig(a.Info())
	cfg.ReceiveCQ, cfg.InitiatorCQ = c.CQ, c.CQ
	cfg.ReceiveQueueDepth, cfg.InitiatorQueueDepth = min(16, cfg.ReceiveQueueDepth), min(16, cfg.InitiatorQueueDepth)
	var made []transport.QP
	defer func() {
		for _, q := range made {
			q.Close()
		}
	}()
	for i := range 128 {
		q, err := pd.CreateQP(cfg)
		if err != nil {
			if !errors.Is(err, transport.ErrInsufficientResources) {
				t.Fatalf("CreateQP #%d with valid sizes: %v, want success or ErrInsufficientResources", i, err)
			}
			t.Logf("provider ran out after %d QPs", i)
			break
		}
		made = append(made, q)
	}
	if len(made) == 128 {
		t.Logf("created 128 QPs without exhausting the provider; Q7's error path is not reachable through the API")
	}
	for _, q := range made {
		q.Close()
	}
	made = nil
	q, err := pd.CreateQP(cfg)
	if err != nil {
		t.Fatalf("CreateQP after closing the others: %v", err)
	}
	q.Close()
}
