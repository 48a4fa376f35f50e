package blkd

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/control"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
	"github.com/blk-project/blk/target"
	"github.com/prometheus/client_golang/prometheus"
)

// The reservation keeper (docs/reservations.md §1.5, §1.7, §1.9, §1.10).
//
// A volume's NVMe persistent reservation lives only in the registry
// (meta.Volume.Reservation), changed by Op 29 (meta.Reservation) and Op
// 30 (meta.ClearReservation). The node that serves the volume's I/O keeps
// an immutable copy in its namespace (the view), which every I/O checks
// with one atomic load. The keeper is what turns a host's Reservation
// Register, Acquire or Release into an Op 29 and publishes the result:
//
//   - one keeper per served volume (a replicated volume's host
//     subsystem, a one-replica volume's subsystem), one goroutine, one
//     command at a time, so the views it publishes follow log order;
//   - each command gets a retry token (a random base of this process plus
//     a counter): a retry after a leader change or a lost answer replays
//     the token and the registry answers it from its record, once;
//   - proposed on the leader (this node, or POST /v1/internal/reservation
//     to it), then this node's copy waits for the entry, the view is
//     published, a preempt-and-abort waits for the victims' commands
//     (DrainHosts), the notices are posted, and only then is the command
//     completed: a change is in the view before the host hears of it.
//
// A view starts unknown (every I/O Namespace Not Ready) and is first
// published from a copy known current: a replicated volume's in the
// lease's renew (the copy applied the leader's index), a one-replica
// volume's once this node asked the leader how far to catch up and got
// there (bringUp). A term that starts with PTPL off first clears the
// state (a power loss: every controller of the old term is gone).

const (
	// resvCommandWait bounds one reservation command at the keeper: the
	// leader's commit, retries through an election (~1–3 s, and a leader
	// change is noticed only when its connection fails), the wait for
	// this node's copy; well inside a host's 30 s I/O timeout. Past it
	// the host gets Namespace Not Ready (no DNR: its caller may retry).
	resvCommandWait = 10 * time.Second
	// resvDrainWait bounds a preempt-and-abort's wait for the victims'
	// commands (§1.6); past it their controllers are evicted.
	resvDrainWait = 5 * time.Second
	// resvQueueLimit bounds the commands waiting at one keeper: a host
	// sends one reservation command at a time per path; more than this
	// is refused with Namespace Not Ready.
	resvQueueLimit = 256
	// resvRetry is the pause between two tries of a proposal.
	resvRetry = 100 * time.Millisecond
	// resvLoopInterval is how often the keepers' loop attaches keepers
	// (an upgrade finished), brings up unknown views, republishes what
	// the registry has that a view lacks (Op 30), and forgets keepers of
	// subsystems gone.
	resvLoopInterval = time.Second
)

// Errors the keeper maps to NVMe statuses (reservationErr).
var (
	// errNotServing: this node does not serve the volume as its primary
	// now (a term that ended, a lease that lapsed).
	errNotServing = errors.New("this node does not serve the volume as its primary now")
	// errKeeperClosed: the keeper's subsystem was removed.
	errKeeperClosed = errors.New("the volume's reservation keeper stopped (its subsystem was removed)")
	// errKeeperBusy: too many commands wait at the keeper.
	errKeeperBusy = errors.New("too many reservation commands wait for the registry")
	// errNoLeader: no leader answered within resvCommandWait.
	errNoLeader = errors.New("no registry leader answered")
	// errViewUnknown: the keeper's view is not known yet (§1.9): a
	// command now would be ordered before the term's or the subsystem's
	// power loss (PTPL off) it must follow.
	errViewUnknown = errors.New("the volume's reservation state is not known on this node yet")
	// errFenceFailed: a preempt-and-abort's victims' commands did not
	// end, not even once their controllers were evicted.
	errFenceFailed = errors.New("the preempted hosts' commands did not end")
)

// reservationErr is the one translation of a keeper's failure into the
// status the host gets (§1.5): the deposed primary's and a lapsed
// lease's path status (the host retries on another path), an operator's
// unfinished upgrade (Internal Error, DNR), a volume gone (Invalid
// Namespace), and everything else Namespace Not Ready (no DNR: the
// Linux host does not retry a reservation command itself, its caller
// may).
func reservationErr(err error) error {
	var st nvme.Status
	switch {
	case errors.Is(err, meta.ErrStaleEpoch), errors.Is(err, errNotServing):
		st = nvme.StatusANATransition
	case errors.Is(err, control.ErrFeatureMissing), errors.Is(err, meta.ErrFeatureMissing):
		st = nvme.StatusInternalError.WithDNR()
	case errors.Is(err, errFenceFailed):
		st = nvme.StatusInternalError
	case errors.Is(err, meta.ErrVolumeDeleting), errors.Is(err, meta.ErrUnknownVolume), errors.Is(err, errKeeperClosed):
		st = nvme.StatusInvalidNamespace.WithDNR()
	case errors.Is(err, meta.ErrInvalid), errors.Is(err, meta.ErrBadCommand), errors.Is(err, control.ErrInvalid):
		st = nvme.StatusInvalidField.WithDNR()
	default:
		st = nvme.StatusNamespaceNotReady
	}
	return target.WithStatus(err, st)
}

// resvKeepers is the node's keepers, by volume ID, and what they share.
type resvKeepers struct {
	// attachMu orders a subsystem's creation with its keeper
	// (addNamespace) before the upgrade's attachKeeper.
	attachMu sync.Mutex
	mu       sync.Mutex
	byID     map[uint64]*resvKeeper
	// tokenBase is this process's random token base; tokens counts.
	tokenBase uint64
	tokens    atomic.Uint64
	// seconds is blk_reservation_command_seconds.
	seconds prometheus.Histogram
	// holds are the test-only fault hooks of BLKD_TEST_RESV_HOLD
	// (resvHolds); zero in production.
	holds resvHolds
}

// resvHolds are pauses cmd/blkd's tests put where a fault must strike:
// BLKD_TEST_RESV_HOLD="leader=1s,keeper=4s,bringup=3s". leader: the
// leader's POST /v1/internal/reservation answers that long after its
// entry committed (a leader killed meanwhile: the keeper's retry replays
// the token); keeper: a keeper holds an Acquire that long after it took
// the term's epoch (a primary deposed meanwhile: the entry is stale);
// bringup: a one-replica volume's view stays unknown that long longer.
// Unset, or unparsable, nothing pauses.
type resvHolds struct {
	leader, keeper, bringUp time.Duration
}

// parseResvHolds reads BLKD_TEST_RESV_HOLD.
func parseResvHolds(s string) resvHolds {
	var h resvHolds
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		d, err := time.ParseDuration(v)
		if !ok || err != nil {
			continue
		}
		switch k {
		case "leader":
			h.leader = d
		case "keeper":
			h.keeper = d
		case "bringup":
			h.bringUp = d
		}
	}
	return h
}

func newResvKeepers() *resvKeepers {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &resvKeepers{
		holds:     parseResvHolds(os.Getenv("BLKD_TEST_RESV_HOLD")),
		byID:      map[uint64]*resvKeeper{},
		tokenBase: binary.LittleEndian.Uint64(b[:]),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "blk_reservation_command_seconds",
			Help:    "Time a reservation command (Register, Acquire, Release) spends at this node's keeper: the registry commit, retries, the publish and a preempt-and-abort's drain.",
			Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5},
		}),
	}
}

// token returns a retry token no other command of any node is given
// (a random 64-bit base per process: a collision needs two processes'
// bases within their counters of each other).
func (ks *resvKeepers) token() uint64 {
	t := ks.tokenBase + ks.tokens.Add(1)
	if t == 0 {
		t = ks.tokenBase + ks.tokens.Add(1)
	}
	return t
}

// resvKeeper is one volume's keeper on this node: target.ReservationKeeper.
type resvKeeper struct {
	d    *Daemon
	id   uint64
	name string
	nqn  string
	sub  *target.Subsystem
	// hv is the replicated volume's host subsystem; nil for a volume of
	// one replica.
	hv *hostVolume

	mu     sync.Mutex
	queue  []*target.IO
	closed bool
	wake   chan struct{}
	stop   chan struct{}

	// pubMu orders publishes; known says a current state was published
	// (the view is no longer unknown); index is the published state's.
	pubMu sync.Mutex
	known bool
	index uint64
	// term is the primary term whose first publish was done (its PTPL
	// check passed), lossFor the term a power loss was proposed for.
	term, lossFor *primaryLeg
	// up closes once a one-replica volume's first publish is done
	// (bringUp); isUp reads it.
	up chan struct{}
}

// withoutReservations, set at link time (-ldflags "-X
// github.com/blk-project/blk/cmd/blkd/internal/blkd.withoutReservations=1")
// by cmd/blkd's TestReservationUpgradeGate only, makes the binary
// register as one from before reservations: without
// meta.FeatureReservations.
var withoutReservations string

func init() {
	if withoutReservations != "" {
		nodeFeatures = slices.DeleteFunc(slices.Clone(nodeFeatures), func(f string) bool { return f == meta.FeatureReservations })
	}
}

// reservationsOn says whether every registered node applies the
// reservation commands (§1.3's gate): until then no subsystem has a
// keeper and the leader proposes neither Op 29 nor Op 30.
func (d *Daemon) reservationsOn() bool { return d.requireReservations() == nil }

// requireReservations is reservationsOn as the registry's error
// (meta.ErrFeatureMissing, naming the node), read from this node's copy.
func (d *Daemon) requireReservations() error {
	var err error
	d.node.FSM().Read(func(s *meta.State) { err = s.RequireFeature(meta.FeatureReservations) })
	return err
}

// newKeeper makes the keeper of v's namespace in sub (hv: the replicated
// volume's host subsystem, nil for one replica), replacing the volume's
// previous one, or returns nil while the cluster does not serve
// reservations. Its goroutine runs until the keeper closes.
func (d *Daemon) newKeeper(v meta.Volume, sub *target.Subsystem, hv *hostVolume) *resvKeeper {
	if !d.reservationsOn() {
		return nil
	}
	k := &resvKeeper{d: d, id: v.ID, name: v.Name, nqn: v.NQN, sub: sub, hv: hv, wake: make(chan struct{}, 1), stop: make(chan struct{}), up: make(chan struct{})}
	d.resv.mu.Lock()
	old := d.resv.byID[v.ID]
	d.resv.byID[v.ID] = k
	d.resv.mu.Unlock()
	if old != nil {
		old.close()
	}
	go k.run()
	if hv == nil {
		go k.bringUp()
	}
	return k
}

// keeperOf returns volume id's keeper, nil if none.
func (d *Daemon) keeperOf(id uint64) *resvKeeper {
	d.resv.mu.Lock()
	defer d.resv.mu.Unlock()
	return d.resv.byID[id]
}

// addNamespace adds v's namespace to sub (hv: the replicated volume's
// host subsystem, nil for one replica) with its keeper, if the cluster
// serves reservations: under attachMu, so that the keepers' round never
// attaches a second keeper to a subsystem being built.
func (d *Daemon) addNamespace(v meta.Volume, sub *target.Subsystem, hv *hostVolume, nc target.NamespaceConfig) error {
	d.resv.attachMu.Lock()
	defer d.resv.attachMu.Unlock()
	if k := d.newKeeper(v, sub, hv); k != nil {
		nc.Reservations = k
	}
	return sub.AddNamespace(nc)
}

// Submit is target.ReservationKeeper's: it queues io and returns.
func (k *resvKeeper) Submit(io *target.IO) {
	k.mu.Lock()
	switch {
	case k.closed:
		k.mu.Unlock()
		io.Done(reservationErr(errKeeperClosed))
		return
	case len(k.queue) >= resvQueueLimit:
		k.mu.Unlock()
		io.Done(reservationErr(errKeeperBusy))
		return
	}
	k.queue = append(k.queue, io)
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// close stops the keeper: the commands queued complete with
// errKeeperClosed (the one running completes as it ends).
func (k *resvKeeper) close() {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.closed = true
	q := k.queue
	k.queue = nil
	k.mu.Unlock()
	close(k.stop)
	for _, io := range q {
		io.Done(reservationErr(errKeeperClosed))
	}
}

// next takes the next command queued, nil if none.
func (k *resvKeeper) next() *target.IO {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.queue) == 0 {
		return nil
	}
	io := k.queue[0]
	k.queue[0] = nil
	k.queue = k.queue[1:]
	return io
}

// run executes the queued commands one at a time until close.
func (k *resvKeeper) run() {
	for {
		for io := k.next(); io != nil; io = k.next() {
			start := time.Now()
			err := k.execute(io)
			k.d.resv.seconds.Observe(time.Since(start).Seconds())
			if err != nil {
				k.d.log.Warn("reservation command not applied", slog.String("volume", k.name), slog.String("err", err.Error()))
				io.Done(reservationErr(err))
			} else {
				io.Done(nil)
			}
		}
		select {
		case <-k.stop:
			return
		case <-k.wake:
		}
	}
}

// epoch is the epoch the keeper's commands carry: the primary term's for
// a replicated volume (errNotServing if none serves), the registry
// copy's for a volume of one replica.
func (k *resvKeeper) epoch() (uint64, error) {
	if k.hv != nil {
		k.d.repl.mu.Lock()
		pl := k.hv.pl
		k.d.repl.mu.Unlock()
		if pl == nil || k.hv.hb.cur.Load() != pl {
			return 0, errNotServing
		}
		k.pubMu.Lock()
		checked := k.term == pl
		k.pubMu.Unlock()
		if !checked {
			return 0, errViewUnknown
		}
		return pl.epoch, nil
	}
	if !k.isUp() {
		return 0, errViewUnknown
	}
	var v meta.Volume
	var ok bool
	k.d.node.FSM().Read(func(s *meta.State) { v, ok = s.Volume(k.name) })
	if !ok || v.ID != k.id {
		return 0, fmt.Errorf("volume %q: %w", k.name, meta.ErrUnknownVolume)
	}
	return v.CurrentEpoch(), nil
}

// execute runs one reservation command through the registry (§1.5) and
// sets its status; an error is a command the registry did not answer.
func (k *resvKeeper) execute(io *target.IO) error {
	cmd := io.Resv
	cmd.Token = k.d.resv.token()
	epoch, err := k.epoch()
	if err != nil {
		return err
	}
	// The registrations as published now name the NQNs of whom a
	// preempt-and-abort may have to evict, should their drain fail.
	before, _ := k.sub.Reservation(1)
	if h := k.d.resv.holds.keeper; h > 0 && cmd.Op == resv.Acquire {
		time.Sleep(h) // a test's fault: the term may be deposed meanwhile
	}
	ctx, cancel := context.WithTimeout(context.Background(), resvCommandWait)
	defer cancel()
	ans, err := k.d.proposeReservation(ctx, resvRequest{Volume: k.name, Epoch: epoch, Cmd: cmd})
	if err != nil {
		return err
	}
	if err := k.d.node.WaitApplied(ctx, ans.Index); err != nil {
		return fmt.Errorf("registry copy at index %d, not yet %d: %w", k.d.node.AppliedIndex(), ans.Index, err)
	}
	if err := k.publishCopy(); err != nil {
		return err
	}
	out := ans.Outcome
	if len(out.Abort) > 0 {
		if err := k.drain(out.Abort, before); err != nil {
			return err
		}
	}
	k.sub.NotifyReservation(1, out.Notices)
	io.ResvStatus = out.Status
	return nil
}

// drain waits for the commands the preempted hosts started before the
// new view (§1.6); past resvDrainWait their controllers are evicted and
// drained, which fences as surely: the preempt then succeeds (it is in
// the registry). Only if even that does not end their commands does the
// host get Internal Error (errFenceFailed): its victims may still write.
func (k *resvKeeper) drain(hosts []resv.HostID, before resv.State) error {
	ctx, cancel := context.WithTimeout(context.Background(), resvDrainWait)
	err := k.sub.DrainHosts(ctx, hosts)
	cancel()
	if err == nil {
		return nil
	}
	k.d.log.Warn("preempt and abort: the preempted hosts' commands did not end in time; evicting their controllers", slog.String("volume", k.name), slog.String("err", err.Error()))
	// The registrations name the hosts' NQNs (a host ID is one host's).
	nqns := map[string]bool{}
	for _, r := range before.Regs {
		if slices.Contains(hosts, r.Host) && r.NQN != "" {
			nqns[r.NQN] = true
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), ownerTimeout)
	defer cancel()
	if _, err := k.sub.EvictAndDrain(ctx, func(nqn string) bool { return nqns[nqn] }); err != nil {
		return fmt.Errorf("%w: %w", errFenceFailed, err)
	}
	return nil
}

// publishCopy publishes the volume's reservation from this node's
// registry copy if it is newer than the view's (or the view is unknown):
// the caller knows the copy is current enough (it waited for an index).
func (k *resvKeeper) publishCopy() error {
	var v meta.Volume
	var ok bool
	var applied uint64
	k.d.node.FSM().Read(func(s *meta.State) { v, ok = s.Volume(k.name); applied = s.Index() })
	if !ok || v.ID != k.id {
		return fmt.Errorf("volume %q: %w", k.name, meta.ErrUnknownVolume)
	}
	return k.publish(v.Reservation, applied)
}

// publish stores st in the view unless the view holds a newer state
// (views only move forward); a nil st is the empty state read at
// registry index applied.
func (k *resvKeeper) publish(st *resv.State, applied uint64) error {
	k.pubMu.Lock()
	defer k.pubMu.Unlock()
	if st == nil {
		if k.known {
			return nil // nothing ever held: the view is already empty
		}
		st = &resv.State{Index: applied}
	} else if k.known && st.Index <= k.index {
		return nil
	}
	if err := k.sub.PublishReservation(1, st); err != nil {
		return fmt.Errorf("reservation view not published: %w", err)
	}
	k.known, k.index = true, st.Index
	return nil
}

// holdsSomething says whether st would lose anything at a power loss.
func holdsSomething(st *resv.State) bool {
	return st != nil && (len(st.Regs) > 0 || st.Type != resv.None)
}

// renewReservation is the lease renewal's part (§1.9, §1.10), called by
// renew with the volume it just read from a copy current to the leader's
// index, before the path may serve: it publishes what the registry holds
// when the view lacks it, and at a term's first renewal with PTPL off it
// clears the state first (a power loss). false: do not serve yet.
func (d *Daemon) renewReservation(hv *hostVolume, pl *primaryLeg, v meta.Volume) bool {
	k := d.keeperOf(hv.id)
	if k == nil || k.hv != hv {
		return true // reservations not served on this subsystem
	}
	k.pubMu.Lock()
	first := k.term != pl
	k.pubMu.Unlock()
	if first && holdsSomething(v.Reservation) && !v.Reservation.PTPL {
		k.pubMu.Lock()
		send := k.lossFor != pl
		k.lossFor = pl
		k.pubMu.Unlock()
		if send {
			go d.powerLoss(k, pl.epoch)
		}
		return false
	}
	if err := k.publish(v.Reservation, d.node.AppliedIndex()); err != nil {
		d.log.Warn("reservation: not serving yet", slog.String("volume", hv.name), slog.String("err", err.Error()))
		return false
	}
	if first {
		k.pubMu.Lock()
		k.term = pl
		k.pubMu.Unlock()
	}
	return true
}

// powerLoss proposes the power loss of a new serving term at epoch (Op
// 29, resv.PowerLoss: registrations and reservation cleared, no notice);
// the next renewal (or bringUp round) that reads it publishes the empty
// state. A failure is retried by the next one.
func (d *Daemon) powerLoss(k *resvKeeper, epoch uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), resvCommandWait)
	defer cancel()
	ans, err := d.proposeReservation(ctx, resvRequest{Volume: k.name, Epoch: epoch, Cmd: resv.Command{Op: resv.PowerLoss, Token: d.resv.token()}})
	if err != nil {
		d.log.Warn("reservation: power loss (PTPL off) not recorded; retrying", slog.String("volume", k.name), slog.String("err", err.Error()))
		k.pubMu.Lock()
		k.lossFor = nil
		k.pubMu.Unlock()
		return
	}
	d.log.Info("reservation: registrations dropped at a new serving term (Persist Through Power Loss off)", slog.String("volume", k.name), slog.Uint64("epoch", epoch), slog.Uint64("index", ans.Index))
	d.kickLease()
}

// bringUp makes a one-replica volume's view known (§1.9): it waits until
// this node's copy has applied the leader's index (asked now: a copy
// known current), clears the state if PTPL is off (the subsystem is new:
// every controller of the old one is gone), and publishes. It retries
// until it succeeds or the keeper closes.
func (k *resvKeeper) bringUp() {
	if h := k.d.resv.holds.bringUp; h > 0 {
		select {
		case <-k.stop:
			return
		case <-time.After(h): // a test's fault: the view stays unknown
		}
	}
	t := time.NewTicker(resvRetry * 5)
	defer t.Stop()
	for {
		if err := k.bringUpOnce(); err == nil {
			close(k.up)
			return
		}
		select {
		case <-k.stop:
			return
		case <-t.C:
		}
	}
}

func (k *resvKeeper) bringUpOnce() error {
	ctx, cancel := context.WithTimeout(context.Background(), resvCommandWait)
	defer cancel()
	if err := k.d.currentCopy(ctx); err != nil {
		return err
	}
	var v meta.Volume
	var ok bool
	k.d.node.FSM().Read(func(s *meta.State) { v, ok = s.Volume(k.name) })
	if !ok || v.ID != k.id {
		return fmt.Errorf("volume %q: %w", k.name, meta.ErrUnknownVolume)
	}
	if holdsSomething(v.Reservation) && !v.Reservation.PTPL {
		ans, err := k.d.proposeReservation(ctx, resvRequest{Volume: k.name, Epoch: v.CurrentEpoch(), Cmd: resv.Command{Op: resv.PowerLoss, Token: k.d.resv.token()}})
		if err != nil {
			return err
		}
		if err := k.d.node.WaitApplied(ctx, ans.Index); err != nil {
			return err
		}
		k.d.log.Info("reservation: registrations dropped at a new subsystem (Persist Through Power Loss off)", slog.String("volume", k.name))
	}
	return k.publishCopy()
}

// isUp reports whether bringUp has published a current view.
func (k *resvKeeper) isUp() bool {
	select {
	case <-k.up:
		return true
	default:
		return false
	}
}

// waitBroughtUp waits, at most limit, until every one-replica volume's
// keeper has published a current view (bringUp), as waitPrimaryLegs does
// for the replicated ones: Start calls it before "ready", so that a host
// connecting once blkd says it is ready is not answered Namespace Not
// Ready while the view catches up (the Linux host retries that status
// only a few times, without delay). A test's bring-up hold skips it:
// that test wants the unknown view.
func (d *Daemon) waitBroughtUp(ctx context.Context, limit time.Duration) {
	if d.resv.holds.bringUp > 0 {
		return
	}
	d.resv.mu.Lock()
	var ks []*resvKeeper
	for _, k := range d.resv.byID {
		if k.hv == nil {
			ks = append(ks, k)
		}
	}
	d.resv.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for _, k := range ks {
		select {
		case <-k.up:
		case <-k.stop:
		case <-ctx.Done():
			d.log.Warn("one-replica volumes' reservation views still unknown: their I/O answers Namespace Not Ready until they are", slog.Duration("waited", limit))
			return
		}
	}
}

// currentCopy returns once this node's registry copy holds every entry
// the leader had applied when asked (on the leader: after a barrier).
func (d *Daemon) currentCopy(ctx context.Context) error {
	if d.node.IsLeader() {
		return d.node.Linearize(ctx)
	}
	id, api := d.leaderAPI()
	if api == "" {
		return errNoLeader
	}
	idx, err := leaderIndex(ctx, d.peers, d.peerURL(api, "/v1/cluster"), id)
	if err != nil {
		return err
	}
	return d.node.WaitApplied(ctx, idx)
}

// resvLoop runs the keepers' housekeeping every resvLoopInterval until
// stop closes.
func (d *Daemon) resvLoop(stop <-chan struct{}) {
	t := time.NewTicker(resvLoopInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			d.closeKeepers()
			return
		case <-t.C:
		}
		d.resvRound()
	}
}

// resvRound forgets the keepers whose subsystem is gone, gives a keeper
// to every served volume without one once the cluster serves
// reservations (§1.3's upgrade), and republishes a one-replica volume's
// state its view lacks (an Op 30 whose push was lost). A replicated
// volume's is renew's.
func (d *Daemon) resvRound() {
	d.resv.mu.Lock()
	var ks []*resvKeeper
	for id, k := range d.resv.byID {
		if sub, ok := d.tgt.Subsystem(k.nqn); !ok || sub != k.sub {
			delete(d.resv.byID, id)
			go k.close()
			continue
		}
		ks = append(ks, k)
	}
	d.resv.mu.Unlock()
	for _, k := range ks {
		if k.hv == nil && k.isUp() {
			_ = k.publishCopy() // the keeper's own publishes say why not
		}
	}
	if !d.reservationsOn() {
		return
	}
	var vols []meta.Volume
	d.node.FSM().Read(func(s *meta.State) { vols = s.Export().Volumes })
	for _, v := range vols {
		if d.keeperOf(v.ID) != nil {
			continue
		}
		d.attachKeeper(v)
	}
}

// attachKeeper gives v's served subsystem its keeper after the upgrade,
// if it has none (checked again under attachMu: addNamespace may have
// given it one meanwhile). A term serving already is not a new one: no
// power loss for it.
func (d *Daemon) attachKeeper(v meta.Volume) {
	d.resv.attachMu.Lock()
	defer d.resv.attachMu.Unlock()
	if d.keeperOf(v.ID) != nil {
		return
	}
	var sub *target.Subsystem
	hv := d.hostVolumeOf(v.ID)
	if hv != nil {
		sub = hv.sub
	} else if s, ok := d.tgt.Subsystem(v.NQN); ok && v.Node == d.cfg.NodeID && len(v.ReplicaSet()) <= 1 {
		sub = s
	} else {
		return
	}
	k := d.newKeeper(v, sub, hv)
	if k == nil {
		return
	}
	if hv != nil {
		d.repl.mu.Lock()
		pl := hv.pl
		d.repl.mu.Unlock()
		k.pubMu.Lock()
		k.term = pl
		k.pubMu.Unlock()
	}
	if err := sub.SetReservations(1, k, nil); err != nil {
		d.log.Warn("reservations: keeper not attached", slog.String("volume", v.Name), slog.String("err", err.Error()))
		d.resv.mu.Lock()
		if d.resv.byID[v.ID] == k {
			delete(d.resv.byID, v.ID)
		}
		d.resv.mu.Unlock()
		k.close()
		return
	}
	d.log.Info("reservations served", slog.String("volume", v.Name))
}

// closeKeepers stops every keeper (shutdown).
func (d *Daemon) closeKeepers() {
	d.resv.mu.Lock()
	ks := d.resv.byID
	d.resv.byID = map[uint64]*resvKeeper{}
	d.resv.mu.Unlock()
	for _, k := range ks {
		k.close()
	}
}

// The leader's part.

// resvRequest is POST /v1/internal/reservation's body: an Op 29 to
// propose.
type resvRequest struct {
	Volume string       `json:"volume"`
	Epoch  uint64       `json:"epoch"`
	Cmd    resv.Command `json:"cmd"`
}

// resvAnswer is its answer: the entry's index and the outcome.
type resvAnswer struct {
	Index   uint64       `json:"index"`
	Outcome resv.Outcome `json:"outcome"`
}

// proposeReservation has the leader apply req (this node if it leads,
// else POST /v1/internal/reservation), retrying with the same token
// through leader changes and lost answers until ctx ends.
func (d *Daemon) proposeReservation(ctx context.Context, req resvRequest) (resvAnswer, error) {
	var last error
	for try := 0; ; try++ {
		ans, err := d.proposeOnce(ctx, req)
		if err == nil || !retryable(err) {
			if err == nil && try > 0 {
				d.log.Info("reservation command applied after a retry with its token", slog.String("volume", req.Volume), slog.Int("tries", try+1), slog.Uint64("index", ans.Index))
			}
			return ans, err
		}
		last = err
		select {
		case <-ctx.Done():
			return resvAnswer{}, fmt.Errorf("%w within %v: %w", errNoLeader, resvCommandWait, last)
		case <-time.After(resvRetry):
		}
	}
}

// retryable says whether a proposal's error may be retried: the registry
// did not say no (a leader change, a lost answer, no leader yet).
func retryable(err error) bool {
	var pa *peerAnswer
	if errors.As(err, &pa) {
		return pa.status == http.StatusMisdirectedRequest || pa.status == http.StatusServiceUnavailable || pa.status >= 500 && pa.status != http.StatusNotImplemented
	}
	switch {
	case errors.Is(err, meta.ErrStaleEpoch), errors.Is(err, errNotServing), errors.Is(err, control.ErrFeatureMissing), errors.Is(err, meta.ErrFeatureMissing), errors.Is(err, meta.ErrUnknownVolume),
		errors.Is(err, meta.ErrVolumeDeleting), errors.Is(err, meta.ErrInvalid), errors.Is(err, meta.ErrBadCommand), errors.Is(err, control.ErrInvalid):
		return false
	}
	return true
}

// proposeOnce is one try of proposeReservation. A refusal by the leader
// comes back as the registry error it was (resvError).
func (d *Daemon) proposeOnce(ctx context.Context, req resvRequest) (resvAnswer, error) {
	if d.node.IsLeader() {
		return d.applyReservation(ctx, req)
	}
	_, api := d.leaderAPI()
	if api == "" {
		return resvAnswer{}, errNoLeader
	}
	var ans resvAnswer
	err := d.postPeer(ctx, api, "/v1/internal/reservation", req, &ans)
	var pa *peerAnswer
	if errors.As(err, &pa) {
		if e := resvError(pa); e != nil {
			return resvAnswer{}, e
		}
	}
	return ans, err
}

// resvError turns the leader's refusal back into the registry error it
// was (resvStatus's inverse), nil for a status to retry.
func resvError(pa *peerAnswer) error {
	var sentinel error
	switch pa.status {
	case http.StatusConflict:
		sentinel = meta.ErrStaleEpoch
	case http.StatusPreconditionFailed:
		sentinel = meta.ErrFeatureMissing
	case http.StatusNotFound:
		sentinel = meta.ErrUnknownVolume
	case http.StatusGone:
		sentinel = meta.ErrVolumeDeleting
	case http.StatusBadRequest:
		sentinel = meta.ErrInvalid
	default:
		return nil
	}
	return fmt.Errorf("the leader: %s: %w", pa.text, sentinel)
}

// resvStatus is the HTTP status of the leader's refusal of an Op 29:
// one per error the keeper tells apart (resvError).
func resvStatus(err error) int {
	switch {
	case errors.Is(err, meta.ErrStaleEpoch):
		return http.StatusConflict
	case errors.Is(err, control.ErrFeatureMissing), errors.Is(err, meta.ErrFeatureMissing):
		return http.StatusPreconditionFailed
	case errors.Is(err, meta.ErrUnknownVolume):
		return http.StatusNotFound
	case errors.Is(err, meta.ErrVolumeDeleting):
		return http.StatusGone
	case errors.Is(err, meta.ErrInvalid), errors.Is(err, meta.ErrBadCommand), errors.Is(err, control.ErrInvalid):
		return http.StatusBadRequest
	}
	return http.StatusServiceUnavailable
}

// applyReservation is the leader's proposal of an Op 29, behind the
// feature gate (control.Manager.Reservation).
func (d *Daemon) applyReservation(ctx context.Context, req resvRequest) (resvAnswer, error) {
	out, index, err := d.mgr.Reservation(ctx, req.Volume, req.Epoch, req.Cmd)
	if err != nil {
		return resvAnswer{}, err
	}
	return resvAnswer{Index: index, Outcome: out}, nil
}

// internalReservation serves POST /v1/internal/reservation on the leader.
func (d *Daemon) internalReservation(w http.ResponseWriter, r *http.Request) error {
	var req resvRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Volume == "" {
		return badRequest(`missing "volume"`)
	}
	ans, err := d.applyReservation(r.Context(), req)
	if err != nil {
		return &apiError{resvStatus(err), err.Error()}
	}
	if h := d.resv.holds.leader; h > 0 {
		time.Sleep(h) // a test's fault: this leader may be killed meanwhile
	}
	writeJSON(w, http.StatusOK, ans)
	return nil
}

// Op 30: the operator's clear, and its push to the serving node (§1.7).

// resvNotify is POST /v1/internal/reservation-notify's body: the serving
// node waits for Index, publishes, and posts the notices.
type resvNotify struct {
	Volume  string        `json:"volume"`
	ID      uint64        `json:"id"`
	Index   uint64        `json:"index"`
	Notices []resv.Notice `json:"notices,omitempty"`
}

// clearReservation serves POST /v1/volumes/{name}/reservation/clear on
// the leader: Op 30, then the notices pushed to the serving node.
func (d *Daemon) clearReservation(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	out, index, err := d.mgr.ClearReservation(r.Context(), name)
	if err != nil {
		return metaError(err, "")
	}
	v, err := d.readVolume(r.Context(), name)
	if err != nil {
		return err
	}
	d.audit.logger().Info("reservation cleared", slog.String("volume", name), slog.Uint64("index", index), slog.Int("registrants_told", len(out.Notices)))
	n := resvNotify{Volume: name, ID: v.ID, Index: index, Notices: out.Notices}
	ctx, cancel := context.WithTimeout(r.Context(), ownerTimeout)
	if err := d.pushNotify(ctx, v.Node, n); err != nil {
		// The serving node's next lease renewal (or keepers' round)
		// publishes it anyway; only the notices are lost.
		d.log.Warn("reservation clear: serving node not told", slog.String("volume", name), slog.String("node", v.Node), slog.String("err", err.Error()))
	}
	cancel()
	writeJSON(w, http.StatusOK, api.ClearReservationAnswer{Reservation: reservationView(v.Reservation)})
	return nil
}

// pushNotify tells node (the volume's serving node) of an Op 30.
func (d *Daemon) pushNotify(ctx context.Context, node string, n resvNotify) error {
	if node == d.cfg.NodeID {
		return d.notifyLocal(ctx, n)
	}
	api := d.apiOf(node)
	if api == "" {
		return fmt.Errorf("the registry knows no API address for node %s", node)
	}
	return d.postPeer(ctx, api, "/v1/internal/reservation-notify", n, nil)
}

// notifyLocal waits for n.Index, publishes and posts n's notices.
func (d *Daemon) notifyLocal(ctx context.Context, n resvNotify) error {
	if err := d.node.WaitApplied(ctx, n.Index); err != nil {
		return &apiError{http.StatusServiceUnavailable, fmt.Sprintf("node %s: registry copy at index %d, not yet %d", d.cfg.NodeID, d.node.AppliedIndex(), n.Index)}
	}
	k := d.keeperOf(n.ID)
	if k == nil {
		return nil // not served here: nobody to tell
	}
	if k.hv != nil {
		if k.hv.hb.cur.Load() == nil {
			return nil // a standby path: its next term's renewal publishes
		}
	} else if !k.isUp() {
		return nil // bringUp publishes it
	}
	if err := k.publishCopy(); err != nil {
		return err
	}
	if len(n.Notices) > 0 {
		k.sub.NotifyReservation(1, n.Notices)
	}
	return nil
}

// internalReservationNotify serves POST /v1/internal/reservation-notify.
func (d *Daemon) internalReservationNotify(w http.ResponseWriter, r *http.Request) error {
	var n resvNotify
	if err := decode(r, &n); err != nil {
		return err
	}
	if n.Volume == "" || n.ID == 0 {
		return badRequest(`missing "volume" or "id"`)
	}
	if err := d.notifyLocal(r.Context(), n); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}

// reservationView is a volume's reservation for the API (§6).
func reservationView(st *resv.State) api.Reservation {
	a := api.Reservation{Type: api.ReservationTypeNames[0]}
	if st == nil {
		return a
	}
	a.Gen, a.PTPL = st.Gen, st.PTPL
	if int(st.Type) < len(api.ReservationTypeNames) {
		a.Type = api.ReservationTypeNames[st.Type]
	} else {
		a.Type = st.Type.String()
	}
	if st.Type != resv.None && !st.Type.AllRegistrants() {
		a.Holder = st.Holder.String()
	}
	for _, r := range st.Regs {
		holds := st.Type.AllRegistrants() || st.Type != resv.None && r.Host == st.Holder
		if holds && !st.Type.AllRegistrants() {
			a.HolderNQN = r.NQN
		}
		a.Registrants = append(a.Registrants, api.Registrant{HostID: r.Host.String(), HostNQN: r.NQN, Key: r.Key, Holder: holds})
	}
	return a
}

// redactReservation is r without the host NQNs, for a reader (redact):
// the host IDs, keys and generation stay.
func redactReservation(r *api.Reservation) *api.Reservation {
	if r == nil {
		return nil
	}
	c := *r
	c.HolderNQN = ""
	c.Registrants = slices.Clone(r.Registrants)
	for i := range c.Registrants {
		c.Registrants[i].HostNQN = ""
	}
	return &c
}

// reservationFields fills a's reservation from v (views).
func reservationFields(v meta.Volume, a *api.Volume) {
	r := reservationView(v.Reservation)
	a.Reservation = &r
}
