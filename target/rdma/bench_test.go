package rdma_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/internal/benchbook"
)

// End-to-end benchmarks: our initiator against our target serving a pebble
// volume, over the soft transport on loopback (or the provider and address
// the environment names, benchenv_test.go), and in the same run the
// bare transport baseline (bare_test.go) moving the same bytes with the
// same messages, RDMA operations and queue depth:
//
//	go test -run '^$' -bench . -benchmem ./target/rdma/
//
// Each benchmark has three sub-benchmarks, run in this order: "bare" (the
// baseline's server), "nvme" (the target through this binding) and
// "nvme-tcp" (the same target, volume and initiator through the NVMe/TCP
// binding, target/tcp, over kernel TCP: the two bindings side by side in
// one run). Both servers run in a child
// process (the test binary, see child_test.go), a fresh one for every run
// the framework makes, so that their CPU time is theirs alone and no run
// inherits another's pebble state; the target's volume is on a real
// temporary directory. The host side — our initiator, or the baseline's
// client — runs in the benchmark process on one queue (one QP, one engine
// core) unless the case asks for more (BenchmarkQueues: the depth is then
// spread evenly over the queues, and the host's engine has one core per
// queue up to the processors, as the initiator sizes itself), and both
// are driven by the same loop (ioLoop): depth requests kept in flight
// from the completion callbacks, each request's latency recorded in a
// preallocated slice. b.N is the number of I/Os; a warm-up of
// benchWarmup I/Os precedes the timed part.
//
// The I/Os address the first benchRegion bytes of the volume. The read
// cases write the region first (and Flush), so reads hit stored blocks;
// the region fits in pebble's memtable, so reads are served from it (not
// from sstables through the block cache). The write cases overwrite the
// region over and over: pebble's memtable flushes and compactions run
// during the measurement and are charged to it, as they would be in use.
// The blocks are drawn from a seeded generator (benchSeed, logged; the
// same in both variants) and the data is checked after the timed part
// (verifyNVMe, verifyBare): the last block each slot read must hold what
// the prefill wrote there, the last block each slot wrote must hold one
// slot's write data whole.
//
// Metrics, besides ns/op (1/IOPS), MB/s and the host's B/op and allocs/op:
//
//	IOPS             I/Os completed per second
//	mean-us, p99-us  latency of one I/O, submission to completion callback
//	tgt-cpu-us/op    CPU time of the server process per I/O (user+system,
//	                 from /proc, 10 ms ticks: meaningful on runs of ~1 s)
//	host-cpu-us/op   CPU time of the benchmark process per I/O (likewise)
//	tgt-allocs/op    heap allocations of the server process per I/O
//	tgt-comps/notify completions per CQ notification on the server
//	rdma-reads/op, rdma-writes/op, in-capsule/op
//	                 the server's data transfers per I/O: bare and nvme
//	                 must show the same mix (a 4 KiB write goes in the
//	                 capsule, a 128 KiB write is fetched by RDMA READ, a
//	                 read is placed by RDMA WRITE)
//	r2ts/op, staging-copies/op
//	                 (nvme-tcp, instead of the RDMA operations) R2Ts sent
//	                 and host data copied from the receive staging buffer
//	                 per I/O
//	x-rdma           (nvme-tcp) IOPS ÷ IOPS of this benchmark's nvme runs
//	                 in the same process (median, as x-bare): NVMe/TCP
//	                 against NVMe/RDMA on the soft provider
//	full-retries/op  (nvme) submissions the initiator refused as queue
//	                 full although a slot was free, retried (retryFull)
//	vol-bounces/op   (nvme) requests the store copied through a bounce
//	                 buffer (the target's buffer not aligned for O_DIRECT),
//	                 per request of the volume (0: no copy in the store)
//	x-bare           (nvme) IOPS of nvme ÷ IOPS of this benchmark's bare
//	                 runs in the same process (their median, see
//	                 bareResults): what the protocol, our initiator, the
//	                 target core and the volume cost together, as one
//	                 number (1 = free); absent if "bare" did not run
//	x-1queue         (BenchmarkQueues, more than one queue) IOPS ÷ IOPS of
//	                 the same variant and pattern on one queue in the same
//	                 process (median, as x-bare): what spreading the same
//	                 depth over more queues costs (1 = nothing)
//
// The copies on the host (by design one per I/O: the initiator copies a
// write into its slot and a read out of it) and the soft provider's own
// copies are not counted here: the initiator and the target expose no
// counter for them.
//
// Host and server share the machine's processors (their notification
// goroutines are pinned to different ones, see bareClient), so on a small
// machine IOPS at depth follow the CPU both processes spend per I/O, and
// anything else running on it shows in the numbers. To see where a
// server's time goes, BLK_TEST_CHILD_CPUPROFILE=/tmp/tgt writes a CPU
// profile of every child to /tmp/tgt.<pid> (the largest is the timed run's).

const (
	// benchBlock is the volume's block size.
	benchBlock = 4096
	// benchRegion is the part of the volume the benchmarks address:
	// 32 MiB, half the volume store's 64 MiB memtable, so that filling it
	// for the read benchmarks does not start a memtable flush that would
	// run (and be charged) during the measurement.
	benchRegion = 32 << 20
	// benchWarmup is the I/Os run before the measurement, plus the queue
	// depth (pools, goroutine stacks, the engines' moderation).
	benchWarmup = 256
)

type benchCase struct {
	name  string
	write bool
	seq   bool
	size  int
	depth int // I/Os in flight, over all queues
	// queues is the host's I/O queues (QPs), depth/queues entries each;
	// 0 is 1.
	queues int
	// base is the name of the one-queue case this one is compared with
	// (x-1queue); empty for none.
	base string
	// disk is BenchmarkStoreDisk's variant ("sync", "async"); empty in
	// the other benchmarks.
	disk string
}

// nqueues is the host's I/O queues.
func (bc benchCase) nqueues() int { return max(bc.queues, 1) }

// perQueue is the I/Os in flight on one queue.
func (bc benchCase) perQueue() int { return bc.depth / bc.nqueues() }

func BenchmarkRandRead4KiBQD1(b *testing.B) {
	runBenchCase(b, benchCase{name: "randread-4k-qd1", size: 4 << 10, depth: 1})
}

func BenchmarkRandRead4KiBQD32(b *testing.B) {
	runBenchCase(b, benchCase{name: "randread-4k-qd32", size: 4 << 10, depth: 32})
}

func BenchmarkRandWrite4KiBQD1(b *testing.B) {
	runBenchCase(b, benchCase{name: "randwrite-4k-qd1", write: true, size: 4 << 10, depth: 1})
}

func BenchmarkRandWrite4KiBQD32(b *testing.B) {
	runBenchCase(b, benchCase{name: "randwrite-4k-qd32", write: true, size: 4 << 10, depth: 32})
}

func BenchmarkSeqRead128KiBQD4(b *testing.B) {
	runBenchCase(b, benchCase{name: "seqread-128k-qd4", seq: true, size: 128 << 10, depth: 4})
}

func BenchmarkSeqWrite128KiBQD4(b *testing.B) {
	runBenchCase(b, benchCase{name: "seqwrite-128k-qd4", write: true, seq: true, size: 128 << 10, depth: 4})
}

// BenchmarkQueues is the cost of queues: 4 KiB random reads and writes
// at a total depth of 32 spread over 1, 4 and 16 I/O queues (QPs) of one
// host — 32, 8 and 2 entries each. The total depth stays fixed so that
// only the number of queues changes: the work in flight, the data buffers
// it holds and what the volume sees are the same in every row, and what
// moves is what a queue costs (a QP, its send queue, fewer completions
// per notification and per doorbell, more connections for the provider
// to serve). QD 32 per queue would also multiply the work in flight by
// 16, and on a small machine would measure its saturation, not the
// queues. 16 queues × 2 is the shallowest queue NVMe allows (SQSIZE 1).
func BenchmarkQueues(b *testing.B) {
	for _, op := range []struct {
		name  string
		write bool
	}{{"randread-4k-qd32", false}, {"randwrite-4k-qd32", true}} {
		for _, q := range []int{1, 4, 16} {
			bc := benchCase{name: fmt.Sprintf("%s-q%d", op.name, q), write: op.write, size: 4 << 10, depth: 32, queues: q}
			if q > 1 {
				bc.base = fmt.Sprintf("%s-q%d", op.name, 1)
			}
			b.Run(fmt.Sprintf("%s/queues=%d", op.name, q), func(b *testing.B) { runBenchCase(b, bc) })
		}
	}
}

func runBenchCase(b *testing.B, bc benchCase) {
	if bc.depth%bc.nqueues() != 0 {
		b.Fatalf("depth %d does not spread evenly over %d queues", bc.depth, bc.nqueues())
	}
	b.Run("bare", func(b *testing.B) { benchBare(b, bc) })
	b.Run("nvme", func(b *testing.B) { benchNVMe(b, bc, initiator.TransportRDMA) })
	b.Run("nvme-tcp", func(b *testing.B) { benchNVMe(b, bc, initiator.TransportTCP) })
}

// benchSeedEnv overrides the benchmarks' seed (benchSeed).
const benchSeedEnv = "BLK_BENCH_SEED"

// benchSeed is the seed of the blocks the benchmarks address: 1, or
// BLK_BENCH_SEED. Fixed by default so that every run, and both variants of
// one, ask for the same blocks. It is logged, so a failure names it.
func benchSeed(tb testing.TB) uint64 {
	tb.Helper()
	seed := uint64(1)
	if s := os.Getenv(benchSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			tb.Fatalf("%s=%q: %v", benchSeedEnv, s, err)
		}
		seed = v
	}
	tb.Logf("seed %d (%s=%d replays it)", seed, benchSeedEnv, seed)
	return seed
}

// lbas returns the first block of each of n I/Os: uniformly random
// size-aligned blocks of the region (seeded, so every run asks for the
// same ones), or the region in order, wrapping.
func (bc benchCase) lbas(seed uint64, n int) []uint64 {
	per := uint64(bc.size / benchBlock)
	slots := uint64(benchRegion / bc.size)
	out := make([]uint64, n)
	rng := rand.New(rand.NewPCG(seed, uint64(bc.size)))
	for i := range out {
		if bc.seq {
			out[i] = uint64(i) % slots * per
		} else {
			out[i] = rng.Uint64N(slots) * per
		}
	}
	return out
}

// benchBare runs the case against the bare baseline's server in a child
// process.
func benchBare(b *testing.B, bc benchCase) {
	srv := startChild(b, append([]string{"BLK_TEST_BARE_SERVER=1", "BLK_TEST_TARGET_ADDR=" + benchListenAddr()}, benchChildEnv()...)...)
	a := benchAdapter(b)
	op := byte(bareRead)
	if bc.write {
		op = bareWrite
	}
	c := newBareClient(b, a, srv.addr, op, uint32(bc.size), bc.depth, bc.nqueues())
	if bc.write {
		fillRandom(c.data.Bytes(), 2)
	}
	var cur atomic.Pointer[ioLoop]
	done := func(slot int, err error) { cur.Load().complete(slot, err) }
	c.done.Store(&done)
	r := measure(b, bc, srv, &cur, c.submit)
	if r.counters["errors"] != 0 {
		b.Fatalf("bare server counted %d bad requests", r.counters["errors"])
	}
	if !bc.write {
		verifyBare(b, c)
	}
	bareResults.Record(bc.name, b.N, r.iops)
	reportPerQueue(b, bc, "bare", r.iops)
}

// verifyBare checks that every slot's buffer holds what the bare server's
// slot buffer holds (a read places it whole). The server discards write
// data (it has no storage), so writes are checked only on the target.
func verifyBare(b *testing.B, c *bareClient) {
	for slot := 0; slot < c.depth; slot++ {
		got := c.buf(slot)
		for i := range got {
			if want := bareServerByte(slot*bareMaxLen + i); got[i] != want {
				b.Fatalf("bare read on slot %d: byte %d is %#x, want %#x", slot, i, got[i], want)
			}
		}
	}
}

// reportPerQueue records a run of a one-queue case, or reports x-1queue
// for a case with a base.
func reportPerQueue(b *testing.B, bc benchCase, variant string, iops float64) {
	if bc.nqueues() == 1 {
		queueResults.Record(variant+"/"+bc.name, b.N, iops)
	}
	if bc.base == "" {
		return
	}
	if one, ok := queueResults.Median(variant + "/" + bc.base); ok {
		b.ReportMetric(iops/one, "x-1queue")
	} else {
		b.Logf("no one-queue run of %s in this process: x-1queue not reported", bc.base)
	}
}

// nvmeSlot is the Callback of one slot of the initiator's queue.
type nvmeSlot struct {
	cur  *atomic.Pointer[ioLoop]
	slot int
}

func (s *nvmeSlot) IODone(err error) { s.cur.Load().complete(s.slot, err) }

// benchNVMe runs the case against the target in a child process, serving
// a volume of the extent store (package store) in a temporary directory,
// through the binding of transport: NVMe/RDMA (this package) or NVMe/TCP
// (target/tcp).
func benchNVMe(b *testing.B, bc benchCase, transport string, childEnv ...string) {
	env := append([]string{"BLK_TEST_TARGET_DIR=" + b.TempDir(), "BLK_TEST_TARGET_ADDR=" + benchListenAddr()}, childEnv...)
	cfg := initiator.Config{Queues: bc.nqueues(), QueueDepth: benchQueueDepth(bc.perQueue()), Transport: transport}
	if transport == initiator.TransportTCP {
		env = append(env, childTransportEnv+"="+transport)
	} else {
		cfg.Adapter = benchAdapter(b)
	}
	srv := startChild(b, append(env, benchChildEnv()...)...)
	c := connectHost(b, srv.addr, cfg)
	ns := c.Namespace(1)
	if ns == nil {
		b.Fatal("namespace 1 not found")
	}
	if ns.BlockSize() != benchBlock || ns.Size() < benchRegion {
		b.Fatalf("namespace of %d-byte blocks, %d bytes", ns.BlockSize(), ns.Size())
	}
	if info := c.Info(); info.IOQueues != bc.nqueues() {
		b.Fatalf("%d I/O queues, want %d", info.IOQueues, bc.nqueues())
	}
	bufs := make([]byte, bc.size*bc.depth)
	buf := func(slot int) []byte { return bufs[slot*bc.size : (slot+1)*bc.size] }
	if bc.write {
		fillRandom(bufs, 2)
	}
	if !bc.write || bc.disk != "" {
		// BenchmarkStoreDisk writes over a volume written once, as the
		// issue's table measures them: overwrites, straight to the disk
		// (deferred/op 0), not first writes allocating clusters.
		prefill(b, ns)
	}
	var cur atomic.Pointer[ioLoop]
	slots := make([]nvmeSlot, bc.depth)
	for i := range slots {
		slots[i] = nvmeSlot{cur: &cur, slot: i}
	}
	var retries atomic.Uint64
	submit := func(slot int, lba uint64) error {
		return retryFull(&retries, func() error {
			if bc.write {
				return ns.WriteAsync(lba, buf(slot), 0, &slots[slot])
			}
			return ns.ReadAsync(lba, buf(slot), &slots[slot])
		})
	}
	r := measure(b, bc, srv, &cur, submit)
	if st := c.Stats(); st.Failures != 0 || st.QueueFull != retries.Load() {
		b.Fatalf("initiator: %d association failures, %d submissions refused as queue full (%d retried)", st.Failures, st.QueueFull, retries.Load())
	}
	b.ReportMetric(float64(retries.Load())/float64(b.N), "full-retries/op")
	verifyNVMe(b, bc, ns, cur.Load(), bufs)
	if bc.disk != "" {
		reportDisk(b, bc, r)
		return
	}
	if n, ok := r.counters["volrequests"]; ok && n > 0 {
		b.ReportMetric(float64(r.counters["volbounces"])/float64(n), "vol-bounces/op")
	}
	if bare, ok := bareResults.Median(bc.name); ok {
		b.ReportMetric(r.iops/bare, "x-bare")
	} else {
		b.Logf("no bare run of %s in this process: x-bare not reported", bc.name)
	}
	if transport == initiator.TransportTCP {
		if rd, ok := rdmaResults.Median(bc.name); ok {
			b.ReportMetric(r.iops/rd, "x-rdma")
		} else {
			b.Logf("no nvme (RDMA) run of %s in this process: x-rdma not reported", bc.name)
		}
		reportPerQueue(b, bc, "nvme-tcp", r.iops)
		return
	}
	rdmaResults.Record(bc.name, b.N, r.iops)
	reportPerQueue(b, bc, "nvme", r.iops)
}

// verifyNVMe checks the data of the timed run l: the buffer of each slot
// that read must hold what the prefill wrote at the slot's last block;
// the last block each slot wrote must read back as one slot's write data
// whole (another slot may have written it later).
func verifyNVMe(b *testing.B, bc benchCase, ns *initiator.Namespace, l *ioLoop, bufs []byte) {
	slotBuf := func(slot int) []byte { return bufs[slot*bc.size : (slot+1)*bc.size] }
	got := make([]byte, bc.size)
	for slot := 0; slot < bc.depth; slot++ {
		lba, ok := l.lastLBA(slot)
		if !ok {
			continue
		}
		if !bc.write {
			if want := prefillData(lba*benchBlock, bc.size); !slices.Equal(slotBuf(slot), want) {
				b.Fatalf("read on slot %d of block %d: differs from the prefill at byte %d", slot, lba, firstDiff(slotBuf(slot), want))
			}
			continue
		}
		if _, err := ns.ReadAt(got, int64(lba)*benchBlock); err != nil {
			b.Fatalf("read back block %d: %v", lba, err)
		}
		found := false
		for s := 0; s < bc.depth && !found; s++ {
			found = slices.Equal(got, slotBuf(s))
		}
		if !found {
			b.Fatalf("block %d, last written by slot %d, holds no slot's write data", lba, slot)
		}
	}
}

// retryFull submits with submit, again while the initiator refuses it with
// ErrQueueFull, at most maxFullRetries times, counting the retries. The
// benchmarks never have more I/Os in flight than the host's queues hold,
// and a completion frees its slot before its callback resubmits, so a
// slot is always free when the loop submits; but the initiator's
// non-blocking submission (acquireIO) looks at the queues one after the
// other, and when two host cores complete at once each can take the slot
// the other freed after having looked at its queue: both then see every
// queue full. With 4 queues of 8 or 16 of 2 entries at exactly their
// depth that happened about once in 30,000 I/Os (never on one queue: both
// freed slots are then on the one list). A second look finds a free slot.
func retryFull(retries *atomic.Uint64, submit func() error) error {
	for try := 0; ; try++ {
		err := submit()
		if try == maxFullRetries || !errors.Is(err, initiator.ErrQueueFull) {
			return err
		}
		retries.Add(1)
	}
}

// maxFullRetries bounds retryFull: a queue that stays full this long is
// really full, a bug of the benchmark's accounting.
const maxFullRetries = 1000

// benchQueueDepth is the I/O queue the initiator asks for to run depth
// I/Os at once: exactly depth (at least the minimum queue). At full depth
// the target's send queue once overflowed (sizing.go, sendSlotsPerEntry
// tells the story); asking for exactly depth keeps that case covered.
func benchQueueDepth(depth int) int {
	return max(depth, initiator.MinQueueDepth)
}

// prefillChunk is the unit of the prefill's data (prefillData).
const prefillChunk = 1 << 20

// prefill writes random data over the benchmark region and flushes it, so
// that reads hit stored blocks, then checks one block reads back.
func prefill(b testing.TB, ns *initiator.Namespace) {
	chunk := make([]byte, prefillChunk)
	var first []byte
	for off := 0; off < benchRegion; off += len(chunk) {
		fillRandom(chunk, uint64(off))
		if off == 0 {
			first = slices.Clone(chunk[:benchBlock])
		}
		if _, err := ns.WriteAt(chunk, int64(off)); err != nil {
			b.Fatalf("prefill at %d: %v", off, err)
		}
	}
	if err := ns.Flush(); err != nil {
		b.Fatalf("prefill flush: %v", err)
	}
	got := make([]byte, benchBlock)
	if _, err := ns.ReadAt(got, 0); err != nil {
		b.Fatal(err)
	}
	if !slices.Equal(got, first) {
		b.Fatal("block 0 does not read back what the prefill wrote")
	}
}

// prefillData is the n bytes prefill wrote at byte off (within one
// chunk).
func prefillData(off uint64, n int) []byte {
	chunk := make([]byte, prefillChunk)
	fillRandom(chunk, off&^(prefillChunk-1))
	at := int(off % prefillChunk)
	return chunk[at : at+n]
}

func fillRandom(p []byte, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x626c6b))
	for i := 0; i+8 <= len(p); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8; j++ {
			p[i+j] = byte(v >> (8 * j))
		}
	}
}

// result is what measure found.
type result struct {
	iops     float64
	counters map[string]uint64 // the server's counters over the run
	final    map[string]uint64 // and as they stood at its end (gauges)
}

// measure runs a warm-up, then b.N I/Os of bc through submit, with the
// server srv's counters and CPU time read around the timed part, and
// reports the metrics common to both variants. Completions reach the
// loop in cur.
func measure(b *testing.B, bc benchCase, srv *childTarget, cur *atomic.Pointer[ioLoop], submit func(slot int, lba uint64) error) result {
	b.SetBytes(int64(bc.size))
	b.ReportAllocs()
	seed := benchSeed(b)
	warm := newIOLoop(benchWarmup+bc.depth, bc.depth, bc.lbas(seed, benchWarmup+bc.depth), submit)
	cur.Store(warm)
	if err := warm.run(srv.exited); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	n := b.N
	l := newIOLoop(n, bc.depth, bc.lbas(seed, n), submit)
	cur.Store(l)
	// Two reads of the counters: their difference is what one read costs
	// the server (its allocations), taken off the run's.
	s0 := srv.counters(b)
	s1 := srv.counters(b)
	tgt0, host0 := srv.cpu(), benchbook.ProcCPU(os.Getpid())
	b.ResetTimer()
	err := l.run(srv.exited)
	b.StopTimer()
	tgt1, host1 := srv.cpu(), benchbook.ProcCPU(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	s2 := srv.counters(b)

	r := result{iops: float64(n) / b.Elapsed().Seconds(), counters: make(map[string]uint64), final: s2}
	for k, v := range s2 {
		r.counters[k] = v - s1[k]
	}
	perOp := func(v uint64) float64 { return float64(v) / float64(n) }
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	mean, p99 := l.latency()
	b.ReportMetric(r.iops, "IOPS")
	b.ReportMetric(us(mean), "mean-us")
	b.ReportMetric(us(p99), "p99-us")
	b.ReportMetric(us(tgt1-tgt0)/float64(n), "tgt-cpu-us/op")
	b.ReportMetric(us(host1-host0)/float64(n), "host-cpu-us/op")
	statsAllocs := s1["mallocs"] - s0["mallocs"]
	b.ReportMetric(perOp(max(r.counters["mallocs"], statsAllocs)-statsAllocs), "tgt-allocs/op")
	if notes := r.counters["notifications"]; notes > 0 {
		b.ReportMetric(float64(r.counters["completions"])/float64(notes), "tgt-comps/notify")
	}
	if _, tcp := r.counters["r2ts"]; tcp {
		b.ReportMetric(perOp(r.counters["r2ts"]), "r2ts/op")
		b.ReportMetric(perOp(r.counters["copies"]), "staging-copies/op")
	} else {
		b.ReportMetric(perOp(r.counters["rdmareads"]), "rdma-reads/op")
		b.ReportMetric(perOp(r.counters["rdmawrites"]), "rdma-writes/op")
	}
	b.ReportMetric(perOp(r.counters["incapsule"]), "in-capsule/op")
	if c := r.counters["groupcommits"]; c > 0 {
		b.ReportMetric(float64(r.counters["groupedwrites"])/float64(c), "writes/commit")
	}
	return r
}

// ioLoop keeps depth I/Os in flight until n have completed: it submits
// the first depth, and each completion (on a transport goroutine) records
// its latency and submits the next I/O on the same slot. Everything it
// touches per I/O is preallocated.
type ioLoop struct {
	n      int64
	depth  int
	submit func(slot int, lba uint64) error
	lbas   []uint64 // of each I/O, in submission order
	start  []int64  // per slot: submission time of its I/O (ns since benchEpoch)
	last   []int64  // per slot: the index in lbas of its last I/O, -1 for none
	lat    []int64  // per I/O, in completion order (ns)

	// issued counts I/Os handed to a slot, done completions (each takes
	// the next index of lat), recorded latencies written (the last one
	// finishes the run, so every write to lat precedes the read of it).
	issued, done, recorded atomic.Int64
	failed                 atomic.Bool
	fin                    chan struct{}
	once                   sync.Once
	err                    error // set before fin closes
}

var benchEpoch = time.Now()

func mono() int64 { return int64(time.Since(benchEpoch)) }

func newIOLoop(n, depth int, lbas []uint64, submit func(int, uint64) error) *ioLoop {
	l := &ioLoop{n: int64(n), depth: depth, submit: submit, lbas: lbas,
		start: make([]int64, depth), last: make([]int64, depth), lat: make([]int64, n), fin: make(chan struct{})}
	for i := range l.last {
		l.last[i] = -1
	}
	return l
}

// lastLBA is the block of slot's last I/O, once the loop has finished.
func (l *ioLoop) lastLBA(slot int) (uint64, bool) {
	if i := l.last[slot]; i >= 0 {
		return l.lbas[i], true
	}
	return 0, false
}

// run submits the first I/Os and waits until every I/O completed, one
// failed, or abort (the server process exited) closed.
func (l *ioLoop) run(abort <-chan struct{}) error {
	k := min(int64(l.depth), l.n)
	l.issued.Store(k)
	for slot := 0; slot < int(k); slot++ {
		l.start[slot] = mono()
		l.last[slot] = int64(slot)
		if err := l.submit(slot, l.lbas[slot]); err != nil {
			l.finish(fmt.Errorf("submit I/O %d (block %d): %w", slot, l.lbas[slot], err))
			break
		}
	}
	select {
	case <-l.fin:
	case <-abort:
		l.finish(fmt.Errorf("server process exited with %d of %d I/Os done", l.done.Load(), l.n))
	}
	return l.err
}

func (l *ioLoop) finish(err error) {
	l.once.Do(func() {
		l.err = err
		if err != nil {
			l.failed.Store(true)
		}
		close(l.fin)
	})
}

// complete is the completion of the I/O on slot (slot -1: a failure not
// tied to one).
func (l *ioLoop) complete(slot int, err error) {
	now := mono()
	if err != nil {
		l.finish(fmt.Errorf("I/O on slot %d failed: %w", slot, err))
		return
	}
	d := l.done.Add(1)
	if d > l.n {
		l.finish(fmt.Errorf("%d completions for %d I/Os", d, l.n))
		return
	}
	l.lat[d-1] = now - l.start[slot]
	if l.recorded.Add(1) == l.n {
		l.finish(nil)
		return
	}
	i := l.issued.Add(1) - 1
	if i >= l.n || l.failed.Load() {
		return
	}
	l.start[slot] = mono()
	l.last[slot] = i
	if err := l.submit(slot, l.lbas[i]); err != nil {
		l.finish(fmt.Errorf("submit I/O %d (block %d): %w", i, l.lbas[i], err))
	}
}

// latency is the mean and 99th percentile (nearest rank) of the
// recorded latencies; it sorts them.
func (l *ioLoop) latency() (mean, p99 time.Duration) {
	return benchbook.Latency(l.lat[:l.done.Load()])
}

// bareResults keeps every bare run of this process, per case, for the
// x-bare of the nvme runs: their median IOPS (benchbook.Book.Median
// leaves out the shorter runs the framework makes first to size b.N).
// The benchmark framework runs "bare" -count times, then "nvme", then
// "nvme-tcp".
var bareResults benchbook.Book

// rdmaResults keeps the nvme (NVMe/RDMA) runs, per case, for the x-rdma
// of the nvme-tcp runs, in the same way.
var rdmaResults benchbook.Book

// queueResults keeps the one-queue runs of BenchmarkQueues, per variant
// and case, for x-1queue, in the same way.
var queueResults benchbook.Book

// BenchmarkStoreDisk is the asynchronous disk path on the RDMA binding
// (issue 22): the child target's store volume served through a StoreIO
// (an io_uring per engine core, reaped through the core's poll set) —
// "async" — against the same target with the cores' poller hook off, so
// that the StoreIO serves every I/O inline on the core's notification
// goroutine as it did before — "sync", the baseline, run first. Random
// 4 KiB reads and writes at QD 1 and 32 on one queue, and 16 KiB writes
// at QD 32 (too large for the capsule: fetched by RDMA READ into an
// aligned data buffer). An overwrite goes straight to the disk from the
// core; a first write (a cluster to allocate) goes to the StoreIO's
// workers; the writes run over a volume written once before (prefill),
// so they are overwrites, as the table measures them. A 4 KiB
// write arrives in the capsule, its data on a page of its own (the
// receive buffers are split): it goes to the disk from there
// (capsule-copies/op 0). At QD 1, "async-nospin" is async with the
// cores' disk spin off (rdma.WithDiskSpin): the core sleeps on its
// io_uring's eventfd as soon as it has submitted, so the difference is
// what the spin buys and costs (latency, tgt-cpu-us/op, poll-wakes/op).
//
//	go test -run '^$' -bench BenchmarkStoreDisk -benchtime 3000x -count 3 ./target/rdma/
//
// Metrics besides measure's: x-sync (IOPS ÷ the sync run's of the same
// case in this process), disk-peak (the most I/Os one core had at the
// disk at once), direct/op (disk I/Os through the core's engine per I/O),
// deferred/op (I/Os served by the StoreIO's workers), capsule-copies/op
// and poll-wakes/op (times a core's poll set woke its goroutine).
func BenchmarkStoreDisk(b *testing.B) {
	for _, bc := range []benchCase{
		{name: "store-randread-4k-qd1", size: 4 << 10, depth: 1},
		{name: "store-randread-4k-qd32", size: 4 << 10, depth: 32},
		{name: "store-randwrite-4k-qd1", write: true, size: 4 << 10, depth: 1},
		{name: "store-randwrite-4k-qd32", write: true, size: 4 << 10, depth: 32},
		{name: "store-randwrite-16k-qd32", write: true, size: 16 << 10, depth: 32},
	} {
		disks := []string{"sync", "async"}
		if bc.depth == 1 {
			disks = append(disks, "async-nospin")
		}
		for _, disk := range disks {
			bc := bc
			bc.disk = disk
			var env []string
			switch disk {
			case "sync":
				env = append(env, childSyncDiskEnv+"=1")
			case "async-nospin":
				env = append(env, childDiskSpinEnv+"=0")
			}
			b.Run(bc.name+"/"+disk, func(b *testing.B) { benchNVMe(b, bc, initiator.TransportRDMA, env...) })
		}
	}
}

// syncDiskResults holds BenchmarkStoreDisk's sync runs (x-sync).
var syncDiskResults benchbook.Book

// reportDisk reports BenchmarkStoreDisk's metrics of run r.
func reportDisk(b *testing.B, bc benchCase, r result) {
	perOp := func(v uint64) float64 { return float64(v) / float64(b.N) }
	b.ReportMetric(float64(r.final["diskpeak"]), "disk-peak")
	b.ReportMetric(perOp(r.counters["storedirect"]), "direct/op")
	b.ReportMetric(perOp(r.counters["storedeferred"]), "deferred/op")
	b.ReportMetric(perOp(r.counters["capsulecopies"]), "capsule-copies/op")
	b.ReportMetric(perOp(r.counters["pollwakes"]), "poll-wakes/op")
	if bc.disk == "sync" {
		syncDiskResults.Record(bc.name, b.N, r.iops)
		return
	}
	if base, ok := syncDiskResults.Median(bc.name); ok {
		b.ReportMetric(r.iops/base, "x-sync")
	}
}
