package meta

import (
	"fmt"
	"slices"
)

// ReplicaState is the state of one replica of a volume (docs/replication.md
// §1). Only the leader's control.Manager changes it, through
// SetReplicaState, SetPrimary, AddReplica and RemoveReplica.
type ReplicaState string

const (
	// ReplicaInSync holds every acknowledged write, counts for
	// acknowledgement and may become primary.
	ReplicaInSync ReplicaState = "in-sync"
	// ReplicaOutOfSync misses writes: the primary tracks which, or Full
	// says the next rebuild copies everything.
	ReplicaOutOfSync ReplicaState = "out-of-sync"
	// ReplicaRebuilding is being copied to and is sent every new write.
	ReplicaRebuilding ReplicaState = "rebuilding"
	// ReplicaFailed cannot be rebuilt in place (node removed, store volume
	// missing or failed): only replacing or removing it helps.
	ReplicaFailed ReplicaState = "failed"
)

func (s ReplicaState) valid() bool {
	switch s {
	case ReplicaInSync, ReplicaOutOfSync, ReplicaRebuilding, ReplicaFailed:
		return true
	}
	return false
}

// MaxReplicas bounds a volume's replica set: every write goes to each
// replica, and five zones are more than any deployment asks for.
const MaxReplicas = 5

// Replica is one copy of a volume: a store volume of the volume's ID on
// Node.
type Replica struct {
	Node   string       `json:"node"`
	State  ReplicaState `json:"state"`
	Reason string       `json:"reason,omitempty"`
	// Since is when the replica entered State, Unix nanoseconds, from
	// the command that moved it.
	Since int64 `json:"since"`
	// Full: the next rebuild copies every allocated extent (the primary
	// has no record of which writes the replica missed).
	Full bool `json:"full_copy,omitempty"`
	// ReplacedBy names the node of the replica that replaces this one
	// (ReplaceReplica): this one is leaving, and is removed once that
	// one is in sync. "": none.
	ReplacedBy string `json:"replaced_by,omitempty"`
}

// ReplicaSet returns the volume's replicas in placement order. A volume
// written before replicas (no Replicas) has one: in sync on v.Node since
// its creation. The slice is the caller's.
func (v *Volume) ReplicaSet() []Replica {
	if len(v.Replicas) == 0 {
		return []Replica{{Node: v.Node, State: ReplicaInSync, Since: v.CreatedAt}}
	}
	return slices.Clone(v.Replicas)
}

// CurrentEpoch is the volume's epoch: 1 for a volume that never changed
// primary (also one written before epochs, whose Epoch is 0).
func (v *Volume) CurrentEpoch() uint64 { return max(v.Epoch, 1) }

// WantReplicas is the replication factor asked for at creation: 1 for a
// volume written before replicas.
func (v *Volume) WantReplicas() int { return max(v.Want, 1) }

// Replica returns the volume's replica on node. It does not allocate:
// placement asks it of every volume for every node.
func (v *Volume) Replica(node string) (Replica, bool) {
	if len(v.Replicas) == 0 {
		if node == v.Node {
			return Replica{Node: v.Node, State: ReplicaInSync, Since: v.CreatedAt}, true
		}
		return Replica{}, false
	}
	for _, r := range v.Replicas {
		if r.Node == node {
			return r, true
		}
	}
	return Replica{}, false
}

// InSync returns the nodes of the in-sync replicas, the primary first.
func (v *Volume) InSync() []string {
	out := []string{v.Node}
	for _, r := range v.ReplicaSet() {
		if r.State == ReplicaInSync && r.Node != v.Node {
			out = append(out, r.Node)
		}
	}
	return out
}

// explicit makes v's replica set and epoch explicit (the first replica
// command on a volume written before replicas) and returns the index of
// node's replica, or -1.
func (v *Volume) explicit(node string) int {
	if len(v.Replicas) == 0 {
		v.Replicas = v.ReplicaSet()
	}
	v.Epoch = v.CurrentEpoch()
	return slices.IndexFunc(v.Replicas, func(r Replica) bool { return r.Node == node })
}

// validReplicaMove says whether SetReplicaState may move a replica from
// one state to another: in-sync → out-of-sync; out-of-sync → rebuilding;
// rebuilding → in-sync or out-of-sync; any → failed; failed → out-of-sync
// (with Full). out-of-sync → out-of-sync and failed → failed are allowed
// too: they update the reason and set Full (a change of primary leaves
// the replicas already out of sync with no record of what they miss).
func validReplicaMove(from, to ReplicaState) bool {
	switch to {
	case ReplicaFailed:
		return true
	case ReplicaOutOfSync:
		return true // from failed only with Full: setReplicaState checks
	case ReplicaRebuilding:
		return from == ReplicaOutOfSync
	case ReplicaInSync:
		return from == ReplicaRebuilding
	}
	return false
}

// zoneOf is node n's failure domain as placement counts it: its zone, or
// the node itself when it has none.
func zoneOf(n *NodeInfo) string {
	if n.Zone == "" {
		return "node:" + n.ID // zone names have no ':' (api.CheckName)
	}
	return "zone:" + n.Zone
}

// checkReplicaNodes checks a new replica set: at most MaxReplicas, every
// node known and up, no node or zone twice.
func (s *State) checkReplicaNodes(volume string, nodes []string) error {
	if len(nodes) > MaxReplicas {
		return fmt.Errorf("meta: volume %q: %d replicas, at most %d: %w", volume, len(nodes), MaxReplicas, ErrLimit)
	}
	zones := make(map[string]string, len(nodes))
	for i, id := range nodes {
		n, err := s.node(id)
		if err != nil {
			return err
		}
		if n.State != NodeUp {
			return fmt.Errorf("meta: volume %q: replica node %q is %v: %w", volume, id, n.State, ErrNodeNotUp)
		}
		if slices.Contains(nodes[:i], id) {
			return fmt.Errorf("meta: volume %q: node %q holds two replicas: %w", volume, id, ErrInvalid)
		}
		z := zoneOf(n)
		if other, ok := zones[z]; ok {
			return fmt.Errorf("meta: volume %q: nodes %q and %q are both in zone %q: replicas need distinct zones: %w", volume, other, id, n.Zone, ErrInvalid)
		}
		zones[z] = id
	}
	return nil
}

// replicaVolume is the volume a replica command changes: known, not
// being deleted, and at the command's epoch when it names one.
func (s *State) replicaVolume(name string, epoch uint64, checkEpoch bool) (*Volume, error) {
	v, err := s.volume(name)
	if err != nil {
		return nil, err
	}
	if v.State == VolumeDeleting {
		return nil, fmt.Errorf("meta: volume %q: %w", name, ErrVolumeDeleting)
	}
	if checkEpoch && epoch != v.CurrentEpoch() {
		return nil, fmt.Errorf("meta: volume %q: command of epoch %d, the volume is at epoch %d: %w", name, epoch, v.CurrentEpoch(), ErrStaleEpoch)
	}
	return v, nil
}

func checkReason(volume, reason string) error {
	if len(reason) > maxReason {
		return fmt.Errorf("meta: volume %q: reason of %d bytes, at most %d: %w", volume, len(reason), maxReason, ErrInvalid)
	}
	return nil
}

func (s *State) setReplicaState(c SetReplicaState) Result {
	v, err := s.replicaVolume(c.Volume, c.Epoch, true)
	if err != nil {
		return Result{Err: err}
	}
	if !c.State.valid() {
		return Result{Err: fmt.Errorf("meta: volume %q: replica state %q: %w", c.Volume, c.State, ErrInvalid)}
	}
	if err := checkReason(c.Volume, c.Reason); err != nil {
		return Result{Err: err}
	}
	if c.State == ReplicaFailed && c.Reason == "" {
		return Result{Err: fmt.Errorf("meta: volume %q: replica on %q failed without a reason: %w", c.Volume, c.Node, ErrInvalid)}
	}
	cur, ok := v.Replica(c.Node)
	if !ok {
		return Result{Err: fmt.Errorf("meta: volume %q has no replica on node %q: %w", c.Volume, c.Node, ErrUnknownNode)}
	}
	if c.Node == v.Node {
		// The primary's replica is in sync by definition; moving it
		// takes SetPrimary (a failover).
		return Result{Err: fmt.Errorf("meta: volume %q: replica on %q is the primary's: change the primary first (SetPrimary): %w", c.Volume, c.Node, ErrBadTransition)}
	}
	if !validReplicaMove(cur.State, c.State) {
		return Result{Err: fmt.Errorf("meta: volume %q: replica on %q: %s → %s: %w", c.Volume, c.Node, cur.State, c.State, ErrBadTransition)}
	}
	if cur.State == ReplicaFailed && c.State == ReplicaOutOfSync && !c.Full {
		return Result{Err: fmt.Errorf("meta: volume %q: replica on %q: failed → out-of-sync needs a full copy (Full): %w", c.Volume, c.Node, ErrBadTransition)}
	}
	i := v.explicit(c.Node)
	r := &v.Replicas[i]
	r.State, r.Reason, r.Since = c.State, c.Reason, c.At
	r.Full = (r.Full || c.Full) && c.State != ReplicaInSync
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) setPrimary(c SetPrimary) Result {
	v, err := s.replicaVolume(c.Volume, c.Epoch, true)
	if err != nil {
		return Result{Err: err}
	}
	n, err := s.node(c.Node)
	if err != nil {
		return Result{Err: err}
	}
	r, ok := v.Replica(c.Node)
	switch {
	case !ok:
		return Result{Err: fmt.Errorf("meta: volume %q has no replica on node %q: %w", c.Volume, c.Node, ErrUnknownNode)}
	case r.State != ReplicaInSync:
		return Result{Err: fmt.Errorf("meta: volume %q: replica on %q is %s, only an in-sync one may become primary: %w", c.Volume, c.Node, r.State, ErrBadTransition)}
	case n.State != NodeUp:
		return Result{Err: fmt.Errorf("meta: volume %q: node %q is %v: %w", c.Volume, c.Node, n.State, ErrNodeNotUp)}
	case c.Failover && c.Node == v.Node:
		return Result{Err: fmt.Errorf("meta: volume %q: a failover from node %q to itself: %w", c.Volume, c.Node, ErrInvalid)}
	}
	old := v.Node
	epoch := v.CurrentEpoch()
	v.explicit(c.Node)
	if c.Failover {
		o := &v.Replicas[slices.IndexFunc(v.Replicas, func(r Replica) bool { return r.Node == old })]
		o.State, o.Reason, o.Since = ReplicaOutOfSync, fmt.Sprintf("primary lost at epoch %d", epoch), c.At
	}
	v.Node = c.Node
	v.Epoch = epoch + 1
	cp := v.clone()
	return Result{Volume: &cp}
}

// checkNewReplica checks that node may take a new replica of v: known,
// up, holding none, in no zone of another replica but those of leaving
// (replicas on their way out: their zone is free for their replacement),
// with the capacity, and v at most MaxReplicas with it once drop
// replicas are dropped.
func (s *State) checkNewReplica(v *Volume, node string, drop int, leaving ...string) error {
	n, err := s.node(node)
	if err != nil {
		return err
	}
	// The existing replicas' nodes may have gone down since: only the
	// new one must be up, and no node or zone may repeat.
	if n.State != NodeUp {
		return fmt.Errorf("meta: volume %q: node %q is %v: %w", v.Name, node, n.State, ErrNodeNotUp)
	}
	set := v.ReplicaSet()
	if len(set)+1-drop > MaxReplicas {
		return fmt.Errorf("meta: volume %q: %d replicas, at most %d: %w", v.Name, len(set), MaxReplicas, ErrLimit)
	}
	for _, r := range set {
		if r.Node == node {
			return fmt.Errorf("meta: volume %q: node %q holds a replica already: %w", v.Name, node, ErrInvalid)
		}
		if slices.Contains(leaving, r.Node) {
			continue
		}
		if o, ok := s.nodes[r.Node]; ok && zoneOf(o) == zoneOf(n) {
			return fmt.Errorf("meta: volume %q: node %q is in zone %q with replica node %q: replicas need distinct zones: %w", v.Name, node, n.Zone, r.Node, ErrInvalid)
		}
	}
	if free := s.free(n); free < v.SizeBytes {
		return fmt.Errorf("meta: volume %q of %d bytes: node %q may be promised %d more bytes: %w", v.Name, v.SizeBytes, node, free, ErrNoCapacity)
	}
	return nil
}

// setReplicaSecret records secret (checked) as v's replica key pair
// when v has none.
func setReplicaSecret(v *Volume, secret *HostSecret) {
	if v.ReplicaSecret == nil && secret != nil {
		rs := *secret
		v.ReplicaSecret = &rs
	}
}

func (s *State) addReplica(c AddReplica) Result {
	v, err := s.replicaVolume(c.Volume, 0, false)
	if err != nil {
		return Result{Err: err}
	}
	if err := s.checkNewReplica(v, c.Node, 0); err != nil {
		return Result{Err: err}
	}
	if v.ReplicaSecret == nil {
		if err := checkReplicaSecret(c.Volume, c.ReplicaSecret); err != nil {
			return Result{Err: err}
		}
	}
	v.explicit(c.Node)
	setReplicaSecret(v, c.ReplicaSecret)
	v.Replicas = append(v.Replicas, Replica{Node: c.Node, State: ReplicaOutOfSync, Reason: "new replica", Since: c.At, Full: true})
	cp := v.clone()
	return Result{Volume: &cp}
}

// replaceReplica starts replacing c.Node's replica with one on c.New
// (see ReplaceReplica).
func (s *State) replaceReplica(c ReplaceReplica) Result {
	v, err := s.replicaVolume(c.Volume, 0, false)
	if err != nil {
		return Result{Err: err}
	}
	if err := checkReason(c.Volume, c.Reason); err != nil {
		return Result{Err: err}
	}
	old, ok := v.Replica(c.Node)
	if !ok {
		return Result{Err: fmt.Errorf("meta: volume %q has no replica on node %q: %w", c.Volume, c.Node, ErrUnknownNode)}
	}
	if old.ReplacedBy != "" {
		return Result{Err: fmt.Errorf("meta: volume %q: the replica on %q is being replaced by one on %q already: %w", c.Volume, c.Node, old.ReplacedBy, ErrInvalid)}
	}
	// The replica on c.Node may be the unfinished replacement of another
	// (its node failed during the copy): that one's replacement moves
	// to c.New, and c.Node's is dropped.
	origin := ""
	for _, r := range v.Replicas {
		if r.ReplacedBy == c.Node {
			origin = r.Node
		}
	}
	drop := 0
	if origin != "" {
		drop = 1
	}
	// Only the zones of the replica replaced (and of the replacement
	// dropped) are free: another replacement may yet be cancelled.
	if err := s.checkNewReplica(v, c.New, drop, c.Node, origin); err != nil {
		return Result{Err: err}
	}
	if origin != "" && c.Node == v.Node {
		// Unreachable: a replacement becomes primary only once in sync,
		// and then its origin is removed in the same round; refused so
		// that the primary is never dropped.
		return Result{Err: fmt.Errorf("meta: volume %q: the replica on %q is the primary's and the replacement of %q's: %w", c.Volume, c.Node, origin, ErrInvalid)}
	}
	if v.ReplicaSecret == nil {
		if err := checkReplicaSecret(c.Volume, c.ReplicaSecret); err != nil {
			return Result{Err: err}
		}
	}
	i := v.explicit(c.Node)
	setReplicaSecret(v, c.ReplicaSecret)
	reason := c.Reason
	if reason == "" {
		reason = "replacing the replica on " + c.Node
	}
	// The new replica comes right after the one it replaces, so that it
	// takes that one's place in placement order once it is removed (the
	// first replica is the primary failback returns to).
	nr := Replica{Node: c.New, State: ReplicaOutOfSync, Reason: reason, Since: c.At, Full: true}
	if origin != "" {
		o := slices.IndexFunc(v.Replicas, func(r Replica) bool { return r.Node == origin })
		v.Replicas[o].ReplacedBy = c.New
		if c.Reason == "" {
			nr.Reason = "replacing the replica on " + origin
		}
		v.Replicas[i] = nr
		v.dropSnapshotNode(c.Node)
	} else {
		v.Replicas[i].ReplacedBy = c.New
		v.Replicas = slices.Insert(v.Replicas, i+1, nr)
	}
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) removeReplica(c RemoveReplica) Result {
	v, err := s.replicaVolume(c.Volume, 0, false)
	if err != nil {
		return Result{Err: err}
	}
	r, ok := v.Replica(c.Node)
	switch {
	case !ok:
		return Result{Err: fmt.Errorf("meta: volume %q has no replica on node %q: %w", c.Volume, c.Node, ErrUnknownNode)}
	case c.Node == v.Node:
		return Result{Err: fmt.Errorf("meta: volume %q: the replica on %q is the primary's: change the primary first: %w", c.Volume, c.Node, ErrInvalid)}
	case c.Replaced && r.ReplacedBy == "":
		return Result{Err: fmt.Errorf("meta: volume %q: the replica on %q is not being replaced: %w", c.Volume, c.Node, ErrBadTransition)}
	case c.Replaced && !replacementInSync(v, r):
		return Result{Err: fmt.Errorf("meta: volume %q: the replica on %q replacing the one on %q is not in sync: %w", c.Volume, r.ReplacedBy, c.Node, ErrBadTransition)}
	case r.State == ReplicaInSync && len(v.InSync()) < 2:
		// Unreachable while the primary's replica is in sync; kept so
		// the invariant does not rest on one other check.
		return Result{Err: fmt.Errorf("meta: volume %q: the replica on %q is the last in sync: %w", c.Volume, c.Node, ErrInvalid)}
	}
	i := v.explicit(c.Node)
	v.Replicas = slices.Delete(v.Replicas, i, i+1)
	v.dropSnapshotNode(c.Node)
	// Removing a replacement cancels it: the replica it replaced stays.
	for j := range v.Replicas {
		if v.Replicas[j].ReplacedBy == c.Node {
			v.Replicas[j].ReplacedBy = ""
		}
	}
	cp := v.clone()
	return Result{Volume: &cp}
}

// replacementInSync says whether the replica replacing r is in sync.
func replacementInSync(v *Volume, r Replica) bool {
	n, ok := v.Replica(r.ReplacedBy)
	return ok && n.State == ReplicaInSync
}

// checkReplicas checks the replica invariants of a volume loaded from a
// snapshot: Node among the replicas and in sync, nodes known and distinct,
// states valid. Zones are not checked: a node may register again in
// another zone (docs/replication.md §1).
func (s *State) checkReplicas(v *Volume) error {
	if len(v.Replicas) == 0 {
		return nil
	}
	if len(v.Replicas) > MaxReplicas {
		return fmt.Errorf("%d replicas", len(v.Replicas))
	}
	primary := false
	for i, r := range v.Replicas {
		if _, ok := s.nodes[r.Node]; !ok || !r.State.valid() {
			return fmt.Errorf("replica %q %q", r.Node, r.State)
		}
		if slices.ContainsFunc(v.Replicas[:i], func(o Replica) bool { return o.Node == r.Node }) {
			return fmt.Errorf("two replicas on %q", r.Node)
		}
		if r.ReplacedBy != "" && (r.ReplacedBy == r.Node || !slices.ContainsFunc(v.Replicas, func(o Replica) bool { return o.Node == r.ReplacedBy })) {
			return fmt.Errorf("replica %q replaced by %q, which holds none", r.Node, r.ReplacedBy)
		}
		if r.Node == v.Node {
			if r.State != ReplicaInSync {
				return fmt.Errorf("primary %q is %s", r.Node, r.State)
			}
			primary = true
		}
	}
	if !primary {
		return fmt.Errorf("primary %q holds no replica", v.Node)
	}
	return nil
}
