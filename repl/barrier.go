package repl

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/blk-project/blk/target"
)

// The barrier (docs/snapshots.md §4.1): a snapshot of a replicated
// volume must hold, on every copy, exactly the writes that completed
// before one point and none after. A write acknowledged to the host is
// on every in-sync leg, but one in flight may have reached some legs and
// not others; so Barrier stops the stream:
//
//  1. Hold. b.gated is set; Submit, having taken its record (uses odd),
//     loads it after the serving check for writes, write zeroes,
//     deallocates and flushes, and when set gives the record back and
//     appends the IO to b.held (made at New with Depth entries; more
//     append, counted) under b.gateMu. Not gated, that is one atomic
//     load per write: no lock, no allocation.
//  2. Drain. waitIdle walks every record, as a rebuild's quiesce does,
//     but waits also for those whose rebuilding leg is held on a window:
//     they land when their window does (the copier is not gated), or at
//     once, since the barrier ends a rebuild in progress first. A write
//     takes its record before it loads the gate and the barrier stores
//     the gate before it loads the records (Go's atomics are
//     sequentially consistent): either the write saw the gate and is
//     held, or the walk waits for its record, until it completed on every
//     leg. A write held on a failing replica's verdict keeps its record
//     until the verdict (at most HoldTimeout).
//  3. fn runs with the replicas in sync (their node IDs, as SetPeers
//     names them) while nothing is in flight. Every in-sync replica it
//     leaves out of took is handled as a failed leg (peer.missed: out of
//     the leg set, reported, later writes held on its verdict), before
//     the release, so that no released write is acknowledged without it
//     until the registry counts it out of sync.
//  4. Release. The gate is cleared and the held IOs resubmitted through
//     Submit in arrival order, from the barrier's goroutine.
//
// The release runs off the host IOs' poll groups, so a local leg it
// submits must not use a group's disk engine (the store's io_uring is
// the group goroutine's alone): submit gives it offGroup as its parent,
// and the local backend serves it on its blocking path on the barrier's
// goroutine (target/store_backend.go: an IO with no poll group). A write
// that arrives during the release is not held and may reach the legs
// before held ones still being resubmitted: none of them has completed,
// so the host cannot tell an order between them (NVMe orders nothing
// between commands in flight together).
//
// A backend that stops serving (stop, SetServing(false)) fails the IOs
// held at that moment with the status it gives every other I/O then
// (failHeld), and any held afterwards at the release (Submit's serving
// check): none waits for the barrier to end.

// Errors of Barrier.
var (
	// ErrBarrierTimeout: the barrier's context ended before the writes
	// in flight drained or fn returned (or while another barrier ran):
	// the held writes were released and no replica was dropped; or
	// before the registry answered the report of a replica fn left out
	// (dropped, its verdict still to come).
	ErrBarrierTimeout = errors.New("repl: barrier did not complete in time")
	// ErrRebuildSnapshot ends a rebuild in progress at a barrier: its copy
	// is a mix of old and new data, not a copy to snapshot; the lead
	// starts it again (Rebuild.Err wraps it; no backoff is called for).
	ErrRebuildSnapshot = errors.New("repl: rebuild ended: snapshot taken")
	// ErrSnapshotMissed: the reason a replica that did not take the
	// barrier's snapshot (left out of fn's took) is reported out of sync.
	ErrSnapshotMissed = errors.New("repl: replica did not take the snapshot")
)

// offGroup is the parent of the local legs the barrier's release
// submits: an IO of no request, on no poll group (IO.Poller gives none).
var offGroup target.IO

// Barrier holds new writes (writes, write zeroes, deallocates, flushes),
// waits for the ones in flight to end on every leg, runs fn with the node
// IDs of the in-sync replicas (those SetPeers gave that have missed no
// write, and a rebuilt one being committed in sync: its copy is
// complete), and releases the held writes in arrival order. Reads go on.
// held is how long writes were held (drain, fn and all).
//
// fn returns the replicas that took the snapshot: each one of inSync it
// leaves out is handled as a failed leg, and Barrier returns once the
// registry confirmed it out of sync (an error if it did not: this
// primary stopped serving). An error from fn fails the barrier and
// drops nobody (the snapshot is abandoned whole). A rebuild in progress
// is ended (ErrRebuildSnapshot): its replica is not in inSync.
//
// ctx bounds the whole: a barrier that cannot drain, or whose fn has not
// returned, when ctx ends releases the writes and returns
// ErrBarrierTimeout (fn, if it runs, is left to finish: its result is
// ignored). One barrier runs at a time; a second waits for the first
// (within its ctx). A backend that does not serve refuses (ErrNotServing).
func (b *Backend) Barrier(ctx context.Context, fn func(inSync []string) (took []string, err error)) (held time.Duration, err error) {
	if fn == nil {
		return 0, fmt.Errorf("%w: barrier with no function", ErrInvalid)
	}
	select {
	case b.barrier <- struct{}{}:
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: waiting for another barrier: %w", ErrBarrierTimeout, ctx.Err())
	}
	owned := true // the barrier slot, unless fn's goroutine took it over
	defer func() {
		if owned {
			<-b.barrier
		}
	}()
	if !b.serving.Load() {
		return 0, ErrNotServing
	}
	b.barriers.Add(1)
	start := time.Now()
	b.gateMu.Lock()
	b.gated.Store(true)
	b.gateMu.Unlock()
	released := false
	release := func() {
		if !released {
			released = true
			held = time.Since(start)
			b.release()
		}
	}
	defer release()

	b.endRebuild()
	if err := b.waitIdle(ctx, false, nil); err != nil {
		return time.Since(start), fmt.Errorf("%w: writes in flight: %w", ErrBarrierTimeout, err)
	}
	if !b.serving.Load() {
		return time.Since(start), ErrNotServing
	}
	set := b.set.Load()
	var inSync []string
	var peers []*peer
	for _, p := range set.peers {
		if st := p.state.Load(); st == peerInSync || st == peerPromoting {
			inSync = append(inSync, p.node)
			peers = append(peers, p)
		}
	}

	// fn on a goroutine of its own, so that one that ignores ctx does not
	// keep the writes held; the next barrier waits for it all the same.
	type result struct {
		took []string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		took, err := fn(slices.Clone(inSync))
		res <- result{took, err}
	}()
	var r result
	select {
	case r = <-res:
	case <-ctx.Done():
		release() // before the slot can go to another barrier
		owned = false
		go func() {
			<-res
			<-b.barrier
		}()
		return held, fmt.Errorf("%w: snapshot: %w", ErrBarrierTimeout, ctx.Err())
	}
	if r.err != nil {
		return time.Since(start), fmt.Errorf("repl: barrier: %w", r.err)
	}
	for _, n := range r.took {
		if !slices.Contains(inSync, n) {
			return time.Since(start), fmt.Errorf("%w: barrier: %s took the snapshot but is not an in-sync replica (%v)", ErrInvalid, n, inSync)
		}
	}
	var dropped []*peer
	for _, p := range peers {
		if !slices.Contains(r.took, p.node) {
			p.missed(ErrSnapshotMissed)
			dropped = append(dropped, p)
		}
	}
	release()
	for _, p := range dropped {
		if p.state.Load() == peerFailing { // reported: by missed, or a failure of its own meanwhile
			select {
			case <-p.verdict:
			case <-ctx.Done():
				return held, fmt.Errorf("%w: %s's report out of sync: %w", ErrBarrierTimeout, p.node, ctx.Err())
			}
		}
		if p.state.Load() == peerRefused {
			return held, fmt.Errorf("%w: %s", ErrUnconfirmed, p.node)
		}
	}
	return held, nil
}

// holdIO keeps io, a write Submit found gated (or a range held), for the
// barrier's (or the range hold's) release; false if the gate was cleared
// meanwhile or io is outside the held range (submit it). r, the record
// Submit took, goes back to the free list once io is queued: a drain
// that waits for it sees io held.
func (b *Backend) holdIO(io *target.IO, r *record) bool {
	b.gateMu.Lock()
	if f := b.heldRange.Load(); !b.gated.Load() && (f == nil || !f.overlaps(io, b.shift)) {
		b.gateMu.Unlock()
		return false
	}
	if len(b.held) == cap(b.held) {
		b.heldOverflows.Add(1)
	}
	b.held = append(b.held, io)
	b.heldIOs.Add(1)
	b.gateMu.Unlock()
	r.uses.Add(1) // even: free, never started
	b.put(r)
	return true
}

// release clears the gate (and the held range) and resubmits the held
// IOs in arrival order. The barrier's (or the range hold's) alone: no IO
// is appended once the gate is clear, and no other barrier or range hold
// sets it before this one returns.
func (b *Backend) release() {
	b.gateMu.Lock()
	b.gated.Store(false)
	b.heldRange.Store(nil)
	q := b.held
	b.gateMu.Unlock()
	for i, io := range q {
		q[i] = nil
		b.submit(io, &offGroup)
	}
	b.gateMu.Lock()
	b.held = q[:0]
	b.gateMu.Unlock()
}

// failHeld fails the IOs held now with the status of a backend that does
// not serve (called once it stopped serving).
func (b *Backend) failHeld() {
	if !b.gated.Load() && b.heldRange.Load() == nil {
		return
	}
	b.gateMu.Lock()
	q := slices.Clone(b.held) // Done outside the lock; a failure path, it may allocate
	clear(b.held)
	b.held = b.held[:0]
	b.gateMu.Unlock()
	for _, io := range q {
		io.Done(errNotServing)
	}
}

// endRebuild ends a rebuild in progress, unless its replica is already
// being committed in sync (it is copied and takes every write: the
// barrier counts it in sync). The CAS decides against promote's.
func (b *Backend) endRebuild() {
	b.mu.Lock()
	rb := b.rb
	b.mu.Unlock()
	if rb == nil {
		return
	}
	if rb.p.state.CompareAndSwap(peerRebuilding, peerDropped) {
		rb.cfg.Logger.Info("rebuild ended by a snapshot; it starts again after", "node", rb.p.node, "epoch", rb.p.epoch)
		rb.fail(ErrRebuildSnapshot)
		rb.p.kick() // its backlog's legs are skipped now
	}
}

// waitIdle waits until every record in use when it looks at it has
// ended that use: then every leg of every write that took its record
// before has completed. exempt skips the records whose rebuilding leg is
// held on a rebuild's window (Rebuild.hold): the copier's own quiesce,
// which would otherwise wait for itself. It returns ctx's error, or
// check's (if set), when they end the wait.
func (b *Backend) waitIdle(ctx context.Context, exempt bool, check func() error) error {
	for i := range b.recs {
		if err := b.waitRecord(ctx, &b.recs[i], exempt, check); err != nil {
			return err
		}
	}
	b.overMu.Lock()
	over := make([]*record, 0, len(b.over))
	for rec := range b.over {
		over = append(over, rec)
	}
	b.overMu.Unlock()
	for _, rec := range over {
		if err := b.waitRecord(ctx, rec, exempt, check); err != nil {
			return err
		}
	}
	return nil
}

// waitRecord waits until rec's current use (if any) ended, or (exempt)
// holds its leg on a window.
func (b *Backend) waitRecord(ctx context.Context, rec *record, exempt bool, check func() error) error {
	u := rec.uses.Load()
	for spin := 0; u&1 != 0 && rec.uses.Load() == u && !(exempt && rec.deferredOn.Load() != nil); spin++ {
		if spin < 16 {
			runtime.Gosched()
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		time.Sleep(min(time.Duration(spin)*10*time.Microsecond, time.Millisecond))
	}
	return nil
}
