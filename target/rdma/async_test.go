package rdma_test

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport/soft"
)

// newAsyncTarget serves testSubNQN with one 64 MiB namespace on a
// DelayedBackend (completions late, out of order, from its own
// goroutines) on a soft adapter on loopback with 2 cores.
func newAsyncTarget(t testing.TB, seed uint64, maxDelay time.Duration, durable bool) (*testTarget, *target.DelayedBackend) {
	t.Helper()
	d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: 4096, Blocks: 16384,
		Seed: seed, MaxDelay: maxDelay, TrackDurable: durable})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close) // last: after the port and the target
	return serveAsyncCfg(t, d, rdma.Config{Addr: "127.0.0.1:0", Cores: 2}), d
}

// serveAsyncCfg serves b as namespace 1 of the test subsystem on a port
// of configuration cfg over a soft adapter, all closed at the test's end.
func serveAsyncCfg(t testing.TB, b target.AsyncBackend, cfg rdma.Config) *testTarget {
	t.Helper()
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tt := &testTarget{}
	if tt.t, err = target.New(target.Config{}); err != nil {
		t.Fatal(err)
	}
	if tt.sub, err = tt.t.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Serial: "blk-test-1", Model: "blk test", Hosts: []string{testHostNQN}}); err != nil {
		t.Fatal(err)
	}
	if err = tt.sub.AddNamespace(target.NamespaceConfig{NSID: 1, Async: b}); err != nil {
		t.Fatal(err)
	}
	if tt.port, err = rdma.Listen(tt.t, a, cfg); err != nil {
		t.Fatal(err)
	}
	tt.addr = tt.port.Addr().String()
	t.Cleanup(func() {
		tt.port.Close()
		tt.t.Close()
		a.Close()
	})
	return tt
}

// TestAsyncBackend: seeded random reads, writes (some FUA), write zeroes
// and flushes at QD 64 over two I/O queues through blk's initiator over
// the soft RDMA provider, on a backend that completes each IO late, out
// of order and from another goroutine: every read returns what was
// written, no write's data changed while at the backend, and after the
// last Flush the durable image holds every write.
func TestAsyncBackend(t *testing.T) {
	seed := uint64(testSeed(t))
	tt, d := newAsyncTarget(t, seed, 200*time.Microsecond, true)
	c := connectHost(t, tt.addr, initiator.Config{Queues: 2, QueueDepth: 64})
	ns := c.Namespace(1)
	ops := 2000
	if testing.Short() {
		ops = 500
	}
	all := initiatortest.RandomWorkload(t, ns, seed, 64, ops)
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := d.CheckFlushed(all); err != nil {
		t.Fatal(err)
	}
	if st := tt.t.Stats(); st.AtBackend < uint64(ops) {
		t.Fatalf("stats: %d IOs at the backend, want ≥ %d", st.AtBackend, ops)
	}
}

// countDone counts completions and their errors.
type countDone struct{ done, failed atomic.Int64 }

func (c *countDone) IODone(err error) {
	if err != nil {
		c.failed.Add(1)
	}
	c.done.Add(1)
}

// TestAsyncDisconnect: the target tears a host's controller down (the
// host is denied) while 64 of its commands are held at the backend:
// nothing the backend still owns is freed (no write's data changes),
// every command completes on the host once the backend lets them go,
// and the target serves the host again afterwards.
func TestAsyncDisconnect(t *testing.T) {
	seed := uint64(testSeed(t))
	tt, d := newAsyncTarget(t, seed, 500*time.Microsecond, false)
	rng := rand.New(rand.NewPCG(seed, 23))
	for round := range 3 {
		c, err := connectHostErr(tt.addr, initiator.Config{Adapter: hostAdapter(t), Queues: 2, QueueDepth: 32})
		if err != nil {
			t.Fatal(err)
		}
		ns := c.Namespace(1)
		before := tt.t.Stats().AtBackend
		d.Pause()
		var cd countDone
		const n = 64
		for i := range n {
			buf := make([]byte, 4096*(1+rng.IntN(8)))
			lba := uint64(rng.IntN(16384 - 8))
			if rng.IntN(2) == 0 {
				rng.Shuffle(len(buf), func(a, b int) { buf[a], buf[b] = byte(i), byte(a) })
				err = ns.WriteAsync(lba, buf, 0, &cd)
			} else {
				err = ns.ReadAsync(lba, buf, &cd)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for tt.t.Stats().AtBackend-before < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d commands at the backend, want %d", tt.t.Stats().AtBackend-before, n)
			}
			time.Sleep(time.Millisecond)
		}
		if err := tt.sub.DenyHost(testHostNQN); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		d.Resume()
		// The target completes every command it took (the controller is
		// gone, so no AER is held).
		deadline = time.Now().Add(30 * time.Second)
		for st := tt.t.Stats(); st.Executed != st.Completed; st = tt.t.Stats() {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: executed %d, completed %d", round, st.Executed, st.Completed)
			}
			time.Sleep(time.Millisecond)
		}
		c.Close()
		if err := tt.sub.AllowHost(testHostNQN); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d of %d commands completed on the host, %d failed", round, cd.done.Load(), n, cd.failed.Load())
	}
	if n := d.Corrupt(); n != 0 {
		t.Fatalf("%d writes changed while at the backend", n)
	}
	c := connectHost(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 16})
	initiatortest.RandomWorkload(t, c.Namespace(1), seed, 16, 200)
}
