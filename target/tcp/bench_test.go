package tcp_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/benchbook"
	"github.com/blk-project/blk/target/tcp"
)

// End-to-end benchmarks: an allocation-free pipelined host
// (benchhost_test.go) against the target serving a 64 MiB namespace in
// memory (target.MemBackend: what is measured is the binding and the
// core, not storage), and in the same run the bare baseline (bareServer)
// moving the same bytes in the same PDUs for the same host:
//
//	go test -run '^$' -bench . -benchtime 1x ./target/tcp/   (CI: every benchmark once)
//	go test -run '^$' -bench . -benchtime 20000x ./target/tcp/
//
// Each benchmark has two sub-benchmarks, in this order: "bare" and
// "nvme"; the 4 KiB QD32 ones a third, "resv=held": "nvme" with the
// namespace serving reservations and Write Exclusive held by the
// benchmark's host, another host registered (docs/reservations.md §7.7:
// what the reservation check adds per I/O is its tgt-cpu-us/op minus
// nvme's, in one run). Host, target and baseline share this process
// (and, on a small machine, its processors); b.N is the number of I/Os
// after a warm-up.
//
// Metrics, besides ns/op, MB/s, B/op and allocs/op (the whole process:
// host, target and baseline; the host allocates nothing per I/O):
//
//	IOPS            I/Os completed per second
//	mean-us, p99-us latency of one I/O, submission to completion
//	tgt-cpu-us/op   CPU time of the server's threads per I/O: the poll
//	                groups' (locked to their threads, the whole data path)
//	                or the baseline's connection goroutines' (locked too),
//	                from /proc/self/task/*/schedstat
//	copies/op       (nvme) user-space copies of data by the target per
//	                I/O (Stats.Copies); copied-bytes/op the bytes
//	r2ts/op, c2h/op, incapsule/op  (nvme) the PDU mix
//	readvs/op, writevs/op, passes/op, sleeps/op
//	                (nvme) the poll groups' socket calls, loop passes and
//	                sleeps per I/O (a partial writev counts; EAGAIN too)
//	x-bare          (nvme) IOPS ÷ IOPS of the bare run of the same case in
//	                this process: what NVMe, the binding and the core cost
//	                together (1 = free)

const (
	benchRegion = 32 << 20 // the part of the namespace addressed
	benchWarmup = 256
)

type benchCase struct {
	name  string
	write bool
	seq   bool
	size  int
	depth int
	resv  bool // also run "resv=held"
}

func BenchmarkRandRead4KiBQD1(b *testing.B) {
	runBenchCase(b, benchCase{name: "randread-4k-qd1", size: 4 << 10, depth: 1})
}

func BenchmarkRandRead4KiBQD32(b *testing.B) {
	runBenchCase(b, benchCase{name: "randread-4k-qd32", size: 4 << 10, depth: 32, resv: true})
}

func BenchmarkRandWrite4KiBQD32(b *testing.B) {
	runBenchCase(b, benchCase{name: "randwrite-4k-qd32", write: true, size: 4 << 10, depth: 32, resv: true})
}

func BenchmarkSeqRead128KiBQD4(b *testing.B) {
	runBenchCase(b, benchCase{name: "seqread-128k-qd4", seq: true, size: 128 << 10, depth: 4})
}

func BenchmarkSeqWrite128KiBQD4(b *testing.B) {
	runBenchCase(b, benchCase{name: "seqwrite-128k-qd4", write: true, seq: true, size: 128 << 10, depth: 4})
}

func runBenchCase(b *testing.B, bc benchCase) {
	b.Run("bare", func(b *testing.B) {
		s := newBareServer(b)
		h := dialBench(b, s.ln.Addr().String(), bc.write, bc.size, bc.depth)
		r := measure(b, bc, h, func() []int { s.mu.Lock(); defer s.mu.Unlock(); return slices.Clone(s.tids) }, nil)
		bareResults.Record(bc.name, b.N, r.iops)
	})
	b.Run("nvme", func(b *testing.B) { runBenchNVMe(b, bc, false) })
	if bc.resv {
		b.Run("resv=held", func(b *testing.B) { runBenchNVMe(b, bc, true) })
	}
}

// runBenchNVMe is the "nvme" sub-benchmark; with resv, "resv=held".
func runBenchNVMe(b *testing.B, bc benchCase, resv bool) {
	{
		tt := newTestTarget(b, tcp.Config{LockThreads: true}) // GroupThreads: the groups' CPU time
		if resv {
			holdReservation(b, tt)
		}
		h := dialBench(b, tt.addr, bc.write, bc.size, bc.depth)
		var s0 tcp.Stats
		r := measure(b, bc, h, tt.port.GroupThreads, func() { s0 = tt.port.Stats() })
		s1 := tt.port.Stats()
		n := float64(r.n)
		b.ReportMetric(float64(s1.Copies-s0.Copies)/n, "copies/op")
		b.ReportMetric(float64(s1.CopiedBytes-s0.CopiedBytes)/n, "copied-bytes/op")
		b.ReportMetric(float64(s1.R2Ts-s0.R2Ts)/n, "r2ts/op")
		b.ReportMetric(float64(s1.C2HData-s0.C2HData)/n, "c2h/op")
		b.ReportMetric(float64(s1.InCapsule-s0.InCapsule)/n, "incapsule/op")
		b.ReportMetric(float64(s1.Reads-s0.Reads)/n, "readvs/op")
		b.ReportMetric(float64(s1.Writes-s0.Writes)/n, "writevs/op")
		b.ReportMetric(float64(s1.Passes-s0.Passes)/n, "passes/op")
		b.ReportMetric(float64(s1.Sleeps-s0.Sleeps)/n, "sleeps/op")
		if bare, ok := bareResults.Median(bc.name); ok {
			b.ReportMetric(r.iops/bare, "x-bare")
		}
	}
}

// lbas returns the first block of each of n I/Os: random size-aligned
// blocks of the region (seeded: every run asks for the same), or the
// region in order.
func (bc benchCase) lbas(n int) []uint64 {
	per := uint64(bc.size / testBlock)
	slots := uint64(benchRegion / bc.size)
	out := make([]uint64, n)
	rng := rand.New(rand.NewPCG(1, uint64(bc.size)))
	for i := range out {
		if bc.seq {
			out[i] = uint64(i) % slots * per
		} else {
			out[i] = rng.Uint64N(slots) * per
		}
	}
	return out
}

type benchResult struct {
	iops float64
	n    int
}

// measure runs a warm-up and then b.N I/Os of bc on h, keeping depth in
// flight, and reports the common metrics; threads lists the server's
// threads whose CPU time is charged to it.
// atStart, if not nil, runs after the warm-up (the caller's counters).
func measure(b *testing.B, bc benchCase, h *benchHost, threads func() []int, atStart func()) benchResult {
	b.SetBytes(int64(bc.size))
	b.ReportAllocs()
	warm := newIOLoop(benchWarmup+bc.depth, bc.depth, bc.lbas(benchWarmup+bc.depth), h.submit)
	h.done = warm.complete
	if err := warm.run(); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	n := b.N
	l := newIOLoop(n, bc.depth, bc.lbas(n), h.submit)
	h.done = l.complete
	cpu := func() (d time.Duration) {
		for _, tid := range threads() {
			d += benchbook.ThreadCPU(tid)
		}
		return d
	}
	runtime.GC()
	if atStart != nil {
		atStart()
	}
	c0 := cpu()
	b.ResetTimer()
	err := l.run()
	b.StopTimer()
	c1 := cpu()
	if err != nil {
		b.Fatal(err)
	}
	r := benchResult{iops: float64(n) / b.Elapsed().Seconds(), n: n}
	mean, p99 := l.latency()
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(r.iops, "IOPS")
	b.ReportMetric(us(mean), "mean-us")
	b.ReportMetric(us(p99), "p99-us")
	b.ReportMetric(us(c1-c0)/float64(n), "tgt-cpu-us/op")
	return r
}

// ioLoop keeps depth I/Os in flight until n have completed; each
// completion (on the host's reader goroutine) records its latency and
// submits the next I/O on its slot. Nothing is allocated per I/O.
type ioLoop struct {
	n      int64
	depth  int
	submit func(slot int, lba uint64) error
	lbas   []uint64
	start  []int64
	lat    []int64

	issued, done atomic.Int64
	fin          chan struct{}
	once         sync.Once
	err          error
}

var benchEpoch = time.Now()

func mono() int64 { return int64(time.Since(benchEpoch)) }

func newIOLoop(n, depth int, lbas []uint64, submit func(int, uint64) error) *ioLoop {
	return &ioLoop{n: int64(n), depth: depth, submit: submit, lbas: lbas,
		start: make([]int64, depth), lat: make([]int64, n), fin: make(chan struct{})}
}

func (l *ioLoop) run() error {
	k := min(int64(l.depth), l.n)
	l.issued.Store(k)
	for slot := 0; slot < int(k); slot++ {
		l.start[slot] = mono()
		if err := l.submit(slot, l.lbas[slot]); err != nil {
			l.finish(err)
			break
		}
	}
	select {
	case <-l.fin:
	case <-time.After(5 * time.Minute):
		l.finish(fmt.Errorf("%d of %d I/Os done after 5 minutes", l.done.Load(), l.n))
	}
	return l.err
}

func (l *ioLoop) finish(err error) {
	l.once.Do(func() {
		l.err = err
		close(l.fin)
	})
}

func (l *ioLoop) complete(slot int, err error) {
	now := mono()
	if err != nil {
		l.finish(fmt.Errorf("I/O on slot %d: %w", slot, err))
		return
	}
	d := l.done.Add(1)
	if d > l.n {
		return
	}
	l.lat[d-1] = now - l.start[slot]
	if d == l.n {
		l.finish(nil)
		return
	}
	i := l.issued.Add(1) - 1
	if i >= l.n {
		return
	}
	l.start[slot] = mono()
	if err := l.submit(slot, l.lbas[i]); err != nil {
		l.finish(err)
	}
}

// latency is the mean and 99th percentile of the completed I/Os.
func (l *ioLoop) latency() (mean, p99 time.Duration) {
	return benchbook.Latency(l.lat[:min(l.done.Load(), l.n)])
}

// bareResults keeps the bare runs' IOPS per case, for x-bare (their
// median, benchbook.Book.Median).
var bareResults benchbook.Book
