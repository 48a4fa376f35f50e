package repl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/internal/lfstack"
)

// Peer states. A peer leaves peerInSync at most once (its first missed
// write), and peerFailing once, for one of the two verdicts. A peer
// added by StartRebuild starts in peerRebuilding and ends in peerInSync
// (through peerPromoting) or peerDropped.
const (
	peerInSync  uint32 = iota // takes every write
	peerFailing               // missed a write; reported, unconfirmed: writes are held on it
	peerOut                   // the registry confirmed it out of sync: writes skip it
	peerRefused               // the report failed or timed out: writes it missed fail
	// peerRebuilding: being copied to (rebuild.go) and sent every write,
	// but the registry does not count it: a failure ends the rebuild
	// (peerDropped) and holds no host write.
	peerRebuilding
	// peerPromoting: copied; the registry is being asked to count it in
	// sync. It may have committed already, so a failure now is an
	// in-sync replica's (peerFailing, reported).
	peerPromoting
	peerDropped // its rebuild failed or was cancelled: writes skip it
)

var peerStateNames = [...]string{peerInSync: "in-sync", peerFailing: "failing", peerOut: "out-of-sync",
	peerRefused: "unconfirmed", peerRebuilding: "rebuilding", peerPromoting: "promoting", peerDropped: "rebuild-failed"}

// sending reports whether writes go to a peer in state st.
func sending(st uint32) bool {
	return st == peerInSync || st == peerRebuilding || st == peerPromoting
}

// peer is one remote replica in one epoch.
type peer struct {
	b         *Backend
	node      string
	ns        Leg
	epoch     uint64
	maxBlocks uint64 // blocks per write command
	state     atomic.Uint32
	rb        *Rebuild // the rebuild that added it (StartRebuild), or nil
	// verdict is closed once the registry's answer to its report is in
	// state (peerOut or peerRefused): a barrier that dropped it waits.
	verdict chan struct{}
	// waiting are the records held until the verdict: pushed by any
	// completion, taken by whoever sees the verdict (see hold).
	waiting lfstack.Stack[record]

	// The backlog: legs that found every slot of the connection busy
	// (initiator.ErrQueueFull), in arrival order, sent again as slots
	// free (see park and kick). queued counts them, with the one a
	// drainer is trying: the normal path reads it once per leg (a new
	// leg queues behind them) and once per completion (kick if
	// non-zero). inflight counts the peer's commands submitted and not
	// completed: a leg that parks with none in flight has no completion
	// coming to wake it and kicks itself.
	queued   atomic.Int32
	inflight atomic.Int64
	bl       backlog

	writes, failures, held, backlogged atomic.Uint64
}

// backlog is a peer's FIFO of parked legs, linked through leg.nextBL.
// A mutex guards it: it is taken only when a leg parks (the connection
// was full) or while legs wait (queued ≠ 0), never on the normal path.
// A lock-free stack (lfstack) would give the legs back newest first and
// cannot put one back at the head, which FIFO order (no starvation)
// needs when a retried leg finds the connection full again.
type backlog struct {
	mu         sync.Mutex
	head, tail *leg
	draining   bool        // a kick is sending legs (one at a time: order)
	again      bool        // a kick came while draining: look once more
	armed      bool        // timer set
	timer      *time.Timer // tick: retry and expire while legs wait
}

// backlogTick is how often a peer's backlog is retried and its expired
// legs failed while it holds legs, with or without completions (at most
// a quarter of HoldTimeout): the safety net for a connection full of
// commands that are not this peer's (no completion of ours comes).
const backlogTick = 10 * time.Millisecond

// ErrBacklogTimeout: a leg waited longer than HoldTimeout for a slot of
// its replica's connection; the leg fails (the replica accepts nothing).
var ErrBacklogTimeout = errors.New("repl: replica connection full for longer than the hold timeout")

func newPeer(b *Backend, node string, ns Leg, epoch, maxBlocks uint64) *peer {
	p := &peer{b: b, node: node, ns: ns, epoch: epoch, maxBlocks: maxBlocks, verdict: make(chan struct{})}
	p.bl.timer = time.AfterFunc(time.Hour, p.tick)
	p.bl.timer.Stop()
	return p
}

// park appends l, whose command l.k found the connection full (or the
// backlog non-empty), to the backlog. The caller gives up the leg. With
// nothing of the peer's in flight (all completed since the submit
// failed: their kicks saw no leg) or the peer failing (its drain may
// have run before the push), it kicks at once; otherwise a completion
// will: each decrements inflight, then reads queued, and park does the
// reverse, so one of them sees the other.
func (p *peer) park(l *leg) {
	p.backlogged.Add(1)
	l.parked = p.b.now()
	bl := &p.bl
	bl.mu.Lock()
	l.nextBL = nil
	if bl.tail == nil {
		bl.head = l
	} else {
		bl.tail.nextBL = l
	}
	bl.tail = l
	p.queued.Add(1)
	p.arm()
	bl.mu.Unlock()
	if p.inflight.Load() == 0 || !sending(p.state.Load()) {
		p.kick()
	}
}

// arm sets the backlog's timer if it is not set. Under bl.mu.
func (p *peer) arm() {
	if !p.bl.armed {
		p.bl.armed = true
		p.bl.timer.Reset(p.b.tick)
	}
}

// tick is the backlog timer: it retries the legs and expires the old
// ones; a leg left in the backlog sets it again (kick's put-back).
func (p *peer) tick() {
	p.bl.mu.Lock()
	p.bl.armed = false
	p.bl.mu.Unlock()
	p.kick()
}

// kick sends the backlog's legs in order while the connection takes
// them: one drainer at a time (a kick meanwhile makes it look again).
// Each leg taken off is resolved outside the lock: skipped if the peer
// failed meanwhile (held on its verdict like any write that skipped it,
// see leg.skip), failed if it waited longer than HoldTimeout
// (ErrBacklogTimeout, the failure path), else resumed; a leg that finds
// the connection full again goes back to the head and the drain stops
// until the next completion or tick.
func (p *peer) kick() {
	bl := &p.bl
	bl.mu.Lock()
	if bl.draining {
		bl.again = true
		bl.mu.Unlock()
		return
	}
	bl.draining = true
	for {
		bl.again = false
		l := bl.head
		if l == nil {
			bl.draining = false
			bl.mu.Unlock()
			return
		}
		bl.head = l.nextBL
		if bl.head == nil {
			bl.tail = nil
		}
		l.nextBL = nil
		bl.mu.Unlock()
		switch {
		case !sending(p.state.Load()):
			p.queued.Add(-1)
			l.skip()
		case p.b.now()-l.parked > int64(p.b.hold):
			p.queued.Add(-1)
			l.abort(int32(l.n-l.k), ErrBacklogTimeout)
		case l.resume():
			p.queued.Add(-1)
		default: // full again: back to the head
			bl.mu.Lock()
			l.nextBL = bl.head
			bl.head = l
			if bl.tail == nil {
				bl.tail = l
			}
			p.arm()
			if !bl.again {
				bl.draining = false
				bl.mu.Unlock()
				return
			}
			continue
		}
		bl.mu.Lock()
	}
}

// missed records that the peer failed a command (err: the leg's error)
// and, the first time, reports it to the registry on a goroutine of its
// own; a rebuilding peer's failure ends its rebuild instead (no report:
// the registry does not count it in sync, and the rebuild's end tells
// the lead). Any goroutine; it never blocks.
func (p *peer) missed(err error) {
	p.failures.Add(1)
	for {
		switch st := p.state.Load(); st {
		case peerInSync, peerPromoting:
			// The log first: a write that sees the peer failing finds
			// it when it finishes. A promotion that lands meanwhile drops
			// the log it found (Rebuild.promote, under drlMu, with its own
			// state change): this CAS then fails and the loop makes one.
			p.b.keepDirty(p)
			if !p.state.CompareAndSwap(st, peerFailing) {
				continue
			}
			go p.report(err)
			if p.rb != nil {
				p.rb.fail(fmt.Errorf("%w: %w", ErrRebuildLeg, err))
			}
		case peerRebuilding:
			if !p.state.CompareAndSwap(st, peerDropped) {
				continue
			}
			p.rb.fail(fmt.Errorf("%w: %w", ErrRebuildLeg, err))
		default:
			return
		}
		p.kick() // its backlog's legs are skipped now
		return
	}
}

// report asks the registry to mark the peer out of sync and settles the
// writes held on it with the answer; HoldTimeout bounds the wait, also
// for a Reporter that ignores its context.
func (p *peer) report(cause error) {
	b := p.b
	reason := fmt.Sprintf("missed a write: %v", cause)
	if errors.Is(cause, ErrDiverged) {
		reason = cause.Error()
	}
	b.log.Warn("replica missed a write: reporting it out of sync", "node", p.node, "epoch", p.epoch, "error", cause)
	ctx, cancel := context.WithTimeout(context.Background(), b.hold)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- b.rep.ReplicaFailed(ctx, p.node, p.epoch, reason) }()
	var err error
	select {
	case err = <-res:
	case <-ctx.Done():
		err = fmt.Errorf("%w: %v", ErrHoldTimeout, b.hold)
	}
	if err != nil {
		// Nobody may acknowledge a write this replica lacks: not serving
		// first, so no new write gets past Submit, then the verdict.
		b.stop()
		p.state.Store(peerRefused)
		b.log.Error("replica out of sync not confirmed: not serving", "node", p.node, "epoch", p.epoch, "error", err)
	} else {
		p.state.Store(peerOut)
		b.log.Info("replica out of sync confirmed", "node", p.node, "epoch", p.epoch)
	}
	close(p.verdict)
	p.drain()
}

// hold parks r until the peer's verdict. The verdict is stored before
// its drain, and r pushed before the state is read again: either the
// drain takes r, or this goroutine sees the verdict and drains itself
// (lfstack's TakeAll is a swap: each record is taken once).
func (p *peer) hold(r *record) {
	p.held.Add(1)
	p.waiting.Push(r, &r.next)
	if p.state.Load() != peerFailing {
		p.drain()
	}
}

// drain settles every record held on the peer.
func (p *peer) drain() {
	for r := p.waiting.TakeAll(); r != nil; {
		next := r.next
		r.next = nil
		r.settle()
		r = next
	}
}

// LegLost records that the connection behind ns, node's leg, is gone
// for good (its Controller lost: the lead watches it) although no
// command may have failed on it: the replica is dropped as if it had
// missed a write (reported if in sync, its rebuild ended if rebuilding),
// so that a replica that went away while idle does not stay counted in
// sync until the next write. Only the peer that writes through ns: a
// newer leg to the same node is left alone. It returns whether it
// dropped one.
func (b *Backend) LegLost(node string, ns Leg, cause error) bool {
	p := b.set.Load().find(node)
	if p == nil || !sameLeg(p.ns, ns) {
		return false
	}
	switch p.state.Load() {
	case peerInSync, peerPromoting, peerRebuilding:
		p.missed(cause)
		return true
	}
	return false
}
