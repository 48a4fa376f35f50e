package blkd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/repl"
	"github.com/blk-project/blk/store"
)

// Rebuilds carry snapshots (docs/snapshots.md §4.3). A replica R that
// was out of sync when some of the volume's snapshots were taken lacks
// them; before the live copy, the primary gives them to it, oldest
// first, so that afterwards R holds every ready snapshot of the
// volume's chain, listed in the registry (SnapshotNodes) and equal to
// the primary's copy byte for byte:
//
//  1. B, the newest snapshot of the primary's chain that R's store holds
//     and the registry lists R in. R's node reverts its live copy to its
//     own copy of B (Store.Revert, token 0). With no B, the first
//     snapshot to carry is copied whole (every run it reads written,
//     every other region deallocated), which makes R's live copy read
//     it whatever it held.
//  2. For each snapshot Si after B: the primary writes what Si reads
//     differently from S(i-1) (Store.Changes: runs written, zero runs
//     deallocated) to R's live copy over the rebuild's leg connection,
//     before the replica is a leg (no host write reaches it, both ends
//     immutable: no window, no quiesce), flushes, has R's node snapshot
//     its copy as Si (POST /v1/internal/rebuild-snapshot) and the
//     leader record R in Si's nodes (POST /v1/internal/snapshot-nodes).
//  3. R's live copy now reads the newest snapshot, the primary's live
//     volume's parent: the live copy copies what the primary's volume
//     owns on top of it (repl.RebuildConfig.MappedOwn), or, if a
//     snapshot came meanwhile, compares or copies everything.
//
// An interruption leaves R with the snapshots it got, listed or not; the
// next rebuild starts again at 1 (a snapshot R holds but the registry
// does not list is taken again: rebuild-snapshot replaces it).
//
// Only a chain of one size is carried: a snapshot taken before a resize
// (a larger volume after it) is not, as R's namespace has the size of
// its connection. Such a rebuild is as before: the live volume only.

// snapshotChain is GET /v1/internal/snapshots: the store's volume and
// its ancestors, the volume first, and which of the objects asked for
// (ids) the store holds, anywhere.
type snapshotChain struct {
	Chain []chainObject `json:"chain"`
	Held  []uint64      `json:"held"`
}

type chainObject struct {
	ID     uint64 `json:"id"`
	Parent uint64 `json:"parent,omitempty"`
}

// localChain is this store's answer for volume id and the objects ids.
func (d *Daemon) localChain(id uint64, ids []uint64) (snapshotChain, error) {
	a := snapshotChain{Chain: []chainObject{}, Held: []uint64{}}
	for o, n := id, 0; o != 0 && n <= meta.MaxSnapshots+1; n++ {
		v, err := d.store.Volume(store.ID(o))
		if errors.Is(err, store.ErrNotFound) && o == id {
			return a, &apiError{http.StatusNotFound, fmt.Sprintf("node %s holds no store object %d", d.cfg.NodeID, id)}
		}
		if err != nil {
			return a, err
		}
		info, err := v.Info()
		if err != nil {
			return a, err
		}
		a.Chain = append(a.Chain, chainObject{ID: o, Parent: uint64(info.Parent)})
		o = uint64(info.Parent)
	}
	for _, h := range ids {
		if _, err := d.store.Volume(store.ID(h)); err == nil {
			a.Held = append(a.Held, h)
		}
	}
	return a, nil
}

// internalSnapshots serves GET /v1/internal/snapshots?id=VOLID&ids=1,2.
func (d *Daemon) internalSnapshots(w http.ResponseWriter, r *http.Request) error {
	id, err := strconv.ParseUint(r.URL.Query().Get("id"), 10, 64)
	if err != nil || id == 0 {
		return badRequest("id=%q: give the volume's store object ID", r.URL.Query().Get("id"))
	}
	ids, err := parseIDs(r.URL.Query().Get("ids"))
	if err != nil {
		return err
	}
	a, err := d.localChain(id, ids)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a)
	return nil
}

// rebuildingReplica checks a rebuild's request to this node (revert,
// snapshot): the registry, once at req.Index, has this node a replica
// of the volume, out of sync or rebuilding, at req.Epoch, the caller
// (if its certificate names a node) the volume's primary, and req's
// snapshot a ready one. The route cannot make a node do to an in-sync
// copy what the registry does not hold.
func (d *Daemon) rebuildingReplica(r *http.Request, req snapshotRequest) (meta.Volume, meta.VolumeSnapshot, error) {
	if req.Volume == "" || req.Snapshot == "" || req.Epoch == 0 {
		return meta.Volume{}, meta.VolumeSnapshot{}, badRequest(`"volume", "snapshot" and "epoch" are required`)
	}
	v, ok, err := d.volumeAt(r.Context(), req.Volume, req.Index)
	if err != nil {
		return v, meta.VolumeSnapshot{}, err
	}
	if !ok {
		return v, meta.VolumeSnapshot{}, metaError(fmt.Errorf("meta: volume %q: %w", req.Volume, meta.ErrUnknownVolume), "")
	}
	if name, bound := certNode(r); bound && name != v.Node {
		return v, meta.VolumeSnapshot{}, &apiError{http.StatusForbidden, fmt.Sprintf("node %s is not the primary of volume %q (%s is): only the primary rebuilds its replicas", name, v.Name, v.Node)}
	}
	if req.Epoch != v.CurrentEpoch() {
		return v, meta.VolumeSnapshot{}, metaError(fmt.Errorf("meta: volume %q at epoch %d, not %d: %w", v.Name, v.CurrentEpoch(), req.Epoch, meta.ErrStaleEpoch), "")
	}
	rep, ok := v.Replica(d.cfg.NodeID)
	if !ok || v.Node == d.cfg.NodeID || (rep.State != meta.ReplicaOutOfSync && rep.State != meta.ReplicaRebuilding) {
		return v, meta.VolumeSnapshot{}, &apiError{http.StatusConflict, fmt.Sprintf("volume %q: node %s holds no secondary replica of it out of sync or rebuilding", v.Name, d.cfg.NodeID)}
	}
	s, ok := v.Snapshot(req.Snapshot)
	switch {
	case !ok:
		return v, s, metaError(fmt.Errorf("meta: snapshot %s@%s: %w", v.Name, req.Snapshot, meta.ErrUnknownSnapshot), "")
	case s.State != meta.SnapshotReady:
		return v, s, &apiError{http.StatusConflict, fmt.Sprintf("snapshot %s@%s is %v, not ready", v.Name, s.Name, s.State)}
	}
	return v, s, nil
}

// internalRebuildRevert serves POST /v1/internal/rebuild-revert: the
// primary, rebuilding this node's replica, has it revert its live copy
// to its own copy of a snapshot the registry lists this node in (§4.3
// step 1). Token 0: the registry's revert token is left as it is.
func (d *Daemon) internalRebuildRevert(w http.ResponseWriter, r *http.Request) error {
	var req snapshotRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	v, s, err := d.rebuildingReplica(r, req)
	if err != nil {
		return err
	}
	if !slices.Contains(s.Nodes, d.cfg.NodeID) {
		return &apiError{http.StatusConflict, fmt.Sprintf("snapshot %s@%s: the registry does not list node %s among its copies", v.Name, s.Name, d.cfg.NodeID)}
	}
	if err := d.store.Revert(store.ID(v.ID), store.ID(s.ID), 0); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrInvalid) {
			code = http.StatusConflict
		}
		return &apiError{code, fmt.Sprintf("revert %s to %s@%s on node %s: %v", v.Name, v.Name, s.Name, d.cfg.NodeID, err)}
	}
	d.log.Info("replica reverted for a rebuild", slog.String("volume", v.Name), slog.String("snapshot", s.Name))
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}

// internalRebuildSnapshot serves POST /v1/internal/rebuild-snapshot: the
// primary, rebuilding this node's replica, wrote the snapshot's content
// to its live copy and has it snapshot the copy (§4.3 step 2). A copy of
// that snapshot the store holds already (an earlier rebuild's, or a
// barrier's, not listed since) is deleted first (merged into its one
// child if it has one, which then reads the same), and the snapshot
// taken again.
func (d *Daemon) internalRebuildSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req snapshotRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	v, s, err := d.rebuildingReplica(r, req)
	if err != nil {
		return err
	}
	if _, err := d.store.Volume(store.ID(v.ID)); err != nil {
		return &apiError{http.StatusConflict, fmt.Sprintf("volume %q on node %s: %v", v.Name, d.cfg.NodeID, err)}
	}
	// Also when the live copy reads through it (a copy the registry
	// never listed here, e.g. taken by a barrier of this node's primary
	// term that the settle rounds finished without it; the whole
	// snapshot was just written over the live copy): merged into the
	// live copy, which reads the same, and taken again.
	if _, err := d.store.Volume(store.ID(s.ID)); err == nil {
		if err := d.store.Delete(store.ID(s.ID)); err != nil && !errors.Is(err, store.ErrNotFound) {
			return &apiError{http.StatusConflict, fmt.Sprintf("snapshot %s@%s: an earlier copy on node %s not deleted: %v", v.Name, s.Name, d.cfg.NodeID, err)}
		}
	}
	if err := d.store.Snapshot(store.ID(v.ID), store.ID(s.ID)); err != nil {
		return &apiError{http.StatusInternalServerError, fmt.Sprintf("snapshot %s@%s on node %s: %v", v.Name, s.Name, d.cfg.NodeID, err)}
	}
	d.log.Info("snapshot carried by a rebuild", slog.String("volume", v.Name), slog.String("snapshot", s.Name))
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}

// snapshotNodesRequest is POST /v1/internal/snapshot-nodes: a volume's
// primary has the leader record that a rebuild gave node a copy of the
// snapshot, or, Remove, that its term check found node's store without
// one (termsnap.go).
type snapshotNodesRequest struct {
	Volume   string `json:"volume"`
	Snapshot string `json:"snapshot"`
	Node     string `json:"node"`
	Remove   bool   `json:"remove,omitempty"`
}

// command is the registry command r asks for.
func (r snapshotNodesRequest) command() meta.SnapshotNodes {
	if r.Remove {
		return meta.SnapshotNodes{Volume: r.Volume, Snapshot: r.Snapshot, Remove: r.Node}
	}
	return meta.SnapshotNodes{Volume: r.Volume, Snapshot: r.Snapshot, Add: r.Node}
}

// internalSnapshotNodes serves POST /v1/internal/snapshot-nodes on the
// leader: only the volume's primary asks (a node certificate naming
// another node is refused).
func (d *Daemon) internalSnapshotNodes(w http.ResponseWriter, r *http.Request) error {
	var req snapshotNodesRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Volume == "" || req.Snapshot == "" || req.Node == "" {
		return badRequest(`"volume", "snapshot" and "node" are required`)
	}
	if name, bound := certNode(r); bound {
		v, err := registryParts{d.node}.Volume(r.Context(), req.Volume)
		if err != nil {
			return metaError(err, "")
		}
		if name != v.Node {
			return &apiError{http.StatusForbidden, fmt.Sprintf("node %s is not the primary of volume %q (%s is): only the primary records its rebuilds", name, req.Volume, v.Node)}
		}
	}
	if _, err := d.node.Apply(r.Context(), req.command()); err != nil {
		return metaError(err, "")
	}
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}

// addSnapshotNode has the leader record node among snap's copies,
// trying again as replica reports do until ctx ends.
func (d *Daemon) addSnapshotNode(ctx context.Context, volume, snap, node string) error {
	return d.snapshotNodes(ctx, snapshotNodesRequest{Volume: volume, Snapshot: snap, Node: node})
}

// snapshotNodes has the leader apply req, trying again as replica
// reports do until ctx ends.
func (d *Daemon) snapshotNodes(ctx context.Context, req snapshotNodesRequest) error {
	for {
		var err error
		if d.node.IsLeader() {
			_, err = d.node.Apply(ctx, req.command())
			if err != nil && !errors.Is(err, meta.ErrNotLeader) {
				return err
			}
		} else if _, api := d.leaderAPI(); api == "" {
			err = errors.New("no registry leader known")
		} else {
			err = d.postPeer(ctx, api, "/v1/internal/snapshot-nodes", req, nil)
			var pa *peerAnswer
			if errors.As(err, &pa) && pa.status >= 400 && pa.status < 500 && pa.status != http.StatusMisdirectedRequest {
				return fmt.Errorf("leader at %s: %w", api, err)
			}
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(reportRetry):
		}
	}
}

// carried is what carrySnapshots gave the replica: top, the store ID of
// the newest snapshot its live copy now reads (0: nothing was carried,
// its copy is as it was), and the names carried.
type carried struct {
	top   uint64
	names []string
}

// carrySnapshots gives node's replica of v the snapshots of the
// primary's chain it lacks (steps 1 and 2 above), over ns, a
// connection to it at epoch that is no leg yet. changing is called
// before the replica's copy is first changed: from then on the
// primary's dirty-region log of the replica no longer says what differs
// (the revert threw away what the replica held since B), and the caller
// drops it, so that a rebuild failing after this point is followed by a
// compare, not an incremental copy.
func (d *Daemon) carrySnapshots(ctx context.Context, v meta.Volume, epoch uint64, node string, ns *initiator.Namespace, changing func()) (carried, error) {
	// The registry copy now, not the rebuild loop's: a snapshot taken
	// while the replica's node came up is in the store already.
	var ok bool
	id := v.ID
	d.node.FSM().Read(func(s *meta.State) { v, ok = s.Volume(v.Name) })
	if !ok || v.ID != id || v.CurrentEpoch() != epoch || v.Node != d.cfg.NodeID {
		return carried{}, fmt.Errorf("volume %q: no longer served by node %s at epoch %d", v.Name, d.cfg.NodeID, epoch)
	}
	// The primary's chain, newest first, as far as it is made of ready
	// snapshots of v of v's size.
	byID := make(map[uint64]meta.VolumeSnapshot, len(v.Snapshots))
	for _, s := range v.Snapshots {
		byID[s.ID] = s
	}
	var chain []meta.VolumeSnapshot
	for id, n := uint64(v.ID), 0; n <= meta.MaxSnapshots; n++ {
		o, err := d.store.Volume(store.ID(id))
		if err != nil {
			return carried{}, err
		}
		info, err := o.Info()
		if err != nil {
			return carried{}, err
		}
		s, ok := byID[uint64(info.Parent)]
		if ok && s.State != meta.SnapshotReady {
			// Being taken or deleted (or this registry copy has not
			// applied its commit yet): carried once it settles, the
			// rebuild waits for it rather than leave the replica without.
			return carried{}, fmt.Errorf("snapshot %s@%s is %v: %w", v.Name, s.Name, s.State, repl.ErrRebuildSnapshot)
		}
		if info.Parent == 0 || !ok || s.SizeBytes != v.SizeBytes {
			break
		}
		chain = append(chain, s)
		id = s.ID
	}
	if len(chain) == 0 {
		return carried{}, nil
	}
	api := d.apiOf(node)
	if api == "" {
		return carried{}, fmt.Errorf("the registry knows no API address for node %s", node)
	}
	ids := make([]string, len(chain))
	for i, s := range chain {
		ids[i] = strconv.FormatUint(s.ID, 10)
	}
	var their snapshotChain
	qctx, cancel := context.WithTimeout(ctx, ownerTimeout)
	err := d.getPeer(qctx, api, fmt.Sprintf("/v1/internal/snapshots?id=%d&ids=%s", v.ID, strings.Join(ids, ",")), &their)
	cancel()
	if err != nil {
		return carried{}, fmt.Errorf("node %s's snapshots: %w", node, err)
	}
	// B: the newest R holds and is listed in, on its live chain with
	// the same older snapshots as the primary's (a replica that lost
	// one in the middle, found by the term check, is reverted below the
	// hole); lack: those after it, oldest first.
	var lack []meta.VolumeSnapshot
	var base meta.VolumeSnapshot
	for i, s := range chain {
		if slices.Contains(their.Held, s.ID) && slices.Contains(s.Nodes, node) && sameBelow(their.Chain, chain[i:]) {
			base = s
			break
		}
		lack = append(lack, s)
	}
	if len(lack) == 0 {
		return carried{}, nil
	}
	slices.Reverse(lack)
	index := d.node.AppliedIndex()
	changing()
	if base.ID != 0 {
		rctx, cancel := context.WithTimeout(ctx, ownerTimeout)
		err := d.postPeer(rctx, api, "/v1/internal/rebuild-revert", snapshotRequest{Volume: v.Name, Snapshot: base.Name, Index: index, Epoch: epoch}, nil)
		cancel()
		if err != nil {
			return carried{}, fmt.Errorf("revert node %s's copy to %s@%s: %w", node, v.Name, base.Name, err)
		}
	}
	var out carried
	from := base.ID
	for _, s := range lack {
		start := time.Now()
		n, err := d.copySnapshot(ctx, v, from, s.ID, ns)
		if err != nil {
			return out, fmt.Errorf("copy %s@%s to node %s: %w", v.Name, s.Name, node, err)
		}
		sctx, cancel := context.WithTimeout(ctx, ownerTimeout)
		err = d.postPeer(sctx, api, "/v1/internal/rebuild-snapshot", snapshotRequest{Volume: v.Name, Snapshot: s.Name, Index: index, Epoch: epoch}, nil)
		cancel()
		if err != nil {
			return out, fmt.Errorf("snapshot %s@%s on node %s: %w", v.Name, s.Name, node, err)
		}
		actx, cancel := context.WithTimeout(ctx, ownerTimeout)
		err = d.addSnapshotNode(actx, v.Name, s.Name, node)
		cancel()
		if err != nil {
			return out, fmt.Errorf("record node %s among %s@%s's copies: %w", node, v.Name, s.Name, err)
		}
		out.top, out.names = s.ID, append(out.names, s.Name)
		from = s.ID
		d.log.Info("snapshot carried to a replica", slog.String("volume", v.Name), slog.String("snapshot", s.Name), slog.String("node", node),
			slog.Uint64("copied_bytes", n), slog.Duration("took", time.Since(start).Round(time.Millisecond)))
	}
	return out, nil
}

// sameBelow says whether theirs, a replica's live chain (the volume
// first), holds ours[0] and below it the snapshots of ours after it in
// the same order, other objects (not in ours) left out.
func sameBelow(theirs []chainObject, ours []meta.VolumeSnapshot) bool {
	at := slices.IndexFunc(theirs, func(o chainObject) bool { return o.ID == ours[0].ID })
	if at < 0 {
		return false
	}
	i := 1
	for _, o := range theirs[at+1:] {
		if !slices.ContainsFunc(ours, func(s meta.VolumeSnapshot) bool { return s.ID == o.ID }) {
			continue
		}
		if i == len(ours) || ours[i].ID != o.ID {
			return false
		}
		i++
	}
	return i == len(ours)
}

// copySnapshot writes to ns what snapshot to reads differently from
// snapshot from (its ancestor; the replica's live copy reads from), and
// flushes: the runs Store.Changes finds, data read from the local copy
// of to and written, zeros deallocated. from 0: the replica's copy may
// read anything, so every run to reads is written and every other
// region deallocated. The bytes written.
func (d *Daemon) copySnapshot(ctx context.Context, v meta.Volume, from, to uint64, ns *initiator.Namespace) (uint64, error) {
	src, err := d.store.Volume(store.ID(to))
	if err != nil {
		return 0, err
	}
	bs := uint64(v.BlockSize)
	blocks := v.SizeBytes / bs
	if ns.Blocks() < blocks || uint64(ns.BlockSize()) != bs {
		return 0, fmt.Errorf("the replica's namespace has %d blocks of %d bytes, the snapshot %d of %d", ns.Blocks(), ns.BlockSize(), blocks, bs)
	}
	buf := make([]byte, rebuildRegion)
	per := uint64(rebuildRegion) / bs
	var written uint64
	dealloc := func(lba, n uint64) error {
		for n > 0 {
			k := min(n, 1<<32-1)
			if err := ns.Deallocate(initiator.Range{LBA: lba, Blocks: uint32(k)}); err != nil {
				return err
			}
			lba, n = lba+k, n-k
		}
		return nil
	}
	data := func(lba, n uint64) error {
		for n > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			k := min(n, per)
			b := buf[:k*bs]
			if d.repl.limit != nil {
				if err := d.repl.limit.Wait(ctx, uint64(len(b))); err != nil {
					return err
				}
			}
			if err := src.Read(lba, b); err != nil {
				return fmt.Errorf("read snapshot %d at %d: %w", to, lba, err)
			}
			if _, err := ns.WriteAt(b, int64(lba*bs)); err != nil {
				return fmt.Errorf("write at %d: %w", lba, err)
			}
			written += uint64(len(b))
			lba, n = lba+k, n-k
		}
		return nil
	}
	if from == 0 {
		at := uint64(0)
		err = src.Mapped(0, blocks, func(lba, n uint64) error {
			if lba > at {
				if err := dealloc(at, lba-at); err != nil {
					return err
				}
			}
			at = lba + n
			return data(lba, n)
		})
		if err == nil && at < blocks {
			err = dealloc(at, blocks-at)
		}
	} else {
		err = d.store.Changes(store.ID(from), store.ID(to), func(lba, n uint64, zero bool) error {
			if zero {
				return dealloc(lba, n)
			}
			return data(lba, n)
		})
	}
	if err != nil {
		return written, err
	}
	return written, ns.Flush()
}
