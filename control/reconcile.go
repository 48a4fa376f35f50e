package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/store"
)

// Store is what the reconciler needs of the node's block store
// (package store's Store, adapted in cmd/blkd). Errors for an absent
// volume wrap store.ErrNotFound.
type Store interface {
	// Shape returns volume id's size and block size.
	Shape(id uint64) (size uint64, blockSize uint32, err error)
	// Create makes an empty volume.
	Create(id uint64, size uint64, blockSize uint32) error
	// Grow enlarges a volume to size bytes.
	Grow(id uint64, size uint64) error
	// Delete removes a volume and its data.
	Delete(id uint64) error
	// List returns the IDs of every volume in the store.
	List() ([]uint64, error)
	// Full says why the store refuses writes now ("" if it does not):
	// its volumes are then degraded.
	Full() string
}

// Target is what the reconciler needs of the NVMe-oF target: one
// subsystem per volume, keyed by the volume's NQN, with the volume as
// namespace 1.
type Target interface {
	// Serve adds v's subsystem with its hosts and namespace 1.
	Serve(v meta.Volume) error
	// Served says whether v is served by this node as its primary, as
	// v says (a subsystem with v's NQN; for a target that replicates,
	// serving at v's epoch).
	Served(v meta.Volume) bool
	// SetHosts makes the subsystem's host list exactly v's (AllowAny,
	// Hosts) and the secrets of the hosts that must authenticate exactly
	// v.Secrets.
	SetHosts(v meta.Volume) error
	// Revalidate tells connected hosts namespace 1 changed (its size).
	Revalidate(nqn string) error
	// Unserve removes the subsystem (no error if it is not there),
	// disconnecting its hosts.
	Unserve(nqn string) error
	// Connected returns the hosts with a live controller on the
	// subsystem (none if it is not served).
	Connected(nqn string) []string
}

// ReplicaTarget is an optional extension of Target, for a node that
// replicates: it serves the replica subsystem of each volume it holds a
// secondary replica of, through which the volume's primary writes the
// copy (docs/replication.md §3). A Target without it holds secondary
// copies without serving them.
type ReplicaTarget interface {
	// ServeReplica serves (or brings up to date: the primary and epoch it
	// admits) the replica subsystem of v, a volume this node holds a
	// secondary replica of.
	ServeReplica(v meta.Volume) error
	// UnserveReplica removes volume id's replica subsystem (no error if
	// it is not there).
	UnserveReplica(id uint64) error
	// Demote stops serving v's host subsystem as its primary: a host's
	// I/O there is refused (no error if it was not primary). A target
	// that exports every replica's path keeps the subsystem as a path
	// that does not serve (ANA inaccessible: the host keeps its
	// connection for the day this node is primary again); one that does
	// not removes it, as Unserve.
	Demote(v meta.Volume) error
}

// Status is a volume's local state on its owner, as the last reconcile
// left it.
type Status struct {
	Name   string `json:"name"`
	ID     uint64 `json:"id"`
	NQN    string `json:"nqn"`
	State  State  `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Connected are the hosts with a live NVMe controller on the volume's
	// subsystem when the reconcile ended: attached or not, they use it.
	Connected []string `json:"connected,omitempty"`
	// Snapshots are the store IDs of the volume's registry snapshots
	// this node's store holds (snapshots.go).
	Snapshots []uint64 `json:"snapshots,omitempty"`
	// Flatten is a flatten's progress on this node, while the registry
	// asks for one.
	Flatten *FlattenStatus `json:"flatten,omitempty"`
}

// Reconciler brings one node's store and target to what the registry
// says about the volumes the node owns. Every path that changes a volume
// on its node — the API (through Manager), the restart, the leader's call
// to an owner — ends in Reconcile. It is idempotent: calling it again
// with the same registry entry changes nothing.
//
// It never talks to the network or the registry; local steps are short,
// so one mutex serializes them.
type Reconciler struct {
	node  string
	store Store
	tgt   Target
	log   *slog.Logger

	// OnFlattenDone, if set, is called (on the flatten's goroutine) when
	// a flatten finished on this node, so that the registry can record it
	// without waiting for the next settle round.
	OnFlattenDone func(volume string)

	mu       sync.Mutex
	vols     map[uint64]*Status     // by volume ID
	flattens map[uint64]*flattenRun // by volume ID (snapshots.go)
}

// NewReconciler returns a reconciler for node's store and target. log
// receives one "volume state" record per change of a volume's local
// state (and one per anomaly found while reconciling): the node's record
// of what happened to its volumes, so it should be a log that keeps every
// record — blkd passes its audit log, never rate-limited. No record here
// is written unless something changed, so a peer cannot flood it.
func NewReconciler(node string, store Store, tgt Target, log *slog.Logger) *Reconciler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reconciler{node: node, store: store, tgt: tgt, log: log, vols: make(map[uint64]*Status), flattens: make(map[uint64]*flattenRun)}
}

// Node is the ID of the node the reconciler serves.
func (r *Reconciler) Node() string { return r.node }

// Statuses returns every volume's local status, by name.
func (r *Reconciler) Statuses() []Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Status, 0, len(r.vols))
	for _, s := range r.vols {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b Status) int { return int(a.ID) - int(b.ID) })
	return out
}

// Status returns the local status of the volume called name.
func (r *Reconciler) Status(name string) (Status, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.vols {
		if s.Name == name {
			return *s, true
		}
	}
	return Status{}, false
}

// transition moves st to state to, with reason for StateFailed. It is the
// one place a volume's local state changes, and logs every change.
func (r *Reconciler) transition(st *Status, to State, reason string) {
	from := st.State
	if from == to && st.Reason == reason {
		return
	}
	if !validTransition(from, to) {
		// A bug in Reconcile, not an input: say so loudly and go on,
		// since the new state is what the store and target now are.
		r.log.Error("volume state: invalid transition", "volume", st.Name, "id", st.ID, "from", from.String(), "to", to.String())
	}
	st.State, st.Reason = to, reason
	attrs := []any{"volume", st.Name, "id", st.ID, "from", stateName(from), "to", to.String()}
	if reason != "" {
		attrs = append(attrs, "reason", reason)
	}
	level := slog.LevelInfo
	if to == StateFailed {
		level = slog.LevelError
	}
	r.log.Log(context.Background(), level, "volume state", attrs...)
}

func stateName(s State) string {
	if s == 0 {
		return "unknown"
	}
	return s.String()
}

// Reconcile makes this node's store and target match v, the registry's
// entry for a volume this node holds a replica of, and returns the
// volume's local status. A volume that cannot be served is StateFailed
// with the reason; nothing else on the node is affected. On a secondary
// replica's node it is reconcileSecondary (the copy kept at the
// registry's shape, StateStandby); what follows is the primary's.
//
// What it does, by the registry's state:
//
//   - deleting: the subsystem is removed, then the store volume; the
//     status is StateDeleted (the registry may purge the volume).
//   - creating: the store volume is created if absent; then as online.
//   - online, failed: the store volume must exist with the registry's
//     block size and at most its size (it is grown to it); the subsystem
//     is served with exactly the registry's hosts.
//   - offline: as online, but the subsystem is removed.
//
// An online volume missing from the store is failed, never recreated
// empty: that would answer reads of acknowledged data with zeros.
func (r *Reconciler) Reconcile(v meta.Volume) Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.vols[v.ID]
	if st == nil {
		st = &Status{Name: v.Name, ID: v.ID, NQN: v.NQN}
		r.vols[v.ID] = st
	}
	rep, holds := v.Replica(r.node)
	if !holds {
		// Serve nothing of it (a replica removed from here); its data
		// stays for an operator.
		_ = r.tgt.Unserve(v.NQN)
		_ = r.unserveReplica(v.ID)
		r.transition(st, StateFailed, fmt.Sprintf("node %s holds no replica of it; its primary is node %s", r.node, v.Node))
		return *st
	}
	st.Snapshots, st.Flatten = nil, nil
	reconcile := r.reconcile
	if v.Node != r.node {
		reconcile = func(st *Status, v meta.Volume) error { return r.reconcileSecondary(st, v, rep) }
	}
	if err := reconcile(st, v); err != nil {
		r.transition(st, StateFailed, err.Error())
	}
	out := *st
	out.Connected = nil
	if st.State == StateOnline || st.State == StateDegraded {
		out.Connected = r.tgt.Connected(v.NQN)
	}
	if st.State == StateDeleted {
		delete(r.vols, v.ID)
	}
	return out
}

func (r *Reconciler) reconcile(st *Status, v meta.Volume) error {
	if v.State == meta.VolumeDeleting {
		return r.delete(st, v)
	}
	// The primary takes no replica connections (it was a secondary
	// before a change of primary, or a restart found one).
	if err := r.unserveReplica(v.ID); err != nil {
		return err
	}
	// A revert changes the volume's size: before the shape is read.
	if err := r.reconcileSnapshots(st, v); err != nil {
		_ = r.tgt.Unserve(v.NQN)
		return err
	}
	size, bs, err := r.store.Shape(v.ID)
	switch {
	case errors.Is(err, store.ErrNotFound) && v.State == meta.VolumeCreating:
		r.transition(st, StateCreating, "")
		if v.CloneOf != nil {
			if err := r.createClone(v); err != nil {
				return err
			}
		} else if err := r.store.Create(v.ID, v.SizeBytes, v.BlockSize); err != nil {
			return fmt.Errorf("create store volume %d: %w", v.ID, err)
		}
		size, bs = v.SizeBytes, v.BlockSize
	case errors.Is(err, store.ErrNotFound):
		// Serving nothing under this NQN is the only safe thing.
		_ = r.tgt.Unserve(v.NQN)
		return fmt.Errorf("the store has no volume %d: its data is missing from this node's data directory", v.ID)
	case err != nil:
		return fmt.Errorf("store volume %d: %w", v.ID, err)
	}
	if bs != v.BlockSize {
		_ = r.tgt.Unserve(v.NQN)
		return fmt.Errorf("store volume %d has %d-byte blocks, the registry says %d", v.ID, bs, v.BlockSize)
	}
	grown := false
	switch {
	case size < v.SizeBytes:
		if err := r.store.Grow(v.ID, v.SizeBytes); err != nil {
			return fmt.Errorf("grow store volume %d from %d to the registry's %d bytes: %w", v.ID, size, v.SizeBytes, err)
		}
		grown = true
	case size > v.SizeBytes:
		// The registry never shrinks a volume: it lost a resize (restored
		// from an older snapshot?). Serve nothing rather than guess.
		_ = r.tgt.Unserve(v.NQN)
		return fmt.Errorf("store volume %d is %d bytes, larger than the registry's %d: the registry lost a resize; resize the volume to at least %d bytes", v.ID, size, v.SizeBytes, size)
	}
	if v.State == meta.VolumeOffline {
		if err := r.tgt.Unserve(v.NQN); err != nil {
			return fmt.Errorf("remove subsystem %s: %w", v.NQN, err)
		}
		r.transition(st, StateOffline, "")
		return nil
	}
	if !r.tgt.Served(v) {
		if err := r.tgt.Serve(v); err != nil {
			return fmt.Errorf("serve subsystem %s: %w", v.NQN, err)
		}
	} else {
		if err := r.tgt.SetHosts(v); err != nil {
			return fmt.Errorf("subsystem %s hosts: %w", v.NQN, err)
		}
		if grown {
			if err := r.tgt.Revalidate(v.NQN); err != nil {
				return fmt.Errorf("subsystem %s: revalidate namespace 1: %w", v.NQN, err)
			}
		}
	}
	if why := r.store.Full(); why != "" {
		r.transition(st, StateDegraded, why)
		return nil
	}
	r.transition(st, StateOnline, "")
	return nil
}

// delete removes a deleting volume's subsystem and store volume.
func (r *Reconciler) delete(st *Status, v meta.Volume) error {
	if st.State != StateDeleted {
		r.transition(st, StateDeleting, "")
	}
	if err := r.tgt.Unserve(v.NQN); err != nil {
		return fmt.Errorf("remove subsystem %s: %w", v.NQN, err)
	}
	if err := r.unserveReplica(v.ID); err != nil {
		return err
	}
	r.stopFlatten(v.ID)
	if err := r.store.Delete(v.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("delete store volume %d: %w", v.ID, err)
	}
	if err := r.deleteSnapshots(v); err != nil {
		return err
	}
	r.transition(st, StateDeleted, "")
	return nil
}

// reconcileSecondary keeps a secondary replica's store volume at the
// registry's shape: created with the volume (or, empty, for a replica to
// be copied in full), grown with it, deleted with it. It serves nothing
// to hosts (a former primary stops): the primary does. A replica whose
// data should be here and is not is failed, never recreated empty, as on
// the primary: its state in the registry says it holds writes.
func (r *Reconciler) reconcileSecondary(st *Status, v meta.Volume, rep meta.Replica) error {
	if v.State == meta.VolumeDeleting {
		return r.delete(st, v)
	}
	rt, replicates := r.tgt.(ReplicaTarget)
	stop := r.tgt.Unserve
	if replicates {
		stop = func(string) error { return rt.Demote(v) }
	}
	if err := stop(v.NQN); err != nil {
		return fmt.Errorf("stop serving subsystem %s (node %s is a secondary now): %w", v.NQN, r.node, err)
	}
	if err := r.reconcileSnapshots(st, v); err != nil {
		return err
	}
	size, bs, err := r.store.Shape(v.ID)
	switch {
	case errors.Is(err, store.ErrNotFound) && v.State == meta.VolumeCreating && v.CloneOf != nil:
		r.transition(st, StateCreating, "")
		if err := r.createClone(v); err != nil {
			return err
		}
		size, bs = v.SizeBytes, v.BlockSize
	case errors.Is(err, store.ErrNotFound) && (v.State == meta.VolumeCreating || (rep.Full && rep.State != meta.ReplicaInSync)):
		r.transition(st, StateCreating, "")
		if err := r.store.Create(v.ID, v.SizeBytes, v.BlockSize); err != nil {
			return fmt.Errorf("create store volume %d (replica): %w", v.ID, err)
		}
		size, bs = v.SizeBytes, v.BlockSize
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("the store has no volume %d: this %s replica's data is missing from this node's data directory", v.ID, rep.State)
	case err != nil:
		return fmt.Errorf("store volume %d: %w", v.ID, err)
	}
	switch {
	case bs != v.BlockSize:
		return fmt.Errorf("store volume %d has %d-byte blocks, the registry says %d", v.ID, bs, v.BlockSize)
	case size < v.SizeBytes:
		if err := r.store.Grow(v.ID, v.SizeBytes); err != nil {
			return fmt.Errorf("grow store volume %d (replica) from %d to the registry's %d bytes: %w", v.ID, size, v.SizeBytes, err)
		}
	case size > v.SizeBytes:
		return fmt.Errorf("store volume %d is %d bytes, larger than the registry's %d: the registry lost a resize; resize the volume to at least %d bytes", v.ID, size, v.SizeBytes, size)
	}
	switch {
	case replicates && v.State != meta.VolumeOffline:
		if err := rt.ServeReplica(v); err != nil {
			return fmt.Errorf("serve replica of volume %d: %w", v.ID, err)
		}
	case replicates:
		// Offline: no path to hosts from any replica.
		if err := r.tgt.Unserve(v.NQN); err != nil {
			return fmt.Errorf("remove subsystem %s: %w", v.NQN, err)
		}
	}
	r.transition(st, StateStandby, "")
	return nil
}

// unserveReplica removes volume id's replica subsystem, if the target
// serves them.
func (r *Reconciler) unserveReplica(id uint64) error {
	if rt, ok := r.tgt.(ReplicaTarget); ok {
		if err := rt.UnserveReplica(id); err != nil {
			return fmt.Errorf("remove replica subsystem of volume %d: %w", id, err)
		}
	}
	return nil
}

// DropRemoved deletes this node's copy of v, a replica the registry no
// longer places here (the end of a replacement or a move: the replica
// that replaced it holds the data): its subsystems, then its store
// volume. Refused while the registry places a replica of v here, or for
// another volume ID.
func (r *Reconciler) DropRemoved(v meta.Volume, id uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, holds := v.Replica(r.node); holds || v.ID != id {
		return fmt.Errorf("%w: volume %q (ID %d): node %s holds a replica of it, or it is not volume %d", ErrInvalid, v.Name, v.ID, r.node, id)
	}
	if err := r.tgt.Unserve(v.NQN); err != nil {
		return fmt.Errorf("remove subsystem %s: %w", v.NQN, err)
	}
	if err := r.unserveReplica(v.ID); err != nil {
		return err
	}
	if err := r.store.Delete(v.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("delete store volume %d: %w", v.ID, err)
	}
	delete(r.vols, v.ID)
	r.log.Info("store volume of a removed replica deleted", "id", v.ID, "volume", v.Name)
	return nil
}

// Forget drops the local record of a volume the registry no longer has,
// removing its subsystem if it is still served. Its store data is kept:
// the registry purges a volume only after its owner deleted it, so data
// here means the registry lost track, and an operator decides.
func (r *Reconciler) Forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, s := range r.vols {
		if s.Name == name {
			_ = r.tgt.Unserve(s.NQN)
			_ = r.unserveReplica(id)
			delete(r.vols, id)
		}
	}
}

// ReconcileAll reconciles every volume of vols this node holds a replica
// of, primary or secondary (the restart path), and returns their
// statuses, plus a StateFailed status for each store volume the registry
// does not know or places elsewhere (an orphan, kept for an operator to
// look at). One volume's failure never stops the others.
func (r *Reconciler) ReconcileAll(vols []meta.Volume) []Status {
	var out []Status
	known := make(map[uint64]bool)
	elsewhere := make(map[uint64]string)
	for _, v := range vols {
		if _, ok := v.Replica(r.node); !ok {
			elsewhere[v.ID] = v.Name
			continue
		}
		known[v.ID] = true
		out = append(out, r.Reconcile(v))
	}
	ids, err := r.store.List()
	if err != nil {
		r.log.Error("volume store: list", "err", err)
		return out
	}
	for _, id := range ids {
		if name, ok := elsewhere[id]; ok && !known[id] {
			r.log.Warn("store volume of a volume this node holds no replica of: kept, not served", "id", id, "volume", name)
			out = append(out, Status{ID: id, Name: name, State: StateFailed, Reason: "in the store, but the registry places no replica of the volume on this node (a removed replica?): kept, not served"})
			continue
		}
		if !known[id] {
			r.log.Warn("store volume unknown to the registry: kept, not served", "id", id)
			out = append(out, Status{ID: id, State: StateFailed, Reason: "in the store but not in the registry (orphan): kept, not served"})
		}
	}
	return out
}
