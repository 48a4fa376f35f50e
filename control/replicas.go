package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/blk-project/blk/meta"
)

// ErrFeatureMissing: a registered node's binary does not apply the
// commands the request needs (it registered without
// meta.FeatureReplication): upgrade every node first. Nothing was written.
var ErrFeatureMissing = errors.New("control: a node lacks a feature the request needs")

// defaultReplicas is the replication factor of a volume created without
// one, when the cluster has at least that many eligible zones
// (docs/replication.md §6): three copies survive the loss of a zone with
// a majority of the raft voters left to commit the failover.
const defaultReplicas = 3

// maxReplicas is the cap the Manager puts on replica counts: its
// MaxReplicas, 1 when unset.
func (m *Manager) maxReplicas() int { return min(max(m.MaxReplicas, 1), meta.MaxReplicas) }

// requireFeature refuses a request that needs feature unless every
// registered node lists it: an older binary cannot apply the command and
// would stop applying the log.
func (m *Manager) requireFeature(ctx context.Context, feature string) error {
	nodes, err := m.reg.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if !n.HasFeature(feature) {
			return fmt.Errorf("%w: node %s did not register feature %q (an older blkd, or it joined through one): upgrade every node, then restart node %s", ErrFeatureMissing, n.ID, feature, n.ID)
		}
	}
	return nil
}

// replicaCount resolves a create's replica count: n (1..MaxReplicas), or
// for 0 the default, 3 when the cluster has at least 3 eligible zones
// (nodes up and serving NVMe-oF; a node without a zone is its own) and
// every node applies replica commands, else 1; capped by MaxReplicas.
// explicit says whether the volume should carry an explicit replica set
// (every node can apply it).
func (m *Manager) replicaCount(ctx context.Context, n int) (count int, explicit bool, err error) {
	if n < 0 || n > meta.MaxReplicas {
		return 0, false, fmt.Errorf("%w: %d replicas: give 1 to %d, or 0 for the default", ErrInvalid, n, meta.MaxReplicas)
	}
	if n > m.maxReplicas() {
		return 0, false, fmt.Errorf("%w: %d replicas: this cluster allows at most %d", ErrInvalid, n, m.maxReplicas())
	}
	ready := m.requireFeature(ctx, meta.FeatureReplication)
	if n > 1 {
		if ready != nil {
			return 0, false, ready
		}
		nodes, err := m.reg.Nodes(ctx)
		if err != nil {
			return 0, false, err
		}
		if n == 2 && len(nodes) < 3 {
			// Every node is a raft voter: with two, losing either stops
			// the registry, so no failover could ever commit.
			return 0, false, fmt.Errorf("%w: %d replicas on a cluster of %d nodes: a failover needs the registry, which two nodes cannot keep when one is lost; add a third node first", ErrInvalid, n, len(nodes))
		}
		return n, true, nil
	}
	if n == 1 {
		return 1, ready == nil, nil
	}
	if ready != nil || m.maxReplicas() < defaultReplicas {
		return 1, ready == nil, nil
	}
	nodes, err := m.reg.Nodes(ctx)
	if err != nil {
		return 0, false, err
	}
	zones := map[string]bool{}
	for _, n := range nodes {
		if n.State != meta.NodeUp || (n.TCPAddr == "" && n.TargetAddr == "") {
			continue
		}
		z := "node:" + n.ID
		if n.Zone != "" {
			z = "zone:" + n.Zone
		}
		zones[z] = true
	}
	if len(zones) >= defaultReplicas {
		return defaultReplicas, true, nil
	}
	return 1, true, nil
}

// logReplica records one replica's change, as Reconciler.transition
// records a volume's local state.
func (m *Manager) logReplica(v meta.Volume, node string, from, to meta.ReplicaState, reason string) {
	attrs := []any{"volume", v.Name, "node", node, "from", replicaStateName(from), "to", replicaStateName(to), "epoch", v.CurrentEpoch()}
	if reason != "" {
		attrs = append(attrs, "reason", reason)
	}
	level := slog.LevelInfo
	if to == meta.ReplicaFailed || to == meta.ReplicaOutOfSync {
		level = slog.LevelWarn
	}
	m.logger().Log(context.Background(), level, "replica state", attrs...)
}

func replicaStateName(s meta.ReplicaState) string {
	if s == "" {
		return "none"
	}
	return string(s)
}

func (m *Manager) logger() *slog.Logger {
	if m.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return m.Log
}

// SetReplicaState moves volume's replica on node to state at epoch
// (meta.SetReplicaState: the registry refuses a stale epoch with
// meta.ErrStaleEpoch, the primary's replica and illegal moves with
// meta.ErrBadTransition), and logs the change. Linearizable: it returns
// once the command is committed. Leader only, like every Manager method.
func (m *Manager) SetReplicaState(ctx context.Context, volume string, epoch uint64, node string, state meta.ReplicaState, reason string, full bool) error {
	if err := m.requireFeature(ctx, meta.FeatureReplication); err != nil {
		return err
	}
	// No wait for the volume's lock: a primary holds a host's write until
	// this commits (repl's hold, 8 s), and the lock's holder may be a
	// settle round waiting up to ownerTimeout (15 s) for the very node
	// that went silent. The registry checks the epoch and the move.
	before, err := m.reg.Volume(ctx, volume)
	if err != nil {
		return err
	}
	res, err := m.reg.Apply(ctx, meta.SetReplicaState{Volume: volume, Epoch: epoch, Node: node, State: state, Reason: reason, Full: full, At: m.Now().UnixNano()})
	if err != nil {
		return err
	}
	from, _ := before.Replica(node)
	m.logReplica(*res.Volume, node, from.State, state, reason)
	return nil
}

// SetPrimary makes node the primary of volume at epoch+1
// (meta.SetPrimary; with failover the old primary's replica becomes
// out-of-sync), logs it, and has the nodes follow: the old primary (in a
// planned handover) stops serving, the new one serves. It returns the volume after
// the change; ErrOwnerUnreachable if the new primary did not answer (the
// registry holds the change; the node applies it when reachable).
func (m *Manager) SetPrimary(ctx context.Context, volume string, epoch uint64, node string, failover bool) (meta.Volume, error) {
	if err := m.requireFeature(ctx, meta.FeatureReplication); err != nil {
		return meta.Volume{}, err
	}
	// A failover does not wait for the volume's lock: its holder may be
	// a settle round waiting for the lost primary to answer (ownerTimeout,
	// 15 s). The registry orders it against every other replica command
	// by the epoch (a second SetPrimary of the same epoch is refused).
	if !failover {
		defer m.lock(volume)()
	}
	before, err := m.reg.Volume(ctx, volume)
	if err != nil {
		return meta.Volume{}, err
	}
	if before.CurrentEpoch() != epoch {
		return before, fmt.Errorf("%w: volume %q is at epoch %d, not %d", meta.ErrStaleEpoch, volume, before.CurrentEpoch(), epoch)
	}
	res, err := m.reg.Apply(ctx, meta.SetPrimary{Volume: volume, Epoch: epoch, Node: node, Failover: failover, At: m.Now().UnixNano()})
	if err != nil {
		return meta.Volume{}, err
	}
	v := *res.Volume
	m.logger().Info("replica primary", "volume", v.Name, "from", before.Node, "to", v.Node, "epoch", v.CurrentEpoch(), "failover", failover)
	if failover {
		r, _ := v.Replica(before.Node)
		m.logReplica(v, before.Node, meta.ReplicaInSync, r.State, r.Reason)
	}
	// A planned handover stops the old primary first, so that it stops
	// serving before the new one starts. A failover does not wait for the
	// old one, presumed lost: it stops when it restarts (a secondary
	// serves nothing) or at the next settle round, and until step 3 of
	// docs/replication.md (the fence) nothing else stops it.
	if !failover && before.Node != v.Node {
		if _, err := m.owners.Reconcile(ctx, before.Node, v.Name, res.Index); err != nil {
			m.logger().Warn("replica primary: the old primary did not answer", "volume", v.Name, "node", before.Node, "err", err)
		}
	}
	// The other secondaries raise their fence to the new epoch (a
	// connection of an older one is torn down, its writes drained) before
	// the new primary connects to them. The old primary was reconciled
	// above, or, failed over, is presumed lost.
	for _, n := range replicaNodes(v) {
		if n == v.Node || n == before.Node {
			continue
		}
		if _, err := m.owners.Reconcile(ctx, n, v.Name, res.Index); err != nil {
			m.logger().Warn("replica primary: a secondary did not answer", "volume", v.Name, "node", n, "err", err)
		}
	}
	return m.convergeOn(ctx, v, res.Index, false)
}

// AddReplica adds a replica of volume on node, or, for node "", on the
// node placement chooses among those outside the volume's zones
// (meta.PlaceRequest.Taken). The replica starts out of sync, to be copied
// in full; its node creates the empty store volume now. It returns the
// volume after the change.
func (m *Manager) AddReplica(ctx context.Context, volume, node string) (meta.Volume, error) {
	if err := m.requireFeature(ctx, meta.FeatureReplication); err != nil {
		return meta.Volume{}, err
	}
	return m.addReplica(ctx, volume, node, func(v meta.Volume) (meta.PlaceRequest, error) {
		return meta.PlaceRequest{Replicas: 1, SizeBytes: v.SizeBytes, Taken: replicaNodes(v)}, nil
	}, func(node string) meta.Command {
		return meta.AddReplica{Volume: volume, Node: node, At: m.Now().UnixNano()}
	})
}

// addReplica is AddReplica and ReplaceReplica: node, or where placement
// says for req(volume), gets the replica cmd(node) adds (given the
// volume's replica secret when it has none yet), and its store volume.
func (m *Manager) addReplica(ctx context.Context, volume, node string, req func(meta.Volume) (meta.PlaceRequest, error), cmd func(node string) meta.Command) (meta.Volume, error) {
	defer m.lock(volume)()
	v, err := m.reg.Volume(ctx, volume)
	if err != nil {
		return meta.Volume{}, err
	}
	pr, err := req(v)
	if err != nil {
		return meta.Volume{}, err
	}
	m.placeMu.Lock()
	if node == "" {
		var nodes []string
		nodes, err = m.placeAnswering(ctx, pr)
		if err == nil {
			node = nodes[0]
		}
	}
	var res meta.Result
	if err == nil {
		c := cmd(node)
		if v.ReplicaSecret == nil {
			var rs meta.HostSecret
			if rs, err = NewReplicaSecret(); err == nil {
				c = withReplicaSecret(c, &rs)
			}
		}
		if err == nil {
			res, err = m.reg.Apply(ctx, c)
		}
	}
	m.placeMu.Unlock()
	if err != nil {
		return meta.Volume{}, err
	}
	v = *res.Volume
	r, _ := v.Replica(node)
	m.logReplica(v, node, "", r.State, r.Reason)
	st, err := m.owners.Reconcile(ctx, node, v.Name, res.Index)
	switch {
	case err != nil:
		return v, fmt.Errorf("%w: volume %q: replica added on node %s, which did not create its store volume yet: %v; it does when it is reachable", ErrOwnerUnreachable, v.Name, node, err)
	case st.State == StateFailed:
		return v, fmt.Errorf("%w: volume %q: replica on node %s: %s", ErrOwnerFailed, v.Name, node, st.Reason)
	}
	return v, nil
}

// withReplicaSecret sets c's replica secret (AddReplica, ReplaceReplica).
func withReplicaSecret(c meta.Command, rs *meta.HostSecret) meta.Command {
	switch c := c.(type) {
	case meta.AddReplica:
		c.ReplicaSecret = rs
		return c
	case meta.ReplaceReplica:
		c.ReplicaSecret = rs
		return c
	}
	return c
}

// RemoveReplica drops volume's replica on node (never the primary's:
// SetPrimary first), and logs it. The removed replica's store volume is
// kept on its node (reported there as not the registry's); deleting it
// belongs to volume move and replace (docs/replication.md §8 step 8).
func (m *Manager) RemoveReplica(ctx context.Context, volume, node string) (meta.Volume, error) {
	if err := m.requireFeature(ctx, meta.FeatureReplication); err != nil {
		return meta.Volume{}, err
	}
	v, _, err := m.removeReplica(ctx, volume, node, false)
	return v, err
}

// removeReplica is RemoveReplica; replaced: the end of a replacement
// (meta.RemoveReplica.Replaced). It returns the registry index of the
// removal too.
func (m *Manager) removeReplica(ctx context.Context, volume, node string, replaced bool) (meta.Volume, uint64, error) {
	defer m.lock(volume)()
	before, err := m.reg.Volume(ctx, volume)
	if err != nil {
		return meta.Volume{}, 0, err
	}
	res, err := m.reg.Apply(ctx, meta.RemoveReplica{Volume: volume, Node: node, Replaced: replaced})
	if err != nil {
		return meta.Volume{}, 0, err
	}
	r, _ := before.Replica(node)
	m.logReplica(*res.Volume, node, r.State, "", "removed")
	// The removed node stops taking the primary's replica connections
	// (its data stays); one that does not answer does when it next
	// reconciles.
	if _, err := m.owners.Reconcile(ctx, node, volume, res.Index); err != nil {
		m.logger().Warn("replica removed: its node did not answer", "volume", volume, "node", node, "err", err)
	}
	// The primary stops writing to it (its write set is the registry's
	// replicas); one that does not answer does at its next settle round.
	if p := res.Volume.Node; p != node {
		if _, err := m.owners.Reconcile(ctx, p, volume, res.Index); err != nil {
			m.logger().Warn("replica removed: the primary did not answer", "volume", volume, "node", p, "err", err)
		}
	}
	return *res.Volume, res.Index, nil
}

// replicaNodes are the nodes of v's replicas, in placement order.
func replicaNodes(v meta.Volume) []string {
	set := v.ReplicaSet()
	out := make([]string, len(set))
	for i, r := range set {
		out[i] = r.Node
	}
	return out
}

// placeAnswering is Place, skipping chosen nodes the Owners' Answerer
// says do not answer (see Answerer) and those its DiskReporter says have
// a full disk (see DiskReporter). The caller holds placeMu.
func (m *Manager) placeAnswering(ctx context.Context, req meta.PlaceRequest) ([]string, error) {
	a, _ := m.owners.(Answerer)
	d, _ := m.owners.(DiskReporter)
	for {
		nodes, err := m.reg.Place(ctx, req)
		if err != nil && len(req.Full) > 0 && !errors.Is(err, meta.ErrNoCapacity) {
			// Too few nodes once the full ones are left out: a want of
			// space (507 at the API), not of nodes.
			return nil, fmt.Errorf("%w (%w: free space on the full nodes, or add one)", err, meta.ErrNoCapacity)
		}
		if err != nil {
			return nil, err
		}
		skip := false
		for _, n := range nodes {
			if a != nil && !a.Answers(ctx, n) {
				req.Exclude, skip = append(req.Exclude, n), true
				break
			}
			if d != nil {
				if why := d.DiskFull(ctx, n); why != "" {
					m.logger().Warn("placement: node left out, its disk is full", "node", n, "reason", why)
					req.Full, skip = append(req.Full, n), true
					break
				}
			}
		}
		if !skip {
			return nodes, nil
		}
		// Place never chooses an excluded or full node: this ends after
		// at most one round per node.
	}
}
