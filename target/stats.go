package target

import (
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/nvme"
)

// Request states. Request.state holds one; enter is the only function
// that changes it, and every entry into a state is counted.
//
//	idle ──Execute──▶ executing ──▶ done               (admin, refused commands)
//	                      │──▶ backend ──IO.Done──▶ done  (NVM commands, async.go)
//	                      │──▶ queued ──worker──▶ (backend) ──▶ done  (sync commands)
//	                      │──▶ queued ──Group.Commit──▶ done  (grouped writes)
//	                      │──▶ held ──event/teardown──▶ done  (AER)
//	                      │──▶ fused ──partner/close──▶ done, or the pair's run (fused.go)
//	                      │──▶ lockWait ──release, IO.Done──▶ executing, not counted again  (rangelock.go)
//	                      └──▶ keeper ──IO.Done──▶ done  (reservation commands, resv_cmd.go)
//
// A DSM of several ranges enters backend once per range. A synchronous
// backend's IO (Inline, called directly) completes without entering
// backend: executing → done, or queued → done on a sync worker.
// done means Responder.Complete was (or is being) called: the binding owns
// the request again and may Execute it once more.
const (
	reqIdle      uint8 = iota // never executed by the core
	reqExecuting              // inside Execute, on the binding's goroutine
	reqQueued                 // waiting for or running on a sync worker
	reqHeld                   // an Asynchronous Event Request waiting for an event
	reqBackend                // at the backend: submitted, IO.Done due (async.go)
	reqFused                  // a fused half waiting for its partner (fused.go)
	reqLockWait               // parked by the namespace's range lock (rangelock.go)
	reqDone                   // completed; the binding owns it
	reqKeeper                 // at the namespace's ReservationKeeper: IO.Done due (resv_cmd.go)
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
	// resvCmds counts reservation commands by ResvOp; resvConflicts the
	// I/O commands refused with Reservation Conflict (resv.go).
	resvCmds      [NumResvOps]atomic.Uint64
	resvConflicts atomic.Uint64
	fused         fusedCounters
	lockWaits     atomic.Uint64
}

// enter moves r into state s and counts it. It is the only place a
// request's state changes.
func (t *Target) enter(r *Request, s uint8) {
	if s == reqExecuting && r.state == reqLockWait {
		r.state = s // resumed by the range lock: the same command, counted once
		return
	}
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
	// Executed == Completed when nothing is in flight. AtBackend counts
	// IOs submitted to an asynchronous backend (AsyncBackend.Submit; a
	// synchronous backend's, called directly, complete within Execute
	// or the sync worker's run and are not counted).
	Executed, Queued, Held, AtBackend, Completed uint64
	// AtKeeper counts reservation commands submitted to a namespace's
	// ReservationKeeper (Register, Acquire, Release, Set Features 83h).
	AtKeeper uint64
	// ReservationCommands counts the reservation commands received on
	// I/O queues, by command; ReservationConflicts the I/O commands
	// refused with Reservation Conflict (resv.go).
	ReservationCommands  [NumResvOps]uint64
	ReservationConflicts uint64
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
	// Fused Compare and Write (fused.go): FusedWaiting counts halves that
	// waited for their partner, FusedPairs the pairs whose Write
	// succeeded, FusedMiscompares those whose Compare failed,
	// FusedMissing and FusedFailed the halves ended with Missing or
	// Failed Fused Command. LockWaits counts requests the namespace's
	// range lock parked (rangelock.go).
	FusedWaiting, FusedPairs, FusedMiscompares, FusedMissing, FusedFailed, LockWaits uint64
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

	// GroupedWrites are the plain writes committed in a write group
	// (Backend.NewWriteGroup), failed ones included, in GroupCommits
	// backend commits: GroupCommits/GroupedWrites is the commits per
	// grouped write. Plain writes not grouped (Writes - FUAWrites -
	// GroupedWrites, failures aside) cost a commit each.
	GroupedWrites, GroupCommits uint64

	// Latency holds the time the backend took per call, by operation,
	// failed calls included.
	Latency [NumLatencyOps]LatencyHistogram
}

// LatencyOp is an operation timed in NamespaceStats.Latency.
type LatencyOp uint8

// The operations timed. A grouped write is timed by the commit that
// applied it (each write of a group waited for all of it); a Compare is
// timed as a read.
const (
	LatencyRead LatencyOp = iota
	LatencyWrite
	LatencyWriteFUA
	LatencyWriteZeroes
	LatencyDeallocate
	LatencyFlush
	NumLatencyOps
)

var latencyOpNames = [NumLatencyOps]string{
	LatencyRead: "read", LatencyWrite: "write", LatencyWriteFUA: "write_fua",
	LatencyWriteZeroes: "write_zeroes", LatencyDeallocate: "deallocate", LatencyFlush: "flush",
}

// String returns the operation's name: read, write, write_fua,
// write_zeroes, deallocate or flush.
func (o LatencyOp) String() string {
	if o < NumLatencyOps {
		return latencyOpNames[o]
	}
	return "unknown"
}

// latencyBounds are the upper bounds of the latency buckets: a 1-2-5
// series from 10 µs to 1 s (16 buckets and one above), growing by ×2 or
// ×2.5 per bucket, so any quantile is known to within a factor of about
// 2.5 and the decade bounds an SLO names (100 µs, 1 ms, 10 ms, 100 ms)
// are exact.
//
//   - 10 µs at the bottom: a backend call that hits memory (MemBackend,
//     a pebble memtable write, a cached read) takes a few µs to ~20 µs;
//     finer buckets would only split what the network round trip around
//     it already hides.
//   - 100 µs–10 ms: a read from an NVMe SSD, a WAL sync for a FUA write or
//     Flush (~50 µs–2 ms on NVMe, ~5–10 ms on SATA), a write stalled
//     behind a memtable flush.
//   - 1 s at the top: beyond it a request is failing, not slow (a host's
//     default I/O timeout is 30 s); it lands in the last bucket and is
//     still counted.
//
// observe finds the bucket by a linear scan: at most 16 comparisons, a
// few ns beside the clock reads.
var latencyBounds = [...]time.Duration{
	10 * time.Microsecond, 20 * time.Microsecond, 50 * time.Microsecond,
	100 * time.Microsecond, 200 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second,
}

// NumLatencyBuckets is the buckets of a LatencyHistogram: one per bound
// of LatencyBounds and one for longer calls.
const NumLatencyBuckets = len(latencyBounds) + 1

// LatencyBounds returns the upper bounds (inclusive) of a
// LatencyHistogram's buckets but the last, in increasing order.
func LatencyBounds() []time.Duration { return append([]time.Duration(nil), latencyBounds[:]...) }

// LatencyHistogram is the distribution of one operation's backend time.
type LatencyHistogram struct {
	// Buckets[i] counts the calls that took at most LatencyBounds()[i]
	// and more than the bound before it; the last bucket counts those
	// that took longer than every bound. They are not cumulative.
	Buckets [NumLatencyBuckets]uint64
	// Count is the calls (the sum of Buckets), Sum their total time.
	Count uint64
	Sum   time.Duration
}

// latencyHist is a LatencyHistogram being filled: plain atomics, so the
// I/O path neither locks nor allocates to observe.
type latencyHist struct {
	buckets [NumLatencyBuckets]atomic.Uint64
	sum     atomic.Int64 // nanoseconds
}

// observe counts n calls that took d each.
func (h *latencyHist) observe(d time.Duration, n uint64) {
	i := 0
	for i < len(latencyBounds) && d > latencyBounds[i] {
		i++
	}
	h.buckets[i].Add(n)
	h.sum.Add(int64(d) * int64(n))
}

// since counts one call started at start.
func (h *latencyHist) since(start time.Time) { h.observe(time.Since(start), 1) }

func (h *latencyHist) snapshot(s *LatencyHistogram) {
	s.Count = 0
	for i := range h.buckets {
		s.Buckets[i] = h.buckets[i].Load()
		s.Count += s.Buckets[i]
	}
	s.Sum = time.Duration(h.sum.Load())
}

// nsCounters are a namespace's counters.
type nsCounters struct {
	reads, writes, fuaWrites, compares   atomic.Uint64
	flushes, writeZeroes, deallocates    atomic.Uint64
	readBytes, writeBytes, deallocBlocks atomic.Uint64
	errors                               atomic.Uint64
	groupedWrites, groupCommits          atomic.Uint64

	lat [NumLatencyOps]latencyHist
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
	s.GroupedWrites = c.groupedWrites.Load()
	s.GroupCommits = c.groupCommits.Load()
	for i := range c.lat {
		c.lat[i].snapshot(&s.Latency[i])
	}
}

// Stats returns the target's counters.
func (t *Target) Stats() Stats {
	st := Stats{
		Commands:            make(map[nvme.Status]uint64),
		Executed:            t.stats.states[reqExecuting].Load(),
		Queued:              t.stats.states[reqQueued].Load(),
		Held:                t.stats.states[reqHeld].Load(),
		AtBackend:           t.stats.states[reqBackend].Load(),
		Completed:           t.stats.states[reqDone].Load(),
		FusedWaiting:        t.stats.states[reqFused].Load(),
		FusedPairs:          t.stats.fused.pairs.Load(),
		FusedMiscompares:    t.stats.fused.miscompares.Load(),
		FusedMissing:        t.stats.fused.missing.Load(),
		FusedFailed:         t.stats.fused.failed.Load(),
		LockWaits:           t.stats.lockWaits.Load(),
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
	st.AtKeeper = t.stats.states[reqKeeper].Load()
	st.ReservationConflicts = t.stats.resvConflicts.Load()
	for i := range st.ReservationCommands {
		st.ReservationCommands[i] = t.stats.resvCmds[i].Load()
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
