package target

import "log/slog"

// Pollers: a backend's completion source on a poll group (issue 22).
//
// An asynchronous backend whose disk engine belongs to one goroutine (an
// io_uring: submission and completion rings without locks, an eventfd)
// keeps one engine per poll group and reaps it there, as SPDK's bdev
// modules keep an I/O channel per thread and poll it from the reactor. The
// backend asks the IO for its group's poller under a key of its own
// (IO.Poller), made on first use; the group registers the poller's
// eventfd with its binding (SetPollerHook: the binding adds it to its
// epoll set) and the binding's loop calls Poll each pass and Arm before
// it sleeps. A group without a hook (a binding that has not wired one,
// the sync workers, a test) gives no poller: the backend then serves the
// IO another way (its own blocking path).

// Poller is one poll group's share of an asynchronous backend: every
// method runs on the group's goroutine.
type Poller interface {
	// Poll hands the I/Os queued since the last call to the disk and
	// completes (IO.Done) those that finished; it reports whether it did
	// either.
	Poll() bool
	// Arm prepares the group's sleep: true means there is work (Poll
	// again instead of sleeping); false that EventFD becomes readable at
	// the next completion.
	Arm() bool
	// EventFD becomes readable when a completion arrives after Arm.
	EventFD() int
	// InFlight is the number of I/Os at the disk (a binding may keep
	// polling rather than sleep while there are some).
	InFlight() int
	// Close completes what is in flight (waiting for the disk), then
	// frees the poller. The group calls it when its binding closes it.
	Close()
}

type groupPoller struct {
	key any
	p   Poller // nil: making it failed; not retried
}

// maxGroupPollers bounds the pollers of one group: one per backend kind
// and store, so a handful.
const maxGroupPollers = 8

// SetPollerHook lets backends attach pollers to the group: add registers
// a poller's eventfd in the binding's wait set (level-triggered, readable
// = call Poll). Call it before the group's first Execute, on the group's
// goroutine or before it starts.
func (g *Group) SetPollerHook(add func(fd int) error) { g.addPoller = add }

// Poller returns the poller the backend keeps under key on the poll group
// running this Submit, made with mk on its first use; nil if Submit is
// not running on a poll group that takes pollers (SetPollerHook), or if
// mk failed for this group before (it is not retried).
func (io *IO) Poller(key any, mk func() (Poller, error)) Poller {
	if p := io.parent; p != nil && !io.sync {
		return p.Poller(key, mk) // a backend's own IO (Inherit)
	}
	r := io.r
	if r == nil || io.sync {
		return nil
	}
	g := r.Group
	if g == nil || g.addPoller == nil {
		return nil
	}
	for i := range g.pollers {
		if g.pollers[i].key == key {
			return g.pollers[i].p
		}
	}
	if len(g.pollers) == maxGroupPollers {
		return nil
	}
	p, err := mk()
	if err == nil {
		if err = g.addPoller(p.EventFD()); err != nil {
			p.Close()
		}
	}
	if err != nil {
		if g.t.logOn(slog.LevelWarn) {
			// Once per group and backend: the backend serves this group's
			// IOs on its blocking path from now on.
			g.t.event(slog.LevelWarn, EventPollerFailed, slog.String("error", err.Error()))
		}
		p = nil
	}
	g.pollers = append(g.pollers, groupPoller{key: key, p: p})
	return p
}

// Poll polls every poller of the group; the group's goroutine.
func (g *Group) Poll() bool {
	worked := false
	for i := range g.pollers {
		if p := g.pollers[i].p; p != nil && p.Poll() {
			worked = true
		}
	}
	return worked
}

// Arm arms every poller of the group before it sleeps: it reports
// whether one has work instead.
func (g *Group) Arm() bool {
	work := false
	for i := range g.pollers {
		if p := g.pollers[i].p; p != nil && p.Arm() {
			work = true
		}
	}
	return work
}

// InFlight is the number of I/Os the group's pollers have at the disk;
// the group's goroutine.
func (g *Group) InFlight() int {
	n := 0
	for i := range g.pollers {
		if p := g.pollers[i].p; p != nil {
			n += p.InFlight()
		}
	}
	return n
}

// ClosePollers closes the group's pollers (each completes what it has in
// flight); the group's goroutine, when the binding closes the group.
func (g *Group) ClosePollers() {
	for i := range g.pollers {
		if p := g.pollers[i].p; p != nil {
			p.Close()
		}
	}
	g.pollers = nil
}
