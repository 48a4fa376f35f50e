package repl

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

// tokenCB hands a host write's slot back to the driver.
type tokenCB struct {
	tok  chan struct{}
	errs atomic.Uint64
}

func (c *tokenCB) IODone(err error) {
	if err != nil {
		c.errs.Add(1)
	}
	c.tok <- struct{}{}
}

// BenchmarkRealWrite: 4 KiB random writes from a host (blk's initiator,
// one queue) through NVMe/TCP on loopback to a primary's Backend, "solo"
// with no peer (its local replica alone, as a volume of one replica) or
// "1leg" with one replica over NVMe/TCP (2 queues of 64, as blkd's),
// memory backends on both: the replicated write path of the product
// without its disks, both targets' poll groups without spin (as
// deploy/bench/replicas.sh runs blkd). "locked" and "unlocked" are the
// poll groups' tcp.Config.LockThreads (unlocked is the default).
// Reported beside ns/op: the process's CPU time per write (host, primary
// and replica share it) and the primary's poll-group passes per write.
func BenchmarkRealWrite(b *testing.B) {
	for _, qd := range []int{1, 32} {
		for _, lock := range []bool{true, false} {
			for _, legs := range []int{0, 1} {
				name := fmt.Sprintf("QD%d/unlocked/solo", qd)
				if lock {
					name = fmt.Sprintf("QD%d/locked/solo", qd)
				}
				if legs == 1 {
					name = name[:len(name)-len("solo")] + "1leg"
				}
				b.Run(name, func(b *testing.B) { benchRealWrite(b, qd, legs, lock) })
			}
		}
	}
}

func benchRealWrite(b *testing.B, qd, legs int, lock bool) {
	cfg := tcp.Config{PollSpin: -1, LockThreads: lock}
	local, _ := target.NewMemBackend(testBlock, realBlocks)
	rb, err := New(Config{Local: target.Inline(local), Reporter: newFakeReporter(), Epoch: 1, Depth: 128})
	if err != nil {
		b.Fatal(err)
	}
	if legs > 0 {
		replica, _ := target.NewMemBackend(testBlock, realBlocks)
		rport, _ := servePort(b, target.Inline(replica), cfg)
		ns := connect(b, rport.Addr().String(), initiator.Config{Queues: 2, QueueDepth: 64})
		if err := rb.SetPeers(1, []Peer{{Node: "replica", NS: ns}}); err != nil {
			b.Fatal(err)
		}
	}
	hport, _ := servePort(b, rb, cfg)
	host := connect(b, hport.Addr().String(), initiator.Config{Queues: 1, QueueDepth: max(qd, initiator.MinQueueDepth)})

	cb := &tokenCB{tok: make(chan struct{}, qd)}
	buf := pattern(testBlock, 7)
	rng := rand.New(rand.NewPCG(1, 2))
	run := func(n int) {
		for range qd {
			cb.tok <- struct{}{}
		}
		for range n {
			<-cb.tok
			if err := host.WriteAsync(rng.Uint64N(realBlocks), buf, 0, cb); err != nil {
				b.Fatal(err)
			}
		}
		for range qd {
			<-cb.tok
		}
	}
	run(1000) // connections warm, buffers touched
	st0 := hport.Stats()
	cpu0 := cpuTime()
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
	cpu, st := cpuTime()-cpu0, hport.Stats()
	if n := cb.errs.Load(); n != 0 {
		b.Fatalf("%d writes failed", n)
	}
	if s := rb.Stats(); legs > 0 && (s.Peers[0].Failures != 0 || s.Peers[0].State != "in-sync") {
		b.Fatalf("peer %+v", s.Peers[0])
	}
	b.ReportMetric(float64(cpu)/1e3/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(st.Passes-st0.Passes)/float64(b.N), "passes/op")
}

// cpuTime is the process's user and system CPU time in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkBarrier: one barrier (an fn that does nothing but answer)
// while a host keeps 32 4 KiB random writes in flight through NVMe/TCP
// on loopback to a primary whose one replica is over NVMe/TCP too (the
// "QD32/unlocked/1leg" rig of BenchmarkRealWrite), at least 64 writes
// completing between two barriers; the primary's local replica a memory
// backend ("mem") or a store volume in a file of the test's directory
// ("store": its held writes released on the store's blocking path). Reported: held-ns (how long writes
// were held, as Barrier returns it: the drain and fn), barrier-ns (the
// wall time of the call, the release included), the 99th percentile and
// the worst of held (p99-held-ns, max-held-ns) and the writes held per
// barrier. The snapshot's goal is 10 ms in all
// (docs/snapshots.md §4.1).
func BenchmarkBarrier(b *testing.B) {
	b.Run("mem", func(b *testing.B) {
		local, _ := target.NewMemBackend(testBlock, realBlocks)
		benchBarrier(b, target.Inline(local))
	})
	b.Run("store", func(b *testing.B) {
		s, err := store.Open(store.Config{Dir: filepath.Join(b.TempDir(), "meta"), ClusterBytes: 16 << 10, AreaBytes: 64 << 20, Logger: quietLogger{}})
		if err != nil {
			b.Fatal(err)
		}
		v, err := s.Create(1, store.CreateOptions{SizeBytes: realBlocks * testBlock, BlockSize: testBlock})
		if err != nil {
			b.Fatal(err)
		}
		sio, err := target.NewStoreIO(s, target.StoreIOConfig{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			sio.Close()
			_ = s.Close()
		})
		benchBarrier(b, sio.Backend(v))
	})
}

func benchBarrier(b *testing.B, local target.AsyncBackend) {
	const qd = 32
	cfg := tcp.Config{PollSpin: -1}
	rb, err := New(Config{Local: local, Reporter: newFakeReporter(), Epoch: 1, Depth: 128})
	if err != nil {
		b.Fatal(err)
	}
	replica, _ := target.NewMemBackend(testBlock, realBlocks)
	rport, _ := servePort(b, target.Inline(replica), cfg)
	ns := connect(b, rport.Addr().String(), initiator.Config{Queues: 2, QueueDepth: 64})
	if err := rb.SetPeers(1, []Peer{{Node: "replica", NS: ns}}); err != nil {
		b.Fatal(err)
	}
	hport, _ := servePort(b, rb, cfg)
	host := connect(b, hport.Addr().String(), initiator.Config{Queues: 1, QueueDepth: max(qd, initiator.MinQueueDepth)})

	cb := &countCB{tokenCB: tokenCB{tok: make(chan struct{}, qd)}}
	buf := pattern(testBlock, 7)
	quit, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		rng := rand.New(rand.NewPCG(1, 2))
		for range qd {
			cb.tok <- struct{}{}
		}
		for {
			select {
			case <-quit:
				for range qd {
					<-cb.tok
				}
				return
			case <-cb.tok:
			}
			if err := host.WriteAsync(rng.Uint64N(realBlocks), buf, 0, cb); err != nil {
				cb.errs.Add(1)
				cb.tok <- struct{}{}
			}
		}
	}()
	progress := func(n uint64) {
		for to := cb.n.Load() + n; cb.n.Load() < to; {
			time.Sleep(20 * time.Microsecond)
		}
	}
	inSync := func(in []string) ([]string, error) { return in, nil }
	progress(1000) // connections warm
	held0 := rb.Stats().HeldIOs
	var heldSum, wallSum time.Duration
	helds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		progress(64)
		t0 := time.Now()
		held, err := rb.Barrier(context.Background(), inSync)
		wall := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		heldSum, wallSum = heldSum+held, wallSum+wall
		helds = append(helds, held)
	}
	b.StopTimer()
	close(quit)
	<-stopped
	if n := cb.errs.Load(); n != 0 {
		b.Fatalf("%d writes failed", n)
	}
	st := rb.Stats()
	if st.Peers[0].Failures != 0 || st.Peers[0].State != "in-sync" {
		b.Fatalf("peer %+v", st.Peers[0])
	}
	b.ReportMetric(float64(heldSum.Nanoseconds())/float64(b.N), "held-ns/op")
	b.ReportMetric(float64(wallSum.Nanoseconds())/float64(b.N), "barrier-ns/op")
	slices.Sort(helds)
	b.ReportMetric(float64(helds[len(helds)*99/100].Nanoseconds()), "p99-held-ns")
	b.ReportMetric(float64(helds[len(helds)-1].Nanoseconds()), "max-held-ns")
	b.ReportMetric(float64(st.HeldIOs-held0)/float64(b.N), "held-writes/op")
}

// countCB is a tokenCB that counts completions.
type countCB struct {
	tokenCB
	n atomic.Uint64
}

func (c *countCB) IODone(err error) {
	c.n.Add(1)
	c.tokenCB.IODone(err)
}
