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

// execute hands r to the core; a fused first is noted first, so that
// its second may have a buffer.
func (r *req) execute() {
	if r.Cmd.Fuse() == nvme.FlagFuseFirst {
		r.conn.firstRun.Mark(r.Seq, true)
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
