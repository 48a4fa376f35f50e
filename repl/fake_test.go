package repl

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

const (
	testBlock  = 4096
	testBlocks = 1024
)

// testSeed is REPL_SEED or the time, logged so a failure replays.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("REPL_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("REPL_SEED: %v", err)
		}
		seed = v
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (REPL_SEED=%d replays it)", seed, seed)
		}
	})
	return seed
}

// seq orders the submissions of a test across the fakes.
type seq struct{ n atomic.Int64 }

// fakeLocal is a local backend whose IOs wait until the test completes
// them (manual), or complete inside Submit on a memory backend (inline).
type fakeLocal struct {
	mem    *target.MemBackend
	inline bool
	seq    *seq
	fail   error // inline: every write fails with it
	noop   bool  // IOs succeed without touching mem
	mu     sync.Mutex
	q      []*target.IO
	at     []int64 // seq number of each queued IO
	ops    atomic.Int64
	// alloc, if set (trackAlloc), says which blocks are allocated, as a
	// store's map would: written, or zeroed; deallocated ones are not.
	amu   sync.Mutex
	alloc []bool
}

// trackAlloc makes the fake keep an allocation map (mapped, read).
func (f *fakeLocal) trackAlloc() { f.alloc = make([]bool, testBlocks) }

// setAlloc marks n blocks at lba allocated or not.
func (f *fakeLocal) setAlloc(lba, n uint64, on bool) {
	if f.alloc == nil {
		return
	}
	f.amu.Lock()
	for b := lba; b < lba+n && b < uint64(len(f.alloc)); b++ {
		f.alloc[b] = on
	}
	f.amu.Unlock()
}

// mapped is (*store.Volume).Mapped over the allocation map: runs of
// allocated blocks in [from, to), fn called without the lock.
func (f *fakeLocal) mapped(from, to uint64, fn func(lba, blocks uint64) error) error {
	f.amu.Lock()
	var runs [][2]uint64
	for b := from; b < min(to, uint64(len(f.alloc))); b++ {
		if !f.alloc[b] {
			continue
		}
		if k := len(runs); k > 0 && runs[k-1][0]+runs[k-1][1] == b {
			runs[k-1][1]++
		} else {
			runs = append(runs, [2]uint64{b, 1})
		}
	}
	f.amu.Unlock()
	for _, r := range runs {
		if err := fn(r[0], r[1]); err != nil {
			return err
		}
	}
	return nil
}

// read is the store's blocking read of the local replica.
func (f *fakeLocal) read(lba uint64, buf []byte) error { return f.mem.Read(lba, buf) }

func newFakeLocal(t testing.TB, inline bool, sq *seq) *fakeLocal {
	t.Helper()
	mem, err := target.NewMemBackend(testBlock, testBlocks)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeLocal{mem: mem, inline: inline, seq: sq}
}

func (f *fakeLocal) Geometry() (target.Geometry, error) { return f.mem.Geometry() }
func (f *fakeLocal) Blocking() bool                     { return false }
func (f *fakeLocal) NewWriteGroup() target.WriteGroup   { return nil }

func (f *fakeLocal) Submit(io *target.IO) {
	f.ops.Add(1)
	if f.inline {
		if f.fail != nil && io.Op != target.OpRead {
			io.Done(f.fail)
			return
		}
		io.Done(f.do(io))
		return
	}
	f.mu.Lock()
	f.q = append(f.q, io)
	if f.seq != nil {
		f.at = append(f.at, f.seq.n.Add(1))
	}
	f.mu.Unlock()
}

func (f *fakeLocal) do(io *target.IO) error {
	if f.noop {
		return nil
	}
	switch io.Op {
	case target.OpRead:
		return f.mem.Read(io.LBA, io.Data)
	case target.OpWrite:
		f.setAlloc(io.LBA, uint64(len(io.Data)/testBlock), true)
		return f.mem.Write(io.LBA, io.Data, io.FUA)
	case target.OpWriteZeroes:
		f.setAlloc(io.LBA, io.Blocks, true)
		return f.mem.WriteZeroes(io.LBA, io.Blocks, io.FUA)
	case target.OpDeallocate:
		err := f.mem.Deallocate(io.LBA, io.Blocks)
		f.setAlloc(io.LBA, io.Blocks, false)
		return err
	case target.OpFlush:
		return f.mem.Flush()
	}
	return errors.New("bad op")
}

// pending returns the IOs waiting (manual mode).
func (f *fakeLocal) pending() []*target.IO {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*target.IO(nil), f.q...)
}

// complete applies and completes the i-th waiting IO with err (nil: its
// effect on the memory backend).
func (f *fakeLocal) complete(t testing.TB, i int, err error) {
	t.Helper()
	f.mu.Lock()
	if i >= len(f.q) {
		f.mu.Unlock()
		t.Fatalf("local: no IO %d waiting (%d)", i, len(f.q))
	}
	io := f.q[i]
	f.q = append(f.q[:i], f.q[i+1:]...)
	f.mu.Unlock()
	if err == nil {
		err = f.do(io)
	}
	io.Done(err)
}

// cmd is one command a fakeLeg received.
type cmd struct {
	op     target.IOOp
	lba    uint64
	blocks uint64
	data   []byte
	fua    bool
	cb     initiator.Callback
	at     int64
}

// fakeLeg is a remote replica: commands wait until the test completes
// them (manual), complete inside the submit (instant), or complete on
// goroutines of their own after done decides (async).
type fakeLeg struct {
	mem       *target.MemBackend
	instant   bool
	async     func(c cmd) error // async mode: the command's outcome, on its own goroutine
	seq       *seq
	submitErr error // every submit returns it
	noop      bool  // commands succeed without touching mem
	// slots > 0 limits the commands in flight, as a replica connection's
	// queues do: a submit beyond it returns initiator.ErrQueueFull; a
	// slot is free before its callback runs (initiator/queue.go finish).
	slots int
	// nolog: manual mode keeping no log and no copy of the data (the
	// allocation test).
	nolog bool
	busy  int // commands in flight
	full  int // submits refused with ErrQueueFull
	mu    sync.Mutex
	q     []cmd
	log   []cmd // every command received (not in instant mode)
	wg    sync.WaitGroup
}

func newFakeLeg(t testing.TB, sq *seq) *fakeLeg {
	t.Helper()
	mem, err := target.NewMemBackend(testBlock, testBlocks)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeLeg{mem: mem, seq: sq}
}

func (f *fakeLeg) submit(c cmd) error {
	if f.submitErr != nil {
		return f.submitErr
	}
	if f.instant {
		c.cb.IODone(nil) // nothing kept: the allocation test
		return nil
	}
	if c.data != nil && !f.nolog {
		c.data = append([]byte(nil), c.data...) // the initiator copies too
	}
	if f.seq != nil {
		c.at = f.seq.n.Add(1)
	}
	f.mu.Lock()
	if f.slots > 0 && f.busy >= f.slots {
		f.full++
		f.mu.Unlock()
		return initiator.ErrQueueFull
	}
	f.busy++
	if !f.nolog {
		f.log = append(f.log, c)
	}
	if f.async == nil {
		f.q = append(f.q, c)
		f.mu.Unlock()
		return nil
	}
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		err := f.async(c)
		if err == nil {
			err = f.apply(c)
		}
		f.mu.Lock()
		f.busy--
		f.mu.Unlock()
		c.cb.IODone(err)
	}()
	return nil
}

func (f *fakeLeg) apply(c cmd) error {
	if f.noop {
		return nil
	}
	switch c.op {
	case target.OpWrite:
		return f.mem.Write(c.lba, c.data, c.fua)
	case target.OpWriteZeroes:
		return f.mem.WriteZeroes(c.lba, c.blocks, c.fua)
	case target.OpDeallocate:
		return f.mem.Deallocate(c.lba, c.blocks)
	}
	return nil
}

func (f *fakeLeg) WriteAsync(lba uint64, buf []byte, flags initiator.IOFlags, cb initiator.Callback) error {
	return f.submit(cmd{op: target.OpWrite, lba: lba, blocks: uint64(len(buf) / testBlock), data: buf, fua: flags&initiator.FUA != 0, cb: cb})
}

func (f *fakeLeg) WriteZeroesAsync(lba uint64, blocks uint32, cb initiator.Callback) error {
	return f.submit(cmd{op: target.OpWriteZeroes, lba: lba, blocks: uint64(blocks), cb: cb})
}

func (f *fakeLeg) DeallocateAsync(ranges []initiator.Range, cb initiator.Callback) error {
	if len(ranges) != 1 {
		return errors.New("fake leg: one range per deallocate expected")
	}
	return f.submit(cmd{op: target.OpDeallocate, lba: ranges[0].LBA, blocks: uint64(ranges[0].Blocks), cb: cb})
}

func (f *fakeLeg) FlushAsync(cb initiator.Callback) error {
	return f.submit(cmd{op: target.OpFlush, cb: cb})
}

func (f *fakeLeg) pending() []cmd {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cmd(nil), f.q...)
}

func (f *fakeLeg) received() []cmd {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cmd(nil), f.log...)
}

// complete completes the i-th waiting command with err (nil: applied).
func (f *fakeLeg) complete(t testing.TB, i int, err error) {
	t.Helper()
	f.mu.Lock()
	if i >= len(f.q) {
		f.mu.Unlock()
		t.Fatalf("leg: no command %d waiting (%d)", i, len(f.q))
	}
	c := f.q[i]
	f.q = append(f.q[:i], f.q[i+1:]...)
	f.busy--
	f.mu.Unlock()
	if err == nil {
		err = f.apply(c)
	}
	c.cb.IODone(err)
}

// refused is the submits refused with ErrQueueFull so far.
func (f *fakeLeg) refused() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.full
}

// completeAll completes every waiting command successfully.
func (f *fakeLeg) completeAll(t testing.TB) {
	t.Helper()
	for len(f.pending()) > 0 {
		f.complete(t, 0, nil)
	}
}

// report is one call of a fakeReporter.
type report struct {
	node   string
	epoch  uint64
	reason string
	ctx    context.Context
	answer chan error
}

// fakeReporter hands every report to the test, which answers it.
type fakeReporter struct {
	calls chan report
	n     atomic.Int64
}

func newFakeReporter() *fakeReporter { return &fakeReporter{calls: make(chan report, 16)} }

func (f *fakeReporter) ReplicaFailed(ctx context.Context, node string, epoch uint64, reason string) error {
	f.n.Add(1)
	r := report{node: node, epoch: epoch, reason: reason, ctx: ctx, answer: make(chan error, 1)}
	f.calls <- r
	return <-r.answer // ignores ctx: the backend's own bound must hold
}

// next waits for the next report.
func (f *fakeReporter) next(t testing.TB) report {
	t.Helper()
	select {
	case r := <-f.calls:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no report within 10 s")
		return report{}
	}
}

// okReporter confirms every report at once.
type okReporter struct{ n atomic.Int64 }

func (o *okReporter) ReplicaFailed(context.Context, string, uint64, string) error {
	o.n.Add(1)
	return nil
}

// hostIO is a host I/O as the core would submit it, completing into a
// channel.
type hostIO struct {
	io   target.IO
	done chan error
}

func newHostIO(op target.IOOp, lba, blocks uint64, data []byte, fua bool) *hostIO {
	h := &hostIO{done: make(chan error, 1)}
	h.io.Op, h.io.LBA, h.io.Blocks, h.io.Data, h.io.FUA = op, lba, blocks, data, fua
	h.io.SetComplete(func(_ *target.IO, err error) { h.done <- err })
	return h
}

func (h *hostIO) isDone() bool { return len(h.done) > 0 }

// wait waits for the host I/O's completion.
func (h *hostIO) wait(t testing.TB) error {
	t.Helper()
	select {
	case err := <-h.done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("host I/O not completed within 10 s")
		return nil
	}
}

// statusOf is the NVMe status the core would answer err with.
func statusOf(err error) nvme.Status {
	if err == nil {
		return nvme.StatusSuccess
	}
	var se target.StatusError
	if errors.As(err, &se) {
		return se.NVMeStatus()
	}
	return nvme.StatusInternalError.WithDNR()
}

func pattern(n int, b byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = b + byte(i*7)
	}
	return p
}
