package tcp_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

// BenchmarkCompareAndWriteQD32: 4 KiB fused Compare and Write pairs at
// queue depth 32 (32 pairs in flight) on distinct random blocks, beside
// plain 4 KiB writes at queue depth 32 on the same blocks, through blk's
// initiator (one I/O queue of 64 entries) over NVMe/TCP, on a MemBackend
// and on a store volume (O_DIRECT data area in the test's directory).
// The pair compares what the blocks hold, so each one writes. In each
// backend the "write" run comes first; the "caw" run reports x-write,
// its IOPS over the write run's (docs/reservations.md §2.6: the goal is
// ≥ 0.8), and both report the process's CPU per I/O and the poll
// groups' socket calls and passes per I/O. One write run then one caw
// run swings with whatever else the machine does; "alternate" makes five
// rounds of both on one target and reports the median ratio, its spread
// and the ratio of CPU per pair to CPU per write. The plain writes' cost of the range lock is what
// BenchmarkRandWrite4KiBQD32 shows before and after it.
//
//	go test -run '^$' -bench CompareAndWrite -benchtime 20000x ./target/tcp/
func BenchmarkCompareAndWriteQD32(b *testing.B) {
	for _, backend := range []string{"mem", "store"} {
		var writeIOPS float64
		for _, op := range []string{"write", "caw", "alternate"} {
			b.Run(fmt.Sprintf("backend=%s/op=%s", backend, op), func(b *testing.B) {
				ns, tt := cawBenchTarget(b, backend)
				if op == "alternate" {
					runCAWAlternate(b, ns)
					return
				}
				p0 := tt.port.Stats()
				kind := cawWrite
				if op == "caw" {
					kind = cawPair
				}
				iops := runCAWBench(b, ns, kind)
				st := tt.t.Stats()
				reportPortPerOp(b, p0, tt.port.Stats())
				if op == "write" {
					writeIOPS = iops
				} else {
					if writeIOPS > 0 {
						b.ReportMetric(iops/writeIOPS, "x-write")
					}
					b.ReportMetric(float64(st.LockWaits)/float64(b.N), "lock-waits/op")
					if st.FusedPairs < uint64(b.N) || st.FusedMiscompares != 0 {
						b.Fatalf("stats: %d pairs, %d miscompares for %d", st.FusedPairs, st.FusedMiscompares, b.N)
					}
				}
			})
		}
	}
}

const (
	cawDepth  = 32
	cawBlocks = 8192 // 32 MiB addressed
)

// cawBenchTarget serves a namespace on backend and connects blk's
// initiator; every block of the addressed region is written first (the
// store then overwrites in place, its steady state).
func cawBenchTarget(b *testing.B, backend string) (*initiator.Namespace, *testTarget) {
	b.Helper()
	var tt *testTarget
	switch backend {
	case "mem":
		tt = newTestTarget(b, tcp.Config{})
	default:
		s, err := store.Open(store.Config{Dir: b.TempDir(), AreaBytes: 64 << 20, SyncInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		v, err := s.Create(1, store.CreateOptions{SizeBytes: cawBlocks * testBlock, BlockSize: testBlock})
		if err != nil {
			b.Fatal(err)
		}
		sio, err := target.NewStoreIO(s, target.StoreIOConfig{})
		if err != nil {
			b.Fatal(err)
		}
		tt = serveAsync(b, sio.Backend(v))
		b.Cleanup(func() {
			tt.port.Close()
			tt.t.Close()
			sio.Close()
			_ = s.Close()
		})
	}
	c := connectTCP(b, tt.addr, initiator.Config{Queues: 1, QueueDepth: 2 * cawDepth})
	ns := c.Namespace(1)
	fill := bytes.Repeat([]byte{0x5a}, 1<<20)
	for off := int64(0); off < cawBlocks*testBlock; off += int64(len(fill)) {
		if _, err := ns.WriteAt(fill, off); err != nil {
			b.Fatal(err)
		}
	}
	return ns, tt
}

// cawSlot is one of the benchmark's I/Os in flight: it resubmits itself
// from its completion until the run is done.
type cawSlot struct {
	r     *cawRun
	idx   int
	start int64
}

type cawRun struct {
	ns       *initiator.Namespace
	kind     cawKind
	rbuf     [cawDepth][]byte // cawRead: each slot's buffer
	data     []byte
	lbas     []uint64 // per I/O
	n        int64
	issued   atomic.Int64
	done     atomic.Int64
	lat      atomic.Int64 // sum of latencies, ns
	slots    [cawDepth]cawSlot
	fin      chan struct{}
	once     sync.Once
	err      error
	inflight [cawDepth]atomic.Uint64 // the block each slot has in flight
}

func (s *cawSlot) IODone(err error) {
	r := s.r
	r.lat.Add(mono() - s.start)
	if err != nil {
		r.finish(err)
		return
	}
	if r.done.Add(1) == r.n {
		r.finish(nil)
		return
	}
	r.next(s)
}

func (r *cawRun) finish(err error) {
	r.once.Do(func() { r.err = err; close(r.fin) })
}

// next submits slot s's next I/O, if any is left.
func (r *cawRun) next(s *cawSlot) {
	i := r.issued.Add(1) - 1
	if i >= r.n {
		return
	}
	// Slot s takes blocks ≡ s (mod cawDepth): no two I/Os in flight
	// touch the same block.
	lba := r.lbas[i]/cawDepth*cawDepth + uint64(s.idx)
	s.start = mono()
	var err error
	switch r.kind {
	case cawPair:
		err = r.ns.CompareAndWriteAsync(lba, r.data, r.data, 0, s)
	case cawWrite:
		err = r.ns.WriteAsync(lba, r.data, 0, s)
	default:
		err = r.ns.ReadAsync(lba, r.rbuf[s.idx], s)
	}
	if err != nil {
		r.finish(err)
	}
}

// cawRunOnce runs n I/Os (pairs for caw) at depth cawDepth and returns
// the run, its wall time and the process's CPU time meanwhile.
func cawRunOnce(b *testing.B, ns *initiator.Namespace, kind cawKind, n int) (*cawRun, time.Duration, time.Duration) {
	r := &cawRun{ns: ns, kind: kind, data: bytes.Repeat([]byte{0x5a}, testBlock), n: int64(n),
		lbas: make([]uint64, n), fin: make(chan struct{})}
	if kind == cawRead {
		for i := range r.rbuf {
			r.rbuf[i] = make([]byte, testBlock)
		}
	}
	rng := rand.New(rand.NewPCG(7, uint64(n)))
	for i := range r.lbas {
		r.lbas[i] = rng.Uint64N(cawBlocks)
	}
	cpu0 := processCPU()
	start := time.Now()
	for i := range r.slots {
		r.slots[i] = cawSlot{r: r, idx: i}
		r.next(&r.slots[i])
	}
	select {
	case <-r.fin:
	case <-time.After(5 * time.Minute):
		b.Fatal("benchmark run did not finish")
	}
	return r, time.Since(start), processCPU() - cpu0
}

// runCAWBench runs a warm-up, then b.N I/Os (pairs for caw) at depth
// cawDepth, and returns their IOPS.
func runCAWBench(b *testing.B, ns *initiator.Namespace, kind cawKind) float64 {
	if r, _, _ := cawRunOnce(b, ns, kind, 1024); r.err != nil {
		b.Fatalf("warm-up: %v", r.err)
	}
	b.ReportAllocs()
	b.SetBytes(testBlock)
	b.ResetTimer()
	r, d, cpu := cawRunOnce(b, ns, kind, max(b.N, cawDepth))
	b.StopTimer()
	if r.err != nil {
		b.Fatal(r.err)
	}
	iops := float64(r.n) / d.Seconds()
	b.ReportMetric(iops, "IOPS")
	b.ReportMetric(float64(r.lat.Load())/float64(r.n)/1e3, "mean-us")
	// The process's CPU (initiator and target together, user and
	// system) per I/O: on a shared machine steadier than IOPS, and what
	// bounds IOPS when the cores are busy.
	b.ReportMetric(float64(cpu.Microseconds())/float64(r.n), "cpu-us/op")
	return iops
}

// cawKind is what a benchmark run sends.
type cawKind uint8

const (
	cawWrite cawKind = iota // plain 4 KiB writes
	cawPair                 // fused Compare and Write pairs
	cawRead                 // 4 KiB reads (op=alternate's ceiling)
)

// cawRounds is how many rounds op=alternate makes.
const cawRounds = 5

// runCAWAlternate makes cawRounds rounds on one target, each a run of
// b.N plain writes, one of b.N pairs and one of b.N reads, and reports
// the median, the lowest and the highest of the rounds' pair-IOPS ÷
// write-IOPS (x-write), the median of their CPU per pair ÷ CPU per
// write, and the median ceiling a latency bound puts on x-write: at the
// same depth a pair's latency is at least a read's plus a write's, so
// x-write ≤ t_write/(t_read+t_write) = read-IOPS/(read-IOPS+write-IOPS)
// (x-ceiling; where the CPU bounds instead, cpu-pair/write says more).
// On a machine shared with other work one write run then one caw run
// cannot tell the pair's cost from the machine's moods
// (docs/reservations.md §2.6).
func runCAWAlternate(b *testing.B, ns *initiator.Namespace) {
	kinds := []cawKind{cawWrite, cawPair, cawRead}
	for _, k := range kinds {
		if r, _, _ := cawRunOnce(b, ns, k, 1024); r.err != nil {
			b.Fatalf("warm-up: %v", r.err)
		}
	}
	n := max(b.N, cawDepth)
	b.ReportAllocs()
	b.ResetTimer()
	var ratio, cpuRatio, ceiling [cawRounds]float64
	for i := range cawRounds {
		var iops, cpu [3]float64
		for _, k := range kinds {
			r, d, c := cawRunOnce(b, ns, k, n)
			if r.err != nil {
				b.Fatal(r.err)
			}
			iops[k] = float64(n) / d.Seconds()
			cpu[k] = float64(c) / float64(n)
		}
		ratio[i] = iops[cawPair] / iops[cawWrite]
		cpuRatio[i] = cpu[cawPair] / cpu[cawWrite]
		ceiling[i] = iops[cawRead] / (iops[cawRead] + iops[cawWrite])
	}
	b.StopTimer()
	for _, a := range [][]float64{ratio[:], cpuRatio[:], ceiling[:]} {
		slices.Sort(a)
	}
	b.ReportMetric(ratio[cawRounds/2], "x-write")
	b.ReportMetric(ratio[0], "x-write-min")
	b.ReportMetric(ratio[cawRounds-1], "x-write-max")
	b.ReportMetric(cpuRatio[cawRounds/2], "cpu-pair/write")
	b.ReportMetric(ceiling[cawRounds/2], "x-ceiling")
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportPortPerOp reports the target's socket calls, loop passes,
// sleeps and responses per benchmark operation (a pair, for caw): what a
// pair costs the poll group beyond a plain write.
func reportPortPerOp(b *testing.B, p0, p1 tcp.Stats) {
	n := float64(b.N)
	b.ReportMetric(float64(p1.Reads-p0.Reads)/n, "readv/op")
	b.ReportMetric(float64(p1.Writes-p0.Writes)/n, "writev/op")
	b.ReportMetric(float64(p1.Passes-p0.Passes)/n, "passes/op")
	b.ReportMetric(float64(p1.Sleeps-p0.Sleeps)/n, "sleeps/op")
}

var _ = context.Background
