package soft

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/blk-project/blk/transport"
)

// The benchmarks run each pattern over the soft provider and, in the same
// run, over a raw TCP socket pair on loopback moving the same bytes:
//
//	go test -run '^$' -bench . -benchmem ./transport/soft/
//
// Domain metrics: comps/notify (completions per CQ notification, both
// sides), copies/op (payload bytes the provider copied in user space, both
// sides, divided by the payload bytes moved: 1.0 is one full extra copy of
// every message; the kernel's socket copies are not counted), and msgs/s
// or MB/s.

// waiter consumes a CQ the way an engine does: poll, and when empty arm,
// poll again (closing the race), then sleep until notified.
type waiter struct {
	cq   transport.CQ
	done <-chan struct{} // the QP's Done: stop waiting when it fails
	// handler, when set, runs in the notification callback instead of
	// waking the waiting goroutine (set before the first Arm).
	handler atomic.Pointer[func()]
	ch      chan struct{}
	comps   [64]transport.Completion
}

func newWaiter(a *Adapter, depth uint32, cpu int) (*waiter, error) {
	w := &waiter{ch: make(chan struct{}, 1)}
	c, err := a.CreateCQ(transport.CQConfig{Depth: depth, Affinity: cpu, Notify: func(any, error) {
		if h := w.handler.Load(); h != nil {
			(*h)()
			return
		}
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}})
	w.cq = c
	return w, err
}

// next returns at least one completion.
func (w *waiter) next() []transport.Completion {
	for {
		if n := w.cq.Poll(w.comps[:]); n > 0 {
			return w.comps[:n]
		}
		w.cq.Arm(transport.NotifyAny)
		if n := w.cq.Poll(w.comps[:]); n > 0 {
			return w.comps[:n]
		}
		select {
		case <-w.ch:
		case <-w.done:
			if n := w.cq.Poll(w.comps[:]); n > 0 {
				return w.comps[:n]
			}
			return nil
		}
	}
}

// raceEnabled is set under the race detector (race_test.go).
var raceEnabled bool

// benchPollGroup makes newBenchPair's adapters run their CQs as poll
// groups (Config.PollGroup); set for one sub-benchmark by pollMode.
var benchPollGroup bool

// benchPollSpin is newBenchPair's Config.PollSpin (0: the default).
var benchPollSpin time.Duration

// benchFPDUSize is newBenchPair's Config.FPDUSize (0: the default).
var benchFPDUSize int

// pollMode runs the rest of b in poll-group mode.
func pollMode(b testing.TB) {
	benchPollGroup = true
	b.Cleanup(func() { benchPollGroup, benchPollSpin = false, 0 })
}

// softModes runs f as the goroutine-mode ("soft") and poll-group-mode
// ("soft-poll") sub-benchmarks.
func softModes(b *testing.B, f func(b *testing.B)) {
	b.Run("soft", f)
	b.Run("soft-poll", func(b *testing.B) { pollMode(b); f(b) })
}

type benchPair struct {
	a, b   *Adapter
	pa, pb transport.PD
	wa, wb *waiter
	qa, qb *qp
}

// newBenchPair connects two adapters; cpus are the CQs' affinities (none
// when not given).
func newBenchPair(b testing.TB, depth uint32, cpus ...int) *benchPair {
	if len(cpus) < 2 {
		cpus = []int{-1, -1}
	}
	p := &benchPair{}
	acfg := Config{FirstFPDUDelay: -1, PollGroup: benchPollGroup, PollSpin: benchPollSpin, FPDUSize: benchFPDUSize}
	p.a, _ = New(acfg)
	p.b, _ = New(acfg)
	b.Cleanup(func() { p.a.Close(); p.b.Close() })
	p.pa, _ = p.a.CreatePD()
	p.pb, _ = p.b.CreatePD()
	var err error
	if p.wa, err = newWaiter(p.a, 4*depth, cpus[0]); err != nil {
		b.Fatal(err)
	}
	if p.wb, err = newWaiter(p.b, 4*depth, cpus[1]); err != nil {
		b.Fatal(err)
	}
	cfg := func(w *waiter) transport.QPConfig {
		return transport.QPConfig{ReceiveCQ: w.cq, InitiatorCQ: w.cq, ReceiveQueueDepth: depth, InitiatorQueueDepth: depth, MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1, InlineDataSize: 64}
	}
	qa, err := p.pa.CreateQP(cfg(p.wa))
	if err != nil {
		b.Fatal(err)
	}
	qb, _ := p.pb.CreateQP(cfg(p.wb))
	p.qa, p.qb = qa.(*qp), qb.(*qp)
	p.wa.done, p.wb.done = qa.Done(), qb.Done()
	ln, err := p.b.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	errc := make(chan error, 1)
	go func() {
		cr, err := ln.GetConnectionRequest(b.Context())
		if err == nil {
			err = cr.Accept(b.Context(), qb, transport.ConnParams{})
		}
		errc <- err
	}()
	if _, err := p.a.Connect(b.Context(), qa, ln.Addr().String(), transport.ConnParams{}); err != nil {
		b.Fatal(err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return p
}

func (p *benchPair) report(b *testing.B, ops, size int) {
	sa, _ := CQStatsOf(p.wa.cq)
	sb, _ := CQStatsOf(p.wb.cq)
	n := sa.Notifications + sb.Notifications
	if n > 0 {
		b.ReportMetric(float64(sa.Completions+sb.Completions)/float64(n), "comps/notify")
	}
	qa, _ := QPStatsOf(p.qa)
	qb, _ := QPStatsOf(p.qb)
	copied := qa.TxCopiedBytes + qa.RxCopiedBytes + qb.TxCopiedBytes + qb.RxCopiedBytes
	b.ReportMetric(float64(copied)/float64(ops)/float64(size), "copies/op")
	if benchPollGroup {
		// Thread wake-ups the poll groups paid: eventfd writes by posters
		// that found a group asleep, and blocking epoll_waits.
		b.ReportMetric(float64(sa.PollWakes+sb.PollWakes)/float64(ops), "wakes/op")
		b.ReportMetric(float64(sa.PollSleeps+sb.PollSleeps)/float64(ops), "sleeps/op")
	}
}

// benchSoftSend streams size-byte sends from a to b with depth in flight.
func benchSoftSend(b *testing.B, size int, depth uint32) {
	p := newBenchPair(b, depth)
	sbuf := make([]byte, size)
	smr, _ := p.pa.RegisterMemory(sbuf, transport.AccessLocalWrite)
	rbuf := make([]byte, size*int(depth))
	rmr, _ := p.pb.RegisterMemory(rbuf, transport.AccessLocalWrite)
	sges := make([]transport.SGE, depth)
	for i := range sges {
		sges[i] = rmr.SGE(uint32(i*size), uint32(size))
		if err := p.qb.PostReceive(&sges[i], sges[i:i+1]); err != nil {
			b.Fatal(err)
		}
	}
	done := make(chan struct{})
	n := b.N
	// received is the receiver's credit return: iWARP has no
	// receiver-not-ready retry, so the sender may only have as many sends
	// outstanding as the peer has receives posted (as NVMe's SQ head does).
	var received atomic.Int64
	// credit wakes a sender that waits for credit only (all its sends
	// completed): a Gosched loop there took 90% of the CPU in a profile,
	// starving the receiver it waited for on a 2-core machine.
	credit := make(chan struct{}, 1)
	go func() { // receiver: repost every buffer it gets
		defer close(done)
		for got := 0; got < n; {
			cs := p.wb.next()
			if cs == nil {
				b.Error("receiver QP failed:", p.qb.Err())
				return
			}
			for _, c := range cs {
				if c.Status != nil {
					b.Error(c.Status, p.qa.Err(), p.qb.Err())
					return
				}
				got++
				s := c.RequestContext.(*transport.SGE)
				p.qb.PostReceive(s, s1(s))
				received.Add(1)
			}
			select {
			case credit <- struct{}{}:
			default:
			}
		}
	}()
	sge := []transport.SGE{smr.SGE(0, uint32(size))}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	inflight := 0
	for posted := 0; posted < n; {
		for inflight < int(depth) && posted < n && int64(posted)-received.Load() < int64(depth) {
			if err := p.qa.Send(nil, sge, 0); err != nil {
				b.Fatal(err, p.qa.Err(), p.qb.Err())
			}
			inflight++
			posted++
		}
		if inflight == 0 {
			<-credit // waiting for credit only
			continue
		}
		cs := p.wa.next()
		if cs == nil {
			b.Fatal("sender QP failed:", p.qa.Err())
		}
		for _, c := range cs {
			if c.Status != nil {
				b.Fatal(c.Status, p.qa.Err(), p.qb.Err())
			}
			inflight--
		}
	}
	<-done
	b.StopTimer()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
	p.report(b, n, size)
}

// tcpPair is the baseline: a connected loopback socket pair.
func tcpPair(b *testing.B) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	c2 := <-ch
	b.Cleanup(func() { c1.Close(); c2.Close() })
	return c1, c2
}

// benchTCPStream writes size-byte messages, one write call each, and the
// peer reads them in full: the raw TCP cost of moving the same bytes.
func benchTCPStream(b *testing.B, size int) {
	c1, c2 := tcpPair(b)
	msg := make([]byte, size)
	done := make(chan struct{})
	n := b.N
	go func() {
		defer close(done)
		r := bufio.NewReaderSize(c2, 64<<10)
		buf := make([]byte, size)
		for i := 0; i < n; i++ {
			if _, err := io.ReadFull(r, buf); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < n; i++ {
		if _, err := c1.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	<-done
	b.StopTimer()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
}

func BenchmarkSend64B(b *testing.B) {
	softModes(b, func(b *testing.B) { benchSoftSend(b, 64, 64) })
	b.Run("tcp", func(b *testing.B) { benchTCPStream(b, 64) })
}

func BenchmarkSend4KiB(b *testing.B) {
	softModes(b, func(b *testing.B) { benchSoftSend(b, 4096, 64) })
	b.Run("tcp", func(b *testing.B) { benchTCPStream(b, 4096) })
}

// benchSoftRDMA moves size-byte RDMA writes (or reads) from a to b with
// depth in flight, then fences with a read so every byte has landed.
func benchSoftRDMA(b *testing.B, size int, depth uint32, read bool) {
	p := newBenchPair(b, depth)
	local := make([]byte, size)
	lmr, _ := p.pa.RegisterMemory(local, transport.AccessLocalWrite|transport.AccessRemoteWrite)
	remote := make([]byte, size)
	rmr, _ := p.pb.RegisterMemory(remote, transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead)
	sge := []transport.SGE{lmr.SGE(0, uint32(size))}
	n := b.N
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	inflight := 0
	for posted := 0; posted < n || inflight > 0; {
		for inflight < int(depth) && posted < n {
			var err error
			if read {
				err = p.qa.Read(nil, sge, rmr.Addr(), rmr.RKey(), 0)
			} else {
				err = p.qa.Write(nil, sge, rmr.Addr(), rmr.RKey(), 0)
			}
			if err != nil {
				b.Fatal(err)
			}
			inflight++
			posted++
		}
		for _, c := range p.wa.next() {
			if c.Status != nil {
				b.Fatal(c.Status)
			}
			inflight--
		}
	}
	if !read { // a read behind the writes returns once they are placed
		if err := p.qa.Read(nil, []transport.SGE{lmr.SGE(0, 4)}, rmr.Addr(), rmr.RKey(), 0); err != nil {
			b.Fatal(err)
		}
		p.wa.next()
	}
	b.StopTimer()
	p.report(b, n, size)
}

func BenchmarkWrite128KiB(b *testing.B) {
	softModes(b, func(b *testing.B) { benchSoftRDMA(b, 128<<10, 8, false) })
	b.Run("tcp", func(b *testing.B) { benchTCPStream(b, 128<<10) })
}

func BenchmarkRead128KiB(b *testing.B) {
	softModes(b, func(b *testing.B) { benchSoftRDMA(b, 128<<10, 8, true) })
	b.Run("tcp", func(b *testing.B) { benchTCPStream(b, 128<<10) })
}

// BenchmarkPingPong64B is round-trip latency at queue depth 1: a sends,
// b answers each receive with a send. b answers inside its CQ
// notification callback, as the engine's handlers do; a waits for its
// reply on its own goroutine, as an application does.
func BenchmarkPingPong64B(b *testing.B) {
	b.Run("soft", func(b *testing.B) { benchPingPong(b) })
	// soft-pinned: both CQs' notification threads pinned (CPU 0 and 1), as
	// the engine pins them: waking a goroutine locked to its OS thread
	// costs a thread hand-off in Go's scheduler each way.
	b.Run("soft-pinned", func(b *testing.B) { benchPingPong(b, 0, 1) })
	// soft-poll: each CQ a poll group (Config.PollGroup): the responder's
	// thread reads the ping, runs the callback and writes the pong.
	b.Run("soft-poll", func(b *testing.B) { pollMode(b); benchPingPong(b) })
	b.Run("soft-poll-pinned", func(b *testing.B) { pollMode(b); benchPingPong(b, 0, 1) })
	// soft-poll-spin: poll groups that keep polling up to 50 µs after
	// work before they sleep (Config.PollSpin), for the window's effect.
	b.Run("soft-poll-spin", func(b *testing.B) { pollMode(b); benchPollSpin = SuggestedPollSpin; benchPingPong(b) })
	b.Run("tcp", func(b *testing.B) { benchTCPPingPong(b) })
}

func benchPingPong(b *testing.B, cpus ...int) {
	p, round := newPingPong(b, cpus...)
	n := b.N
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < n; i++ {
		if err := round(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	p.report(b, 2*n, 64)
}

// newPingPong connects a pair whose b side answers every 64 B send with
// one in its CQ callback; round is one round trip driven from a.
func newPingPong(tb testing.TB, cpus ...int) (*benchPair, func() error) {
	p := newBenchPair(tb, 4, cpus...)
	abuf := make([]byte, 128)
	amr, _ := p.pa.RegisterMemory(abuf, transport.AccessLocalWrite)
	bbuf := make([]byte, 128)
	bmr, _ := p.pb.RegisterMemory(bbuf, transport.AccessLocalWrite)
	aRecv := []transport.SGE{amr.SGE(64, 64)}
	bRecv := []transport.SGE{bmr.SGE(64, 64)}
	bSend := []transport.SGE{bmr.SGE(0, 64)}
	p.qa.PostReceive(nil, aRecv)
	p.qb.PostReceive(nil, bRecv)
	// Replace b's waiter with a responder running in the callback.
	var comps [16]transport.Completion
	respond := func() {
		for {
			n := p.wb.cq.Poll(comps[:])
			if n == 0 {
				p.wb.cq.Arm(transport.NotifyAny)
				if n = p.wb.cq.Poll(comps[:]); n == 0 {
					return
				}
			}
			for _, c := range comps[:n] {
				if c.Type == transport.OpReceive && c.Status == nil {
					p.qb.PostReceive(nil, bRecv)
					p.qb.Send(nil, bSend, transport.FlagInline|transport.FlagSilentSuccess)
				}
			}
		}
	}
	p.wb.handler.Store(&respond)
	p.wb.cq.Arm(transport.NotifyAny)
	send := []transport.SGE{amr.SGE(0, 64)}
	round := func() error {
		if err := p.qa.Send(nil, send, transport.FlagInline|transport.FlagSilentSuccess); err != nil {
			return err
		}
		for got := false; !got; {
			cs := p.wa.next()
			if cs == nil {
				return fmt.Errorf("QP failed: %v, %v", p.qa.Err(), p.qb.Err())
			}
			for _, c := range cs {
				if c.Type == transport.OpReceive {
					got = true
					p.qa.PostReceive(nil, aRecv)
				}
			}
		}
		return nil
	}
	return p, round
}

func benchTCPPingPong(b *testing.B) {
	{
		c1, c2 := tcpPair(b)
		n := b.N
		go func() {
			buf := make([]byte, 64)
			for i := 0; i < n; i++ {
				if _, err := io.ReadFull(c2, buf); err != nil {
					return
				}
				c2.Write(buf)
			}
		}()
		buf := make([]byte, 64)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < n; i++ {
			c1.Write(buf)
			if _, err := io.ReadFull(c1, buf); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// s1 makes a one-entry SGE list without allocating.
func s1(s *transport.SGE) []transport.SGE { return unsafe.Slice(s, 1) }
