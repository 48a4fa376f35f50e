package repl

import (
	"context"
	"fmt"
	"time"

	"github.com/blk-project/blk/target"
)

// The range hold (docs/replication.md §5, "Verify"): a barrier over a
// range of blocks. `volume verify` compares a region's hash on the
// primary with its hash on each replica; hashed at different moments
// while a host writes there, the two may differ although no byte is
// lost (a write on one copy and still on its way to the other, or one
// landing between the two reads). HoldRange makes the moments one: it
// holds the writes that overlap the range (writes, write zeroes,
// deallocates; not flushes, which change no byte), waits until every
// write in flight has completed on every leg, runs fn, and releases the
// held writes in arrival order, as Barrier does for the whole volume.
// While fn runs no write to the range is anywhere between the host and a
// copy: every copy in sync holds the same bytes there, or it missed a
// write.
//
// The gate is the barrier's (barrier.go): a write takes its record, then
// loads b.heldRange (after b.gated); HoldRange stores b.heldRange, then
// waits for every record in use. Go's atomics are sequentially
// consistent: either the write saw the range (and is held, if it
// overlaps), or the wait sees its record in use and lasts until it
// completed on every leg. It waits for every record in use, not only the
// overlapping ones: each write in flight ends within its legs' latency,
// and one walk is simpler than a range index. A write whose rebuilding
// leg is held on a rebuild's window is waited for too: it lands with its
// window, and the copier is not held.
//
// A range hold takes the barrier's slot (one barrier or range hold at a
// time) and does not end a rebuild in progress. A write outside the
// range is not held, but while the range is held it takes b.gateMu once
// (holdIO): a hold lasts a region's hashing, a few milliseconds.

// blockRange is the range of blocks HoldRange holds the writes of.
type blockRange struct{ lo, hi uint64 }

// overlaps says whether io changes a block of f.
func (f *blockRange) overlaps(io *target.IO, shift uint) bool {
	if io.Op == target.OpFlush {
		return false
	}
	n := io.Blocks
	if io.Op == target.OpWrite {
		n = uint64(len(io.Data)) >> shift
	}
	return io.LBA < f.hi && io.LBA+n > f.lo
}

// HoldRange holds the writes to blocks [lba, lba+blocks), waits until no
// write is in flight on any leg, runs fn, and releases the held writes
// (see the top of the file). held is how long writes to the range were
// held. ctx bounds the wait for another barrier or range hold and the
// drain: when it ends first, the writes are released, fn does not run
// and HoldRange returns ErrBarrierTimeout. fn is not bounded by ctx (it runs on
// the caller's goroutine): it should honour ctx itself. A backend that
// does not serve refuses (ErrNotServing).
func (b *Backend) HoldRange(ctx context.Context, lba, blocks uint64, fn func() error) (held time.Duration, err error) {
	if fn == nil || blocks == 0 || lba+blocks < lba {
		return 0, fmt.Errorf("%w: range hold of %d blocks at LBA %d (fn set: %v)", ErrInvalid, blocks, lba, fn != nil)
	}
	select {
	case b.barrier <- struct{}{}:
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: waiting for another barrier: %w", ErrBarrierTimeout, ctx.Err())
	}
	defer func() { <-b.barrier }()
	if !b.serving.Load() {
		return 0, ErrNotServing
	}
	b.rangeHolds.Add(1)
	start := time.Now()
	b.gateMu.Lock()
	b.heldRange.Store(&blockRange{lo: lba, hi: lba + blocks})
	b.gateMu.Unlock()
	defer func() {
		held = time.Since(start)
		b.release()
	}()
	if err := b.waitIdle(ctx, false, nil); err != nil {
		return 0, fmt.Errorf("%w: writes in flight: %w", ErrBarrierTimeout, err)
	}
	if !b.serving.Load() {
		return 0, ErrNotServing
	}
	return 0, fn()
}
