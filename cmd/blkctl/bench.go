package main

import (
	"errors"
	"fmt"
	"github.com/blk-project/blk/api"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/urfave/cli/v2"
)

// maxSamples bounds the preallocated latency slice of a timed run; I/Os
// beyond it are counted but their latency is not sampled.
const maxSamples = 4 << 20

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure a volume's IOPS, throughput and latency through the initiator",
		UsageText: "blkctl bench VOLUME --host-nqn NQN [--rw randread|randwrite|read|write|caw] [--bs 4KiB] [--qd 32] [--time 10s | --ios N]\n\n" +
			"Attaches the host (if it is not attached), connects over NVMe-oF (NVMe/TCP when the node serves it, or --transport rdma\n" +
			"over --rdma-provider, soft-iWARP by default), keeps --qd I/Os\n" +
			"in flight, and detaches at the end if it attached. Writes overwrite the volume's data. caw sends fused Compare and\n" +
			"Write pairs at random blocks, comparing with zeros and writing zeros (on a fresh volume each writes; elsewhere they\n" +
			"miscompare, counted), --qd pairs in flight. --zero-data makes writes write zeros, so that caw compares equal on a\n" +
			"volume written so before (what a caw run against randwrite on the same volume needs).",
		Flags: append(append(providerFlags(), authFlags()...),
			&cli.StringFlag{Name: "host-nqn", Usage: "NQN of the host to connect as (must be allowed on the volume)"},
			&cli.StringFlag{Name: "rw", Value: "randread", Usage: "pattern: randread, randwrite, read, write or caw (Compare and Write)"},
			&cli.StringFlag{Name: "bs", Value: "4KiB", Usage: "I/O size, a multiple of the volume's block size"},
			&cli.IntFlag{Name: "qd", Value: 32, Usage: "queue depth: I/Os kept in flight (1-256)"},
			&cli.DurationFlag{Name: "time", Value: 10 * time.Second, Usage: "run this long (unless --ios ends it first)"},
			&cli.Int64Flag{Name: "ios", Usage: "run this many I/Os (then --time only bounds the run if set explicitly)"},
			&cli.BoolFlag{Name: "zero-data", Usage: "writes write zeros instead of random bytes (caw then compares equal on the blocks they wrote)"},
			&cli.BoolFlag{Name: "progress", Usage: "show the progress bar even when stderr is not a terminal"},
		),
		Action: benchAction,
	}
}

// benchResult is what bench prints.
type benchResult struct {
	Volume    string  `json:"volume"`
	RW        string  `json:"rw"`
	BS        uint64  `json:"bs"`
	QD        int     `json:"qd"`
	IOs       int64   `json:"ios"`
	Seconds   float64 `json:"seconds"`
	IOPS      float64 `json:"iops"`
	MBps      float64 `json:"mb_per_s"`
	LatMeanUS float64 `json:"lat_mean_us"`
	LatP50US  float64 `json:"lat_p50_us"`
	LatP99US  float64 `json:"lat_p99_us"`
	LatMaxUS  float64 `json:"lat_max_us"`
	// Miscompares are the caw pairs whose blocks were not zeros (counted
	// in IOs: they compared, and wrote nothing).
	Miscompares int64 `json:"miscompares,omitempty"`
}

type bench struct {
	ns       *initiator.Namespace
	write    bool
	random   bool
	caw      bool // fused Compare and Write pairs (zeros against zeros)
	bsBlocks uint64
	slots    uint64 // I/O-sized positions on the namespace
	limit    int64  // I/Os to issue; 0: until the deadline
	deadline time.Time

	issued  atomic.Int64
	done    atomic.Int64
	miscmp  atomic.Int64
	seq     atomic.Uint64
	lat     []time.Duration // preallocated; index by done-1
	stop    atomic.Bool
	errOnce sync.Once
	err     error
	retry   chan *benchSlot // submissions refused with ErrQueueFull
	wg      sync.WaitGroup
}

type benchSlot struct {
	b     *bench
	buf   []byte
	zero  []byte // caw: the compare data and the write data
	rng   *rand.Rand
	start time.Time
	lba   uint64
}

func (b *bench) fail(err error) {
	b.errOnce.Do(func() { b.err = err })
	b.stop.Store(true)
}

// next issues the slot's next I/O, or retires the slot when the run is
// over. It runs from the callbacks and must not block.
func (b *bench) next(s *benchSlot) {
	if b.stop.Load() || (b.limit > 0 && b.issued.Add(1) > b.limit) || (!b.deadline.IsZero() && time.Now().After(b.deadline)) {
		b.wg.Done()
		return
	}
	if b.random {
		s.lba = s.rng.Uint64N(b.slots) * b.bsBlocks
	} else {
		s.lba = (b.seq.Add(1) - 1) % b.slots * b.bsBlocks
	}
	b.submit(s)
}

func (b *bench) submit(s *benchSlot) {
	s.start = time.Now()
	var err error
	switch {
	case b.caw:
		err = b.ns.CompareAndWriteAsync(s.lba, s.zero, s.zero, 0, s)
	case b.write:
		err = b.ns.WriteAsync(s.lba, s.buf, 0, s)
	default:
		err = b.ns.ReadAsync(s.lba, s.buf, s)
	}
	switch {
	case err == nil:
	case errors.Is(err, initiator.ErrQueueFull):
		b.retry <- s // buffered for every slot: never blocks
	default:
		b.fail(fmt.Errorf("submit at LBA %d: %v", s.lba, err))
		b.wg.Done()
	}
}

// IODone implements initiator.Callback.
func (s *benchSlot) IODone(err error) {
	b := s.b
	d := time.Since(s.start)
	if b.caw && initiator.IsCompareFailure(err) {
		b.miscmp.Add(1)
		err = nil
	}
	if err != nil {
		b.fail(fmt.Errorf("I/O at LBA %d: %v", s.lba, err))
		b.wg.Done()
		return
	}
	if i := b.done.Add(1) - 1; i < int64(len(b.lat)) {
		b.lat[i] = d
	}
	b.next(s)
}

func benchAction(c *cli.Context) error {
	a, err := args(c, "volume")
	if err != nil {
		return err
	}
	host, err := hostNQNFlag(c)
	if err != nil {
		return err
	}
	rw := c.String("rw")
	if !slices.Contains([]string{"randread", "randwrite", "read", "write", "caw"}, rw) {
		return usageErrorf("--rw %q: use randread, randwrite, read, write or caw", rw)
	}
	bs, err := api.ParseSize(c.String("bs"))
	if err != nil || bs == 0 {
		return usageErrorf("--bs %q: use an I/O size like 4KiB or 128KiB", c.String("bs"))
	}
	qd := c.Int("qd")
	if qd < 1 || qd > 256 {
		return usageErrorf("--qd %d: use a queue depth from 1 to 256", qd)
	}
	ios := c.Int64("ios")
	if ios < 0 {
		return usageErrorf("--ios %d: use a positive number of I/Os", ios)
	}
	dur := c.Duration("time")
	if dur <= 0 {
		return usageErrorf("--time %v: use a positive duration like 10s", dur)
	}
	if ios > 0 && !c.IsSet("time") {
		dur = 0
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	vol := a[0]

	at, attached, err := e.attachOrFind(vol, host)
	if err != nil {
		return err
	}
	if at, err = chooseEndpoint(c, at); err != nil {
		if attached {
			e.detach(vol, host)
		}
		return err
	}
	res, err := runBench(e, c, vol, host, at, rw, bs, qd, ios, dur)
	if attached {
		if derr := e.detach(vol, host); derr != nil && err == nil {
			err = fmt.Errorf("detach after the run: %v", derr)
		}
	}
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(res)
	}
	fmt.Fprintf(e.stdout, "%s %s qd=%d on %s: %d I/Os in %.2f s\n", rw, api.HumanSize(bs), qd, vol, res.IOs, res.Seconds)
	rows := [][2]string{
		{"IOPS", fmt.Sprintf("%.0f", res.IOPS)},
		{"Throughput", fmt.Sprintf("%.2f MB/s", res.MBps)},
		{"Latency mean", fmt.Sprintf("%.1f µs", res.LatMeanUS)},
		{"Latency p50", fmt.Sprintf("%.1f µs", res.LatP50US)},
		{"Latency p99", fmt.Sprintf("%.1f µs", res.LatP99US)},
		{"Latency max", fmt.Sprintf("%.1f µs", res.LatMaxUS)},
	}
	if rw == "caw" {
		rows = append(rows, [2]string{"Miscompares", fmt.Sprint(res.Miscompares)})
	}
	return e.keyValues(rows)
}

func runBench(e *env, c *cli.Context, vol, host string, at attachment, rw string, bs uint64, qd int, ios int64, dur time.Duration) (benchResult, error) {
	zeroData := c.Bool("zero-data")
	depth := max(2*qd, 32)
	closeAll, ctrl, ns, err := connect(c, at, host, initiator.Config{Queues: 1, QueueDepth: min(depth, 256)})
	if err != nil {
		return benchResult{}, err
	}
	defer closeAll()

	lbs := uint64(ns.BlockSize())
	if bs%lbs != 0 {
		return benchResult{}, usageErrorf("--bs %s: not a multiple of the volume's block size %d", api.HumanSize(bs), lbs)
	}
	if mt := ctrl.Info().MaxTransfer; mt > 0 && bs > uint64(mt) {
		return benchResult{}, usageErrorf("--bs %s: above the largest transfer %s the controller takes", api.HumanSize(bs), api.HumanSize(uint64(mt)))
	}
	if bs > uint64(ns.Size()) {
		return benchResult{}, usageErrorf("--bs %s: larger than the volume (%s)", api.HumanSize(bs), api.HumanSize(uint64(ns.Size())))
	}
	b := &bench{
		ns: ns, write: strings.HasSuffix(rw, "write"), random: strings.HasPrefix(rw, "rand") || rw == "caw", caw: rw == "caw",
		bsBlocks: bs / lbs, slots: uint64(ns.Size()) / bs, limit: ios,
		retry: make(chan *benchSlot, qd),
	}
	n := ios
	if n == 0 || n > maxSamples {
		n = maxSamples
	}
	b.lat = make([]time.Duration, n)
	slots := make([]*benchSlot, qd)
	seed := uint64(time.Now().UnixNano())
	for i := range slots {
		s := &benchSlot{b: b, buf: make([]byte, bs), rng: rand.New(rand.NewPCG(seed, uint64(i)))}
		if b.caw {
			s.zero = make([]byte, bs)
		}
		for j := 0; j+8 <= len(s.buf) && !zeroData; j += 8 {
			v := s.rng.Uint64()
			for k := range 8 {
				s.buf[j+k] = byte(v >> (8 * k))
			}
		}
		slots[i] = s
	}

	showProgress := c.Bool("progress") || isTerminal(os.Stderr)
	start := time.Now()
	if dur > 0 {
		b.deadline = start.Add(dur)
	}
	b.wg.Add(qd)
	for _, s := range slots {
		b.next(s)
	}
	finished := make(chan struct{})
	go func() { b.wg.Wait(); close(finished) }()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	retry := time.NewTimer(time.Hour)
	// SIGINT/SIGTERM end the run early: the I/Os in flight complete, the
	// results so far are printed, and an attachment made here is removed.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
loop:
	for {
		select {
		case <-finished:
			break loop
		case <-sig:
			b.stop.Store(true)
		case s := <-b.retry:
			// Wait a moment for a slot, then resubmit from here.
			retry.Reset(50 * time.Microsecond)
			<-retry.C
			b.submit(s)
		case <-tick.C:
			if showProgress {
				progress(e.stderr, start, dur, ios, b.done.Load())
			}
		}
	}
	elapsed := time.Since(start)
	if showProgress {
		progress(e.stderr, start, dur, ios, b.done.Load())
		fmt.Fprintln(e.stderr)
	}
	if b.err != nil {
		return benchResult{}, fmt.Errorf("bench %s: %v", vol, b.err)
	}
	done := b.done.Load()
	if done == 0 {
		return benchResult{}, fmt.Errorf("bench %s: no I/O completed", vol)
	}
	lat := b.lat[:min(done, int64(len(b.lat)))]
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	pct := func(p float64) time.Duration { return lat[min(int(p*float64(len(lat))), len(lat)-1)] }
	sec := elapsed.Seconds()
	return benchResult{
		Volume: vol, RW: rw, BS: bs, QD: qd, IOs: done, Seconds: sec,
		IOPS: float64(done) / sec, MBps: float64(done) * float64(bs) / sec / 1e6,
		LatMeanUS: us(sum / time.Duration(len(lat))), LatP50US: us(pct(0.50)), LatP99US: us(pct(0.99)), LatMaxUS: us(lat[len(lat)-1]),
		Miscompares: b.miscmp.Load(),
	}, nil
}

// progress draws a one-line bar: by I/O count with --ios, else by time.
func progress(w io.Writer, start time.Time, dur time.Duration, ios, done int64) {
	el := time.Since(start)
	frac := 0.0
	switch {
	case ios > 0:
		frac = float64(done) / float64(ios)
	case dur > 0:
		frac = float64(el) / float64(dur)
	}
	frac = min(max(frac, 0), 1)
	const width = 30
	fill := int(frac * width)
	iops := 0.0
	if s := el.Seconds(); s > 0 {
		iops = float64(done) / s
	}
	fmt.Fprintf(w, "\r[%s%s] %3.0f%% %d I/Os %.0f IOPS ", strings.Repeat("#", fill), strings.Repeat(" ", width-fill), frac*100, done, iops)
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
