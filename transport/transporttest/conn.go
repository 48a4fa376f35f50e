package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/blk-project/blk/transport"
)

// InlineSend: a send or write with FlagInline copies its payload at post
// time: the buffer is overwritten right after each post and the peer still
// gets the original bytes. The SGEs must still name registered memory
// (transport.FlagInline): an inline post with a key that names nothing is
// refused at post time with ErrAccessViolation and the connection goes on.
func testInlineSend(t *T) {
	t.skipUnless(t.info().MaxInlineDataSize > 0, "adapter reports MaxInlineDataSize 0")
	t.Run("registered", func(t *T) { t.inlineSend(true) })
	t.Run("unregistered-key", func(t *T) { t.inlineSend(false) })
}

func (t *T) inlineSend(validKey bool) {
	p := t.newPair(pairOpts{cli: epOpts{qp: func(c *transport.QPConfig) {
		c.InlineDataSize = min(128, c.InlineDataSize)
	}}})
	L := int(p.cli.cfg.InlineDataSize)
	t.skipUnless(L > 0, "no inline data")
	const n = 32
	rmr := t.register(p.srv.pd, n*L, allAccess)
	t.postRecvs(p.srv.qp, rmr, n, L, 0)
	buf := t.register(p.cli.pd, L, allAccess)
	sge := func(size int) transport.SGE {
		s := buf.SGE(0, uint32(size))
		if !validKey {
			s.LKey = 0
		}
		return s
	}
	if !validKey {
		if err := p.cli.qp.Send("bad", []transport.SGE{sge(1)}, transport.FlagInline); !errors.Is(err, transport.ErrAccessViolation) {
			t.Fatalf("inline Send with a key that names no region: %v, want ErrAccessViolation", err)
		}
		validKey = true // the rest runs with the registered key: the QP must be unharmed
	}
	want := make([][]byte, n)
	for i := range n {
		size := 1 + t.rng.IntN(L)
		t.fill(buf.Bytes()[:size])
		want[i] = slices.Clone(buf.Bytes()[:size])
		if err := p.cli.qp.Send(i, []transport.SGE{sge(size)}, transport.FlagInline); err != nil {
			t.Fatalf("inline Send of %d bytes (InlineDataSize %d): %v", size, L, err)
		}
		// The buffer is the caller's again as soon as the post returns.
		t.fill(buf.Bytes())
	}
	t.checkOK(t.waitN(p.cli.icq, n, "inline sends"), transport.OpSend, p.cli.tag, "inline sends")
	for i, c := range t.waitN(p.srv.rcq, n, "receives of inline sends") {
		got := rmr.Bytes()[i*L : i*L+int(c.Bytes)]
		if c.Status != nil || !bytes.Equal(got, want[i]) {
			t.Fatalf("inline send %d (%d bytes): status %v, %s (the buffer was overwritten right after the post)", i, len(want[i]), c.Status, firstDiff(got, want[i]))
		}
	}
	// Inline write, buffer reused at once, then a fence send.
	dst := t.register(p.srv.pd, L, allAccess)
	before := slices.Clone(dst.Bytes())
	t.fill(buf.Bytes())
	wdata := slices.Clone(buf.Bytes())
	if err := p.cli.qp.Write("w", []transport.SGE{sge(L)}, dst.Addr(), dst.RKey(), transport.FlagInline); err != nil {
		t.Fatalf("inline Write of %d bytes: %v", L, err)
	}
	t.fill(buf.Bytes())
	fence := t.register(p.srv.pd, 8, allAccess)
	if err := p.srv.qp.PostReceive("fence", []transport.SGE{fence.SGE(0, 8)}); err != nil {
		t.Fatalf("PostReceive: %v", err)
	}
	if err := p.cli.qp.Send("fence", []transport.SGE{sge(1)}, transport.FlagInline); err != nil {
		t.Fatalf("Send: %v", err)
	}
	t.waitN(p.cli.icq, 2, "inline write and fence")
	t.waitN(p.srv.rcq, 1, "fence")
	if !bytes.Equal(dst.Bytes(), wdata) {
		t.Fatalf("inline write: %s (before the write the region was %s)", firstDiff(dst.Bytes(), wdata), firstDiff(before, wdata))
	}
}

// QueueFull: posting past a queue's depth (receive queue, initiator queue,
// SRQ) fails with ErrInsufficientResources and never blocks, and nothing
// is dropped: every accepted request completes exactly once.
func testQueueFull(t *T) {
	t.Run("receive", func(t *T) {
		p := t.newPair(pairOpts{cli: epOpts{qp: func(c *transport.QPConfig) { c.ReceiveQueueDepth = min(16, c.ReceiveQueueDepth) }}})
		rd := int(p.cli.cfg.ReceiveQueueDepth)
		cmr := t.register(p.cli.pd, 64*(rd+8), allAccess)
		var r fillResult
		t.within(5*time.Second, "PostReceive burst", func() {
			r = burst(rd+8, func(i int) error { return p.cli.qp.PostReceive(i, []transport.SGE{cmr.SGE(uint32(64*i), 64)}) })
		})
		if r.firstBad != nil {
			t.Fatalf("PostReceive past the depth: %v, want ErrInsufficientResources", r.firstBad)
		}
		if r.accepted != rd {
			t.Fatalf("%d of %d receives accepted on a receive queue of depth %d with nothing arriving, want exactly %d", r.accepted, rd+8, rd, rd)
		}
		smr := t.register(p.srv.pd, 64, allAccess)
		for i := range rd {
			if err := p.srv.qp.Send(i, []transport.SGE{smr.SGE(0, 64)}, 0); err != nil {
				t.Fatalf("server Send %d: %v", i, err)
			}
		}
		got := t.waitN(p.cli.rcq, rd, "every accepted receive")
		t.checkOK(got, transport.OpReceive, p.cli.tag, "receives")
		seenOnce{}.add(t, got, "receives")
		t.waitN(p.srv.icq, rd, "server sends")
		t.expectNoMore(p.cli.rcq, "after every accepted receive completed")
		if err := p.cli.qp.PostReceive("again", []transport.SGE{cmr.SGE(0, 64)}); err != nil {
			t.Fatalf("PostReceive after the queue drained: %v", err)
		}
	})
	t.Run("initiator", func(t *T) {
		p := t.newPair(pairOpts{
			cli: epOpts{cqDepth: 512, qp: func(c *transport.QPConfig) { c.InitiatorQueueDepth = min(4, c.InitiatorQueueDepth) }},
			srv: epOpts{qp: func(c *transport.QPConfig) { c.ReceiveQueueDepth = min(64, c.ReceiveQueueDepth) }},
		})
		id := int(p.cli.cfg.InitiatorQueueDepth)
		size := min(128<<10, int(p.cli.info.MaxTransferLength))
		// Disjoint memory for each kind of request: a write's source is
		// never a read's sink, a write's target never a read's source
		// (concurrent access to one buffer is undefined in RDMA and a data
		// race in Go).
		src := t.register(p.cli.pd, size, allAccess)
		sink := t.register(p.cli.pd, size, allAccess)
		dst := t.register(p.srv.pd, size, allAccess)
		rsrc := t.register(p.srv.pd, size, allAccess)
		rmr := t.register(p.srv.pd, 64*64, allAccess)
		t.postRecvs(p.srv.qp, rmr, int(p.srv.cfg.ReceiveQueueDepth), 64, 0)
		const posts = 64
		var r fillResult
		sends := 0
		t.within(5*time.Second, "initiator burst", func() {
			r = burst(posts, func(i int) error {
				switch i % 3 {
				case 0:
					return p.cli.qp.Write(i, []transport.SGE{src.SGE(0, uint32(size))}, dst.Addr(), dst.RKey(), 0)
				case 1:
					return p.cli.qp.Read(i, []transport.SGE{sink.SGE(0, uint32(size))}, rsrc.Addr(), rsrc.RKey(), 0)
				}
				if sends == int(p.srv.cfg.ReceiveQueueDepth) {
					return p.cli.qp.Read(i, []transport.SGE{sink.SGE(0, 64)}, rsrc.Addr(), rsrc.RKey(), 0)
				}
				err := p.cli.qp.Send(i, []transport.SGE{src.SGE(0, 64)}, 0)
				if err == nil {
					sends++
				}
				return err
			})
		})
		if r.firstBad != nil {
			t.Fatalf("posting past InitiatorQueueDepth %d: %v, want ErrInsufficientResources", id, r.firstBad)
		}
		if r.accepted < id {
			t.Fatalf("only %d requests accepted on an empty initiator queue of depth %d", r.accepted, id)
		}
		t.Logf("%d of %d requests accepted on an initiator queue of depth %d, %d refused", r.accepted, posts, id, len(r.refused))
		got := t.waitN(p.cli.icq, r.accepted, "every accepted initiator request")
		seenOnce{}.add(t, got, "initiator requests")
		for _, c := range got {
			if c.Status != nil {
				t.Fatalf("request %v (%v) failed: %v", c.RequestContext, c.Type, c.Status)
			}
		}
		t.expectNoMore(p.cli.icq, "after every accepted request completed")
		if err := p.cli.qp.Write("again", []transport.SGE{src.SGE(0, 64)}, dst.Addr(), dst.RKey(), 0); err != nil {
			t.Fatalf("Write after the queue drained: %v", err)
		}
		t.waitN(p.cli.icq, 1, "write after drain")
		t.waitN(p.srv.rcq, sends, "server receives")
	})
	t.Run("srq", func(t *T) {
		const depth = 16
		p, s := t.srqPair(depth)
		rmr := t.register(p.srv.pd, 64*(depth+8), allAccess)
		var r fillResult
		t.within(5*time.Second, "SRQ PostReceive burst", func() {
			r = burst(depth+8, func(i int) error { return s.PostReceive(i, []transport.SGE{rmr.SGE(uint32(64*i), 64)}) })
		})
		if r.firstBad != nil {
			t.Fatalf("SRQ PostReceive past the depth: %v, want ErrInsufficientResources", r.firstBad)
		}
		if r.accepted != depth {
			t.Fatalf("%d of %d receives accepted on an SRQ of depth %d, want exactly %d", r.accepted, depth+8, depth, depth)
		}
		src := t.register(p.cli.pd, 64*8, allAccess)
		t.sendN(p, src, 0, depth)
		got := t.waitN(p.srv.rcq, depth, "every accepted SRQ receive")
		t.checkOK(got, transport.OpReceive, p.srv.tag, "SRQ receives")
		seenOnce{}.add(t, got, "SRQ receives")
		t.expectNoMore(p.srv.rcq, "after every accepted SRQ receive completed")
	})
}

// DeferredPost: FlagDefer queues a request without starting it "until a
// later post without FlagDefer on the same queue" (PostFlags contract):
// other work the QP does meanwhile (serving the peer's RDMA read) does not
// start it; the next plain post starts the batch, in order.
func testDeferredPost(t *T) {
	p := t.newPair(pairOpts{})
	src := t.register(p.cli.pd, 256, allAccess)
	rsrc := t.register(p.cli.pd, 4096, allAccess)
	dst := t.register(p.srv.pd, 256, allAccess)
	sink := t.register(p.srv.pd, 4096, allAccess)
	for i := range 2 {
		if err := p.cli.qp.Write(i, []transport.SGE{src.SGE(uint32(64*i), 64)}, dst.Addr()+uint64(64*i), dst.RKey(), transport.FlagDefer); err != nil {
			t.Fatalf("deferred Write %d: %v", i, err)
		}
	}
	// The client's QP now has work to do for its peer.
	if err := p.srv.qp.Read("peer-read", []transport.SGE{sink.SGE(0, 4096)}, rsrc.Addr(), rsrc.RKey(), 0); err != nil {
		t.Fatalf("peer Read: %v", err)
	}
	t.checkOK(t.waitN(p.srv.icq, 1, "peer's read"), transport.OpRead, p.srv.tag, "peer's read")
	if !bytes.Equal(sink.Bytes(), rsrc.Bytes()) {
		t.Fatalf("peer's read: %s", firstDiff(sink.Bytes(), rsrc.Bytes()))
	}
	if early := pollAll(p.cli.icq); len(early) > 0 {
		t.Fatalf("deferred requests started without a later non-deferred post (the QP was serving the peer's RDMA read):%s", describe(early))
	}
	// The doorbell: a plain post starts the batch.
	if err := p.cli.qp.Write(2, []transport.SGE{src.SGE(128, 64)}, dst.Addr()+128, dst.RKey(), 0); err != nil {
		t.Fatalf("Write: %v", err)
	}
	got := t.waitN(p.cli.icq, 3, "deferred batch after the doorbell")
	t.checkOK(got, transport.OpWrite, p.cli.tag, "deferred batch")
	for i, c := range got {
		if c.RequestContext != any(i) {
			t.Fatalf("completion %d is request %v: a deferred batch starts in post order", i, c.RequestContext)
		}
	}
}

// SendWithoutReceive: a send that finds no receive posted at the peer
// breaks the connection (iWARP: DDP error, Terminate). Requests still
// outstanding on either side complete with an error status, both QPs'
// Done() close and Err() is non-nil.
func testSendWithoutReceive(t *T) {
	p := t.newPair(pairOpts{})
	const readLen = 32 << 10
	cmr := t.register(p.cli.pd, 4*64+2*readLen, allAccess)
	smr := t.register(p.srv.pd, 2*readLen, allAccess)
	// Outstanding on the sender: receives the peer never satisfies.
	for i := range 4 {
		if err := p.cli.qp.PostReceive(reqID{"recv", 0, i}, []transport.SGE{cmr.SGE(uint32(64*i), 64)}); err != nil {
			t.Fatalf("client PostReceive: %v", err)
		}
	}
	// On the peer: a read of the sender's memory, in flight or done when
	// the send arrives; it must complete exactly once either way.
	if err := p.srv.qp.Read("srv-read", []transport.SGE{smr.SGE(0, readLen)}, cmr.Addr()+256, cmr.RKey(), 0); err != nil {
		t.Fatalf("server Read: %v", err)
	}
	t.checkOK(t.waitN(p.srv.icq, 1, "peer's read"), transport.OpRead, p.srv.tag, "peer's read")
	// And one that is certainly outstanding: deferred, never started.
	if err := p.srv.qp.Read("srv-deferred", []transport.SGE{smr.SGE(0, 64)}, cmr.Addr()+256, cmr.RKey(), transport.FlagDefer); err != nil {
		t.Fatalf("server deferred Read: %v", err)
	}
	// The send is deferred so that the read queued behind it is posted
	// before either leaves: the read can then never be answered.
	if err := p.cli.qp.Send("send", []transport.SGE{cmr.SGE(0, 64)}, transport.FlagDefer); err != nil {
		t.Fatalf("client Send: %v", err)
	}
	if err := p.cli.qp.Read("read-after", []transport.SGE{cmr.SGE(256+readLen, readLen)}, smr.Addr()+readLen, smr.RKey(), 0); err != nil {
		t.Fatalf("client Read after the send: %v", err)
	}
	t.waitDone(p.cli.qp, "sender")
	t.waitDone(p.srv.qp, "peer without receives")
	for _, c := range t.waitN(p.cli.rcq, 4, "sender's outstanding receives") {
		if c.Status == nil {
			t.Fatalf("sender's receive %v completed successfully although the peer sent nothing", c.RequestContext)
		}
		if c.QPContext != any(p.cli.tag) {
			t.Fatalf("flushed receive carries QP context %v", c.QPContext)
		}
	}
	got := map[any]error{}
	for _, c := range t.waitN(p.cli.icq, 2, "sender's send and read") {
		got[c.RequestContext] = c.Status
	}
	if _, ok := got["send"]; !ok {
		t.Fatalf("the send did not complete (got %v)", got)
	}
	if st, ok := got["read-after"]; !ok || st == nil {
		t.Fatalf("the read queued behind the fatal send: completed %v with status %v, want an error", ok, st)
	}
	if c := t.waitN(p.srv.icq, 1, "peer's deferred read")[0]; c.Status == nil {
		t.Fatalf("the peer's deferred (never started) read completed successfully although the connection failed")
	}
	t.expectNoMore(p.cli.icq, "sender after the failure")
	t.expectNoMore(p.srv.icq, "peer after the failure")
	if p.cli.qp.Err() == nil || p.srv.qp.Err() == nil {
		t.Fatalf("Err() after the failure: sender %v, peer %v; want both non-nil", p.cli.qp.Err(), p.srv.qp.Err())
	}
	t.Logf("sender: %v; peer: %v; send status %v", p.cli.qp.Err(), p.srv.qp.Err(), got["send"])
}

// AccessViolation: RDMA writes and reads with a wrong key, out of the
// region's bounds, or without the remote right complete with
// ErrAccessViolation on the initiator, put the connection in error on both
// sides, and leave the target memory unchanged; a local SGE with a wrong
// key is refused with ErrAccessViolation.
//
// An iWARP RDMA write is not acknowledged: the initiator may have completed
// it successfully before the peer's Terminate arrives. For writes the suite
// therefore accepts either the write's own ErrAccessViolation or a
// successful write followed by the QP failing with ErrAccessViolation.
// An adapter without FlagRemoteErrorsReported (siw) does not tell the
// initiator why: there the request may end ErrCancelled (or a write
// complete) and both QPs end with whatever error the device reports
// first; the memory must still be untouched. An adapter without
// FlagRemoteReadEnforced skips the read-without-the-right case.
func testAccessViolation(t *T) {
	const size = 64 << 10
	type avCase struct {
		name   string
		write  bool
		access transport.Access
		addr   func(mr transport.MemoryRegion) uint64
		key    func(mr transport.MemoryRegion) uint32
		n      uint32
	}
	base := func(mr transport.MemoryRegion) uint64 { return mr.Addr() }
	rkey := func(mr transport.MemoryRegion) uint32 { return mr.RKey() }
	wrongKey := func(mr transport.MemoryRegion) uint32 { return mr.RKey() ^ 0xff }
	nearEnd := func(mr transport.MemoryRegion) uint64 { return mr.Addr() + size - 100 }
	below := func(mr transport.MemoryRegion) uint64 { return mr.Addr() - 64 }
	cases := []avCase{
		{"write-wrong-key", true, allAccess, base, wrongKey, 4096},
		{"write-past-end", true, allAccess, nearEnd, rkey, 4096},
		{"write-before-start", true, allAccess, below, rkey, 128},
		{"write-without-remote-write", true, transport.AccessLocalWrite | transport.AccessRemoteRead, base, rkey, 4096},
		{"read-wrong-key", false, allAccess, base, wrongKey, 4096},
		{"read-past-end", false, allAccess, nearEnd, rkey, 4096},
		{"read-before-start", false, allAccess, below, rkey, 128},
		{"read-without-remote-read", false, transport.AccessLocalWrite | transport.AccessRemoteWrite, base, rkey, 4096},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *T) {
			if !tc.write && tc.access&transport.AccessRemoteRead == 0 {
				t.skipUnless(t.info().Flags&transport.FlagRemoteReadEnforced != 0,
					"adapter lacks FlagRemoteReadEnforced: it serves a peer's read of a region registered without AccessRemoteRead (siw), so there is no refusal to observe")
			}
			p := t.newPair(pairOpts{})
			tgt := t.register(p.srv.pd, size, tc.access)
			before := slices.Clone(tgt.Bytes())
			cmr := t.register(p.cli.pd, 8192+2*64, allAccess)
			for i := range 2 {
				if err := p.cli.qp.PostReceive(i, []transport.SGE{cmr.SGE(uint32(8192+64*i), 64)}); err != nil {
					t.Fatalf("PostReceive: %v", err)
				}
			}
			var err error
			if tc.write {
				err = p.cli.qp.Write("bad", []transport.SGE{cmr.SGE(0, tc.n)}, tc.addr(tgt), tc.key(tgt), 0)
			} else {
				err = p.cli.qp.Read("bad", []transport.SGE{cmr.SGE(0, tc.n)}, tc.addr(tgt), tc.key(tgt), 0)
			}
			if err != nil {
				t.Fatalf("post: %v (the violation is the peer's to detect: the post must be accepted)", err)
			}
			c := t.waitN(p.cli.icq, 1, "the violating request")[0]
			t.waitDone(p.cli.qp, "initiator after an access violation")
			t.waitDone(p.srv.qp, "target after an access violation")
			t.checkRemoteRefusal(p, c, tc.write, "violating "+map[bool]string{true: "write", false: "read"}[tc.write])
			for _, r := range t.waitN(p.cli.rcq, 2, "initiator's outstanding receives") {
				if r.Status == nil {
					t.Fatalf("receive %v succeeded after the connection failed", r.RequestContext)
				}
			}
			t.expectNoMore(p.cli.icq, "initiator")
			if !bytes.Equal(tgt.Bytes(), before) {
				t.Fatalf("target memory changed by a refused %s: %s", tc.name, firstDiff(tgt.Bytes(), before))
			}
		})
	}
	t.Run("local-wrong-lkey", func(t *T) {
		p := t.newPair(pairOpts{})
		rmr := t.register(p.srv.pd, 64, allAccess)
		t.postRecvs(p.srv.qp, rmr, 1, 64, 0)
		src := t.register(p.cli.pd, 64, allAccess)
		sge := src.SGE(0, 64)
		sge.LKey ^= 0xff
		err := p.cli.qp.Send("bad-lkey", []transport.SGE{sge}, 0)
		if err != nil {
			if !errors.Is(err, transport.ErrAccessViolation) {
				t.Fatalf("Send with a wrong local key: %v, want ErrAccessViolation", err)
			}
			return
		}
		c := t.waitN(p.cli.icq, 1, "send with a wrong local key")[0]
		if !errors.Is(c.Status, transport.ErrAccessViolation) {
			t.Fatalf("Send with a wrong local key completed with %v, want ErrAccessViolation", c.Status)
		}
	})
}

// DisconnectInFlight: every request outstanding at Disconnect completes,
// once: receives with ErrCancelled, initiator requests either successfully
// (finished before) or with ErrCancelled; the peer's receives are flushed
// too; both sides end with ErrDisconnected; nothing completes afterwards.
func testDisconnectInFlight(t *T) {
	p := t.newPair(pairOpts{cli: epOpts{cqDepth: 256}})
	size := min(256<<10, int(p.cli.info.MaxTransferLength))
	cmr := t.register(p.cli.pd, size, allAccess)  // write source
	sink := t.register(p.cli.pd, size, allAccess) // read sink
	smr := t.register(p.srv.pd, size, allAccess)  // write target
	rsrc := t.register(p.srv.pd, size, allAccess) // read source
	crecv := t.register(p.cli.pd, 8*64, allAccess)
	srecv := t.register(p.srv.pd, 8*64, allAccess)
	t.postRecvs(p.cli.qp, crecv, 8, 64, 0)
	t.postRecvs(p.srv.qp, srecv, 8, 64, 0)
	accepted := 0
	for i := range 16 {
		var err error
		if i%2 == 0 {
			err = p.cli.qp.Write(100+i, []transport.SGE{cmr.SGE(0, uint32(size))}, smr.Addr(), smr.RKey(), 0)
		} else {
			err = p.cli.qp.Read(100+i, []transport.SGE{sink.SGE(0, uint32(size))}, rsrc.Addr(), rsrc.RKey(), 0)
		}
		if err == nil {
			accepted++
		} else if !errors.Is(err, transport.ErrInsufficientResources) {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	if err := p.cli.qp.Disconnect(); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	seen := seenOnce{}
	rc := t.waitN(p.cli.rcq, 8, "client receives outstanding at Disconnect")
	seen.add(t, rc, "client receives")
	for _, c := range rc {
		if !errors.Is(c.Status, transport.ErrCancelled) {
			t.Fatalf("client receive %v: %v, want ErrCancelled", c.RequestContext, c.Status)
		}
	}
	ic := t.waitN(p.cli.icq, accepted, "client requests outstanding at Disconnect")
	seen.add(t, ic, "client initiator requests")
	cancelled := 0
	for _, c := range ic {
		switch {
		case c.Status == nil:
		case errors.Is(c.Status, transport.ErrCancelled):
			cancelled++
		default:
			t.Fatalf("client %v %v: %v, want success or ErrCancelled", c.Type, c.RequestContext, c.Status)
		}
	}
	t.Logf("%d of %d initiator requests cancelled by Disconnect", cancelled, accepted)
	for _, c := range t.waitN(p.srv.rcq, 8, "peer's receives") {
		if !errors.Is(c.Status, transport.ErrCancelled) {
			t.Fatalf("peer receive %v: %v, want ErrCancelled", c.RequestContext, c.Status)
		}
	}
	t.waitDone(p.cli.qp, "disconnecting side")
	t.waitDone(p.srv.qp, "peer of a Disconnect")
	if !errors.Is(p.cli.qp.Err(), transport.ErrDisconnected) || !errors.Is(p.srv.qp.Err(), transport.ErrDisconnected) {
		t.Errorf("Err() after an orderly Disconnect: local %v, peer %v; want ErrDisconnected on both", p.cli.qp.Err(), p.srv.qp.Err())
	}
	// After the disconnect: a post is refused, or accepted and flushed.
	if err := p.cli.qp.Send("late", []transport.SGE{cmr.SGE(0, 64)}, 0); err == nil {
		if c := t.waitN(p.cli.icq, 1, "send posted after Disconnect")[0]; !errors.Is(c.Status, transport.ErrCancelled) {
			t.Fatalf("send posted after Disconnect completed with %v, want ErrCancelled (or the post refused)", c.Status)
		}
	}
	p.cli.qp.Disconnect() // twice: must not panic
	t.expectNoMore(p.cli.icq, "client initiator CQ after Disconnect")
	t.expectNoMore(p.cli.rcq, "client receive CQ after Disconnect")
	t.expectNoMore(p.srv.rcq, "peer receive CQ after Disconnect")
}

// RejectWithPrivateData: a rejected connect returns a *RejectError carrying
// the peer's private data and matching ErrConnectionRefused; the listener
// goes on accepting; connecting where nothing listens is refused too.
func testRejectWithPrivateData(t *T) {
	srvA, cliA := t.adapter(), t.adapter()
	info := srvA.Info()
	ln := t.listen(srvA)
	cli := t.newEndpoint(cliA, "client", epOpts{})
	callerData := make([]byte, min(16, int(cliA.Info().MaxCallerData)))
	t.fill(callerData)
	rejectData := make([]byte, min(24, int(info.MaxCalleeData)))
	t.fill(rejectData)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	srvErr := make(chan error, 1)
	go func() {
		req, err := ln.GetConnectionRequest(ctx)
		if err != nil {
			srvErr <- err
			return
		}
		if !bytes.Equal(req.PrivateData(), callerData) {
			srvErr <- fmt.Errorf("request private data %x, want %x", req.PrivateData(), callerData)
			req.Reject(nil)
			return
		}
		srvErr <- req.Reject(rejectData)
	}()
	_, err := cliA.Connect(ctx, cli.qp, ln.Addr().String(), transport.ConnParams{PrivateData: callerData})
	if e := <-srvErr; e != nil {
		t.Fatalf("passive side: %v", e)
	}
	var rej *transport.RejectError
	if !errors.As(err, &rej) {
		t.Fatalf("Connect to a rejecting peer: %v (%T), want a *transport.RejectError", err, err)
	}
	if !errors.Is(err, transport.ErrConnectionRefused) {
		t.Fatalf("Connect to a rejecting peer: %v does not match ErrConnectionRefused", err)
	}
	if !bytes.Equal(rej.PrivateData, rejectData) {
		t.Fatalf("reject private data %x, want %x", rej.PrivateData, rejectData)
	}
	// The listener still accepts.
	srv := t.newEndpoint(srvA, "server", epOpts{})
	cli2 := t.newEndpoint(cliA, "client2", epOpts{})
	t.connect(ln, cliA, cli2.qp, srv.qp, transport.ConnParams{}, transport.ConnParams{})
	// Nothing listening.
	ln2 := t.listen(srvA)
	addr := ln2.Addr().String()
	ln2.Close()
	cli3 := t.newEndpoint(cliA, "client3", epOpts{})
	_, err = cliA.Connect(ctx, cli3.qp, addr, transport.ConnParams{})
	if !errors.Is(err, transport.ErrConnectionRefused) {
		t.Fatalf("Connect to %s where nothing listens: %v, want ErrConnectionRefused", addr, err)
	}
}

// PrivateDataLimits: exactly MaxCallerData bytes travel with a connect and
// exactly MaxCalleeData with an accept; one byte more is refused with
// ErrInvalidParameter (connect, accept and reject).
func testPrivateDataLimits(t *T) {
	srvA, cliA := t.adapter(), t.adapter()
	maxCaller, maxCallee := int(cliA.Info().MaxCallerData), int(srvA.Info().MaxCalleeData)
	ln := t.listen(srvA)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

	t.Run("exact", func(t *T) {
		caller, callee := make([]byte, maxCaller), make([]byte, maxCallee)
		t.fill(caller)
		t.fill(callee)
		srv := t.newEndpoint(srvA, "server", epOpts{})
		cli := t.newEndpoint(cliA, "client", epOpts{})
		srvErr := make(chan error, 1)
		go func() {
			req, err := ln.GetConnectionRequest(ctx)
			if err != nil {
				srvErr <- err
				return
			}
			if !bytes.Equal(req.PrivateData(), caller) {
				srvErr <- fmt.Errorf("connect private data of %d bytes arrived as %d bytes (%s)", len(caller), len(req.PrivateData()), firstDiff(req.PrivateData(), caller))
				req.Reject(nil)
				return
			}
			srvErr <- req.Accept(ctx, srv.qp, transport.ConnParams{PrivateData: callee})
		}()
		got, err := cliA.Connect(ctx, cli.qp, ln.Addr().String(), transport.ConnParams{PrivateData: caller})
		if e := <-srvErr; e != nil {
			t.Fatalf("passive side with MaxCallerData = %d bytes: %v", maxCaller, e)
		}
		if err != nil {
			t.Fatalf("Connect with MaxCallerData = %d bytes: %v", maxCaller, err)
		}
		if !bytes.Equal(got, callee) {
			t.Fatalf("accept private data of MaxCalleeData = %d bytes arrived as %d bytes (%s)", len(callee), len(got), firstDiff(got, callee))
		}
	})
	t.Run("caller-too-long", func(t *T) {
		cli := t.newEndpoint(cliA, "client", epOpts{})
		_, err := cliA.Connect(ctx, cli.qp, ln.Addr().String(), transport.ConnParams{PrivateData: make([]byte, maxCaller+1)})
		if !errors.Is(err, transport.ErrInvalidParameter) {
			t.Fatalf("Connect with MaxCallerData+1 = %d bytes: %v, want ErrInvalidParameter", maxCaller+1, err)
		}
		qctx, qcancel := context.WithTimeout(ctx, quiet)
		defer qcancel()
		if req, err := ln.GetConnectionRequest(qctx); err == nil {
			req.Reject(nil)
			t.Fatalf("a Connect refused for its private data still reached the listener")
		}
	})
	t.Run("callee-too-long", func(t *T) {
		srv := t.newEndpoint(srvA, "server", epOpts{})
		cli := t.newEndpoint(cliA, "client", epOpts{})
		srvErr := make(chan error, 1)
		go func() {
			req, err := ln.GetConnectionRequest(ctx)
			if err != nil {
				srvErr <- err
				return
			}
			err = req.Accept(ctx, srv.qp, transport.ConnParams{PrivateData: make([]byte, maxCallee+1)})
			if !errors.Is(err, transport.ErrInvalidParameter) {
				srvErr <- fmt.Errorf("Accept with MaxCalleeData+1 = %d bytes: %v, want ErrInvalidParameter", maxCallee+1, err)
				req.Reject(nil)
				return
			}
			err = req.Reject(make([]byte, maxCallee+1))
			if !errors.Is(err, transport.ErrInvalidParameter) {
				srvErr <- fmt.Errorf("Reject with MaxCalleeData+1 = %d bytes: %v, want ErrInvalidParameter", maxCallee+1, err)
				req.Reject(nil)
				return
			}
			srvErr <- req.Reject(nil)
		}()
		_, err := cliA.Connect(ctx, cli.qp, ln.Addr().String(), transport.ConnParams{})
		if e := <-srvErr; e != nil {
			t.Fatal(e)
		}
		if !errors.Is(err, transport.ErrConnectionRefused) {
			t.Fatalf("Connect after the peer's refused Accept and Reject(nil): %v, want ErrConnectionRefused", err)
		}
	})
}

// MemoryWindows: a provider without transport.MemoryWindowPD and
// transport.BindQP clears FlagMemoryWindowsSupported (then the subtest
// skips); one with them but on an adapter without the flag refuses
// CreateMemoryWindow and Bind with ErrNotSupported; with the flag, a bound
// window gives the peer access through its key.
func testMemoryWindows(t *T) {
	p := t.newPair(pairOpts{})
	mpd, bqp := t.memoryWindowsOf(p.srv)
	if p.srv.info.Flags&transport.FlagMemoryWindowsSupported == 0 {
		mr := t.register(p.srv.pd, 8192, allAccess)
		if mw, err := mpd.CreateMemoryWindow(); !errors.Is(err, transport.ErrNotSupported) {
			if mw != nil {
				mw.Close()
			}
			t.Fatalf("CreateMemoryWindow without FlagMemoryWindowsSupported: %v, want ErrNotSupported", err)
		}
		if err := bqp.Bind("bind", mr, fakeMW{}, mr.Bytes()[:4096], transport.AccessRemoteRead, 0); !errors.Is(err, transport.ErrNotSupported) {
			t.Fatalf("Bind without FlagMemoryWindowsSupported: %v, want ErrNotSupported", err)
		}
		t.expectNoMore(p.srv.icq, "after a refused Bind")
		return
	}
	mr := t.register(p.srv.pd, 8192, allAccess|transport.AccessMWBind)
	mw, err := mpd.CreateMemoryWindow()
	if err != nil {
		t.Fatalf("CreateMemoryWindow: %v", err)
	}
	t.Cleanup(func() { mw.Close() })
	const off, n = 1024, 4096
	if err := bqp.Bind("bind", mr, mw, mr.Bytes()[off:off+n], transport.AccessRemoteRead|transport.AccessRemoteWrite, 0); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	t.checkOK(t.waitN(p.srv.icq, 1, "bind"), transport.OpBind, p.srv.tag, "bind")
	sink := t.register(p.cli.pd, n, allAccess)
	c := t.readVia(p, sink, mr.Addr()+off, mw.RKey(), n, "read-through-window")
	t.checkOK([]transport.Completion{c}, transport.OpRead, p.cli.tag, "read through the window")
	if !bytes.Equal(sink.Bytes(), mr.Bytes()[off:off+n]) {
		t.Fatalf("read through the window: %s", firstDiff(sink.Bytes(), mr.Bytes()[off:off+n]))
	}
}
