//go:build linux

package tcp

import "github.com/blk-project/blk/nvme"

// Fused Compare and Write and the data buffers (docs/reservations.md
// §2.2). A fused first holds its buffer while it waits in the core for
// its second; were every buffer held by such firsts, their seconds would
// wait for a buffer for ever. So each pool keeps Config.FusedReserve
// buffers that only these may take:
//
//   - a second whose first has executed (it waits in the core): once its
//     data is in, the pair runs at once and gives both buffers back;
//   - a command that is not a second but follows a first (it ends that
//     first with Missing Fused Command and runs as usual).
//
// A second whose first has not executed yet (its data still coming)
// takes no data buffer at all, reserved or not: it would wait in the
// core for that first holding it, and were every buffer so held, the
// firsts would wait for one for ever (TestFusedBufferExhaustion found
// exactly that). Such commands wait in the fused FIFOs, looked at before
// the others and each in turn, until their first has run. So a second
// holds a buffer only when its pair can run at once, and a first waits
// only for seconds that can always get one. (An in-capsule second is
// read only after its first's in-capsule data, so its first has run.)
//
// Which firsts have run is conn.firstRun (target.FirstRun, shared with
// target/rdma), which also decides MayReserve and SecondEarly.

// firstRan notes that fused first r executed, and lets runWaiters look
// at its second.
func (c *conn) firstRan(r *req) {
	c.firstRun.Mark(r.Seq, true)
	if c.g.waitingFused.n+c.g.waitingCapsuleFused.n > 0 {
		c.g.freed = true
	}
}

// wait queues r for a data buffer.
func (g *group) wait(r *req) {
	if r.PrevFuse == nvme.FlagFuseFirst {
		g.waitingFused.push(r)
		return
	}
	g.waiting.push(r)
}

// waitCapsule queues r for an in-capsule buffer.
func (g *group) waitCapsule(r *req) {
	if r.PrevFuse == nvme.FlagFuseFirst {
		g.waitingCapsuleFused.push(r)
		return
	}
	g.waitingCapsule.push(r)
}

// waiters is the commands waiting for a buffer.
func (g *group) waiters() int {
	return g.waiting.n + g.waitingCapsule.n + g.waitingFused.n + g.waitingCapsuleFused.n
}

// runFusedWaiters starts every command of the fused FIFOs that can have
// a buffer now, in order.
func (g *group) runFusedWaiters() bool {
	worked := false
	for _, f := range []struct {
		q      *reqFIFO
		attach func(*req) bool
	}{{&g.waitingFused, g.attach}, {&g.waitingCapsuleFused, g.attachCapsule}} {
		var prev *req
		for r := f.q.head; r != nil; {
			next := r.wnext
			if !f.attach(r) {
				prev = r
				r = next
				continue
			}
			f.q.unlink(prev, r)
			worked = true
			r.c.gotBuffer(r)
			r = next
		}
	}
	return worked
}
