package repl

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/target"
)

// testRegion: 4 blocks per dirty region in these tests, 256 regions.
const testRegion = 4 * testBlock

// drlRig is a Backend over an inline local replica with an allocation
// map and 4-block dirty regions, at epoch 1, with one in-sync peer.
type drlRig struct {
	local *fakeLocal
	leg   *fakeLeg
	b     *Backend
}

func newDRLRig(t testing.TB, rep Reporter) *drlRig {
	t.Helper()
	g := &drlRig{local: newFakeLocal(t, true, nil), leg: newFakeLeg(t, nil)}
	g.local.trackAlloc()
	b, err := New(Config{Local: g.local, Reporter: rep, Epoch: 1, Depth: 16, DirtyRegion: testRegion, HoldTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g.b = b
	if err := b.SetPeers(1, []Peer{{Node: "node-r", NS: g.leg}}); err != nil {
		t.Fatal(err)
	}
	return g
}

func (g *drlRig) submit(op target.IOOp, lba, blocks uint64, data []byte) *hostIO {
	h := newHostIO(op, lba, blocks, data, false)
	g.b.Submit(&h.io)
	return h
}

// dirtyRegions lists the regions node's log marks.
func dirtyRegions(b *Backend, node string) []uint64 {
	d := b.drls.Load().find(node)
	if d == nil {
		return nil
	}
	var out []uint64
	for i := uint64(0); i < d.regions; i++ {
		if d.dirty(i) {
			out = append(out, i)
		}
	}
	return out
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDirtyLogMarks: no log while the replica is in sync; from its first
// failed write, the log marks that write, a write in flight to it at the
// time whose leg then succeeded (it may or may not have landed), a write
// that skipped it while its report was pending, and, once the registry
// confirmed it and the lead took it out of the leg set, later writes,
// write zeroes and deallocates; a flush marks nothing, nor did the write
// that completed on it before it failed. A range across two regions
// marks both.
func TestDirtyLogMarks(t *testing.T) {
	rep := newFakeReporter()
	g := newDRLRig(t, rep)
	h := g.submit(target.OpWrite, 0, 1, pattern(testBlock, 1)) // region 0, lands
	g.leg.complete(t, 0, nil)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	if _, ok := g.b.DirtyBytes("node-r"); ok {
		t.Fatal("a log for a replica in sync")
	}
	inflight := g.submit(target.OpWrite, 8, 1, pattern(testBlock, 2)) // region 2
	failing := g.submit(target.OpWrite, 16, 1, pattern(testBlock, 3)) // region 4
	g.leg.complete(t, 1, errors.New("connection lost"))
	r := rep.next(t)
	g.leg.complete(t, 0, nil) // in flight when the log was made
	if err := inflight.wait(t); err != nil {
		t.Fatal(err)
	}
	skipped := g.submit(target.OpWriteZeroes, 24, 2, nil) // region 6, not sent
	if len(g.leg.pending()) != 0 {
		t.Fatal("a write went to a failing replica")
	}
	r.answer <- nil
	for _, h := range []*hostIO{failing, skipped} {
		if err := h.wait(t); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.b.SetPeers(1, nil); err != nil { // the registry's set, without it
		t.Fatal(err)
	}
	for _, h := range []*hostIO{
		g.submit(target.OpDeallocate, 40, 4, nil),                   // region 10
		g.submit(target.OpFlush, 0, 0, nil),                         // none
		g.submit(target.OpWrite, 50, 3, pattern(3*testBlock, 4)),    // regions 12 and 13
		g.submit(target.OpWriteZeroes, 1020, 4, nil),                // the last region, 255
		g.submit(target.OpWrite, 128, 64, pattern(64*testBlock, 5)), // regions 32..47
	} {
		if err := h.wait(t); err != nil {
			t.Fatal(err)
		}
	}
	want := []uint64{2, 4, 6, 10, 12, 13}
	for i := uint64(32); i < 48; i++ {
		want = append(want, i)
	}
	want = append(want, 255)
	if got := dirtyRegions(g.b, "node-r"); !equalU64(got, want) {
		t.Fatalf("dirty regions %v, want %v", got, want)
	}
	n, ok := g.b.DirtyBytes("node-r")
	if !ok || n != uint64(len(want))*testRegion {
		t.Fatalf("DirtyBytes %d %v, want %d", n, ok, len(want)*testRegion)
	}
	if st := g.b.Stats(); len(st.Dirty) != 1 || st.Dirty[0] != (DirtyStats{Node: "node-r", Bytes: n}) {
		t.Fatalf("stats %+v", st.Dirty)
	}
	// A write past the log's end (a volume grown since) makes it useless.
	g.b.drls.Load().find("node-r").mark(testBlocks, 1)
	if _, ok := g.b.DirtyBytes("node-r"); ok {
		t.Fatal("a log that missed a write is still offered")
	}
}

// TestDirtyLogNewEpoch: a new epoch drops the logs (another primary may
// have written meanwhile): the rebuild asked to use one is a full copy,
// and a full copy in sync drops the log of its replica.
func TestDirtyLogNewEpoch(t *testing.T) {
	for _, newEpoch := range []bool{true, false} {
		g := newDRLRig(t, &okReporter{})
		g.leg.submitErr = errors.New("connection lost")
		if err := g.submit(target.OpWrite, 0, 1, pattern(testBlock, 1)).wait(t); err != nil {
			t.Fatal(err)
		}
		if _, ok := g.b.DirtyBytes("node-r"); !ok {
			t.Fatal("no log for the replica that missed a write")
		}
		epoch := uint64(1)
		if newEpoch {
			epoch = 2
			if err := g.b.SetPeers(epoch, nil); err != nil {
				t.Fatal(err)
			}
			if _, ok := g.b.DirtyBytes("node-r"); ok {
				t.Fatal("a log kept across a new epoch")
			}
		}
		leg := newFakeLeg(t, nil)
		leg.mem = g.leg.mem
		leg.async = func(cmd) error { return nil }
		rb, err := g.b.StartRebuild(epoch, RebuildConfig{Node: "node-r", NS: leg, UseDirtyLog: newEpoch, Mapped: g.local.mapped, Read: g.local.read,
			Promote: func(context.Context) error { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		if rb.Incremental() || rb.Mode() != "full" {
			t.Fatalf("new epoch %v: mode %s, want a full copy", newEpoch, rb.Mode())
		}
		if err := waitRebuild(t, rb); err != nil {
			t.Fatal(err)
		}
		leg.wg.Wait()
		sameStores(t, g.local, leg)
		if _, ok := g.b.DirtyBytes("node-r"); ok {
			t.Fatal("the log outlived the replica's return in sync")
		}
	}
}

// staleReplica makes a rig whose replica left after a write at LBA 0
// failed (region 0), then missed writes: 8 blocks at 100 (regions 25,
// 26), zeroes
// at 200 (region 50), a deallocate of blocks 300..303 (region 75: a
// hole on the primary). Before that, both held the same data on every
// block. It returns the regions dirty.
func staleReplica(t *testing.T, g *drlRig) []uint64 {
	t.Helper()
	for lba := uint64(0); lba < testBlocks; lba += 16 {
		data := pattern(16*testBlock, byte(lba))
		var io target.IO
		io.Op, io.LBA, io.Data = target.OpWrite, lba, data
		if err := g.local.do(&io); err != nil {
			t.Fatal(err)
		}
		if err := g.leg.mem.Write(lba, data, false); err != nil {
			t.Fatal(err)
		}
	}
	g.leg.submitErr = errors.New("connection lost")
	for _, h := range []*hostIO{
		g.submit(target.OpWrite, 0, 1, pattern(testBlock, 7)),
		g.submit(target.OpWrite, 100, 8, pattern(8*testBlock, 8)),
		g.submit(target.OpWriteZeroes, 200, 1, nil),
		g.submit(target.OpDeallocate, 300, 4, nil),
	} {
		if err := h.wait(t); err != nil {
			t.Fatal(err)
		}
	}
	want := []uint64{0, 25, 26, 50, 75}
	if got := dirtyRegions(g.b, "node-r"); !equalU64(got, want) {
		t.Fatalf("dirty regions %v, want %v", got, want)
	}
	return want
}

// TestRebuildIncremental: a replica that missed writes while out of sync
// is rebuilt from its dirty-region log: the copier writes and
// deallocates only inside the dirty regions (a hole of the primary's
// there deallocated), copies at most their size, reports them as its
// total, and the replica ends equal to the primary, block for block; in
// sync, the log is gone.
func TestRebuildIncremental(t *testing.T) {
	g := newDRLRig(t, &okReporter{})
	dirty := staleReplica(t, g)
	total, ok := g.b.DirtyBytes("node-r")
	if !ok || total != uint64(len(dirty))*testRegion {
		t.Fatalf("DirtyBytes %d %v", total, ok)
	}
	leg := newFakeLeg(t, nil)
	leg.mem = g.leg.mem // a new connection to the same replica
	leg.async = func(cmd) error { return nil }
	rb, err := g.b.StartRebuild(1, RebuildConfig{Node: "node-r", NS: leg, MaxTransfer: 2 * testBlock, RegionBytes: 8 * testBlock, UseDirtyLog: true,
		Mapped: g.local.mapped, Read: g.local.read, Promote: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if !rb.Incremental() {
		t.Fatal("a full copy with a dirty-region log")
	}
	if err := waitRebuild(t, rb); err != nil {
		t.Fatal(err)
	}
	leg.wg.Wait()
	sameStores(t, g.local, leg)
	inDirty := func(lba, n uint64) bool {
		for b := lba; b < lba+n; b++ {
			found := false
			for _, r := range dirty {
				found = found || b/4 == r
			}
			if !found {
				return false
			}
		}
		return true
	}
	var deallocs int
	for _, c := range leg.received() {
		switch c.op {
		case target.OpWrite, target.OpDeallocate:
			if !inDirty(c.lba, c.blocks) {
				t.Fatalf("copier %v of %d+%d outside the dirty regions %v", c.op, c.lba, c.blocks, dirty)
			}
			if c.op == target.OpDeallocate {
				deallocs++
			}
		}
	}
	if deallocs != 1 {
		t.Fatalf("%d deallocates, want the hole of region 75", deallocs)
	}
	done, tot := rb.Progress()
	if tot != total || done != total || rb.Copied() != total-testRegion {
		t.Fatalf("progress %d/%d, copied %d; dirty %d (one region a hole)", done, tot, rb.Copied(), total)
	}
	if _, ok := g.b.DirtyBytes("node-r"); ok {
		t.Fatal("the log outlived the rebuild")
	}
	st := g.b.Stats()
	if p := st.Peers[0]; p.State != "in-sync" || p.RebuildMode != "incremental" || p.RebuildCopied != rb.Copied() || p.RebuildTotal != total {
		t.Fatalf("stats %+v", p)
	}
}

// TestRebuildIncrementalFails: an incremental rebuild whose replica
// fails mid-way keeps the log, the regions it copied cleared and the
// others still set, marking on: a write while the replica is out again
// is marked; the next rebuild is incremental too, copies only what is
// left and the new write, and the replica ends equal to the primary.
func TestRebuildIncrementalFails(t *testing.T) {
	g := newDRLRig(t, &okReporter{})
	staleReplica(t, g)
	leg := newFakeLeg(t, nil)
	leg.mem = g.leg.mem
	leg.async = func(c cmd) error {
		if c.lba >= 150 && c.op != target.OpFlush {
			return errors.New("connection lost")
		}
		return nil
	}
	cfg := RebuildConfig{Node: "node-r", NS: leg, MaxTransfer: 2 * testBlock, RegionBytes: 4 * testBlock, UseDirtyLog: true,
		Mapped: g.local.mapped, Read: g.local.read, Promote: func(context.Context) error { return nil }}
	rb, err := g.b.StartRebuild(1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitRebuild(t, rb); !errors.Is(err, ErrRebuildLeg) {
		t.Fatalf("rebuild: %v, want ErrRebuildLeg", err)
	}
	leg.wg.Wait()
	// Regions 25 and 26 were copied, but their windows may have been in
	// flight still when the failure came (the copier keeps several), or
	// landed after the replica was dropped: then they stay marked,
	// copied again next time.
	left := dirtyRegions(g.b, "node-r")
	if !equalU64(left, []uint64{50, 75}) && !equalU64(left, []uint64{26, 50, 75}) && !equalU64(left, []uint64{25, 26, 50, 75}) {
		t.Fatalf("after the failed rebuild: dirty %v, want [50 75] and perhaps the copied windows before them", left)
	}
	if err := g.submit(target.OpWrite, 600, 1, pattern(testBlock, 9)).wait(t); err != nil {
		t.Fatal(err)
	}
	if got, want := dirtyRegions(g.b, "node-r"), append(left, 150); !equalU64(got, want) {
		t.Fatalf("after a write: dirty %v, want %v", got, want)
	}
	leg = newFakeLeg(t, nil)
	leg.mem = g.leg.mem
	leg.async = func(cmd) error { return nil }
	cfg.NS = leg
	rb, err = g.b.StartRebuild(1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitRebuild(t, rb); err != nil || !rb.Incremental() {
		t.Fatalf("second rebuild: %v (incremental %v)", err, rb.Incremental())
	}
	leg.wg.Wait()
	sameStores(t, g.local, leg)
	if want := uint64(len(left)) * testRegion; rb.Copied() != want { // 75 a hole, 150 written
		t.Fatalf("second rebuild copied %d bytes, want %d: regions %v but 75, and 150", rb.Copied(), want, left)
	}
}

// TestDirtyLogRace: four writers issue seeded random writes, write
// zeroes and deallocates (each on its own blocks) to a replica whose
// legs complete out of order on goroutines of their own, and which at a
// seeded command starts failing everything (some failed commands land
// first, as a timed-out write may); the registry confirms it at once and
// the lead takes it out of the leg set at a seeded moment. Then every
// block on which the replica differs from the primary is in a dirty
// region. In odd rounds an incremental rebuild under writes then loses
// its replica connection at a seeded command: the log is kept and the
// same holds again. Last, an incremental rebuild, while the writers
// write again, ends with the replica equal to the primary, having copied
// at most the dirty regions. Run with -race; REPL_SEED replays.
func TestDirtyLogRace(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	for round := range 6 {
		rep := &okReporter{}
		g := newDRLRig(t, rep)
		failAt := 20 + rng.Int64N(400)
		var cmds atomic.Int64
		lands := rng.Uint64()
		g.leg.async = func(c cmd) error {
			k := cmds.Add(1)
			for range k % 4 {
				runtime.Gosched()
			}
			if k < failAt {
				return nil
			}
			if lands>>(k%64)&1 != 0 {
				_ = g.leg.apply(c) // landed, then reported failed
			}
			return errors.New("connection lost")
		}
		dropAfter := time.Duration(rng.IntN(2000)) * time.Microsecond
		dropped := make(chan struct{})
		go func() {
			defer close(dropped)
			for g.b.Stats().Peers[0].State != "out-of-sync" {
				time.Sleep(50 * time.Microsecond)
			}
			time.Sleep(dropAfter)
			if err := g.b.SetPeers(1, nil); err != nil {
				t.Error(err)
			}
		}()
		writers := func(ops int, base uint64) {
			var wg sync.WaitGroup
			for w := range 4 {
				wrng := rand.New(rand.NewPCG(seed, base+uint64(round*8+w)))
				wg.Add(1)
				go func() {
					defer wg.Done()
					q := uint64(w) * testBlocks / 4
					for i := range ops {
						n := 1 + wrng.Uint64N(8)
						lba := q + wrng.Uint64N(testBlocks/4-n+1)
						var h *hostIO
						switch k := wrng.IntN(10); {
						case k < 7:
							h = g.submit(target.OpWrite, lba, n, pattern(int(n)*testBlock, byte(i+w*61+int(base))))
						case k < 8:
							h = g.submit(target.OpWriteZeroes, lba, n, nil)
						case k < 9:
							h = g.submit(target.OpDeallocate, lba, n, nil)
						default:
							h = g.submit(target.OpFlush, 0, 0, nil)
						}
						if err := h.wait(t); err != nil {
							t.Errorf("host I/O failed: %v", err)
							return
						}
					}
				}()
			}
			wg.Wait()
		}
		writers(150, 100)
		<-dropped
		g.leg.wg.Wait()
		if t.Failed() {
			return
		}
		if rep.n.Load() != 1 {
			t.Fatalf("round %d: %d reports (fail at command %d of %d)", round, rep.n.Load(), failAt, cmds.Load())
		}
		differ := checkMarked(t, g, round)
		if differ == 0 {
			t.Fatalf("round %d: the replica missed nothing", round)
		}
		if round%2 == 1 {
			// A rebuild whose replica connection dies at a seeded command,
			// under writes: the log keeps what it did not copy and every
			// write the replica missed meanwhile.
			before, _ := g.b.DirtyBytes("node-r")
			dieAt := 1 + rng.Int64N(60)
			var n atomic.Int64
			leg := newFakeLeg(t, nil)
			leg.mem = g.leg.mem
			leg.async = func(c cmd) error {
				runtime.Gosched()
				if k := n.Add(1); k >= dieAt {
					if lands>>(k%64)&1 != 0 {
						_ = leg.apply(c)
					}
					return errors.New("connection lost")
				}
				return nil
			}
			rb, err := g.b.StartRebuild(1, RebuildConfig{Node: "node-r", NS: leg, MaxTransfer: 4 * testBlock, RegionBytes: 8 * testBlock, UseDirtyLog: true,
				Mapped: g.local.mapped, Read: g.local.read, Promote: func(context.Context) error { return nil }})
			if err != nil {
				t.Fatal(err)
			}
			writers(60, 300)
			err = waitRebuild(t, rb)
			leg.wg.Wait()
			if err == nil {
				t.Logf("round %d: the rebuild ended before command %d", round, dieAt)
				continue
			}
			if !errors.Is(err, ErrRebuildLeg) {
				t.Fatalf("round %d: failed rebuild: %v", round, err)
			}
			after, ok := g.b.DirtyBytes("node-r")
			if !ok {
				t.Fatalf("round %d: the log did not outlive a failed rebuild", round)
			}
			t.Logf("round %d: a rebuild failed at command %d: %d bytes dirty before, %d after", round, dieAt, before, after)
			checkMarked(t, g, round)
		}
		total, _ := g.b.DirtyBytes("node-r")
		leg := newFakeLeg(t, nil)
		leg.mem = g.leg.mem
		leg.async = func(cmd) error { runtime.Gosched(); return nil }
		rb, err := g.b.StartRebuild(1, RebuildConfig{Node: "node-r", NS: leg, MaxTransfer: 4 * testBlock, RegionBytes: 8 * testBlock, UseDirtyLog: true,
			Mapped: g.local.mapped, Read: g.local.read, Promote: func(context.Context) error { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		writers(60, 200)
		if err := waitRebuild(t, rb); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !rb.Incremental() || rb.Copied() > total || total == 0 {
			t.Fatalf("round %d: incremental %v, copied %d of %d dirty", round, rb.Incremental(), rb.Copied(), total)
		}
		leg.wg.Wait()
		sameStores(t, g.local, leg)
		t.Logf("round %d: replica failed at command %d, %d blocks differed, %d of %d bytes dirty, %d copied",
			round, failAt, differ, total, testBlocks*testBlock, rb.Copied())
	}
}

// checkMarked fails unless every block on which g's replica differs
// from the primary is in a dirty region of its log; it returns how many
// differ.
func checkMarked(t *testing.T, g *drlRig, round int) int {
	t.Helper()
	d := g.b.drls.Load().find("node-r")
	a, b := make([]byte, testBlock), make([]byte, testBlock)
	differ := 0
	for lba := uint64(0); lba < testBlocks; lba++ {
		_ = g.local.mem.Read(lba, a)
		_ = g.leg.mem.Read(lba, b)
		if !bytes.Equal(a, b) {
			differ++
			if d == nil || !d.dirty(lba/4) {
				t.Fatalf("round %d: block %d differs on the replica, its region is not marked", round, lba)
			}
		}
	}
	return differ
}

// TestZeroAllocDirtyMark: a write, write zeroes and deallocate that
// skip an out-of-sync replica mark its log without allocating.
func TestZeroAllocDirtyMark(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	g := newDRLRig(t, &okReporter{})
	g.leg.instant = true
	g.leg.submitErr = errors.New("connection lost")
	if err := g.submit(target.OpWrite, 0, 1, make([]byte, testBlock)).wait(t); err != nil {
		t.Fatal(err)
	}
	var h target.IO
	done := 0
	h.SetComplete(func(*target.IO, error) { done++ })
	data := make([]byte, testBlock)
	i := uint64(0)
	n := testing.AllocsPerRun(1000, func() {
		h.Op, h.LBA, h.Blocks, h.Data = target.OpWrite, i%testBlocks, 1, data
		if i%3 == 1 {
			h.Op, h.Data = target.OpWriteZeroes, nil
		} else if i%3 == 2 {
			h.Op, h.Data = target.OpDeallocate, nil
		}
		i += 5
		g.b.Submit(&h)
	})
	if n != 0 {
		t.Fatalf("%v allocations per marked write", n)
	}
	if done != 1001 {
		t.Fatalf("%d completions", done)
	}
	if got := dirtyRegions(g.b, "node-r"); len(got) != 256 {
		t.Fatalf("%d regions dirty, want all 256", len(got))
	}
}

// TestDirtyLogOldEpochPeer: a write in flight to a replica across a new
// epoch whose leg then fails starts no log: one made now would lack the
// new epoch's writes its node may have missed already. A replica of the
// new epoch failing does.
func TestDirtyLogOldEpochPeer(t *testing.T) {
	g := newDRLRig(t, &okReporter{})
	h := g.submit(target.OpWrite, 0, 1, pattern(testBlock, 1))
	if err := g.b.SetPeers(2, nil); err != nil {
		t.Fatal(err)
	}
	if err := g.submit(target.OpWrite, 40, 1, pattern(testBlock, 2)).wait(t); err != nil { // missed by node-r
		t.Fatal(err)
	}
	g.leg.complete(t, 0, errors.New("connection lost"))
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	if _, ok := g.b.DirtyBytes("node-r"); ok {
		t.Fatal("a log made by a peer of an older epoch")
	}
	leg := newFakeLeg(t, nil)
	if err := g.b.SetPeers(2, []Peer{{Node: "node-s", NS: leg}}); err != nil {
		t.Fatal(err)
	}
	h = g.submit(target.OpWrite, 80, 1, pattern(testBlock, 3))
	leg.complete(t, 0, errors.New("connection lost"))
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	if got := dirtyRegions(g.b, "node-s"); !equalU64(got, []uint64{20}) {
		t.Fatalf("node-s dirty %v, want [20]", got)
	}
}

// BenchmarkWriteMarked: a 4 KiB write that skips an out-of-sync replica
// and marks its dirty-region log (compare BenchmarkWrite/legs=0: the
// marking's cost), at a new region each time or always the same one.
func BenchmarkWriteMarked(b *testing.B) {
	for _, spread := range []bool{true, false} {
		b.Run(map[bool]string{true: "new-regions", false: "same-region"}[spread], func(b *testing.B) {
			g := newDRLRig(b, &okReporter{})
			g.leg.instant = true
			g.leg.submitErr = errors.New("connection lost")
			if err := g.submit(target.OpWrite, 0, 1, make([]byte, testBlock)).wait(b); err != nil {
				b.Fatal(err)
			}
			var h target.IO
			h.SetComplete(func(*target.IO, error) {})
			h.Op, h.Blocks, h.Data = target.OpWrite, 1, make([]byte, testBlock)
			b.ReportAllocs()
			b.SetBytes(testBlock)
			i := uint64(0)
			for b.Loop() {
				if spread {
					h.LBA = i * 4 % testBlocks
					i++
				}
				g.b.Submit(&h)
			}
		})
	}
}

// TestRebuildIncrementalWaitsForOlderWrites: a write that started before
// the rebuild (its leg set without the replica) marks the log only when
// it finishes; the copier looks at the log only after it did, so a
// region it marks behind the first dirty one is copied too.
func TestRebuildIncrementalWaitsForOlderWrites(t *testing.T) {
	g := &drlRig{local: newFakeLocal(t, false, nil), leg: newFakeLeg(t, nil)}
	g.local.trackAlloc()
	b, err := New(Config{Local: g.local, Reporter: &okReporter{}, Epoch: 1, Depth: 16, DirtyRegion: testRegion})
	if err != nil {
		t.Fatal(err)
	}
	g.b = b
	g.leg.submitErr = errors.New("connection lost")
	if err := b.SetPeers(1, []Peer{{Node: "node-r", NS: g.leg}}); err != nil {
		t.Fatal(err)
	}
	h := g.submit(target.OpWrite, 200, 1, pattern(testBlock, 1)) // region 50: the replica leaves
	g.local.complete(t, 0, nil)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	if err := b.SetPeers(1, nil); err != nil {
		t.Fatal(err)
	}
	older := g.submit(target.OpWrite, 40, 1, pattern(testBlock, 2)) // region 10, in flight
	leg := newFakeLeg(t, nil)
	leg.mem = g.leg.mem
	leg.async = func(cmd) error { return nil }
	rb, err := b.StartRebuild(1, RebuildConfig{Node: "node-r", NS: leg, UseDirtyLog: true,
		Mapped: g.local.mapped, Read: g.local.read, Promote: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if rb.win.Load() != nil {
		t.Fatal("the copier set a window while a write that started before it was in flight")
	}
	g.local.complete(t, 0, nil)
	if err := older.wait(t); err != nil {
		t.Fatal(err)
	}
	if err := waitRebuild(t, rb); err != nil {
		t.Fatal(err)
	}
	leg.wg.Wait()
	sameStores(t, g.local, leg)
	if rb.Copied() != 2*testBlock {
		t.Fatalf("copied %d bytes, want the blocks mapped in regions 10 and 50", rb.Copied())
	}
}

// TestLegLost: a leg whose connection is gone for good while idle is
// dropped as a missed write (reported, writes skipping it held until the
// registry answered), with a dirty-region log from then on; a lost
// connection that is not the peer's current leg changes nothing.
func TestLegLost(t *testing.T) {
	rep := newFakeReporter()
	g := newDRLRig(t, rep)
	g.leg.async = func(cmd) error { return nil }
	other := newFakeLeg(t, nil)
	cause := errors.New("initiator: controller lost")
	if g.b.LegLost("node-r", other, cause) || g.b.LegLost("node-x", g.leg, cause) {
		t.Fatal("LegLost dropped a peer for another connection or node")
	}
	if !g.b.LegLost("node-r", g.leg, cause) {
		t.Fatal("LegLost kept the peer")
	}
	h := g.submit(target.OpWrite, 9, 1, pattern(testBlock, 9))
	r := rep.next(t)
	if r.node != "node-r" || !strings.Contains(r.reason, "controller lost") {
		t.Fatalf("report %+v", r)
	}
	if h.isDone() {
		t.Fatal("a write skipping the lost replica completed before the registry recorded it")
	}
	r.answer <- nil
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	if n, ok := g.b.DirtyBytes("node-r"); !ok || n != testRegion {
		t.Fatalf("dirty-region log %d bytes (%v), want the one region written since", n, ok)
	}
	if g.b.LegLost("node-r", g.leg, cause) {
		t.Fatal("LegLost twice")
	}
}
