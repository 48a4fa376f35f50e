package transport

import (
	"errors"
	"sync/atomic"
)

// A core's poll set: work of its own beside the CQ (issue 22).
//
// A consumer that serves a core's requests from a second source — a disk
// engine whose completions arrive on an eventfd (an io_uring), answers
// handed over by other goroutines — needs that source served where the
// core's completions are, one call at a time, so that the state it shares
// with HandleCompletion (a request table, a write group, buffer waiters)
// takes no lock. Its Handler implements PollHandler; NewEngine then gives
// every core a poll set: an epoll set (internal/epoll's Loop) watched by a
// goroutine of the core's own, which parks in Go's netpoller while
// nothing happens. Core.AddPollFD adds a descriptor to it, Core.Wake
// asks for a call from any goroutine; either leads to HandlePoll.
//
// Why here and not in each provider: the providers deliver CQ
// notifications each their own way (transport/soft from a goroutine per
// CQ or from its poll groups, transport/verbs from a goroutine in poll(2)
// on the completion channel), and a provider must not learn of the
// consumer's descriptors. The engine only needs its notifications
// serialized, which it can do above every provider.
//
// How the two sources are serialized without a lock: a core's handler
// calls are made by whichever goroutine holds the core's run token (an
// atomic word: a busy bit and one bit per kind of pending work). A CQ
// notification or a poll-set event sets its bit; if the token is free it
// takes it and runs, else it leaves at once and the holder, which looks
// at the word again before it lets the token go, runs that work too. So
// HandleCompletion, HandleBatchEnd, HandleCQError and HandlePoll never
// overlap, each sees what the previous call stored (the token's atomics
// order them), no goroutine ever waits for another, and the common case
// (a notification that finds the core idle) costs two compare-and-swaps.
// "The core's notification goroutine" in the Handler contract means this
// serialized context: the calls may be made by the CQ's goroutine or by
// the poll set's, one at a time.
//
// Why edge-triggered: a descriptor the core watches becomes readable on
// an event (an eventfd write), and the consumer drains it when it arms
// its source (HandlePoll's contract); a level-triggered watch would make
// the poll set's goroutine spin while another goroutine holds the token
// and has not yet drained it. Every write to an eventfd is an edge,
// whether or not the counter was drained.
//
// Polling: a core whose source still has work, or that wants to look
// again before it sleeps (a disk with I/Os in flight), says so
// (HandlePoll returns true) and is called again at once, after a drain
// of its CQ: the goroutine holding the token may be the CQ's own
// notification goroutine, which cannot deliver the CQ's next
// notification while it keeps polling, so the token's holder polls the
// CQ itself meanwhile. With nothing left the core sleeps until a
// descriptor fires, which an io_uring's eventfd does at each completion.

// PollHandler is an optional extension of Handler: a handler with work
// on a core beside its CQ (see above). NewEngine gives each core a poll
// set when the handler implements it and the platform has epoll.
type PollHandler interface {
	// HandlePoll runs serialized with the core's other Handler calls:
	// after every CQ notification (after HandleBatchEnd), when a
	// descriptor of the poll set fires, and after Core.Wake. It must not
	// block. Before it returns false it must arm its sources, so that a
	// later event fires a descriptor (an eventfd written after the arm)
	// or calls Wake; true asks to be called again at once (it has work
	// left).
	HandlePoll(core *Core) (more bool)
}

// The run token's bits (Core.sched).
const (
	runBusy   uint32 = 1 << iota // a goroutine holds the token
	runCQ                        // a CQ notification to handle
	runCQFail                    // a CQ failure to report (Core.cqErr)
	runPoll                      // HandlePoll to call
	runCQLook                    // a look at the CQ by a core that keeps polling
)

// Polling reports whether the core has a poll set: AddPollFD and Wake
// work, and the handler's HandlePoll is called.
func (c *Core) Polling() bool { return c.ps != nil }

// errNoPollSet: AddPollFD on a core without a poll set.
var errNoPollSet = errors.New("transport: engine core has no poll set (the handler is no PollHandler, or no epoll on this platform)")

// Wake makes the core call HandlePoll soon, serialized with its other
// handler calls; any goroutine, no lock, no allocation. A core that is
// handling something takes the request with it (one compare-and-swap);
// an idle one is woken through its poll set. A core without a poll set,
// or closed, ignores it.
func (c *Core) Wake() {
	if c.ps == nil {
		return
	}
	for {
		s := c.sched.Load()
		if s&runBusy == 0 {
			c.ps.kick()
			return
		}
		if s&runPoll != 0 || c.sched.CompareAndSwap(s, s|runPoll) {
			return // the holder looks at the word before it lets go
		}
	}
}

// schedule records work for the core and runs it if no goroutine holds
// the token; the caller has entered the gate.
func (c *Core) schedule(work uint32) {
	for {
		s := c.sched.Load()
		if s&runBusy != 0 {
			if c.sched.CompareAndSwap(s, s|work) {
				return
			}
			continue
		}
		if c.sched.CompareAndSwap(s, s|work|runBusy) {
			break
		}
	}
	c.runToken()
}

// runToken does the pending work while it holds the token, until none is
// left. Quiesce counts each round as one handler call.
func (c *Core) runToken() {
	for {
		work := c.sched.Swap(runBusy) &^ runBusy
		if c.gate.Load()&gateClosed != 0 {
			// Closing: no handler call from now on (stopCallbacks waits
			// for this goroutine).
			c.sched.Store(0)
			return
		}
		c.handling.Add(1)
		if work&runCQFail != 0 {
			if err := c.cqErr.Swap(nil); err != nil {
				c.cqFailed(*err)
			}
		}
		if work&(runCQ|runCQLook) != 0 {
			c.handleCQ(work&runCQ != 0)
		}
		more := c.ph.HandlePoll(c)
		c.handling.Add(1)
		if more {
			// The CQ too: the token's holder may be the CQ's own
			// notification goroutine, which cannot deliver the CQ's next
			// notification while it is busy here.
			c.sched.Or(runPoll | runCQLook)
		}
		if c.sched.CompareAndSwap(runBusy, 0) {
			return
		}
	}
}

// AddPollFD adds fd to the core's poll set, edge-triggered (see above):
// each event on it (an eventfd written) leads to a HandlePoll call. The
// caller keeps fd; closing it takes it out of the set. Any goroutine.
func (c *Core) AddPollFD(fd int) error {
	if c.ps == nil {
		return errNoPollSet
	}
	return c.ps.add(fd)
}

// pollLoop is the poll set's goroutine: it sleeps until a descriptor
// fires or Wake kicks it, then schedules HandlePoll.
func (c *Core) pollLoop() {
	defer close(c.psDone)
	for {
		c.ps.wait()
		if c.ps.stopped() || !c.enter() {
			break
		}
		c.st.pollWakes.Add(1)
		c.schedule(runPoll)
		c.exit()
	}
	c.ps.end()
}

// stopPollSet stops the poll set's goroutine and closes its descriptors
// (not the consumer's). The gate is closed already.
func (c *Core) stopPollSet() {
	if c.ps == nil || c.psDone == nil {
		return
	}
	c.ps.stop()
	<-c.psDone
	c.psDone = nil
}

// pollSetCounters are the poll set's: wakes of its goroutine.
type pollSetCounters struct{ pollWakes atomic.Uint64 }
