package repl

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// logReporter confirms every report at once and keeps them.
type logReporter struct {
	mu      sync.Mutex
	reports []report
}

func (l *logReporter) ReplicaFailed(_ context.Context, node string, epoch uint64, reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reports = append(l.reports, report{node: node, epoch: epoch, reason: reason})
	return nil
}

func (l *logReporter) all() []report {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reports)
}

// barrierRig is a Backend at epoch 5 over an inline memory replica and
// two remote legs (node-b, node-c) whose commands complete on goroutines
// of their own after a few yields.
type barrierRig struct {
	b     *Backend
	local *fakeLocal
	legs  []*fakeLeg
	rep   *logReporter
}

func newBarrierRig(t testing.TB, depth int) *barrierRig {
	t.Helper()
	g := &barrierRig{local: newFakeLocal(t, true, nil), rep: &logReporter{}}
	b, err := New(Config{Local: g.local, Reporter: g.rep, Epoch: 5, Depth: depth, HoldTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g.b = b
	var peers []Peer
	for i := range 2 {
		l := newFakeLeg(t, nil)
		l.async = func(c cmd) error {
			for range int(c.lba*7+c.blocks) % 5 {
				runtime.Gosched()
			}
			return nil
		}
		g.legs = append(g.legs, l)
		peers = append(peers, Peer{Node: "node-" + string(rune('b'+i)), NS: l})
	}
	if err := b.SetPeers(5, peers); err != nil {
		t.Fatal(err)
	}
	return g
}

func (g *barrierRig) submit(op target.IOOp, lba, blocks uint64, data []byte) *hostIO {
	h := newHostIO(op, lba, blocks, data, false)
	g.b.Submit(&h.io)
	return h
}

// heldNow is the IOs the barrier holds, in arrival order.
func (b *Backend) heldNow() []*target.IO {
	b.gateMu.Lock()
	defer b.gateMu.Unlock()
	return slices.Clone(b.held)
}

// recordsInUse counts the records carrying a host I/O.
func (b *Backend) recordsInUse() int {
	n := 0
	for i := range b.recs {
		if b.recs[i].uses.Load()&1 != 0 {
			n++
		}
	}
	b.overMu.Lock()
	defer b.overMu.Unlock()
	return n + len(b.over)
}

func (f *fakeLeg) inFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.busy
}

// Barrier writers: writer w owns blocks [w*span, (w+1)*span) and issues
// one I/O at a time; every block a write carries is stamped with its
// writer and op number, so a store's content names the op that wrote it.
const (
	barrierWriters = 4
	barrierSpan    = 8
)

// barrierOp is one I/O of a writer.
type barrierOp struct {
	op     target.IOOp
	lba    uint64 // in the writer's span
	blocks uint64
	data   []byte
	io     *target.IO
}

// barrierWriter is one writer's ops, the last one outstanding until done
// says so.
type barrierWriter struct {
	mu   sync.Mutex
	ops  []barrierOp
	done int // ops completed
}

// state is the writer's span after its first k ops.
func (w *barrierWriter) state(k int) []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := make([]byte, barrierSpan*testBlock)
	for _, o := range w.ops[:k] {
		switch o.op {
		case target.OpWrite:
			copy(s[o.lba*testBlock:], o.data)
		case target.OpWriteZeroes, target.OpDeallocate:
			clear(s[o.lba*testBlock : (o.lba+o.blocks)*testBlock])
		}
	}
	return s
}

// span reads writer w's blocks of a memory replica.
func span(t testing.TB, mem *target.MemBackend, w int) []byte {
	t.Helper()
	buf := make([]byte, barrierSpan*testBlock)
	if err := mem.Read(uint64(w*barrierSpan), buf); err != nil {
		t.Fatal(err)
	}
	return buf
}

// runBarrierWriters starts the writers; stop ends them and returns how
// many I/Os failed.
func runBarrierWriters(t *testing.T, seed uint64, b *Backend) ([]*barrierWriter, func() int) {
	ws := make([]*barrierWriter, barrierWriters)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	var failed sync.Map
	for w := range ws {
		ws[w] = &barrierWriter{}
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			bw := ws[w]
			for k := 0; ; k++ {
				select {
				case <-quit:
					return
				default:
				}
				o := barrierOp{lba: r.Uint64N(barrierSpan)}
				o.blocks = 1 + r.Uint64N(min(3, barrierSpan-o.lba))
				switch x := r.IntN(10); {
				case x < 6:
					o.op = target.OpWrite
					o.data = make([]byte, o.blocks*testBlock)
					for i := range o.blocks {
						blk := o.data[i*testBlock : (i+1)*testBlock]
						copy(blk, pattern(testBlock, byte(r.Uint32())))
						binary.LittleEndian.PutUint32(blk, uint32(w))
						binary.LittleEndian.PutUint32(blk[4:], uint32(k))
					}
				case x < 8:
					o.op = target.OpWriteZeroes
				case x < 9:
					o.op = target.OpDeallocate
				default:
					o.op, o.lba, o.blocks = target.OpFlush, 0, 0
				}
				h := newHostIO(o.op, 0, o.blocks, o.data, false)
				h.io.LBA = uint64(w*barrierSpan) + o.lba
				if o.op == target.OpFlush {
					h.io.LBA = 0
				}
				o.io = &h.io
				bw.mu.Lock()
				bw.ops = append(bw.ops, o)
				bw.mu.Unlock()
				b.Submit(&h.io)
				if err := h.wait(t); err != nil {
					failed.Store(w, err)
					return
				}
				bw.mu.Lock()
				bw.done++
				bw.mu.Unlock()
			}
		}()
	}
	var once sync.Once
	n := 0
	return ws, func() int {
		once.Do(func() {
			close(quit)
			wg.Wait()
			failed.Range(func(k, v any) bool {
				t.Errorf("writer %v: %v", k, v)
				n++
				return true
			})
		})
		return n
	}
}

// poll waits up to 10 s for cond; false if it never held (for
// goroutines other than the test's, which may not call t.Fatal).
func poll(cond func() bool) bool {
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(50 * time.Microsecond)
	}
	return true
}

// TestBarrier: four writers issue seeded random writes, write zeroes,
// deallocates and flushes, one at a time each, over a primary with two
// remote legs completing out of order, while barriers are taken back to
// back. At each barrier's fn: nothing is in flight on any leg and no
// record is in use; every writer's next I/O is held (fn waits for it);
// and every store (the local replica, each in-sync leg) holds exactly
// the writer's ops before the held one, none of the held ones. After
// each barrier the held writes reach every leg in arrival order and
// complete. In one round fn leaves node-c out of took: it is reported
// out of sync (reason naming the snapshot), confirmed before Barrier
// returns, and gets none of the released writes. With Depth 2 the
// records and the held FIFO overflow (counted). No host I/O fails; in
// the end the local replica and node-b hold what the writers wrote.
func TestBarrier(t *testing.T) {
	for _, depth := range []int{16, 2} {
		t.Run("depth"+string(rune('0'+depth/10))+string(rune('0'+depth%10)), func(t *testing.T) { testBarrier(t, depth) })
	}
}

func testBarrier(t *testing.T, depth int) {
	seed := testSeed(t)
	const rounds = 6
	drop := 1 + int(seed%(rounds-2)) // the round whose fn leaves node-c out
	g := newBarrierRig(t, depth)
	ws, stop := runBarrierWriters(t, seed, g.b)
	defer stop()
	inSync := []string{"node-b", "node-c"}
	for round := range rounds {
		var (
			held  []*target.IO
			marks []int // each leg's commands before the release
		)
		d, err := g.b.Barrier(context.Background(), func(got []string) ([]string, error) {
			if !slices.Equal(got, inSync) {
				return nil, errors.New("in sync: " + strings.Join(got, ","))
			}
			// At once: the writes in flight at the gate have landed on
			// every leg, the same on each.
			for i, l := range g.legs {
				if n := l.inFlight(); n != 0 {
					t.Errorf("round %d: leg %d has %d commands in flight at fn", round, i, n)
				}
			}
			for w := range ws {
				local := span(t, g.local.mem, w)
				for i := range inSync {
					if !bytes.Equal(span(t, g.legs[i].mem, w), local) {
						t.Errorf("round %d: writer %d: %s differs from the local replica at fn", round, w, inSync[i])
					}
				}
			}
			// Then every writer is stuck on a held I/O (a holding Submit
			// gives its record back just after it queued the IO).
			if !poll(func() bool { return len(g.b.heldNow()) == barrierWriters && g.b.recordsInUse() == 0 }) {
				return nil, errors.New("the writers' next I/Os were not all held")
			}
			held = g.b.heldNow()
			for _, l := range g.legs {
				marks = append(marks, len(l.received()))
			}
			for w, bw := range ws {
				bw.mu.Lock()
				k := len(bw.ops) - 1
				out, done := bw.ops[k].io, bw.done
				bw.mu.Unlock()
				if !slices.Contains(held, out) || done != k {
					t.Errorf("round %d: writer %d's op %d (of %d done) is not held", round, w, k, done)
					continue
				}
				want := bw.state(k)
				if got := span(t, g.local.mem, w); !bytes.Equal(got, want) {
					t.Errorf("round %d: writer %d: the local replica does not hold exactly its first %d ops", round, w, k)
				}
				for i := range inSync {
					if got := span(t, g.legs[i].mem, w); !bytes.Equal(got, want) {
						t.Errorf("round %d: writer %d: %s does not hold exactly its first %d ops", round, w, inSync[i], k)
					}
				}
			}
			if round == drop {
				return got[:1], nil
			}
			return got, nil
		})
		if err != nil || d <= 0 {
			t.Fatalf("round %d: barrier: %v (held %v)", round, err, d)
		}
		if round == drop {
			r := g.rep.all()
			if len(r) != 1 || r[0].node != "node-c" || r[0].epoch != 5 || !strings.Contains(r[0].reason, "did not take the snapshot") {
				t.Fatalf("reports %+v", r)
			}
			if st := g.b.Stats(); st.Peers[1].State != "out-of-sync" || st.Peers[0].State != "in-sync" {
				t.Fatalf("peers after node-c missed the snapshot: %+v", st.Peers)
			}
			if n := len(g.legs[1].received()); n != marks[1] {
				t.Fatalf("node-c received %d commands after it missed the snapshot", n-marks[1])
			}
			inSync = inSync[:1]
		}
		// The held writes reach every leg still in sync in arrival order.
		for i := range inSync {
			pos := -1
			for _, io := range held {
				if io.Op != target.OpWrite {
					continue
				}
				at := slices.IndexFunc(g.legs[i].received()[marks[i]:], func(c cmd) bool {
					return c.op == target.OpWrite && c.lba == io.LBA && bytes.Equal(c.data, io.Data)
				})
				if at < 0 || at < pos {
					t.Fatalf("round %d: %s: held write at LBA %d sent at %d, after one sent at %d, or never", round, inSync[i], io.LBA, at, pos)
				}
				pos = at
			}
		}
	}
	if n := stop(); n != 0 {
		t.Fatalf("%d writers saw an I/O fail", n)
	}
	for i := range g.legs {
		g.legs[i].wg.Wait()
	}
	for w, bw := range ws {
		want := bw.state(len(bw.ops))
		if !bytes.Equal(span(t, g.local.mem, w), want) || !bytes.Equal(span(t, g.legs[0].mem, w), want) {
			t.Fatalf("writer %d: the stores do not hold what it wrote", w)
		}
	}
	st := g.b.Stats()
	if st.Barriers != rounds || st.HeldIOs != rounds*barrierWriters || (depth < barrierWriters) != (st.HeldOverflows > 0) ||
		(depth < barrierWriters) != (st.Overflows > 0) {
		t.Fatalf("stats %+v", st)
	}
}

// TestBarrierTimeout: a write whose leg does not complete keeps the
// barrier from draining: when its context ends, the barrier returns
// ErrBarrierTimeout (wrapping the context's error) without running fn,
// and the write and the flush held meanwhile go to every leg, in that
// order; all complete once the legs do. A read meanwhile is served. No
// replica is dropped.
func TestBarrierTimeout(t *testing.T) {
	g := newRig(t, 2, Config{})
	h1 := g.write(5, 1, false)
	res := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := g.b.Barrier(ctx, func([]string) ([]string, error) {
			return nil, errors.New("fn ran")
		})
		res <- err
	}()
	until(t, "the gate", g.b.gated.Load)
	h2 := g.write(6, 2, false)
	h3 := newHostIO(target.OpFlush, 0, 0, nil, false)
	g.b.Submit(&h3.io)
	if len(g.local.pending()) != 1 || len(g.legs[0].pending()) != 1 || len(g.legs[1].pending()) != 1 || h2.isDone() || h3.isDone() {
		t.Fatal("a write or flush submitted while gated was not held")
	}
	rd := newHostIO(target.OpRead, 6, 1, make([]byte, testBlock), false)
	g.b.Submit(&rd.io)
	if p := g.local.pending(); len(p) != 2 || p[1].Op != target.OpRead {
		t.Fatal("a read submitted while gated did not reach the local replica")
	}
	g.local.complete(t, 1, nil)
	if err := rd.wait(t); err != nil {
		t.Fatal(err)
	}
	err := <-res
	if !errors.Is(err, ErrBarrierTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("barrier: %v", err)
	}
	for _, l := range g.legs {
		if p := l.pending(); len(p) != 3 || p[1].op != target.OpWrite || p[1].lba != 6 || p[2].op != target.OpFlush {
			t.Fatalf("after the release a leg has %d commands: the held write and flush were not released in order", len(p))
		}
	}
	if len(g.local.pending()) != 3 {
		t.Fatal("the held write and flush did not reach the local replica")
	}
	for len(g.local.pending()) > 0 {
		g.local.complete(t, 0, nil)
	}
	g.legs[0].completeAll(t)
	g.legs[1].completeAll(t)
	for _, h := range []*hostIO{h1, h2, h3} {
		if err := h.wait(t); err != nil {
			t.Fatal(err)
		}
	}
	if st := g.b.Stats(); st.Peers[0].State != "in-sync" || st.Peers[1].State != "in-sync" || st.HeldIOs != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestBarrierSlowFn: an fn that does not return within the context
// does not keep writes held: the barrier releases them and returns
// ErrBarrierTimeout while fn still runs; a second barrier meanwhile
// waits for the first's fn and gives up with its own context; once fn
// returns a third one goes through.
func TestBarrierSlowFn(t *testing.T) {
	g := newBarrierRig(t, 16)
	entered, unblock := make(chan struct{}), make(chan struct{})
	res := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := g.b.Barrier(ctx, func(in []string) ([]string, error) {
			close(entered)
			<-unblock
			return in, nil
		})
		res <- err
	}()
	<-entered
	h := g.submit(target.OpWrite, 3, 1, pattern(testBlock, 3))
	if err := <-res; !errors.Is(err, ErrBarrierTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("barrier: %v", err)
	}
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := g.b.Barrier(ctx, func(in []string) ([]string, error) { return in, nil }); !errors.Is(err, ErrBarrierTimeout) ||
		!strings.Contains(err.Error(), "another barrier") {
		t.Fatalf("second barrier: %v", err)
	}
	close(unblock)
	if _, err := g.b.Barrier(context.Background(), func(in []string) ([]string, error) { return in, nil }); err != nil {
		t.Fatal(err)
	}
	if st := g.b.Stats(); st.Peers[0].State != "in-sync" || st.Peers[1].State != "in-sync" || st.Barriers != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// refuseReporter refuses every report (no quorum).
type refuseReporter struct{}

func (refuseReporter) ReplicaFailed(context.Context, string, uint64, string) error {
	return errors.New("no quorum")
}

// TestBarrierErrors: the refusals and failures of a barrier, each with
// its error, none leaving a write held.
func TestBarrierErrors(t *testing.T) {
	in := func(in []string) ([]string, error) { return in, nil }
	t.Run("no fn", func(t *testing.T) {
		g := newBarrierRig(t, 4)
		if _, err := g.b.Barrier(context.Background(), nil); !errors.Is(err, ErrInvalid) {
			t.Fatal(err)
		}
	})
	t.Run("not serving", func(t *testing.T) {
		g := newBarrierRig(t, 4)
		g.b.SetServing(false)
		if _, err := g.b.Barrier(context.Background(), in); !errors.Is(err, ErrNotServing) {
			t.Fatal(err)
		}
	})
	t.Run("fn fails", func(t *testing.T) {
		// The snapshot is abandoned whole: nobody dropped, the held
		// write released.
		g := newBarrierRig(t, 4)
		var h *hostIO
		boom := errors.New("local snapshot failed")
		_, err := g.b.Barrier(context.Background(), func([]string) ([]string, error) {
			h = g.submit(target.OpWrite, 1, 1, pattern(testBlock, 1))
			return nil, boom
		})
		if !errors.Is(err, boom) {
			t.Fatal(err)
		}
		if err := h.wait(t); err != nil {
			t.Fatal(err)
		}
		if st := g.b.Stats(); st.Peers[0].State != "in-sync" || st.Peers[1].State != "in-sync" || len(g.rep.all()) != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("took a stranger", func(t *testing.T) {
		g := newBarrierRig(t, 4)
		_, err := g.b.Barrier(context.Background(), func(in []string) ([]string, error) { return append(in, "node-x"), nil })
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "node-x") {
			t.Fatal(err)
		}
		if st := g.b.Stats(); st.Peers[0].State != "in-sync" || st.Peers[1].State != "in-sync" {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("fenced while held", func(t *testing.T) {
		// The held write fails with the path status as soon as the
		// backend stops serving, while fn still runs.
		g := newBarrierRig(t, 4)
		var status nvme.Status
		_, err := g.b.Barrier(context.Background(), func(in []string) ([]string, error) {
			h := g.submit(target.OpWrite, 1, 1, pattern(testBlock, 1))
			g.b.SetServing(false)
			select {
			case err := <-h.done:
				status = statusOf(err)
			case <-time.After(10 * time.Second):
			}
			return in, nil
		})
		if err != nil || status != nvme.StatusANAInaccessible {
			t.Fatalf("barrier %v; held write's status %v", err, status)
		}
	})
	t.Run("rebuild started during fn", func(t *testing.T) {
		// Refused: the barrier looked for a rebuild to end already.
		g := newBarrierRig(t, 4)
		var err error
		if _, berr := g.b.Barrier(context.Background(), func(in []string) ([]string, error) {
			_, err = g.b.StartRebuild(5, RebuildConfig{Node: "node-r", NS: newFakeLeg(t, nil), Mapped: g.local.mapped, Read: g.local.read,
				Promote: func(context.Context) error { return nil }})
			return in, nil
		}); berr != nil {
			t.Fatal(berr)
		}
		if !errors.Is(err, ErrRebuildBusy) || !strings.Contains(err.Error(), "barrier") {
			t.Fatalf("rebuild during a barrier: %v", err)
		}
	})
	t.Run("report refused", func(t *testing.T) {
		// A replica left out of took whose report the registry refuses:
		// the backend stops serving and the barrier fails.
		g := newBarrierRig(t, 4)
		g.b.rep = refuseReporter{}
		var h *hostIO
		_, err := g.b.Barrier(context.Background(), func(in []string) ([]string, error) {
			h = g.submit(target.OpWrite, 1, 1, pattern(testBlock, 1))
			return in[:1], nil
		})
		if !errors.Is(err, ErrUnconfirmed) || !strings.Contains(err.Error(), "node-c") {
			t.Fatal(err)
		}
		if err := h.wait(t); statusOf(err) != nvme.StatusANAInaccessible {
			t.Fatalf("held write: %v", err)
		}
		if g.b.Serving() {
			t.Fatal("still serving")
		}
	})
}

// TestBarrierRebuild: a barrier during a rebuild whose window holds a
// host write's leg: the rebuild ends (ErrRebuildSnapshot), the held
// leg is dropped rather than sent to the replica, the write completes,
// and fn runs with no record in use and no rebuilding replica among the
// in-sync ones. A write held by the barrier never reaches the replica.
// A rebuild started again afterwards brings the replica in sync.
func TestBarrierRebuild(t *testing.T) {
	g := newRebuildRig(t)
	rb := g.startWritten(t, 4)
	until(t, "the copy", func() bool { return waiting(g.leg, target.OpWrite, 0) >= 0 })
	h := g.submit(target.OpWrite, 1, 1, pattern(testBlock, 2))
	if h.isDone() || waiting(g.leg, target.OpWrite, 1) >= 0 {
		t.Fatal("the host's write to the window was not held on it")
	}
	var h2 *hostIO
	var inUse int
	_, err := g.b.Barrier(context.Background(), func(in []string) ([]string, error) {
		inUse = g.b.recordsInUse()
		h2 = g.submit(target.OpWrite, 2, 1, pattern(testBlock, 3))
		if len(in) != 0 {
			return nil, errors.New("in sync: " + strings.Join(in, ","))
		}
		return in, nil
	})
	if err != nil || inUse != 0 {
		t.Fatalf("barrier: %v; %d records in use at fn", err, inUse)
	}
	if err := waitRebuild(t, rb); !errors.Is(err, ErrRebuildSnapshot) {
		t.Fatalf("rebuild: %v", err)
	}
	for _, h := range []*hostIO{h, h2} {
		if err := h.wait(t); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range g.leg.received() {
		if c.op == target.OpWrite && (c.lba == 1 || c.lba == 2) {
			t.Fatalf("a write at LBA %d reached the replica after its rebuild ended", c.lba)
		}
	}
	if st := g.b.Stats(); len(st.Peers) != 1 || st.Peers[0].State != "rebuild-failed" {
		t.Fatalf("peers %+v", st.Peers)
	}
	g.leg.completeAll(t) // the old copy's commands, never waited for
	cfg := g.config()
	cfg.MaxTransfer = 4 * testBlock
	rb, err = g.b.StartRebuild(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := drive(t, g.leg, rb); err != nil {
		t.Fatal(err)
	}
	sameStores(t, g.local, g.leg)
}
