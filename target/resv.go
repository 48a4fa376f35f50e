package target

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
)

// Persistent reservations (docs/reservations.md §1): the seam to the
// keeper, the serving node's copy of a namespace's state (the view), the
// check every I/O command makes against it, and the drain preempt-and-
// abort waits for. The commands themselves are resv_cmd.go's.
//
// The state changes a few times a minute at most; every I/O reads it. So
// it is published whole and immutable, by one atomic pointer per
// namespace, as the namespace table and the ANA status are: a namespace
// without a keeper, or whose published state holds no reservation, costs
// an I/O one more atomic load of a pointer that is nil. With a
// reservation held, each queue keeps the host's rights under the view it
// computed them for (a per-queue cache): one more load and one pointer
// compare. No lock, no allocation, no write to a line another queue
// writes.

// ReservationKeeper executes Reservation Register, Acquire and Release,
// and Set Features Reservation Persistence, for a namespace
// (NamespaceConfig.Reservations, Subsystem.SetReservations). The core
// decodes and checks the command, then calls Submit with an IO whose Op
// is OpReservation and whose Resv holds it (IO.Subsystem and IO.NSID
// name the namespace). Submit returns at once or soon (it must not wait
// for other commands of the target: a poll group calls it); the keeper
// calls io.Done exactly once, from any goroutine, inside Submit or later:
//
//   - with nil and the command's status in io.ResvStatus (the model's
//     Outcome.Status: success, Reservation Conflict, Invalid Field...),
//     after the state that resulted was published with
//     Subsystem.PublishReservation (so every command the host sends
//     after the completion is checked against it), after the notices
//     were posted (Subsystem.NotifyReservation) and, for
//     preempt-and-abort, after Subsystem.DrainHosts returned;
//   - or with an error carrying the status to answer (WithStatus): the
//     command could not be answered (no leader, a deposed primary).
//
// The core answers Reservation Report itself, from the published state.
type ReservationKeeper interface {
	Submit(io *IO)
}

// OpReservation is an IO of a ReservationKeeper: IO.Resv is the command.
const OpReservation IOOp = 0x80

// Subsystem returns the subsystem of the namespace an IO was submitted
// for (a keeper's IO; nil for an IO of no request).
func (io *IO) Subsystem() *Subsystem {
	if io.r == nil || io.r.ns == nil {
		return nil
	}
	return io.r.ns.s
}

// NSID returns the namespace an IO was submitted for (0: none).
func (io *IO) NSID() uint32 {
	if io.r == nil || io.r.ns == nil {
		return 0
	}
	return io.r.ns.nsid
}

// nsResv is a namespace's reservation state (namespace.resv).
type nsResv struct {
	// view is what the I/O path loads: nil when no keeper is set or the
	// published state holds no reservation, unknownView before the
	// first publish, else the reservation held.
	view atomic.Pointer[resvView]
	// state is the whole published state, for Report, Get Features 83h
	// and the view; nil before the first publish (or without a keeper).
	state atomic.Pointer[resv.State]
	// keeper is the namespace's keeper; nil: reservations not served
	// (ONCS bit 5 clear, the four opcodes Invalid Opcode).
	keeper atomic.Pointer[keeperRef]
	// mu serialises publishes and keeper changes; never on the I/O path.
	mu sync.Mutex
}

type keeperRef struct{ k ReservationKeeper }

// resvView is the serving node's immutable copy of a reservation held
// on a namespace. Rights are computed from st with resv.Access once per
// queue and view (queueResv.cache).
type resvView struct {
	unknown bool   // no state published yet: every I/O gets Namespace Not Ready
	index   uint64 // registry index of st: views only move forward
	typ     resv.Type
	st      *resv.State
}

// unknownView is the view of a namespace with a keeper and no state yet
// (§1.9): its I/O is answered Namespace Not Ready, without DNR, until
// the first publish from a copy known to be current.
var unknownView = &resvView{unknown: true}

// queueResv is a queue's reservation state (Queue.resv).
type queueResv struct {
	// cache is the host's rights under one view, computed on the
	// queue's first command after the view changed.
	cache atomic.Pointer[resvCache]
	// epoch and inflight are the drain's (DrainHosts): each checked
	// command is counted in inflight[epoch&1] until it completes.
	epoch    atomic.Uint32
	inflight [2]atomic.Int64
}

type resvCache struct {
	v      *resvView
	rights resv.Rights
}

// keeper returns the namespace's keeper, or nil.
func (ns *namespace) keeper() ReservationKeeper {
	if k := ns.resv.keeper.Load(); k != nil {
		return k.k
	}
	return nil
}

// resvCheck checks an I/O command against the namespace's reservation:
// Reservation Conflict (DNR) if the holder's type excludes this host
// from the command's group (write: the write group, else the read
// group), Namespace Not Ready before the first publish, else success.
// A namespace with a keeper also counts the command for DrainHosts
// (drainEnter) before it loads the view. One atomic load when the
// namespace has no keeper.
func (q *Queue) resvCheck(c *ctrl, ns *namespace, r *Request, write bool) nvme.Status {
	if ns.resv.keeper.Load() == nil {
		return nvme.StatusSuccess
	}
	q.drainEnter(r)
	v := ns.resv.view.Load()
	if v == nil {
		return nvme.StatusSuccess
	}
	return q.resvRights(c, v, write)
}

// resvRights is resvCheck with a reservation held (or not known).
func (q *Queue) resvRights(c *ctrl, v *resvView, write bool) nvme.Status {
	if v.unknown {
		return nvme.StatusNamespaceNotReady
	}
	rc := q.resv.cache.Load()
	if rc == nil || rc.v != v {
		// Once per queue and view: allocated, not on the steady path.
		rc = &resvCache{v: v, rights: resv.Access(v.st, c.hostID)}
		q.resv.cache.Store(rc)
	}
	need := resv.ReadOK
	if write {
		need = resv.WriteOK
	}
	if rc.rights&need == 0 {
		q.t.stats.resvConflicts.Add(1)
		return nvme.StatusReservationConflict.WithDNR()
	}
	return nvme.StatusSuccess
}

// drainEnter counts r in the queue's current drain epoch.
func (q *Queue) drainEnter(r *Request) {
	if r.io.drain != 0 {
		return // counted already (Flush of every namespace checks each)
	}
	e := q.resv.epoch.Load() & 1
	q.resv.inflight[e].Add(1)
	r.io.drain = uint8(e) + 1
}

// drainTake takes r's drain count (its epoch + 1, 0: not counted) off
// the request, which the binding may reuse once answered; complete
// passes it to drainExit after Responder.Complete, so that DrainHosts
// returns only once the commands it waits for were answered.
func (q *Queue) drainTake(r *Request) uint8 {
	e := r.io.drain
	r.io.drain = 0
	return e
}

// drainExit uncounts a command of epoch e-1 (e from drainTake).
func (q *Queue) drainExit(e uint8) {
	if e != 0 {
		q.resv.inflight[e-1].Add(-1)
	}
}

// SetReservations makes a namespace serve reservations through keeper k
// (nil: stop serving them), with st its current state: nil leaves the
// namespace's I/O answered Namespace Not Ready until the first
// PublishReservation. It is how a namespace added without a keeper gets
// one later (docs/reservations.md §1.3, the upgrade). Identify shows
// ONCS bit 5 and RESCAP from then on.
func (s *Subsystem) SetReservations(nsid uint32, k ReservationKeeper, st *resv.State) error {
	ns := s.table().find(nsid)
	if ns == nil {
		return fmt.Errorf("target: subsystem %s: NSID %d: %w", s.nqn, nsid, ErrNotFound)
	}
	return ns.setKeeper(k, st)
}

// setKeeper sets the namespace's keeper and first state. A local keeper
// (LocalReservations) is bound to the namespace and its state published.
func (ns *namespace) setKeeper(k ReservationKeeper, st *resv.State) error {
	if lk, ok := k.(*localKeeper); ok {
		// Before ns.resv.mu: the keeper's Submit publishes holding its
		// own lock (lock order: localKeeper.mu, then namespace's).
		bound, err := lk.bind(ns, st)
		if err != nil {
			return fmt.Errorf("target: subsystem %s: NSID %d: %w", ns.s.nqn, ns.nsid, err)
		}
		st = bound
	}
	ns.resv.mu.Lock()
	defer ns.resv.mu.Unlock()
	if k == nil {
		ns.resv.keeper.Store(nil)
		ns.resv.view.Store(nil)
		ns.resv.state.Store(nil)
		return nil
	}
	// The view first: the I/O path loads the keeper, then the view, and
	// must never see a keeper with the nil view of "nothing held" before
	// the state is known.
	ns.resv.state.Store(nil)
	ns.resv.view.Store(unknownView)
	if st != nil {
		ns.publishLocked(st)
	}
	ns.resv.keeper.Store(&keeperRef{k})
	return nil
}

// PublishReservation makes st the namespace's reservation state: the
// I/O path checks every command that loads the view after this returns
// against it, and Report answers from it. A state whose Index is not
// above the one published is ignored (views only move forward: a
// keeper's publish after a command and a lease renewal's refresh may
// race), except that the first publish after SetReservations is always
// taken. st nil is the empty state of index 0. The core keeps a copy.
func (s *Subsystem) PublishReservation(nsid uint32, st *resv.State) error {
	ns := s.table().find(nsid)
	if ns == nil {
		return fmt.Errorf("target: subsystem %s: NSID %d: %w", s.nqn, nsid, ErrNotFound)
	}
	ns.resv.mu.Lock()
	defer ns.resv.mu.Unlock()
	if ns.resv.keeper.Load() == nil {
		return fmt.Errorf("target: subsystem %s: NSID %d: no reservation keeper: %w", s.nqn, nsid, ErrInvalid)
	}
	if st == nil {
		st = &resv.State{}
	}
	if cur := ns.resv.state.Load(); cur != nil && st.Index <= cur.Index {
		return nil
	}
	ns.publishLocked(st)
	return nil
}

// publishLocked stores a copy of st and its view. Requires ns.resv.mu.
func (ns *namespace) publishLocked(st *resv.State) {
	c := st.Clone()
	ns.resv.state.Store(c)
	if c.Type == 0 {
		ns.resv.view.Store(nil)
		return
	}
	ns.resv.view.Store(&resvView{index: c.Index, typ: c.Type, st: c})
}

// Reservation returns the namespace's published reservation state (a
// copy), and false if it has no keeper or nothing was published yet.
func (s *Subsystem) Reservation(nsid uint32) (resv.State, bool) {
	ns := s.table().find(nsid)
	if ns == nil || ns.resv.keeper.Load() == nil {
		return resv.State{}, false
	}
	st := ns.resv.state.Load()
	if st == nil {
		return resv.State{}, false
	}
	return *st.Clone(), true
}

// reservationsServed reports whether a namespace of the subsystem has a
// keeper: the controller then advertises ONCS bit 5 and serves log 80h
// and features 82h and 83h.
func (s *Subsystem) reservationsServed() bool {
	for _, ns := range s.table().list {
		if ns.resv.keeper.Load() != nil {
			return true
		}
	}
	return false
}

// DrainHosts waits until every I/O command that the hosts' queues had
// started before it was called — checked against the reservation then,
// at the backend since — has completed (docs/reservations.md §1.6): a
// keeper calls it for preempt-and-abort after publishing the state that
// removed those hosts, so that the command completes only once the
// victims' earlier writes are done. Commands started afterwards are
// checked against the new view and are not waited for. A queue closed
// meanwhile counts as drained once its binding drained it. Reservation
// commands are never counted (a victim's own Acquire may wait at the
// keeper behind the preempt). It returns ctx's error if ctx ends first.
//
// How: each namespace-with-keeper command is counted, before its
// reservation check, in one of two per-queue counters, the queue's
// current epoch's; DrainHosts flips the epoch of each victim queue and
// waits for the old epoch's counter to reach zero. A command that took
// the old epoch but was counted after DrainHosts read zero loads the
// view after that, so it sees the state published before the call.
func (s *Subsystem) DrainHosts(ctx context.Context, hosts []resv.HostID) error {
	if len(hosts) == 0 {
		return nil
	}
	s.drainMu.Lock()
	defer s.drainMu.Unlock()
	type victim struct {
		q   *Queue
		old uint32
	}
	var vs []victim
	s.qmu.Lock()
	for q := range s.ioQueues {
		c := q.ctrl.Load()
		if c != nil && slices.Contains(hosts, resv.HostID(c.hostID)) {
			vs = append(vs, victim{q: q})
		}
	}
	s.qmu.Unlock()
	for i := range vs {
		vs[i].old = (vs[i].q.resv.epoch.Add(1) - 1) & 1
	}
	var tick *time.Ticker
	for i, v := range vs {
		for v.q.resv.inflight[v.old].Load() != 0 {
			if tick == nil {
				tick = time.NewTicker(200 * time.Microsecond)
				defer tick.Stop()
			}
			select {
			case <-v.q.Drained():
			case <-ctx.Done():
				return fmt.Errorf("target: subsystem %s: drain: %d of %d queues not drained: %w",
					s.nqn, len(vs)-i, len(vs), ctx.Err())
			case <-tick.C:
				continue
			}
			break
		}
	}
	return nil
}

// NotifyReservation posts reservation notices (resv.Outcome.Notices) for
// namespace nsid: each goes to every live controller of the subsystem
// whose host identifier is the notice's host, unless that controller's
// Reservation Notification Mask (feature 82h) hides its kind, as an
// entry of its log page 80h and, unless one is outstanding, the
// Reservation Log Page Available event.
func (s *Subsystem) NotifyReservation(nsid uint32, notices []resv.Notice) {
	if len(notices) == 0 {
		return
	}
	for _, c := range s.controllers() {
		for _, n := range notices {
			if resv.HostID(c.hostID) == n.Host {
				c.resvNotice(nsid, uint8(n.Kind))
			}
		}
	}
}

// LocalReservations is a keeper that keeps one namespace's state in
// memory and applies resv.Apply to it under a mutex: for tests, the
// targettest package and a target without a registry. Give each
// namespace its own (NamespaceConfig.Reservations): it is bound to the
// first namespace it is set on. Its state starts empty and known, and
// is lost with the process (PTPL is recorded, not honoured); given
// with a state (SetReservations), it starts from that state.
func LocalReservations() ReservationKeeper { return &localKeeper{} }

type localKeeper struct {
	mu    sync.Mutex
	ns    *namespace
	st    resv.State
	index uint64
}

// errKeeperBound: a LocalReservations keeper set on a second namespace.
var errKeeperBound = errors.New("target: the local reservation keeper serves another namespace")

// bind ties the keeper to ns and returns its state, which becomes st if
// st is not nil (SetReservations with a state).
func (k *localKeeper) bind(ns *namespace, st *resv.State) (*resv.State, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	// Bound to another namespace that is attached: refused. One that an
	// AddNamespace never attached (it failed after setting the keeper)
	// or that was removed frees the keeper.
	if k.ns != nil && k.ns != ns && k.ns.s.table().find(k.ns.nsid) == k.ns {
		return nil, fmt.Errorf("%w: %w", errKeeperBound, ErrInvalid)
	}
	k.ns = ns
	if st != nil {
		k.st = *st.Clone()
		k.index = st.Index
	}
	return k.st.Clone(), nil
}

// localDrainTimeout bounds a preempt-and-abort's wait for its victims'
// commands (§1.6).
const localDrainTimeout = 5 * time.Second

// Submit applies the command, publishes the new state, posts the
// notices and completes the IO; a preempt-and-abort first drains its
// victims, on a goroutine of its own (the victims' commands may be
// completed by the very poll group that called Submit).
func (k *localKeeper) Submit(io *IO) {
	k.mu.Lock()
	ns := k.ns
	if ns == nil || io.r == nil || io.r.ns != ns {
		k.mu.Unlock()
		io.Done(WithStatus(errKeeperBound, nvme.StatusInternalError.WithDNR()))
		return
	}
	st, out := resv.Apply(k.st, io.Resv)
	if out.Status == nvme.StatusSuccess {
		k.index++
		st.Index = k.index
		k.st = st
		_ = ns.s.PublishReservation(ns.nsid, &st)
	}
	k.mu.Unlock()
	ns.s.NotifyReservation(ns.nsid, out.Notices)
	if len(out.Abort) == 0 {
		io.ResvStatus = out.Status
		io.Done(nil)
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), localDrainTimeout)
		defer cancel()
		if err := ns.s.DrainHosts(ctx, out.Abort); err != nil {
			// As surely fenced: the victims' controllers go.
			hosts := out.Abort
			_, _ = ns.s.evictHostIDs(hosts)
			io.Done(WithStatus(err, nvme.StatusInternalError.WithDNR()))
			return
		}
		io.ResvStatus = out.Status
		io.Done(nil)
	}()
}

// evictHostIDs tears down every controller of the subsystem whose host
// identifier is one of hosts.
func (s *Subsystem) evictHostIDs(hosts []resv.HostID) (int, error) {
	var n int
	for _, c := range s.controllers() {
		if slices.Contains(hosts, resv.HostID(c.hostID)) {
			c.teardown(errEvicted)
			n++
		}
	}
	return n, nil
}

// rescap is Identify Namespace RESCAP for a namespace with a keeper:
// Persist Through Power Loss (the state is the registry's), the six
// types, and IEKEY with its 1.3 meaning (ignored on Acquire and
// Release, §1.2).
const rescap uint8 = 0xFF

// resvCheckAll is resvCheck for a Flush of every namespace: Reservation
// Conflict if any namespace's reservation refuses it (blk has one per
// subsystem: the same answer as its NSID).
func (q *Queue) resvCheckAll(c *ctrl, r *Request) nvme.Status {
	for _, ns := range c.s.table().list {
		if st := q.resvCheck(c, ns, r, true); st != nvme.StatusSuccess {
			return st
		}
	}
	return nvme.StatusSuccess
}
