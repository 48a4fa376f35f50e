package target

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/internal/lfstack"
	"github.com/blk-project/blk/nvme"
)

// Group gathers the plain writes one binding goroutine executes between
// two calls of Commit, so that each backend commits them together (see
// Backend.NewWriteGroup). The binding makes one per goroutine that executes
// requests (a transport core) and calls Commit at the end of every batch
// of completions it handles; writes wait at most that long. Only that
// goroutine uses the group: it takes no lock.
//
// Ordering is NVMe's: a write is not complete until Commit, so a host
// cannot rely on it before; a read executed in the same batch may see the
// old data, as it may for any command in flight at once.
//
// A Group is also its goroutine's completion sink for asynchronous
// backends (async.go): a binding that gives it a wake (SetWake) has every
// IO its goroutine submitted completed on that goroutine, by Reap.
type Group struct {
	t       *Target
	entries []groupEntry
	pending []pendingWrite

	// doneq holds requests whose IO a backend completed from another
	// goroutine (linked by IO.next); wake tells the owner.
	doneq lfstack.Stack[Request]
	wake  func()

	// pollers are the backends' engines on this group (poller.go);
	// addPoller registers one with the binding. The group's goroutine.
	pollers   []groupPoller
	addPoller func(fd int) error

	commits, writes atomic.Uint64
}

// GroupStats are a group's counters: Writes gathered and Commits that
// applied them (Writes/Commits is the writes per backend commit).
type GroupStats struct{ Commits, Writes uint64 }

// Stats returns the group's counters; any goroutine.
func (g *Group) Stats() GroupStats {
	return GroupStats{Commits: g.commits.Load(), Writes: g.writes.Load()}
}

type groupEntry struct {
	ns  *namespace
	wg  WriteGroup // nil: the backend commits each write alone
	err error      // the last Commit's outcome, for its pending writes
}

type pendingWrite struct {
	q     *Queue
	r     *Request
	entry int
	bytes int
}

// maxGroupEntries bounds the namespaces one group keeps a WriteGroup for;
// past it, entries without pending writes are dropped (a namespace
// detached since is dropped the same way).
const maxGroupEntries = 64

// NewGroup makes a group for up to capacity pending writes (the most
// requests the binding goroutine can have executing at once, e.g. a
// core's receive buffers); more are committed alone.
func (t *Target) NewGroup(capacity int) *Group {
	return &Group{t: t, pending: make([]pendingWrite, 0, capacity), entries: make([]groupEntry, 0, 4)}
}

// SetWake makes the group its goroutine's completion sink: a backend's
// IO.Done from another goroutine queues the request on the group and
// calls wake, which must make the owner call Reap soon (a poll group's
// epoll.Loop.Kick); wake is called from any goroutine and must not
// block. Call it before the group's first Execute.
func (g *Group) SetWake(wake func()) { g.wake = wake }

// HasCompletions reports whether Reap has work; any goroutine (a poll
// group asks it before sleeping).
func (g *Group) HasCompletions() bool { return !g.doneq.Empty() }

// Reap finishes the requests whose IO completed since the last Reap,
// oldest first, answering them through their Responder; the owner's
// goroutine only. It reports whether there were any.
func (g *Group) Reap() bool {
	if g.doneq.Empty() {
		return false // a load, not the swap: the common case of an inline backend
	}
	top := g.doneq.TakeAll()
	if top == nil {
		return false
	}
	var rev *Request
	for r := top; r != nil; {
		next := r.io.next
		r.io.next = rev
		rev = r
		r = next
	}
	for r := rev; r != nil; {
		next := r.io.next
		r.io.next = nil
		r.q.ioDone(r)
		r = next
	}
	return true
}

// Pending is the number of writes waiting for Commit.
func (g *Group) Pending() int { return len(g.pending) }

// add tries to gather a plain write; it reports false if the write must
// be executed alone (no room, or the backend cannot group it).
func (g *Group) add(q *Queue, ns *namespace, r *Request, data []byte) bool {
	if len(g.pending) == cap(g.pending) {
		return false
	}
	e := g.entry(ns)
	wg := g.entries[e].wg
	if wg == nil {
		return false
	}
	err := wg.Add(r.Cmd.SLBA(), data)
	if errors.Is(err, ErrGroupFull) {
		g.Commit()
		e = g.entry(ns)
		wg = g.entries[e].wg
		err = wg.Add(r.Cmd.SLBA(), data)
	}
	if err != nil {
		if errors.Is(err, ErrGroupFull) {
			return false
		}
		q.finish(ns, r, statusOf(err))
		return true
	}
	q.t.enter(r, reqQueued)
	g.pending = append(g.pending, pendingWrite{q: q, r: r, entry: e, bytes: len(data)})
	return true
}

// entry returns the index of ns's entry, making it if needed (once per
// namespace, also for a backend without write groups, so that one is not
// asked again for every write).
func (g *Group) entry(ns *namespace) int {
	for i := range g.entries {
		if g.entries[i].ns == ns {
			return i
		}
	}
	if len(g.entries) == maxGroupEntries {
		g.Commit() // every entry is now empty: start over
		clear(g.entries)
		g.entries = g.entries[:0]
	}
	g.entries = append(g.entries, groupEntry{ns: ns, wg: ns.io.NewWriteGroup()})
	return len(g.entries) - 1
}

// Commit commits every backend's pending writes and completes them (each
// with its backend's outcome). The binding calls it at the end of every
// batch; it is cheap when nothing is pending.
func (g *Group) Commit() {
	if len(g.pending) == 0 {
		return
	}
	g.writes.Add(uint64(len(g.pending)))
	for i := range g.entries {
		e := &g.entries[i]
		e.err = nil
		if e.wg == nil {
			continue
		}
		if n := e.wg.Len(); n > 0 {
			g.commits.Add(1)
			start := time.Now()
			e.err = e.wg.Commit()
			// Each write waited for the whole commit: that is its time
			// in the backend.
			e.ns.c.lat[LatencyWrite].observe(time.Since(start), uint64(n))
			e.ns.c.groupCommits.Add(1)
			e.ns.c.groupedWrites.Add(uint64(n))
		}
	}
	for i := range g.pending {
		p := &g.pending[i]
		ns := g.entries[p.entry].ns
		st := statusOf(g.entries[p.entry].err)
		if st == nvme.StatusSuccess {
			ns.c.writes.Add(1)
			ns.c.writeBytes.Add(uint64(p.bytes))
		}
		p.q.finish(ns, p.r, st)
		*p = pendingWrite{}
	}
	g.pending = g.pending[:0]
}
