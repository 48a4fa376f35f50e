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
	q.drainExit(q.drainTake(r))
	return st
}

// FeaturesServed lists the features the controller of q serves
// (featureServed), in FID order: TestIdentifyMatchesBehaviour asks each.
func FeaturesServed(q *Queue) []uint8 {
	c := q.ctrl.Load()
	var out []uint8
	for fid := range 256 {
		if c.featureServed(uint8(fid)) {
			out = append(out, uint8(fid))
		}
	}
	return out
}
