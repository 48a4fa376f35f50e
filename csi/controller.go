package csi

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/nvme"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// controller is the Controller service (docs/operations.md §1.5): each
// call is one or a few requests to blkd's /v1 API; the controller keeps
// no state of its own but the read-only flag of its publications
// (published).
type controller struct {
	csipb.UnimplementedControllerServer
	d   *Driver
	api *blkAPI

	// published remembers, per volume and node, whether this process
	// published it read-only: blkd's allow list has no read-only hosts,
	// and a second publish that differs only in readonly must answer
	// AlreadyExists. After a restart the record is gone and such a
	// publish is taken as the first one (the node mounts per its own
	// publish context either way).
	mu        sync.Mutex
	published map[pubKey]bool
}

type pubKey struct{ vol, node string }

// TopologyKey is the topology segment key of a node's zone (§1.8).
const TopologyKey = "topology.blk-project.github.io/zone"

const (
	defaultVolumeSize = 1 << 30 // a CreateVolume without capacity_range
	minAlign          = 4096    // blk sizes are multiples of 4 KiB
	// onlineWait bounds how long ControllerPublish waits for a volume
	// still being created (§1.5); then Unavailable, the attacher retries.
	onlineWait = 30 * time.Second
)

// Secret keys of the controller-publish Secret (§1.7).
const (
	secretDHCHAP     = "dhchapSecret"
	secretDHCHAPCtrl = "dhchapCtrlSecret"
)

// Publish context keys: what the node reads at NodeStage (§1.5). None is
// a secret: the VolumeAttachment's status holds them.
const (
	PubSubNQN    = "subnqn"
	PubNSID      = "nsid"
	PubEndpoints = "endpoints" // tcp:ADDR:PORT[,rdma:ADDR:PORT]
	PubTransport = "transport"
	PubReadonly  = "readonly"
	PubAuth      = "auth" // "dhchap" or "none"
)

func (c *controller) start() error {
	a, err := newBlkAPI(c.d.cfg.API, c.d.cfg.TLSDir, c.d.cfg.TLSName)
	if err != nil {
		return err
	}
	c.api = a
	c.published = map[pubKey]bool{}
	return nil
}

func (c *controller) close(ctx context.Context) error {
	c.api.hc.CloseIdleConnections()
	return nil
}

// controllerCaps are exactly §1.3's.
var controllerCaps = []csipb.ControllerServiceCapability_RPC_Type{
	csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	csipb.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csipb.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
	csipb.ControllerServiceCapability_RPC_GET_VOLUME,
	csipb.ControllerServiceCapability_RPC_GET_CAPACITY,
	csipb.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csipb.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csipb.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	csipb.ControllerServiceCapability_RPC_PUBLISH_READONLY,
	csipb.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
	csipb.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	csipb.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
}

func (c *controller) ControllerGetCapabilities(ctx context.Context, req *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	caps := make([]*csipb.ControllerServiceCapability, len(controllerCaps))
	for i, t := range controllerCaps {
		caps[i] = &csipb.ControllerServiceCapability{Type: &csipb.ControllerServiceCapability_Rpc{
			Rpc: &csipb.ControllerServiceCapability_RPC{Type: t}}}
	}
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// checkCaps checks volume capabilities against §1.3's table.
func checkCaps(caps []*csipb.VolumeCapability) error {
	if len(caps) == 0 {
		return invalid("volume_capabilities: none given")
	}
	for _, vc := range caps {
		if err := checkCap(vc); err != nil {
			return err
		}
	}
	return nil
}

func checkCap(vc *csipb.VolumeCapability) error {
	if vc == nil {
		return invalid("volume_capability: none given")
	}
	block := vc.GetBlock() != nil
	mnt := vc.GetMount()
	if !block && mnt == nil {
		return invalid("volume_capability: neither block nor mount")
	}
	if mnt != nil {
		switch mnt.GetFsType() {
		case "", "ext4", "xfs":
		default:
			return invalid("volume_capability: fs_type %q: the driver makes ext4 or xfs", mnt.GetFsType())
		}
	}
	m := vc.GetAccessMode().GetMode()
	switch m {
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return nil
	case csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		if block {
			return nil
		}
		return invalid("access mode %s needs a block volume: ext4 and xfs are not cluster filesystems", m)
	}
	return invalid("access mode %s is not supported", m)
}

// singleNode reports whether the capability lets one node at a time use
// the volume.
func singleNode(vc *csipb.VolumeCapability) bool {
	switch vc.GetAccessMode().GetMode() {
	case csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
		csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
		csipb.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER:
		return false
	}
	return true
}

// volumeSize is the size to create for a capacity range: required_bytes
// rounded up to align, checked against limit_bytes; fallback when
// neither asks for a size.
func volumeSize(r *csipb.CapacityRange, align, fallback int64) (int64, error) {
	req, lim := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, invalid("capacity_range: negative bytes (required %d, limit %d)", req, lim)
	}
	if lim > 0 && req > lim {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range: required_bytes %d over limit_bytes %d", req, lim)
	}
	size := req
	if size == 0 {
		size = fallback
		if lim > 0 && size > lim {
			size = lim / align * align
		}
	}
	size = (size + align - 1) / align * align
	if size == 0 || (lim > 0 && size > lim) {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range: no multiple of %d bytes between required_bytes %d and limit_bytes %d", align, req, lim)
	}
	return size, nil
}

func (c *controller) CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, invalid("name: none given")
	}
	if err := checkCaps(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	p, err := parseParams(req.GetParameters())
	if err != nil {
		return nil, invalid("%v", err)
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if fs := vc.GetMount().GetFsType(); fs != "" && req.GetParameters()[ParamSidecarFSType] == "" && req.GetParameters()[ParamFSType] == "" {
			p.FSType = fs
		}
	}
	if req.GetVolumeContentSource().GetVolume() != nil {
		return nil, invalid("volume_content_source: a volume source (CLONE_VOLUME) is not supported: snapshot the volume and create from the snapshot")
	}
	name := blkName(req.GetName())
	unlock, err := c.d.lock(name)
	if err != nil {
		return nil, err
	}
	defer unlock()

	if src := req.GetVolumeContentSource().GetSnapshot(); src != nil {
		return c.createFromSnapshot(ctx, req, name, p, src.GetSnapshotId())
	}
	size, err := volumeSize(req.GetCapacityRange(), int64(max(minAlign, p.BlockSize)), defaultVolumeSize)
	if err != nil {
		return nil, err
	}
	node, topo, err := c.place(ctx, req.GetAccessibilityRequirements(), p)
	if err != nil {
		return nil, err
	}
	sz := api.Size(size)
	creq := api.CreateVolumeRequest{Name: name, Size: &sz, BlockSize: p.BlockSize, Replicas: p.Replicas, Node: node}
	var v api.Volume
	err = c.api.do(ctx, http.MethodPost, "/v1/volumes", creq, &v)
	if is(err, http.StatusConflict, msgVolumeExists) {
		got, gerr := c.api.volume(ctx, name)
		if gerr != nil {
			return nil, rpcError(gerr, "volume "+name+" exists; reading it")
		}
		if why := sameVolume(got, size, p, ""); why != "" {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists with %s", name, why)
		}
		v, err = *got, nil
	}
	if err != nil {
		return nil, rpcError(err, "create volume "+name)
	}
	return &csipb.CreateVolumeResponse{Volume: c.csiVolume(&v, p, topo, nil)}, nil
}

// sameVolume says how an existing volume differs from the one asked for
// ("" when it is the same): size, block size, replicas, source.
func sameVolume(v *api.Volume, size int64, p params, cloneOf string) string {
	switch {
	case int64(v.SizeBytes) != size:
		return fmt.Sprintf("size %d, not %d", v.SizeBytes, size)
	case v.BlockSize != p.BlockSize:
		return fmt.Sprintf("block size %d, not %d", v.BlockSize, p.BlockSize)
	case cloneOf == "" && p.Replicas != 0 && v.WantReplicas != p.Replicas:
		return fmt.Sprintf("%d replicas, not %d", v.WantReplicas, p.Replicas)
	case v.CloneOf != cloneOf && !(cloneOf != "" && v.CloneOf == "" && p.FlattenClones):
		if v.CloneOf == "" {
			return "no snapshot source"
		}
		return "source snapshot " + v.CloneOf
	}
	return ""
}

// createFromSnapshot is CreateVolume with a snapshot source: a clone of
// the snapshot, grown if a larger size is asked, flattened in the
// background with flattenClones.
func (c *controller) createFromSnapshot(ctx context.Context, req *csipb.CreateVolumeRequest, name string, p params, id string) (*csipb.CreateVolumeResponse, error) {
	vol, snap, err := parseSnapshotID(id)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "source snapshot %q: %v", id, err)
	}
	s, err := c.api.snapshot(ctx, vol, snap)
	if err != nil {
		return nil, rpcError(err, "source snapshot "+id)
	}
	align := int64(max(minAlign, p.BlockSize))
	size, err := volumeSize(req.GetCapacityRange(), align, int64(s.SizeBytes))
	if err != nil {
		return nil, err
	}
	if size < int64(s.SizeBytes) {
		return nil, status.Errorf(codes.OutOfRange, "a volume of %d bytes is smaller than its source snapshot %s (%d bytes)", size, id, s.SizeBytes)
	}
	src, err := c.api.volume(ctx, vol)
	if err != nil {
		return nil, rpcError(err, "source volume "+vol)
	}
	if src.BlockSize != p.BlockSize {
		return nil, invalid("blockSize %d differs from the source snapshot's %d: a clone keeps its snapshot's block size", p.BlockSize, src.BlockSize)
	}
	cloneOf := vol + "@" + snap
	var v api.Volume
	err = c.api.do(ctx, http.MethodPost, volPath(vol)+"/snapshots/"+url.PathEscape(snap)+"/clone", api.CloneRequest{Name: name}, &v)
	if is(err, http.StatusConflict, msgVolumeExists) {
		got, gerr := c.api.volume(ctx, name)
		if gerr != nil {
			return nil, rpcError(gerr, "volume "+name+" exists; reading it")
		}
		cmp := *got
		if cmp.CloneOf == cloneOf && cmp.SizeBytes == s.SizeBytes {
			cmp.SizeBytes = uint64(size) // made, its grow not done yet: done below
		}
		if why := sameVolume(&cmp, size, p, cloneOf); why != "" {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists with %s", name, why)
		}
		v, err = *got, nil
	}
	if err != nil {
		return nil, rpcError(err, "clone "+id+" as "+name)
	}
	if int64(v.SizeBytes) < size {
		sz := api.Size(size)
		if err := c.api.do(ctx, http.MethodPost, volPath(name)+"/resize", api.ResizeRequest{Size: &sz}, &v); err != nil {
			return nil, rpcError(err, "grow clone "+name)
		}
	}
	if p.FlattenClones && v.CloneOf != "" && v.Flatten == nil {
		err := c.api.do(ctx, http.MethodPost, volPath(name)+"/flatten", nil, nil)
		if err != nil && statusOf(err) != http.StatusConflict { // 409: flattened or flattening already
			return nil, rpcError(err, "flatten clone "+name)
		}
	}
	src2 := &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{
		Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	topo := requisiteTopology(req.GetAccessibilityRequirements())
	return &csipb.CreateVolumeResponse{Volume: c.csiVolume(&v, p, topo, src2)}, nil
}

// csiVolume is a blk volume as CSI shows it.
func (c *controller) csiVolume(v *api.Volume, p params, topo []*csipb.Topology, src *csipb.VolumeContentSource) *csipb.Volume {
	return &csipb.Volume{
		VolumeId:           v.Name,
		CapacityBytes:      int64(v.SizeBytes),
		VolumeContext:      p.volumeContext(),
		ContentSource:      src,
		AccessibleTopology: topo,
	}
}

// requisiteTopology is the topology a volume is reachable from: every
// requisite zone (a volume is reachable over the network from each).
func requisiteTopology(r *csipb.TopologyRequirement) []*csipb.Topology {
	var out []*csipb.Topology
	for _, t := range r.GetRequisite() {
		if z, ok := t.GetSegments()[TopologyKey]; ok {
			out = append(out, &csipb.Topology{Segments: map[string]string{TopologyKey: z}})
		}
	}
	return out
}

// place picks the primary's node for a volume with topology requirements
// (§1.8): the up member with the most free promise in the first
// preferred zone that has one (then the requisite zones). No
// requirement, or a cluster without zones: blkd places it. It returns
// the topology to report.
func (c *controller) place(ctx context.Context, r *csipb.TopologyRequirement, p params) (node string, topo []*csipb.Topology, err error) {
	var zones []string
	for _, t := range append(slices.Clone(r.GetPreferred()), r.GetRequisite()...) {
		if z, ok := t.GetSegments()[TopologyKey]; ok && !slices.Contains(zones, z) {
			zones = append(zones, z)
		}
	}
	if len(zones) == 0 {
		return "", nil, nil
	}
	cl, err := c.api.cluster(ctx)
	if err != nil {
		return "", nil, rpcError(err, "read the cluster for placement")
	}
	zoned := false
	for _, m := range cl.Members {
		zoned = zoned || m.Zone != ""
	}
	if !zoned {
		// blkd has no failure domains: every node serves every zone.
		return "", requisiteTopology(r), nil
	}
	for _, z := range zones {
		best, bestFree := "", int64(-1)
		for _, m := range cl.Members {
			if m.State == "up" && m.Zone == z {
				if f := memberFree(m); f > bestFree {
					best, bestFree = m.ID, f
				}
			}
		}
		if best == "" {
			continue
		}
		if p.ZoneLocal {
			return best, []*csipb.Topology{{Segments: map[string]string{TopologyKey: z}}}, nil
		}
		return best, requisiteTopology(r), nil
	}
	return "", nil, status.Errorf(codes.ResourceExhausted, "no blkd node is up in the zones asked for (%s)", strings.Join(zones, ", "))
}

// memberFree is what a member can still promise: its capacity less its
// promises; a member without a limit (capacity 0) counts its disk's free
// bytes.
func memberFree(m api.Member) int64 {
	if m.CapacityBytes == 0 {
		if m.Disk != nil {
			return int64(m.Disk.FreeBytes)
		}
		return 0
	}
	if m.PromisedBytes >= m.CapacityBytes {
		return 0
	}
	return int64(m.CapacityBytes - m.PromisedBytes)
}

func (c *controller) DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("volume_id: none given")
	}
	if checkVolumeID(id) != nil {
		return &csipb.DeleteVolumeResponse{}, nil // no such volume can exist
	}
	unlock, err := c.d.lock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	err = c.api.do(ctx, http.MethodDelete, volPath(id), nil, nil)
	switch {
	case err == nil, statusOf(err) == http.StatusNotFound:
		c.forget(id)
		return &csipb.DeleteVolumeResponse{}, nil
	case is(err, http.StatusConflict, msgHasSnapshots):
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s has snapshots: delete its VolumeSnapshots first (%v)", id, err)
	case is(err, http.StatusConflict, msgHasConnections):
		hosts := ""
		if v, gerr := c.api.volume(ctx, id); gerr == nil {
			for _, a := range v.Attachments {
				hosts += " " + a.HostNQN
			}
		}
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still attached to hosts%s: unpublish it first", id, hosts)
	}
	return nil, rpcError(err, "delete volume "+id)
}

func (c *controller) forget(vol string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.published {
		if k.vol == vol {
			delete(c.published, k)
		}
	}
}

// nodeKnown checks that node is a host the registry knows (§1.9):
// NotFound otherwise. Without a host registry (an older blkd) any host
// NQN is taken.
func (c *controller) nodeKnown(ctx context.Context, node string) error {
	if err := nvme.ValidateNQN(node); err != nil {
		return status.Errorf(codes.NotFound, "node %q: no such node: a node ID is its host NQN (%v)", node, err)
	}
	known, registry, err := c.api.hostKnown(ctx, node)
	if err != nil {
		return rpcError(err, "look up host "+node)
	}
	if registry && !known {
		return status.Errorf(codes.NotFound, "node %s: no such host registered with blkd (blkctl host list)", node)
	}
	return nil
}

func (c *controller) ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	id, node := req.GetVolumeId(), req.GetNodeId()
	switch {
	case id == "":
		return nil, invalid("volume_id: none given")
	case node == "":
		return nil, invalid("node_id: none given")
	}
	if err := checkCap(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	unlock, err := c.lockVolume(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, err := c.waitOnline(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := c.nodeKnown(ctx, node); err != nil {
		return nil, err
	}
	ro := req.GetReadonly()
	key := pubKey{id, node}
	c.mu.Lock()
	prevRO, had := c.published[key]
	c.mu.Unlock()
	if had && prevRO != ro && slices.Contains(v.Hosts, node) {
		return nil, status.Errorf(codes.AlreadyExists, "volume %s is published to node %s with readonly %t already", id, node, prevRO)
	}
	if singleNode(req.GetVolumeCapability()) {
		other, err := c.otherNodes(ctx, v, node)
		if err != nil {
			return nil, err
		}
		if len(other) > 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published to node %s already and its access mode allows one node", id, strings.Join(other, ", "))
		}
	}
	auth := req.GetVolumeContext()[ctxAuthentication]
	hreq := api.HostRequest{HostNQN: node}
	if auth == AuthDHCHAP {
		hreq.DHCHAPSecret, hreq.DHCHAPCtrlSecret = req.GetSecrets()[secretDHCHAP], req.GetSecrets()[secretDHCHAPCtrl]
		if hreq.DHCHAPSecret == "" {
			return nil, invalid("volume %s uses DH-HMAC-CHAP: the controller-publish secret has no %s key", id, secretDHCHAP)
		}
	} else {
		auth = AuthNone
	}
	if err := c.api.do(ctx, http.MethodPost, volPath(id)+"/hosts", hreq, nil); err != nil {
		return nil, rpcError(err, "allow host "+node+" on volume "+id)
	}
	var conn api.Connection
	err = c.api.do(ctx, http.MethodPost, volPath(id)+"/attach", api.HostRequest{HostNQN: node}, &conn)
	if is(err, http.StatusConflict, msgAlreadyConnected) {
		err = c.connection(ctx, v, &conn)
	}
	if err != nil {
		return nil, rpcError(err, "attach host "+node+" to volume "+id)
	}
	c.mu.Lock()
	c.published[key] = ro
	c.mu.Unlock()
	transport := req.GetVolumeContext()[ctxTransport]
	if transport == "" {
		transport = TransportTCP
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: map[string]string{
		PubSubNQN:    conn.SubsystemNQN,
		PubNSID:      strconv.FormatUint(uint64(conn.NSID), 10),
		PubEndpoints: formatEndpoints(conn.Endpoints),
		PubTransport: transport,
		PubReadonly:  strconv.FormatBool(ro),
		PubAuth:      auth,
	}}, nil
}

// formatEndpoints is the publish context's endpoints: tcp:ADDR:PORT and
// rdma:ADDR:PORT, comma-separated, in blkd's order (TCP first).
func formatEndpoints(eps []api.Endpoint) string {
	s := make([]string, len(eps))
	for i, e := range eps {
		s[i] = e.Transport + ":" + e.Address + ":" + strconv.Itoa(e.Port)
	}
	return strings.Join(s, ",")
}

// connection is the api.Connection of a host attached already: the
// subsystem of the volume and its owner's ports from the cluster view,
// as blkd's attach gives them (TCP first).
func (c *controller) connection(ctx context.Context, v *api.Volume, out *api.Connection) error {
	cl, err := c.api.cluster(ctx)
	if err != nil {
		return err
	}
	*out = api.Connection{SubsystemNQN: v.NQN, NSID: 1}
	for _, m := range cl.Members {
		if m.ID != v.Node {
			continue
		}
		for _, e := range []struct{ t, addr string }{{api.TransportTCP, m.TCPAddr}, {api.TransportRDMA, m.NVMeAddr}} {
			host, port, err := net.SplitHostPort(e.addr)
			n, perr := strconv.Atoi(port)
			if err == nil && perr == nil {
				out.Endpoints = append(out.Endpoints, api.Endpoint{Transport: e.t, Address: host, Port: n})
			}
		}
	}
	if len(out.Endpoints) == 0 {
		return fmt.Errorf("volume %s: the cluster view has no NVMe port of its node %s", v.Name, v.Node)
	}
	return nil
}

// otherNodes are the nodes other than node the volume is published to.
func (c *controller) otherNodes(ctx context.Context, v *api.Volume, node string) ([]string, error) {
	reg, registry, err := c.api.hosts(ctx)
	if err != nil {
		return nil, rpcError(err, "list hosts")
	}
	return slices.DeleteFunc(publishedNodes(v, reg, registry), func(h string) bool { return h == node }), nil
}

// waitOnline reads the volume, waiting (bounded by onlineWait) while it
// is still being created.
func (c *controller) waitOnline(ctx context.Context, id string) (*api.Volume, error) {
	deadline := time.Now().Add(onlineWait)
	for {
		v, err := c.api.volume(ctx, id)
		if err != nil {
			return nil, rpcError(err, "volume "+id)
		}
		if v.State != api.StateCreating {
			return v, nil
		}
		if time.Now().After(deadline) {
			return nil, status.Errorf(codes.Unavailable, "volume %s is still being created after %v", id, onlineWait)
		}
		select {
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *controller) ControllerUnpublishVolume(ctx context.Context, req *csipb.ControllerUnpublishVolumeRequest) (*csipb.ControllerUnpublishVolumeResponse, error) {
	id, node := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, invalid("volume_id: none given")
	}
	if node == "" {
		return nil, invalid("node_id: none given (unpublishing from every node is not supported)")
	}
	if checkVolumeID(id) != nil || nvme.ValidateNQN(node) != nil {
		return &csipb.ControllerUnpublishVolumeResponse{}, nil // never published
	}
	unlock, err := c.d.lock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	err = c.api.do(ctx, http.MethodPost, volPath(id)+"/detach", api.HostRequest{HostNQN: node}, nil)
	if err != nil && statusOf(err) != http.StatusNotFound && !is(err, http.StatusConflict, msgNotConnected) {
		return nil, rpcError(err, "detach host "+node+" from volume "+id)
	}
	if statusOf(err) != http.StatusNotFound {
		err = c.api.do(ctx, http.MethodDelete, volPath(id)+"/hosts?host_nqn="+url.QueryEscape(node), nil, nil)
		if err != nil && statusOf(err) != http.StatusNotFound {
			return nil, rpcError(err, "deny host "+node+" on volume "+id)
		}
	}
	c.mu.Lock()
	delete(c.published, pubKey{id, node})
	c.mu.Unlock()
	return &csipb.ControllerUnpublishVolumeResponse{}, nil
}

func (c *controller) ValidateVolumeCapabilities(ctx context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("volume_id: none given")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume_capabilities: none given")
	}
	if _, err := c.existingVolume(ctx, id); err != nil {
		return nil, err
	}
	if err := checkCaps(req.GetVolumeCapabilities()); err != nil {
		return &csipb.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	if _, err := parseParams(req.GetParameters()); err != nil {
		return &csipb.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// health is a volume's health as CSI shows it (spec v1.13's volume
// health, which replaced VOLUME_CONDITION): INACCESSIBLE when it is not
// served (failed, offline, its node down), DEGRADED when it is served but
// a replica is not in sync or writes are refused; no entry when healthy.
func health(v *api.Volume) *csipb.VolumeHealth {
	h := &csipb.VolumeHealth{VolumeId: v.Name}
	add := func(t csipb.VolumeHealthErrorType, reason, msg string) {
		h.HealthStatuses = append(h.HealthStatuses, &csipb.VolumeHealth_VolumeHealthEntry{Status: t, Reason: reason, Message: msg})
	}
	why := "volume is " + v.State
	if v.Reason != "" {
		why += ": " + v.Reason
	}
	switch v.State {
	case api.StateOnline, api.StateCreating:
	case api.StateDegraded:
		add(csipb.VolumeHealthErrorType_DEGRADED, v.State, why)
	default:
		add(csipb.VolumeHealthErrorType_INACCESSIBLE, v.State, why)
	}
	in := 0
	for _, r := range v.Replicas {
		if r.State == api.ReplicaInSync {
			in++
		}
	}
	if len(v.Replicas) > 0 && in < len(v.Replicas) {
		add(csipb.VolumeHealthErrorType_DEGRADED, "replicas", fmt.Sprintf("%d of %d replicas in sync", in, len(v.Replicas)))
	}
	return h
}

// publishedNodes are the volume's allowed hosts that are registered hosts
// (every allowed host without a host registry): an operator's host
// allowed by hand is not a Kubernetes node.
func publishedNodes(v *api.Volume, reg map[string]bool, registry bool) []string {
	var nodes []string
	for _, h := range v.Hosts {
		if !registry || reg[h] {
			nodes = append(nodes, h)
		}
	}
	return nodes
}

func (c *controller) ListVolumes(ctx context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	vols, next, err := c.volumePage(ctx, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	reg, registry, err := c.api.hosts(ctx)
	if err != nil {
		return nil, rpcError(err, "list hosts")
	}
	out := &csipb.ListVolumesResponse{NextToken: next}
	for i := range vols {
		out.Entries = append(out.Entries, &csipb.ListVolumesResponse_Entry{
			Volume: &csipb.Volume{VolumeId: vols[i].Name, CapacityBytes: int64(vols[i].SizeBytes)},
			Status: &csipb.ListVolumesResponse_VolumeStatus{PublishedNodeIds: publishedNodes(&vols[i], reg, registry)},
		})
	}
	return out, nil
}

// volumePage is one page of the cluster's volumes by name, for the
// list calls: the volumes after token, at most max of them (0: all),
// and the next page's token ("" on the last page).
func (c *controller) volumePage(ctx context.Context, token string, max int32) ([]api.Volume, string, error) {
	if max < 0 {
		return nil, "", invalid("max_entries: %d is negative", max)
	}
	vols, err := c.api.volumes(ctx)
	if err != nil {
		return nil, "", rpcError(err, "list volumes")
	}
	slices.SortFunc(vols, func(a, b api.Volume) int { return strings.Compare(a.Name, b.Name) })
	names := make([]string, len(vols))
	for i := range vols {
		names[i] = vols[i].Name
	}
	from, next, err := page(names, token, int(max))
	if err != nil {
		return nil, "", err
	}
	to := len(vols)
	if next != "" {
		to = from + int(max) // next is the page's last name
	}
	return vols[from:to], next, nil
}

// page is one page of sorted keys: the index to start at (after the
// token, which must be one of keys: else Aborted) and the next token
// (the page's last key, "" on the last page).
func page(keys []string, token string, max int) (from int, next string, err error) {
	if token != "" {
		i, found := slices.BinarySearch(keys, token)
		if !found {
			return 0, "", status.Errorf(codes.Aborted, "starting_token %q: no such entry (any more): list again from the start", token)
		}
		from = i + 1
	}
	if max > 0 && from+max < len(keys) {
		next = keys[from+max-1]
	}
	return from, next, nil
}

// lockVolume takes volume id's lock for a call that changes it: an id
// blk could not have given is NotFound (the spec's answer for an unknown
// volume).
func (c *controller) lockVolume(id string) (unlock func(), err error) {
	if checkVolumeID(id) != nil {
		return nil, status.Errorf(codes.NotFound, "volume %q: no such volume", id)
	}
	return c.d.lock(id)
}

// existingVolume looks volume id up: InvalidArgument for none given,
// NotFound for an id blk could not have given (the spec's answer for an
// unknown volume), else what blkd says.
func (c *controller) existingVolume(ctx context.Context, id string) (*api.Volume, error) {
	if id == "" {
		return nil, invalid("volume_id: none given")
	}
	if checkVolumeID(id) != nil {
		return nil, status.Errorf(codes.NotFound, "volume %q: no such volume", id)
	}
	v, err := c.api.volume(ctx, id)
	if err != nil {
		return nil, rpcError(err, "volume "+id)
	}
	return v, nil
}

func (c *controller) ControllerGetVolume(ctx context.Context, req *csipb.ControllerGetVolumeRequest) (*csipb.ControllerGetVolumeResponse, error) {
	v, err := c.existingVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	reg, registry, err := c.api.hosts(ctx)
	if err != nil {
		return nil, rpcError(err, "list hosts")
	}
	return &csipb.ControllerGetVolumeResponse{
		Volume: &csipb.Volume{VolumeId: v.Name, CapacityBytes: int64(v.SizeBytes)},
		Status: &csipb.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: publishedNodes(v, reg, registry)},
	}, nil
}

func (c *controller) ControllerGetVolumeHealth(ctx context.Context, req *csipb.ControllerGetVolumeHealthRequest) (*csipb.ControllerGetVolumeHealthResponse, error) {
	v, err := c.existingVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csipb.ControllerGetVolumeHealthResponse{VolumeHealth: health(v)}, nil
}

func (c *controller) ControllerListVolumeHealth(ctx context.Context, req *csipb.ControllerListVolumeHealthRequest) (*csipb.ControllerListVolumeHealthResponse, error) {
	vols, next, err := c.volumePage(ctx, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	out := &csipb.ControllerListVolumeHealthResponse{NextToken: next}
	for i := range vols {
		out.Entries = append(out.Entries, health(&vols[i]))
	}
	return out, nil
}

func (c *controller) GetCapacity(ctx context.Context, req *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	for _, vc := range req.GetVolumeCapabilities() {
		if err := checkCap(vc); err != nil {
			return nil, err
		}
	}
	p, err := parseParams(req.GetParameters())
	if err != nil {
		return nil, invalid("%v", err)
	}
	cl, err := c.api.cluster(ctx)
	if err != nil {
		return nil, rpcError(err, "read the cluster")
	}
	zone, zoned := req.GetAccessibleTopology().GetSegments()[TopologyKey]
	avail, largest := capacity(cl.Members, zone, zoned, p.Replicas)
	return &csipb.GetCapacityResponse{AvailableCapacity: avail, MaximumVolumeSize: wrapperspb.Int64(largest)}, nil
}

// capacity is GetCapacity's answer over the members (§1.5): the sum of
// the up members' free promise (of one zone when zoned), and the largest
// single one. With replicas > 1 a volume needs that many zones: both are
// the replicas-th largest free promise among distinct zones.
func capacity(members []api.Member, zone string, zoned bool, replicas int) (avail, largest int64) {
	perZone := map[string]int64{}
	for _, m := range members {
		if m.State != "up" || (zoned && m.Zone != zone) {
			continue
		}
		f := memberFree(m)
		avail += f
		largest = max(largest, f)
		perZone[m.Zone] = max(perZone[m.Zone], f)
	}
	if replicas > 1 && !zoned {
		frees := make([]int64, 0, len(perZone))
		for _, f := range perZone {
			frees = append(frees, f)
		}
		slices.Sort(frees)
		slices.Reverse(frees)
		if len(frees) < replicas {
			return 0, 0
		}
		return frees[replicas-1], frees[replicas-1]
	}
	return avail, largest
}

func (c *controller) CreateSnapshot(ctx context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	src := req.GetSourceVolumeId()
	switch {
	case req.GetName() == "":
		return nil, invalid("name: none given")
	case src == "":
		return nil, invalid("source_volume_id: none given")
	}
	if checkVolumeID(src) != nil {
		return nil, status.Errorf(codes.NotFound, "source volume %q: no such volume", src)
	}
	name := blkName(req.GetName())
	unlock, err := c.d.lock("snapshot " + name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	vols, err := c.api.volumes(ctx)
	if err != nil {
		return nil, rpcError(err, "list volumes")
	}
	for _, v := range vols {
		if !slices.Contains(v.Snapshots, name) {
			continue
		}
		if v.Name != src {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %s exists already, of volume %s", name, v.Name)
		}
		s, err := c.api.snapshot(ctx, src, name)
		if err != nil {
			return nil, rpcError(err, "snapshot "+snapshotID(src, name))
		}
		return &csipb.CreateSnapshotResponse{Snapshot: csiSnapshot(s)}, nil
	}
	var s api.Snapshot
	if err := c.api.do(ctx, http.MethodPost, volPath(src)+"/snapshots", api.SnapshotRequest{Name: name}, &s); err != nil {
		return nil, rpcError(err, "snapshot volume "+src)
	}
	return &csipb.CreateSnapshotResponse{Snapshot: csiSnapshot(&s)}, nil
}

func csiSnapshot(s *api.Snapshot) *csipb.Snapshot {
	return &csipb.Snapshot{
		SnapshotId:     snapshotID(s.Volume, s.Name),
		SourceVolumeId: s.Volume,
		SizeBytes:      int64(s.SizeBytes),
		CreationTime:   timestamppb.New(time.Unix(0, s.CreatedAt)),
		ReadyToUse:     s.State == api.SnapshotReady,
	}
}

func (c *controller) DeleteSnapshot(ctx context.Context, req *csipb.DeleteSnapshotRequest) (*csipb.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, invalid("snapshot_id: none given")
	}
	vol, snap, err := parseSnapshotID(id)
	if err != nil {
		return &csipb.DeleteSnapshotResponse{}, nil // no such snapshot can exist
	}
	unlock, err := c.d.lock("snapshot " + snap)
	if err != nil {
		return nil, err
	}
	defer unlock()
	err = c.api.do(ctx, http.MethodDelete, volPath(vol)+"/snapshots/"+url.PathEscape(snap), nil, nil)
	switch {
	case err == nil, statusOf(err) == http.StatusNotFound:
		return &csipb.DeleteSnapshotResponse{}, nil
	case is(err, http.StatusConflict, msgHasClones), is(err, http.StatusConflict, msgHasChildren):
		return nil, status.Errorf(codes.FailedPrecondition, "snapshot %s has clones: delete or flatten the volumes made from it first (%v)", id, err)
	}
	return nil, rpcError(err, "delete snapshot "+id)
}

func (c *controller) GetSnapshot(ctx context.Context, req *csipb.GetSnapshotRequest) (*csipb.GetSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, invalid("snapshot_id: none given")
	}
	vol, snap, err := parseSnapshotID(id)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "snapshot %q: no such snapshot: %v", id, err)
	}
	s, err := c.api.snapshot(ctx, vol, snap)
	if err != nil {
		return nil, rpcError(err, "snapshot "+id)
	}
	return &csipb.GetSnapshotResponse{Snapshot: csiSnapshot(s)}, nil
}

func (c *controller) ListSnapshots(ctx context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, invalid("max_entries: %d is negative", req.GetMaxEntries())
	}
	snaps, err := c.snapshotsFor(ctx, req.GetSnapshotId(), req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	slices.SortFunc(snaps, func(a, b *csipb.Snapshot) int { return strings.Compare(a.SnapshotId, b.SnapshotId) })
	ids := make([]string, len(snaps))
	for i, s := range snaps {
		ids[i] = s.SnapshotId
	}
	from, next, err := page(ids, req.GetStartingToken(), int(req.GetMaxEntries()))
	if err != nil {
		return nil, err
	}
	out := &csipb.ListSnapshotsResponse{NextToken: next}
	for i := from; i < len(snaps) && (next == "" || ids[i] <= next); i++ {
		out.Entries = append(out.Entries, &csipb.ListSnapshotsResponse_Entry{Snapshot: snaps[i]})
	}
	return out, nil
}

// snapshotsFor lists the snapshots ListSnapshots filters for: one by ID,
// a volume's, or all. A malformed or unknown ID or volume is an empty
// list, not an error (the spec).
func (c *controller) snapshotsFor(ctx context.Context, id, vol string) ([]*csipb.Snapshot, error) {
	notFound := func(err error) bool { return statusOf(err) == http.StatusNotFound }
	if id != "" {
		v, snap, err := parseSnapshotID(id)
		if err != nil || (vol != "" && vol != v) {
			return nil, nil
		}
		s, err := c.api.snapshot(ctx, v, snap)
		if notFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, rpcError(err, "snapshot "+id)
		}
		return []*csipb.Snapshot{csiSnapshot(s)}, nil
	}
	var vols []string
	if vol != "" {
		if checkVolumeID(vol) != nil {
			return nil, nil
		}
		vols = []string{vol}
	} else {
		all, err := c.api.volumes(ctx)
		if err != nil {
			return nil, rpcError(err, "list volumes")
		}
		for _, v := range all {
			if len(v.Snapshots) > 0 {
				vols = append(vols, v.Name)
			}
		}
	}
	var out []*csipb.Snapshot
	for _, v := range vols {
		ss, err := c.api.snapshots(ctx, v)
		if notFound(err) {
			continue // gone meanwhile
		}
		if err != nil {
			return nil, rpcError(err, "list the snapshots of "+v)
		}
		for i := range ss {
			out = append(out, csiSnapshot(&ss[i]))
		}
	}
	return out, nil
}

func (c *controller) ControllerExpandVolume(ctx context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("volume_id: none given")
	}
	if req.GetCapacityRange() == nil {
		return nil, invalid("capacity_range: none given")
	}
	if vc := req.GetVolumeCapability(); vc != nil {
		if err := checkCap(vc); err != nil {
			return nil, err
		}
	}
	unlock, err := c.lockVolume(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, err := c.api.volume(ctx, id)
	if err != nil {
		return nil, rpcError(err, "volume "+id)
	}
	size, err := volumeSize(req.GetCapacityRange(), int64(max(minAlign, v.BlockSize)), int64(v.SizeBytes))
	if err != nil {
		return nil, err
	}
	nodeExpand := req.GetVolumeCapability().GetBlock() == nil
	if size <= int64(v.SizeBytes) {
		return &csipb.ControllerExpandVolumeResponse{CapacityBytes: int64(v.SizeBytes), NodeExpansionRequired: nodeExpand}, nil
	}
	sz := api.Size(size)
	if err := c.api.do(ctx, http.MethodPost, volPath(id)+"/resize", api.ResizeRequest{Size: &sz}, v); err != nil {
		return nil, rpcError(err, "resize volume "+id)
	}
	return &csipb.ControllerExpandVolumeResponse{CapacityBytes: int64(v.SizeBytes), NodeExpansionRequired: nodeExpand}, nil
}
