package repl

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/blk-project/blk/internal/lfstack"
)

// Peer states. A peer leaves peerInSync at most once (its first missed
// write), and peerFailing once, for one of the two verdicts.
const (
	peerInSync  uint32 = iota // takes every write
	peerFailing               // missed a write; reported, unconfirmed: writes are held on it
	peerOut                   // the registry confirmed it out of sync: writes skip it
	peerRefused               // the report failed or timed out: writes it missed fail
)

var peerStateNames = [...]string{peerInSync: "in-sync", peerFailing: "failing", peerOut: "out-of-sync", peerRefused: "unconfirmed"}

// peer is one remote replica in one epoch.
type peer struct {
	b         *Backend
	node      string
	ns        Leg
	epoch     uint64
	maxBlocks uint64 // blocks per write command
	state     atomic.Uint32
	// waiting are the records held until the verdict: pushed by any
	// completion, taken by whoever sees the verdict (see hold).
	waiting lfstack.Stack[record]

	writes, failures, held atomic.Uint64
}

// missed records that the peer failed a command (err: the leg's error)
// and, the first time, reports it to the registry on a goroutine of its
// own. Any goroutine; it never blocks.
func (p *peer) missed(err error) {
	p.failures.Add(1)
	if p.state.CompareAndSwap(peerInSync, peerFailing) {
		go p.report(err)
	}
}

// report asks the registry to mark the peer out of sync and settles the
// writes held on it with the answer; HoldTimeout bounds the wait, also
// for a Reporter that ignores its context.
func (p *peer) report(cause error) {
	b := p.b
	reason := fmt.Sprintf("missed a write: %v", cause)
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
		b.serving.Store(false)
		p.state.Store(peerRefused)
		b.log.Error("replica out of sync not confirmed: not serving", "node", p.node, "epoch", p.epoch, "error", err)
	} else {
		p.state.Store(peerOut)
		b.log.Info("replica out of sync confirmed", "node", p.node, "epoch", p.epoch)
	}
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
