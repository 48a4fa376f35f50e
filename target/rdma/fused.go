package rdma

import "github.com/blk-project/blk/nvme"

// Fused Compare and Write and the data buffers (docs/reservations.md
// §2.2), as target/tcp's fused.go: a fused first holds its buffer while
// it waits in the core for its second, so each class keeps
// Config.FusedReserve buffers that only a second whose first has
// executed (its pair then runs at once) and a command ending a first
// that has no second may take; and a second whose first has not executed
// yet takes no buffer at all (it would wait holding it). Such commands
// wait in fwait, looked at before the FIFO and each in turn. An
// in-capsule command needs no buffer: its data stays in its receive
// buffer.

// firstWords sizes conn.firstRun for a queue of entries commands: a
// power of two of bits, at least twice the commands in flight.
func firstWords(entries uint32) int {
	bits := uint32(64)
	for bits < 2*entries {
		bits <<= 1
	}
	return int(bits / 64)
}

// markFirst sets or clears the bit of arrival number seq.
func (c *conn) markFirst(seq uint32, ran bool) {
	if len(c.firstRun) == 0 {
		return
	}
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
	if len(c.firstRun) == 0 {
		return false
	}
	i := seq % uint32(len(c.firstRun)*64)
	return c.firstRun[i/64]&(1<<(i%64)) != 0
}

// mayReserve reports whether r may take a reserved buffer.
func (c *conn) mayReserve(r *req) bool {
	if r.PrevFuse != nvme.FlagFuseFirst {
		return false
	}
	return r.Cmd.Fuse() != nvme.FlagFuseSecond || c.ranFirst(r.Seq-1)
}

// secondEarly reports whether r is a fused second whose first has not
// executed yet.
func (c *conn) secondEarly(r *req) bool {
	return r.Cmd.Fuse() == nvme.FlagFuseSecond && r.PrevFuse == nvme.FlagFuseFirst && !c.ranFirst(r.Seq-1)
}

// execute hands r to the core; a fused first is noted first, so that
// its second may have a buffer.
func (r *req) execute() {
	if r.Cmd.Fuse() == nvme.FlagFuseFirst {
		r.conn.markFirst(r.Seq, true)
	}
	r.conn.q.Execute(&r.Request)
}

// wait1 queues r for a data buffer: the fused list or the FIFO.
func (cs *coreState) wait1(r *req) {
	if r.PrevFuse == nvme.FlagFuseFirst {
		cs.fwait = append(cs.fwait, r) // within capacity: one entry per request
		return
	}
	cs.push(r)
}

// runFusedWaiters starts every command of fwait that can have a buffer
// now, keeping the others in order.
func (cs *coreState) runFusedWaiters() {
	k := 0
	for i, r := range cs.fwait {
		cs.fwait[i] = nil
		switch {
		case r.conn.dead.Load():
			r.recycle()
		case cs.attach(r):
			cs.start(r)
		default:
			cs.fwait[k] = r
			k++
		}
	}
	cs.fwait = cs.fwait[:k]
}
