package api

// The request and response bodies of blkd's /v1 API (docs/blkd.md). blkd
// writes them and blkctl reads them: one definition, so the two cannot
// drift.

// Volume states as the API shows them: the registry's (creating, online,
// offline, deleting, failed, degraded: served but writes refused, its
// node's disk is full) and "unavailable", an online volume whose owner
// node is down.
const (
	StateCreating    = "creating"
	StateOnline      = "online"
	StateOffline     = "offline"
	StateDeleting    = "deleting"
	StateFailed      = "failed"
	StateDegraded    = "degraded"
	StateUnavailable = "unavailable"
)

// A member's readiness as GET /v1/cluster?health=true shows it
// (Member.Ready): ReadyYes, NotReadyPrefix followed by the failing
// checks' names, or ReadyUnreachable.
const (
	ReadyYes         = "ready"
	NotReadyPrefix   = "not ready: "
	ReadyUnreachable = "unreachable"
)

// Volume is one volume (GET /v1/volumes/{name}, and the answer of every
// change to it).
type Volume struct {
	Name string `json:"name"`
	// LegacyName: Name is outside the name grammar (CheckName), written
	// by an older blkd. Such a volume works, but its name cannot be put
	// in every API path: delete it with DELETE /v1/volumes?name=NAME
	// (blkctl volume delete --legacy-name NAME).
	LegacyName bool     `json:"legacy_name,omitempty"`
	ID         uint64   `json:"id"`
	SizeBytes  uint64   `json:"size_bytes"`
	BlockSize  uint32   `json:"block_size"`
	Node       string   `json:"node"`
	State      string   `json:"state"`
	Reason     string   `json:"reason,omitempty"` // why failed or unavailable
	NQN        string   `json:"nqn"`
	AllowAny   bool     `json:"allow_any,omitempty"`
	Hosts      []string `json:"hosts,omitempty"`
	// Authentication names the hosts that must authenticate with
	// DH-HMAC-CHAP and how: AuthHost (they prove their secret) or
	// AuthBidirectional (the controller proves its own too, when the host
	// asks). The secrets themselves are never shown.
	Authentication map[string]string `json:"authentication,omitempty"`
	CreatedAt      int64             `json:"created_at"` // Unix nanoseconds
	// Attachments are the hosts attached to the volume (blkctl attach,
	// or a kernel host that connected).
	Attachments []Attachment `json:"attachments,omitempty"`
	// Epoch counts the changes of the volume's primary (Node), from 1.
	Epoch uint64 `json:"epoch"`
	// WantReplicas is the number of copies asked for at creation.
	WantReplicas int `json:"want_replicas"`
	// Replicas are the volume's copies in placement order; the one on
	// Node is the primary. A volume online with fewer in sync than
	// WantReplicas has the Reason "degraded: K/N in sync".
	Replicas []Replica `json:"replicas"`
	// Snapshots names the volume's snapshots, oldest first (GET
	// /v1/volumes/{name}/snapshots lists them with their sizes).
	Snapshots []string `json:"snapshots,omitempty"`
	// CloneOf is the snapshot a clone was made from, as VOL@SNAP, until
	// the clone is flattened; Flatten is a flatten's progress while it
	// runs.
	CloneOf string           `json:"clone_of,omitempty"`
	Flatten *FlattenProgress `json:"flatten,omitempty"`
	// OwnedBytes is the space the volume's own clusters take on its
	// primary; SharedBytes what it reads from the snapshots below it
	// (its own earlier snapshots, or a clone's origin). Both are given
	// by the primary when it answers (absent when it did not).
	OwnedBytes  *uint64 `json:"owned_bytes,omitempty"`
	SharedBytes *uint64 `json:"shared_bytes,omitempty"`
	// Reservation is the volume's NVMe persistent reservation state as
	// the registry keeps it (docs/reservations.md §6): its generation,
	// which a host's Reservation Report shows too, the holder and the
	// registrants. Gen 0 and no registrant: none ever made. Absent from
	// a blkd older than reservations.
	Reservation *Reservation `json:"reservation,omitempty"`
}

// Reservation is a volume's persistent reservation (NVMe reservations,
// kept by the registry).
type Reservation struct {
	// Gen is PRGEN, the reservation generation a host's Reservation
	// Report shows: +1 on every registration change, preempt and clear.
	Gen uint32 `json:"gen"`
	// Type is the reservation held, by name: "none", "write-exclusive",
	// "exclusive-access", "write-exclusive-registrants-only",
	// "exclusive-access-registrants-only", "write-exclusive-all-registrants",
	// "exclusive-access-all-registrants".
	Type string `json:"type"`
	// Holder is the holding host's identifier (32 hex digits) for the
	// types held by one host; absent for none and for the all-registrants
	// types, which every registrant holds.
	Holder string `json:"holder,omitempty"`
	// HolderNQN is the holder's host NQN at its registration.
	HolderNQN   string       `json:"holder_nqn,omitempty"`
	Registrants []Registrant `json:"registrants,omitempty"`
	// PTPL: Persist Through Power Loss. Off, the registrations and the
	// reservation are dropped when the volume's serving node changes or
	// restarts (its controllers all end: docs/reservations.md §1.10).
	PTPL bool `json:"ptpl"`
}

// Registrant is a host registered on a volume's reservation.
type Registrant struct {
	HostID  string `json:"host_id"` // 32 hex digits (Connect's HOSTID)
	HostNQN string `json:"host_nqn,omitempty"`
	Key     uint64 `json:"key"`
	// Holder: the registrant holds the reservation.
	Holder bool `json:"holder,omitempty"`
}

// ReservationTypeNames are Reservation.Type's names by RTYPE (0: none).
var ReservationTypeNames = [...]string{"none", "write-exclusive", "exclusive-access",
	"write-exclusive-registrants-only", "exclusive-access-registrants-only",
	"write-exclusive-all-registrants", "exclusive-access-all-registrants"}

// ClearReservationAnswer answers POST /v1/volumes/{name}/reservation/clear:
// the reservation after the clear.
type ClearReservationAnswer struct {
	Reservation Reservation `json:"reservation"`
}

// FlattenProgress is a running flatten of a clone: the bytes its primary
// copied from the origin snapshot and those it has to copy (what the
// clone read from the snapshot when the flatten began).
type FlattenProgress struct {
	DoneBytes  uint64 `json:"done_bytes"`
	TotalBytes uint64 `json:"total_bytes"`
	// Since: when the flatten was asked for (Unix nanoseconds).
	Since int64 `json:"since"`
}

// Snapshot states of Snapshot.State.
const (
	SnapshotCreating = "creating" // being taken
	SnapshotReady    = "ready"
	SnapshotDeleting = "deleting" // its space is being merged or freed
)

// Snapshot is one read-only point-in-time copy of a volume (GET
// /v1/volumes/{name}/snapshots/{snap}), named VOL@NAME.
type Snapshot struct {
	Name      string `json:"name"`
	Volume    string `json:"volume"`
	ID        uint64 `json:"id"`
	SizeBytes uint64 `json:"size_bytes"` // the volume's size when taken
	CreatedAt int64  `json:"created_at"` // Unix nanoseconds
	State     string `json:"state"`
	// Nodes hold a copy of it (the volume's in-sync replicas when it
	// was taken).
	Nodes []string `json:"nodes"`
	// Clones are the volumes made from it and not yet flattened: it
	// cannot be deleted while it has any.
	Clones []string `json:"clones,omitempty"`
	// OwnedBytes is the space of the clusters it holds (shared with
	// later snapshots and the volume where they did not change them);
	// ExclusiveBytes what deleting it would free. Given by the primary
	// when it answers.
	OwnedBytes     *uint64 `json:"owned_bytes,omitempty"`
	ExclusiveBytes *uint64 `json:"exclusive_bytes,omitempty"`
	// HeldNanos (the answer of a create only): how long host writes were
	// held while it was taken.
	HeldNanos int64 `json:"held_ns,omitempty"`
	// Origin is, for a snapshot an import made, the exported snapshot
	// it is a copy of, "cluster/ID": the next diff of that snapshot's
	// volume imports onto it.
	Origin string `json:"origin,omitempty"`
}

// SnapshotList is GET /v1/volumes/{name}/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// SnapshotRequest is POST /v1/volumes/{name}/snapshots.
type SnapshotRequest struct {
	Name string `json:"name"`
	// Origin (an import's snapshot only): the exported snapshot, as
	// ImportResult.Origin gives it.
	Origin string `json:"origin,omitempty"`
}

// ImageContentType is the media type of a blk-image/1 stream
// (internal/image): GET .../export answers it, PUT .../import takes it.
const ImageContentType = "application/vnd.blk.image"

// ImageDataBytesHeader is the answer header of an export that gives the
// image's data bytes (Content-Length is the whole stream's).
const ImageDataBytesHeader = "Blk-Image-Data-Bytes"

// ImportResult is the answer of PUT /v1/volumes/{name}/import: what the
// image was, and what was written.
type ImportResult struct {
	Volume string `json:"volume"`
	// Snapshot is the name of the exported snapshot (blkctl gives the
	// volume a snapshot of that name, with Origin).
	Snapshot string `json:"snapshot"`
	// Origin is the exported snapshot as "cluster/ID".
	Origin string `json:"origin"`
	// Base is the snapshot a diff image was taken since ("": full).
	Base         string `json:"base,omitempty"`
	SizeBytes    uint64 `json:"size_bytes"`
	DataBytes    uint64 `json:"data_bytes"`
	WrittenBytes uint64 `json:"written_bytes"`
	Records      uint64 `json:"records"`
}

// CloneRequest is POST /v1/volumes/{name}/snapshots/{snap}/clone: a new
// writable volume Name that starts as the snapshot's content and shares
// its clusters. NQN: its subsystem NQN; "": the default for Name.
type CloneRequest struct {
	Name string `json:"name"`
	NQN  string `json:"nqn,omitempty"`
}

// RevertRequest is POST /v1/volumes/{name}/revert: the volume's content
// becomes its snapshot Snapshot's (and its size the snapshot's). Refused
// while a host is connected.
type RevertRequest struct {
	Snapshot string `json:"snapshot"`
}

// Replica states of Replica.State.
const (
	ReplicaInSync     = "in-sync"     // holds every acknowledged write
	ReplicaOutOfSync  = "out-of-sync" // misses writes; to be rebuilt
	ReplicaRebuilding = "rebuilding"  // being copied to
	ReplicaFailed     = "failed"      // cannot be rebuilt in place: replace it
)

// Replica is one copy of a volume.
type Replica struct {
	Node   string `json:"node"`
	State  string `json:"state"` // ReplicaInSync, ...
	Reason string `json:"reason,omitempty"`
	Since  int64  `json:"since"` // Unix nanoseconds: when it entered State
	// Primary: the copy hosts do I/O to (on Volume.Node).
	Primary bool `json:"primary,omitempty"`
	// ReplacedBy: this copy is leaving, replaced by the one on that node
	// (volume replace-replica, volume move); it is removed once that one
	// is in sync. Replaces: this copy replaces the one on that node.
	ReplacedBy string `json:"replaced_by,omitempty"`
	Replaces   string `json:"replaces,omitempty"`
	// Rebuild: a rebuild's progress, given by the volume's primary only
	// (GET /v1/volumes/{name} answered by that node) while it copies.
	Rebuild *RebuildProgress `json:"rebuild,omitempty"`
}

// RebuildProgress is a running rebuild of a replica: the bytes its copy
// has passed (copied, or holes cleared) and those it has to pass: the
// volume's size for a full copy, the size of the regions the replica
// missed for an incremental one (the registry's reason says which).
type RebuildProgress struct {
	DoneBytes  uint64 `json:"done_bytes"`
	TotalBytes uint64 `json:"total_bytes"`
}

// ReplaceReplicaRequest is POST /v1/volumes/{name}/replicas/replace:
// replace the volume's replica on Node (volume replace-replica: its node
// is gone; volume move: drain it) with a new one on To, or where
// placement says (outside the other replicas' zones) when To is empty.
// The new replica is copied in full while hosts write; the old one is
// removed once the new one is in sync, after a planned handover when it
// is the primary's. Answered 202 with the volume: the copy goes on.
type ReplaceReplicaRequest struct {
	Node string `json:"node"`
	To   string `json:"to,omitempty"`
}

// VolumeList is GET /v1/volumes.
type VolumeList struct {
	Volumes []Volume `json:"volumes"`
}

// CreateVolumeRequest is POST /v1/volumes.
type CreateVolumeRequest struct {
	Name      string `json:"name"`
	Size      *Size  `json:"size"`
	BlockSize uint32 `json:"block_size,omitempty"`
	// Node pins the volume (its primary replica) to that node (its ID).
	// Empty: the cluster places it on the node up and serving NVMe-oF
	// with the most unpromised capacity (then the fewest volumes, then
	// the lowest ID).
	Node string `json:"node,omitempty"`
	// Replicas is how many copies of the volume to keep, each on a node
	// of its own zone (1 to 5); 0: 3 when the cluster has three zones
	// with a node up, else 1. A blkd that does not replicate writes yet
	// answers 501 to more than 1.
	Replicas int `json:"replicas,omitempty"`
}

// ResizeRequest is POST /v1/volumes/{name}/resize.
type ResizeRequest struct {
	Size *Size `json:"size"`
}

// HostRequest is POST /v1/volumes/{name}/hosts, /attach and /detach.
type HostRequest struct {
	HostNQN string `json:"host_nqn"`
	// DHCHAPSecret (POST .../hosts only) makes the host authenticate
	// with this DH-HMAC-CHAP secret ("DHHC-1:..."); DHCHAPCtrlSecret is the
	// controller's secret for bidirectional authentication. Without
	// them a host keeps the secrets it had.
	DHCHAPSecret     string `json:"dhchap_secret,omitempty"`
	DHCHAPCtrlSecret string `json:"dhchap_ctrl_secret,omitempty"`
}

// Authentication modes of Volume.Authentication and
// Connection.Authentication.
const (
	AuthHost          = "dhchap"
	AuthBidirectional = "dhchap-bidirectional"
)

// Transports of Connection and Endpoint.
const (
	TransportTCP  = "tcp"
	TransportRDMA = "rdma"
)

// Endpoint is one transport port a volume is served on.
type Endpoint struct {
	Transport string `json:"transport"` // TransportTCP or TransportRDMA
	Address   string `json:"address"`
	Port      int    `json:"port"`
}

// Connection is what a host needs to connect to a volume (the answer of
// POST /v1/volumes/{name}/attach). Address, Port and Transport are the
// preferred endpoint (NVMe/TCP when the node serves it: every host has
// it); Endpoints lists every transport the node serves the volume on.
type Connection struct {
	Address      string     `json:"address"`
	Port         int        `json:"port"`
	SubsystemNQN string     `json:"subsystem_nqn"`
	NSID         uint32     `json:"nsid"`
	Transport    string     `json:"transport"`
	Endpoints    []Endpoint `json:"endpoints,omitempty"`
	// Authentication is AuthHost or AuthBidirectional when the host must
	// authenticate (it holds the secrets; the API never returns them).
	Authentication string `json:"authentication,omitempty"`
}

// Attachment is one host attached to a volume through a node.
type Attachment struct {
	HostNQN string `json:"host_nqn"`
	Node    string `json:"node"`
	Since   int64  `json:"since"` // Unix nanoseconds
}

// Member is one entry of GET /v1/cluster.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	APIAddr  string `json:"api_addr,omitempty"`
	NVMeAddr string `json:"nvme_addr,omitempty"` // NVMe/RDMA
	TCPAddr  string `json:"tcp_addr,omitempty"`  // NVMe/TCP
	Leader   bool   `json:"leader"`
	// Suffrage is the raft role: voter, nonvoter.
	Suffrage string `json:"suffrage"`
	// State is the registry's node state (up, draining, down), or
	// "unregistered" for a raft member the registry does not know yet.
	State string `json:"state"`
	// Zone is the node's failure domain (blkd --zone); "": none.
	Zone string `json:"zone,omitempty"`
	// Ordinal is the node's number in the registry (1..63), which
	// gives it its NVMe controller IDs and PORTIDs; 0 (absent): none
	// yet, or unregistered.
	Ordinal int `json:"ordinal,omitempty"`
	// CapacityBytes is how many bytes of volumes the registry may
	// promise the node (its disk times its --overcommit; 0: no limit),
	// PromisedBytes what it has promised: the sizes of the volumes and
	// clones with a replica there. Snapshots are not promised (what one
	// holds grows with the writes after it): Disk says what the node
	// really holds (docs/volume.md, "Capacity").
	CapacityBytes uint64 `json:"capacity_bytes,omitempty"`
	PromisedBytes uint64 `json:"promised_bytes,omitempty"`
	// Disk is the node's store as the node reports it, asked with GET
	// /v1/cluster?usage=true; absent without it, or if the node did not
	// answer.
	Disk *NodeDisk `json:"disk,omitempty"`
	// Ready is the node's readiness (its GET /readyz), asked with GET
	// /v1/cluster?health=true: "ready"; "not ready: " and the failing
	// checks' names, comma-separated ("not ready: registry"); or
	// "unreachable" (no answer within a second, an answer not from the
	// node, or no API address known). Absent without the query, or from
	// a node too old to serve /readyz.
	Ready string `json:"ready,omitempty"`
}

// NodeDisk is a node's store, measured by the node.
type NodeDisk struct {
	// MappedBytes: the clusters of its data area that its volumes and
	// snapshots hold.
	MappedBytes uint64 `json:"mapped_bytes"`
	// FreeBytes, TotalBytes: the filesystem of its store's metadata
	// (and of its data area, unless --data-device); absent if the
	// filesystem cannot say.
	FreeBytes  uint64 `json:"free_bytes,omitempty"`
	TotalBytes uint64 `json:"total_bytes,omitempty"`
	// Full says why the store refuses new clusters (free space under its
	// reserve); "": it has room. Placement leaves such a node out.
	Full string `json:"full,omitempty"`
}

// Cluster is GET /v1/cluster.
type Cluster struct {
	NodeID       string   `json:"node_id"`
	ClusterID    string   `json:"cluster_id,omitempty"`
	LeaderID     string   `json:"leader_id"`
	LeaderAPI    string   `json:"leader_api"`
	Members      []Member `json:"members"`
	AppliedIndex uint64   `json:"applied_index"`
}

// Error is the body of every error answer. A follower answering a
// leader-only route (421) names the leader.
type Error struct {
	Error     string `json:"error"`
	LeaderID  string `json:"leader_id,omitempty"`
	LeaderAPI string `json:"leader_api,omitempty"`
}

// VerifyResult is the answer of POST /v1/volumes/{name}/verify: the
// volume's replicas compared region by region (SHA-256 of each).
type VerifyResult struct {
	Volume string `json:"volume"`
	Epoch  uint64 `json:"epoch"`
	// RegionBytes is the size of a compared region; Regions how many the
	// volume has; Compared the replicas' nodes, the primary first.
	RegionBytes uint64   `json:"region_bytes"`
	Regions     uint64   `json:"regions"`
	Compared    []string `json:"compared"`
	// Unreachable are the replicas' nodes that did not answer (not
	// compared).
	Unreachable map[string]string `json:"unreachable,omitempty"`
	// Mismatches are the regions where a replica differs from the
	// primary (in sync or not: an out-of-sync replica is expected to).
	Mismatches []VerifyMismatch `json:"mismatches"`
	// Snapshots are the snapshots compared too (?snapshots=true: every
	// ready one, on the nodes it lists).
	Snapshots []string `json:"snapshots,omitempty"`
}

// VerifyMismatch is one region where Node's replica differs from the
// primary's; InSync says whether that replica counts as in sync (a
// mismatch there is corruption or a lost write; on another replica it is
// what the rebuild will copy).
type VerifyMismatch struct {
	Offset uint64 `json:"offset"`
	Node   string `json:"node"`
	InSync bool   `json:"in_sync"`
	// Snapshot: the region is of that snapshot's copy on Node, which
	// differs from the reference copy (the primary's, or the first node
	// holding it); a snapshot's listed copies must all be equal.
	Snapshot string `json:"snapshot,omitempty"`
}
