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

// mayReserve reports whether r may take a reserved buffer.
func (c *conn) mayReserve(r *req) bool {
	if r.PrevFuse != nvme.FlagFuseFirst {
		return false
	}
	return r.Cmd.Fuse() != nvme.FlagFuseSecond || c.ranFirst(r.Seq-1)
}

// firstWords sizes conn.firstRun for a queue of entries commands: a
// power of two of bits, at least twice the commands in flight, so that a
// bit is cleared by the next arrival of its number only long after its
// pair is done.
func firstWords(entries uint32) int {
	bits := uint32(64)
	for bits < 2*entries {
		bits <<= 1
	}
	return int(bits / 64)
}

// markFirst sets or clears the bit of arrival number seq.
func (c *conn) markFirst(seq uint32, ran bool) {
	i := seq % uint32(len(c.firstRun)*64)
	if ran {
		c.firstRun[i/64] |= 1 << (i % 64)
	} else {
		c.firstRun[i/64] &^= 1 << (i % 64)
	}
}

// ranFirst reports whether the fused first of arrival number seq has
// executed.
func (c *conn) ranFirst(seq uint32) bool {
	i := seq % uint32(len(c.firstRun)*64)
	return c.firstRun[i/64]&(1<<(i%64)) != 0
}

// secondEarly reports whether r is a fused second whose first has not
// executed yet.
func (c *conn) secondEarly(r *req) bool {
	return r.Cmd.Fuse() == nvme.FlagFuseSecond && r.PrevFuse == nvme.FlagFuseFirst && !c.ranFirst(r.Seq-1)
}

// firstRan notes that fused first r executed, and lets runWaiters look
// at its second.
func (c *conn) firstRan(r *req) {
	c.markFirst(r.Seq, true)
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
