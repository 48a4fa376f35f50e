package rdma_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/internal/benchbook"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport"
)

// BenchmarkConnectedQPs is what connected queues cost the target: 1 and
// 1,000 connected I/O QPs on one target (in a child process, as the other
// end-to-end benchmarks), each case with the target sized for exactly the
// QPs it serves. The first I/O queue belongs to a "probe" host of that one
// queue, the others to hosts of scaleQueuesPerHost queues. Two patterns,
// 4 KiB random reads at a total depth of 32 (measure's metrics):
//
//	probe    every I/O on the probe host's one queue: what the other QPs
//	         cost by being connected (the same I/O in both cases)
//	spread   slot i on host i mod the hosts, each host's commands round
//	         robin over its queues: 32 I/Os over ~32 of the 1,000 QPs, what
//	         spreading the same work over many queues costs (1,000 QPs
//	         only: with one QP it is probe)
//
// and for each
//
//	x-1qp              IOPS ÷ the IOPS of probe with 1 QP in this run
//	connected-qps      I/O QPs the target accepted and holds (its
//	                   accepts, less the admin queues)
//	queue-entries      the per-QP depth the target promises (MQES+1), the
//	                   deepest the adapter's CQ and SRQ limits allow at
//	                   this many QPs per core (scaleQueueEntries); every
//	                   host asks for exactly it
//	srq-recv-bytes     receive-buffer memory of the engine's shared SRQs,
//	                   as the running port sized them (Port.Sizing: cores
//	                   × Engine.Buffers × Engine.BufferSize)
//	perqp-recv-bytes   what a receive queue per I/O QP would need for the
//	                   same per-QP depth: connected I/O QPs × queue
//	                   entries × Engine.BufferSize (one receive per queue
//	                   entry, the promise an SRQ that may never run dry
//	                   keeps too)
//	x-perqp-recv       srq-recv-bytes ÷ perqp-recv-bytes (issue 13 aims at
//	                   ≤ 0.1 for 1,000 QPs)
//	admin-recv-bytes   the admin queues' private receives (the same under
//	                   both schemes, counted in neither)
//	tgt-rss-MiB        the target process's resident memory after setup
//
// Before the timed parts every I/O queue of every host writes one seeded
// random 4 KiB block and reads it back (the initiator's round robin puts
// consecutive blocking commands on consecutive queues), and the data
// read must equal the data written; after each, the reads are checked
// against the prefill (verifyNVMe).
//
// Each connection is a TCP connection on loopback with both ends in this
// machine: 1,000 QPs take about 1,000 descriptors in each process. The
// soft limit is raised towards the hard one if it is lower
// (raiseFileLimit); if the hard limit is too low the case is scaled down,
// and says so. The setup (connecting every queue) is done once per case,
// for both patterns and every run the framework makes of them.
func BenchmarkConnectedQPs(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprintf("qps=%d", n), func(b *testing.B) {
			if p := os.Getenv(benchProviderEnv); n > scaleQueuesPerHost && p != "" && p != "soft" {
				// Not tried on a device: 1,000 QPs register ~0.5 GiB
				// between the two ends (e2e's guests have 2 GiB).
				b.Skipf("%d QPs are measured on the soft provider only (%s=%s)", n, benchProviderEnv, p)
			}
			// This level runs once; the fixture ends with it.
			f := newScaleFixture(b, n)
			b.Run("probe", func(b *testing.B) { f.run(b, false) })
			if len(f.ctrls) > 1 {
				b.Run("spread", func(b *testing.B) { f.run(b, true) })
			}
		})
	}
}

const (
	// scaleQueuesPerHost is the I/O queues of each host (controller) but
	// the probe: 1,000 QPs are 11 hosts connecting at once, each with its
	// admin queue, so the setup takes about a tenth of connecting one
	// host's 1,000 queues one after the other.
	scaleQueuesPerHost = 100
	// scaleCores is the target's engine cores, fixed so that the figures
	// do not depend on the machine's processors.
	scaleCores = 2
	// scaleDepth is the I/Os in flight in the timed part, over all hosts.
	scaleDepth = 32
)

// scaleResults keeps the probe runs with one QP, for x-1qp.
var scaleResults benchbook.Book

type scaleFixture struct {
	n        int // I/O QPs asked for
	srv      *childTarget
	ctrls    []*initiator.Controller
	nss      []*initiator.Namespace
	entries  int // per-QP depth
	ioQPs    int // I/O queues granted, over all hosts
	sizes    map[string]uint64
	rssBytes uint64
	cur      atomic.Pointer[ioLoop]
	slots    []nvmeSlot
	bufs     []byte
}

func newScaleFixture(tb testing.TB, n int) *scaleFixture {
	tb.Helper()
	n = raiseFileLimit(tb, n)
	// The probe host's one queue, then hosts of scaleQueuesPerHost.
	queues := []int{1}
	for left := n - 1; left > 0; left -= scaleQueuesPerHost {
		queues = append(queues, min(left, scaleQueuesPerHost))
	}
	hosts := len(queues)
	total := n + hosts // with the admin queues
	qpsPerCore := uint32((total + scaleCores - 1) / scaleCores)
	a := benchAdapter(tb)
	entries := scaleQueueEntries(tb, a.Info(), qpsPerCore)
	f := &scaleFixture{n: n, entries: int(entries)}
	f.srv = startChild(tb, append([]string{"BLK_TEST_TARGET_DIR=" + tb.TempDir(), "BLK_TEST_TARGET_ADDR=" + benchListenAddr(),
		childCoresEnv + "=" + strconv.Itoa(scaleCores),
		childQPsPerCoreEnv + "=" + strconv.Itoa(int(qpsPerCore)),
		childQueueEntriesEnv + "=" + strconv.Itoa(int(entries))}, benchChildEnv()...)...)

	// The hosts connect at once; each asks for its share of the queues,
	// of exactly the target's depth, with 4 KiB slots (every I/O here is
	// 4 KiB: the initiator registers depth × MaxTransfer per queue).
	f.ctrls = make([]*initiator.Controller, hosts)
	errs := make([]error, hosts)
	var wg sync.WaitGroup
	for h, q := range queues {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.ctrls[h], errs[h] = connectScaleHost(tb, a, f.srv.addr, q, int(entries))
		}()
	}
	wg.Wait()
	for h, err := range errs {
		if err != nil {
			tb.Fatalf("host %d: %v", h, err)
		}
	}
	for _, c := range f.ctrls {
		info := c.Info()
		if info.QueueDepth != int(entries) {
			tb.Fatalf("host %#x: queues of %d entries, asked for %d", info.CNTLID, info.QueueDepth, entries)
		}
		f.ioQPs += info.IOQueues
		ns := c.Namespace(1)
		if ns == nil || ns.BlockSize() != benchBlock {
			tb.Fatalf("host %#x: no namespace 1 of %d-byte blocks", info.CNTLID, benchBlock)
		}
		f.nss = append(f.nss, ns)
	}
	if f.ioQPs != n {
		tb.Fatalf("%d I/O queues granted over %d hosts, asked for %d", f.ioQPs, hosts, n)
	}
	f.sizes = f.srv.counters(tb)
	if acc, rej := f.sizes["accepts"], f.sizes["rejects"]; acc != uint64(total) || rej != 0 {
		tb.Fatalf("target accepted %d connections and rejected %d; want %d accepted (%d I/O + %d admin)", acc, rej, total, n, hosts)
	}
	f.rssBytes = procRSS(f.srv.cmd.Process.Pid)
	f.checkEveryQueue(tb)
	prefill(tb, f.nss[0])

	f.slots = make([]nvmeSlot, scaleDepth)
	for i := range f.slots {
		f.slots[i] = nvmeSlot{cur: &f.cur, slot: i}
	}
	f.bufs = make([]byte, scaleDepth*benchBlock)
	return f
}

// connectScaleHost connects one host of queues I/O queues of entries
// entries each, closed when tb ends.
func connectScaleHost(tb testing.TB, a transport.Adapter, addr string, queues, entries int) (*initiator.Controller, error) {
	c, err := connectHostErr(addr, initiator.Config{Adapter: a, HostNQN: testHostNQN,
		Queues: queues, QueueDepth: entries, MaxTransfer: benchBlock})
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { c.Close() })
	return c, nil
}

// checkEveryQueue writes one seeded random block through each I/O queue
// of each host and reads it back. The blocking calls go one at a time,
// and the initiator's round robin (acquireIO) starts each at the queue
// after the last one's, so a host's k-th write and k-th read land on its
// k-th queue in turn. The hosts run at once, each on its own blocks.
func (f *scaleFixture) checkEveryQueue(tb testing.TB) {
	tb.Helper()
	seed := benchSeed(tb)
	errs := make([]error, len(f.ctrls))
	var wg sync.WaitGroup
	next := uint64(0)
	for h, c := range f.ctrls {
		queues := c.Info().IOQueues
		first := next
		next += uint64(queues)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ns := f.nss[h]
			rng := rand.New(rand.NewPCG(seed, uint64(h)))
			data := make([]byte, queues*benchBlock)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			for q := range queues {
				if _, err := ns.WriteAt(data[q*benchBlock:(q+1)*benchBlock], int64(first+uint64(q))*benchBlock); err != nil {
					errs[h] = fmt.Errorf("write through queue %d of %d: %w", q+1, queues, err)
					return
				}
			}
			got := make([]byte, benchBlock)
			for q := range queues {
				if _, err := ns.ReadAt(got, int64(first+uint64(q))*benchBlock); err != nil {
					errs[h] = fmt.Errorf("read through queue %d of %d: %w", q+1, queues, err)
					return
				}
				if want := data[q*benchBlock : (q+1)*benchBlock]; !bytes.Equal(got, want) {
					errs[h] = fmt.Errorf("block %d (queue %d of %d) reads back different data from byte %d", first+uint64(q), q+1, queues, firstDiff(got, want))
					return
				}
			}
		}()
	}
	wg.Wait()
	for h, err := range errs {
		if err != nil {
			tb.Fatalf("host %d of %d: %v", h, len(f.ctrls), err)
		}
	}
}

// run is one run of the framework: 4 KiB random reads at a total depth of
// scaleDepth, all through the probe host, or (spread) slot i through host
// i mod the hosts; then the memory figures.
func (f *scaleFixture) run(b *testing.B, spread bool) {
	sz := func(k string) uint64 {
		v, ok := f.sizes[k]
		if !ok {
			b.Fatalf("the child target reported no %q", k)
		}
		return v
	}
	recvBuf := sz("recvbufsize")
	srq := sz("cores") * sz("srqbuffers") * recvBuf
	perQP := uint64(f.ioQPs) * sz("queueentries") * recvBuf
	if sz("queueentries") != uint64(f.entries) {
		b.Fatalf("the target promises %d entries per queue, the fixture sized %d", sz("queueentries"), f.entries)
	}

	pattern := "probe"
	if spread {
		pattern = "spread"
	}
	bc := benchCase{name: fmt.Sprintf("randread-4k-qd%d-%dqps-%s", scaleDepth, f.n, pattern), size: benchBlock, depth: scaleDepth}
	buf := func(slot int) []byte { return f.bufs[slot*benchBlock : (slot+1)*benchBlock] }
	submit := func(slot int, lba uint64) error {
		ns := f.nss[0]
		if spread {
			ns = f.nss[slot%len(f.nss)]
		}
		return ns.ReadAsync(lba, buf(slot), &f.slots[slot])
	}
	r := measure(b, bc, f.srv, &f.cur, submit)
	// After measure: its ResetTimer drops metrics reported before.
	if f.n == 1 && !spread {
		scaleResults.Record("probe", b.N, r.iops)
	}
	if one, ok := scaleResults.Median("probe"); ok {
		b.ReportMetric(r.iops/one, "x-1qp")
	} else {
		b.Logf("no probe run with 1 QP in this process: x-1qp not reported")
	}
	b.ReportMetric(float64(f.ioQPs), "connected-qps")
	b.ReportMetric(float64(f.entries), "queue-entries")
	b.ReportMetric(float64(srq), "srq-recv-bytes")
	b.ReportMetric(float64(perQP), "perqp-recv-bytes")
	b.ReportMetric(float64(srq)/float64(perQP), "x-perqp-recv")
	b.ReportMetric(float64(uint64(len(f.ctrls))*sz("adminentries")*sz("adminbufsize")), "admin-recv-bytes")
	b.ReportMetric(float64(f.rssBytes)/(1<<20), "tgt-rss-MiB")
	for _, c := range f.ctrls {
		if st := c.Stats(); st.Failures != 0 || st.QueueFull != 0 {
			b.Fatalf("initiator: %d association failures, %d submissions refused as queue full", st.Failures, st.QueueFull)
		}
	}
	verifyNVMe(b, bc, f.nss[0], f.cur.Load(), f.bufs)
}

// scaleQueueEntries is the deepest queue, a power of two from the target's
// default down, that a port of scaleCores cores and qpsPerCore QPs per core
// can hold on an adapter reporting info (rdma.Size: every QP's receives
// must fit the SRQ and every completion the CQ). At 506 QPs per core on
// the soft provider that is 64: the CQ of Buffers + QPsPerCore × 4 ×
// entries must stay within its 2^18 entries.
func scaleQueueEntries(tb testing.TB, info transport.AdapterInfo, qpsPerCore uint32) uint32 {
	tb.Helper()
	for e := uint32(rdma.DefaultQueueEntries); e >= 2; e /= 2 {
		if _, err := rdma.Size(info, rdma.Config{Cores: scaleCores, QPsPerCore: qpsPerCore, QueueEntries: e}); err == nil {
			return e
		}
	}
	_, err := rdma.Size(info, rdma.Config{Cores: scaleCores, QPsPerCore: qpsPerCore, QueueEntries: 2})
	tb.Fatalf("no queue depth fits %d QPs per core: %v", qpsPerCore, err)
	return 0
}

// raiseFileLimit makes room for n connections in this process and in the
// child (which inherits the limit): it raises the soft limit on open
// files towards the hard one when needed, and returns how many
// connections fit, n or fewer (logged).
func raiseFileLimit(tb testing.TB, n int) int {
	tb.Helper()
	// Per connection one socket (a host's in this process, the target's
	// in the child), plus the admin queues' and a margin for everything
	// else (pebble's files, the runtime's, the pipes).
	const margin = 256
	need := uint64(n + n/scaleQueuesPerHost + 1 + margin)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		tb.Logf("getrlimit: %v; assuming %d connections fit", err, n)
		return n
	}
	if lim.Cur >= need {
		return n
	}
	raised := lim
	raised.Cur = min(need, lim.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
		tb.Logf("setrlimit %d: %v", raised.Cur, err)
		raised = lim
	} else {
		tb.Logf("open files: soft limit raised from %d to %d", lim.Cur, raised.Cur)
	}
	if raised.Cur >= need {
		return n
	}
	fit := int(raised.Cur) - margin - 1
	fit -= fit / (scaleQueuesPerHost + 1)
	if fit < 1 {
		tb.Fatalf("open files limited to %d: no room for connections", raised.Cur)
	}
	tb.Logf("open files limited to %d (hard %d): scaled down from %d to %d connected QPs", raised.Cur, lim.Max, n, fit)
	return fit
}

// procRSS is a process's resident memory, from /proc/<pid>/status (0
// where there is none).
func procRSS(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
