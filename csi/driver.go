package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DriverName is the CSI driver's name: the CSIDriver object's, the
// StorageClass provisioner's and GetPluginInfo's.
const DriverName = "csi.blk-project.github.io"

// Mode says which services one blk-csi process serves.
type Mode string

const (
	ModeController Mode = "controller" // the Deployment beside the sidecars
	ModeNode       Mode = "node"       // the DaemonSet on every node
	ModeAll        Mode = "all"        // both: tests and single-machine use
)

// Config is one driver's configuration, from cmd/blk-csi's flags.
type Config struct {
	Mode     Mode
	API      string // blkd's API address: host:port or https://host:port
	TLSDir   string // ca.crt, NAME.crt, NAME.key for mutual TLS; "" for plain HTTP
	TLSName  string // NAME of the certificate in TLSDir
	NodeName string // Kubernetes node name (node mode)
	HostNQN  string // the node's host NQN; "" reads /etc/nvme/hostnqn (§1.4)
	HostID   string // the kernel's host ID; "" derives it (§1.4)
	Zone     string // topology zone of this node; "" for none
	StateDir string // node staging records
	Version  string // vendor version reported by GetPluginInfo
	Host     Host   // the machine's kernel operations (node mode)
	Log      *slog.Logger
}

// Driver serves the CSI services of one process.
type Driver struct {
	cfg Config
	log *slog.Logger

	ident *identity
	ctrl  *controller
	node  *node

	busy sync.Map // ID -> *sync.Mutex: one call per volume or snapshot at a time
}

// New checks the configuration and prepares the services its mode serves.
func New(cfg Config) (*Driver, error) {
	switch cfg.Mode {
	case ModeController, ModeNode, ModeAll:
	default:
		return nil, fmt.Errorf("csi: mode %q is not controller, node or all", cfg.Mode)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	d := &Driver{cfg: cfg, log: cfg.Log}
	d.ident = &identity{d: d}
	if cfg.Mode != ModeNode {
		d.ctrl = &controller{d: d}
		if err := d.ctrl.start(); err != nil {
			return nil, err
		}
	}
	if cfg.Mode != ModeController {
		if cfg.Host == nil {
			return nil, errors.New("csi: node mode needs a Host")
		}
		d.node = &node{d: d}
		if err := d.node.start(); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Register adds the driver's services to a gRPC server.
func (d *Driver) Register(s *grpc.Server) {
	csipb.RegisterIdentityServer(s, d.ident)
	if d.ctrl != nil {
		csipb.RegisterControllerServer(s, d.ctrl)
	}
	if d.node != nil {
		csipb.RegisterNodeServer(s, d.node)
	}
}

// lock takes the per-ID lock for a whole call. A second call on the same
// ID while one runs answers Aborted at once (the sidecars retry with
// backoff) instead of queueing behind a slow blkd call (§1.2).
func (d *Driver) lock(id string) (unlock func(), err error) {
	v, _ := d.busy.LoadOrStore(id, new(sync.Mutex))
	mu := v.(*sync.Mutex)
	if !mu.TryLock() {
		return nil, status.Errorf(codes.Aborted, "an operation on %s is in progress", id)
	}
	return mu.Unlock, nil
}

// Close releases what the services hold.
func (d *Driver) Close(ctx context.Context) error {
	var errs []error
	if d.node != nil {
		errs = append(errs, d.node.close(ctx))
	}
	if d.ctrl != nil {
		errs = append(errs, d.ctrl.close(ctx))
	}
	return errors.Join(errs...)
}
