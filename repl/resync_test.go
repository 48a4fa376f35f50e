package repl

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/blk-project/blk/target"
)

// legDigests is RemoteDigests over a fake leg's memory, every block
// counted as mapped (a replica's store may hold zeros in clusters the
// primary never wrote: the digests must agree anyway).
func legDigests(leg *fakeLeg, calls *atomic.Int32) RemoteDigestsFunc {
	return func(ctx context.Context, lba uint64, out []Digest) error {
		calls.Add(1)
		src := DigestSource{
			Mapped:     func(from, to uint64, fn func(lba, blocks uint64) error) error { return fn(from, to-from) },
			Read:       leg.mem.Read,
			BlockShift: 12,
			Blocks:     testBlocks,
		}
		_, err := src.Digests(lba, DigestRegionBytes/testBlock, nil, out)
		return err
	}
}

// TestRebuildCompare: a compare rebuild of a replica that differs from
// the primary in a few seeded places copies exactly the regions that
// differ (none when nothing does), while host writes race it in some
// rounds; afterwards the two hold the same bytes everywhere.
func TestRebuildCompare(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	defer func(b int) { digestBatch = b }(digestBatch)
	const per = DigestRegionBytes / testBlock // blocks per region
	for round := range 6 {
		digestBatch = []int{DigestBatch, 5, 1}[round%3]
		hosts := round >= 3
		g := newRebuildRig(t)
		g.leg.async = func(c cmd) error {
			for range int(c.lba*7+c.blocks) % 5 {
				runtime.Gosched()
			}
			return nil
		}
		// The same data on both, then a few writes on one side only.
		for range 200 {
			lba := rng.Uint64N(testBlocks)
			data := pattern(testBlock, byte(rng.Uint32()))
			g.localWrite(t, lba, data)
			_ = g.leg.mem.Write(lba, data, false)
		}
		differ := map[uint64]bool{}
		for range rng.IntN(6) {
			lba := rng.Uint64N(testBlocks)
			data := pattern(testBlock, byte(rng.Uint32())|1)
			if rng.IntN(2) == 0 {
				g.localWrite(t, lba, data)
			} else {
				_ = g.leg.mem.Write(lba, data, false)
			}
			differ[lba/per] = true
		}
		// A region may have stopped differing by chance (a write of
		// equal bytes): count what the stores say.
		want := uint64(0)
		a, b := make([]byte, DigestRegionBytes), make([]byte, DigestRegionBytes)
		for reg := range differ {
			_ = g.local.mem.Read(reg*per, a)
			_ = g.leg.mem.Read(reg*per, b)
			if !bytes.Equal(a, b) {
				want += DigestRegionBytes
			}
		}
		var calls atomic.Int32
		cfg := g.config()
		cfg.RegionBytes = 4 * DigestRegionBytes
		cfg.MaxTransfer = 8 * testBlock
		cfg.RemoteDigests = legDigests(g.leg, &calls)
		rb, err := g.b.StartRebuild(3, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if rb.Mode() != "compare" {
			t.Fatalf("mode %q", rb.Mode())
		}
		stop := func() int32 { return 0 }
		if hosts {
			stop = hostWriters(t, seed, uint64(round*10+2), 3, 100, true, nil, g.submit, func(r *rand.Rand, w int) (uint64, uint64, bool) {
				return r.Uint64N(testBlocks/3)*3 + uint64(w), 1, true
			})
		}
		err = waitRebuild(t, rb)
		if failed := stop(); err != nil || failed != 0 {
			t.Fatalf("round %d: rebuild: %v", round, err)
		}
		g.leg.wg.Wait()
		sameStores(t, g.local, g.leg)
		wantCalls := (testBlocks/per + digestBatch - 1) / digestBatch
		if int(calls.Load()) != wantCalls {
			t.Fatalf("round %d: %d digest calls, want %d", round, calls.Load(), wantCalls)
		}
		// Without host writes, exactly the regions that differ; with
		// them, a region may also look different for a moment (a write
		// on one copy and still on its way to the other when the
		// digests are read): copying it is harmless.
		if got := rb.Differ(); !hosts && got != want {
			t.Fatalf("round %d: %d bytes found to differ, %d did", round, got, want)
		}
		if rb.Copied() > rb.Differ() {
			t.Fatalf("round %d: copied %d bytes, more than the %d that differed", round, rb.Copied(), rb.Differ())
		}
		if done, total := rb.Progress(); done != total || total != testBlocks*testBlock {
			t.Fatalf("progress %d/%d", done, total)
		}
		if g.promoted.Load() != 1 {
			t.Fatalf("promoted %d times", g.promoted.Load())
		}
	}
}

// TestRebuildCompareDigestsFail: a replica that cannot answer its
// digests fails the rebuild like a failed command (the replica leaves
// the leg set, nothing promoted), and the host's writes go on.
func TestRebuildCompareDigestsFail(t *testing.T) {
	g := newRebuildRig(t)
	g.leg.async = func(cmd) error { return nil }
	cfg := g.config()
	refusal := errors.New("node-r: 503")
	cfg.RemoteDigests = func(context.Context, uint64, []Digest) error { return refusal }
	rb, err := g.b.StartRebuild(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitRebuild(t, rb); !errors.Is(err, ErrRebuildLeg) || !errors.Is(err, refusal) {
		t.Fatalf("rebuild ended with %v", err)
	}
	if g.promoted.Load() != 0 {
		t.Fatal("promoted")
	}
	if err := g.submit(target.OpWrite, 3, 1, pattern(testBlock, 4)).wait(t); err != nil {
		t.Fatal(err)
	}
	if st := g.b.Stats(); st.Peers[0].State != "rebuild-failed" {
		t.Fatalf("state %q", st.Peers[0].State)
	}
}

// TestDigests: the digest of a region is the SHA-256 of its bytes
// whether or not it is mapped, the short last region included, and an
// unmapped region is not read; a range off the volume is refused.
func TestDigests(t *testing.T) {
	const blocks = 100 // regions of 16: six whole, one of 4
	mem, err := target.NewMemBackend(testBlock, blocks)
	if err != nil {
		t.Fatal(err)
	}
	_ = mem.Write(17, pattern(testBlock, 9), false)
	_ = mem.Write(97, pattern(testBlock, 3), false)
	var reads atomic.Int32
	src := DigestSource{
		Mapped: func(from, to uint64, fn func(lba, blocks uint64) error) error {
			for _, b := range []uint64{17, 97} {
				if b >= from && b < to {
					if err := fn(b, 1); err != nil {
						return err
					}
				}
			}
			return nil
		},
		Read:       func(lba uint64, buf []byte) error { reads.Add(1); return mem.Read(lba, buf) },
		BlockShift: 12,
		Blocks:     blocks,
	}
	out := make([]Digest, 7)
	n, err := src.Digests(0, 16, make([]byte, 2*DigestRegionBytes), out)
	if err != nil {
		t.Fatal(err)
	}
	if n != DigestRegionBytes+4*testBlock || reads.Load() != 2 {
		t.Fatalf("read %d bytes in %d reads, want the two mapped regions", n, reads.Load())
	}
	for i := range out {
		lo, hi := uint64(i*16), min(uint64(i*16+16), blocks)
		buf := make([]byte, (hi-lo)*testBlock)
		_ = mem.Read(lo, buf)
		if out[i] != Digest(sha256.Sum256(buf)) {
			t.Fatalf("region %d: digest differs from its bytes' SHA-256", i)
		}
	}
	for _, c := range []struct{ lba, regions uint64 }{{8, 1}, {96, 2}, {112, 1}, {0, 8}} {
		if _, err := src.Digests(c.lba, 16, nil, make([]Digest, c.regions)); !errors.Is(err, ErrDigestRange) {
			t.Fatalf("%d regions at %d: %v, want ErrDigestRange", c.regions, c.lba, err)
		}
	}
}

// TestDiverged: DivergedRegions finds the runs of regions where an
// in-sync replica differs (and nothing where it does not); Diverged
// takes it out of sync as a missed write is (reported with its own
// reason, writes held until the registry answered, skipped after), with
// no usable dirty-region log, so its rebuild is a compare that copies
// back exactly the regions that differ.
func TestDiverged(t *testing.T) {
	rep := newFakeReporter()
	g := newDRLRig(t, rep)
	g.leg.async = func(cmd) error { return nil }
	const per = DigestRegionBytes / testBlock
	for lba := uint64(0); lba < testBlocks; lba += 5 {
		data := pattern(testBlock, byte(lba))
		if err := g.submit(target.OpWrite, lba, 1, data).wait(t); err != nil {
			t.Fatal(err)
		}
	}
	g.leg.wg.Wait()
	src := DigestSource{Mapped: g.local.mapped, Read: g.local.read, BlockShift: 12, Blocks: testBlocks}
	var calls atomic.Int32
	runs, err := DivergedRegions(context.Background(), src, legDigests(g.leg, &calls), nil, nil)
	if err != nil || len(runs) != 0 {
		t.Fatalf("an equal replica: runs %v, %v", runs, err)
	}
	// Writes in flight at a change of primary that reached this replica
	// only: regions 3 and 4, and 40.
	_ = g.leg.mem.Write(3*per+1, pattern(testBlock, 0xee), false)
	_ = g.leg.mem.Write(4*per+2, pattern(testBlock, 0xee), false)
	_ = g.leg.mem.Write(40*per, pattern(testBlock, 0xee), false)
	defer func(b int) { digestBatch = b }(digestBatch)
	digestBatch = 4 // runs across batches: 3 and 4 are in two
	runs, err = DivergedRegions(context.Background(), src, legDigests(g.leg, &calls), nil, nil)
	want := [][2]uint64{{3 * per, 4 * per}, {4 * per, 5 * per}, {40 * per, 41 * per}}
	if err != nil || len(runs) != len(want) || runs[0] != want[0] || runs[1] != want[1] || runs[2] != want[2] {
		t.Fatalf("runs %v, %v; want %v", runs, err, want)
	}

	if g.b.Diverged("node-x", ErrDiverged) {
		t.Fatal("Diverged of no peer")
	}
	cause := fmt.Errorf("%w: 3 regions at epoch 1", ErrDiverged)
	if !g.b.Diverged("node-r", cause) {
		t.Fatal("Diverged refused the in-sync peer")
	}
	h := g.submit(target.OpWrite, 7, 1, pattern(testBlock, 7))
	r := rep.next(t)
	if r.node != "node-r" || r.reason != cause.Error() {
		t.Fatalf("report %+v", r)
	}
	if h.isDone() {
		t.Fatal("a write skipping the diverged replica completed before the registry recorded it")
	}
	r.answer <- nil
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	if g.b.Diverged("node-r", cause) {
		t.Fatal("Diverged twice")
	}
	if _, ok := g.b.DirtyBytes("node-r"); ok {
		t.Fatal("a usable dirty-region log of a diverged replica")
	}
	if err := g.b.SetPeers(1, nil); err != nil { // the registry took it out
		t.Fatal(err)
	}
	leg := newFakeLeg(t, nil)
	leg.async = func(cmd) error { return nil }
	leg.mem = g.leg.mem
	rb, err := g.b.StartRebuild(1, RebuildConfig{Node: "node-r", NS: leg, Mapped: g.local.mapped, Read: g.local.read,
		UseDirtyLog: true, RemoteDigests: legDigests(leg, &calls), Promote: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitRebuild(t, rb); err != nil {
		t.Fatal(err)
	}
	leg.wg.Wait()
	// The three, and region 0: the write at 7 skipped the replica.
	if rb.Mode() != "compare" || rb.Differ() != 4*DigestRegionBytes {
		t.Fatalf("rebuild %s, %d bytes differed; want a compare of 4 regions", rb.Mode(), rb.Differ())
	}
	sameStores(t, g.local, leg)
}
