package transporttest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/blk-project/blk/transport"
)

// srq is an SRQ with the test's notification callback.
type srq struct {
	transport.SRQ
	*notifier
}

func (t *T) newSRQ(pd transport.PD, depth, maxSge, threshold uint32) *srq {
	t.Helper()
	n := newNotifier("srq")
	s, err := pd.CreateSRQ(transport.SRQConfig{Depth: depth, MaxSge: maxSge, NotifyThreshold: threshold, Notify: n.notify, Context: n.ctx, Affinity: -1})
	if err != nil {
		t.Fatalf("CreateSRQ(depth %d, sge %d, threshold %d): %v", depth, maxSge, threshold, err)
	}
	t.Cleanup(func() { s.Close() })
	return &srq{SRQ: s, notifier: n}
}

func (t *T) needSRQ(info transport.AdapterInfo, depth uint32) {
	t.Helper()
	t.skipUnless(info.MaxSrqDepth >= depth, fmt.Sprintf("adapter's MaxSrqDepth %d < %d: no SRQ to test", info.MaxSrqDepth, depth))
}

// srqPair connects a client to a server QP whose receives come from an SRQ
// of the given depth. The SRQ is created with its threshold notification
// unarmed: whether arming at creation an SRQ that starts empty fires at
// once is not settled by S4 ("falls below"), so tests arm with Modify
// once the SRQ is filled.
func (t *T) srqPair(depth uint32) (*pair, *srq) {
	t.Helper()
	srvA, cliA := t.adapter(), t.adapter()
	t.needSRQ(srvA.Info(), depth)
	spd := t.newPD(srvA)
	s := t.newSRQ(spd, depth, min(2, srvA.Info().MaxReceiveRequestSge), 0)
	srv := t.newEndpoint(srvA, "server", epOpts{pd: spd, srq: s.SRQ, cqDepth: max(256, 2*depth)})
	cli := t.newEndpoint(cliA, "client", epOpts{qp: func(c *transport.QPConfig) {
		c.InitiatorQueueDepth = min(max(64, depth), cliA.Info().MaxInitiatorQueueDepth)
	}, cqDepth: max(256, 2*depth)})
	ln := t.listen(srvA)
	t.connect(ln, cliA, cli.qp, srv.qp, transport.ConnParams{}, transport.ConnParams{})
	return &pair{cli: cli, srv: srv, ln: ln}, s
}

// sendN sends k messages of 8 bytes (an index) from the client and waits
// for their send completions.
func (t *T) sendN(p *pair, src transport.MemoryRegion, from, k int) {
	t.Helper()
	for i := from; i < from+k; i++ {
		off := uint32(8 * (i % (len(src.Bytes()) / 8)))
		binary.LittleEndian.PutUint64(src.Bytes()[off:], uint64(i))
		if err := p.cli.qp.Send(i, []transport.SGE{src.SGE(off, 8)}, 0); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
		// Sends are posted one window at a time so that a buffer is not
		// rewritten while it may still be on its way.
		if (i-from+1)%32 == 0 {
			t.checkOK(t.waitN(p.cli.icq, 32, "sends"), transport.OpSend, p.cli.tag, "sends")
		}
	}
	if r := k % 32; r != 0 {
		t.checkOK(t.waitN(p.cli.icq, r, "sends"), transport.OpSend, p.cli.tag, "sends")
	}
}

// S1. CreateSRQ takes PD, depth, SGE limit, threshold, an optional
// callback with context, and affinity; QPs created against it take their
// receives from it.
func testS1(t *T) {
	a := t.adapter()
	info := a.Info()
	t.needSRQ(info, 4)
	pd := t.newPD(a)
	s, err := pd.CreateSRQ(transport.SRQConfig{Depth: 4, MaxSge: 1, Affinity: -1})
	if err != nil {
		t.Fatalf("CreateSRQ without a callback: %v", err)
	}
	if q := s.Queued(); q != 0 {
		t.Errorf("new SRQ: Queued() = %d", q)
	}
	s.Close()

	p, sq := t.srqPair(8)
	rmr := t.register(p.srv.pd, 8*64, allAccess)
	for i := range 8 {
		if err := sq.PostReceive(reqID{"srq", 0, i}, []transport.SGE{rmr.SGE(uint32(64*i), 64)}); err != nil {
			t.Fatalf("SRQ PostReceive %d: %v", i, err)
		}
	}
	if q := sq.Queued(); q != 8 {
		t.Fatalf("Queued() = %d after 8 posts", q)
	}
	src := t.register(p.cli.pd, 64, allAccess)
	t.sendN(p, src, 0, 3)
	got := t.waitN(p.srv.rcq, 3, "receives taken from the SRQ")
	for i, c := range got {
		if c.Status != nil || c.Type != transport.OpReceive || c.QPContext != any(p.srv.tag) || c.Bytes != 8 {
			t.Fatalf("SRQ receive %d: status %v type %v QP context %v bytes %d; want success, receive, %v, 8", i, c.Status, c.Type, c.QPContext, c.Bytes, p.srv.tag)
		}
		if c.RequestContext != any(reqID{"srq", 0, i}) {
			t.Fatalf("SRQ receive %d: request context %v, want srq0.%d (SRQ order)", i, c.RequestContext, i)
		}
	}
	if q := sq.Queued(); q != 5 {
		t.Fatalf("Queued() = %d after 3 of 8 receives were used, want 5", q)
	}
}

// S2. Depth above MaxSrqDepth or MaxSge above MaxReceiveRequestSge fails
// with ErrInvalidParameter; the limits themselves are accepted.
func testS2(t *T) {
	a := t.adapter()
	info := a.Info()
	t.needSRQ(info, 1)
	pd := t.newPD(a)
	try := func(depth, sge uint32) error {
		s, err := pd.CreateSRQ(transport.SRQConfig{Depth: depth, MaxSge: sge, Affinity: -1})
		if err == nil {
			s.Close()
		}
		return err
	}
	if info.MaxSrqDepth != transport.MaxUint32 {
		if err := try(info.MaxSrqDepth+1, 1); !errors.Is(err, transport.ErrInvalidParameter) {
			t.Errorf("CreateSRQ(depth MaxSrqDepth+1 = %d): %v, want ErrInvalidParameter", info.MaxSrqDepth+1, err)
		}
	}
	if info.MaxReceiveRequestSge != transport.MaxUint32 {
		if err := try(1, info.MaxReceiveRequestSge+1); !errors.Is(err, transport.ErrInvalidParameter) {
			t.Errorf("CreateSRQ(MaxSge MaxReceiveRequestSge+1 = %d): %v, want ErrInvalidParameter", info.MaxReceiveRequestSge+1, err)
		}
	}
	if info.MaxSrqDepth <= 1<<20 {
		if err := try(info.MaxSrqDepth, info.MaxReceiveRequestSge); err != nil {
			t.Errorf("CreateSRQ(depth %d, sge %d) at the limits: %v", info.MaxSrqDepth, info.MaxReceiveRequestSge, err)
		}
	}
}

// S3. At most SrqDepth receives are queued: one more is refused with
// ErrInsufficientResources; Modify raises the depth. A receive with more
// SGEs than the SRQ's MaxSge is refused with ErrInvalidParameter.
func testS3(t *T) {
	a := t.adapter()
	info := a.Info()
	t.needSRQ(info, 24)
	pd := t.newPD(a)
	sge := min(2, info.MaxReceiveRequestSge)
	s := t.newSRQ(pd, 16, sge, 0)
	mr := t.register(pd, 64*32, allAccess)
	for i := range 16 {
		if err := s.PostReceive(i, []transport.SGE{mr.SGE(uint32(64*i), 64)}); err != nil {
			t.Fatalf("PostReceive %d of 16: %v", i+1, err)
		}
	}
	if err := s.PostReceive(16, []transport.SGE{mr.SGE(64*16, 64)}); !errors.Is(err, transport.ErrInsufficientResources) {
		t.Fatalf("PostReceive past SrqDepth 16: %v, want ErrInsufficientResources", err)
	}
	if q := s.Queued(); q != 16 {
		t.Fatalf("Queued() = %d, want 16", q)
	}
	if err := s.Modify(24, 0); err != nil {
		t.Fatalf("Modify(depth 24): %v", err)
	}
	for i := 16; i < 24; i++ {
		if err := s.PostReceive(i, []transport.SGE{mr.SGE(uint32(64*i), 64)}); err != nil {
			t.Fatalf("PostReceive %d after Modify to depth 24: %v", i+1, err)
		}
	}
	if err := s.PostReceive(24, []transport.SGE{mr.SGE(64*24, 64)}); !errors.Is(err, transport.ErrInsufficientResources) {
		t.Fatalf("PostReceive past the modified depth 24: %v, want ErrInsufficientResources", err)
	}
	s2 := t.newSRQ(pd, 4, sge, 0)
	sges := make([]transport.SGE, sge+1)
	for i := range sges {
		sges[i] = mr.SGE(uint32(16*i), 16)
	}
	if err := s2.PostReceive("too many", sges); !errors.Is(err, transport.ErrInvalidParameter) {
		t.Fatalf("PostReceive with %d SGEs on an SRQ of MaxSge %d: %v, want ErrInvalidParameter", sge+1, sge, err)
	}
}

// S4. When the queued receives fall below NotifyThreshold the callback
// runs once, with the SRQ's context; Modify re-arms it and fires at once
// when already below.
func testS4(t *T) {
	const depth, threshold = 16, 4
	p, s := t.srqPair(depth)
	rmr := t.register(p.srv.pd, 64*depth, allAccess)
	for i := range depth {
		if err := s.PostReceive(i, []transport.SGE{rmr.SGE(uint32(64*i), 64)}); err != nil {
			t.Fatalf("SRQ PostReceive: %v", err)
		}
	}
	if err := s.Modify(0, threshold); err != nil {
		t.Fatalf("Modify(0, %d) to arm the threshold: %v", threshold, err)
	}
	src := t.register(p.cli.pd, 256, allAccess)
	count := func(want int64, what string) {
		t.Helper()
		if want > s.normal.Load() {
			deadline := time.After(waitTimeout)
			for s.normal.Load() < want {
				select {
				case <-s.notes:
				case <-deadline:
					t.Fatalf("%s: SRQ notification did not come within %v (Queued %d, threshold %d)", what, waitTimeout, s.Queued(), threshold)
				}
			}
		}
		time.Sleep(quiet)
		if got := s.normal.Load(); got != want {
			t.Fatalf("%s: %d SRQ notifications, want %d (Queued %d, threshold %d)", what, got, want, s.Queued(), threshold)
		}
	}
	sent := 0
	consume := func(k int) {
		t.Helper()
		t.sendN(p, src, sent, k)
		t.checkOK(t.waitN(p.srv.rcq, k, "SRQ receives"), transport.OpReceive, p.srv.tag, "SRQ receives")
		sent += k
	}
	consume(depth - threshold)
	count(0, fmt.Sprintf("%d queued, threshold %d (not below)", threshold, threshold))
	consume(1)
	count(1, fmt.Sprintf("%d queued, below threshold %d", threshold-1, threshold))
	consume(1)
	count(1, "further below, not re-armed (one notification per arm)")
	if err := s.Modify(0, threshold); err != nil {
		t.Fatalf("Modify(0, %d): %v", threshold, err)
	}
	count(2, "Modify re-arms while already below the threshold")
	if w := s.wrongCtx.Load(); w != 0 {
		t.Errorf("%d SRQ notifications carried another context than the one given", w)
	}
	// Refill, re-arm above the threshold, consume again.
	for i := range depth - s.Queued() {
		if err := s.PostReceive(100+i, []transport.SGE{rmr.SGE(uint32(64*((sent+i)%depth)), 64)}); err != nil {
			t.Fatalf("refill PostReceive: %v", err)
		}
	}
	if err := s.Modify(0, threshold); err != nil {
		t.Fatalf("Modify: %v", err)
	}
	count(2, "re-armed with the SRQ full")
	consume(depth - threshold + 1)
	count(3, "below the threshold again after re-arming")
}

// S5. Affinity as in C6 (accepted, not observable); exhaustion as in C7.
func testS5(t *T) {
	a := t.adapter()
	info := a.Info()
	t.needSRQ(info, 8)
	pd := t.newPD(a)
	affs := []int{-1, 0}
	if info.Cores > 1 {
		affs = append(affs, info.Cores-1)
	}
	n := newNotifier("s5")
	for _, aff := range affs {
		s, err := pd.CreateSRQ(transport.SRQConfig{Depth: 8, MaxSge: 1, NotifyThreshold: 1, Notify: n.notify, Context: n.ctx, Affinity: aff})
		if err != nil {
			t.Fatalf("CreateSRQ(affinity %d): %v", aff, err)
		}
		s.Close()
	}
	var made []transport.SRQ
	defer func() {
		for _, s := range made {
			s.Close()
		}
	}()
	for i := range 128 {
		s, err := pd.CreateSRQ(transport.SRQConfig{Depth: 8, MaxSge: 1, Affinity: -1})
		if err != nil {
			if !errors.Is(err, transport.ErrInsufficientResources) {
				t.Fatalf("CreateSRQ #%d with valid sizes: %v, want success or ErrInsufficientResources", i, err)
			}
			t.Logf("provider ran out after %d SRQs", i)
			break
		}
		made = append(made, s)
	}
	if len(made) == 128 {
		t.Logf("created 128 SRQs without exhausting the provider; S5's error path is not reachable through the API")
	}
}

// ManyQPsOneSRQ: 16 QPs share one SRQ and one receive CQ; every message of
// every peer arrives once, and Completion.QPContext names the QP it came in
// on.
func testManyQPsOneSRQ(t *T) {
	const nqp, perQP = 16, 8
	srvA, cliA := t.adapter(), t.adapter()
	t.needSRQ(srvA.Info(), nqp*perQP)
	spd := t.newPD(srvA)
	s := t.newSRQ(spd, nqp*perQP, 1, 0)
	srcq := t.newCQ(srvA, "srv.rcq", min(4*nqp*perQP, srvA.Info().MaxCqDepth), -1)
	sicq := t.newCQ(srvA, "srv.icq", min(4*nqp*perQP, srvA.Info().MaxCqDepth), -1)
	cpd := t.newPD(cliA)
	crcq := t.newCQ(cliA, "cli.rcq", min(4*nqp*perQP, cliA.Info().MaxCqDepth), -1)
	cicq := t.newCQ(cliA, "cli.icq", min(4*nqp*perQP, cliA.Info().MaxCqDepth), -1)
	ln := t.listen(srvA)
	var srv, cli [nqp]*endpoint
	for i := range nqp {
		srv[i] = t.newEndpoint(srvA, "server", epOpts{pd: spd, rcq: srcq, icq: sicq, srq: s.SRQ, index: i})
		cli[i] = t.newEndpoint(cliA, "client", epOpts{pd: cpd, rcq: crcq, icq: cicq, index: i})
		t.connect(ln, cliA, cli[i].qp, srv[i].qp, transport.ConnParams{}, transport.ConnParams{})
	}
	rmr := t.register(spd, nqp*perQP*16, allAccess)
	for i := range nqp * perQP {
		if err := s.PostReceive(i, []transport.SGE{rmr.SGE(uint32(16*i), 16)}); err != nil {
			t.Fatalf("SRQ PostReceive %d: %v", i, err)
		}
	}
	cmr := t.register(cpd, nqp*perQP*16, allAccess)
	// Receives get their own memory: a buffer that a send reads must not
	// be a buffer a receive writes (that would be a data race).
	crecv := t.register(cpd, nqp*16, allAccess)
	for i := range nqp {
		if err := cli[i].qp.PostReceive(i, []transport.SGE{crecv.SGE(uint32(16*i), 16)}); err != nil {
			t.Fatalf("client %d PostReceive: %v", i, err)
		}
	}
	// Interleave the peers: message j of every QP before message j+1.
	for j := range perQP {
		for i := range nqp {
			off := uint32(16 * (i*perQP + j))
			binary.LittleEndian.PutUint64(cmr.Bytes()[off:], uint64(i))
			binary.LittleEndian.PutUint64(cmr.Bytes()[off+8:], uint64(j))
			if err := cli[i].qp.Send(reqID{"c", i, j}, []transport.SGE{cmr.SGE(off, 16)}, 0); err != nil {
				t.Fatalf("client %d Send %d: %v", i, j, err)
			}
		}
	}
	seen := map[[2]uint64]bool{}
	for _, c := range t.waitN(srcq, nqp*perQP, "messages from all peers") {
		if c.Status != nil || c.Bytes != 16 {
			t.Fatalf("receive %v: status %v, %d bytes", c.RequestContext, c.Status, c.Bytes)
		}
		idx, ok := c.RequestContext.(int)
		if !ok {
			t.Fatalf("receive request context %v (%T), want an int posted on the SRQ", c.RequestContext, c.RequestContext)
		}
		b := rmr.Bytes()[16*idx:]
		from, j := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
		if from >= nqp || j >= perQP {
			t.Fatalf("receive %d holds garbage (%d, %d)", idx, from, j)
		}
		if c.QPContext != any(srv[from].tag) {
			t.Fatalf("message %d from client %d arrived with QP context %v, want %v", j, from, c.QPContext, srv[from].tag)
		}
		k := [2]uint64{from, j}
		if seen[k] {
			t.Fatalf("message %d from client %d arrived twice", j, from)
		}
		seen[k] = true
	}
	t.waitN(cicq, nqp*perQP, "client send completions")
	if q := s.Queued(); q != 0 {
		t.Errorf("Queued() = %d after every receive was used", q)
	}
	// And back: each server QP answers its own peer.
	ans := t.register(spd, nqp*16, allAccess)
	for i := range nqp {
		binary.LittleEndian.PutUint64(ans.Bytes()[16*i:], uint64(i))
		if err := srv[i].qp.Send(i, []transport.SGE{ans.SGE(uint32(16*i), 16)}, 0); err != nil {
			t.Fatalf("server %d Send: %v", i, err)
		}
	}
	for _, c := range t.waitN(crcq, nqp, "answers") {
		i, _ := c.RequestContext.(int)
		if c.Status != nil || c.QPContext != any(cli[i].tag) {
			t.Fatalf("client receive %v: status %v, QP context %v, want %v", c.RequestContext, c.Status, c.QPContext, cli[i].tag)
		}
		if got := binary.LittleEndian.Uint64(crecv.Bytes()[16*i:]); got != uint64(i) {
			t.Fatalf("client %d got the answer meant for %d", i, got)
		}
	}
	t.waitN(sicq, nqp, "server send completions")
}

// SRQThresholdRefill: a consumer that refills its SRQ only from the
// threshold notification keeps a stream of messages flowing: each time the
// queue falls below the threshold exactly one notification comes, the
// refill and Modify re-arm it, and no message ever finds the SRQ empty.
func testSRQThresholdRefill(t *T) {
	const depth, threshold, batch, rounds = 32, 8, 25, 8
	p, s := t.srqPair(depth)
	rmr := t.register(p.srv.pd, 64*depth, allAccess)
	slot := 0
	post := func(k int) {
		t.Helper()
		for range k {
			if err := s.PostReceive(slot, []transport.SGE{rmr.SGE(uint32(64*(slot%depth)), 64)}); err != nil {
				t.Fatalf("SRQ PostReceive (Queued %d): %v", s.Queued(), err)
			}
			slot++
		}
	}
	post(depth)
	if err := s.Modify(0, threshold); err != nil {
		t.Fatalf("Modify(0, %d) to arm the threshold: %v", threshold, err)
	}
	src := t.register(p.cli.pd, 8*64, allAccess)
	sent := 0
	for r := range rounds {
		t.sendN(p, src, sent, batch)
		got := t.waitN(p.srv.rcq, batch, fmt.Sprintf("round %d receives", r))
		for i, c := range got {
			if c.Status != nil {
				t.Fatalf("round %d: receive %d failed: %v", r, i, c.Status)
			}
			if want := sent + i; binary.LittleEndian.Uint64(rmr.Bytes()[64*(c.RequestContext.(int)%depth):]) != uint64(want) {
				t.Fatalf("round %d: receive %v does not hold message %d", r, c.RequestContext, want)
			}
		}
		sent += batch
		// Queued fell from depth to depth-batch < threshold: one
		// notification.
		deadline := time.After(waitTimeout)
		for s.normal.Load() < int64(r+1) {
			select {
			case <-s.notes:
			case <-deadline:
				t.Fatalf("round %d: no threshold notification within %v (Queued %d, threshold %d)", r, waitTimeout, s.Queued(), threshold)
			}
		}
		if n := s.normal.Load(); n != int64(r+1) {
			t.Fatalf("round %d: %d notifications, want %d (one per crossing)", r, n, r+1)
		}
		post(depth - s.Queued())
		if err := s.Modify(0, threshold); err != nil {
			t.Fatalf("Modify re-arm: %v", err)
		}
	}
	time.Sleep(quiet)
	if n := s.normal.Load(); n != rounds {
		t.Fatalf("%d notifications after %d rounds, want %d", n, rounds, rounds)
	}
	select {
	case <-p.srv.qp.Done():
		t.Fatalf("connection failed: %v", p.srv.qp.Err())
	default:
	}
	if w := s.wrongCtx.Load(); w != 0 {
		t.Errorf("%d SRQ notifications carried another context", w)
	}
}

// SRQReceiverWait: with FlagSRQReceiverWait, sends that reach a QP whose
// SRQ is empty wait for receives instead of ending the connection: none
// completes while the SRQ stays empty, both QPs stay up, and receives
// posted afterwards take the held messages in order, whole, one each.
// Without the flag the suite does not test it (SendWithoutReceive shows
// what an empty receive queue does).
func testSRQReceiverWait(t *T) {
	const held = 6
	p, s := t.srqPair(2 * held)
	t.skipUnless(p.srv.qp != nil && t.adapter().Info().Flags&transport.FlagSRQReceiverWait != 0,
		"the adapter does not set FlagSRQReceiverWait: an empty SRQ ends the connection that finds it so")
	src := t.register(p.cli.pd, 8*held, allAccess)
	for i := range held {
		binary.LittleEndian.PutUint64(src.Bytes()[8*i:], uint64(1000+i))
		if err := p.cli.qp.Send(i, []transport.SGE{src.SGE(uint32(8*i), 8)}, 0); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
	}
	t.expectNoMore(p.srv.rcq, "receives while the SRQ is empty")
	if err := p.srv.qp.Err(); err != nil {
		t.Fatalf("the server QP failed while its SRQ was empty: %v", err)
	}
	if err := p.cli.qp.Err(); err != nil {
		t.Fatalf("the client QP failed while the peer's SRQ was empty: %v", err)
	}
	dst := t.register(p.srv.pd, 16*held, allAccess)
	for i := range held {
		// One receive at a time: each takes exactly the next message.
		if err := s.PostReceive(i, []transport.SGE{dst.SGE(uint32(16*i), 16)}); err != nil {
			t.Fatalf("SRQ PostReceive %d: %v", i, err)
		}
		c := t.waitN(p.srv.rcq, 1, "a held message")[0]
		if c.Status != nil || c.Bytes != 8 || c.RequestContext != any(i) {
			t.Fatalf("receive %d: ctx %v, status %v, %d bytes", i, c.RequestContext, c.Status, c.Bytes)
		}
		if got := binary.LittleEndian.Uint64(dst.Bytes()[16*i:]); got != uint64(1000+i) {
			t.Fatalf("receive %d holds message %d, want %d", i, got, 1000+i)
		}
	}
	t.waitN(p.cli.icq, held, "the held sends' completions")
	t.expectNoMore(p.srv.rcq, "after every held message was taken")
	if p.srv.qp.Err() != nil || p.cli.qp.Err() != nil {
		t.Fatalf("a QP failed: server %v, client %v", p.srv.qp.Err(), p.cli.qp.Err())
	}
}

// SRQSplitReceive: an SRQ receive of two SGEs in two regions — a 64-byte
// header, then a page-aligned 4 KiB payload, as a target posts them so
// that a command's in-capsule data lands on a page of its own — scatters
// a message across them in order: its first 64 bytes in the header, the
// rest from the payload's start. A message shorter than the header
// leaves the payload untouched, and nothing past a message's end
// changes. Receives complete in order and report the message length.
func testSRQSplitReceive(t *T) {
	t.skipUnless(t.adapter().Info().MaxReceiveRequestSge >= 2, "adapter takes one SGE per receive")
	const hdr, page = 64, 4096
	sizes := []int{hdr + page, hdr + 512, hdr, hdr / 2, hdr + 1, 1, hdr + page - 8}
	p, s := t.srqPair(uint32(len(sizes)))
	hmr := t.register(p.srv.pd, hdr*len(sizes), allAccess)
	// One page more than needed, so that the payloads can start on a
	// page whatever the registered buffer's own alignment.
	pmr := t.register(p.srv.pd, page*(len(sizes)+1), allAccess)
	base := uint32((page - uintptr(unsafe.Pointer(unsafe.SliceData(pmr.Bytes())))%page) % page)
	// Taken before the receives are posted: the buffers are the
	// adapter's from then on.
	hbefore, pbefore := bytes.Clone(hmr.Bytes()), bytes.Clone(pmr.Bytes())
	for i := range sizes {
		sges := []transport.SGE{hmr.SGE(uint32(hdr*i), hdr), pmr.SGE(base+uint32(page*i), page)}
		if err := s.PostReceive(i, sges); err != nil {
			t.Fatalf("SRQ PostReceive of two SGEs (header, payload) %d: %v", i, err)
		}
	}
	src := t.register(p.cli.pd, hdr+page, allAccess)
	for i, n := range sizes {
		t.fill(src.Bytes())
		msg := bytes.Clone(src.Bytes()[:n])
		if err := p.cli.qp.Send(i, []transport.SGE{src.SGE(0, uint32(n))}, 0); err != nil {
			t.Fatalf("Send %d (%d bytes): %v", i, n, err)
		}
		t.checkOK(t.waitN(p.cli.icq, 1, "send"), transport.OpSend, p.cli.tag, "send")
		got := t.waitN(p.srv.rcq, 1, "split receive")
		t.checkOK(got, transport.OpReceive, p.srv.tag, "split receive")
		if got[0].RequestContext != any(i) || int(got[0].Bytes) != n {
			t.Fatalf("message %d of %d bytes completed as receive %v of %d bytes", i, n, got[0].RequestContext, got[0].Bytes)
		}
		h := hmr.Bytes()[hdr*i : hdr*(i+1)]
		pl := pmr.Bytes()[int(base)+page*i : int(base)+page*(i+1)]
		want := append(bytes.Clone(hbefore[hdr*i:hdr*(i+1)]), pbefore[int(base)+page*i:int(base)+page*(i+1)]...)
		copy(want, msg)
		all := append(bytes.Clone(h), pl...)
		if !bytes.Equal(all, want) {
			t.Fatalf("message %d (%d bytes) over a %d-byte header and a %d-byte payload: %s", i, n, hdr, page, firstDiff(all, want))
		}
	}
}
