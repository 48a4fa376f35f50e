//go:build linux

package transport_test

import (
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/transport"
)

// deferEcho is an echo server whose echoes are produced by a "disk": each
// request received on a core is handed, from HandlePoll, to that core's
// disk goroutine, which gives it back through a list and signals the core
// either by writing an eventfd in the core's poll set or by Core.Wake.
// The echo is sent from HandlePoll. Its per-core pending slice is a plain
// slice shared by HandleCompletion and HandlePoll without a lock: the
// race detector sees any call that is not serialized with the others,
// and inside counts overlapping calls.
type deferEcho struct {
	r       *echoRig
	cores   []*deferCore
	overlap atomic.Int64
	byFD    atomic.Uint64 // echoes signalled by the eventfd
	byWake  atomic.Uint64 // echoes signalled by Core.Wake
	stop    chan struct{}
	wg      sync.WaitGroup
}

type deferCore struct {
	inside atomic.Int32 // handler calls running on the core
	efd    int
	pend   []deferItem // the core's only
	work   chan deferItem
	mu     sync.Mutex // the done list, shared with the disk goroutine
	done   []deferItem
	take   []deferItem // the core's only
	rng    *rand.Rand  // the disk goroutine's only
}

type deferItem struct {
	core *transport.Core
	b    *transport.RecvBuf
	n    uint32
	qp   transport.QP
}

func (d *deferEcho) enter(core *transport.Core) *deferCore {
	dc := d.cores[core.Index()]
	if dc.inside.Add(1) != 1 {
		d.overlap.Add(1)
	}
	return dc
}

func (dc *deferCore) exit() { dc.inside.Add(-1) }

func (d *deferEcho) HandleCompletion(core *transport.Core, c *transport.Completion) {
	dc := d.enter(core)
	defer dc.exit()
	r := d.r
	if c.Status != nil {
		r.serverFailed(core, c)
		return
	}
	switch c.Type {
	case transport.OpReceive:
		b := core.RecvBuf(c)
		if _, _, _, ok := echoCheck(core.RecvBuffer(c)); !ok {
			r.fail("server: corrupt request")
			b.Release()
			return
		}
		dc.pend = append(dc.pend, deferItem{core: core, b: b, n: c.Bytes, qp: c.QPContext.(*srvConn).qp})
	case transport.OpSend:
		b := c.RequestContext.(*transport.RecvBuf)
		giveBack(b, binary.LittleEndian.Uint32(b.Bytes()[4:]))
	}
}

// HandlePoll hands what arrived to the disk, arms (drains the eventfd),
// then sends the echoes the disk gave back: one given back after the arm
// signals again, so none is left behind.
func (d *deferEcho) HandlePoll(core *transport.Core) bool {
	dc := d.enter(core)
	defer dc.exit()
	for _, it := range dc.pend {
		dc.work <- it // buffered for every receive buffer: never blocks
	}
	clear(dc.pend)
	dc.pend = dc.pend[:0]
	var buf [8]byte
	unix.Read(dc.efd, buf[:])
	dc.mu.Lock()
	dc.take, dc.done = dc.done, dc.take[:0]
	dc.mu.Unlock()
	for _, it := range dc.take {
		sge := &d.r.srvSGE[core.Index()][it.b.Index()]
		sge[0] = it.b.SGE(it.n)
		if err := it.qp.Send(it.b, sge[:], 0); err != nil {
			d.r.fail("server: echo send: %v", err)
			it.b.Release()
		}
	}
	clear(dc.take)
	return false
}

// disk gives each item back after a short, seeded while, and signals
// the core one way or the other.
func (d *deferEcho) disk(dc *deferCore) {
	defer d.wg.Done()
	var one = [8]byte{1}
	for {
		select {
		case it := <-dc.work:
			if dc.rng.IntN(4) == 0 {
				runtime.Gosched()
			}
			dc.mu.Lock()
			dc.done = append(dc.done, it)
			dc.mu.Unlock()
			if dc.rng.IntN(2) == 0 {
				d.byFD.Add(1)
				unix.Write(dc.efd, one[:])
			} else {
				d.byWake.Add(1)
				it.core.Wake()
			}
		case <-d.stop:
			return
		}
	}
}

// TestEnginePollSet: an echo whose answers come back through each server
// core's poll set — an eventfd it watches, or Wake from another goroutine
// — 8 QPs at depth 8 over 2 cores. Every echo arrives intact, the
// server's handler calls on a core never overlap (and, under -race, the race
// detector finds the state they share unsynchronized by nothing but the
// engine), and both ways of signalling were used.
func TestEnginePollSet(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	const qps, depth, perQP = 8, 8, 400
	cfg := echoConfig(depth)
	d := &deferEcho{stop: make(chan struct{})}
	// The cores' state is made before the engine, whose handler calls
	// may start at once (every CQ notification ends with HandlePoll).
	for i := range cfg.Cores {
		efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		d.cores = append(d.cores, &deferCore{efd: efd, work: make(chan deferItem, cfg.Buffers), rng: rand.New(rand.NewPCG(seed, uint64(i)))})
	}
	r := newEchoRigWith(t, qps, depth, cfg, func(r *echoRig) transport.Handler { d.r = r; return d })
	for i, c := range r.srv.Cores() {
		if !c.Polling() {
			t.Fatalf("core %d has no poll set", i)
		}
		dc := d.cores[i]
		if err := c.AddPollFD(dc.efd); err != nil {
			t.Fatal(err)
		}
		d.wg.Add(1)
		go d.disk(dc)
	}
	t.Cleanup(func() {
		close(d.stop)
		d.wg.Wait()
		for _, dc := range d.cores {
			unix.Close(dc.efd)
		}
	})
	r.run(t, perQP)
	if n := d.overlap.Load(); n != 0 {
		t.Fatalf("seed %d: %d handler calls overlapped another", seed, n)
	}
	st := r.srv.Stats()
	t.Logf("echoes signalled by eventfd %d, by Wake %d; server %d poll wakes, %d notifications", d.byFD.Load(), d.byWake.Load(), st.PollWakes, st.Notifications)
	if d.byFD.Load() == 0 || d.byWake.Load() == 0 || st.PollWakes == 0 {
		t.Fatalf("seed %d: want echoes signalled both ways and poll-set wakes: %d by eventfd, %d by Wake, %d wakes", seed, d.byFD.Load(), d.byWake.Load(), st.PollWakes)
	}
	if cs := r.cli.Cores(); cs[0].Polling() {
		t.Fatal("the client's handler is no PollHandler, yet its core has a poll set")
	}
}

// spinPoll is a PollHandler that always has more work until told to
// stop, and counts its calls.
type spinPoll struct {
	calls atomic.Uint64
	more  atomic.Bool
}

func (s *spinPoll) HandleCompletion(*transport.Core, *transport.Completion) {}
func (s *spinPoll) HandlePoll(*transport.Core) bool {
	s.calls.Add(1)
	return s.more.Load()
}

// TestEnginePollSetClose: Close returns while a core's HandlePoll keeps
// asking for more and other goroutines keep waking it, and no handler
// call is made after Close returns; Wake after Close does nothing.
func TestEnginePollSetClose(t *testing.T) {
	r := newEchoRig(t, 1, 1) // adapters and a PD for one more engine
	pd, err := r.srvA.CreatePD()
	if err != nil {
		t.Fatal(err)
	}
	h := &spinPoll{}
	h.more.Store(true)
	e, err := transport.NewEngine(r.srvA, pd, echoConfig(1), h)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range e.Cores() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					c.Wake()
					runtime.Gosched()
				}
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.calls.Load() < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("HandlePoll called %d times in 10 s", h.calls.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	n := h.calls.Load()
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	for _, c := range e.Cores() {
		c.Wake()
	}
	if m := h.calls.Load(); m != n {
		t.Fatalf("%d HandlePoll calls after Close returned", m-n)
	}
}
