//go:build !linux

package transport

// pollSet: no epoll here, so no core has a poll set (Core.Polling is
// false) and a PollHandler is never called.
type pollSet struct{}

func newPollSet() (*pollSet, error) { return nil, errNoPollSet }

func (ps *pollSet) kick()            {}
func (ps *pollSet) stopped() bool    { return true }
func (ps *pollSet) add(fd int) error { return errNoPollSet }
func (ps *pollSet) wait()            {}
func (ps *pollSet) stop()            {}
func (ps *pollSet) end()             {}
