//go:build verbs && linux && cgo

package verbs_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/transport"
)

// rig is a connected pair on one device: a client QP and a server QP, each
// with one CQ for both queues; the server's QP takes its receives from an
// SRQ when srq is set.
type rig struct {
	a, b           transport.Adapter
	cpd, spd       transport.PD
	ccq, scq       transport.CQ
	cli, srv       transport.QP
	srq            transport.SRQ
	cmem, smem     transport.MemoryRegion
	comps          []transport.Completion
	cliCtx, srvCtx *int
}

func newRig(t *testing.T, srq bool) *rig {
	dev, addr := device(t)
	r := &rig{a: open(t, dev), b: open(t, dev), comps: make([]transport.Completion, 16), cliCtx: new(int), srvCtx: new(int)}
	t.Cleanup(func() { r.a.Close(); r.b.Close() })
	var err error
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	r.spd, err = r.a.CreatePD()
	must("CreatePD", err)
	r.cpd, err = r.b.CreatePD()
	must("CreatePD", err)
	r.scq, err = r.a.CreateCQ(transport.CQConfig{Depth: 256, Affinity: -1})
	must("CreateCQ", err)
	r.ccq, err = r.b.CreateCQ(transport.CQConfig{Depth: 256, Affinity: -1})
	must("CreateCQ", err)
	cfg := transport.QPConfig{ReceiveCQ: r.scq, InitiatorCQ: r.scq, Context: r.srvCtx, ReceiveQueueDepth: 64, InitiatorQueueDepth: 64, MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 2, InlineDataSize: 64}
	if srq {
		r.srq, err = r.spd.CreateSRQ(transport.SRQConfig{Depth: 64, MaxSge: 1, Affinity: -1})
		must("CreateSRQ", err)
		cfg.SRQ = r.srq
	}
	r.srv, err = r.spd.CreateQP(cfg)
	must("CreateQP", err)
	cfg.SRQ, cfg.ReceiveCQ, cfg.InitiatorCQ, cfg.Context = nil, r.ccq, r.ccq, r.cliCtx
	r.cli, err = r.cpd.CreateQP(cfg)
	must("CreateQP", err)
	r.smem, err = r.spd.AllocateMemory(1<<20, transport.AccessLocalWrite|transport.AccessRemoteRead|transport.AccessRemoteWrite)
	must("AllocateMemory", err)
	r.cmem, err = r.cpd.AllocateMemory(1<<20, transport.AccessLocalWrite|transport.AccessRemoteRead|transport.AccessRemoteWrite)
	must("AllocateMemory", err)
	ln, err := r.a.Listen(net.JoinHostPort(addr, "0"))
	must("Listen", err)
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		req, err := ln.GetConnectionRequest(ctx)
		if err == nil {
			err = req.Accept(ctx, r.srv, transport.ConnParams{})
		}
		errc <- err
	}()
	_, err = r.b.Connect(ctx, r.cli, ln.Addr().String(), transport.ConnParams{})
	must("Connect", err)
	must("Accept", <-errc)
	return r
}

// wait polls c until n completions arrived, all successful.
func (r *rig) wait(t *testing.T, c transport.CQ, n int) {
	deadline := time.Now().Add(10 * time.Second)
	for n > 0 {
		k := c.Poll(r.comps[:min(n, len(r.comps))])
		for _, comp := range r.comps[:k] {
			if comp.Status != nil {
				t.Fatalf("completion %v (%v): %v", comp.RequestContext, comp.Type, comp.Status)
			}
		}
		n -= k
		if k == 0 && time.Now().After(deadline) {
			t.Fatalf("%d completions missing", n)
		}
	}
}

// TestSteadyStateAllocs guards the data path: a post (receive, send,
// inline send, write, read, deferred batch) and the poll of its
// completion allocate nothing, with and without an SRQ.
func TestSteadyStateAllocs(t *testing.T) {
	for _, srq := range []bool{false, true} {
		name := "qp-receive-queue"
		if srq {
			name = "srq"
		}
		t.Run(name, func(t *testing.T) {
			r := newRig(t, srq)
			var reqCtx any = new(int)
			rsge := []transport.SGE{r.smem.SGE(0, 4096)}
			post := func() {
				var err error
				if srq {
					err = r.srq.PostReceive(reqCtx, rsge)
				} else {
					err = r.srv.PostReceive(reqCtx, rsge)
				}
				if err != nil {
					t.Fatalf("PostReceive: %v", err)
				}
			}
			sges := []transport.SGE{r.cmem.SGE(0, 32), r.cmem.SGE(64, 32)}
			inl := []transport.SGE{r.cmem.SGE(0, 48)}
			sink := []transport.SGE{r.cmem.SGE(8192, 4096)}
			round := func() {
				post()
				post()
				if err := r.cli.Send(reqCtx, sges, 0); err != nil {
					t.Fatalf("Send: %v", err)
				}
				if err := r.cli.Send(reqCtx, inl, transport.FlagInline); err != nil {
					t.Fatalf("inline Send: %v", err)
				}
				if err := r.cli.Write(reqCtx, sges, r.smem.Addr()+65536, r.smem.RKey(), transport.FlagDefer); err != nil {
					t.Fatalf("Write: %v", err)
				}
				if err := r.cli.Read(reqCtx, sink, r.smem.Addr()+131072, r.smem.RKey(), transport.FlagSilentSuccess); err != nil {
					t.Fatalf("Read: %v", err)
				}
				r.wait(t, r.ccq, 3) // the silent read completes unseen
				r.wait(t, r.scq, 2)
			}
			for range 50 {
				round()
			}
			if a := testing.AllocsPerRun(500, round); a != 0 {
				t.Errorf("%v allocations per round of 6 posts and 5 completions, want 0", a)
			}
		})
	}
}

// TestEngine runs the per-core engine on the device: its CQs, SRQs (with
// the threshold refill) and receive buffers, echoing messages a plain
// client sends; the client keeps fewer messages in flight than the
// buffers, as the engine's contract asks.
func TestEngine(t *testing.T) {
	dev, addr := device(t)
	srvA, cliA := open(t, dev), open(t, dev)
	defer cliA.Close()
	defer srvA.Close()
	spd, err := srvA.CreatePD()
	if err != nil {
		t.Fatal(err)
	}
	defer spd.Close()
	var received atomic.Int64
	var srvQP transport.QP
	echo := transport.HandlerFunc(func(c *transport.Core, comp *transport.Completion) {
		b := c.RecvBuf(comp)
		if b == nil {
			return
		}
		if comp.Status == nil {
			received.Add(1)
		}
		b.Repost()
	})
	e, err := transport.NewEngine(srvA, spd, transport.EngineConfig{
		Cores: 2, QPsPerCore: 2, InitiatorDepth: 32, SRQDepth: 64, Buffers: 64,
		BufferSize: 256, RefillThreshold: 16, NoPin: true,
	}, echo)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	defer e.Close()
	ln, err := srvA.Listen(net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cpd, _ := cliA.CreatePD()
	defer cpd.Close()
	ccq, err := cliA.CreateCQ(transport.CQConfig{Depth: 128, Affinity: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer ccq.Close()
	cli, err := cpd.CreateQP(transport.QPConfig{ReceiveCQ: ccq, InitiatorCQ: ccq, ReceiveQueueDepth: 1, InitiatorQueueDepth: 64, MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		req, err := ln.GetConnectionRequest(ctx)
		if err == nil {
			var qp transport.QP
			qp, _, err = e.CreateQP(nil, 0, 0)
			if err == nil {
				srvQP = qp
				err = req.Accept(ctx, qp, transport.ConnParams{})
			}
		}
		errc <- err
	}()
	if _, err := cliA.Connect(ctx, cli, ln.Addr().String(), transport.ConnParams{}); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Accept: %v", err)
	}
	mem, err := cpd.AllocateMemory(4096, transport.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	comps := make([]transport.Completion, 32)
	const total, window = 2000, 32
	sent := 0
	for sent < total {
		posted := 0
		for ; posted < window && sent < total; posted++ {
			if err := cli.Send(sent, []transport.SGE{mem.SGE(0, 64)}, 0); err != nil {
				t.Fatalf("Send %d: %v", sent, err)
			}
			sent++
		}
		got := 0
		deadline := time.Now().Add(10 * time.Second)
		for got < posted {
			k := ccq.Poll(comps)
			for _, c := range comps[:k] {
				if c.Status != nil {
					t.Fatalf("send %v: %v (server QP error %v, engine %+v)", c.RequestContext, c.Status, srvQP.Err(), e.Stats())
				}
			}
			got += k
			if k == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("sends stuck after %d; engine %+v", sent, e.Stats())
				}
				time.Sleep(50 * time.Microsecond)
			}
		}
		// Keep the window below the buffers: wait until the server took
		// what was sent.
		for received.Load() < int64(sent) {
			if time.Now().After(deadline) {
				t.Fatalf("server received %d of %d; engine %+v", received.Load(), sent, e.Stats())
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	// The whole path — posts, device events, the notification goroutine,
	// the engine's dispatch and reposts, polls — allocates nothing.
	var reqCtx any = new(int)
	sge := []transport.SGE{mem.SGE(0, 64)}
	round := func() {
		for range window {
			if err := cli.Send(reqCtx, sge, 0); err != nil {
				t.Fatalf("Send: %v", err)
			}
		}
		sent += window
		for got := 0; got < window; {
			got += ccq.Poll(comps)
		}
		for received.Load() < int64(sent) {
			time.Sleep(20 * time.Microsecond)
		}
	}
	if a := testing.AllocsPerRun(50, round); a != 0 {
		t.Errorf("%v allocations per window of %d echoed sends through the engine, want 0", a, window)
	}
	s := e.Stats()
	t.Logf("engine: %+v", s)
	if s.Receives < uint64(total) {
		t.Errorf("engine received %d of %d", s.Receives, total)
	}
	if srvQP.Err() != nil {
		t.Errorf("server QP failed: %v", srvQP.Err())
	}
}
