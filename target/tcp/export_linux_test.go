package tcp

import "golang.org/x/sys/unix"

// GroupThreads returns the OS thread of every poll group (benchmarks
// read their CPU time).
func (p *Port) GroupThreads() []int {
	var tids []int
	for _, g := range p.groups {
		tids = append(tids, int(g.tid.Load()))
	}
	return tids
}

// Gettid is the calling thread's ID.
func Gettid() int { return unix.Gettid() }
