package repl

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/target"
)

// rebuildRig is a Backend over an inline local replica with an
// allocation map, no peers, at epoch 3, and the replica to rebuild.
type rebuildRig struct {
	local    *fakeLocal
	b        *Backend
	leg      *fakeLeg
	promoted atomic.Int32
}

func newRebuildRig(t testing.TB) *rebuildRig {
	t.Helper()
	g := &rebuildRig{local: newFakeLocal(t, true, nil), leg: newFakeLeg(t, nil)}
	g.local.trackAlloc()
	b, err := New(Config{Local: g.local, Reporter: &okReporter{}, Epoch: 3, Depth: 16})
	if err != nil {
		t.Fatal(err)
	}
	g.b = b
	return g
}

// config is a rebuild of g.leg: regions of 4 blocks, writes of 2.
func (g *rebuildRig) config() RebuildConfig {
	return RebuildConfig{Node: "node-r", NS: g.leg, MaxTransfer: 2 * testBlock, RegionBytes: 4 * testBlock,
		Mapped: g.local.mapped, Read: g.local.read,
		Promote: func(context.Context) error { g.promoted.Add(1); return nil }}
}

// startWritten writes the first n blocks of the local replica only
// (pattern 1) and starts the rebuild, a window's copy one write of 4
// blocks.
func (g *rebuildRig) startWritten(t testing.TB, n uint64) *Rebuild {
	t.Helper()
	for lba := range n {
		g.localWrite(t, lba, pattern(testBlock, 1))
	}
	cfg := g.config()
	cfg.MaxTransfer = 4 * testBlock
	rb, err := g.b.StartRebuild(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rb
}

// localWrite puts data at lba on the local replica only (written before
// the rebuild: the replica lacks it).
func (g *rebuildRig) localWrite(t testing.TB, lba uint64, data []byte) {
	t.Helper()
	var io target.IO
	io.Op, io.LBA, io.Data = target.OpWrite, lba, data
	if err := g.local.do(&io); err != nil {
		t.Fatal(err)
	}
}

func (g *rebuildRig) submit(op target.IOOp, lba, blocks uint64, data []byte) *hostIO {
	h := newHostIO(op, lba, blocks, data, false)
	g.b.Submit(&h.io)
	return h
}

func waitRebuild(t testing.TB, r *Rebuild) error {
	t.Helper()
	select {
	case <-r.Done():
		return r.Err()
	case <-time.After(20 * time.Second):
		t.Fatal("rebuild not done within 20 s")
		return nil
	}
}

// sameStores fails unless the local replica and the leg's hold the same
// bytes everywhere.
func sameStores(t testing.TB, local *fakeLocal, leg *fakeLeg) {
	t.Helper()
	a, b := make([]byte, testBlock), make([]byte, testBlock)
	for lba := uint64(0); lba < testBlocks; lba++ {
		if err := local.mem.Read(lba, a); err != nil {
			t.Fatal(err)
		}
		if err := leg.mem.Read(lba, b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("block %d differs: local %x…, replica %x…", lba, a[:8], b[:8])
		}
	}
}

// drive completes the replica's commands until the rebuild ends.
func drive(t testing.TB, leg *fakeLeg, rb *Rebuild) error {
	t.Helper()
	end := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-rb.Done():
			return rb.Err()
		default:
		}
		if time.Now().After(end) {
			t.Fatal("rebuild not done within 20 s")
		}
		if len(leg.pending()) > 0 {
			leg.complete(t, 0, nil)
		} else {
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// waiting is the index of the leg's first waiting command op at lba,
// or -1.
func waiting(leg *fakeLeg, op target.IOOp, lba uint64) int {
	for i, c := range leg.pending() {
		if c.op == op && c.lba == lba {
			return i
		}
	}
	return -1
}

// until polls cond (the copier is a goroutine of its own) for 10 s.
func until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestRebuildRandom: a replica holding stale bytes (where the primary
// has data and where it has holes) is rebuilt while four writers issue
// seeded random writes, write zeroes and deallocates (each on its own
// blocks), and an in-sync replica takes them too; the legs complete on
// goroutines of their own, out of order. The rebuild ends in sync, the
// registry asked once; no host I/O fails; after the writers stop the
// rebuilt replica holds exactly the primary's bytes, block for block.
func TestRebuildRandom(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	for round := range 4 {
		g := newRebuildRig(t)
		delay := func(c cmd) error {
			for range int(c.lba*7+c.blocks) % 5 {
				runtime.Gosched()
			}
			return nil
		}
		g.leg.async = delay
		insync := newFakeLeg(t, nil)
		insync.async = delay
		if err := g.b.SetPeers(3, []Peer{{Node: "node-s", NS: insync}}); err != nil {
			t.Fatal(err)
		}
		for range 300 {
			lba := rng.Uint64N(testBlocks)
			data := pattern(testBlock, byte(rng.Uint32()))
			switch rng.IntN(3) {
			case 0:
				g.localWrite(t, lba, data)
				_ = insync.mem.Write(lba, data, false)
			case 1:
				_ = g.leg.mem.Write(lba, data, false) // stale on the replica
			default:
				g.localWrite(t, lba, data)
				_ = insync.mem.Write(lba, data, false)
				_ = g.leg.mem.Write(lba, pattern(testBlock, byte(rng.Uint32())), false)
			}
		}
		cfg := g.config()
		if round%2 == 1 {
			cfg.RegionBytes, cfg.MaxTransfer = 16*testBlock, 16*testBlock
		}
		rb, err := g.b.StartRebuild(3, cfg)
		if err != nil {
			t.Fatal(err)
		}
		stop := hostWriters(t, seed, uint64(round*10+2), 4, 200, true, nil, g.submit, func(r *rand.Rand, w int) (uint64, uint64, bool) {
			return r.Uint64N(testBlocks/4)*4 + uint64(w), 1, true
		})
		err = waitRebuild(t, rb)
		if failed := stop(); err != nil || failed != 0 {
			t.Fatalf("round %d: rebuild: %v", round, err)
		}
		if g.promoted.Load() != 1 {
			t.Fatalf("promoted %d times", g.promoted.Load())
		}
		st := g.b.Stats()
		if len(st.Peers) != 2 || st.Peers[1].State != "in-sync" || st.Peers[1].RebuildDone != st.Peers[1].RebuildTotal ||
			st.Peers[1].RebuildTotal != testBlocks*testBlock {
			t.Fatalf("stats after the rebuild: %+v", st.Peers)
		}
		g.leg.wg.Wait()
		insync.wg.Wait()
		sameStores(t, g.local, g.leg)
		sameStores(t, g.local, insync)
	}
}

// TestRebuildHoldsOverlappingWrite: a host write to the window being
// copied is written to the rebuilding replica only after the copy (its
// local leg goes at once), so the replica ends with the host's bytes,
// not the copy's.
func TestRebuildHoldsOverlappingWrite(t *testing.T) {
	g := newRebuildRig(t)
	rb := g.startWritten(t, 4)
	until(t, "the copy", func() bool { return waiting(g.leg, target.OpWrite, 0) >= 0 })
	h := g.submit(target.OpWrite, 1, 1, pattern(testBlock, 2))
	if waiting(g.leg, target.OpWrite, 1) >= 0 {
		t.Fatal("the host's write to the window was not held")
	}
	if h.isDone() {
		t.Fatal("host write completed before its rebuilding leg")
	}
	i := waiting(g.leg, target.OpWrite, 0)
	if c := g.leg.pending()[i]; c.lba != 0 || c.blocks != 4 || !bytes.Equal(c.data[testBlock:2*testBlock], pattern(testBlock, 1)) {
		t.Fatalf("copy %d+%d", c.lba, c.blocks)
	}
	g.leg.complete(t, i, nil) // the copy lands, then the held write goes
	until(t, "the held write", func() bool {
		for _, c := range g.leg.pending() {
			if c.op == target.OpWrite && c.lba == 1 {
				return true
			}
		}
		return false
	})
	if err := drive(t, g.leg, rb); err != nil {
		t.Fatal(err)
	}
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	sameStores(t, g.local, g.leg)
	got := make([]byte, testBlock)
	_ = g.leg.mem.Read(1, got)
	if !bytes.Equal(got, pattern(testBlock, 2)) {
		t.Fatal("the replica lost the host's write to the window")
	}
	// The rest of the volume was one hole: one deallocate; then a flush.
	var deallocs, flushes int
	for _, c := range g.leg.received() {
		switch c.op {
		case target.OpDeallocate:
			deallocs++
			if c.lba != 4 || c.blocks != testBlocks-4 {
				t.Fatalf("hole %d+%d, want 4+%d", c.lba, c.blocks, testBlocks-4)
			}
		case target.OpFlush:
			flushes++
		}
	}
	if deallocs != 1 || flushes != 1 {
		t.Fatalf("%d deallocates, %d flushes", deallocs, flushes)
	}
}

// TestRebuildWaitsForWriteInFlight: a host write sent to the rebuilding
// replica before the copier set its window is waited for before the
// copier reads the region, so the copy carries the write's bytes.
func TestRebuildWaitsForWriteInFlight(t *testing.T) {
	g := newRebuildRig(t)
	for lba := range uint64(4) {
		g.localWrite(t, lba, pattern(testBlock, 1))
	}
	gate := make(chan struct{})
	var reads atomic.Int32
	cfg := g.config()
	cfg.MaxTransfer = 4 * testBlock
	first := true
	cfg.Mapped = func(from, to uint64, fn func(lba, blocks uint64) error) error {
		if first {
			first = false
			<-gate
		}
		return g.local.mapped(from, to, fn)
	}
	cfg.Read = func(lba uint64, buf []byte) error { reads.Add(1); return g.local.read(lba, buf) }
	rb, err := g.b.StartRebuild(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := g.submit(target.OpWrite, 2, 1, pattern(testBlock, 9))
	if p := g.leg.pending(); len(p) != 1 || p[0].lba != 2 {
		t.Fatalf("replica commands %v: the host write did not go to the rebuilding replica", p)
	}
	close(gate)
	// The copier must not read blocks 0-3 while the write is in flight.
	time.Sleep(50 * time.Millisecond)
	if reads.Load() != 0 || len(g.leg.pending()) != 1 {
		t.Fatalf("the copier read (%d) with a write to its window in flight", reads.Load())
	}
	g.leg.complete(t, 0, nil)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	until(t, "the copy", func() bool { return waiting(g.leg, target.OpWrite, 0) >= 0 })
	c := g.leg.pending()[waiting(g.leg, target.OpWrite, 0)]
	if c.op != target.OpWrite || c.lba != 0 || !bytes.Equal(c.data[2*testBlock:3*testBlock], pattern(testBlock, 9)) {
		t.Fatalf("copy %v at %d does not carry the host's write", c.op, c.lba)
	}
	if err := drive(t, g.leg, rb); err != nil {
		t.Fatal(err)
	}
	sameStores(t, g.local, g.leg)
}

// TestRebuildLegFails: the rebuilding replica failing a command (here
// a host write's) fails neither that write nor later ones, reports
// nothing to the registry, and ends the rebuild with ErrRebuildLeg; the
// replica takes no more writes.
func TestRebuildLegFails(t *testing.T) {
	g := newRebuildRig(t)
	rep := newFakeReporter()
	b, err := New(Config{Local: g.local, Reporter: rep, Epoch: 3})
	if err != nil {
		t.Fatal(err)
	}
	g.b = b
	for lba := range uint64(8) {
		g.localWrite(t, lba, pattern(testBlock, 1))
	}
	cfg := g.config()
	cfg.MaxTransfer = 4 * testBlock
	// The copier stops in its second read: windows [0, 4) and [4, 8) in
	// flight, the first one's write on the replica.
	var reads atomic.Int32
	gate := make(chan struct{})
	cfg.Read = func(lba uint64, buf []byte) error {
		if reads.Add(1) == 2 {
			<-gate
		}
		return g.local.read(lba, buf)
	}
	rb, err := g.b.StartRebuild(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	until(t, "the copy's second read", func() bool { return reads.Load() == 2 })
	h := g.submit(target.OpWrite, 100, 1, pattern(testBlock, 2)) // outside the windows: sent
	if len(g.leg.pending()) != 2 || waiting(g.leg, target.OpWrite, 100) != 1 {
		t.Fatal("the host write did not go to the rebuilding replica")
	}
	g.leg.complete(t, 1, errors.New("connection lost"))
	if err := h.wait(t); err != nil {
		t.Fatalf("host write failed with its rebuilding leg: %v", err)
	}
	g.leg.complete(t, 0, nil) // the copy's write, after the failure
	close(gate)
	if err := waitRebuild(t, rb); !errors.Is(err, ErrRebuildLeg) {
		t.Fatalf("rebuild ended with %v, want ErrRebuildLeg", err)
	}
	n := len(g.leg.received())
	h = g.submit(target.OpWrite, 5, 1, pattern(testBlock, 3))
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	if len(g.leg.received()) != n {
		t.Fatal("a write went to the replica after its rebuild failed")
	}
	if rep.n.Load() != 0 || g.promoted.Load() != 0 {
		t.Fatalf("%d reports, %d promotions", rep.n.Load(), g.promoted.Load())
	}
	if st := g.b.Stats(); st.Peers[0].State != "rebuild-failed" {
		t.Fatalf("state %q", st.Peers[0].State)
	}
	// The backend takes another rebuild of the replica.
	g.leg = newFakeLeg(t, nil)
	g.leg.async = func(cmd) error { return nil }
	rb, err = g.b.StartRebuild(3, g.config())
	if err != nil {
		t.Fatal(err)
	}
	if err := waitRebuild(t, rb); err != nil {
		t.Fatal(err)
	}
	g.leg.wg.Wait()
	sameStores(t, g.local, g.leg)
}

// TestRebuildPromoteRefused: the registry refusing the replica in sync
// ends the rebuild with its error; the replica takes no more writes.
func TestRebuildPromoteRefused(t *testing.T) {
	g := newRebuildRig(t)
	g.leg.async = func(cmd) error { return nil }
	cfg := g.config()
	refusal := errors.New("stale epoch")
	cfg.Promote = func(context.Context) error { return refusal }
	rb, err := g.b.StartRebuild(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitRebuild(t, rb); !errors.Is(err, refusal) {
		t.Fatalf("rebuild: %v", err)
	}
	if st := g.b.Stats(); st.Peers[0].State != "rebuild-failed" {
		t.Fatalf("state %q", st.Peers[0].State)
	}
}

// TestRebuildThrottle: at 1 MiB/s, copying 512 KiB takes half a second
// at least.
func TestRebuildThrottle(t *testing.T) {
	g := newRebuildRig(t)
	g.leg.async = func(cmd) error { return nil }
	for lba := range uint64(128) {
		g.localWrite(t, lba, pattern(testBlock, 1))
	}
	cfg := g.config()
	cfg.Rate = 1 << 20
	start := time.Now()
	rb, err := g.b.StartRebuild(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitRebuild(t, rb); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 450*time.Millisecond {
		t.Fatalf("512 KiB copied in %v at 1 MiB/s", d)
	}
	if rb.Copied() != 128*testBlock {
		t.Fatalf("copied %d bytes, want %d (holes are free)", rb.Copied(), 128*testBlock)
	}
	g.leg.wg.Wait()
	sameStores(t, g.local, g.leg)
}

// TestRebuildSharedLimiter: two rebuilds (two volumes) sharing a
// Limiter of 1 MiB/s copy 256 KiB each in half a second at least.
func TestRebuildSharedLimiter(t *testing.T) {
	lim := NewLimiter(1 << 20)
	start := time.Now()
	var rbs []*Rebuild
	var rigs []*rebuildRig
	for range 2 {
		g := newRebuildRig(t)
		g.leg.async = func(cmd) error { return nil }
		for lba := range uint64(64) {
			g.localWrite(t, lba, pattern(testBlock, byte(lba)))
		}
		cfg := g.config()
		cfg.Rate, cfg.Limiter = 1<<30, lim // the limiter wins
		rb, err := g.b.StartRebuild(3, cfg)
		if err != nil {
			t.Fatal(err)
		}
		rbs, rigs = append(rbs, rb), append(rigs, g)
	}
	for i, rb := range rbs {
		if err := waitRebuild(t, rb); err != nil {
			t.Fatal(err)
		}
		rigs[i].leg.wg.Wait()
		sameStores(t, rigs[i].local, rigs[i].leg)
	}
	if d := time.Since(start); d < 450*time.Millisecond {
		t.Fatalf("2 × 256 KiB copied in %v at 1 MiB/s shared", d)
	}
}

// TestRebuildRefusals: a rebuild at another epoch, of an in-sync peer,
// while another runs, or without its functions is refused; a new epoch
// ends a running one.
func TestRebuildRefusals(t *testing.T) {
	g := newRebuildRig(t)
	if err := g.b.SetPeers(3, []Peer{{Node: "node-s", NS: newFakeLeg(t, nil)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.b.StartRebuild(2, g.config()); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("stale epoch: %v", err)
	}
	cfg := g.config()
	cfg.Node = "node-s"
	if _, err := g.b.StartRebuild(3, cfg); !errors.Is(err, ErrInvalid) {
		t.Fatalf("in-sync peer: %v", err)
	}
	cfg = g.config()
	cfg.Read = nil
	if _, err := g.b.StartRebuild(3, cfg); !errors.Is(err, ErrInvalid) {
		t.Fatalf("no read: %v", err)
	}
	cfg = g.config()
	cfg.RegionBytes = testBlock + 1
	if _, err := g.b.StartRebuild(3, cfg); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad region: %v", err)
	}
	gate := make(chan struct{})
	cfg = g.config()
	cfg.Mapped = func(from, to uint64, fn func(lba, blocks uint64) error) error {
		<-gate
		return g.local.mapped(from, to, fn)
	}
	rb, err := g.b.StartRebuild(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Node = "node-t"
	if _, err := g.b.StartRebuild(3, cfg); !errors.Is(err, ErrRebuildBusy) {
		t.Fatalf("second rebuild: %v", err)
	}
	// SetPeers at the same epoch keeps the rebuilding replica.
	if err := g.b.SetPeers(3, []Peer{{Node: "node-s", NS: newFakeLeg(t, nil)}}); err != nil {
		t.Fatal(err)
	}
	if st := g.b.Stats(); len(st.Peers) != 2 || st.Peers[1].State != "rebuilding" {
		t.Fatalf("peers after SetPeers: %+v", st.Peers)
	}
	if err := g.b.SetPeers(4, nil); err != nil {
		t.Fatal(err)
	}
	close(gate)
	if err := waitRebuild(t, rb); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("rebuild across an epoch: %v", err)
	}
}

// TestZeroAllocRebuildWrite: a host write while a rebuild runs (its
// window set elsewhere) allocates nothing.
func TestZeroAllocRebuildWrite(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	g := newRebuildRig(t)
	g.leg.instant = true
	g.localWrite(t, 0, pattern(testBlock, 1))
	gate := make(chan struct{})
	defer close(gate)
	cfg := g.config()
	cfg.Read = func(lba uint64, buf []byte) error { <-gate; return g.local.read(lba, buf) }
	rb, err := g.b.StartRebuild(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	until(t, "the window", func() bool { return rb.win.Load() != nil })
	h := newHostIO(target.OpWrite, 500, 1, make([]byte, testBlock), false)
	done := 0
	h.io.SetComplete(func(*target.IO, error) { done++ })
	if n := testing.AllocsPerRun(1000, func() { g.b.Submit(&h.io) }); n != 0 {
		t.Fatalf("%v allocations per write during a rebuild", n)
	}
	if done != 1001 {
		t.Fatalf("%d writes completed", done)
	}
}

// TestRebuildFailsWhilePromoted: once the registry is being asked to
// count the replica in sync (the commit may land before the answer), a
// failure of its leg is an in-sync replica's: the host write is held
// and reported, acknowledged only once the registry confirmed it out of
// sync; the rebuild ends with ErrRebuildLeg even though the commit
// succeeded. After a successful promotion the same holds.
func TestRebuildFailsWhilePromoted(t *testing.T) {
	for _, during := range []bool{true, false} {
		g := newRebuildRig(t)
		rep := newFakeReporter()
		b, err := New(Config{Local: g.local, Reporter: rep, Epoch: 3, HoldTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		g.b = b
		asked, answer := make(chan struct{}), make(chan error)
		cfg := g.config()
		cfg.Promote = func(context.Context) error { close(asked); return <-answer }
		rb, err := g.b.StartRebuild(3, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// The hole, then the flush.
		for range 2 {
			until(t, "a copier command", func() bool { return len(g.leg.pending()) == 1 })
			g.leg.complete(t, 0, nil)
		}
		<-asked
		if !during {
			answer <- nil
			if err := waitRebuild(t, rb); err != nil {
				t.Fatal(err)
			}
		}
		h := g.submit(target.OpWrite, 7, 1, pattern(testBlock, 4))
		until(t, "the host's leg", func() bool { return len(g.leg.pending()) == 1 })
		g.leg.complete(t, 0, errors.New("connection lost"))
		r := rep.next(t)
		if r.node != "node-r" || r.epoch != 3 {
			t.Fatalf("report %+v", r)
		}
		if h.isDone() {
			t.Fatal("a write the replica missed was acknowledged before the registry confirmed it out of sync")
		}
		r.answer <- nil
		if err := h.wait(t); err != nil {
			t.Fatal(err)
		}
		if during {
			answer <- nil
			if err := waitRebuild(t, rb); !errors.Is(err, ErrRebuildLeg) {
				t.Fatalf("rebuild: %v, want ErrRebuildLeg", err)
			}
		}
		if st := g.b.Stats(); st.Peers[0].State != "out-of-sync" {
			t.Fatalf("state %q", st.Peers[0].State)
		}
	}
}

// TestRebuildPipelined: the copier keeps several windows in flight
// (regions of 4 blocks, writes of 2; 10 blocks of data in flight at
// most in round 0; 1 MiB windows of data read in 4 parts in round 2)
// while four writers issue seeded random writes of 1 to 4 blocks, write
// zeroes and deallocates, each in 8-block stripes of its own, next to
// the copier's front, so many land in windows being copied and some
// span two; the replica completes commands on goroutines of their own
// after a random delay, out of order, so a held leg released before the
// copy of a window it overlaps landed would race that copy and could
// lose. The rebuild ends in sync with windows in flight at once and
// writes held; the replica then holds exactly the primary's bytes.
func TestRebuildPipelined(t *testing.T) {
	seed := testSeed(t)
	defer func(n int) { copyBudget = n }(copyBudget)
	for round := range 3 {
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		if round == 0 { // 2 or 3 windows of data in flight
			copyBudget = 10 * testBlock
		} else {
			copyBudget = copyBytes
		}
		g := newRebuildRig(t)
		var dmu sync.Mutex
		drng := rand.New(rand.NewPCG(seed, uint64(round)+100))
		g.leg.async = func(cmd) error {
			dmu.Lock()
			k := drng.IntN(64)
			dmu.Unlock()
			if k < 16 { // one command in four overtaken by those after it
				time.Sleep(time.Duration(k) * 20 * time.Microsecond)
			}
			for range k % 8 {
				runtime.Gosched()
			}
			return nil
		}
		for range 400 { // the primary's data, and stale bytes on the replica
			lba := rng.Uint64N(testBlocks)
			g.localWrite(t, lba, pattern(testBlock, byte(rng.Uint32())))
			if rng.IntN(2) == 0 {
				_ = g.leg.mem.Write(rng.Uint64N(testBlocks), pattern(testBlock, byte(rng.Uint32())), false)
			}
		}
		cfg := g.config()
		var split atomic.Int32
		if round == 2 { // 1 MiB windows of data, each read in 4 parts at once
			for lba := range uint64(testBlocks) {
				g.localWrite(t, lba, pattern(testBlock, byte(lba)))
			}
			cfg.RegionBytes, cfg.MaxTransfer = 256*testBlock, 32*testBlock
			cfg.Read = func(lba uint64, buf []byte) error {
				if len(buf) == 64*testBlock {
					split.Add(1)
				}
				return g.local.read(lba, buf)
			}
		}
		rb, err := g.b.StartRebuild(3, cfg)
		if err != nil {
			t.Fatal(err)
		}
		stop := hostWriters(t, seed, uint64(round*10)+1000, 4, 0, false, rb.Done(), g.submit, func(r *rand.Rand, w int) (uint64, uint64, bool) {
			// Near the copier's front (the blocks landed), in this
			// writer's 8-block stripes: a block is seldom written again
			// once the copier went past it.
			front := rb.done.Load() / testBlock
			stripe := front/32*4 + 4*r.Uint64N(3) + uint64(w)
			off := r.Uint64N(8)
			n := min(1+r.Uint64N(4), 8-off)
			lba := stripe*8 + off
			return lba, n, lba+n <= testBlocks
		})
		err = waitRebuild(t, rb)
		if failed := stop(); err != nil || failed != 0 {
			t.Fatalf("round %d: rebuild: %v", round, err)
		}
		g.leg.wg.Wait()
		rb.mu.Lock()
		holds := rb.holds
		rb.mu.Unlock()
		if round == 2 && split.Load() == 0 {
			t.Fatal("no window read in parts")
		}
		// Windows pile up to the budget or copyDepth (the copier lands
		// only when it must); holds depend on the writers' timing, and
		// the 1 MiB windows of round 2 see few (4 to 9 here, unloaded).
		if rb.peak < 3 || (round < 2 && holds == 0) {
			t.Fatalf("round %d: at most %d windows in flight, %d legs held: the test did not test the pipeline", round, rb.peak, holds)
		}
		t.Logf("round %d: %d windows in flight at most, %d legs held", round, rb.peak, holds)
		sameStores(t, g.local, g.leg)
	}
}

// TestRebuildReadFails: a local read failing (one part of a window read
// in parts) ends the rebuild with the store's error; the replica is
// not promoted and takes no more writes.
func TestRebuildReadFails(t *testing.T) {
	g := newRebuildRig(t)
	g.leg.async = func(cmd) error { return nil }
	for lba := range uint64(512) {
		g.localWrite(t, lba, pattern(testBlock, byte(lba)))
	}
	errDisk := errors.New("disk on fire")
	cfg := g.config()
	cfg.RegionBytes, cfg.MaxTransfer = 256*testBlock, 32*testBlock
	cfg.Read = func(lba uint64, buf []byte) error {
		if lba == 256+128 { // the third part of the second window
			return errDisk
		}
		return g.local.read(lba, buf)
	}
	rb, err := g.b.StartRebuild(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitRebuild(t, rb); !errors.Is(err, errDisk) {
		t.Fatalf("rebuild: %v, want the read's error", err)
	}
	if g.promoted.Load() != 0 {
		t.Fatal("promoted")
	}
	if st := g.b.Stats(); st.Peers[0].State != "rebuild-failed" {
		t.Fatalf("state %q", st.Peers[0].State)
	}
	g.leg.wg.Wait()
	n := len(g.leg.received())
	if err := g.submit(target.OpWrite, 5, 1, pattern(testBlock, 3)).wait(t); err != nil {
		t.Fatal(err)
	}
	if len(g.leg.received()) != n {
		t.Fatal("a write went to the replica after its rebuild failed")
	}
}

// TestRebuildHoldsPerWindow: with four windows in flight ([0, 4),
// [4, 8), [8, 12) copied, the hole after them deallocated), a host
// write inside the first is held until the first window's copy landed,
// and goes then, while one spanning the first two waits for the second
// too; a write to none goes at once.
func TestRebuildHoldsPerWindow(t *testing.T) {
	g := newRebuildRig(t)
	rb := g.startWritten(t, 12)
	until(t, "four windows in flight", func() bool { return waiting(g.leg, target.OpDeallocate, 12) >= 0 })
	inside := g.submit(target.OpWrite, 1, 1, pattern(testBlock, 2))
	across := g.submit(target.OpWrite, 3, 2, append(pattern(testBlock, 3), pattern(testBlock, 4)...))
	if waiting(g.leg, target.OpWrite, 1) >= 0 || waiting(g.leg, target.OpWrite, 3) >= 0 {
		t.Fatal("a write to a window in flight was sent before its copy landed")
	}
	g.leg.complete(t, waiting(g.leg, target.OpWrite, 0), nil) // the first window lands
	until(t, "the write inside the first window", func() bool { return waiting(g.leg, target.OpWrite, 1) >= 0 })
	if waiting(g.leg, target.OpWrite, 3) >= 0 {
		t.Fatal("the write across two windows went when the first landed")
	}
	g.leg.complete(t, waiting(g.leg, target.OpWrite, 4), nil) // the second
	until(t, "the write across the first two", func() bool { return waiting(g.leg, target.OpWrite, 3) >= 0 })
	if err := drive(t, g.leg, rb); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*hostIO{inside, across} {
		if err := h.wait(t); err != nil {
			t.Fatal(err)
		}
	}
	sameStores(t, g.local, g.leg)
}

// hostWriters runs n writers of random host I/O through submit while a
// rebuild runs: writer w, with its own seeded generator, picks where
// (at: blocks [lba, lba+blocks), or skip) and submits a write of random
// bytes (six in ten), a write zeroes (two), a deallocate (one) or, with
// flushes, a flush (one; else a write), and waits for it; it makes at
// least min I/Os and stops at stop's call (or when done closes), which
// returns how many writers saw an I/O fail.
func hostWriters(t *testing.T, seed, stream uint64, n, min int, flushes bool, done <-chan struct{},
	submit func(op target.IOOp, lba, blocks uint64, data []byte) *hostIO,
	at func(r *rand.Rand, w int) (lba, blocks uint64, ok bool)) (stop func() int32) {
	var wg sync.WaitGroup
	var failed atomic.Int32
	quit := make(chan struct{})
	for w := range n {
		r := rand.New(rand.NewPCG(seed, stream+uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if i > min {
					select {
					case <-quit:
						return
					case <-done:
						return
					default:
					}
				}
				lba, blocks, ok := at(r, w)
				if !ok {
					continue
				}
				var h *hostIO
				switch k := r.IntN(10); {
				case k < 6 || k == 9 && !flushes:
					data := make([]byte, blocks*testBlock)
					for b := range blocks {
						copy(data[b*testBlock:], pattern(testBlock, byte(r.Uint32())))
					}
					h = submit(target.OpWrite, lba, blocks, data)
				case k < 8:
					h = submit(target.OpWriteZeroes, lba, blocks, nil)
				case k < 9:
					h = submit(target.OpDeallocate, lba, blocks, nil)
				default:
					h = submit(target.OpFlush, 0, 0, nil)
				}
				if err := h.wait(t); err != nil {
					t.Errorf("host I/O failed: %v", err)
					failed.Add(1)
					return
				}
			}
		}()
	}
	return func() int32 {
		close(quit)
		wg.Wait()
		return failed.Load()
	}
}

// TestRebuildMappedOwn: a full copy through MappedOwn (docs/snapshots.md
// §4.3) copies the local replica's own runs, deallocates its own
// tombstones on the replica, and leaves every other region as the
// replica has it: the replica, holding the same parent snapshot's
// content, ends equal to the local replica, and only the own runs were
// written (no inherited region copied nor deallocated). Host writes run
// meanwhile, into inherited regions too.
func TestRebuildMappedOwn(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	for round := range 4 {
		g := newRebuildRig(t)
		g.leg.async = func(cmd) error { runtime.Gosched(); return nil }
		// The parent snapshot's content, on both.
		for lba := range uint64(testBlocks) {
			if rng.IntN(4) == 0 {
				continue // a hole in the snapshot too
			}
			data := pattern(testBlock, byte(rng.Uint32()))
			g.localWrite(t, lba, data)
			_ = g.leg.mem.Write(lba, data, false)
		}
		// What the local volume owns on top: clusters written (own) and
		// tombstones (zeros over the parent's data); the replica lacks
		// both and holds stale bytes of its own there.
		var ownMu sync.Mutex
		own := map[uint64]int8{} // 1 data, -1 tombstone
		ownBytes := uint64(0)
		for range testBlocks / 4 {
			lba := rng.Uint64N(testBlocks)
			if _, ok := own[lba]; ok {
				continue
			}
			_ = g.leg.mem.Write(lba, pattern(testBlock, byte(rng.Uint32())), false)
			if rng.IntN(3) == 0 {
				g.localWrite(t, lba, make([]byte, testBlock))
				own[lba] = -1
				continue
			}
			g.localWrite(t, lba, pattern(testBlock, byte(rng.Uint32())))
			own[lba] = 1
			ownBytes += testBlock
		}
		mappedOwn := func(from, to uint64, fn func(lba, blocks uint64, zero bool) error) error {
			type run struct {
				lba, n uint64
				zero   bool
			}
			var runs []run
			ownMu.Lock()
			for b := from; b < min(to, testBlocks); b++ {
				k, ok := own[b]
				if !ok {
					continue
				}
				if n := len(runs); n > 0 && runs[n-1].lba+runs[n-1].n == b && runs[n-1].zero == (k < 0) {
					runs[n-1].n++
				} else {
					runs = append(runs, run{b, 1, k < 0})
				}
			}
			ownMu.Unlock()
			for _, r := range runs {
				if err := fn(r.lba, r.n, r.zero); err != nil {
					return err
				}
			}
			return nil
		}
		cfg := g.config()
		cfg.MappedOwn = mappedOwn
		if round%2 == 1 {
			cfg.RegionBytes, cfg.MaxTransfer = 16*testBlock, 16*testBlock
		}
		rb, err := g.b.StartRebuild(3, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if rb.Mode() != "full" {
			t.Fatalf("mode %q", rb.Mode())
		}
		// Host writes go to both (the replica is a leg now); a write to
		// a block makes it own locally, as the store's copy-on-write does.
		var hostBytes atomic.Uint64
		stop := hostWriters(t, seed, uint64(round*10+3), 2, 50, false, nil, func(op target.IOOp, lba, blocks uint64, data []byte) *hostIO {
			ownMu.Lock()
			for b := lba; b < lba+blocks; b++ {
				own[b] = 1
			}
			ownMu.Unlock()
			hostBytes.Add(blocks * testBlock)
			return g.submit(op, lba, blocks, data)
		}, func(r *rand.Rand, w int) (uint64, uint64, bool) {
			return r.Uint64N(testBlocks/2)*2 + uint64(w), 1, true
		})
		err = waitRebuild(t, rb)
		if failed := stop(); err != nil || failed != 0 {
			t.Fatalf("seed %d round %d: rebuild: %v (%d host writes failed)", seed, round, err, failed)
		}
		g.leg.wg.Wait()
		sameStores(t, g.local, g.leg)
		// Copied: the own data runs at most, and the blocks host writes
		// made own; never the inherited rest of the volume.
		if c := rb.Copied(); c < ownBytes || c > ownBytes+hostBytes.Load() {
			t.Fatalf("seed %d round %d: copied %d bytes, own %d, host %d", seed, round, c, ownBytes, hostBytes.Load())
		}
	}
}
