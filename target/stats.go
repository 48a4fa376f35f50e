package target

import (
	"sync/atomic"

	"github.com/blk-project/blk/nvme"
)

// Request states. Request.state holds one; enter is the only function
// that changes it, and every entry into a state is counted.
//
//	idle ──Execute──▶ executing ──▶ done               (inline commands)
//	                      │──▶ queued ──worker──▶ done  (sync commands)
//	                      └──▶ held ──event/teardown──▶ done  (AER)
//
// done means Responder.Complete was (or is being) called: the binding owns
// the request again and may Execute it once more.
const (
	reqIdle      uint8 = iota // never executed by the core
	reqExecuting              // inside Execute, on the binding's goroutine
	reqQueued                 // waiting for or running on a sync worker
	reqHeld                   // an Asynchronous Event Request waiting for an event
	reqDone                   // completed; the binding owns it
	numReqStates
)

// counters are the target's plain counters, read by Stats.
type counters struct {
	// states counts entries into each request state.
	states [numReqStates]atomic.Uint64
	// status counts completions by status code: index SCT<<8 | SC.
	status [1 << 11]atomic.Uint64
	// misuse counts Execute calls on a request the core still owned.
	misuse atomic.Uint64

	syncOverflow     atomic.Uint64
	keepAliveExpired atomic.Uint64
	keepAliveTraffic atomic.Uint64
	ctrlCreated      atomic.Uint64
	ctrlTornDown     atomic.Uint64
	connectRefused   atomic.Uint64
	connectTimedOut  atomic.Uint64
	// busy counts Connects refused by each budget (busyReason).
	busy          [numBusyReasons]atomic.Uint64
	discoveryIdle atomic.Uint64
	eventsDropped atomic.Uint64
	authSucceeded atomic.Uint64
	authFailed    atomic.Uint64
	authTimedOut  atomic.Uint64
	authRequired  atomic.Uint64
}

// enter moves r into state s and counts it. It is the only place a
// request's state changes.
func (t *Target) enter(r *Request, s uint8) {
	if s == reqExecuting && r.state != reqIdle && r.state != reqDone {
		// The binding executed a request the core has not completed:
		// a binding bug. Count it; the first completion still wins.
		t.stats.misuse.Add(1)
	}
	r.state = s
	t.stats.states[s].Add(1)
}

// countStatus counts one completion.
func (t *Target) countStatus(s nvme.Status) {
	t.stats.status[uint16(s.Code())&(1<<11-1)].Add(1)
}

// Stats are the target's counters since New.
type Stats struct {
	// Commands counts completions by status code (SCT and SC; DNR and
	// the other flags cleared). Success is nvme.StatusSuccess.
	Commands map[nvme.Status]uint64
	// Request state entries: every Execute enters Executed, every
	// Complete enters Completed; Queued counts commands handed to the sync
	// workers, Held the Asynchronous Event Requests held for an event.
	// Executed == Completed when nothing is in flight.
	Executed, Queued, Held, Completed uint64
	// Misuse counts Execute calls on a request the core had not yet
	// completed (a binding bug).
	Misuse uint64
	// SyncOverflow counts sync commands that found the worker queue full
	// and ran on a goroutine of their own.
	SyncOverflow uint64
	// KeepAliveExpired counts controllers torn down by keep-alive expiry.
	KeepAliveExpired uint64
	// KeepAliveTraffic counts keep-alive timeouts that did not expire
	// because commands had been executed since the timer last looked
	// (traffic-based keep-alive): each restarted the timer.
	KeepAliveTraffic uint64
	// ControllersCreated and ControllersTornDown count controllers; the
	// difference is Controllers, the live ones.
	ControllersCreated, ControllersTornDown uint64
	Controllers                             int
	// ConnectsRefused counts Connect commands that failed.
	ConnectsRefused uint64
	// ConnectsTimedOut counts queues dropped because no Connect succeeded
	// on them within Config.ConnectTimeout.
	ConnectsTimedOut uint64
	// BusyControllers, BusyDiscovery and BusyDiscoverySource count the
	// admin Connects refused with Controller Busy (of ConnectsRefused)
	// because MaxControllers, MaxDiscoveryControllers or
	// MaxDiscoveryPerSource was reached (budget.go).
	BusyControllers, BusyDiscovery, BusyDiscoverySource uint64
	// DiscoveryControllers are the live discovery controllers (of
	// Controllers).
	DiscoveryControllers int
	// DiscoveryIdle counts discovery controllers torn down for sending
	// nothing after their Connect (Config.DiscoveryIdleTimeout).
	DiscoveryIdle uint64
	// AuthSucceeded counts queues authenticated (DH-HMAC-CHAP), AuthFailed
	// queues ended by a failed or timed-out authentication (AuthTimedOut
	// of them by the deadline), AuthRequired commands refused on a queue
	// not yet authenticated.
	AuthSucceeded, AuthFailed, AuthTimedOut, AuthRequired uint64
	// EventsDropped counts asynchronous events lost because too many were
	// pending with no Asynchronous Event Request to take them.
	EventsDropped uint64
	// Namespaces are the counters of every namespace, by subsystem NQN
	// and NSID.
	Namespaces []NamespaceStats
}

// NamespaceStats are one namespace's counters: commands that succeeded,
// the data they moved, and the commands that failed after reaching the
// namespace.
type NamespaceStats struct {
	Subsystem string
	NSID      uint32

	Reads, Writes, FUAWrites, Compares       uint64
	Flushes, WriteZeroes, Deallocates        uint64
	ReadBytes, WriteBytes, DeallocatedBlocks uint64
	Errors                                   uint64
}

// nsCounters are a namespace's counters.
type nsCounters struct {
	reads, writes, fuaWrites, compares   atomic.Uint64
	flushes, writeZeroes, deallocates    atomic.Uint64
	readBytes, writeBytes, deallocBlocks atomic.Uint64
	errors                               atomic.Uint64
}

func (c *nsCounters) snapshot(s *NamespaceStats) {
	s.Reads = c.reads.Load()
	s.Writes = c.writes.Load()
	s.FUAWrites = c.fuaWrites.Load()
	s.Compares = c.compares.Load()
	s.Flushes = c.flushes.Load()
	s.WriteZeroes = c.writeZeroes.Load()
	s.Deallocates = c.deallocates.Load()
	s.ReadBytes = c.readBytes.Load()
	s.WriteBytes = c.writeBytes.Load()
	s.DeallocatedBlocks = c.deallocBlocks.Load()
	s.Errors = c.errors.Load()
}

// Stats returns the target's counters.
func (t *Target) Stats() Stats {
	st := Stats{
		Commands:            make(map[nvme.Status]uint64),
		Executed:            t.stats.states[reqExecuting].Load(),
		Queued:              t.stats.states[reqQueued].Load(),
		Held:                t.stats.states[reqHeld].Load(),
		Completed:           t.stats.states[reqDone].Load(),
		Misuse:              t.stats.misuse.Load(),
		SyncOverflow:        t.stats.syncOverflow.Load(),
		KeepAliveExpired:    t.stats.keepAliveExpired.Load(),
		KeepAliveTraffic:    t.stats.keepAliveTraffic.Load(),
		ControllersCreated:  t.stats.ctrlCreated.Load(),
		ControllersTornDown: t.stats.ctrlTornDown.Load(),
		ConnectsRefused:     t.stats.connectRefused.Load(),
		ConnectsTimedOut:    t.stats.connectTimedOut.Load(),
		BusyControllers:     t.stats.busy[busyControllers].Load(),
		BusyDiscovery:       t.stats.busy[busyDiscovery].Load(),
		BusyDiscoverySource: t.stats.busy[busyDiscoverySource].Load(),
		DiscoveryIdle:       t.stats.discoveryIdle.Load(),
		EventsDropped:       t.stats.eventsDropped.Load(),
		AuthSucceeded:       t.stats.authSucceeded.Load(),
		AuthFailed:          t.stats.authFailed.Load(),
		AuthTimedOut:        t.stats.authTimedOut.Load(),
		AuthRequired:        t.stats.authRequired.Load(),
	}
	for i := range t.stats.status {
		if n := t.stats.status[i].Load(); n != 0 {
			st.Commands[nvme.Status(i)] = n
		}
	}
	t.mu.Lock()
	st.Controllers = t.nctrl
	st.DiscoveryControllers = t.ndisc
	subs := t.sortedSubsystems()
	t.mu.Unlock()
	for _, s := range subs {
		for _, ns := range s.table().list {
			ns := ns
			n := NamespaceStats{Subsystem: s.nqn, NSID: ns.nsid}
			ns.c.snapshot(&n)
			st.Namespaces = append(st.Namespaces, n)
		}
	}
	return st
}
