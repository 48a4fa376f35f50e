package blkd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/control"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/store"
)

// Snapshots and clones (docs/snapshots.md §3, §4.1): the API routes, the
// store's side of the reconcile (storeParts), and the primary's taking
// of a snapshot at one point of the volume's write stream.

// snapshotTimeout bounds the taking of a snapshot on the primary: the
// barrier's drain, every copy's flush and synced commit.
const snapshotTimeout = 10 * time.Second

// ---- the store (control.SnapshotStore) ----

func (p storeParts) Snapshot(vol, snap uint64) error {
	return p.s.Snapshot(store.ID(vol), store.ID(snap))
}

func (p storeParts) Clone(snap, clone uint64) error {
	return p.s.Clone(store.ID(snap), store.ID(clone))
}

func (p storeParts) Revert(vol, snap, token uint64) error {
	return p.s.Revert(store.ID(vol), store.ID(snap), token)
}

func (p storeParts) Flatten(ctx context.Context, vol uint64, progress func(done, total uint64)) error {
	v, err := p.s.Volume(store.ID(vol))
	if err != nil {
		return err
	}
	// The store counts clusters; the API shows bytes.
	cb := p.s.Stats().ClusterBytes
	if p.limit == nil {
		return v.Flatten(ctx, func(done, total uint64) { progress(done*cb, total*cb) })
	}
	// Throttled in the progress callback, which the store calls after
	// each batch of at most 32 copies and outside the volume's lock: the
	// batch's bytes are drawn from the limiter, and the wait holds back
	// the next batch (the store has no hook of its own, and needs none).
	// A ctx that ends during the wait cuts it short, and Flatten stops
	// at its next check of ctx.
	var drawn uint64
	return v.Flatten(ctx, func(done, total uint64) {
		progress(done*cb, total*cb)
		if done > drawn {
			_ = p.limit.Wait(ctx, (done-drawn)*cb)
			drawn = done
		}
	})
}

func (p storeParts) Parent(id uint64) (uint64, error) {
	v, err := p.s.Volume(store.ID(id))
	if err != nil {
		return 0, err
	}
	info, err := v.Info()
	return uint64(info.Parent), err
}

func (p storeParts) Has(id uint64) (bool, error) {
	_, err := p.s.Volume(store.ID(id))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// ---- taking a snapshot ----

// snapshotRequest is the body of POST /v1/internal/snapshot (the leader
// asks a volume's primary to take a snapshot the registry holds as
// being taken) and of POST /v1/internal/snapshot-copy (the primary asks
// a replica's node to snapshot its copy, inside the barrier).
type snapshotRequest struct {
	Volume   string `json:"volume"`
	Snapshot string `json:"snapshot"`
	Index    uint64 `json:"index"`
	Epoch    uint64 `json:"epoch,omitempty"`
}

// snapshotRefused is the primary's refusal or failure to take a
// snapshot (as opposed to no answer): the manager deletes the snapshot.
type snapshotRefused struct{ err error }

func (e *snapshotRefused) Error() string { return e.err.Error() }
func (e *snapshotRefused) Unwrap() error { return e.err }
func (e *snapshotRefused) Refused() bool { return true }

// TakeSnapshot implements control.Snapshotter.
func (p ownerParts) TakeSnapshot(ctx context.Context, node, volume, snap string, index uint64) (control.Taken, error) {
	ctx, cancel := context.WithTimeout(ctx, snapshotTimeout+ownerCatchUp)
	defer cancel()
	if node == p.d.cfg.NodeID {
		t, err := p.d.takeSnapshot(ctx, volume, snap, index)
		if err != nil {
			return t, &snapshotRefused{err}
		}
		return t, nil
	}
	api := p.d.apiOf(node)
	if api == "" {
		return control.Taken{}, fmt.Errorf("the registry knows no API address for node %s", node)
	}
	var t control.Taken
	err := p.d.postPeer(ctx, api, "/v1/internal/snapshot", snapshotRequest{Volume: volume, Snapshot: snap, Index: index}, &t)
	var pa *peerAnswer
	if errors.As(err, &pa) && pa.status != http.StatusServiceUnavailable {
		return t, &snapshotRefused{fmt.Errorf("node %s: %w", node, err)}
	}
	return t, err
}

// apiOf is node's API address from the local registry copy ("": none).
func (d *Daemon) apiOf(node string) string {
	var addr string
	d.node.FSM().Read(func(s *meta.State) {
		if n, ok := s.Node(node); ok {
			addr = n.MgmtAddr
		}
	})
	return addr
}

// snapshotOf waits for the local registry copy to reach index and
// returns volume and its snapshot snap, which must be being taken.
func (d *Daemon) snapshotOf(ctx context.Context, volume, snap string, index uint64) (meta.Volume, meta.VolumeSnapshot, error) {
	v, ok, err := d.volumeAt(ctx, volume, index)
	if err != nil {
		return v, meta.VolumeSnapshot{}, err
	}
	if !ok {
		return v, meta.VolumeSnapshot{}, metaError(fmt.Errorf("meta: volume %q: %w", volume, meta.ErrUnknownVolume), "")
	}
	s, ok := v.Snapshot(snap)
	switch {
	case !ok:
		return v, s, metaError(fmt.Errorf("meta: snapshot %s@%s: %w", volume, snap, meta.ErrUnknownSnapshot), "")
	case s.State != meta.SnapshotCreating:
		return v, s, &apiError{http.StatusConflict, fmt.Sprintf("snapshot %s@%s is %v, not being taken", volume, snap, s.State)}
	}
	return v, s, nil
}

// takeSnapshot takes volume's snapshot snap on this node, its primary:
// for a volume of one copy, the store's snapshot (which waits for the
// I/O in flight at the store and flushes); for a replicated one, inside
// the term's barrier (writes held and drained on every leg), on this
// store and on every in-sync replica's node.
func (d *Daemon) takeSnapshot(ctx context.Context, volume, snap string, index uint64) (control.Taken, error) {
	v, s, err := d.snapshotOf(ctx, volume, snap, index)
	if err != nil {
		return control.Taken{}, err
	}
	if v.Node != d.cfg.NodeID {
		return control.Taken{}, &apiError{http.StatusConflict, fmt.Sprintf("volume %q: node %s is not its primary (node %s is)", volume, d.cfg.NodeID, v.Node)}
	}
	ctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	if len(v.ReplicaSet()) == 1 {
		start := time.Now()
		if err := d.store.Snapshot(store.ID(v.ID), store.ID(s.ID)); err != nil {
			return control.Taken{}, fmt.Errorf("snapshot %s@%s on node %s: %w", volume, snap, d.cfg.NodeID, err)
		}
		return control.Taken{Nodes: []string{d.cfg.NodeID}, Held: time.Since(start)}, nil
	}
	_, pl := d.termAt(v)
	if pl == nil {
		return control.Taken{}, &apiError{http.StatusConflict, fmt.Sprintf("volume %q: node %s does not serve it as its primary at epoch %d now", volume, d.cfg.NodeID, v.CurrentEpoch())}
	}
	var took []string
	held, err := pl.b.Barrier(ctx, func(inSync []string) ([]string, error) {
		// Every copy at once: the writes are held meanwhile.
		type answer struct {
			node string
			err  error
		}
		answers := make(chan answer, len(inSync)+1)
		if d.cfg.SnapshotHoldAt == HoldLocal {
			answers <- answer{d.cfg.NodeID, d.store.Snapshot(store.ID(v.ID), store.ID(s.ID))}
			d.holdSnapshot(ctx, volume, snap, []string{d.cfg.NodeID})
		} else {
			go func() {
				answers <- answer{d.cfg.NodeID, d.store.Snapshot(store.ID(v.ID), store.ID(s.ID))}
			}()
		}
		n := 1
		for _, node := range inSync {
			if node == d.cfg.NodeID {
				continue
			}
			n++
			go func() {
				api := d.apiOf(node)
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				err := errors.New("no API address")
				if api != "" {
					err = d.postPeer(cctx, api, "/v1/internal/snapshot-copy", snapshotRequest{Volume: volume, Snapshot: snap, Index: index, Epoch: v.CurrentEpoch()}, nil)
				}
				answers <- answer{node, err}
			}()
		}
		for range n {
			a := <-answers
			if a.node == d.cfg.NodeID && a.err != nil {
				return nil, fmt.Errorf("snapshot of the primary's copy: %w", a.err)
			}
			if a.err != nil {
				d.log.Warn("a replica did not take a snapshot: it leaves the in-sync set", "volume", volume, "snapshot", snap, "node", a.node, "err", a.err)
				continue
			}
			if a.node != d.cfg.NodeID {
				took = append(took, a.node) // the barrier's peers: the primary is none
			}
		}
		if d.cfg.SnapshotHoldAt != HoldLocal {
			d.holdSnapshot(ctx, volume, snap, append([]string{d.cfg.NodeID}, took...))
		}
		return took, nil
	})
	if err != nil {
		return control.Taken{}, fmt.Errorf("snapshot %s@%s: %w", volume, snap, err)
	}
	nodes := append([]string{d.cfg.NodeID}, took...)
	slices.Sort(nodes)
	return control.Taken{Nodes: nodes, Held: held}, nil
}

// holdSnapshot keeps a snapshot's barrier for Config.SnapshotHold (a
// test's: 0 returns at once), took the copies taken so far, logging
// first that it does.
func (d *Daemon) holdSnapshot(ctx context.Context, volume, snap string, took []string) {
	hold := time.Duration(d.cfg.SnapshotHold)
	if hold <= 0 {
		return
	}
	d.log.Warn("snapshot barrier held for a test", "volume", volume, "snapshot", snap, "took", took, "hold", hold)
	select {
	case <-ctx.Done():
	case <-time.After(hold):
	}
}

// internalSnapshot serves POST /v1/internal/snapshot: the leader asks
// this node, the volume's primary, to take a snapshot the registry holds
// as being taken.
func (d *Daemon) internalSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req snapshotRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	t, err := d.takeSnapshot(r.Context(), req.Volume, req.Snapshot, req.Index)
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return err
		}
		return &apiError{http.StatusInternalServerError, err.Error()}
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}

// internalSnapshotCopy serves POST /v1/internal/snapshot-copy: a
// volume's primary, inside its barrier, has this node snapshot its
// secondary copy. Only for the primary of the epoch the registry has,
// and for a snapshot being taken: the route cannot make a node do what
// the registry does not hold.
func (d *Daemon) internalSnapshotCopy(w http.ResponseWriter, r *http.Request) error {
	var req snapshotRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	v, s, err := d.snapshotOf(r.Context(), req.Volume, req.Snapshot, req.Index)
	if err != nil {
		return err
	}
	if req.Epoch != v.CurrentEpoch() {
		return metaError(fmt.Errorf("meta: volume %q at epoch %d, not %d: %w", v.Name, v.CurrentEpoch(), req.Epoch, meta.ErrStaleEpoch), "")
	}
	if rep, ok := v.Replica(d.cfg.NodeID); !ok || v.Node == d.cfg.NodeID || rep.State != meta.ReplicaInSync {
		return &apiError{http.StatusConflict, fmt.Sprintf("volume %q: node %s holds no in-sync secondary replica of it", v.Name, d.cfg.NodeID)}
	}
	if err := d.store.Snapshot(store.ID(v.ID), store.ID(s.ID)); err != nil {
		return &apiError{http.StatusInternalServerError, fmt.Sprintf("snapshot %s@%s on node %s: %v", v.Name, s.Name, d.cfg.NodeID, err)}
	}
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}

// ---- space ----

// spaceAnswer is GET /v1/internal/space: the byte counts of store
// objects, by ID.
type spaceAnswer struct {
	Objects map[string]objectSpace `json:"objects"`
}

type objectSpace struct {
	Owned     uint64 `json:"owned"`
	Shared    uint64 `json:"shared"`
	Exclusive uint64 `json:"exclusive"`
}

// localSpace counts the space of this store's objects ids (those it
// lacks are left out).
func (d *Daemon) localSpace(ids []uint64) map[string]objectSpace {
	out := make(map[string]objectSpace, len(ids))
	for _, id := range ids {
		sp, err := d.store.SpaceOf(store.ID(id))
		if err != nil {
			continue
		}
		out[strconv.FormatUint(id, 10)] = objectSpace{Owned: sp.OwnedBytes, Shared: sp.SharedBytes, Exclusive: sp.ExclusiveBytes}
	}
	return out
}

// internalSpace serves GET /v1/internal/space?ids=1,2,3.
func (d *Daemon) internalSpace(w http.ResponseWriter, r *http.Request) error {
	ids, err := parseIDs(r.URL.Query().Get("ids"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, spaceAnswer{Objects: d.localSpace(ids)})
	return nil
}

func parseIDs(s string) ([]uint64, error) {
	var ids []uint64
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		id, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, badRequest("ids=%q: give store object IDs separated by commas", s)
		}
		ids = append(ids, id)
	}
	if len(ids) > meta.MaxSnapshots+1 {
		return nil, badRequest("ids: at most %d", meta.MaxSnapshots+1)
	}
	return ids, nil
}

// space asks v's primary for the space of ids (nil if it does not
// answer within a second: the listing goes on without the figures).
func (d *Daemon) space(ctx context.Context, v meta.Volume, ids []uint64) map[string]objectSpace {
	if v.Node == d.cfg.NodeID {
		return d.localSpace(ids)
	}
	api := d.apiOf(v.Node)
	if api == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	q := make([]string, len(ids))
	for i, id := range ids {
		q[i] = strconv.FormatUint(id, 10)
	}
	var a spaceAnswer
	if err := d.getPeer(ctx, api, "/v1/internal/space?ids="+strings.Join(q, ","), &a); err != nil {
		return nil
	}
	return a.Objects
}

// ---- the API ----

// snapshotView is s, a snapshot of v, as the API shows it; st is the
// registry (for its clones).
func snapshotView(st *meta.State, v meta.Volume, s meta.VolumeSnapshot) api.Snapshot {
	return api.Snapshot{
		Name: s.Name, Volume: v.Name, ID: s.ID, SizeBytes: s.SizeBytes, CreatedAt: s.CreatedAt,
		State: s.State.String(), Nodes: s.Nodes, Clones: st.Clones(v.Name, s.ID), Origin: s.Origin,
	}
}

func withSpace(a *api.Snapshot, sp map[string]objectSpace) {
	if o, ok := sp[strconv.FormatUint(a.ID, 10)]; ok {
		a.OwnedBytes, a.ExclusiveBytes = &o.Owned, &o.Exclusive
	}
}

// snapshotPath is the {name} (as volumeName takes it) and {snap} (in
// the name grammar) of r's path.
func (d *Daemon) snapshotPath(r *http.Request) (volume, snap string, err error) {
	if volume, err = d.volumeName(r); err != nil {
		return "", "", err
	}
	snap = r.PathValue("snap")
	if err := api.CheckName("snapshot name", snap); err != nil {
		return "", "", badRequest("%v", err)
	}
	return volume, snap, nil
}

func (d *Daemon) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	var req api.SnapshotRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	switch {
	case req.Name == "":
		return badRequest(`missing "name": name the snapshot, e.g. {"name": "nightly"}`)
	case api.CheckName("snapshot name", req.Name) != nil:
		return badRequest("%v", api.CheckName("snapshot name", req.Name))
	}
	if err := (meta.CreateSnapshot{Name: req.Name, Origin: req.Origin}).Check(); err != nil {
		return badRequest("%v", err)
	}
	v, s, held, err := d.mgr.SnapshotOrigin(r.Context(), name, req.Name, req.Origin)
	if err != nil {
		return metaError(err, "")
	}
	var a api.Snapshot
	d.node.FSM().Read(func(st *meta.State) { a = snapshotView(st, v, s) })
	a.HeldNanos = held.Nanoseconds()
	writeJSON(w, http.StatusCreated, a)
	return nil
}

// readVolumeAny reads a volume linearizably on the leader, from the
// local copy elsewhere.
func (d *Daemon) readVolumeAny(ctx context.Context, name string) (meta.Volume, error) {
	if d.node.IsLeader() {
		return d.readVolume(ctx, name)
	}
	var v meta.Volume
	var ok bool
	d.node.FSM().Read(func(s *meta.State) { v, ok = s.Volume(name) })
	if !ok {
		return v, metaError(fmt.Errorf("meta: volume %q: %w", name, meta.ErrUnknownVolume), "")
	}
	return v, nil
}

func (d *Daemon) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	v, err := d.readVolumeAny(r.Context(), name)
	if err != nil {
		return err
	}
	out := api.SnapshotList{Snapshots: []api.Snapshot{}}
	var ids []uint64
	d.node.FSM().Read(func(st *meta.State) {
		for _, s := range v.Snapshots {
			out.Snapshots = append(out.Snapshots, snapshotView(st, v, s))
			ids = append(ids, s.ID)
		}
	})
	if len(ids) > 0 {
		sp := d.space(r.Context(), v, ids)
		for i := range out.Snapshots {
			withSpace(&out.Snapshots[i], sp)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (d *Daemon) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	name, snap, err := d.snapshotPath(r)
	if err != nil {
		return err
	}
	v, err := d.readVolumeAny(r.Context(), name)
	if err != nil {
		return err
	}
	s, ok := v.Snapshot(snap)
	if !ok {
		return metaError(fmt.Errorf("meta: snapshot %s@%s: %w", name, snap, meta.ErrUnknownSnapshot), "")
	}
	var a api.Snapshot
	d.node.FSM().Read(func(st *meta.State) { a = snapshotView(st, v, s) })
	withSpace(&a, d.space(r.Context(), v, []uint64{s.ID}))
	writeJSON(w, http.StatusOK, a)
	return nil
}

func (d *Daemon) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	name, snap, err := d.snapshotPath(r)
	if err != nil {
		return err
	}
	if err := d.mgr.DeleteSnapshot(r.Context(), name, snap); err != nil {
		return metaError(err, "")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (d *Daemon) cloneSnapshot(w http.ResponseWriter, r *http.Request) error {
	name, snap, err := d.snapshotPath(r)
	if err != nil {
		return err
	}
	var req api.CloneRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	switch {
	case req.Name == "":
		return badRequest(`missing "name": name the new volume, e.g. {"name": "clone1"}`)
	case api.CheckName("volume name", req.Name) != nil:
		return badRequest("%v", api.CheckName("volume name", req.Name))
	case req.NQN != "" && checkNQN(req.NQN) != nil:
		return badRequest("nqn %q: %v", req.NQN, checkNQN(req.NQN))
	}
	v, err := d.mgr.Clone(r.Context(), name, snap, req.Name, req.NQN)
	if err != nil {
		return metaError(err, "")
	}
	writeJSON(w, http.StatusCreated, d.view(v))
	return nil
}

func (d *Daemon) flattenVolume(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	v, err := d.mgr.Flatten(r.Context(), name)
	if err != nil {
		return metaError(err, "")
	}
	writeJSON(w, http.StatusAccepted, d.view(v))
	return nil
}

func (d *Daemon) revertVolume(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	var req api.RevertRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	switch {
	case req.Snapshot == "":
		return badRequest(`missing "snapshot": name the volume's snapshot to revert to, e.g. {"snapshot": "nightly"}`)
	case api.CheckName("snapshot name", req.Snapshot) != nil:
		return badRequest("%v", api.CheckName("snapshot name", req.Snapshot))
	}
	v, err := d.mgr.Revert(r.Context(), name, req.Snapshot)
	if errors.Is(err, meta.ErrHasConnections) {
		// Not metaError's hint: no force drops hosts under a revert.
		return &apiError{http.StatusConflict, strings.ReplaceAll(err.Error(), ": meta: ", ": ") + ": a revert needs no host connected (blkctl detach " + name + " --host-nqn NQN, and disconnect the host)"}
	}
	if err != nil {
		return metaError(err, "")
	}
	writeJSON(w, http.StatusOK, d.view(v))
	return nil
}

// snapshotFields fills a's snapshot fields from v: the names, a clone's
// origin, a flatten asked for (its progress is the primary's: view).
func snapshotFields(v meta.Volume, a *api.Volume) {
	for _, s := range v.Snapshots {
		a.Snapshots = append(a.Snapshots, s.Name)
	}
	if v.CloneOf != nil {
		a.CloneOf = v.CloneOf.String()
	}
	if v.Flatten != nil {
		a.Flatten = &api.FlattenProgress{Since: v.Flatten.Since}
	}
}
