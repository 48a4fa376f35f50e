package failover_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/failover"
	"github.com/blk-project/blk/initiator/nbd"
	"github.com/blk-project/blk/internal/testseed"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

const (
	subNQN   = "nqn.2026-11.io.blk:failover-test"
	hostNQN  = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000f0"
	block    = 4096
	blocks   = 1024             // 4 MiB
	waitLong = 20 * time.Second // patience for an event that must come
)

func testSeed(t *testing.T) uint64 { return testseed.Seed(t, "./initiator/failover/") }

// node is one replica's node: a target serving subNQN with ANA over
// NVMe/TCP on loopback. The nodes of a test share one backend, as
// replicas in sync hold the same bytes.
type node struct {
	t    *target.Target
	port *tcp.Port
	sub  *target.Subsystem
	ep   failover.Endpoint
	once sync.Once
}

func newNode(t *testing.T, mem *target.MemBackend, state nvme.ANAState) *node {
	t.Helper()
	cfg := tcp.Config{Addr: "127.0.0.1:0", Cores: 1}
	lim, err := tcp.Limits(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{}
	if n.t, err = target.New(target.Config{Limits: lim}); err != nil {
		t.Fatal(err)
	}
	n.sub, err = n.t.AddSubsystem(target.SubsystemConfig{NQN: subNQN, Serial: "blk-failover-1", Model: "blk failover test",
		Hosts: []string{hostNQN}, ANA: true, ANAState: state})
	if err != nil {
		t.Fatal(err)
	}
	if err = n.sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: mem}); err != nil {
		t.Fatal(err)
	}
	if n.port, err = tcp.Listen(n.t, cfg); err != nil {
		t.Fatal(err)
	}
	n.ep = failover.Endpoint{Transport: "tcp", Addr: n.port.Addr().String(), SubNQN: subNQN, NSID: 1}
	t.Cleanup(n.kill)
	return n
}

// kill stops the node as kill -9 would: its connections reset, its port
// refuses.
func (n *node) kill() {
	n.once.Do(func() {
		n.port.Close()
		n.t.Close()
	})
}

func (n *node) set(t *testing.T, s nvme.ANAState) {
	t.Helper()
	if err := n.sub.SetANAState(s); err != nil {
		t.Fatal(err)
	}
}

// registry stands for the API: where the volume is served now.
type registry struct {
	mu   sync.Mutex
	ep   failover.Endpoint
	err  error
	asks atomic.Int64
}

func (r *registry) set(ep failover.Endpoint, err error) {
	r.mu.Lock()
	r.ep, r.err = ep, err
	r.mu.Unlock()
}

func (r *registry) resolve(context.Context) (failover.Endpoint, error) {
	r.asks.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ep, r.err
}

// connect connects as blkctl does: NVMe/TCP, the same host NQN; short
// reconnect delays so that a test does not wait seconds.
func connect(ctx context.Context, ep failover.Endpoint) (failover.Path, error) {
	cfg := initiator.Config{Transport: initiator.TransportTCP, HostNQN: hostNQN, Queues: 2, QueueDepth: 16,
		ReconnectDelay: 20 * time.Millisecond, MaxReconnectDelay: 50 * time.Millisecond}
	c, err := initiator.Connect(ctx, cfg, ep.Addr, ep.SubNQN)
	if err != nil {
		return failover.Path{}, err
	}
	ns := c.Namespace(ep.NSID)
	if ns == nil {
		c.Close()
		return failover.Path{}, fmt.Errorf("no namespace %d at %s", ep.NSID, ep.Addr)
	}
	return failover.Path{Endpoint: ep, Namespace: ns}, nil
}

// newDevice connects to first and follows reg from there.
func newDevice(t *testing.T, reg *registry, first *node, cfg failover.Config) *failover.Device {
	t.Helper()
	reg.set(first.ep, nil)
	p, err := connect(context.Background(), first.ep)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Resolve, cfg.Connect = reg.resolve, connect
	cfg.Logf = t.Logf
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay, cfg.MaxRetryDelay = 5*time.Millisecond, 50*time.Millisecond
	}
	d, err := failover.New(cfg, p)
	if err != nil {
		p.Namespace.Controller().Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// workload is writers doing seeded random I/O on a Device, each on its
// own region (so that the model needs no order between them), checking
// every read against the model of acknowledged writes.
type workload struct {
	d       *failover.Device
	done    atomic.Int64 // I/Os completed without error
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	errs    []error
	regions [][]byte // the model: each region's acknowledged contents
}

const workers = 6

func startWorkload(t *testing.T, d *failover.Device, seed uint64) *workload {
	w := &workload{d: d, stop: make(chan struct{}), regions: make([][]byte, workers)}
	per := blocks / workers
	for i := range w.regions {
		w.regions[i] = make([]byte, per*block)
		// The backend is shared by the tests' nodes; make the model's
		// zeros true.
		if err := d.WriteZeroes(int64(i*per*block), int64(per*block)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range w.regions {
		w.wg.Add(1)
		go w.run(i, int64(i*per*block), rand.New(rand.NewPCG(seed, uint64(i))))
	}
	return w
}

func (w *workload) fail(err error) {
	w.mu.Lock()
	w.errs = append(w.errs, err)
	w.mu.Unlock()
}

func (w *workload) run(i int, base int64, rng *rand.Rand) {
	defer w.wg.Done()
	model := w.regions[i]
	per := len(model) / block
	buf := make([]byte, 8*block)
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		n := 1 + rng.IntN(8)
		lba := rng.IntN(per - n + 1)
		off, b := int64(lba*block), buf[:n*block]
		var err error
		switch op := rng.IntN(10); {
		case op < 4: // write
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			if op == 0 {
				_, err = w.d.WriteAtFUA(b, base+off)
			} else {
				_, err = w.d.WriteAt(b, base+off)
			}
			if err == nil {
				copy(model[off:], b)
			}
		case op < 8: // read, checked
			if _, err = w.d.ReadAt(b, base+off); err == nil && !bytes.Equal(b, model[off:off+int64(len(b))]) {
				err = fmt.Errorf("worker %d: read of %d blocks at block %d differs from the acknowledged writes", i, n, lba)
			}
		case op == 8:
			if err = w.d.WriteZeroes(base+off, int64(len(b))); err == nil {
				clear(model[off : off+int64(len(b))])
			}
		default:
			err = w.d.Flush()
		}
		if err != nil {
			w.fail(fmt.Errorf("worker %d: %w", i, err))
			return
		}
		w.done.Add(1)
	}
}

// finish stops the writers, fails t for any error they met, and reads
// every region back through the Device against the model.
func (w *workload) finish(t *testing.T) {
	t.Helper()
	close(w.stop)
	w.wg.Wait()
	for _, err := range w.errs {
		t.Errorf("an error reached the client: %v", err)
	}
	for i, model := range w.regions {
		got := make([]byte, len(model))
		if _, err := w.d.ReadAt(got, int64(i*len(model))); err != nil {
			t.Fatalf("read back region %d: %v", i, err)
		}
		if !bytes.Equal(got, model) {
			t.Fatalf("region %d: an acknowledged write does not read back", i)
		}
	}
}

// progress waits until the writers complete k more I/Os.
func (w *workload) progress(t *testing.T, k int64) {
	t.Helper()
	want := w.done.Load() + k
	until(t, fmt.Sprintf("%d more I/Os", k), func() bool {
		w.mu.Lock()
		errs := w.errs
		w.mu.Unlock()
		if len(errs) > 0 {
			t.Fatalf("an error reached the client: %v", errs)
		}
		return w.done.Load() >= want
	})
}

// until polls cond (a state the test waits for, never a duration it
// assumes) for up to waitLong.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func newMem(t *testing.T) *target.MemBackend {
	t.Helper()
	m, err := target.NewMemBackend(block, blocks)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFollowANA: a seeded workload through the Device while the paths'
// ANA states change under it, as blk's failover changes them: (1) the
// path answers inaccessible while the registry still names it (a lease
// that lapsed): held, retried there, resumed, no failover; (2) failover
// with a gap: the old path inaccessible, the registry names the new one
// which is not optimized yet: every writer is held on the new path and
// nothing completes, until it turns optimized; (3) failback with no gap.
// No error reaches a writer and every acknowledged write reads back.
func TestFollowANA(t *testing.T) {
	seed := testSeed(t)
	mem := newMem(t)
	a, b := newNode(t, mem, nvme.ANAOptimized), newNode(t, mem, nvme.ANAInaccessible)
	reg := &registry{}
	d := newDevice(t, reg, a, failover.Config{})
	w := startWorkload(t, d, seed)
	w.progress(t, 200)

	// (1) Inaccessible, still named: held on a, resumed there.
	a.set(t, nvme.ANAInaccessible)
	until(t, "every writer held", func() bool { return d.Stats().Holding == workers })
	asks := reg.asks.Load()
	until(t, "the follower asking the registry", func() bool { return reg.asks.Load() > asks })
	a.set(t, nvme.ANAOptimized)
	w.progress(t, 200)
	if st := d.Stats(); st.Failovers != 0 || d.Endpoint() != a.ep {
		t.Fatalf("stats %+v, endpoint %v: moved while the registry named the same path", st, d.Endpoint())
	}

	// (2) Failover with a gap in which no path is optimized.
	a.set(t, nvme.ANAInaccessible)
	reg.set(b.ep, nil)
	until(t, "every writer held, on b", func() bool { return d.Endpoint() == b.ep && d.Stats().Holding == workers })
	done, retries := w.done.Load(), d.Stats().Retries
	until(t, "held I/O retried on b", func() bool { return d.Stats().Retries >= retries+2*workers })
	if got := w.done.Load(); got != done {
		t.Fatalf("%d I/Os completed while no path was optimized", got-done)
	}
	b.set(t, nvme.ANAOptimized)
	w.progress(t, 300)

	// (3) Failback, no gap: a optimized first, then b inaccessible.
	a.set(t, nvme.ANAOptimized)
	reg.set(a.ep, nil)
	b.set(t, nvme.ANAInaccessible)
	until(t, "the device back on a", func() bool { return d.Endpoint() == a.ep })
	w.progress(t, 300)
	w.finish(t)
	if st := d.Stats(); st.Failovers != 2 || st.Expired != 0 || st.Holding != 0 {
		t.Fatalf("stats %+v; want 2 failovers, none expired, none holding", st)
	}
}

// TestFollowKilledNode: the serving node dies (its port closes, its
// connections reset) under the workload; the registry still names it
// for a while (the leader has not noticed), then names the other
// replica, which turns optimized. The writers waiting inside the
// initiator's reconnect move to the new path: no error, no lost write.
func TestFollowKilledNode(t *testing.T) {
	seed := testSeed(t)
	mem := newMem(t)
	a, b := newNode(t, mem, nvme.ANAOptimized), newNode(t, mem, nvme.ANAInaccessible)
	reg := &registry{}
	d := newDevice(t, reg, a, failover.Config{})
	w := startWorkload(t, d, seed)
	w.progress(t, 200)

	a.kill()
	asks := reg.asks.Load()
	until(t, "the follower asking the registry", func() bool { return reg.asks.Load() > asks+2 })
	b.set(t, nvme.ANAOptimized)
	reg.set(b.ep, nil)
	until(t, "the device on b", func() bool { return d.Endpoint() == b.ep })
	w.progress(t, 300)
	w.finish(t)
	if st := d.Stats(); st.Failovers != 1 || st.Expired != 0 {
		t.Fatalf("stats %+v; want 1 failover, none expired", st)
	}
}

// TestHoldBound: with no usable path, a held I/O fails with ErrNoPath
// (wrapping the path's last error) once HoldTimeout has passed, not
// before and not much later: (1) the only path inaccessible and still
// named; (2) the node killed and the registry unreachable, the write
// waiting inside the initiator's reconnect. Then a path appears and
// the same Device serves again.
func TestHoldBound(t *testing.T) {
	const hold = 300 * time.Millisecond
	mem := newMem(t)
	a := newNode(t, mem, nvme.ANAOptimized)
	reg := &registry{}
	d := newDevice(t, reg, a, failover.Config{HoldTimeout: hold})
	data := bytes.Repeat([]byte{0xa5}, 2*block)
	if _, err := d.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}

	a.set(t, nvme.ANAInaccessible)
	start := time.Now()
	_, err := d.WriteAt(data, block)
	took := time.Since(start)
	var se *initiator.StatusError
	if !errors.Is(err, failover.ErrNoPath) || !errors.As(err, &se) || se.Status != nvme.StatusANAInaccessible {
		t.Fatalf("write with no usable path: %v; want ErrNoPath wrapping the inaccessible status", err)
	}
	if took < hold || took > hold+5*time.Second {
		t.Fatalf("the write failed after %v; HoldTimeout is %v", took, hold)
	}
	a.set(t, nvme.ANAOptimized)
	if _, err := d.WriteAt(data, block); err != nil {
		t.Fatalf("write after the path serves again: %v", err)
	}

	a.kill()
	reg.set(failover.Endpoint{}, errors.New("registry unreachable"))
	start = time.Now()
	_, err = d.ReadAt(make([]byte, block), 0)
	if took := time.Since(start); !errors.Is(err, failover.ErrNoPath) || took > hold+5*time.Second {
		t.Fatalf("read from a dead node with no registry: %v after %v; want ErrNoPath after about %v", err, took, hold)
	}
	if st := d.Stats(); st.Expired != 2 || st.Abandoned != 1 || st.Holding != 0 {
		t.Fatalf("stats %+v; want 2 expired, 1 path abandoned, none holding", st)
	}

	b := newNode(t, mem, nvme.ANAOptimized)
	reg.set(b.ep, nil)
	until(t, "the device on b", func() bool { return d.Endpoint() == b.ep })
	got := make([]byte, 2*block)
	if _, err := d.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back on b: %v (equal %v)", err, bytes.Equal(got, data))
	}
}

// TestNotPathErrors: an error that is the I/O's, not the path's, is
// returned at once, never held: a write beyond the end (ENOSPC for NBD)
// and a write the namespace refuses (a write-protected backend: an NVMe
// status outside SCT 3h).
func TestNotPathErrors(t *testing.T) {
	mem := newMem(t)
	a := newNode(t, mem, nvme.ANAOptimized)
	d := newDevice(t, &registry{}, a, failover.Config{})
	if _, err := d.WriteAt(make([]byte, block), blocks*block); !errors.Is(err, nbd.ErrNoSpace) {
		t.Fatalf("write beyond the end: %v", err)
	}
	mem.SetReadOnly(true)
	var se *initiator.StatusError
	if _, err := d.WriteAt(make([]byte, block), 0); !errors.As(err, &se) || se.Status.SCT() == nvme.SCTPath {
		t.Fatalf("write to a read-only namespace: %v", err)
	}
	if st := d.Stats(); st.Held != 0 {
		t.Fatalf("stats %+v: an I/O error was held", st)
	}
}

// TestSteadyStateAllocs: in the steady state the Device adds no
// allocation to the namespace's I/O (the target, in this process, is
// counted in both).
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	mem := newMem(t)
	a := newNode(t, mem, nvme.ANAOptimized)
	d := newDevice(t, &registry{}, a, failover.Config{})
	p, err := connect(context.Background(), a.ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Namespace.Controller().Close() })
	raw := nbd.NamespaceDevice(p.Namespace)
	buf := make([]byte, 8*block)
	measure := func(dev nbd.Device) float64 {
		return testing.AllocsPerRun(200, func() {
			if _, err := dev.WriteAt(buf, 0); err != nil {
				t.Fatal(err)
			}
			if _, err := dev.ReadAt(buf, 0); err != nil {
				t.Fatal(err)
			}
		})
	}
	measure(d) // warm up both
	measure(raw)
	viaRaw, viaDev := measure(raw), measure(d)
	t.Logf("allocations per 32 KiB write + read: %v through the Device, %v through the namespace", viaDev, viaRaw)
	if viaDev > viaRaw {
		t.Fatalf("allocations per write+read: %v through the Device, %v through the namespace", viaDev, viaRaw)
	}
}

func TestConfigValidate(t *testing.T) {
	res := func(context.Context) (failover.Endpoint, error) { return failover.Endpoint{}, nil }
	con := func(context.Context, failover.Endpoint) (failover.Path, error) { return failover.Path{}, nil }
	for _, c := range []failover.Config{
		{Connect: con},
		{Resolve: res},
		{Resolve: res, Connect: con, HoldTimeout: -time.Second},
		{Resolve: res, Connect: con, RetryDelay: time.Second, MaxRetryDelay: time.Millisecond},
	} {
		if err := c.Validate(); !errors.Is(err, failover.ErrInvalidConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if err := (failover.Config{Resolve: res, Connect: con}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	if _, err := failover.New(failover.Config{Resolve: res, Connect: con}, failover.Path{}); err == nil {
		t.Error("New with a path without a namespace")
	}
}

// TestCloseEndsHold: Close while an I/O is held ends it at once with
// ErrClosed (not after HoldTimeout), and Close itself returns while the
// follower is busy looking for a path.
func TestCloseEndsHold(t *testing.T) {
	mem := newMem(t)
	a := newNode(t, mem, nvme.ANAInaccessible)
	reg := &registry{}
	d := newDevice(t, reg, a, failover.Config{HoldTimeout: time.Hour})
	dead := newNode(t, mem, nvme.ANAOptimized)
	dead.kill()
	reg.set(dead.ep, nil) // its port refuses
	res := make(chan error, 1)
	go func() {
		_, err := d.WriteAt(make([]byte, block), 0)
		res <- err
	}()
	until(t, "the write held", func() bool { return d.Stats().Holding == 1 && d.Stats().ConnectFailures > 0 })
	closed := make(chan struct{})
	go func() {
		d.Close()
		close(closed)
	}()
	select {
	case err := <-res:
		if !errors.Is(err, failover.ErrClosed) {
			t.Fatalf("held write after Close: %v", err)
		}
	case <-time.After(waitLong):
		t.Fatal("held write not ended by Close")
	}
	select {
	case <-closed:
	case <-time.After(waitLong):
		t.Fatal("Close did not return")
	}
}
