//go:build linux

package transport

import (
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/internal/epoll"
)

// pollSet is a core's epoll set and the flag that stops its goroutine
// (core_poll.go). The Loop's own eventfd carries Wake's kicks.
type pollSet struct {
	loop epoll.Loop
	halt atomic.Bool
}

// newPollSet opens a core's poll set; its goroutine is started by the
// caller.
func newPollSet() (*pollSet, error) {
	ps := &pollSet{}
	if err := ps.loop.Init("transport-core-poll", ps.stopped); err != nil {
		return nil, err
	}
	return ps, nil
}

func (ps *pollSet) kick()         { ps.loop.Kick() }
func (ps *pollSet) stopped() bool { return ps.halt.Load() }

// add watches fd, edge-triggered; the events carry slot 0, which names
// nothing: any event means "call HandlePoll".
func (ps *pollSet) add(fd int) error { return ps.loop.Add(fd, unix.EPOLLIN|unix.EPOLLET, 0, 0) }

// wait sleeps until a descriptor fires, a kick or a stop.
func (ps *pollSet) wait() { ps.loop.Wait(true) }

func (ps *pollSet) stop() {
	ps.halt.Store(true)
	ps.loop.Kick()
}

// end closes the loop's descriptors; its goroutine, last.
func (ps *pollSet) end() { ps.loop.End() }
