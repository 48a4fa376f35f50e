package rdma_test

import (
	"bytes"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
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
	if err = tt.sub.AddNamespace(target.NamespaceConfig{NSID: 1, Async: d}); err != nil {
		t.Fatal(err)
	}
	if tt.port, err = rdma.Listen(tt.t, a, rdma.Config{Addr: "127.0.0.1:0", Cores: 2}); err != nil {
		t.Fatal(err)
	}
	tt.addr = tt.port.Addr().String()
	t.Cleanup(func() {
		tt.port.Close()
		tt.t.Close()
		a.Close()
	})
	return tt, d
}

// asyncSlot is one of the workload's commands in flight: it owns a
// region of the namespace, so that no two commands in flight overlap and
// the model needs no order.
type asyncSlot struct {
	idx        int
	lo, blocks uint64 // its region
	model      []byte // the region's expected contents
	buf        []byte
	op         byte // 'r', 'w', 'f', 'z'
	lba, n     uint64
	res        chan<- asyncResult
}

type asyncResult struct {
	s   *asyncSlot
	err error
}

func (s *asyncSlot) IODone(err error) { s.res <- asyncResult{s, err} }

// runAsyncWorkload issues ops seeded random reads, writes (some FUA),
// write zeroes and flushes with depth commands in flight, checks every
// read against the model as it completes, then reads the whole namespace
// back; it returns its contents.
func runAsyncWorkload(t *testing.T, ns *initiator.Namespace, seed uint64, depth, ops int) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 22))
	bs := uint64(ns.BlockSize())
	per := ns.Blocks() / uint64(depth)
	res := make(chan asyncResult, depth)
	slots := make([]*asyncSlot, depth)
	initial := make([]byte, ns.Size())
	if _, err := ns.ReadAt(initial, 0); err != nil {
		t.Fatal(err)
	}
	for i := range slots {
		slots[i] = &asyncSlot{idx: i, lo: uint64(i) * per, blocks: per, buf: make([]byte, 16*bs), res: res}
		slots[i].model = append([]byte(nil), initial[uint64(i)*per*bs:uint64(i+1)*per*bs]...)
	}
	start := func(s *asyncSlot) error {
		s.n = 1 + rng.Uint64N(16)
		s.lba = s.lo + rng.Uint64N(s.blocks-s.n+1)
		buf := s.buf[:s.n*bs]
		switch p := rng.IntN(100); {
		case p < 40:
			s.op = 'r'
			return ns.ReadAsync(s.lba, buf, s)
		case p < 85:
			s.op = 'w'
			for i := range buf {
				buf[i] = byte(rng.Uint32())
			}
			var f initiator.IOFlags
			if rng.IntN(8) == 0 {
				f = initiator.FUA
			}
			return ns.WriteAsync(s.lba, buf, f, s)
		case p < 92:
			s.op = 'z'
			return ns.WriteZeroesAsync(s.lba, uint32(s.n), s)
		default:
			s.op = 'f'
			return ns.FlushAsync(s)
		}
	}
	for _, s := range slots {
		if err := start(s); err != nil {
			t.Fatal(err)
		}
	}
	for done := 0; done < ops+depth; done++ {
		var r asyncResult
		select {
		case r = <-res:
		case <-time.After(30 * time.Second):
			t.Fatalf("no completion in 30 s (%d done)", done)
		}
		s := r.s
		if r.err != nil {
			t.Fatalf("slot %d op %c LBA %d+%d: %v", s.idx, s.op, s.lba, s.n, r.err)
		}
		off := (s.lba - s.lo) * bs
		m := s.model[off : off+s.n*bs]
		switch s.op {
		case 'r':
			if !bytes.Equal(s.buf[:len(m)], m) {
				t.Fatalf("slot %d: read LBA %d+%d differs from what was written", s.idx, s.lba, s.n)
			}
		case 'w':
			copy(m, s.buf)
		case 'z':
			clear(m)
		}
		if done < ops {
			if err := start(s); err != nil {
				t.Fatal(err)
			}
		}
	}
	all := initial
	for _, s := range slots {
		copy(all[s.lo*bs:], s.model)
	}
	got := make([]byte, len(all))
	if _, err := ns.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, all) {
		t.Fatal("the namespace differs from what was written")
	}
	return all
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
	all := runAsyncWorkload(t, ns, seed, 64, ops)
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	durable := make([]byte, len(all))
	if err := d.Durable().Read(0, durable); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(durable, all) {
		t.Fatal("after a Flush, the durable image lacks acknowledged writes")
	}
	if n := d.Corrupt(); n != 0 {
		t.Fatalf("%d writes changed while at the backend", n)
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
	runAsyncWorkload(t, c.Namespace(1), seed, 16, 200)
}
