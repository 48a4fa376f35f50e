package meta

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/nvme/resv"
)

// Limits. The registry is small and lives in memory on every replica; these
// bound its size and the cost of one snapshot (a full registry at the limits
// is a few tens of MiB of JSON).
const (
	// MaxNodes is MaxOrdinal: every node holds an ordinal.
	MaxNodes          = MaxOrdinal
	MaxVolumes        = 1 << 16
	MaxConnections    = 1 << 16
	MaxHostsPerVolume = 256
	MaxNameLen        = 128 // node IDs, volume names, addresses
	MaxNQNLen         = 223 // NVMe Base Specification: NQNs are at most 223 bytes
)

// NodeState is a storage node's administrative state.
type NodeState uint8

const (
	NodeUp       NodeState = 1 // serving, may receive new volumes and connections
	NodeDraining NodeState = 2 // serving existing volumes, no new ones
	NodeDown     NodeState = 3 // not serving
)

func (s NodeState) String() string {
	switch s {
	case NodeUp:
		return "up"
	case NodeDraining:
		return "draining"
	case NodeDown:
		return "down"
	}
	return fmt.Sprintf("node-state(%d)", uint8(s))
}

func (s NodeState) valid() bool { return s >= NodeUp && s <= NodeDown }

// MarshalText encodes the state by name, so commands and snapshots read
// well; an out-of-range value encodes as "node-state(N)", which no replica
// decodes.
func (s NodeState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText is MarshalText's inverse.
func (s *NodeState) UnmarshalText(b []byte) error {
	for v := NodeUp; v <= NodeDown; v++ {
		if v.String() == string(b) {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("meta: node state %q: %w", b, ErrInvalid)
}

// VolumeState is a volume's lifecycle state.
type VolumeState uint8

const (
	VolumeCreating VolumeState = 1 // registered; its node has not created it yet
	VolumeOnline   VolumeState = 2 // hosts may connect
	VolumeOffline  VolumeState = 3 // exists, refuses new connections
	VolumeDeleting VolumeState = 4 // being freed on its node; PurgeVolume forgets it
	VolumeFailed   VolumeState = 5 // its node cannot serve it; Volume.Reason says why
	VolumeDegraded VolumeState = 6 // served, but not fully (its node's disk is full: writes refused); Reason says why
)

func (s VolumeState) String() string {
	switch s {
	case VolumeCreating:
		return "creating"
	case VolumeOnline:
		return "online"
	case VolumeOffline:
		return "offline"
	case VolumeDeleting:
		return "deleting"
	case VolumeFailed:
		return "failed"
	case VolumeDegraded:
		return "degraded"
	}
	return fmt.Sprintf("volume-state(%d)", uint8(s))
}

// MarshalText encodes the state by name (see NodeState.MarshalText).
func (s VolumeState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText is MarshalText's inverse.
func (s *VolumeState) UnmarshalText(b []byte) error {
	for v := VolumeCreating; v <= VolumeDegraded; v++ {
		if v.String() == string(b) {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("meta: volume state %q: %w", b, ErrInvalid)
}

// validTransition says whether SetVolumeState may move from to to.
// VolumeDeleting is entered only through DeleteVolume and left only through
// PurgeVolume. VolumeFailed is the owner's report that it cannot serve the
// volume; a later successful reconcile moves it back to online (or
// offline), and a failed volume may be failed again with a new reason.
func validTransition(from, to VolumeState) bool {
	switch from {
	case VolumeCreating:
		return to == VolumeOnline || to == VolumeOffline || to == VolumeFailed || to == VolumeDegraded
	case VolumeOnline:
		return to == VolumeOffline || to == VolumeFailed || to == VolumeDegraded
	case VolumeOffline:
		return to == VolumeOnline || to == VolumeFailed
	case VolumeFailed, VolumeDegraded:
		return to == VolumeOnline || to == VolumeOffline || to == VolumeFailed || to == VolumeDegraded
	}
	return false
}

// NodeInfo is one registered storage node. TargetAddr (NVMe/RDMA) and
// TCPAddr (NVMe/TCP) are the host:port hosts connect to for its volumes:
// its advertised NVMe-oF addresses, which are not always the ones it
// listens on (NAT, a wildcard listen address). Either may be empty (the
// node does not serve that transport); nodes registered before NVMe/TCP
// have no TCPAddr until they register again.
type NodeInfo struct {
	ID         string    `json:"id"`
	TargetAddr string    `json:"target_addr"`
	TCPAddr    string    `json:"tcp_addr,omitempty"`
	MgmtAddr   string    `json:"mgmt_addr"`
	State      NodeState `json:"state"`
	// CapacityBytes: see RegisterNode.
	CapacityBytes uint64 `json:"capacity_bytes,omitempty"`
	// Zone: see RegisterNode. Snapshots written before zones have none.
	Zone string `json:"zone,omitempty"`
	// ReplicaAddr: see RegisterNode; read it through ReplicaTCPAddr.
	ReplicaAddr string `json:"replica_addr,omitempty"`
	// Features: see RegisterNode. Snapshots written before features
	// have none.
	Features []string `json:"features,omitempty"`
	// Ordinal is the node's small number, 1..MaxOrdinal, unique in the
	// cluster: the FSM gives a node the smallest one free when it
	// applies the node's first RegisterNode, or the first one after an
	// upgrade (0: a node registered before ordinals, until it registers
	// again), and it never changes while the node is registered. It
	// gives the node its share of NVMe controller IDs (CNTLIDRange) and
	// its discovery PORTIDs: every node of a volume exports one
	// subsystem NQN, and a Linux host refuses a second controller with
	// a CNTLID it already has in that subsystem.
	Ordinal int `json:"ordinal,omitempty"`
}

// Node ordinals and the controller IDs they stand for.
const (
	// CNTLIDsPerNode is how many NVMe controller IDs each ordinal owns:
	// as many as a target's default MaxControllers.
	CNTLIDsPerNode = 1024
	// MaxOrdinal is the largest ordinal: 63 × 1024 = 0xFC00 IDs fit
	// below NVMe's largest dynamic CNTLID, 0xFFEF; a 64th node's would
	// not. A cluster has at most this many nodes.
	MaxOrdinal = 63
)

// CNTLIDRange is the controller IDs ordinal k owns, (k−1)·1024+1 to
// k·1024, both included; ok is false for an ordinal outside
// 1..MaxOrdinal (0: a node without one).
func CNTLIDRange(ordinal int) (lo, hi uint16, ok bool) {
	if ordinal < 1 || ordinal > MaxOrdinal {
		return 0, 0, false
	}
	return uint16((ordinal-1)*CNTLIDsPerNode + 1), uint16(ordinal * CNTLIDsPerNode), true
}

// HasFeature says whether the node registered feature f.
func (n *NodeInfo) HasFeature(f string) bool { return slices.Contains(n.Features, f) }

func (n *NodeInfo) clone() NodeInfo {
	c := *n
	c.Features = slices.Clone(n.Features)
	return c
}

// Volume is one registered volume. Hosts is sorted.
type Volume struct {
	Name      string      `json:"name"`
	ID        uint64      `json:"id"`
	SizeBytes uint64      `json:"size_bytes"`
	BlockSize uint32      `json:"block_size"`
	Node      string      `json:"node"`
	State     VolumeState `json:"state"`
	NQN       string      `json:"nqn"`
	AllowAny  bool        `json:"allow_any,omitempty"`
	Hosts     []string    `json:"hosts,omitempty"`
	// Secrets are the DH-HMAC-CHAP secrets of the hosts that must
	// authenticate, by host NQN. They are secrets: the API never shows
	// them.
	Secrets   map[string]HostSecret `json:"secrets,omitempty"`
	CreatedAt int64                 `json:"created_at"` // Unix nanoseconds, from the command
	// Reason says why the volume is VolumeFailed (empty otherwise).
	Reason string `json:"reason,omitempty"`
	// ReplicaSecret authenticates the replica connections (see
	// CreateVolume); a secret, never shown by the API.
	ReplicaSecret *HostSecret `json:"replica_secret,omitempty"`
	// Replicas are the volume's copies in placement order, never two on
	// one node nor in one zone; Node's is always among them, in sync.
	// Empty for a volume written before replicas: ReplicaSet reads it as
	// one in-sync replica on Node. Read it through ReplicaSet.
	Replicas []Replica `json:"replicas,omitempty"`
	// Epoch counts changes of primary (+1 at every SetPrimary); 0 (a
	// volume written before epochs) reads as 1: see CurrentEpoch.
	Epoch uint64 `json:"epoch,omitempty"`
	// Want is the replication factor asked for at creation; 0 (written
	// before replicas) reads as 1: see WantReplicas.
	Want int `json:"want_replicas,omitempty"`

	// Snapshots (docs/snapshots.md §2.1) are the volume's snapshots in
	// creation order; they live on its nodes and have no NQN, host nor
	// connection. Read one through Snapshot or SnapshotByID.
	Snapshots []VolumeSnapshot `json:"snapshots,omitempty"`
	// Parent is the store parent of the volume's live map: the ID of a
	// snapshot (its own latest, the one it was reverted to, or its
	// origin's for a clone without snapshots); 0: none.
	Parent uint64 `json:"parent,omitempty"`
	// CloneOf is the snapshot a clone shares clusters with (nil: not a
	// clone, or flattened).
	CloneOf *SnapshotRef `json:"clone_of,omitempty"`
	// Flatten is set while a flatten asked for (FlattenVolume) runs.
	Flatten *FlattenState `json:"flatten,omitempty"`
	// Reverted is the log index of the last RevertVolume applied: the
	// stores' revert token. 0: never reverted.
	Reverted uint64 `json:"reverted,omitempty"`
	// Reservation is the NVMe reservation state of the volume's namespace
	// (docs/reservations.md §1.3), changed only by Reservation (Op 29) and
	// ClearReservation (Op 30); nil: nothing was ever registered (a
	// registry without reservations encodes as before).
	Reservation *resv.State `json:"reservation,omitempty"`
}

func (v *Volume) clone() Volume {
	c := *v
	c.Replicas = slices.Clone(v.Replicas)
	c.Hosts = slices.Clone(v.Hosts)
	c.Secrets = maps.Clone(v.Secrets)
	if v.ReplicaSecret != nil {
		rs := *v.ReplicaSecret
		c.ReplicaSecret = &rs
	}
	if v.Snapshots != nil {
		c.Snapshots = make([]VolumeSnapshot, len(v.Snapshots))
		for i := range v.Snapshots {
			c.Snapshots[i] = v.Snapshots[i].clone()
		}
	}
	if v.CloneOf != nil {
		r := *v.CloneOf
		c.CloneOf = &r
	}
	if v.Flatten != nil {
		f := *v.Flatten
		c.Flatten = &f
	}
	c.Reservation = v.Reservation.Clone()
	return c
}

// checkReplicaSecret checks a replica key pair, if there is one: both
// halves, DHHC-1, distinct. The registry does not require one (a node
// refuses to serve replica connections of a volume without it); the
// leader's control.Manager always proposes one.
func checkReplicaSecret(volume string, rs *HostSecret) error {
	if rs == nil {
		return nil
	}
	if rs.Host == "" || rs.Ctrl == "" {
		return fmt.Errorf("meta: volume %q: a replica secret needs both a host and a controller secret: %w", volume, ErrInvalid)
	}
	if err := checkSecrets(rs.Host, rs.Ctrl); err != nil {
		return fmt.Errorf("meta: volume %q: replica secret: %w", volume, err)
	}
	return nil
}

// HostSecret is a host's DH-HMAC-CHAP secrets on one volume, in the DHHC-1
// format: Host, which the host proves it holds, and Ctrl (optional), which
// the volume's controller proves it holds when the host asks.
type HostSecret struct {
	Host string `json:"host"`
	Ctrl string `json:"ctrl,omitempty"`
}

// MaxSecretLen bounds a DHHC-1 secret: 64 bytes and a CRC in base64
// with the prefix are 100 bytes.
const MaxSecretLen = 128

// checkSecrets checks the shape of a host's secrets: DHHC-1 strings (nvme
// gen-dhchap-key's format; meta stays out of the data plane, so
// control.Manager checks the encoding itself before it asks), a
// controller secret only with a host secret, and not the same one (a
// controller must not be able to answer with the host's own response).
func checkSecrets(host, ctrl string) error {
	if host == "" {
		if ctrl != "" {
			return fmt.Errorf("meta: a controller secret needs a host secret: %w", ErrInvalid)
		}
		return nil
	}
	for what, s := range map[string]string{"host secret": host, "controller secret": ctrl} {
		if s != "" && (!strings.HasPrefix(s, "DHHC-1:") || len(s) > MaxSecretLen) {
			return fmt.Errorf("meta: %s: not a DHHC-1 secret of at most %d bytes: %w", what, MaxSecretLen, ErrInvalid)
		}
	}
	if strings.TrimSuffix(host, ":") == strings.TrimSuffix(ctrl, ":") {
		return fmt.Errorf("meta: the controller secret must differ from the host secret: %w", ErrInvalid)
	}
	return nil
}

// Connection is a host attached to a volume through a node.
type Connection struct {
	HostNQN string `json:"host_nqn"`
	Volume  string `json:"volume"`
	Node    string `json:"node"`
	Since   int64  `json:"since"` // Unix nanoseconds, from the Connect command
}

type connKey struct{ host, volume, node string }

func (c *Connection) key() connKey { return connKey{c.HostNQN, c.Volume, c.Node} }

// maxReason bounds a failed volume's reason, in bytes.
const maxReason = 1024

// maxFeatures bounds a node's feature list.
const maxFeatures = 32

// DefaultNQN is the subsystem NQN a volume created without one gets.
func DefaultNQN(volume string) string { return "nqn.2024-01.io.blk:volume:" + volume }

// State is the registry. It is a pure state machine: Apply's effect depends
// only on the state and the command. State is not safe for concurrent use;
// FSM adds the locking raft needs.
type State struct {
	cluster string // the cluster's ID (SetClusterID); "" until set
	index   uint64 // log index of the last applied command
	nextVol uint64 // ID the next created volume gets; IDs are never reused
	nodes   map[string]*NodeInfo
	vols    map[string]*Volume
	nqns    map[string]string // subsystem NQN → volume name
	conns   map[connKey]*Connection
	snaps   map[uint64]string // snapshot ID → its volume's name
	hosts   map[string]*Host  // registered hosts by NQN (hosts.go)
}

// NewState returns an empty registry.
func NewState() *State {
	return &State{
		nextVol: 1,
		nodes:   make(map[string]*NodeInfo),
		vols:    make(map[string]*Volume),
		nqns:    make(map[string]string),
		conns:   make(map[connKey]*Connection),
		snaps:   make(map[uint64]string),
		hosts:   make(map[string]*Host),
	}
}

// Result is what applying one command yields. Err, when set, wraps one of
// the package's sentinel errors and the state is unchanged.
type Result struct {
	Index  uint64    // log index of the command (0 outside raft)
	Volume *Volume   // CreateVolume, ResizeVolume, SetVolumeState, ...: the volume after the command
	Node   *NodeInfo // RegisterNode, SetNodeState: the node after the command
	// Snapshot is the snapshot after CreateSnapshot, SnapshotDone,
	// DeleteSnapshot and SnapshotNodes (Volume is its volume).
	Snapshot *VolumeSnapshot
	// Reservation is the outcome of Reservation and ClearReservation
	// (Volume is the volume after it, its Reservation the state the
	// serving node publishes): the status the host gets, the notices to
	// post, the hosts to drain. A refused reservation command is an
	// Outcome, not an Err: it is logged, and every node computes it.
	Reservation *resv.Outcome
	// Host is the host after RegisterHost, the one forgotten by
	// UnregisterHost.
	Host *Host
	Err  error
}

// ApplyBytes decodes and applies one encoded command at log index index.
func (s *State) ApplyBytes(index uint64, b []byte) Result {
	c, err := DecodeCommand(b)
	if err != nil {
		s.index = index
		return Result{Index: index, Err: err}
	}
	return s.Apply(index, c)
}

// Apply applies c at log index index. A command that fails leaves the state
// unchanged except for the applied index.
func (s *State) Apply(index uint64, c Command) Result {
	var r Result
	switch c := c.(type) {
	case RegisterNode:
		r = s.registerNode(c)
	case SetNodeState:
		r = s.setNodeState(c)
	case RemoveNode:
		r = s.removeNode(c)
	case CreateVolume:
		r = s.createVolume(c)
	case SetVolumeState:
		r = s.setVolumeState(c)
	case ResizeVolume:
		r = s.resizeVolume(c)
	case DeleteVolume:
		r = s.deleteVolume(c)
	case PurgeVolume:
		r = s.purgeVolume(c)
	case AllowHost:
		r = s.allowHost(c)
	case DisallowHost:
		r = s.disallowHost(c)
	case SetAllowAny:
		r = s.setAllowAny(c)
	case Connect:
		r = s.connect(c)
	case Disconnect:
		r = s.disconnect(c)
	case SetClusterID:
		r = s.setClusterID(c)
	case SetReplicaState:
		r = s.setReplicaState(c)
	case SetPrimary:
		r = s.setPrimary(c)
	case AddReplica:
		r = s.addReplica(c)
	case RemoveReplica:
		r = s.removeReplica(c)
	case ReplaceReplica:
		r = s.replaceReplica(c)
	case CreateSnapshot:
		r = s.createSnapshot(c)
	case SnapshotDone:
		r = s.snapshotDone(c)
	case DeleteSnapshot:
		r = s.deleteSnapshot(c)
	case PurgeSnapshot:
		r = s.purgeSnapshot(c)
	case CloneVolume:
		r = s.cloneVolume(c)
	case FlattenVolume:
		r = s.flattenVolume(c)
	case FlattenDone:
		r = s.flattenDone(c)
	case RevertVolume:
		r = s.revertVolume(index, c)
	case SnapshotNodes:
		r = s.snapshotNodes(c)
	case Reservation:
		r = s.reservation(index, c)
	case ClearReservation:
		r = s.clearReservation(index, c)
	case RegisterHost:
		r = s.registerHost(c)
	case UnregisterHost:
		r = s.unregisterHost(c)
	default:
		r = Result{Err: fmt.Errorf("meta: command %T: %w", c, ErrBadCommand)}
	}
	s.index = index
	r.Index = index
	return r
}

// setClusterID names the cluster once; the same ID again is a no-op,
// another one is refused.
func (s *State) setClusterID(c SetClusterID) Result {
	if err := checkName("cluster ID", c.ID); err != nil {
		return Result{Err: err}
	}
	if s.cluster != "" && s.cluster != c.ID {
		return Result{Err: fmt.Errorf("meta: the registry belongs to cluster %s, not %s: %w", s.cluster, c.ID, ErrInvalid)}
	}
	s.cluster = c.ID
	return Result{}
}

// ClusterID is the cluster's ID, "" until SetClusterID.
func (s *State) ClusterID() string { return s.cluster }

func checkName(what, v string) error {
	if v == "" || len(v) > MaxNameLen {
		return fmt.Errorf("meta: %s %q: must be 1..%d bytes: %w", what, v, MaxNameLen, ErrInvalid)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("meta: %s %q: byte %d is not printable ASCII: %w", what, v, i, ErrInvalid)
		}
	}
	return nil
}

// CheckVolumeName checks a new volume's name against the name grammar
// (api.CheckName: letters, digits, '.', '_', '-', starting with a letter
// or a digit, at most MaxNameLen bytes). The error wraps ErrInvalid and
// api.ErrName.
func CheckVolumeName(name string) error { return checkNewName("volume name", name) }

// CheckNodeID checks a new node's ID against the name grammar, as
// CheckVolumeName.
func CheckNodeID(id string) error { return checkNewName("node ID", id) }

// CheckZone checks a node's zone against the name grammar, as
// CheckVolumeName. Zones are new, so every zone in the log is in it.
func CheckZone(zone string) error { return checkNewName("zone", zone) }

func checkNewName(what, v string) error {
	if err := api.CheckName(what, v); err != nil {
		return fmt.Errorf("meta: %w: %w", err, ErrInvalid)
	}
	return nil
}

// LegacyName reports whether a volume name or node ID held by the
// registry is outside the name grammar: written by an older blkd, before
// the grammar was enforced. Such a name loads and works as before, but
// cannot be used in an API path; it should be deleted (docs/blkctl.md).
func LegacyName(name string) bool { return api.CheckName("name", name) != nil }

func checkNQN(v string) error {
	if len(v) > MaxNQNLen || !strings.HasPrefix(v, "nqn.") {
		return fmt.Errorf("meta: NQN %q: must start with \"nqn.\" and be at most %d bytes: %w", v, MaxNQNLen, ErrInvalid)
	}
	return checkName("NQN", v[:min(len(v), MaxNameLen)])
}

func (s *State) registerNode(c RegisterNode) Result {
	if err := checkName("node ID", c.ID); err != nil {
		return Result{Err: err}
	}
	if c.TargetAddr == "" && c.TCPAddr == "" {
		return Result{Err: fmt.Errorf("meta: node %q registers no NVMe address (RDMA or TCP): %w", c.ID, ErrInvalid)}
	}
	if c.TargetAddr != "" {
		if err := checkName("target address", c.TargetAddr); err != nil {
			return Result{Err: err}
		}
	}
	if c.TCPAddr != "" {
		if err := checkName("TCP target address", c.TCPAddr); err != nil {
			return Result{Err: err}
		}
	}
	if err := checkName("management address", c.MgmtAddr); err != nil {
		return Result{Err: err}
	}
	if c.Zone != "" {
		if err := checkName("zone", c.Zone); err != nil {
			return Result{Err: err}
		}
	}
	if c.ReplicaAddr != "" {
		if err := checkName("replica address", c.ReplicaAddr); err != nil {
			return Result{Err: err}
		}
	}
	if len(c.Features) > maxFeatures {
		return Result{Err: fmt.Errorf("meta: node %q: %d features, at most %d: %w", c.ID, len(c.Features), maxFeatures, ErrLimit)}
	}
	for _, f := range c.Features {
		if err := checkName("feature", f); err != nil {
			return Result{Err: err}
		}
	}
	n, ok := s.nodes[c.ID]
	if !ok && len(s.nodes) >= MaxNodes {
		return Result{Err: fmt.Errorf("meta: node %q: the cluster has %d nodes, the most it can (each needs one of the %d node ordinals, which share the NVMe controller IDs): remove a node first: %w", c.ID, MaxNodes, MaxOrdinal, ErrLimit)}
	}
	ordinal := 0
	if !ok || n.Ordinal == 0 {
		if ordinal = s.freeOrdinal(); ordinal == 0 {
			return Result{Err: fmt.Errorf("meta: node %q: every node ordinal (1..%d) is held by another node: remove a node first: %w", c.ID, MaxOrdinal, ErrLimit)}
		}
	}
	if !ok {
		n = &NodeInfo{ID: c.ID, State: NodeUp}
		s.nodes[c.ID] = n
	}
	if ordinal != 0 {
		n.Ordinal = ordinal
	}
	n.TargetAddr, n.TCPAddr, n.MgmtAddr, n.Zone, n.ReplicaAddr = c.TargetAddr, c.TCPAddr, c.MgmtAddr, c.Zone, c.ReplicaAddr
	n.Features = slices.Clone(c.Features)
	if c.CapacityBytes != 0 {
		n.CapacityBytes = c.CapacityBytes
	}
	cp := n.clone()
	return Result{Node: &cp}
}

// freeOrdinal is the smallest ordinal no node holds, 0 if none is free.
// A function of the registry alone, so every replica of it gives a
// registering node the same one.
func (s *State) freeOrdinal() int {
	var used uint64 // bit k: ordinal k held; MaxOrdinal < 64
	for _, n := range s.nodes {
		if n.Ordinal > 0 && n.Ordinal <= MaxOrdinal {
			used |= 1 << n.Ordinal
		}
	}
	for k := 1; k <= MaxOrdinal; k++ {
		if used&(1<<k) == 0 {
			return k
		}
	}
	return 0
}

// ReplicaTCPAddr is where other nodes reach n's NVMe/TCP port for
// replica connections: its ReplicaAddr, else its TCPAddr.
func (n *NodeInfo) ReplicaTCPAddr() string {
	if n.ReplicaAddr != "" {
		return n.ReplicaAddr
	}
	return n.TCPAddr
}

func (s *State) node(id string) (*NodeInfo, error) {
	n, ok := s.nodes[id]
	if !ok {
		return nil, fmt.Errorf("meta: node %q: %w", id, ErrUnknownNode)
	}
	return n, nil
}

func (s *State) setNodeState(c SetNodeState) Result {
	n, err := s.node(c.ID)
	if err != nil {
		return Result{Err: err}
	}
	if !c.State.valid() {
		return Result{Err: fmt.Errorf("meta: node %q: state %v: %w", c.ID, c.State, ErrInvalid)}
	}
	n.State = c.State
	cp := n.clone()
	return Result{Node: &cp}
}

func (s *State) removeNode(c RemoveNode) Result {
	if _, err := s.node(c.ID); err != nil {
		return Result{Err: err}
	}
	for _, v := range s.vols {
		if v.Node == c.ID {
			return Result{Err: fmt.Errorf("meta: node %q owns volume %q: %w", c.ID, v.Name, ErrNodeInUse)}
		}
		if _, ok := v.Replica(c.ID); ok {
			return Result{Err: fmt.Errorf("meta: node %q holds a replica of volume %q: %w", c.ID, v.Name, ErrNodeInUse)}
		}
	}
	for k := range s.conns {
		if k.node == c.ID {
			return Result{Err: fmt.Errorf("meta: node %q carries a connection of %q: %w", c.ID, k.host, ErrNodeInUse)}
		}
	}
	delete(s.nodes, c.ID)
	return Result{}
}

func (s *State) volume(name string) (*Volume, error) {
	v, ok := s.vols[name]
	if !ok {
		return nil, fmt.Errorf("meta: volume %q: %w", name, ErrUnknownVolume)
	}
	return v, nil
}

func checkSize(size uint64, bs uint32) error {
	if size == 0 || size%uint64(bs) != 0 {
		return fmt.Errorf("meta: size %d, block size %d: %w", size, bs, ErrSizeNotMultiple)
	}
	return nil
}

// Check is what CreateVolume requires of its own fields, whatever the
// registry holds: a caller checks it before proposing the command, so a
// bad request never reaches the log. The name must be in the name
// grammar (CheckVolumeName); Apply does not ask that of a committed
// entry (see checkCommitted).
func (c CreateVolume) Check() error {
	if err := CheckVolumeName(c.Name); err != nil {
		return err
	}
	return c.checkCommitted()
}

// checkCommitted is what Apply requires of a CreateVolume: Check without
// the name grammar, which came later. A log or snapshot written before it
// may hold a volume named ".", "a/b" or "%2e%2e"; replaying it must build
// the same registry as before, or such a volume (and its data) would
// vanish on restart. The grammar is enforced where commands are proposed
// (Check, Node.Apply); such names are reported (LegacyName) and can be
// deleted.
func (c CreateVolume) checkCommitted() error {
	if err := checkName("volume name", c.Name); err != nil {
		return err
	}
	if c.BlockSize != 512 && c.BlockSize != 4096 {
		return fmt.Errorf("meta: volume %q: block size %d: %w", c.Name, c.BlockSize, ErrBadBlockSize)
	}
	if err := checkSize(c.SizeBytes, c.BlockSize); err != nil {
		return err
	}
	nqn := c.NQN
	if nqn == "" {
		nqn = DefaultNQN(c.Name)
	}
	return checkNQN(nqn)
}

func (s *State) createVolume(c CreateVolume) Result {
	if err := c.checkCommitted(); err != nil {
		return Result{Err: err}
	}
	nqn := c.NQN
	if nqn == "" {
		nqn = DefaultNQN(c.Name)
	}
	if _, ok := s.vols[c.Name]; ok {
		return Result{Err: fmt.Errorf("meta: volume %q: %w", c.Name, ErrVolumeExists)}
	}
	if other, ok := s.nqns[nqn]; ok {
		return Result{Err: fmt.Errorf("meta: NQN %q belongs to volume %q: %w", nqn, other, ErrNQNInUse)}
	}
	n, err := s.node(c.Node)
	if err != nil {
		return Result{Err: err}
	}
	if n.State != NodeUp {
		return Result{Err: fmt.Errorf("meta: node %q is %v: %w", n.ID, n.State, ErrNodeNotUp)}
	}
	if len(c.Replicas) > 0 {
		if c.Replicas[0] != c.Node {
			return Result{Err: fmt.Errorf("meta: volume %q: first replica %q is not the primary %q: %w", c.Name, c.Replicas[0], c.Node, ErrInvalid)}
		}
		if err := s.checkReplicaNodes(c.Name, c.Replicas); err != nil {
			return Result{Err: err}
		}
		if err := checkReplicaSecret(c.Name, c.ReplicaSecret); err != nil {
			return Result{Err: err}
		}
	}
	if len(s.vols) >= MaxVolumes {
		return Result{Err: fmt.Errorf("meta: %d volumes: %w", MaxVolumes, ErrLimit)}
	}
	v := &Volume{
		Name: c.Name, ID: s.nextVol, SizeBytes: c.SizeBytes, BlockSize: c.BlockSize,
		Node: c.Node, State: VolumeCreating, NQN: nqn, CreatedAt: c.At,
	}
	if len(c.Replicas) > 0 {
		// A new volume reads as zeros everywhere: every copy is in sync.
		for _, n := range c.Replicas {
			v.Replicas = append(v.Replicas, Replica{Node: n, State: ReplicaInSync, Since: c.At})
		}
		v.Epoch, v.Want = 1, len(c.Replicas)
		if c.ReplicaSecret != nil {
			rs := *c.ReplicaSecret
			v.ReplicaSecret = &rs
		}
	}
	s.nextVol++
	s.vols[v.Name] = v
	s.nqns[nqn] = v.Name
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) setVolumeState(c SetVolumeState) Result {
	v, err := s.volume(c.Name)
	if err != nil {
		return Result{Err: err}
	}
	if !validTransition(v.State, c.State) {
		return Result{Err: fmt.Errorf("meta: volume %q: %v → %v: %w", c.Name, v.State, c.State, ErrBadTransition)}
	}
	if (c.State == VolumeFailed || c.State == VolumeDegraded) && c.Reason == "" {
		return Result{Err: fmt.Errorf("meta: volume %q: failed without a reason: %w", c.Name, ErrInvalid)}
	}
	if len(c.Reason) > maxReason {
		return Result{Err: fmt.Errorf("meta: volume %q: reason of %d bytes, at most %d: %w", c.Name, len(c.Reason), maxReason, ErrInvalid)}
	}
	v.State = c.State
	v.Reason = ""
	if c.State == VolumeFailed || c.State == VolumeDegraded {
		v.Reason = c.Reason
	}
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) resizeVolume(c ResizeVolume) Result {
	v, err := s.volume(c.Name)
	if err != nil {
		return Result{Err: err}
	}
	if v.State == VolumeDeleting {
		return Result{Err: fmt.Errorf("meta: volume %q: %w", c.Name, ErrVolumeDeleting)}
	}
	if err := checkSize(c.SizeBytes, v.BlockSize); err != nil {
		return Result{Err: err}
	}
	if c.SizeBytes < v.SizeBytes {
		return Result{Err: fmt.Errorf("meta: volume %q: %d < %d bytes: %w", c.Name, c.SizeBytes, v.SizeBytes, ErrShrink)}
	}
	if sn := v.creatingSnapshot(); sn != nil && c.SizeBytes != v.SizeBytes {
		// The snapshot records the size it was asked at; its nodes
		// must take it at that size.
		return Result{Err: fmt.Errorf("meta: volume %q: snapshot %s is being taken: resize it once that is done: %w", c.Name, snapName(v.Name, sn.Name), ErrBusy)}
	}
	v.SizeBytes = c.SizeBytes
	cp := v.clone()
	return Result{Volume: &cp}
}

// dropConns removes the connections to volume (of host, if host != "").
func (s *State) dropConns(volume, host string) {
	for k := range s.conns {
		if k.volume == volume && (host == "" || k.host == host) {
			delete(s.conns, k)
		}
	}
}

func (s *State) countConns(volume, host string) int {
	n := 0
	for k := range s.conns {
		if k.volume == volume && (host == "" || k.host == host) {
			n++
		}
	}
	return n
}

func (s *State) deleteVolume(c DeleteVolume) Result {
	v, err := s.volume(c.Name)
	if err != nil {
		return Result{Err: err}
	}
	if v.State == VolumeDeleting {
		return Result{Err: fmt.Errorf("meta: volume %q: %w", c.Name, ErrVolumeDeleting)}
	}
	if n := s.countConns(c.Name, ""); n > 0 && !c.Force {
		return Result{Err: fmt.Errorf("meta: volume %q: %d connections: %w", c.Name, n, ErrHasConnections)}
	}
	if err := s.checkDeleteSnapshots(v, c.WithSnapshots); err != nil {
		return Result{Err: err}
	}
	s.dropConns(c.Name, "")
	v.State = VolumeDeleting
	v.Reservation = nil // no host may reach it any more
	for i := range v.Snapshots {
		v.Snapshots[i].State = SnapshotDeleting
	}
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) purgeVolume(c PurgeVolume) Result {
	v, err := s.volume(c.Name)
	if err != nil {
		return Result{Err: err}
	}
	if v.State != VolumeDeleting {
		return Result{Err: fmt.Errorf("meta: purge volume %q in state %v: %w", c.Name, v.State, ErrBadTransition)}
	}
	if len(v.Snapshots) > 0 {
		// Its snapshots' records are how the nodes know to free them.
		return Result{Err: fmt.Errorf("meta: purge volume %q: its snapshots %s are not purged yet: %w", c.Name, strings.Join(v.snapshotNames(true), ", "), ErrHasSnapshots)}
	}
	// DeleteVolume dropped the connections and Connect refuses a deleting
	// volume, so none can remain.
	if n := s.countConns(c.Name, ""); n != 0 {
		panic(fmt.Sprintf("meta: invariant: deleting volume %q has %d connections", c.Name, n))
	}
	delete(s.nqns, v.NQN)
	delete(s.vols, c.Name)
	return Result{}
}

func (s *State) allowHost(c AllowHost) Result {
	v, err := s.volume(c.Volume)
	if err != nil {
		return Result{Err: err}
	}
	if err := c.Check(); err != nil {
		return Result{Err: err}
	}
	i, found := slices.BinarySearch(v.Hosts, c.HostNQN)
	if !found {
		if len(v.Hosts) >= MaxHostsPerVolume {
			return Result{Err: fmt.Errorf("meta: volume %q: %d hosts: %w", c.Volume, MaxHostsPerVolume, ErrLimit)}
		}
		v.Hosts = slices.Insert(v.Hosts, i, c.HostNQN)
	}
	if c.Secret != "" {
		if v.Secrets == nil {
			v.Secrets = make(map[string]HostSecret)
		}
		v.Secrets[c.HostNQN] = HostSecret{Host: c.Secret, Ctrl: c.CtrlSecret}
	}
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) disallowHost(c DisallowHost) Result {
	v, err := s.volume(c.Volume)
	if err != nil {
		return Result{Err: err}
	}
	if n := s.countConns(c.Volume, c.HostNQN); n > 0 && !v.AllowAny {
		if !c.Force {
			return Result{Err: fmt.Errorf("meta: volume %q: host %q has %d connections: %w", c.Volume, c.HostNQN, n, ErrHasConnections)}
		}
		s.dropConns(c.Volume, c.HostNQN)
	}
	i, found := slices.BinarySearch(v.Hosts, c.HostNQN)
	if !found {
		return Result{Err: fmt.Errorf("meta: volume %q: host %q: %w", c.Volume, c.HostNQN, ErrHostNotAllowed)}
	}
	v.Hosts = slices.Delete(v.Hosts, i, i+1)
	delete(v.Secrets, c.HostNQN)
	if len(v.Secrets) == 0 {
		v.Secrets = nil
	}
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) setAllowAny(c SetAllowAny) Result {
	v, err := s.volume(c.Volume)
	if err != nil {
		return Result{Err: err}
	}
	if !c.AllowAny && v.AllowAny {
		// Hosts connected only because any host was allowed must go first.
		for k := range s.conns {
			if k.volume == c.Volume {
				if _, ok := slices.BinarySearch(v.Hosts, k.host); !ok {
					return Result{Err: fmt.Errorf("meta: volume %q: host %q is connected and not in the allow list: %w", c.Volume, k.host, ErrHasConnections)}
				}
			}
		}
	}
	v.AllowAny = c.AllowAny
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) connect(c Connect) Result {
	v, err := s.volume(c.Volume)
	if err != nil {
		return Result{Err: err}
	}
	if err := checkNQN(c.HostNQN); err != nil {
		return Result{Err: err}
	}
	n, err := s.node(c.Node)
	if err != nil {
		return Result{Err: err}
	}
	if n.State != NodeUp {
		return Result{Err: fmt.Errorf("meta: node %q is %v: %w", n.ID, n.State, ErrNodeNotUp)}
	}
	if v.State != VolumeOnline && v.State != VolumeDegraded {
		return Result{Err: fmt.Errorf("meta: volume %q is %v: %w", v.Name, v.State, ErrVolumeNotOnline)}
	}
	if _, ok := slices.BinarySearch(v.Hosts, c.HostNQN); !ok && !v.AllowAny {
		return Result{Err: fmt.Errorf("meta: volume %q: host %q: %w", v.Name, c.HostNQN, ErrHostNotAllowed)}
	}
	k := connKey{c.HostNQN, c.Volume, c.Node}
	if _, ok := s.conns[k]; ok {
		return Result{Err: fmt.Errorf("meta: %q on %q through %q: %w", c.HostNQN, c.Volume, c.Node, ErrAlreadyConnected)}
	}
	if len(s.conns) >= MaxConnections {
		return Result{Err: fmt.Errorf("meta: %d connections: %w", MaxConnections, ErrLimit)}
	}
	s.conns[k] = &Connection{HostNQN: c.HostNQN, Volume: c.Volume, Node: c.Node, Since: c.At}
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) disconnect(c Disconnect) Result {
	k := connKey{c.HostNQN, c.Volume, c.Node}
	if _, ok := s.conns[k]; !ok {
		return Result{Err: fmt.Errorf("meta: %q on %q through %q: %w", c.HostNQN, c.Volume, c.Node, ErrNotConnected)}
	}
	delete(s.conns, k)
	return Result{}
}

// Index returns the log index of the last applied command.
func (s *State) Index() uint64 { return s.index }

// Volume returns a copy of the named volume.
func (s *State) Volume(name string) (Volume, bool) {
	v, ok := s.vols[name]
	if !ok {
		return Volume{}, false
	}
	return v.clone(), true
}

// NodeCount is how many nodes are registered.
func (s *State) NodeCount() int { return len(s.nodes) }

// Node returns a copy of the node with that ID.
func (s *State) Node(id string) (NodeInfo, bool) {
	n, ok := s.nodes[id]
	if !ok {
		return NodeInfo{}, false
	}
	return n.clone(), true
}

// Snapshot is the registry in canonical form: every list sorted by its key.
// It is both the snapshot encoding and what readers get.
type Snapshot struct {
	Version      int          `json:"version"`
	ClusterID    string       `json:"cluster_id,omitempty"`
	Index        uint64       `json:"index"`
	NextVolumeID uint64       `json:"next_volume_id"`
	Nodes        []NodeInfo   `json:"nodes"`
	Volumes      []Volume     `json:"volumes"`
	Connections  []Connection `json:"connections"`
	// Hosts are the registered hosts (hosts.go), sorted by NQN; left out
	// when there are none, so a registry without them encodes as before.
	Hosts []Host `json:"hosts,omitempty"`
}

// SnapshotVersion is the version of the Snapshot encoding.
const SnapshotVersion = 1

// Export returns a deep copy of the registry in canonical (sorted) form.
func (s *State) Export() Snapshot {
	out := Snapshot{
		Version: SnapshotVersion, ClusterID: s.cluster, Index: s.index, NextVolumeID: s.nextVol,
		Nodes:       make([]NodeInfo, 0, len(s.nodes)),
		Volumes:     make([]Volume, 0, len(s.vols)),
		Connections: make([]Connection, 0, len(s.conns)),
	}
	for _, n := range s.nodes {
		out.Nodes = append(out.Nodes, n.clone())
	}
	for _, v := range s.vols {
		out.Volumes = append(out.Volumes, v.clone())
	}
	for _, c := range s.conns {
		out.Connections = append(out.Connections, *c)
	}
	slices.SortFunc(out.Nodes, func(a, b NodeInfo) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(out.Volumes, func(a, b Volume) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(out.Connections, func(a, b Connection) int {
		return cmp.Or(cmp.Compare(a.Volume, b.Volume), cmp.Compare(a.HostNQN, b.HostNQN), cmp.Compare(a.Node, b.Node))
	})
	if len(s.hosts) > 0 {
		out.Hosts = s.Hosts()
	}
	return out
}

// MarshalState encodes the registry canonically: equal states give equal bytes.
func (s *State) MarshalState() []byte {
	b, err := json.Marshal(s.Export())
	if err != nil {
		// Only plain strings, integers and bools: Marshal cannot fail.
		panic(fmt.Sprintf("meta: marshal state: %v", err))
	}
	return b
}

// UnmarshalState decodes what MarshalState wrote, checking the invariants a
// live state keeps.
func UnmarshalState(b []byte) (*State, error) {
	var snap Snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		return nil, fmt.Errorf("meta: snapshot: %v: %w", err, ErrBadSnapshot)
	}
	if snap.Version != SnapshotVersion {
		return nil, fmt.Errorf("meta: snapshot version %d, want %d: %w", snap.Version, SnapshotVersion, ErrBadSnapshot)
	}
	s := NewState()
	s.index, s.nextVol, s.cluster = snap.Index, snap.NextVolumeID, snap.ClusterID
	bad := func(format string, a ...any) (*State, error) {
		return nil, fmt.Errorf("meta: snapshot: "+format+": %w", append(a, ErrBadSnapshot)...)
	}
	var ordinals uint64 // as freeOrdinal's
	for i := range snap.Nodes {
		n := snap.Nodes[i]
		if _, dup := s.nodes[n.ID]; dup || !n.State.valid() {
			return bad("node %q", n.ID)
		}
		if n.Ordinal != 0 {
			if n.Ordinal < 0 || n.Ordinal > MaxOrdinal || ordinals&(1<<n.Ordinal) != 0 {
				return bad("node %q: ordinal %d out of 1..%d or another node's", n.ID, n.Ordinal, MaxOrdinal)
			}
			ordinals |= 1 << n.Ordinal
		}
		s.nodes[n.ID] = &n
	}
	for i := range snap.Volumes {
		v := snap.Volumes[i]
		_, dup := s.vols[v.Name]
		_, dupNQN := s.nqns[v.NQN]
		_, nodeOK := s.nodes[v.Node]
		stateOK := v.State >= VolumeCreating && v.State <= VolumeDegraded
		sizeOK := (v.BlockSize == 512 || v.BlockSize == 4096) && checkSize(v.SizeBytes, v.BlockSize) == nil
		if dup || dupNQN || !nodeOK || !stateOK || !sizeOK || v.ID == 0 || v.ID >= s.nextVol || !slices.IsSorted(v.Hosts) {
			return bad("volume %q", v.Name)
		}
		if err := s.checkReplicas(&v); err != nil {
			return bad("volume %q: %v", v.Name, err)
		}
		if err := resv.Check(v.Reservation); err != nil {
			return bad("volume %q: %v", v.Name, err)
		}
		for h, sec := range v.Secrets {
			if _, ok := slices.BinarySearch(v.Hosts, h); !ok || checkSecrets(sec.Host, sec.Ctrl) != nil || sec.Host == "" {
				return bad("volume %q: secrets of host %q", v.Name, h)
			}
		}
		s.vols[v.Name] = &v
		s.nqns[v.NQN] = v.Name
		for _, sn := range v.Snapshots {
			s.snaps[sn.ID] = v.Name // duplicates: checkSnapshots refuses them
		}
	}
	if err := s.checkSnapshots(); err != nil {
		return bad("%v", err)
	}
	for i := range snap.Connections {
		c := snap.Connections[i]
		v, volOK := s.vols[c.Volume]
		volOK = volOK && v.State != VolumeDeleting
		_, nodeOK := s.nodes[c.Node]
		if _, dup := s.conns[c.key()]; dup || !volOK || !nodeOK {
			return bad("connection %q/%q/%q", c.HostNQN, c.Volume, c.Node)
		}
		s.conns[c.key()] = &c
	}
	if err := s.restoreHosts(snap.Hosts); err != nil {
		return bad("%v", err)
	}
	return s, nil
}
