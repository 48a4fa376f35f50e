package blkd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
)

// Failover (docs/replication.md §3–4).
//
// Every replica's node exports a replicated volume's host subsystem under
// the volume's NQN, with one ANA group: optimized on the primary while
// it holds a lease, inaccessible elsewhere. A Linux host with native
// multipath connects every path and sends I/O to the optimized one; when
// the primary's node dies, the leader makes an in-sync replica primary
// at the next epoch (SetPrimary), that node's path turns optimized and
// the host moves there by itself.
//
// The lease keeps a primary that was cut off (SIGSTOP, a partition) from
// serving a single I/O once another may have taken over. A primary asks
// the registry's leader for it every leaseInterval, stamping the time t0
// before it asks; the leader confirms it still leads (a heartbeat round
// to a majority), counts the node as heard from, and answers its applied
// raft index. The node waits until its registry copy has applied that
// index, checks that it is still the primary of each volume at the
// epoch it serves, and serves until t0 + leaseDuration. The leader fails
// a node over only once it has not heard from it for downAfter (> the
// lease): every lease it granted has ended by then, whatever the clocks
// say, since t0 precedes the grant. A new leader waits downAfter from
// its own start before it judges a silent node, and a grant needs a
// leader that a majority still follows: an old leader's grants have
// ended too. A node whose API port refuses connections is down at once:
// its process is gone, and with it every lease it held.

const (
	// leaseDuration is how long a primary serves after it asked for its
	// lease (t0): 2 s short of downAfter, the margin for the leader's
	// probe timeout and clock rates.
	leaseDuration = 4 * time.Second
	// leaseInterval is how often a primary asks: three tries inside one
	// lease, so that a lost request or a short election costs nothing.
	leaseInterval = time.Second
	// leaseAskTimeout bounds one request for a lease.
	leaseAskTimeout = time.Second
)

// monoStart anchors mono, the process's monotonic clock in nanoseconds.
var monoStart = time.Now()

func mono() int64 { return int64(time.Since(monoStart)) }

// hostVolume is a replicated volume's host subsystem on this node.
type hostVolume struct {
	id   uint64
	name string
	nqn  string
	sub  *target.Subsystem
	hb   *hostBackend
	// local is the node's replica (the store volume's backend).
	local target.AsyncBackend
	// pl is the current primary term, nil on a standby path; under
	// replicas.mu.
	pl *primaryLeg
}

// hostBackend is the namespace backend of a replicated volume's host
// subsystem: while this node is primary and the term holds its lease,
// the term's repl.Backend; otherwise every I/O answers the inaccessible
// path status (no DNR: a multipath host retries it on another path)
// before it reaches any copy. Two atomic loads and a clock read per I/O.
// The lease is the term's own (primaryLeg.lease): a renewal that comes
// late for an ended term cannot reach the next one.
type hostBackend struct {
	local target.AsyncBackend
	cur   atomic.Pointer[primaryLeg] // the term serving, nil: none
}

var errNoLease = target.WithStatus(errors.New("this node is not serving the volume as its primary (a standby path, or its lease lapsed)"), nvme.StatusANAInaccessible)

func (h *hostBackend) Submit(io *target.IO) {
	pl := h.cur.Load()
	if pl == nil || mono() >= pl.lease.Load() {
		io.Done(errNoLease)
		return
	}
	pl.b.Submit(io)
}

func (h *hostBackend) Geometry() (target.Geometry, error) { return h.local.Geometry() }

func (h *hostBackend) TryGeometry() (target.Geometry, bool, error) {
	if t, ok := h.local.(target.GeometryTrier); ok {
		return t.TryGeometry()
	}
	g, err := h.local.Geometry()
	return g, true, err
}

func (h *hostBackend) Blocking() bool                   { return h.local.Blocking() }
func (h *hostBackend) NewWriteGroup() target.WriteGroup { return nil }

var _ target.GeometryTrier = (*hostBackend)(nil)

// hostVolumeOf returns the host subsystem of volume id on this node, if
// it serves one.
func (d *Daemon) hostVolumeOf(id uint64) *hostVolume {
	d.repl.mu.Lock()
	defer d.repl.mu.Unlock()
	return d.repl.host[id]
}

// hostVolumeByNQN is hostVolumeOf by subsystem NQN.
func (d *Daemon) hostVolumeByNQN(nqn string) *hostVolume {
	d.repl.mu.Lock()
	defer d.repl.mu.Unlock()
	for _, hv := range d.repl.host {
		if hv.nqn == nqn {
			return hv
		}
	}
	return nil
}

// ensureHostVolume makes v's host subsystem an ANA path of this node,
// inaccessible until a primary term and its lease make it optimized. A
// subsystem served before without ANA (a volume of one replica then) is
// replaced: its hosts reconnect.
func (d *Daemon) ensureHostVolume(v meta.Volume) (*hostVolume, error) {
	if hv := d.hostVolumeOf(v.ID); hv != nil {
		return hv, nil
	}
	if _, ok := d.tgt.Subsystem(v.NQN); ok {
		if err := d.tgt.RemoveSubsystem(v.NQN); err != nil && !errors.Is(err, target.ErrNotFound) {
			return nil, err
		}
		d.stopPrimaryLeg(v.NQN)
	}
	vol, err := d.store.Volume(store.ID(v.ID))
	if err != nil {
		return nil, err
	}
	keys, err := hostKeys(v)
	if err != nil {
		return nil, err
	}
	local := d.sio.Backend(vol)
	hv := &hostVolume{id: v.ID, name: v.Name, nqn: v.NQN, local: local, hb: &hostBackend{local: local}}
	hv.sub, err = d.tgt.AddSubsystem(target.SubsystemConfig{
		NQN: v.NQN, Serial: fmt.Sprintf("blk-%d", v.ID), Model: "blk",
		AllowAnyHost: v.AllowAny, Hosts: v.Hosts, HostKeys: keys,
		ANA: true, ANAState: nvme.ANAInaccessible,
		// The other replicas' nodes, in this node's discovery log: a host
		// connects every path from any one (nvme connect-all).
		Paths: d.volumePaths(v),
	})
	if err != nil {
		return nil, err
	}
	// With a reservation keeper once every node serves reservations, its
	// view unknown until a renewal publishes it (reservation.go).
	if err := d.addNamespace(v, hv.sub, hv, target.NamespaceConfig{NSID: 1, Async: hv.hb}); err != nil {
		_ = d.tgt.RemoveSubsystem(v.NQN)
		return nil, err
	}
	d.repl.mu.Lock()
	d.repl.host[v.ID] = hv
	d.repl.mu.Unlock()
	return hv, nil
}

// servePrimary starts a primary term of the replicated volume v on this
// node (serve, when Served says the node does not serve v as its
// primary at v's epoch): the host subsystem stays (hosts keep their
// connections), a term over the previous one's end starts, connecting
// the legs; the lease loop makes the path optimized once the legs are
// connected and the leader granted a lease.
func (d *Daemon) servePrimary(v meta.Volume) error {
	hv, err := d.ensureHostVolume(v)
	if err != nil {
		return err
	}
	d.repl.mu.Lock()
	old := hv.pl
	d.repl.mu.Unlock()
	if old != nil {
		d.endTerm(hv, "a new term starts")
	}
	pl, err := d.newPrimaryLeg(v, hv.local)
	if err != nil {
		return err
	}
	d.repl.mu.Lock()
	hv.pl = pl
	d.repl.primary[v.ID] = pl
	d.repl.mu.Unlock()
	hv.hb.cur.Store(pl) // serving from its first lease (pl.lease)
	d.log.Info("primary term", slog.String("volume", v.Name), slog.Uint64("epoch", pl.epoch))
	d.startLegs(pl, v)
	if d.ready.Load() {
		// Not while the node starts (its peers may be starting too,
		// their ports closed): Start waits for every volume at once
		// (waitPrimaryLegs), once its own ports are open.
		select {
		case <-pl.leased:
		case <-pl.done:
		case <-time.After(replicaReadyWait):
		}
	}
	return nil
}

// endTerm ends hv's primary term: the path turns inaccessible (an ANA
// change notice to the hosts), no new I/O reaches the term's backend,
// every host I/O already past that point completes (the hosts'
// controllers are torn down and drained: they reconnect to a path that
// is inaccessible), and the legs close. After it, nothing this node
// served as primary is still in flight: a new primary may write here.
func (d *Daemon) endTerm(hv *hostVolume, why string) {
	d.repl.mu.Lock()
	pl := hv.pl
	hv.pl = nil
	d.repl.mu.Unlock()
	if pl == nil {
		return
	}
	// The backend first, then the state: a lease round that turned the
	// path optimized just before checks the backend again after (renew).
	hv.hb.cur.Store(nil)
	pl.lease.Store(0)
	_ = hv.sub.SetANAState(nvme.ANAInaccessible)
	ctx, cancel := context.WithTimeout(context.Background(), ownerTimeout)
	n, err := hv.sub.EvictAndDrain(ctx, func(string) bool { return true })
	if err != nil {
		d.log.Error("primary term ended, its host I/O not drained", slog.String("volume", hv.name), slog.String("err", err.Error()))
	}
	// An import's writes (imagewrite.go) are no host's: wait for those
	// that passed the term check before cur was cleared.
	for pl.imports.Load() != 0 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if k := pl.imports.Load(); k != 0 {
		d.log.Error("primary term ended, an import's writes not drained", slog.String("volume", hv.name), slog.Int64("writes", k))
	}
	d.stopPrimaryLeg(hv.nqn)
	d.log.Info("primary term ended", slog.String("volume", hv.name), slog.Uint64("epoch", pl.epoch), slog.String("reason", why), slog.Int("evicted", n))
}

// demote is control.ReplicaTarget's Demote: v's host subsystem stays as
// a standby path (inaccessible), its primary term (if any) ended.
func (d *Daemon) demote(v meta.Volume) error {
	hv := d.hostVolumeOf(v.ID)
	if hv == nil {
		// Not an ANA path (served when the volume had one replica, or by
		// an older binary): a secondary does not serve it.
		if _, ok := d.tgt.Subsystem(v.NQN); ok {
			if err := d.tgt.RemoveSubsystem(v.NQN); err != nil && !errors.Is(err, target.ErrNotFound) {
				return err
			}
		}
		d.stopPrimaryLeg(v.NQN)
		return nil
	}
	d.endTerm(hv, fmt.Sprintf("node %s is primary at epoch %d", v.Node, v.CurrentEpoch()))
	return nil
}

// refreshPaths brings the discovery log's other paths of v's host
// subsystem to v's replica set (a change posts the discovery change
// notice).
func (d *Daemon) refreshPaths(v meta.Volume) error {
	hv := d.hostVolumeOf(v.ID)
	if hv == nil {
		return nil
	}
	want := d.volumePaths(v)
	if slices.Equal(hv.sub.Paths(), want) {
		return nil
	}
	return hv.sub.SetPaths(want)
}

// serveStandby serves v's host subsystem on this node, a secondary, as
// a path that does not serve (ANA inaccessible), with v's hosts.
func (d *Daemon) serveStandby(v meta.Volume) error {
	if _, err := d.ensureHostVolume(v); err != nil {
		return fmt.Errorf("standby path %s: %w", v.NQN, err)
	}
	return d.tparts.SetHosts(v)
}

// primaryAt says whether this node serves v as its primary at v's epoch,
// in a term that still runs.
func (d *Daemon) primaryAt(v meta.Volume) bool {
	_, pl := d.termAt(v)
	return pl != nil
}

// termAt returns v's host subsystem on this node and the primary term it
// serves v in, if that term is at v's epoch and still runs; pl is nil
// otherwise (a term of an older epoch must not act for the current one).
func (d *Daemon) termAt(v meta.Volume) (hv *hostVolume, pl *primaryLeg) {
	hv = d.hostVolumeOf(v.ID)
	if hv == nil {
		return nil, nil
	}
	d.repl.mu.Lock()
	pl = hv.pl
	d.repl.mu.Unlock()
	if pl == nil || pl.epoch != v.CurrentEpoch() || pl.dead() {
		return hv, nil
	}
	return hv, pl
}

// removeHostVolume forgets the host subsystem of the volume served under
// nqn (it was removed) and ends its term.
func (d *Daemon) removeHostVolume(nqn string) {
	d.repl.mu.Lock()
	var hv *hostVolume
	for id, h := range d.repl.host {
		if h.nqn == nqn {
			hv = h
			delete(d.repl.host, id)
		}
	}
	if hv != nil {
		hv.pl = nil
	}
	d.repl.mu.Unlock()
	if hv != nil {
		hv.hb.cur.Store(nil)
	}
}

// The lease, node side.

// leaseAnswer is the body of POST /v1/internal/lease's answer.
type leaseAnswer struct {
	Index uint64 `json:"index"`
}

// leaseRequest is its body.
type leaseRequest struct {
	Node string `json:"node"`
}

// kickLease asks the lease loop for a round now (a term's legs are
// connected).
func (d *Daemon) kickLease() {
	select {
	case d.leaseKick <- struct{}{}:
	default:
	}
}

// leaseLoop renews the lease of every primary term on this node until
// stop closes.
func (d *Daemon) leaseLoop(stop <-chan struct{}) {
	t := time.NewTicker(leaseInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		case <-d.leaseKick:
		}
		d.leaseRound(stop)
	}
}

// leaseRound asks for a lease once and applies the answer to every term.
func (d *Daemon) leaseRound(stop <-chan struct{}) {
	d.repl.mu.Lock()
	var hvs []*hostVolume
	for _, hv := range d.repl.host {
		if hv.pl != nil {
			hvs = append(hvs, hv)
		}
	}
	d.repl.mu.Unlock()
	if len(hvs) == 0 {
		return
	}
	t0 := mono()
	until := t0 + int64(leaseDuration)
	ctx, cancel := context.WithTimeout(context.Background(), leaseAskTimeout)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	index, err := d.askLease(ctx)
	if err == nil {
		// The copy must show what the leader had applied: a term it
		// shows is current then was current when the leader answered.
		wctx, wcancel := context.WithTimeout(context.Background(), time.Duration(until-mono()))
		err = d.node.WaitApplied(wctx, index)
		wcancel()
		if err != nil {
			err = fmt.Errorf("registry copy at index %d, the leader's %d: %w", d.node.AppliedIndex(), index, err)
		}
	}
	if err != nil {
		d.leaseLapsed(hvs, err)
		return
	}
	for _, hv := range hvs {
		d.renew(hv, until)
	}
}

// renew extends hv's lease to until if the registry copy still shows
// this node primary at the term's epoch, and deposes the term otherwise.
func (d *Daemon) renew(hv *hostVolume, until int64) {
	d.repl.mu.Lock()
	pl := hv.pl
	d.repl.mu.Unlock()
	if pl == nil || hv.hb.cur.Load() != pl {
		return // no term, or one deposed or being ended: reconcile ends it
	}
	var v meta.Volume
	var ok bool
	d.node.FSM().Read(func(s *meta.State) { v, ok = s.Volume(hv.name) })
	if !ok || v.ID != hv.id || v.Node != d.cfg.NodeID || v.CurrentEpoch() != pl.epoch {
		// Deposed: stop serving at once, then let reconcile end the term
		// (drain, legs) from the registry copy.
		hv.hb.cur.Store(nil)
		_ = hv.sub.SetANAState(nvme.ANAInaccessible)
		why := "the volume is gone"
		if ok {
			why = fmt.Sprintf("node %s is primary at epoch %d", v.Node, v.CurrentEpoch())
		}
		d.log.Warn("primary deposed", slog.String("volume", hv.name), slog.Uint64("epoch", pl.epoch), slog.String("reason", why))
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), ownerTimeout)
			defer cancel()
			if _, err := d.reconcileLocal(ctx, hv.name, d.node.AppliedIndex()); err != nil {
				d.log.Warn("deposed primary: reconcile", slog.String("volume", hv.name), slog.String("err", err.Error()))
			}
		}()
		return
	}
	if !d.renewReservation(hv, pl, v) {
		return // a power loss (PTPL off) is being recorded: serve after it
	}
	pl.lease.Store(until)
	if pl.b.Serving() && hv.sub.ANAState() != nvme.ANAOptimized {
		_ = hv.sub.SetANAState(nvme.ANAOptimized)
		if hv.hb.cur.Load() != pl {
			// The term ended meanwhile (endTerm unsets the backend
			// before it sets the state): never leave a path optimized
			// that serves nothing.
			_ = hv.sub.SetANAState(nvme.ANAInaccessible)
			return
		}
		d.log.Info("primary serving", slog.String("volume", hv.name), slog.Uint64("epoch", pl.epoch))
	}
	if pl.b.Serving() {
		pl.lease1.Do(func() { close(pl.leased) })
	}
}

// leaseLapsed turns the paths whose lease ended inaccessible (the host
// learns it now, not at its next I/O).
func (d *Daemon) leaseLapsed(hvs []*hostVolume, err error) {
	now := mono()
	for _, hv := range hvs {
		pl := hv.hb.cur.Load()
		if pl != nil && now < pl.lease.Load() || hv.sub.ANAState() != nvme.ANAOptimized {
			continue
		}
		_ = hv.sub.SetANAState(nvme.ANAInaccessible)
		d.log.Warn("primary lease lapsed: not serving until the registry's leader renews it", slog.String("volume", hv.name), slog.String("err", err.Error()))
	}
}

// askLease asks the registry's leader for a lease; it answers the raft
// index it had applied.
func (d *Daemon) askLease(ctx context.Context) (uint64, error) {
	if d.node.IsLeader() {
		return d.grantLease(ctx, d.cfg.NodeID)
	}
	_, api := d.leaderAPI()
	if api == "" {
		return 0, errors.New("no registry leader known")
	}
	var a leaseAnswer
	if err := d.postPeer(ctx, api, "/v1/internal/lease", leaseRequest{Node: d.cfg.NodeID}, &a); err != nil {
		return 0, fmt.Errorf("leader at %s: %w", api, err)
	}
	return a.Index, nil
}

// grantLease is the leader's part: it confirms it still leads (a
// heartbeat round a majority answered), counts node as heard from now,
// and returns its applied index.
func (d *Daemon) grantLease(ctx context.Context, node string) (uint64, error) {
	f := d.node.Raft().VerifyLeader()
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		if err != nil {
			return 0, fmt.Errorf("not the registry's leader: %w", err)
		}
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	d.live.heard(node)
	return d.node.AppliedIndex(), nil
}

// internalLease serves POST /v1/internal/lease on the leader.
func (d *Daemon) internalLease(w http.ResponseWriter, r *http.Request) error {
	var req leaseRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Node == "" {
		return badRequest(`"node" is required`)
	}
	if name, bound := certNode(r); bound && name != req.Node {
		return &apiError{http.StatusForbidden, fmt.Sprintf("a certificate of node %q asks a lease for node %q", name, req.Node)}
	}
	index, err := d.grantLease(r.Context(), req.Node)
	if err != nil {
		return &apiError{http.StatusServiceUnavailable, err.Error()}
	}
	writeJSON(w, http.StatusOK, leaseAnswer{Index: index})
	return nil
}

// The leader's view of the nodes (liveness.go's probes and the leases).

// liveness is when the leader last heard from each node: an answered
// probe or a lease request. Reset when this node stops leading.
type liveness struct {
	mu   sync.Mutex
	seen map[string]time.Time // nil: not leading
}

// heard records node as alive now, if this node keeps the record.
func (l *liveness) heard(node string) {
	l.mu.Lock()
	if l.seen != nil {
		l.seen[node] = time.Now()
	}
	l.mu.Unlock()
}

// The leader's failover decision.

// failoverRound makes another replica primary of every replicated volume
// whose primary's node is down (liveness.go set it so), for the volumes
// not already being failed over.
func (d *Daemon) failoverRound() {
	var vols []meta.Volume
	down := map[string]bool{}
	primaries := map[string]int{}
	d.node.FSM().Read(func(s *meta.State) {
		snap := s.Export()
		for _, n := range snap.Nodes {
			if n.State != meta.NodeUp {
				down[n.ID] = true
			}
		}
		for _, v := range snap.Volumes {
			primaries[v.Node]++
			if len(v.ReplicaSet()) > 1 {
				vols = append(vols, v)
			}
		}
	})
	now := time.Now()
	for _, v := range vols {
		if v.State == meta.VolumeDeleting || v.State == meta.VolumeCreating {
			continue
		}
		if !down[v.Node] {
			// Failback: the primary placement chose, in sync long enough.
			pref := v.ReplicaSet()[0]
			after := time.Duration(d.cfg.FailbackAfter)
			if pref.Node != v.Node && after > 0 && pref.State == meta.ReplicaInSync && !down[pref.Node] &&
				now.Sub(time.Unix(0, pref.Since)) >= after && d.startFailover(v.Name) {
				go d.handover(v, pref.Node, fmt.Sprintf("failback: in sync for %v", now.Sub(time.Unix(0, pref.Since)).Round(time.Second)))
			}
			continue
		}
		var cands []string
		for _, r := range v.ReplicaSet() {
			if r.Node != v.Node && r.State == meta.ReplicaInSync && !down[r.Node] {
				cands = append(cands, r.Node)
			}
		}
		if len(cands) == 0 {
			d.failMu.Lock()
			warned := d.failWarned[v.Name]
			d.failWarned[v.Name] = true
			d.failMu.Unlock()
			if !warned {
				d.log.Error("failover impossible: no in-sync replica on a node that is up; the volume is unavailable until its primary's node returns", slog.String("volume", v.Name), slog.String("primary", v.Node))
			}
			continue
		}
		slices.SortFunc(cands, func(a, b string) int {
			if c := primaries[a] - primaries[b]; c != 0 {
				return c
			}
			if a < b {
				return -1
			}
			return 1
		})
		to := cands[0]
		if !d.startFailover(v.Name) {
			continue
		}
		primaries[to]++
		go d.setPrimary(v, to, true, "failover")
	}
}

// startFailover claims v's change of primary; false if one runs.
func (d *Daemon) startFailover(volume string) bool {
	d.failMu.Lock()
	defer d.failMu.Unlock()
	if d.failing[volume] {
		return false
	}
	d.failing[volume] = true
	delete(d.failWarned, volume)
	return true
}

// handover is a planned change of primary (failback).
func (d *Daemon) handover(v meta.Volume, to, why string) { d.setPrimary(v, to, false, why) }

// setPrimary makes node to primary of v (failover: from a primary lost),
// then releases v's claim (startFailover).
func (d *Daemon) setPrimary(v meta.Volume, to string, failover bool, why string) {
	defer func() {
		d.failMu.Lock()
		delete(d.failing, v.Name)
		d.failMu.Unlock()
	}()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*ownerTimeout)
	defer cancel()
	d.log.Warn("primary change", slog.String("volume", v.Name), slog.String("from", v.Node), slog.String("to", to), slog.Uint64("epoch", v.CurrentEpoch()+1), slog.String("reason", why))
	nv, err := d.mgr.SetPrimary(ctx, v.Name, v.CurrentEpoch(), to, failover)
	if err != nil && nv.Node != to {
		d.log.Error("primary change not done", slog.String("volume", v.Name), slog.String("to", to), slog.String("err", err.Error()))
		return
	}
	attrs := []any{slog.String("volume", v.Name), slog.String("primary", nv.Node), slog.Uint64("epoch", nv.CurrentEpoch()), slog.Duration("took", time.Since(start))}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	d.log.Info("primary change done", attrs...)
}
