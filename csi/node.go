package csi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// nodeDefaultFSType is the filesystem of a mount volume whose capability and
// StorageClass name none.
const nodeDefaultFSType = "ext4"

// expandWait bounds NodeExpandVolume's wait for the kernel to see the
// namespace's new size; rescanAfter is when it asks the controllers to
// rescan rather than wait for the namespace change notice alone.
const (
	expandWait  = 30 * time.Second
	rescanAfter = 3 * time.Second
)

// prober is the optional Host extra Probe asks (the real host: the
// kernel's NVMe-oF host or NBD is there).
type prober interface {
	Probe(ctx context.Context) error
}

// rescanner is the optional Host extra NodeExpandVolume asks when the
// kernel is slow to see a new size.
type rescanner interface {
	Rescan(ctx context.Context, subNQN string) error
}

// node is the Node service (§1.10).
type node struct {
	csipb.UnimplementedNodeServer
	d      *Driver
	host   Host
	state  *stateDir
	nqn    string // node ID and the kernel's hostnqn
	hostID string
	api    *blkAPI // blkd's API, for the host registry (§1.9); nil without --api
	zone   string  // --zone, else the Kubernetes node's zone label (§1.8)
}

// start finds the node's identity, opens the state directory and
// converges with what the records say was staged: an NBD attachment
// lived in the previous process and is made again.
func (n *node) start() error {
	cfg := n.d.cfg
	n.host = cfg.Host
	nqn, id, err := NodeIdentity(cfg.HostNQN, cfg.HostID)
	if err != nil {
		return fmt.Errorf("csi: node identity: %w", err)
	}
	n.nqn, n.hostID = nqn, id
	if n.state, err = openStateDir(cfg.StateDir); err != nil {
		return err
	}
	if cfg.API != "" {
		if n.api, err = newBlkAPI(cfg.API, cfg.TLSDir, cfg.TLSName); err != nil {
			return err
		}
	}
	recs, err := n.state.all()
	if err != nil {
		n.d.log.Warn("staging records skipped", "err", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, r := range recs {
		n.converge(ctx, r)
	}
	n.zone = cfg.Zone
	if n.zone == "" && cfg.NodeName != "" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		if n.zone, err = inClusterKube().nodeZone(ctx, cfg.NodeName); err != nil {
			n.d.log.Warn("no zone: reading the node's topology.kubernetes.io/zone label failed", "node", cfg.NodeName, "err", err)
		}
	}
	if err := n.register(ctx); err != nil {
		// NodeGetInfo registers again: kubelet calls it at registration.
		n.d.log.Warn("host registration failed; retried at NodeGetInfo", "err", err)
	}
	n.d.log.Info("node service started", "node_id", n.nqn, "host_id", n.hostID, "staged", len(recs))
	return nil
}

// converge checks one record against the kernel at start.
func (n *node) converge(ctx context.Context, r *stageRecord) {
	dev, ok, err := n.host.Device(ctx, r.SubNQN)
	switch {
	case err != nil:
		n.d.log.Warn("staged volume: cannot read its device", "volume", r.VolumeID, "err", err)
	case ok:
		if dev != r.Device && r.Device != "" {
			n.d.log.Warn("staged volume: device changed", "volume", r.VolumeID, "was", r.Device, "now", dev)
		}
	case r.Transport == "nbd" && !r.Auth:
		// The NBD device died with the previous process: attach again,
		// so the next NodeStageVolume (or the pod's restart) finds it.
		dev, err := n.host.Connect(ctx, n.connection(r, nil))
		if err != nil {
			n.d.log.Warn("staged NBD volume: reattach failed", "volume", r.VolumeID, "err", err)
			return
		}
		n.d.log.Warn("staged NBD volume reattached; its mounts need the volume staged again", "volume", r.VolumeID, "device", dev)
	default:
		n.d.log.Info("staged volume not connected (the node restarted?); NodeStageVolume connects it again", "volume", r.VolumeID)
	}
}

func (n *node) close(ctx context.Context) error {
	if c, ok := n.host.(interface{ closeNBD() error }); ok {
		return c.closeNBD()
	}
	return nil
}

// probe is the node's part of Identity.Probe: the state directory is
// writable and the host can attach volumes.
func (n *node) probe(ctx context.Context) error {
	if err := n.state.writable(); err != nil {
		return err
	}
	if p, ok := n.host.(prober); ok {
		return p.Probe(ctx)
	}
	return nil
}

// connection is what Host.Connect needs for a record (secrets from the
// request, never from the record).
func (n *node) connection(r *stageRecord, secrets map[string]string) Connection {
	eps := make([]Endpoint, len(r.Endpoints))
	for i, e := range r.Endpoints {
		eps[i] = Endpoint{Addr: e}
	}
	return Connection{Transport: r.Transport, SubNQN: r.SubNQN, NSID: r.NSID, HostNQN: n.nqn, HostID: n.hostID,
		Endpoints: eps, DHCHAPSecret: secrets[secretDHCHAP], DHCHAPCtrlSecret: secrets[secretDHCHAPCtrl]}
}

// nodeCap is a validated volume capability.
type nodeCap struct {
	block      bool
	fsType     string
	mountFlags []string
	mode       csipb.VolumeCapability_AccessMode_Mode
}

func (c nodeCap) readOnly() bool {
	return c.mode == csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY ||
		c.mode == csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// nodeCapability applies §1.3's access mode table.
func nodeCapability(vc *csipb.VolumeCapability, volCtx map[string]string) (nodeCap, error) {
	if vc == nil {
		return nodeCap{}, status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	var c nodeCap
	if vc.GetAccessMode() == nil {
		return c, status.Error(codes.InvalidArgument, "volume_capability.access_mode is required")
	}
	c.mode = vc.GetAccessMode().GetMode()
	switch {
	case vc.GetBlock() != nil:
		c.block = true
	case vc.GetMount() != nil:
		c.fsType = vc.GetMount().GetFsType()
		if c.fsType == "" {
			c.fsType = volCtx[ctxFSType]
		}
		if c.fsType == "" {
			c.fsType = nodeDefaultFSType
		}
		if c.fsType != "ext4" && c.fsType != "xfs" {
			return c, status.Errorf(codes.InvalidArgument, "filesystem %q is not supported: ext4 or xfs", c.fsType)
		}
		c.mountFlags = vc.GetMount().GetMountFlags()
	default:
		return c, status.Error(codes.InvalidArgument, "volume_capability needs an access type: block or mount")
	}
	switch c.mode {
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER, csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
	case csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		if !c.block {
			return c, status.Error(codes.InvalidArgument, "MULTI_NODE_MULTI_WRITER is for block volumes only: ext4 and xfs are not cluster filesystems")
		}
	default:
		return c, status.Errorf(codes.InvalidArgument, "access mode %v is not supported", c.mode)
	}
	return c, nil
}

// stageMountOptions are the options of the staging mount: the
// capability's flags, ro for read-only modes, and for ext4 shared
// read-only noload (no journal replay writing to a volume others read).
func stageMountOptions(c nodeCap) []string {
	opts := slices.Clone(c.mountFlags)
	if c.readOnly() {
		opts = append(opts, "ro")
		if c.fsType == "ext4" && c.mode == csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY {
			opts = append(opts, "noload")
		}
	}
	return opts
}

// parsePublishEndpoints reads the publish context's endpoints, keeping the TCP
// ones (the kernel host and blk's NBD path both use NVMe/TCP).
func parsePublishEndpoints(s string) ([]string, error) {
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		kind, addr, ok := strings.Cut(e, ":")
		i := strings.LastIndexByte(addr, ':')
		if !ok || i <= 0 {
			return nil, fmt.Errorf("endpoint %q is not TRANSPORT:ADDR:PORT", e)
		}
		// The controller writes an IPv6 address without brackets.
		host, port := strings.Trim(addr[:i], "[]"), addr[i+1:]
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return nil, fmt.Errorf("endpoint %q: port %q", e, port)
		}
		addr = net.JoinHostPort(host, port)
		if kind == "tcp" {
			out = append(out, addr)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("publish context endpoints %q name no tcp endpoint", s)
	}
	return out, nil
}

// transportOf picks how to connect: the publish context's transport,
// "tcp" by default; "tcp,nbd" falls back to NBD only when this kernel
// has no NVMe/TCP host (§10 Q6).
func (n *node) transportOf(ctx context.Context, pc map[string]string) (string, error) {
	switch t := pc[PubTransport]; t {
	case "", TransportTCP:
		return TransportTCP, nil
	case TransportNBD:
		return TransportNBD, nil
	case TransportTCPNBD:
		if l, ok := n.host.(interface{ loadTCP(context.Context) error }); ok {
			if err := l.loadTCP(ctx); err != nil {
				n.d.log.Warn("no NVMe/TCP host on this node: falling back to NBD", "err", err)
				return TransportNBD, nil
			}
		}
		return TransportTCP, nil
	default:
		return "", status.Errorf(codes.InvalidArgument, "publish context transport %q is not tcp, nbd or tcp,nbd", t)
	}
}

// newRecord builds the staging record of a NodeStageVolume request.
func (n *node) newRecord(ctx context.Context, req *csipb.NodeStageVolumeRequest, c nodeCap) (*stageRecord, error) {
	pc := req.GetPublishContext()
	sub := pc[PubSubNQN]
	if sub == "" {
		return nil, status.Errorf(codes.InvalidArgument, "publish_context has no %q: was the volume published to this node (ControllerPublishVolume)?", PubSubNQN)
	}
	eps, err := parsePublishEndpoints(pc[PubEndpoints])
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	var nsid uint32
	if s := pc[PubNSID]; s != "" {
		v, err := strconv.ParseUint(s, 10, 32)
		if err != nil || v == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "publish context nsid %q is not a namespace ID", s)
		}
		nsid = uint32(v)
	}
	auth := pc[PubAuth] == AuthDHCHAP
	if auth && req.GetSecrets()[secretDHCHAP] == "" {
		return nil, status.Errorf(codes.InvalidArgument, "the volume needs DH-HMAC-CHAP: the node-stage secret has no %q", secretDHCHAP)
	}
	tr, err := n.transportOf(ctx, pc)
	if err != nil {
		return nil, err
	}
	return &stageRecord{VolumeID: req.GetVolumeId(), Transport: tr, SubNQN: sub, NSID: nsid, Endpoints: eps, Auth: auth,
		Block: c.block, FSType: c.fsType, MountFlags: c.mountFlags, AccessMode: c.mode.String(),
		StagingPath: filepath.Clean(req.GetStagingTargetPath()), StagedAt: time.Now().UTC()}, nil
}

// sameStage says whether an existing record is the same stage as a new
// request's (then NodeStageVolume is idempotent), or why not.
func sameStage(old, new *stageRecord) error {
	switch {
	case old.StagingPath != new.StagingPath:
		return fmt.Errorf("volume %s is staged at %s, not %s", old.VolumeID, old.StagingPath, new.StagingPath)
	case old.Block != new.Block:
		return fmt.Errorf("volume %s is staged as %s, not %s", old.VolumeID, accessTypeName(old.Block), accessTypeName(new.Block))
	case old.FSType != new.FSType:
		return fmt.Errorf("volume %s is staged with %s, not %s", old.VolumeID, old.FSType, new.FSType)
	case old.AccessMode != new.AccessMode:
		return fmt.Errorf("volume %s is staged %s, not %s", old.VolumeID, old.AccessMode, new.AccessMode)
	case !slices.Equal(old.MountFlags, new.MountFlags):
		return fmt.Errorf("volume %s is staged with mount flags %v, not %v", old.VolumeID, old.MountFlags, new.MountFlags)
	case old.SubNQN != new.SubNQN:
		return fmt.Errorf("volume %s is staged from %s, not %s", old.VolumeID, old.SubNQN, new.SubNQN)
	}
	return nil
}

func accessTypeName(block bool) string {
	if block {
		return "block"
	}
	return "mount"
}

// requireVolumePath checks the volume_id and the path field that every
// per-volume node call carries.
func requireVolumePath(id, field, path string) error {
	if id == "" {
		return status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if path == "" {
		return status.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	return nil
}

// loadRecord reads volume id's stage record (nil when it has none), a
// read failure as Internal.
func (n *node) loadRecord(id string) (*stageRecord, error) {
	rec, err := n.state.load(id)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return rec, nil
}

// lockRecord takes volume id's lock and reads its stage record; the
// caller defers unlock when err is nil.
func (n *node) lockRecord(id string) (rec *stageRecord, unlock func(), err error) {
	unlock, err = n.d.lock(id)
	if err != nil {
		return nil, nil, err
	}
	if rec, err = n.loadRecord(id); err != nil {
		unlock()
		return nil, nil, err
	}
	return rec, unlock, nil
}

func (n *node) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := requireVolumePath(id, "staging_target_path", path); err != nil {
		return nil, err
	}
	c, err := nodeCapability(req.GetVolumeCapability(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	unlock, err := n.d.lock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := n.newRecord(ctx, req, c)
	if err != nil {
		return nil, err
	}
	old, err := n.loadRecord(id)
	if err != nil {
		return nil, err
	}
	if old != nil && old.Complete {
		if err := sameStage(old, rec); err != nil {
			return nil, status.Error(codes.AlreadyExists, err.Error())
		}
	}
	if old != nil {
		rec.StagedAt, rec.Targets, rec.Device, rec.Complete = old.StagedAt, old.Targets, old.Device, old.Complete
	}
	// The record first: a plugin killed during the connect leaves what
	// NodeUnstageVolume needs to undo it.
	if err := n.state.save(rec); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	dev, err := n.host.Connect(ctx, n.connection(rec, req.GetSecrets()))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "connect volume %s (%s): %v", id, rec.SubNQN, err)
	}
	if rec.Device != dev {
		rec.Device = dev
		if err := n.state.save(rec); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if !c.block {
		if err := n.stageMount(ctx, rec, c, req.GetVolumeContext()); err != nil {
			return nil, err
		}
	}
	if !rec.Complete {
		rec.Complete = true
		if err := n.state.save(rec); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	n.d.log.Info("volume staged", "volume", id, "device", dev, "transport", rec.Transport, "path", rec.StagingPath)
	return &csipb.NodeStageVolumeResponse{}, nil
}

// stageMount makes the filesystem on first use and mounts it at the
// staging path (§1.10 step 3).
func (n *node) stageMount(ctx context.Context, rec *stageRecord, c nodeCap, volCtx map[string]string) error {
	src, mounted, err := n.host.Mounted(ctx, rec.StagingPath)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if mounted {
		if src != rec.Device {
			return status.Errorf(codes.AlreadyExists, "staging path %s has %s mounted, not volume %s's %s", rec.StagingPath, src, rec.VolumeID, rec.Device)
		}
		return nil
	}
	fs, err := n.host.FSType(ctx, rec.Device)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	switch {
	case fs == "" && c.readOnly():
		return status.Errorf(codes.FailedPrecondition, "volume %s has no filesystem and is staged read-only: nothing to mount", rec.VolumeID)
	case fs == "":
		opts := strings.Fields(volCtx[ctxMkfsOptions])
		if err := n.host.Mkfs(ctx, rec.Device, c.fsType, opts); err != nil {
			return status.Errorf(codes.Internal, "mkfs %s on volume %s: %v", c.fsType, rec.VolumeID, err)
		}
		n.d.log.Info("filesystem made", "volume", rec.VolumeID, "fs_type", c.fsType, "device", rec.Device)
	case fs != c.fsType:
		return status.Errorf(codes.FailedPrecondition, "volume %s holds %s, not the %s asked for: it is never reformatted", rec.VolumeID, fs, c.fsType)
	}
	if err := os.MkdirAll(rec.StagingPath, 0o750); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if err := n.host.Mount(ctx, rec.Device, rec.StagingPath, c.fsType, stageMountOptions(c)); err != nil {
		return status.Errorf(codes.Internal, "mount volume %s: %v", rec.VolumeID, err)
	}
	return nil
}

func (n *node) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := requireVolumePath(id, "staging_target_path", path); err != nil {
		return nil, err
	}
	rec, unlock, err := n.lockRecord(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if rec == nil {
		return &csipb.NodeUnstageVolumeResponse{}, nil // nothing staged here: done
	}
	if rec.StagingPath != filepath.Clean(path) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is staged at %s, not %s", id, rec.StagingPath, path)
	}
	for _, t := range rec.Targets {
		if _, ok, _ := n.host.Mounted(ctx, t.Path); ok {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published at %s: unpublish it first", id, t.Path)
		}
	}
	if !rec.Block {
		src, mounted, err := n.host.Mounted(ctx, rec.StagingPath)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if mounted && rec.Device != "" && src != rec.Device {
			return nil, status.Errorf(codes.FailedPrecondition, "staging path %s has %s mounted, not volume %s's %s", rec.StagingPath, src, id, rec.Device)
		}
		if mounted {
			if err := n.host.Unmount(ctx, rec.StagingPath); err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
		}
	}
	if err := n.host.Disconnect(ctx, rec.SubNQN); err != nil {
		return nil, status.Errorf(codes.Internal, "disconnect volume %s: %v", id, err)
	}
	if err := n.state.remove(id); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	n.d.log.Info("volume unstaged", "volume", id, "device", rec.Device)
	return &csipb.NodeUnstageVolumeResponse{}, nil
}

func (n *node) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	id, target, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	if err := requireVolumePath(id, "target_path", target); err != nil {
		return nil, err
	}
	c, err := nodeCapability(req.GetVolumeCapability(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	if staging == "" {
		return nil, status.Error(codes.InvalidArgument, "staging_target_path is required (the plugin stages volumes)")
	}
	target = filepath.Clean(target)
	rec, unlock, err := n.lockRecord(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if rec == nil || rec.Device == "" || rec.StagingPath != filepath.Clean(staging) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", id, staging)
	}
	if rec.Block != c.block {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s is staged as %s, published as %s", id, accessTypeName(rec.Block), accessTypeName(c.block))
	}
	readOnly := req.GetReadonly() || c.readOnly() || req.GetPublishContext()[PubReadonly] == "true"
	want := publishedTarget{Path: target, ReadOnly: readOnly, AccessMode: c.mode.String()}
	if err := n.checkWriters(rec, want); err != nil {
		return nil, err
	}
	src := rec.StagingPath
	if rec.Block {
		src = rec.Device
	} else if s, ok, err := n.host.Mounted(ctx, rec.StagingPath); err != nil || !ok || s != rec.Device {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not mounted at its staging path %s", id, rec.StagingPath)
	}
	if s, ok, err := n.host.Mounted(ctx, target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if ok {
		if s != rec.Device {
			return nil, status.Errorf(codes.AlreadyExists, "target %s has %s mounted, not volume %s", target, s, id)
		}
		if old, known := rec.target(target); known && old.ReadOnly != readOnly {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is published at %s with readonly=%v", id, target, old.ReadOnly)
		}
		return &csipb.NodePublishVolumeResponse{}, n.saveTarget(rec, want)
	}
	if err := makeTarget(target, rec.Block); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	opts := []string{"bind"}
	if readOnly {
		opts = append(opts, "ro")
	}
	if !rec.Block {
		opts = append(opts, c.mountFlags...)
	}
	if err := n.host.Mount(ctx, src, target, "", opts); err != nil {
		return nil, status.Errorf(codes.Internal, "publish volume %s at %s: %v", id, target, err)
	}
	if err := n.saveTarget(rec, want); err != nil {
		return nil, err
	}
	n.d.log.Info("volume published", "volume", id, "target", target, "readonly", readOnly)
	return &csipb.NodePublishVolumeResponse{}, nil
}

// checkWriters applies SINGLE_NODE_SINGLE_WRITER: one publish only.
func (n *node) checkWriters(rec *stageRecord, want publishedTarget) error {
	single := csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER.String()
	for _, t := range rec.Targets {
		if t.Path != want.Path && (t.AccessMode == single || want.AccessMode == single) {
			return status.Errorf(codes.FailedPrecondition, "volume %s is published at %s and one of the two is SINGLE_NODE_SINGLE_WRITER", rec.VolumeID, t.Path)
		}
	}
	return nil
}

func (n *node) saveTarget(rec *stageRecord, t publishedTarget) error {
	rec.addTarget(t)
	if err := n.state.save(rec); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

// makeTarget creates the publish target: a directory for a mount
// volume, a file for a block volume's device to be bound onto.
func makeTarget(target string, block bool) error {
	if !block {
		return os.MkdirAll(target, 0o750)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

func (n *node) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if err := requireVolumePath(id, "target_path", target); err != nil {
		return nil, err
	}
	target = filepath.Clean(target)
	rec, unlock, err := n.lockRecord(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	src, mounted, err := n.host.Mounted(ctx, target)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if mounted {
		if rec == nil || (rec.Device != "" && src != rec.Device) {
			return nil, status.Errorf(codes.FailedPrecondition, "target %s has %s mounted, which is not volume %s staged on this node", target, src, id)
		}
		if err := n.host.Unmount(ctx, target); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove target %s: %v", target, err)
	}
	if rec != nil {
		if _, known := rec.target(target); known {
			rec.dropTarget(target)
			if err := n.state.save(rec); err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
		}
	}
	if mounted {
		n.d.log.Info("volume unpublished", "volume", id, "target", target)
	}
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// volumeAt finds a staged volume's record and checks that path is its
// staging path or one of its targets, mounted: NotFound otherwise (the
// spec's answer for both an unknown volume and a wrong path).
func (n *node) volumeAt(ctx context.Context, id, path string) (*stageRecord, error) {
	rec, err := n.loadRecord(id)
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.Device == "" {
		return nil, status.Errorf(codes.NotFound, "volume %s is not staged on this node", id)
	}
	path = filepath.Clean(path)
	if _, known := rec.target(path); !known && path != rec.StagingPath {
		return nil, status.Errorf(codes.NotFound, "volume %s is not staged or published at %s", id, path)
	}
	if rec.Block && path == rec.StagingPath {
		return rec, nil // a block volume's staging path holds no mount
	}
	src, ok, err := n.host.Mounted(ctx, path)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if !ok || src != rec.Device {
		return nil, status.Errorf(codes.NotFound, "volume %s is not mounted at %s", id, path)
	}
	return rec, nil
}

func (n *node) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := requireVolumePath(id, "volume_path", path); err != nil {
		return nil, err
	}
	rec, err := n.volumeAt(ctx, id, path)
	if err != nil {
		return nil, err
	}
	if rec.Block {
		size, err := n.host.DeviceSize(ctx, rec.Device)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{{Unit: csipb.VolumeUsage_BYTES, Total: size}}}, nil
	}
	u, err := n.host.Stats(ctx, path)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{
		{Unit: csipb.VolumeUsage_BYTES, Total: u.BytesTotal, Available: u.BytesAvailable, Used: u.BytesUsed},
		{Unit: csipb.VolumeUsage_INODES, Total: u.InodesTotal, Available: u.InodesAvailable, Used: u.InodesUsed},
	}}, nil
}

// NodeGetVolumeHealth reports a staged volume's paths: INACCESSIBLE when
// it has no device any more, DEGRADED when a controller is not live (the
// spec v1.13 successor of VOLUME_CONDITION, §1.3).
func (n *node) NodeGetVolumeHealth(ctx context.Context, req *csipb.NodeGetVolumeHealthRequest) (*csipb.NodeGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	rec, err := n.loadRecord(id)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s is not staged on this node", id)
	}
	h := &csipb.VolumeHealth{VolumeId: id}
	entry := func(s csipb.VolumeHealthErrorType, reason, msg string) {
		h.HealthStatuses = append(h.HealthStatuses, &csipb.VolumeHealth_VolumeHealthEntry{Status: s, Reason: reason, Message: msg})
	}
	if _, ok, err := n.host.Device(ctx, rec.SubNQN); err != nil || !ok {
		entry(csipb.VolumeHealthErrorType_INACCESSIBLE, "NotConnected", fmt.Sprintf("%s has no device on this node (%v)", rec.SubNQN, err))
	} else if live, err := n.host.Healthy(ctx, rec.SubNQN); err != nil || !live {
		entry(csipb.VolumeHealthErrorType_DEGRADED, "PathNotLive", fmt.Sprintf("a controller of %s is not live (%v)", rec.SubNQN, err))
	}
	return &csipb.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

func (n *node) NodeExpandVolume(ctx context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := requireVolumePath(id, "volume_path", path); err != nil {
		return nil, err
	}
	unlock, err := n.d.lock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := n.volumeAt(ctx, id, path)
	if err != nil {
		return nil, err
	}
	size, err := n.waitSize(ctx, rec, req.GetCapacityRange().GetRequiredBytes())
	if err != nil {
		return nil, err
	}
	if !rec.Block {
		if err := n.host.Resize(ctx, rec.Device, rec.StagingPath, rec.FSType); err != nil {
			return nil, status.Errorf(codes.Internal, "grow the filesystem of volume %s: %v", id, err)
		}
		n.d.log.Info("filesystem grown", "volume", id, "bytes", size)
	}
	return &csipb.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// waitSize waits until the kernel sees the device at least want bytes
// large (the target's namespace change notice makes the host rescan;
// after rescanAfter the plugin asks for a rescan itself), then returns
// its size.
func (n *node) waitSize(ctx context.Context, rec *stageRecord, want int64) (int64, error) {
	start := time.Now()
	rescanned := false
	for {
		size, err := n.host.DeviceSize(ctx, rec.Device)
		if err != nil {
			return 0, status.Error(codes.Internal, err.Error())
		}
		if size >= want {
			return size, nil
		}
		waited := time.Since(start)
		if waited > expandWait {
			return 0, status.Errorf(codes.Unavailable, "volume %s: the kernel sees %d bytes after %v, not the %d asked for", rec.VolumeID, size, expandWait, want)
		}
		if r, ok := n.host.(rescanner); ok && !rescanned && waited > rescanAfter {
			rescanned = true
			if err := r.Rescan(ctx, rec.SubNQN); err != nil {
				n.d.log.Warn("rescan failed", "volume", rec.VolumeID, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return 0, status.FromContextError(ctx.Err()).Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (n *node) NodeGetCapabilities(ctx context.Context, req *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	var caps []*csipb.NodeServiceCapability
	for _, t := range []csipb.NodeServiceCapability_RPC_Type{
		csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csipb.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{
			Rpc: &csipb.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// register records this node in blkd's host registry (§1.9): the
// controller publishes volumes only to registered hosts. An idempotent
// upsert; a blkd without the registry is no error.
func (n *node) register(ctx context.Context) error {
	if n.api == nil {
		return nil
	}
	body := struct {
		HostNQN string `json:"host_nqn"`
		Name    string `json:"name,omitempty"`
		Zone    string `json:"zone,omitempty"`
	}{n.nqn, n.d.cfg.NodeName, n.zone}
	err := n.api.do(ctx, http.MethodPost, "/v1/hosts", body, nil)
	var ae *apiError
	if errors.As(err, &ae) && ae.noRoute() {
		return nil
	}
	return err
}

func (n *node) NodeGetInfo(ctx context.Context, req *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	if err := n.register(ctx); err != nil {
		return nil, rpcError(err, "register host "+n.nqn+" with blkd")
	}
	// Always a topology, as VOLUME_ACCESSIBILITY_CONSTRAINTS asks; a
	// node without a zone has no segment (a value may not be empty).
	topo := &csipb.Topology{Segments: map[string]string{}}
	if z := n.zone; z != "" {
		topo.Segments[TopologyKey] = z
	}
	return &csipb.NodeGetInfoResponse{NodeId: n.nqn, AccessibleTopology: topo}, nil
}

// kube reads one thing of the Kubernetes API: a node's zone label. Plain
// net/http with the pod's service-account token, no client library
// (§1.8); RBAC: get nodes.
type kube struct {
	base      string // https://HOST:PORT
	tokenFile string
	hc        *http.Client
}

// inClusterKube is the API server of the pod's cluster, as its
// environment and service-account mount name it.
func inClusterKube() *kube {
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
	tr := &http.Transport{}
	if pem, err := os.ReadFile(sa + "ca.crt"); err == nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &kube{base: "https://" + net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")),
		tokenFile: sa + "token", hc: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// zoneLabel is the well-known label of a node's zone.
const zoneLabel = "topology.kubernetes.io/zone"

// nodeZone is the node's zone label, "" when it has none.
func (k *kube) nodeZone(ctx context.Context, name string) (string, error) {
	token, err := os.ReadFile(k.tokenFile)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.base+"/api/v1/nodes/"+url.PathEscape(name), nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	resp, err := k.hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("GET node %s: %s: %s", name, resp.Status, bytes.TrimSpace(b))
	}
	var node struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&node); err != nil {
		return "", fmt.Errorf("GET node %s: %v", name, err)
	}
	return node.Metadata.Labels[zoneLabel], nil
}
