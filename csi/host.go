package csi

import "context"

// Host is what the node service does to the machine it runs on. The node
// service's rules (state records, idempotency, path checks) are real code
// in node.go; only these kernel operations sit behind the interface, so
// that csi-sanity's node rules run on a developer machine without root
// (with a fake) and against a real kernel in the e2e guest (with the real
// one, NewHost).
//
// Every method is idempotent where the spec needs it to be: Connect of a
// subsystem already connected returns its device, Disconnect of one not
// connected and Unmount of a path not mounted succeed.
type Host interface {
	// Connect attaches the subsystem through the given endpoints and
	// returns the block device path of its namespace (one head device
	// over all paths).
	Connect(ctx context.Context, c Connection) (device string, err error)
	// Device returns the block device of a connected subsystem, or ok false.
	Device(ctx context.Context, subNQN string) (device string, ok bool, err error)
	// Disconnect detaches every controller of the subsystem.
	Disconnect(ctx context.Context, subNQN string) error
	// Healthy reports whether every controller of the subsystem is live.
	Healthy(ctx context.Context, subNQN string) (bool, error)
	// DeviceSize is the block device's size in bytes as the kernel sees it.
	DeviceSize(ctx context.Context, device string) (int64, error)

	// FSType is the filesystem signature on the device, "" when none.
	FSType(ctx context.Context, device string) (string, error)
	// Mkfs makes a filesystem of the given type on the device, with
	// extra mkfs arguments (the StorageClass's mkfsOptions).
	Mkfs(ctx context.Context, device, fstype string, options []string) error
	// Resize grows the filesystem mounted at path on device to the device's size.
	Resize(ctx context.Context, device, path, fstype string) error
	// Mount mounts source at target; bind mounts have fstype "" and
	// options containing "bind".
	Mount(ctx context.Context, source, target, fstype string, options []string) error
	// Unmount unmounts target; a target not mounted is no error.
	Unmount(ctx context.Context, target string) error
	// Mounted returns the source device (or the bind source's device) and
	// whether target is a mount point.
	Mounted(ctx context.Context, target string) (source string, ok bool, err error)
	// Stats is the usage of the filesystem mounted at path.
	Stats(ctx context.Context, path string) (Usage, error)
}

// Connection is one subsystem to connect.
type Connection struct {
	Transport string     // "tcp" or "nbd"
	SubNQN    string     // the volume's subsystem NQN
	NSID      uint32     // its namespace; 0: the subsystem's only one
	HostNQN   string     // the node's host NQN
	HostID    string     // the kernel's host ID (UUID), reservations key on it
	Endpoints []Endpoint // every path the node may use (publish context)
	// DHCHAPSecret and DHCHAPCtrlSecret are the DH-HMAC-CHAP host and
	// controller secrets ("DHHC-1:..."), empty without authentication.
	DHCHAPSecret     string
	DHCHAPCtrlSecret string
}

// Endpoint is one address a subsystem is reachable at.
type Endpoint struct {
	Addr string // host:port
}

// Usage is what NodeGetVolumeStats reports for a mounted filesystem.
type Usage struct {
	BytesTotal, BytesAvailable, BytesUsed    int64
	InodesTotal, InodesAvailable, InodesUsed int64
}
