package target

import "github.com/blk-project/blk/nvme"

// ResvCheck runs the I/O path's reservation check for a command of q on
// namespace nsid (a write-group command if write), as resvCheck does
// after acquireNS, and uncounts it as complete would: for
// BenchmarkReservationCheck, the check alone.
func ResvCheck(q *Queue, r *Request, nsid uint32, write bool) nvme.Status {
	c := q.ctrl.Load()
	ns := c.s.table().find(nsid)
	st := q.resvCheck(c, ns, r, write)
	q.drainExit(r)
	return st
}
