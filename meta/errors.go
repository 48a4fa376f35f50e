package meta

import "errors"

// Errors a command's Result can carry. They are results, not faults: every
// replica reaches the same one for the same entry. Match with errors.Is.
var (
	ErrBadCommand       = errors.New("meta: malformed command")
	ErrInvalid          = errors.New("meta: invalid argument")
	ErrLimit            = errors.New("meta: limit reached")
	ErrUnknownNode      = errors.New("meta: unknown node")
	ErrNodeNotUp        = errors.New("meta: node is not up")
	ErrNodeInUse        = errors.New("meta: node owns volumes or carries connections")
	ErrVolumeExists     = errors.New("meta: volume name already in use")
	ErrNQNInUse         = errors.New("meta: subsystem NQN already in use")
	ErrUnknownVolume    = errors.New("meta: unknown volume")
	ErrBadBlockSize     = errors.New("meta: block size must be 512 or 4096")
	ErrSizeNotMultiple  = errors.New("meta: size is not a multiple of the block size")
	ErrShrink           = errors.New("meta: volumes cannot shrink")
	ErrBadTransition    = errors.New("meta: state transition not allowed")
	ErrVolumeNotOnline  = errors.New("meta: volume is not online")
	ErrVolumeDeleting   = errors.New("meta: volume is being deleted")
	ErrHasConnections   = errors.New("meta: volume has live connections")
	ErrHostNotAllowed   = errors.New("meta: host is not allowed on volume")
	ErrAlreadyConnected = errors.New("meta: host already connected through node")
	ErrNotConnected     = errors.New("meta: no such connection")
	ErrBadSnapshot      = errors.New("meta: malformed snapshot")
	// ErrNoCapacity: Place found no node with room for the volume.
	ErrNoCapacity = errors.New("meta: no node has the capacity for the volume")
	// ErrNoPlacement: Place found fewer eligible nodes (up, serving
	// NVMe-oF, in distinct zones) than replicas asked for.
	ErrNoPlacement = errors.New("meta: not enough nodes up to place the volume")
	// ErrStaleEpoch: a replica command names an epoch other than the
	// volume's current one: it comes from a primary that was replaced
	// (deposed), or raced another change of primary.
	ErrStaleEpoch = errors.New("meta: stale epoch")
	// ErrFeatureMissing: a registered node's binary cannot apply the
	// command (it did not register the feature, e.g.
	// FeatureReservations): Node.Apply refuses to propose it, since that
	// node would stop applying the log. Upgrade every node first.
	ErrFeatureMissing = errors.New("meta: a node lacks a feature the command needs")

	// Snapshots and clones (docs/snapshots.md §2). Messages name the
	// objects (VOL@SNAP, clones and hosts by name): the API shows them to
	// operators verbatim.

	// ErrUnknownSnapshot: the volume has no snapshot of that name.
	ErrUnknownSnapshot = errors.New("meta: unknown snapshot")
	// ErrSnapshotExists: the volume has a snapshot of that name already
	// (ready, being taken or being deleted).
	ErrSnapshotExists = errors.New("meta: snapshot name already in use")
	// ErrSnapshotNotReady: the snapshot is being taken or deleted.
	ErrSnapshotNotReady = errors.New("meta: snapshot is not ready")
	// ErrHasClones: the snapshot is the base of clones (named in the
	// message): flatten or delete them first.
	ErrHasClones = errors.New("meta: snapshot has clones")
	// ErrHasChildren: the snapshot is the base of two or more of its own
	// volume's objects (a revert gave it a second child): delete the
	// later snapshot first.
	ErrHasChildren = errors.New("meta: snapshot is the base of more than one object")
	// ErrHasSnapshots: the volume has snapshots (named in the message).
	ErrHasSnapshots = errors.New("meta: volume has snapshots")
	// ErrNotClone: the volume is not a clone (or was flattened).
	ErrNotClone = errors.New("meta: volume is not a clone")
	// ErrBusy: another operation on the volume must finish first (a
	// snapshot being taken, a flatten, a merge, a rebuild): retry.
	ErrBusy = errors.New("meta: volume is busy")
)
