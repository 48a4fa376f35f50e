package target

import "github.com/blk-project/blk/nvme"

// FirstRun is a binding's record, per queue, of which fused firsts have
// executed, by arrival number (Request.Seq): a binding gives a data
// buffer to a fused second only when its pair can run at once
// (docs/reservations.md §2.2; target/tcp's and target/rdma's fused.go).
// Bit Seq mod its length is set when the first of that number executes
// and cleared when its number arrives again. The zero FirstRun records
// nothing: no first has run.
type FirstRun []uint64

// NewFirstRun sizes a FirstRun for a queue of entries commands: a power
// of two of bits, at least twice the commands in flight, so that a bit is
// cleared by the next arrival of its number only long after its pair is
// done.
func NewFirstRun(entries uint32) FirstRun {
	bits := uint32(64)
	for bits < 2*entries {
		bits <<= 1
	}
	return make(FirstRun, bits/64)
}

// Mark sets (ran) or clears the bit of arrival number seq.
func (f FirstRun) Mark(seq uint32, ran bool) {
	if len(f) == 0 {
		return
	}
	i := seq % uint32(len(f)*64)
	if ran {
		f[i/64] |= 1 << (i % 64)
	} else {
		f[i/64] &^= 1 << (i % 64)
	}
}

// Ran reports whether the fused first of arrival number seq has executed.
func (f FirstRun) Ran(seq uint32) bool {
	if len(f) == 0 {
		return false
	}
	i := seq % uint32(len(f)*64)
	return f[i/64]&(1<<(i%64)) != 0
}

// MayReserve reports whether r may take one of the data buffers kept for
// fused pairs: a second whose first has executed, or a command that is
// not a second but follows a first (it ends that first at once).
func (f FirstRun) MayReserve(r *Request) bool {
	if r.PrevFuse != nvme.FlagFuseFirst {
		return false
	}
	return r.Cmd.Fuse() != nvme.FlagFuseSecond || f.Ran(r.Seq-1)
}

// SecondEarly reports whether r is a fused second whose first has not
// executed yet (it takes no data buffer until it has).
func (f FirstRun) SecondEarly(r *Request) bool {
	return r.Cmd.Fuse() == nvme.FlagFuseSecond && r.PrevFuse == nvme.FlagFuseFirst && !f.Ran(r.Seq-1)
}
