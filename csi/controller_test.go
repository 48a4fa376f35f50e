package csi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func mountVC(mode csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
	}
}

func blockVC(mode csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
	}
}

var singleWriter = csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

const otherHost = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555"

// wantCode fails unless err is a gRPC status with code.
func wantStatus(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: %v; want code %v", what, err, code)
	}
}

// twice runs call twice and requires both answers to succeed and be equal
// (the spec's idempotency: a repeated call is answered as the first).
func twice[T proto.Message](t *testing.T, what string, call func() (T, error)) T {
	t.Helper()
	a, err := call()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	b, err := call()
	if err != nil {
		t.Fatalf("%s again: %v", what, err)
	}
	if !proto.Equal(a, b) {
		t.Fatalf("%s answered differently the second time:\n%v\n%v", what, a, b)
	}
	return a
}

// TestIdempotency makes every controller call twice with the same
// arguments against a real blkd (the same answer both times) and once
// with conflicting ones (the spec's code).
func TestIdempotency(t *testing.T) {
	if testing.Short() {
		t.Skip("runs blkd")
	}
	api := startBlkd(t)
	_, cc := newController(t, api)
	for _, h := range []string{testHost, otherHost} {
		if err := registerHost(api, h); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	caps := []*csipb.VolumeCapability{mountVC(singleWriter)}
	create := &csipb.CreateVolumeRequest{Name: "pvc-one", CapacityRange: &csipb.CapacityRange{RequiredBytes: 10 << 20}, VolumeCapabilities: caps}

	vol := twice(t, "CreateVolume", func() (*csipb.CreateVolumeResponse, error) { return cc.CreateVolume(ctx, create) }).Volume
	if vol.VolumeId != "pvc-one" || vol.CapacityBytes != 10<<20 {
		t.Fatalf("created %v", vol)
	}
	_, err := cc.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-one", CapacityRange: &csipb.CapacityRange{RequiredBytes: 20 << 20}, VolumeCapabilities: caps})
	wantStatus(t, "CreateVolume of another size", err, codes.AlreadyExists)
	_, err = cc.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-one", CapacityRange: &csipb.CapacityRange{RequiredBytes: 10 << 20}, VolumeCapabilities: caps, Parameters: map[string]string{"blockSize": "512"}})
	wantStatus(t, "CreateVolume of another block size", err, codes.AlreadyExists)

	snapReq := &csipb.CreateSnapshotRequest{Name: "snap-one", SourceVolumeId: vol.VolumeId}
	snap := twice(t, "CreateSnapshot", func() (*csipb.CreateSnapshotResponse, error) { return cc.CreateSnapshot(ctx, snapReq) }).Snapshot
	if snap.SnapshotId != "pvc-one/snap-one" || !snap.ReadyToUse || snap.SizeBytes != 10<<20 {
		t.Fatalf("snapshot %v", snap)
	}
	twice(t, "CreateVolume other", func() (*csipb.CreateVolumeResponse, error) {
		return cc.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-two", VolumeCapabilities: caps})
	})
	_, err = cc.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "snap-one", SourceVolumeId: "pvc-two"})
	wantStatus(t, "CreateSnapshot of the name on another volume", err, codes.AlreadyExists)

	// A volume from the snapshot, larger than it: clone, then grow.
	fromSnap := &csipb.CreateVolumeRequest{Name: "pvc-clone", CapacityRange: &csipb.CapacityRange{RequiredBytes: 16 << 20}, VolumeCapabilities: caps,
		VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snap.SnapshotId}}}}
	clone := twice(t, "CreateVolume from a snapshot", func() (*csipb.CreateVolumeResponse, error) { return cc.CreateVolume(ctx, fromSnap) }).Volume
	if clone.CapacityBytes != 16<<20 || clone.ContentSource.GetSnapshot().GetSnapshotId() != snap.SnapshotId {
		t.Fatalf("clone %v", clone)
	}
	_, err = cc.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-clone", CapacityRange: &csipb.CapacityRange{RequiredBytes: 16 << 20}, VolumeCapabilities: caps})
	wantStatus(t, "CreateVolume of the clone's name without its source", err, codes.AlreadyExists)
	small := proto.Clone(fromSnap).(*csipb.CreateVolumeRequest)
	small.Name, small.CapacityRange.RequiredBytes = "pvc-small", 4<<20
	_, err = cc.CreateVolume(ctx, small)
	wantStatus(t, "CreateVolume smaller than its snapshot", err, codes.OutOfRange)
	_, err = cc.DeleteSnapshot(ctx, &csipb.DeleteSnapshotRequest{SnapshotId: snap.SnapshotId})
	wantStatus(t, "DeleteSnapshot with a clone", err, codes.FailedPrecondition)
	_, err = cc.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: vol.VolumeId})
	wantStatus(t, "DeleteVolume with a snapshot", err, codes.FailedPrecondition)

	pub := &csipb.ControllerPublishVolumeRequest{VolumeId: vol.VolumeId, NodeId: testHost, VolumeCapability: caps[0], VolumeContext: vol.VolumeContext}
	pc := twice(t, "ControllerPublishVolume", func() (*csipb.ControllerPublishVolumeResponse, error) { return cc.ControllerPublishVolume(ctx, pub) }).PublishContext
	if pc[PubSubNQN] == "" || pc[PubNSID] != "1" || !strings.HasPrefix(pc[PubEndpoints], "tcp:127.0.0.1:") || pc[PubReadonly] != "false" || pc[PubAuth] != AuthNone || pc[PubTransport] != TransportTCP {
		t.Fatalf("publish context %v", pc)
	}
	ro := proto.Clone(pub).(*csipb.ControllerPublishVolumeRequest)
	ro.Readonly = true
	_, err = cc.ControllerPublishVolume(ctx, ro)
	wantStatus(t, "ControllerPublishVolume read-only after read-write", err, codes.AlreadyExists)
	other := proto.Clone(pub).(*csipb.ControllerPublishVolumeRequest)
	other.NodeId = otherHost
	_, err = cc.ControllerPublishVolume(ctx, other)
	wantStatus(t, "ControllerPublishVolume of a single-node volume to a second node", err, codes.FailedPrecondition)
	// A host NQN blkd's registry does not know is no node (§1.9); a blkd
	// without the registry cannot tell.
	unknown := proto.Clone(pub).(*csipb.ControllerPublishVolumeRequest)
	unknown.NodeId = "nqn.2014-08.org.nvmexpress:uuid:99999999-2222-4333-8444-555555555555"
	if c, _ := newBlkAPI(api, "", ""); c != nil {
		if _, registry, err := c.hosts(ctx); err != nil {
			t.Fatal(err)
		} else if registry {
			_, err = cc.ControllerPublishVolume(ctx, unknown)
			wantStatus(t, "ControllerPublishVolume to an unregistered host", err, codes.NotFound)
		}
	}
	_, err = cc.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: "pvc-two"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cc.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: "pvc-two", NodeId: testHost, VolumeCapability: caps[0]})
	wantStatus(t, "ControllerPublishVolume of a deleted volume", err, codes.NotFound)

	got := twice(t, "ControllerGetVolume", func() (*csipb.ControllerGetVolumeResponse, error) {
		return cc.ControllerGetVolume(ctx, &csipb.ControllerGetVolumeRequest{VolumeId: vol.VolumeId})
	})
	if ids := got.Status.GetPublishedNodeIds(); len(ids) != 1 || ids[0] != testHost {
		t.Fatalf("published node IDs %v", ids)
	}

	expand := &csipb.ControllerExpandVolumeRequest{VolumeId: vol.VolumeId, CapacityRange: &csipb.CapacityRange{RequiredBytes: 32 << 20}, VolumeCapability: caps[0]}
	ex := twice(t, "ControllerExpandVolume", func() (*csipb.ControllerExpandVolumeResponse, error) { return cc.ControllerExpandVolume(ctx, expand) })
	if ex.CapacityBytes != 32<<20 || !ex.NodeExpansionRequired {
		t.Fatalf("expanded %v", ex)
	}
	expand.VolumeCapability = blockVC(singleWriter)
	if ex, err := cc.ControllerExpandVolume(ctx, expand); err != nil || ex.NodeExpansionRequired {
		t.Fatalf("expand of a block volume: %v, %v; want no node expansion", ex, err)
	}

	unpub := &csipb.ControllerUnpublishVolumeRequest{VolumeId: vol.VolumeId, NodeId: testHost}
	twice(t, "ControllerUnpublishVolume", func() (*csipb.ControllerUnpublishVolumeResponse, error) {
		return cc.ControllerUnpublishVolume(ctx, unpub)
	})
	twice(t, "DeleteVolume clone", func() (*csipb.DeleteVolumeResponse, error) {
		return cc.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: clone.VolumeId})
	})
	twice(t, "DeleteSnapshot", func() (*csipb.DeleteSnapshotResponse, error) {
		return cc.DeleteSnapshot(ctx, &csipb.DeleteSnapshotRequest{SnapshotId: snap.SnapshotId})
	})
	twice(t, "DeleteVolume", func() (*csipb.DeleteVolumeResponse, error) {
		return cc.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: vol.VolumeId})
	})
	list, err := cc.ListVolumes(ctx, &csipb.ListVolumesRequest{})
	if err != nil || len(list.Entries) != 0 {
		t.Fatalf("volumes left: %v, %v", list, err)
	}
}

// TestBusy: a second call on a volume while one runs answers Aborted at
// once (§1.2).
func TestBusy(t *testing.T) {
	d, cc := newController(t, "127.0.0.1:1")
	unlock, err := d.lock("pvc-busy")
	if err != nil {
		t.Fatal(err)
	}
	_, err = cc.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: "pvc-busy"})
	wantStatus(t, "DeleteVolume while another call holds the volume", err, codes.Aborted)
	unlock()
	_, err = cc.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: "pvc-busy"})
	wantStatus(t, "DeleteVolume with blkd unreachable", err, codes.Unavailable)
}

// fakeHosts is a blkd answering the host registry's routes (§1.9) as
// piece 3 serves them, and "no route" when registry is false (an older
// blkd); every other path answers 404 no route too.
func fakeHosts(t *testing.T, registry bool, hosts ...string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if !registry || !strings.HasPrefix(r.URL.Path, "/v1/hosts") {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]string{"error": "no route " + r.Method + " " + r.URL.Path})
			return
		}
		if nqn, ok := strings.CutPrefix(r.URL.Path, "/v1/hosts/"); ok {
			for _, h := range hosts {
				if h == nqn {
					json.NewEncoder(w).Encode(map[string]string{"host_nqn": h})
					return
				}
			}
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]string{"error": "host " + nqn + " is not registered"})
			return
		}
		var l struct {
			Hosts []hostEntry `json:"hosts"`
		}
		for _, h := range hosts {
			l.Hosts = append(l.Hosts, hostEntry{HostNQN: h})
		}
		json.NewEncoder(w).Encode(l)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestHostRegistry: a node ID is a registered host NQN (§1.9); without a
// registry (an older blkd) any host NQN passes, a non-NQN never does.
func TestHostRegistry(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		registry bool
		node     string
		want     codes.Code
	}{
		{true, testHost, codes.OK},
		{true, otherHost, codes.NotFound},
		{true, "nqn.2014-08.org.nvmexpress:host/with/slashes", codes.NotFound},
		{true, "fake-node-id", codes.NotFound},
		{false, otherHost, codes.OK},
		{false, "fake-node-id", codes.NotFound},
	} {
		a, err := newBlkAPI(fakeHosts(t, tc.registry, testHost), "", "")
		if err != nil {
			t.Fatal(err)
		}
		c := &controller{api: a}
		if err := c.nodeKnown(ctx, tc.node); status.Code(err) != tc.want {
			t.Errorf("registry %t, node %s: %v; want %v", tc.registry, tc.node, err, tc.want)
		}
		reg, registry, err := a.hosts(ctx)
		if err != nil || registry != tc.registry || (registry && !reg[testHost]) {
			t.Errorf("hosts with registry %t: %v %t %v", tc.registry, reg, registry, err)
		}
	}
}

// TestVolumeIDRefused: the calls that read one volume refuse an empty
// volume_id (InvalidArgument) and answer NotFound for an id blk could
// not have given, both before asking blkd (the controller has none).
func TestVolumeIDRefused(t *testing.T) {
	c, ctx := &controller{}, context.Background()
	for _, tc := range []struct {
		id   string
		code codes.Code
	}{{"", codes.InvalidArgument}, {"no/such volume", codes.NotFound}} {
		_, err := c.ControllerGetVolume(ctx, &csipb.ControllerGetVolumeRequest{VolumeId: tc.id})
		wantStatus(t, "ControllerGetVolume "+tc.id, err, tc.code)
		_, err = c.ControllerGetVolumeHealth(ctx, &csipb.ControllerGetVolumeHealthRequest{VolumeId: tc.id})
		wantStatus(t, "ControllerGetVolumeHealth "+tc.id, err, tc.code)
	}
}
