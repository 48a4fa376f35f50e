package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/blk-project/blk/meta"
)

// Replace and move (docs/replication.md §6): a replica is replaced by a
// new one copied in full while hosts write; the old one leaves the
// registry only once the new one is in sync (after a planned handover
// when it is the primary's), so a volume never has fewer in-sync
// replicas than before. The registry holds the replacement
// (meta.Replica.ReplacedBy), so a new leader finishes what an old one
// started: FinishReplace, called every round.

// ReplaceReplica starts replacing volume's replica on node with a new
// one on to, or, for to "", on the node placement chooses outside the
// zones of the volume's other replicas (node's own zone is allowed: it is
// leaving). The new replica starts out of sync, to be copied in full by
// the primary; its node creates the empty store volume now. reason is
// the new replica's ("": the registry's default). node's replica may be
// the primary's (volume move): FinishReplace hands over first. It
// returns the volume after the change.
func (m *Manager) ReplaceReplica(ctx context.Context, volume, node, to, reason string) (meta.Volume, error) {
	if err := m.requireFeature(ctx, meta.FeatureReplace); err != nil {
		return meta.Volume{}, err
	}
	return m.addReplica(ctx, volume, to, func(v meta.Volume) (meta.PlaceRequest, error) {
		r, ok := v.Replica(node)
		if !ok {
			return meta.PlaceRequest{}, fmt.Errorf("meta: volume %q has no replica on node %q: %w", volume, node, meta.ErrUnknownNode)
		}
		if r.ReplacedBy != "" {
			return meta.PlaceRequest{}, fmt.Errorf("meta: volume %q: the replica on %q is being replaced by one on %q already: %w", volume, node, r.ReplacedBy, meta.ErrInvalid)
		}
		var taken []string
		for _, n := range replicaNodes(v) {
			if n != node {
				taken = append(taken, n)
			}
		}
		return meta.PlaceRequest{Replicas: 1, SizeBytes: v.SizeBytes, Taken: taken, Exclude: []string{node}}, nil
	}, func(to string) meta.Command {
		return meta.ReplaceReplica{Volume: volume, Node: node, New: to, Reason: reason, At: m.Now().UnixNano()}
	})
}

// FinishReplace ends the replacement of volume's replica on node once
// the replica replacing it is in sync: a planned handover to the new one
// if node is the primary, then the removal of node's replica
// (meta.RemoveReplica with Replaced, which the registry refuses if the
// new one fell out of sync meanwhile). It reports whether the
// replacement is over; false with a nil error: not yet (copying).
func (m *Manager) FinishReplace(ctx context.Context, volume, node string) (bool, error) {
	v, err := m.reg.Volume(ctx, volume)
	if err != nil {
		return false, err
	}
	old, ok := v.Replica(node)
	if !ok || old.ReplacedBy == "" {
		return true, nil // finished or cancelled already
	}
	r, ok := v.Replica(old.ReplacedBy)
	if !ok || r.State != meta.ReplicaInSync {
		return false, nil
	}
	if v.Node == node {
		// The new replica takes over first: hosts keep a path (they have
		// one to every replica node, the new one's through discovery).
		if _, err := m.SetPrimary(ctx, volume, v.CurrentEpoch(), r.Node, false); err != nil && !errors.Is(err, ErrOwnerUnreachable) {
			return false, fmt.Errorf("hand over from node %s to node %s: %w", node, r.Node, err)
		}
	}
	_, index, err := m.removeReplica(ctx, volume, node, true)
	if err != nil {
		return false, err
	}
	m.logger().Info("replica replaced", "volume", volume, "node", node, "by", r.Node)
	// Its data is on the new replica now: node deletes its copy, or, down
	// or silent, keeps it as a store volume of a replica it does not hold
	// (never served, never counted: Reconciler.ReconcileAll reports it),
	// for an operator.
	if d, ok := m.owners.(Dropper); ok {
		if err := d.DropRemoved(ctx, node, volume, v.ID, index); err != nil {
			m.logger().Warn("replaced replica's store volume kept on its node (not served, not counted): it did not delete it", "volume", volume, "node", node, "id", v.ID, "err", err)
		}
	}
	return true, nil
}

// Dropper is an optional interface of Owners: node deletes its copy
// (store volume id) of the volume called name, a replica the registry,
// once it has applied index, no longer places there
// (Reconciler.DropRemoved).
type Dropper interface {
	DropRemoved(ctx context.Context, node, name string, id, index uint64) error
}

// A DueReplacement is a replica whose node has been down longer than the
// automatic replacement's wait.
type DueReplacement struct {
	Volume, Node string
	Down         time.Duration // how long its node has been down
}

// DueReplacements lists the replicas of vols to replace automatically
// (blkd --replace-after): on a node down (downFor, the time since the
// leader last heard from it) for at least after, not the primary's (a
// failover moves the primary first), of a volume whose primary is up
// (the copy's source) and not being deleted, not being replaced or
// replacing another already. One per volume a
// round: each replacement is a full copy.
func DueReplacements(vols []meta.Volume, nodes []meta.NodeInfo, downFor func(node string) time.Duration, after time.Duration) []DueReplacement {
	down := map[string]bool{}
	for _, n := range nodes {
		if n.State == meta.NodeDown {
			down[n.ID] = true
		}
	}
	var out []DueReplacement
	for _, v := range vols {
		// A primary that is down has nothing to copy from: its failover
		// comes first.
		if v.State == meta.VolumeDeleting || len(v.Replicas) < 2 || down[v.Node] {
			continue
		}
		for _, r := range v.Replicas {
			if !down[r.Node] || r.Node == v.Node || r.ReplacedBy != "" || replacing(v, r.Node) {
				continue
			}
			if d := downFor(r.Node); d >= after {
				out = append(out, DueReplacement{Volume: v.Name, Node: r.Node, Down: d})
				break
			}
		}
	}
	return out
}

// replacing says whether v's replica on node replaces another.
func replacing(v meta.Volume, node string) bool {
	return slices.ContainsFunc(v.Replicas, func(r meta.Replica) bool { return r.ReplacedBy == node })
}
