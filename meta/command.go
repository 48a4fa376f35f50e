package meta

import (
	"encoding/json"
	"fmt"
)

// CommandVersion is the encoding version written in the first byte of every
// command. A replica refuses (as a typed result, ErrBadCommand) a version it
// does not know, so an old binary never misreads a newer log.
const CommandVersion = 1

// Op identifies a command. Values are part of the log format: never reuse or
// renumber one.
type Op uint8

const (
	OpRegisterNode   Op = 1
	OpSetNodeState   Op = 2
	OpRemoveNode     Op = 3
	OpCreateVolume   Op = 4
	OpSetVolumeState Op = 5
	OpResizeVolume   Op = 6
	OpDeleteVolume   Op = 7
	OpPurgeVolume    Op = 8
	OpAllowHost      Op = 9
	OpDisallowHost   Op = 10
	OpSetAllowAny    Op = 11
	OpConnect        Op = 12
	OpDisconnect     Op = 13
	OpSetClusterID   Op = 14
	// Replicas (docs/replication.md §1).
	OpSetReplicaState Op = 15
	OpSetPrimary      Op = 16
	OpAddReplica      Op = 17
	OpRemoveReplica   Op = 18
	// Replace and move (docs/replication.md §6).
	OpReplaceReplica Op = 19
	// Snapshots and clones (docs/snapshots.md §2.2).
	OpCreateSnapshot Op = 20
	OpSnapshotDone   Op = 21
	OpDeleteSnapshot Op = 22
	OpPurgeSnapshot  Op = 23
	OpCloneVolume    Op = 24
	OpFlattenVolume  Op = 25
	OpFlattenDone    Op = 26
	OpRevertVolume   Op = 27
	OpSnapshotNodes  Op = 28
	// Reservations (docs/reservations.md §1.3).
	OpReservation      Op = 29
	OpClearReservation Op = 30
	// Registered hosts (docs/operations.md §1.9; hosts.go).
	OpRegisterHost   Op = 31
	OpUnregisterHost Op = 32
)

var opNames = map[Op]string{
	OpRegisterNode: "register-node", OpSetNodeState: "set-node-state",
	OpRemoveNode: "remove-node", OpCreateVolume: "create-volume",
	OpSetVolumeState: "set-volume-state", OpResizeVolume: "resize-volume",
	OpDeleteVolume: "delete-volume", OpPurgeVolume: "purge-volume",
	OpAllowHost: "allow-host", OpDisallowHost: "disallow-host",
	OpSetAllowAny: "set-allow-any", OpConnect: "connect", OpDisconnect: "disconnect",
	OpSetClusterID:    "set-cluster-id",
	OpSetReplicaState: "set-replica-state", OpSetPrimary: "set-primary",
	OpAddReplica: "add-replica", OpRemoveReplica: "remove-replica",
	OpReplaceReplica: "replace-replica",
	OpCreateSnapshot: "create-snapshot", OpSnapshotDone: "snapshot-done",
	OpDeleteSnapshot: "delete-snapshot", OpPurgeSnapshot: "purge-snapshot",
	OpCloneVolume: "clone-volume", OpFlattenVolume: "flatten-volume",
	OpFlattenDone: "flatten-done", OpRevertVolume: "revert-volume",
	OpSnapshotNodes:    "snapshot-nodes",
	OpReservation:      "reservation",
	OpClearReservation: "clear-reservation",
	OpRegisterHost:     "register-host",
	OpUnregisterHost:   "unregister-host",
}

func (o Op) String() string {
	if s, ok := opNames[o]; ok {
		return s
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Command is one registry mutation. Every field a command's effect depends
// on, including time, is in the command: Apply never reads a clock.
type Command interface {
	Op() Op
}

// RegisterNode adds a storage node, or updates the addresses of a known one
// (a node re-registers after a restart). A new node starts NodeUp. A node
// without an ordinal (a new one, or one registered before ordinals) gets
// the smallest free one (NodeInfo.Ordinal), and keeps it; when none is
// free (MaxNodes nodes) the command is refused with ErrLimit.
type RegisterNode struct {
	ID         string `json:"id"`
	TargetAddr string `json:"target_addr"` // host:port hosts reach its NVMe/RDMA port at (its advertised address); "": none
	// TCPAddr is the host:port hosts reach its NVMe/TCP port at (its
	// advertised address); "": none. A node has at least one of the two.
	TCPAddr  string `json:"tcp_addr,omitempty"`
	MgmtAddr string `json:"mgmt_addr"` // host:port of its management API
	// CapacityBytes is how many bytes of volumes the node may be promised
	// (its store's filesystem times its overcommit ratio); 0: unknown,
	// no limit. Updated on every registration.
	CapacityBytes uint64 `json:"capacity_bytes,omitempty"`
	// ReplicaAddr is the host:port other nodes reach its NVMe/TCP port at,
	// for the replica connections of replicated volumes (its listen
	// address; hosts may be told another, TCPAddr, behind NAT); "": as
	// TCPAddr. Updated on every registration.
	ReplicaAddr string `json:"replica_addr,omitempty"`
	// Zone is the node's failure domain (blkd --zone), in the name
	// grammar; "": none, the node is a domain of its own. Placement never
	// puts two replicas of a volume in one zone. Updated on every
	// registration (a node restarted without --zone leaves its zone);
	// entries written before zones have none.
	Zone string `json:"zone,omitempty"`
	// Features are what the node's binary can do that an older one
	// cannot (FeatureReplication); the leader proposes a command only
	// every node can apply. Updated on every registration.
	Features []string `json:"features,omitempty"`
}

// FeatureReplication: the node applies the replica commands
// (SetReplicaState, SetPrimary, AddReplica, RemoveReplica) and
// CreateVolume's Replicas, and keeps secondary replicas in its store.
const FeatureReplication = "replication"

// FeatureReplace: the node applies ReplaceReplica and keeps
// Replica.ReplacedBy (volume replace-replica and move). A binary without
// it would apply the other replica commands but not this one.
const FeatureReplace = "replace"

// FeatureSnapshots: the node applies the snapshot commands (Op 20 to 28:
// CreateSnapshot, SnapshotDone, DeleteSnapshot, PurgeSnapshot,
// CloneVolume, FlattenVolume, FlattenDone, RevertVolume, SnapshotNodes)
// and DeleteVolume's WithSnapshots, and its store keeps snapshots and
// clones. An older binary fails to decode those commands: the leader
// proposes them only when every registered node has it.
const FeatureSnapshots = "snapshots"

// FeatureDigests: the node answers POST /v1/internal/checksum with
// digests of any region size (region_bytes), which a compare rebuild
// asks of its replica (repl.RebuildConfig.RemoteDigests). Not a registry
// command's: the primary copies in full to a node without it.
const FeatureDigests = "region-digests"

// SetNodeState moves a node to State.
type SetNodeState struct {
	ID    string    `json:"id"`
	State NodeState `json:"state"`
}

// RemoveNode forgets a node. It fails with ErrNodeInUse while the node owns
// a volume or carries a connection.
type RemoveNode struct {
	ID string `json:"id"`
}

// CreateVolume registers a new volume in VolumeCreating on node Node. The
// registry assigns its ID. An empty NQN defaults to DefaultNQN(Name).
type CreateVolume struct {
	Name      string `json:"name"`
	SizeBytes uint64 `json:"size_bytes"`
	BlockSize uint32 `json:"block_size"` // 512 or 4096
	Node      string `json:"node"`
	NQN       string `json:"nqn,omitempty"`
	At        int64  `json:"at"` // creation time, Unix nanoseconds, set by the proposer
	// Replicas, when set, are the nodes of the volume's replicas,
	// Replicas[0] == Node (the primary); all start in sync (a new volume
	// is zeros everywhere) at epoch 1, and Want is their number. Every
	// node must be known and up, none twice, no two in one zone. Empty:
	// one replica on Node, as volumes were before replicas.
	Replicas []string `json:"replicas,omitempty"`
	// ReplicaSecret is the DH-HMAC-CHAP key pair the primary and the
	// other replicas authenticate each other with on the replica
	// connections (set by the proposer, DHHC-1); required with more than
	// one replica.
	ReplicaSecret *HostSecret `json:"replica_secret,omitempty"`
}

// SetVolumeState moves a volume along the transitions validTransition allows.
type SetVolumeState struct {
	Name  string      `json:"name"`
	State VolumeState `json:"state"`
	// Reason is required with VolumeFailed and ignored otherwise.
	Reason string `json:"reason,omitempty"`
}

// ResizeVolume grows a volume; shrinking is refused (ErrShrink).
type ResizeVolume struct {
	Name      string `json:"name"`
	SizeBytes uint64 `json:"size_bytes"`
}

// DeleteVolume moves a volume to VolumeDeleting. It fails with
// ErrHasConnections while hosts are connected unless Force, which drops them.
// It fails with ErrHasSnapshots, naming them, while the volume has
// snapshots not already being deleted, unless WithSnapshots, which moves
// every one of them to SnapshotDeleting too; that is refused with
// ErrHasClones when one of them is the base of a clone. A clone not
// flattened may be deleted: its origin snapshot loses a child.
type DeleteVolume struct {
	Name          string `json:"name"`
	Force         bool   `json:"force,omitempty"`
	WithSnapshots bool   `json:"with_snapshots,omitempty"`
}

// PurgeVolume forgets a volume in VolumeDeleting once its node freed the
// data. Its snapshots must have been purged first (ErrHasSnapshots).
type PurgeVolume struct {
	Name string `json:"name"`
}

// AllowHost adds a host NQN to a volume's allow list (idempotent). With
// Secret the host must also authenticate with DH-HMAC-CHAP (a DHHC-1
// secret), and with CtrlSecret it may ask the volume's controller to prove
// itself too; they replace the host's secrets if it had some. Without
// Secret an allowed host keeps the secrets it has: allowing it again never
// drops its authentication (DisallowHost does).
type AllowHost struct {
	Volume     string `json:"volume"`
	HostNQN    string `json:"host_nqn"`
	Secret     string `json:"dhchap_secret,omitempty"`
	CtrlSecret string `json:"dhchap_ctrl_secret,omitempty"`
}

// Check validates the command's fields.
func (c AllowHost) Check() error {
	if err := checkNQN(c.HostNQN); err != nil {
		return err
	}
	return checkSecrets(c.Secret, c.CtrlSecret)
}

// DisallowHost removes a host NQN from a volume's allow list (idempotent).
// It fails with ErrHasConnections while that host is connected, unless Force,
// which drops its connections to the volume.
type DisallowHost struct {
	Volume  string `json:"volume"`
	HostNQN string `json:"host_nqn"`
	Force   bool   `json:"force,omitempty"`
}

// SetAllowAny sets whether any host may connect to a volume.
type SetAllowAny struct {
	Volume   string `json:"volume"`
	AllowAny bool   `json:"allow_any"`
}

// Connect records that HostNQN attached to Volume through node Node at At.
type Connect struct {
	HostNQN string `json:"host_nqn"`
	Volume  string `json:"volume"`
	Node    string `json:"node"`
	At      int64  `json:"at"` // Unix nanoseconds, set by the proposer
}

// Disconnect forgets a connection.
type Disconnect struct {
	HostNQN string `json:"host_nqn"`
	Volume  string `json:"volume"`
	Node    string `json:"node"`
}

// SetReplicaState moves the replica of Volume on Node to State (the
// legal moves are validReplicaMove's), at the volume's current Epoch: a
// report from a deposed primary is refused (ErrStaleEpoch). The primary's
// replica cannot be moved (SetPrimary first), so one replica stays in
// sync. Full asks the next rebuild to copy everything; it stays set until
// the replica is in sync.
type SetReplicaState struct {
	Volume string       `json:"volume"`
	Epoch  uint64       `json:"epoch"`
	Node   string       `json:"node"`
	State  ReplicaState `json:"state"`
	Reason string       `json:"reason,omitempty"` // required with ReplicaFailed
	Full   bool         `json:"full_copy,omitempty"`
	At     int64        `json:"at"` // Unix nanoseconds, set by the proposer
}

// SetPrimary makes Node, whose replica must be in sync and whose node up,
// the volume's primary at Epoch+1 (Epoch must be the current one). Node
// may be the primary already (a restart: a new epoch, nothing else
// changes). With Failover the old primary's replica becomes out-of-sync,
// "primary lost at epoch E".
type SetPrimary struct {
	Volume   string `json:"volume"`
	Epoch    uint64 `json:"epoch"`
	Node     string `json:"node"`
	Failover bool   `json:"failover,omitempty"`
	At       int64  `json:"at"`
}

// AddReplica appends an out-of-sync replica on Node, to be copied in full.
// Node must be up, hold no replica of the volume, share no zone with one,
// and have the capacity.
type AddReplica struct {
	Volume string `json:"volume"`
	Node   string `json:"node"`
	At     int64  `json:"at"`
	// ReplicaSecret is the volume's replica key pair, recorded when the
	// volume has none yet (one created with a single replica); ignored
	// otherwise.
	ReplicaSecret *HostSecret `json:"replica_secret,omitempty"`
}

// RemoveReplica drops the replica on Node; never the primary's.
type RemoveReplica struct {
	Volume string `json:"volume"`
	Node   string `json:"node"`
	// Replaced: the end of a replacement (ReplaceReplica), refused
	// unless Node's replica is being replaced and its replacement is in
	// sync, so that the in-sync count never drops below what it was
	// before the replacement (the leader's check and this command are
	// not atomic: the replacement may fall out of sync in between).
	// Sent only with FeatureReplace.
	Replaced bool `json:"replaced,omitempty"`
}

// ReplaceReplica starts replacing the replica on Node with a new one on
// New (volume replace-replica, volume move): the new replica is inserted
// right after Node's (it takes its place in placement order once Node's
// is removed: the first is the primary failback returns to), out of
// sync, to be copied in full, and Node's is marked ReplacedBy New.
// The leader removes Node's replica (after a planned handover when it is
// the primary's) once New's is in sync, so the volume never has fewer
// in-sync replicas than before. New must be up, hold no replica of the
// volume, share no zone with a replica other than Node's (Node's zone is
// allowed: it is leaving), and have the capacity. When Node's replica is
// itself the replacement of another (its node failed during the copy),
// it is dropped and the other's replacement becomes New.
type ReplaceReplica struct {
	Volume string `json:"volume"`
	Node   string `json:"node"`
	New    string `json:"new"`
	// Reason is the new replica's (shown in volume show); "": "replacing
	// the replica on Node".
	Reason string `json:"reason,omitempty"`
	At     int64  `json:"at"`
	// ReplicaSecret is the volume's replica key pair, recorded when the
	// volume has none yet; ignored otherwise.
	ReplicaSecret *HostSecret `json:"replica_secret,omitempty"`
}

// CreateSnapshot registers a snapshot of Volume named Name, in
// SnapshotCreating, before the nodes are asked to take it: its ID comes
// from the volume ID counter (never reused), its Nodes are the volume's
// in-sync replicas, its Parent the volume's Parent, its size the
// volume's. The volume must be online, offline or degraded
// (ErrVolumeNotOnline); the name in the name grammar and unused in the
// volume (ErrSnapshotExists); no other snapshot of the volume being
// taken, no flatten in progress, the volume's parent snapshot not being
// deleted (ErrBusy); fewer than MaxSnapshots snapshots (ErrLimit).
// Origin, for the snapshot an import takes, is the exported snapshot's
// "cluster/ID" (docs/snapshots.md §5.3), kept as the snapshot's Origin.
type CreateSnapshot struct {
	Volume string `json:"volume"`
	Name   string `json:"name"`
	At     int64  `json:"at"` // creation time, Unix nanoseconds, set by the proposer
	Origin string `json:"origin,omitempty"`
}

// SnapshotDone marks a snapshot being taken ready: Nodes took it, at the
// volume's epoch Epoch (ErrStaleEpoch otherwise). Nodes must be replicas
// of the volume, each once, and include the primary and every replica in
// sync now (ErrInvalid: an in-sync replica without the snapshot would be
// rebuilt wrong). The volume's Parent becomes the snapshot.
type SnapshotDone struct {
	Volume string   `json:"volume"`
	Name   string   `json:"name"`
	Epoch  uint64   `json:"epoch"`
	Nodes  []string `json:"nodes"`
}

// DeleteSnapshot moves a snapshot (being taken: its barrier failed; or
// ready) to SnapshotDeleting; its nodes free it and PurgeSnapshot
// forgets it. Refused while it is the base of two objects or more
// (ErrHasClones naming the clones when a clone is among them, else
// ErrHasChildren naming them), while its one child is a clone being
// flattened or a snapshot being taken (ErrBusy).
type DeleteSnapshot struct {
	Volume string `json:"volume"`
	Name   string `json:"name"`
}

// PurgeSnapshot forgets a snapshot in SnapshotDeleting once its nodes
// freed it (merged it into its one child): every snapshot and volume
// whose Parent was its ID takes its Parent, and a clone whose origin it
// was takes its parent as origin (or stops being a clone when it had
// none).
type PurgeSnapshot struct {
	Volume string `json:"volume"`
	Name   string `json:"name"`
}

// CloneVolume registers a new volume Name, in VolumeCreating, that
// starts as the content of Volume's snapshot Snapshot and shares its
// clusters: on the snapshot's Nodes that are up (at least one:
// ErrNodeNotUp), which hold a copy, the source's primary first if it is
// among them; all in sync at epoch 1; Want as the source's; the
// snapshot's size and the source's block size. The snapshot must be
// ready (ErrSnapshotNotReady); the name in the name grammar and free
// (ErrVolumeExists), the NQN (DefaultNQN(Name) when empty) free
// (ErrNQNInUse); every node must have the capacity (ErrNoCapacity),
// since a flattened clone holds all of its size.
type CloneVolume struct {
	Name     string `json:"name"`
	Volume   string `json:"volume"`   // the source volume
	Snapshot string `json:"snapshot"` // its snapshot
	NQN      string `json:"nqn,omitempty"`
	At       int64  `json:"at"` // creation time, Unix nanoseconds, set by the proposer
	// ReplicaSecret is the clone's replica key pair (see CreateVolume).
	ReplicaSecret *HostSecret `json:"replica_secret,omitempty"`
}

// FlattenVolume asks for a clone to be detached from its origin (a
// background copy of what it still shares, on every replica): Flatten
// is set until FlattenDone. Refused for a volume that is not a clone
// (ErrNotClone), while a flatten is in progress or its parent snapshot
// is being deleted (ErrBusy), and while the clone has snapshots of its
// own (ErrHasSnapshots: they share the origin's clusters too, and a
// flatten copies into the live map only).
type FlattenVolume struct {
	Name string `json:"name"`
	At   int64  `json:"at"` // Unix nanoseconds, set by the proposer
}

// FlattenDone ends a flatten (every replica copied what it shared): the
// volume is no clone any more (CloneOf, Flatten and Parent cleared).
// Refused unless a flatten is in progress (ErrBadTransition).
type FlattenDone struct {
	Name string `json:"name"`
}

// RevertVolume makes volume Name read as its snapshot Snapshot again:
// its size becomes the snapshot's, its Parent the snapshot, Reverted
// the command's log index (the stores' revert token, so a retried revert
// is applied once), and its epoch moves on (fencing any write of the
// old term). The snapshot must be the volume's own and ready; Epoch the
// volume's current one (ErrStaleEpoch); no host connected
// (ErrHasConnections, naming each host and its node); every in-sync
// replica must hold the snapshot and none be rebuilding, and no snapshot
// be being taken, nor the volume's parent being deleted (ErrBusy).
type RevertVolume struct {
	Name     string `json:"name"`
	Snapshot string `json:"snapshot"`
	Epoch    uint64 `json:"epoch"`
}

// SnapshotNodes records that a rebuild gave node Add (a replica of the
// volume) a copy of ready snapshot Snapshot, or that node Remove holds
// none any more. Adding a node listed already, or removing one not
// listed, is a no-op. Exactly one of Add and Remove is set.
type SnapshotNodes struct {
	Volume   string `json:"volume"`
	Snapshot string `json:"snapshot"`
	Add      string `json:"add,omitempty"`
	Remove   string `json:"remove,omitempty"`
}

func (RegisterNode) Op() Op     { return OpRegisterNode }
func (SetNodeState) Op() Op     { return OpSetNodeState }
func (RemoveNode) Op() Op       { return OpRemoveNode }
func (CreateVolume) Op() Op     { return OpCreateVolume }
func (SetVolumeState) Op() Op   { return OpSetVolumeState }
func (ResizeVolume) Op() Op     { return OpResizeVolume }
func (DeleteVolume) Op() Op     { return OpDeleteVolume }
func (PurgeVolume) Op() Op      { return OpPurgeVolume }
func (AllowHost) Op() Op        { return OpAllowHost }
func (DisallowHost) Op() Op     { return OpDisallowHost }
func (SetAllowAny) Op() Op      { return OpSetAllowAny }
func (Connect) Op() Op          { return OpConnect }
func (Disconnect) Op() Op       { return OpDisconnect }
func (SetClusterID) Op() Op     { return OpSetClusterID }
func (SetReplicaState) Op() Op  { return OpSetReplicaState }
func (SetPrimary) Op() Op       { return OpSetPrimary }
func (AddReplica) Op() Op       { return OpAddReplica }
func (RemoveReplica) Op() Op    { return OpRemoveReplica }
func (ReplaceReplica) Op() Op   { return OpReplaceReplica }
func (CreateSnapshot) Op() Op   { return OpCreateSnapshot }
func (SnapshotDone) Op() Op     { return OpSnapshotDone }
func (DeleteSnapshot) Op() Op   { return OpDeleteSnapshot }
func (PurgeSnapshot) Op() Op    { return OpPurgeSnapshot }
func (CloneVolume) Op() Op      { return OpCloneVolume }
func (FlattenVolume) Op() Op    { return OpFlattenVolume }
func (FlattenDone) Op() Op      { return OpFlattenDone }
func (RevertVolume) Op() Op     { return OpRevertVolume }
func (SnapshotNodes) Op() Op    { return OpSnapshotNodes }
func (Reservation) Op() Op      { return OpReservation }
func (ClearReservation) Op() Op { return OpClearReservation }

// SetClusterID names the cluster the registry belongs to, once: the first
// leader of a new cluster applies it. A node whose data directory belongs
// to another cluster is refused when it asks to join.
type SetClusterID struct {
	ID string `json:"id"`
}

// MaxCommandBytes bounds an encoded command: the largest legal command is a
// CreateVolume with a MaxNameLen name and a MaxNQNLen NQN, well under 1 KiB;
// 64 KiB leaves room for future commands while keeping a hostile entry cheap.
const MaxCommandBytes = 64 << 10

// EncodeCommand encodes c as [CommandVersion][Op][JSON body].
func EncodeCommand(c Command) ([]byte, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("meta: encode %v: %w", c.Op(), err)
	}
	out := make([]byte, 0, 2+len(body))
	out = append(out, CommandVersion, byte(c.Op()))
	out = append(out, body...)
	if len(out) > MaxCommandBytes {
		return nil, fmt.Errorf("meta: %v is %d bytes (max %d): %w", c.Op(), len(out), MaxCommandBytes, ErrLimit)
	}
	return out, nil
}

// DecodeCommand is EncodeCommand's inverse. Its errors wrap ErrBadCommand.
func DecodeCommand(b []byte) (Command, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("meta: command of %d bytes: %w", len(b), ErrBadCommand)
	}
	if len(b) > MaxCommandBytes {
		return nil, fmt.Errorf("meta: command of %d bytes (max %d): %w", len(b), MaxCommandBytes, ErrBadCommand)
	}
	if b[0] != CommandVersion {
		return nil, fmt.Errorf("meta: command version %d, want %d: %w", b[0], CommandVersion, ErrBadCommand)
	}
	var c Command
	switch Op(b[1]) {
	case OpRegisterNode:
		c = new(RegisterNode)
	case OpSetNodeState:
		c = new(SetNodeState)
	case OpRemoveNode:
		c = new(RemoveNode)
	case OpCreateVolume:
		c = new(CreateVolume)
	case OpSetVolumeState:
		c = new(SetVolumeState)
	case OpResizeVolume:
		c = new(ResizeVolume)
	case OpDeleteVolume:
		c = new(DeleteVolume)
	case OpPurgeVolume:
		c = new(PurgeVolume)
	case OpAllowHost:
		c = new(AllowHost)
	case OpDisallowHost:
		c = new(DisallowHost)
	case OpSetAllowAny:
		c = new(SetAllowAny)
	case OpConnect:
		c = new(Connect)
	case OpDisconnect:
		c = new(Disconnect)
	case OpSetClusterID:
		c = new(SetClusterID)
	case OpSetReplicaState:
		c = new(SetReplicaState)
	case OpSetPrimary:
		c = new(SetPrimary)
	case OpAddReplica:
		c = new(AddReplica)
	case OpRemoveReplica:
		c = new(RemoveReplica)
	case OpReplaceReplica:
		c = new(ReplaceReplica)
	case OpCreateSnapshot:
		c = new(CreateSnapshot)
	case OpSnapshotDone:
		c = new(SnapshotDone)
	case OpDeleteSnapshot:
		c = new(DeleteSnapshot)
	case OpPurgeSnapshot:
		c = new(PurgeSnapshot)
	case OpCloneVolume:
		c = new(CloneVolume)
	case OpFlattenVolume:
		c = new(FlattenVolume)
	case OpFlattenDone:
		c = new(FlattenDone)
	case OpRevertVolume:
		c = new(RevertVolume)
	case OpSnapshotNodes:
		c = new(SnapshotNodes)
	case OpReservation:
		c = new(Reservation)
	case OpClearReservation:
		c = new(ClearReservation)
	case OpRegisterHost:
		c = new(RegisterHost)
	case OpUnregisterHost:
		c = new(UnregisterHost)
	default:
		return nil, fmt.Errorf("meta: unknown op %d: %w", b[1], ErrBadCommand)
	}
	if err := json.Unmarshal(b[2:], c); err != nil {
		return nil, fmt.Errorf("meta: decode %v: %v: %w", Op(b[1]), err, ErrBadCommand)
	}
	return deref(c), nil
}

// deref turns the *T DecodeCommand filled into the T callers construct.
func deref(c Command) Command {
	switch c := c.(type) {
	case *RegisterNode:
		return *c
	case *SetNodeState:
		return *c
	case *RemoveNode:
		return *c
	case *CreateVolume:
		return *c
	case *SetVolumeState:
		return *c
	case *ResizeVolume:
		return *c
	case *DeleteVolume:
		return *c
	case *PurgeVolume:
		return *c
	case *AllowHost:
		return *c
	case *DisallowHost:
		return *c
	case *SetAllowAny:
		return *c
	case *Connect:
		return *c
	case *Disconnect:
		return *c
	case *SetClusterID:
		return *c
	case *SetReplicaState:
		return *c
	case *SetPrimary:
		return *c
	case *AddReplica:
		return *c
	case *RemoveReplica:
		return *c
	case *ReplaceReplica:
		return *c
	case *CreateSnapshot:
		return *c
	case *SnapshotDone:
		return *c
	case *DeleteSnapshot:
		return *c
	case *PurgeSnapshot:
		return *c
	case *CloneVolume:
		return *c
	case *FlattenVolume:
		return *c
	case *FlattenDone:
		return *c
	case *RevertVolume:
		return *c
	case *SnapshotNodes:
		return *c
	case *Reservation:
		return *c
	case *ClearReservation:
		return *c
	case *RegisterHost:
		return *c
	case *UnregisterHost:
		return *c
	}
	return c
}
