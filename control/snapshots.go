package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/store"
)

// Snapshots and clones (docs/snapshots.md §2.3). The registry holds the
// intent (meta's snapshot commands); each node's reconcile makes its
// store agree: a snapshot being deleted is merged into its child, a
// clone being created is made from the node's copy of its snapshot, a
// revert is applied once (by its token), a flatten runs in the
// background. Taking a snapshot is the one step reconcile does not do:
// it must happen at one point of the volume's write stream, so the
// manager asks the primary (Snapshotter), which holds host writes while
// every copy takes it.

// SnapshotStore is an optional extension of Store, for a store that
// keeps snapshots and clones (package store's, adapted in cmd/blkd).
type SnapshotStore interface {
	// Snapshot makes snap a read-only snapshot of volume vol; vol
	// continues on top of it. Idempotent: nil if snap already is vol's
	// parent.
	Snapshot(vol, snap uint64) error
	// Clone makes clone a writable volume on top of snapshot snap.
	// Idempotent: nil if clone exists with parent snap.
	Clone(snap, clone uint64) error
	// Revert makes vol read as snapshot snap again (a new empty map on
	// top of it), once per token.
	Revert(vol, snap, token uint64) error
	// Flatten copies into clone vol every cluster it still reads from
	// its parents and detaches it; progress is called as it goes.
	Flatten(ctx context.Context, vol uint64, progress func(done, total uint64)) error
	// Parent is the store parent of object id (0: none).
	Parent(id uint64) (uint64, error)
	// Has says whether the store holds object id (a volume or a
	// snapshot).
	Has(id uint64) (bool, error)
}

// Snapshotter is an optional interface of Owners: it has a volume's
// primary take a snapshot the registry holds as being taken, at one
// point of the write stream on every in-sync copy.
type Snapshotter interface {
	// TakeSnapshot asks node, volume's primary, to take its snapshot
	// snap once its registry copy has applied index. It returns the
	// nodes whose copy took it and how long host writes were held.
	TakeSnapshot(ctx context.Context, node, volume, snap string, index uint64) (Taken, error)
}

// Taken is what a primary answers TakeSnapshot.
type Taken struct {
	Nodes []string      `json:"nodes"`
	Held  time.Duration `json:"held_ns"`
}

// FlattenStatus is a flatten's progress on one node.
type FlattenStatus struct {
	DoneBytes  uint64 `json:"done_bytes"`
	TotalBytes uint64 `json:"total_bytes"`
	// Finished: the node's copy is flat (no parent).
	Finished bool `json:"finished,omitempty"`
	// Err: the last attempt failed (the next reconcile tries again).
	Err string `json:"err,omitempty"`
}

// flattenRun is one volume's flatten running on this node.
type flattenRun struct {
	cancel      context.CancelFunc
	done, total atomic.Uint64
	mu          sync.Mutex
	finished    bool
	err         string
	running     bool
}

func (f *flattenRun) status() *FlattenStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &FlattenStatus{DoneBytes: f.done.Load(), TotalBytes: f.total.Load(), Finished: f.finished, Err: f.err}
}

// snapshotStore is r's store as a SnapshotStore, if it is one.
func (r *Reconciler) snapshotStore() (SnapshotStore, bool) {
	ss, ok := r.store.(SnapshotStore)
	return ss, ok
}

// needsSnapshots says whether v uses anything only a SnapshotStore does.
func needsSnapshots(v meta.Volume) bool {
	return len(v.Snapshots) > 0 || v.CloneOf != nil || v.Reverted != 0 || v.Parent != 0
}

// createClone makes clone v from this node's copy of its origin snapshot.
func (r *Reconciler) createClone(v meta.Volume) error {
	ss, ok := r.snapshotStore()
	if !ok {
		return fmt.Errorf("clone of %s: this node's store keeps no snapshots", v.CloneOf)
	}
	if err := ss.Clone(v.CloneOf.ID, v.ID); err != nil {
		return fmt.Errorf("make clone %d of %s (snapshot %d): %w", v.ID, v.CloneOf, v.CloneOf.ID, err)
	}
	return nil
}

// reconcileSnapshots brings this node's copy of v to the registry's
// snapshots before the volume itself is checked: a revert not yet
// applied is applied, the snapshots being deleted are merged away, a
// flatten asked for runs. It fills st.Snapshots.
func (r *Reconciler) reconcileSnapshots(st *Status, v meta.Volume) error {
	st.Snapshots, st.Flatten = nil, nil
	ss, ok := r.snapshotStore()
	if !ok {
		if needsSnapshots(v) {
			return errors.New("the volume has snapshots or is a clone, and this node's store keeps none")
		}
		return nil
	}
	if has, err := ss.Has(v.ID); err != nil || !has {
		return err // the volume's own checks say what is missing
	}
	if v.Reverted != 0 {
		if err := ss.Revert(v.ID, v.Parent, v.Reverted); err != nil {
			return fmt.Errorf("revert store volume %d to snapshot %d: %w", v.ID, v.Parent, err)
		}
	}
	// Newest first: each has one child (the registry refused more), so
	// any order merges, and newest first moves each cluster once.
	for i := len(v.Snapshots) - 1; i >= 0; i-- {
		s := v.Snapshots[i]
		if s.State != meta.SnapshotDeleting {
			continue
		}
		if err := r.store.Delete(s.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("delete snapshot %s@%s (store object %d): %w", v.Name, s.Name, s.ID, err)
		}
		r.log.Info("snapshot deleted", "volume", v.Name, "snapshot", s.Name, "id", s.ID)
	}
	r.dropOrphans(v, ss)
	for _, s := range v.Snapshots {
		has, err := ss.Has(s.ID)
		if err != nil {
			return err
		}
		if has {
			st.Snapshots = append(st.Snapshots, s.ID)
		}
	}
	r.flatten(st, v, ss)
	return nil
}

// dropOrphans deletes the snapshots on v's chain in this node's store
// that the registry does not know: one a replica took after its barrier
// had failed and the snapshot was dropped (the copy's request arrived
// late), or whose purge the node missed. The chain is walked from the
// volume down to its clone origin (whose snapshots are the origin
// volume's). Each is merged into its child, as a delete of it would; a
// failure is logged and tried again at the next reconcile, never fails
// the volume: its data reads the same either way.
func (r *Reconciler) dropOrphans(v meta.Volume, ss SnapshotStore) {
	known := make(map[uint64]bool, len(v.Snapshots))
	for _, s := range v.Snapshots {
		known[s.ID] = true
	}
	stop := uint64(0)
	if v.CloneOf != nil {
		stop = v.CloneOf.ID
	}
	for id, n := v.ID, 0; n <= meta.MaxSnapshots+1; n++ {
		p, err := ss.Parent(id)
		if err != nil || p == 0 || p == stop {
			return
		}
		if !known[p] {
			if err := r.store.Delete(p); err != nil && !errors.Is(err, store.ErrNotFound) {
				r.log.Warn("store snapshot unknown to the registry not deleted", "volume", v.Name, "id", p, "err", err)
				return
			}
			r.log.Warn("store snapshot unknown to the registry deleted (a snapshot dropped after this node took it)", "volume", v.Name, "id", p)
			continue // id's parent is now p's parent
		}
		id = p
	}
}

// flatten starts v's flatten on this node if the registry asks for one
// and none runs, and reports its progress in st.
func (r *Reconciler) flatten(st *Status, v meta.Volume, ss SnapshotStore) {
	f := r.flattens[v.ID]
	if v.Flatten == nil || v.CloneOf == nil {
		// stopFlatten, not f.cancel(): a flatten found finished at start
		// (the copy flat already) never had a cancel.
		r.stopFlatten(v.ID)
		return
	}
	if f == nil {
		f = &flattenRun{}
		r.flattens[v.ID] = f
	}
	f.mu.Lock()
	start := !f.running && !f.finished
	if start {
		f.running, f.err = true, ""
	}
	f.mu.Unlock()
	if start {
		if p, err := ss.Parent(v.ID); err == nil && p == 0 {
			// Flat already (a flatten that ended before a restart).
			f.mu.Lock()
			f.running, f.finished = false, true
			f.mu.Unlock()
		} else {
			ctx, cancel := context.WithCancel(context.Background())
			f.cancel = cancel
			go r.runFlatten(ctx, f, v, ss)
		}
	}
	st.Flatten = f.status()
}

func (r *Reconciler) runFlatten(ctx context.Context, f *flattenRun, v meta.Volume, ss SnapshotStore) {
	r.log.Info("flatten started", "volume", v.Name, "id", v.ID, "clone_of", v.CloneOf.String())
	start := time.Now()
	err := ss.Flatten(ctx, v.ID, func(done, total uint64) { f.done.Store(done); f.total.Store(total) })
	f.mu.Lock()
	f.running = false
	if err != nil {
		f.err = err.Error()
	} else {
		f.finished = true
	}
	f.mu.Unlock()
	if err != nil {
		r.log.Error("flatten failed", "volume", v.Name, "id", v.ID, "err", err)
		return
	}
	r.log.Info("flatten done", "volume", v.Name, "id", v.ID, "copied_bytes", f.done.Load(), "took", time.Since(start).String())
	if r.OnFlattenDone != nil {
		r.OnFlattenDone(v.Name)
	}
}

// deleteSnapshots deletes a deleted volume's snapshots from the store,
// newest first: each has no child left once the later ones and the
// volume are gone (the registry refused a snapshot with clones).
func (r *Reconciler) deleteSnapshots(v meta.Volume) error {
	for i := len(v.Snapshots) - 1; i >= 0; i-- {
		s := v.Snapshots[i]
		if err := r.store.Delete(s.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("delete snapshot %s@%s (store object %d): %w", v.Name, s.Name, s.ID, err)
		}
	}
	return nil
}

// stopFlatten ends a flatten of volume id running here, if any.
func (r *Reconciler) stopFlatten(id uint64) {
	if f := r.flattens[id]; f != nil {
		if f.cancel != nil {
			f.cancel()
		}
		delete(r.flattens, id)
	}
}

// FlattenProgress is the progress of volume id's flatten on this node,
// if one ran since the node started.
func (r *Reconciler) FlattenProgress(id uint64) (FlattenStatus, bool) {
	r.mu.Lock()
	f := r.flattens[id]
	r.mu.Unlock()
	if f == nil {
		return FlattenStatus{}, false
	}
	return *f.status(), true
}

// ---- Manager ----

// snapshotter is the Owners' Snapshotter, or an error saying there is
// none.
func (m *Manager) snapshotter() (Snapshotter, error) {
	s, ok := m.owners.(Snapshotter)
	if !ok {
		return nil, fmt.Errorf("%w: this node cannot take snapshots", ErrInvalid)
	}
	return s, nil
}

// Snapshot takes a snapshot called name of volume: the registry records
// it as being taken, every replica's node reconciles the volume (so that
// the snapshot is of what the registry holds), the primary takes it on
// every in-sync copy at one point of the write stream, and the registry
// marks it ready on the copies that took it. If the primary fails, the
// snapshot is deleted again (on the nodes that took it) and the error
// says why; if it does not answer, the leader's settle rounds finish or
// delete it.
func (m *Manager) Snapshot(ctx context.Context, volume, name string) (meta.Volume, meta.VolumeSnapshot, time.Duration, error) {
	return m.SnapshotOrigin(ctx, volume, name, "")
}

// SnapshotOrigin is Snapshot for the snapshot an import takes: origin,
// the exported snapshot's "cluster/ID", is kept as its Origin
// (meta.CreateSnapshot), where the next diff's base is looked for.
func (m *Manager) SnapshotOrigin(ctx context.Context, volume, name, origin string) (meta.Volume, meta.VolumeSnapshot, time.Duration, error) {
	if err := m.requireFeature(ctx, meta.FeatureSnapshots); err != nil {
		return meta.Volume{}, meta.VolumeSnapshot{}, 0, err
	}
	taker, err := m.snapshotter()
	if err != nil {
		return meta.Volume{}, meta.VolumeSnapshot{}, 0, err
	}
	cmd := meta.CreateSnapshot{Volume: volume, Name: name, At: m.Now().UnixNano(), Origin: origin}
	if err := cmd.Check(); err != nil {
		return meta.Volume{}, meta.VolumeSnapshot{}, 0, err
	}
	defer m.lock(volume)()
	res, err := m.reg.Apply(ctx, cmd)
	if err != nil {
		return meta.Volume{}, meta.VolumeSnapshot{}, 0, err
	}
	v := *res.Volume
	// What the registry holds for the volume and a node has not applied
	// (its reconcile lost with a leader) is applied before the snapshot
	// is taken: else the snapshot holds the volume as it was before. A
	// revert applied later would go onto the new snapshot and be lost
	// (TestSnapshotAfterUnappliedRevert); a growth would leave the
	// snapshot shorter than the registry says (TestSnapshotCrashThenGoOn).
	// When every node is up to date this is a reconcile that changes
	// nothing.
	if err := m.convergeForSnapshot(ctx, v, name, res.Index); err != nil {
		return v, meta.VolumeSnapshot{}, 0, err
	}
	taken, err := taker.TakeSnapshot(ctx, v.Node, volume, name, res.Index)
	if err != nil {
		var ae interface{ Refused() bool }
		if errors.As(err, &ae) && ae.Refused() {
			m.dropSnapshot(context.WithoutCancel(ctx), volume, name)
			return v, meta.VolumeSnapshot{}, 0, fmt.Errorf("%w: snapshot %s@%s on node %s: %v", ErrOwnerFailed, volume, name, v.Node, err)
		}
		return v, meta.VolumeSnapshot{}, 0, fmt.Errorf("%w: snapshot %s@%s is registered (creating) but its primary %s did not say it took it: %v; the cluster finishes or deletes it within a minute", ErrOwnerUnreachable, volume, name, v.Node, err)
	}
	res, err = m.reg.Apply(ctx, meta.SnapshotDone{Volume: volume, Name: name, Epoch: v.CurrentEpoch(), Nodes: taken.Nodes})
	if err != nil {
		m.dropSnapshot(context.WithoutCancel(ctx), volume, name)
		return v, meta.VolumeSnapshot{}, 0, err
	}
	s, _ := res.Volume.Snapshot(name)
	return *res.Volume, s, taken.Held, nil
}

// convergeForSnapshot has the nodes of v's in-sync replicas (those that
// take snapshot name) reconcile v as of index (a revert or a growth not
// yet applied is), the secondaries first; if one does not answer or
// fails, the snapshot is deleted again and the error says which. An
// out-of-sync replica's node is not asked: its copy takes no snapshot,
// and a node that hangs (stopped, cut off) would hold every snapshot
// for the request's whole timeout.
func (m *Manager) convergeForSnapshot(ctx context.Context, v meta.Volume, name string, index uint64) error {
	sts, errs := map[string]Status{}, map[string]error{}
	nodes := v.InSync()
	if i := slices.Index(nodes, v.Node); i >= 0 {
		nodes = append(slices.Delete(slices.Clone(nodes), i, i+1), v.Node)
	}
	for _, node := range nodes {
		st, err := m.owners.Reconcile(ctx, node, v.Name, index)
		sts[node], errs[node] = st, err
	}
	for _, node := range v.InSync() {
		err := errs[node]
		if err != nil {
			err = fmt.Errorf("%w: snapshot %s@%s: node %s did not answer, so whether its copy is the registry's (a revert, a growth) is unknown: %v", ErrOwnerUnreachable, v.Name, name, node, err)
		} else if st := sts[node]; st.State == StateFailed {
			err = fmt.Errorf("%w: snapshot %s@%s: node %s: %s", ErrOwnerFailed, v.Name, name, node, st.Reason)
		}
		if err != nil {
			m.dropSnapshot(context.WithoutCancel(ctx), v.Name, name)
			return err
		}
	}
	return nil
}

// dropSnapshot deletes a snapshot whose taking failed: the registry
// moves it to deleting, the nodes delete what they took, the registry
// forgets it once none holds it. Best effort: the settle rounds finish
// what is left.
func (m *Manager) dropSnapshot(ctx context.Context, volume, name string) {
	res, err := m.reg.Apply(ctx, meta.DeleteSnapshot{Volume: volume, Name: name})
	if err != nil {
		m.logger().Warn("snapshot not deleted after a failure", "volume", volume, "snapshot", name, "err", err)
		return
	}
	m.purgeSnapshot(ctx, *res.Volume, name, res.Index)
}

// purgeSnapshot has every replica node of v reconcile it as of index
// (deleting their copy of v's deleting snapshot name) and forgets the
// snapshot once none holds it. It returns an error saying which node
// still does or did not answer.
func (m *Manager) purgeSnapshot(ctx context.Context, v meta.Volume, name string, index uint64) error {
	s, ok := v.Snapshot(name)
	if !ok {
		return nil
	}
	sts, errs := m.reconcileReplicas(ctx, v, index)
	for _, node := range replicaNodes(v) {
		if err := errs[node]; err != nil {
			return fmt.Errorf("%w: snapshot %s@%s is deleting, but node %s did not delete it yet: %v; it finishes when the node is reachable", ErrOwnerUnreachable, v.Name, name, node, err)
		}
		if st := sts[node]; slices.Contains(st.Snapshots, s.ID) {
			return fmt.Errorf("%w: delete snapshot %s@%s on node %s: %s", ErrOwnerFailed, v.Name, name, node, st.Reason)
		}
	}
	_, err := m.reg.Apply(ctx, meta.PurgeSnapshot{Volume: v.Name, Name: name})
	return err
}

// DeleteSnapshot deletes volume's snapshot name: refused while it has
// clones (meta.ErrHasClones naming them); its clusters merge into its
// one child on every node holding it, then the registry forgets it. A
// snapshot left deleting by an earlier failure is finished.
func (m *Manager) DeleteSnapshot(ctx context.Context, volume, name string) error {
	defer m.lock(volume)()
	v, err := m.reg.Volume(ctx, volume)
	if err != nil {
		return err
	}
	s, ok := v.Snapshot(name)
	if !ok {
		return fmt.Errorf("meta: snapshot %s@%s: %w", volume, name, meta.ErrUnknownSnapshot)
	}
	index := uint64(0)
	if s.State != meta.SnapshotDeleting {
		res, err := m.reg.Apply(ctx, meta.DeleteSnapshot{Volume: volume, Name: name})
		if err != nil {
			return err
		}
		v, index = *res.Volume, res.Index
	}
	return m.purgeSnapshot(ctx, v, name, index)
}

// Clone makes volume name, a clone of volume's snapshot snap, on the
// nodes holding the snapshot, and puts it online, as Create does.
func (m *Manager) Clone(ctx context.Context, volume, snap, name, nqn string) (meta.Volume, error) {
	if err := m.requireFeature(ctx, meta.FeatureSnapshots); err != nil {
		return meta.Volume{}, err
	}
	src, err := m.reg.Volume(ctx, volume)
	if err != nil {
		return meta.Volume{}, err
	}
	cmd := meta.CloneVolume{Name: name, Volume: volume, Snapshot: snap, NQN: nqn, At: m.Now().UnixNano()}
	if err := cmd.Check(); err != nil {
		return meta.Volume{}, err
	}
	if s, ok := src.Snapshot(snap); ok && len(s.Nodes) > 1 {
		rs, err := NewReplicaSecret()
		if err != nil {
			return meta.Volume{}, err
		}
		cmd.ReplicaSecret = &rs
	}
	defer m.lock(name)()
	m.placeMu.Lock()
	res, err := m.reg.Apply(ctx, cmd)
	m.placeMu.Unlock()
	if err != nil {
		return meta.Volume{}, err
	}
	return m.finishCreate(ctx, *res.Volume, res.Index, "clone")
}

// Flatten asks for clone name to be detached from its snapshot: every
// replica copies what it still shares, in the background; the settle
// rounds mark it done. The answer is the volume with the flatten set.
func (m *Manager) Flatten(ctx context.Context, name string) (meta.Volume, error) {
	defer m.lock(name)()
	res, err := m.reg.Apply(ctx, meta.FlattenVolume{Name: name, At: m.Now().UnixNano()})
	if err != nil {
		return meta.Volume{}, err
	}
	v := *res.Volume
	sts, errs := m.reconcileReplicas(ctx, v, res.Index)
	for _, node := range replicaNodes(v) {
		if err := errs[node]; err != nil {
			return v, fmt.Errorf("%w: volume %q: the flatten is registered, but node %s did not start it yet: %v; it does when it is reachable", ErrOwnerUnreachable, v.Name, node, err)
		}
	}
	return m.flattenDone(ctx, v, sts)
}

// flattenDone records the end of v's flatten when every replica's copy
// is flat.
func (m *Manager) flattenDone(ctx context.Context, v meta.Volume, sts map[string]Status) (meta.Volume, error) {
	if v.Flatten == nil {
		return v, nil
	}
	for _, node := range replicaNodes(v) {
		st, ok := sts[node]
		if !ok || st.Flatten == nil || !st.Flatten.Finished {
			return v, nil
		}
	}
	res, err := m.reg.Apply(ctx, meta.FlattenDone{Name: v.Name})
	if err != nil {
		return v, err
	}
	m.logger().Info("flatten done", "volume", v.Name)
	return *res.Volume, nil
}

// Revert makes volume name read as its snapshot snap again. Refused
// while a host has a live controller on it (the owner is asked, as for
// Delete) or is attached (the registry refuses): a host's cache would
// disagree with the volume under it.
func (m *Manager) Revert(ctx context.Context, name, snap string) (meta.Volume, error) {
	if err := m.requireFeature(ctx, meta.FeatureSnapshots); err != nil {
		return meta.Volume{}, err
	}
	defer m.lock(name)()
	v, err := m.reg.Volume(ctx, name)
	if err != nil {
		return v, err
	}
	for _, node := range replicaNodes(v) {
		st, err := m.owners.Reconcile(ctx, node, name, 0)
		switch {
		case err != nil:
			return v, fmt.Errorf("%w: volume %q: node %s did not answer, so whether hosts are connected to it is unknown: %v", ErrOwnerUnreachable, name, node, err)
		case len(st.Connected) > 0:
			return v, fmt.Errorf("meta: volume %q: hosts connected to it through node %s now: %v: disconnect them first: %w", name, node, st.Connected, meta.ErrHasConnections)
		}
	}
	res, err := m.reg.Apply(ctx, meta.RevertVolume{Name: name, Snapshot: snap, Epoch: v.CurrentEpoch()})
	if err != nil {
		return v, err
	}
	v = *res.Volume
	sts, errs := m.reconcileReplicas(ctx, v, res.Index)
	for _, node := range replicaNodes(v) {
		if err := errs[node]; err != nil {
			return v, fmt.Errorf("%w: volume %q: the revert is registered, but node %s did not apply it yet: %v; it does when it is reachable", ErrOwnerUnreachable, v.Name, node, err)
		}
		if st := sts[node]; st.State == StateFailed {
			return v, fmt.Errorf("%w: revert volume %q on node %s: %s", ErrOwnerFailed, v.Name, node, st.Reason)
		}
	}
	return m.settle(ctx, v, sts[v.Node], true)
}

// settleSnapshots is the settle round's part for v's snapshots, given
// the statuses of the replicas that answered (all: complete): a
// snapshot being taken for over snapshotSettle (its primary or the
// leader died mid-way) is marked ready if every in-sync replica holds
// it, else deleted; a deleting one held by no node is forgotten; a
// flatten every replica finished is recorded.
func (m *Manager) settleSnapshots(ctx context.Context, v meta.Volume, sts map[string]Status, complete bool) {
	now := m.Now()
	for _, s := range v.Snapshots {
		switch s.State {
		case meta.SnapshotCreating:
			if now.Sub(time.Unix(0, s.CreatedAt)) < snapshotSettle {
				continue
			}
			// The in-sync replicas decide (a node down since is out of
			// sync after its failover): each must have answered.
			answered := true
			for _, node := range v.InSync() {
				_, ok := sts[node]
				answered = answered && ok
			}
			if !answered {
				continue
			}
			var took []string
			for _, node := range s.Nodes {
				if slices.Contains(sts[node].Snapshots, s.ID) {
					took = append(took, node)
				}
			}
			all := true
			for _, node := range v.InSync() {
				all = all && slices.Contains(took, node)
			}
			var c meta.Command = meta.DeleteSnapshot{Volume: v.Name, Name: s.Name}
			if all && slices.Contains(took, v.Node) {
				c = meta.SnapshotDone{Volume: v.Name, Name: s.Name, Epoch: v.CurrentEpoch(), Nodes: took}
			}
			if _, err := m.reg.Apply(ctx, c); err != nil {
				m.logger().Warn("snapshot left creating not settled", "volume", v.Name, "snapshot", s.Name, "err", err)
			}
		case meta.SnapshotDeleting:
			if !complete {
				continue // a node that did not answer may still hold it
			}
			held := false
			for _, st := range sts {
				held = held || slices.Contains(st.Snapshots, s.ID)
			}
			if !held {
				_, _ = m.reg.Apply(ctx, meta.PurgeSnapshot{Volume: v.Name, Name: s.Name})
			}
		}
	}
	if v.Flatten != nil && complete {
		_, _ = m.flattenDone(ctx, v, sts)
	}
}

// snapshotSettle is how long a snapshot may stay being taken before the
// settle rounds decide it: far over a barrier's time (milliseconds) and
// its request's timeout.
const snapshotSettle = 30 * time.Second
