package csi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const testNodeNQN = "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-4d2e-883f-0016d3cca427"

// nodeEnv is a node service over a fake host with its own state and
// mount directories.
type nodeEnv struct {
	t     *testing.T
	h     *fakeHost
	d     *Driver
	n     *node
	state string
	dir   string
}

func newNodeEnv(t *testing.T) *nodeEnv {
	t.Helper()
	e := &nodeEnv{t: t, h: newFakeHost(), state: t.TempDir(), dir: t.TempDir()}
	e.restart()
	return e
}

// restart makes a new driver over the same host and state directory, as
// a restarted plugin process on the same node.
func (e *nodeEnv) restart() {
	e.t.Helper()
	d, err := New(Config{Mode: ModeNode, HostNQN: testNodeNQN, StateDir: e.state, Host: e.h, Zone: "z1"})
	if err != nil {
		e.t.Fatal(err)
	}
	e.d, e.n = d, d.node
}

func (e *nodeEnv) path(p string) string { return filepath.Join(e.dir, p) }

func mountCap(mode csipb.VolumeCapability_AccessMode_Mode, fs string, flags ...string) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fs, MountFlags: flags}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode}}
}

func blockCap(mode csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode}}
}

const snw = csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

func publishCtx(vol string) map[string]string {
	return map[string]string{PubSubNQN: "nqn.2024-01.io.blk:vol:" + vol, PubNSID: "1",
		PubEndpoints: "tcp:10.0.2.2:4420,tcp:10.0.2.3:4420", PubTransport: "tcp", PubAuth: "none"}
}

func (e *nodeEnv) stageReq(vol string, vc *csipb.VolumeCapability) *csipb.NodeStageVolumeRequest {
	return &csipb.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: e.path("stage-" + vol),
		VolumeCapability: vc, PublishContext: publishCtx(vol)}
}

func (e *nodeEnv) stage(vol string, vc *csipb.VolumeCapability) {
	e.t.Helper()
	if _, err := e.n.NodeStageVolume(e.t.Context(), e.stageReq(vol, vc)); err != nil {
		e.t.Fatalf("stage %s: %v", vol, err)
	}
}

func (e *nodeEnv) publishReq(vol, target string, vc *csipb.VolumeCapability) *csipb.NodePublishVolumeRequest {
	return &csipb.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: e.path("stage-" + vol),
		TargetPath: e.path(target), VolumeCapability: vc, PublishContext: publishCtx(vol)}
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
	}
}

// calls returns the fake host's calls of the given methods.
func (e *nodeEnv) calls(methods ...string) []string {
	e.h.mu.Lock()
	defer e.h.mu.Unlock()
	var out []string
	for _, c := range e.h.calls {
		if slices.Contains(methods, strings.Fields(c)[0]) {
			out = append(out, c)
		}
	}
	return out
}

func TestNodeRequiredFields(t *testing.T) {
	e := newNodeEnv(t)
	ctx := t.Context()
	vc := mountCap(snw, "")
	_, err := e.n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{StagingTargetPath: "/s", VolumeCapability: vc})
	wantCode(t, "stage without volume", err, codes.InvalidArgument)
	_, err = e.n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", VolumeCapability: vc})
	wantCode(t, "stage without path", err, codes.InvalidArgument)
	_, err = e.n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s"})
	wantCode(t, "stage without capability", err, codes.InvalidArgument)
	_, err = e.n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: vc,
		PublishContext: map[string]string{"device": "/dev/mock"}})
	wantCode(t, "stage without subnqn (csi-sanity's publish context)", err, codes.InvalidArgument)
	_, err = e.n.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{StagingTargetPath: "/s"})
	wantCode(t, "unstage without volume", err, codes.InvalidArgument)
	_, err = e.n.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "v"})
	wantCode(t, "unstage without path", err, codes.InvalidArgument)
	_, err = e.n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{TargetPath: "/t", StagingTargetPath: "/s", VolumeCapability: vc})
	wantCode(t, "publish without volume", err, codes.InvalidArgument)
	_, err = e.n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: vc})
	wantCode(t, "publish without target", err, codes.InvalidArgument)
	_, err = e.n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", StagingTargetPath: "/s"})
	wantCode(t, "publish without capability", err, codes.InvalidArgument)
	_, err = e.n.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{TargetPath: "/t"})
	wantCode(t, "unpublish without volume", err, codes.InvalidArgument)
	_, err = e.n.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "v"})
	wantCode(t, "unpublish without target", err, codes.InvalidArgument)
	_, err = e.n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumePath: "some/path"})
	wantCode(t, "stats without volume", err, codes.InvalidArgument)
	_, err = e.n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v"})
	wantCode(t, "stats without path", err, codes.InvalidArgument)
	_, err = e.n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "some/path"})
	wantCode(t, "stats of an unknown volume", err, codes.NotFound)
	_, err = e.n.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumePath: "/t"})
	wantCode(t, "expand without volume", err, codes.InvalidArgument)
	_, err = e.n.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: "v"})
	wantCode(t, "expand without path", err, codes.InvalidArgument)
	_, err = e.n.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: "v", VolumePath: "some/path"})
	wantCode(t, "expand of an unknown volume", err, codes.NotFound)
	_, err = e.n.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{})
	wantCode(t, "health without volume", err, codes.InvalidArgument)
	if len(e.calls("Connect", "Mount", "Mkfs", "Disconnect")) != 0 {
		t.Errorf("a refused call reached the host: %v", e.h.calls)
	}
}

func TestNodeAccessModes(t *testing.T) {
	e := newNodeEnv(t)
	for _, c := range []struct {
		vc   *csipb.VolumeCapability
		code codes.Code
	}{
		{mountCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER, ""), codes.InvalidArgument},
		{blockCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER), codes.InvalidArgument},
		{mountCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, ""), codes.InvalidArgument},
		{mountCap(snw, "btrfs"), codes.InvalidArgument},
		{mountCap(csipb.VolumeCapability_AccessMode_UNKNOWN, ""), codes.InvalidArgument},
		{&csipb.VolumeCapability{AccessMode: &csipb.VolumeCapability_AccessMode{Mode: snw}}, codes.InvalidArgument},
		{blockCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER), codes.OK},
	} {
		_, err := e.n.NodeStageVolume(t.Context(), e.stageReq("v", c.vc))
		wantCode(t, c.vc.String(), err, c.code)
	}
}

func TestNodeStageMountIdempotent(t *testing.T) {
	e := newNodeEnv(t)
	req := e.stageReq("v1", mountCap(snw, "", "noatime"))
	req.VolumeContext = map[string]string{ctxMkfsOptions: "-E lazy_itable_init=1"}
	for i := 0; i < 3; i++ {
		if _, err := e.n.NodeStageVolume(t.Context(), req); err != nil {
			t.Fatalf("stage %d: %v", i, err)
		}
	}
	got := e.calls("Mkfs", "Mount")
	want := []string{"Mkfs /dev/nvme1n1 ext4 -E lazy_itable_init=1", "Mount /dev/nvme1n1 " + e.path("stage-v1") + " ext4 noatime"}
	if !slices.Equal(got, want) {
		t.Errorf("host calls %q, want %q (mkfs and mount once)", got, want)
	}
	c := e.h.conns["nqn.2024-01.io.blk:vol:v1"].c
	if c.HostNQN != testNodeNQN || c.HostID != "1b4e28ba-2fa1-4d2e-883f-0016d3cca427" || c.NSID != 1 || c.Transport != "tcp" ||
		len(c.Endpoints) != 2 || c.Endpoints[1].Addr != "10.0.2.3:4420" {
		t.Errorf("connection %+v", c)
	}
	rec, err := e.n.state.load("v1")
	if err != nil || rec == nil || rec.Device != "/dev/nvme1n1" || rec.FSType != "ext4" || rec.StagingPath != e.path("stage-v1") {
		t.Fatalf("record %+v %v", rec, err)
	}

	// The same volume staged differently.
	other := e.stageReq("v1", mountCap(snw, "xfs"))
	_, err = e.n.NodeStageVolume(t.Context(), other)
	wantCode(t, "stage with another fs", err, codes.AlreadyExists)
	other = e.stageReq("v1", mountCap(snw, "", "noatime"))
	other.StagingTargetPath = e.path("elsewhere")
	_, err = e.n.NodeStageVolume(t.Context(), other)
	wantCode(t, "stage at another path", err, codes.AlreadyExists)
	_, err = e.n.NodeStageVolume(t.Context(), e.stageReq("v1", blockCap(snw)))
	wantCode(t, "stage as block", err, codes.AlreadyExists)
}

func TestNodeStageNeverReformats(t *testing.T) {
	e := newNodeEnv(t)
	e.h.fs["/dev/nvme1n1"] = "xfs"
	_, err := e.n.NodeStageVolume(t.Context(), e.stageReq("v", mountCap(snw, "ext4")))
	wantCode(t, "stage ext4 over xfs", err, codes.FailedPrecondition)
	if len(e.calls("Mkfs", "Mount")) != 0 {
		t.Errorf("host calls %v", e.h.calls)
	}
	// A filesystem there already is mounted as it is.
	e.stage("v", mountCap(snw, "xfs"))
	if got := e.calls("Mkfs"); len(got) != 0 {
		t.Errorf("mkfs over an existing filesystem: %v", got)
	}
	// Read-only on an empty device: nothing to mount.
	_, err = e.n.NodeStageVolume(t.Context(), e.stageReq("w", mountCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, "")))
	wantCode(t, "read-only stage of an empty volume", err, codes.FailedPrecondition)
}

func TestNodeReadOnlyMountOptions(t *testing.T) {
	e := newNodeEnv(t)
	e.h.fs["/dev/nvme1n1"] = "ext4"
	e.stage("v", mountCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, ""))
	if got := e.calls("Mount"); len(got) != 1 || !strings.HasSuffix(got[0], " ext4 ro,noload") {
		t.Errorf("mount calls %v, want ro,noload", got)
	}
}

func TestNodeDHCHAP(t *testing.T) {
	e := newNodeEnv(t)
	req := e.stageReq("v", mountCap(snw, ""))
	req.PublishContext[PubAuth] = "dhchap"
	_, err := e.n.NodeStageVolume(t.Context(), req)
	wantCode(t, "dhchap without a secret", err, codes.InvalidArgument)
	const host, ctrl = "DHHC-1:01:c2VjcmV0LWhvc3Qta2V5LTMyLWJ5dGVzLWxvbmchIQ==:", "DHHC-1:01:Y3RybC1rZXktMzItYnl0ZXMtbG9uZy1lbm91Z2ghIQ==:"
	req.Secrets = map[string]string{secretDHCHAP: host, secretDHCHAPCtrl: ctrl}
	if _, err := e.n.NodeStageVolume(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	c := e.h.conns["nqn.2024-01.io.blk:vol:v"].c
	if c.DHCHAPSecret != host || c.DHCHAPCtrlSecret != ctrl {
		t.Errorf("secrets not passed to the connect: %+v", c)
	}
	// Never in the state directory.
	filepath.WalkDir(e.state, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			if strings.Contains(string(b), "DHHC-1") {
				t.Errorf("%s holds a secret: %s", p, b)
			}
		}
		return nil
	})
}

func TestNodeConnectFailureLeavesRecordToUndo(t *testing.T) {
	e := newNodeEnv(t)
	e.h.failNext["Connect"] = errors.New("connect refused: host not allowed")
	_, err := e.n.NodeStageVolume(t.Context(), e.stageReq("v", mountCap(snw, "")))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "host not allowed") {
		t.Fatalf("stage with a failing connect: %v", err)
	}
	rec, _ := e.n.state.load("v")
	if rec == nil || rec.Device != "" {
		t.Fatalf("record after a failed connect: %+v", rec)
	}
	e.restart() // the plugin restarted after it
	if _, err := e.n.NodeUnstageVolume(t.Context(), &csipb.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: e.path("stage-v")}); err != nil {
		t.Fatal(err)
	}
	if got := e.calls("Disconnect"); !slices.Equal(got, []string{"Disconnect nqn.2024-01.io.blk:vol:v"}) {
		t.Errorf("disconnect calls %v", got)
	}
	if rec, _ := e.n.state.load("v"); rec != nil {
		t.Errorf("record kept after unstage: %+v", rec)
	}
}

func TestNodePublishUnpublishMount(t *testing.T) {
	e := newNodeEnv(t)
	ctx := t.Context()
	vc := mountCap(snw, "")
	_, err := e.n.NodePublishVolume(ctx, e.publishReq("v", "target", vc))
	wantCode(t, "publish before stage", err, codes.FailedPrecondition)
	e.stage("v", vc)
	for i := 0; i < 2; i++ {
		if _, err := e.n.NodePublishVolume(ctx, e.publishReq("v", "target", vc)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if got := e.calls("Mount"); len(got) != 2 || got[1] != "Mount "+e.path("stage-v")+" "+e.path("target")+"  bind" {
		t.Errorf("mount calls %q (one bind mount)", got)
	}
	if fi, err := os.Stat(e.path("target")); err != nil || !fi.IsDir() {
		t.Errorf("target not a directory: %v", err)
	}
	ro := e.publishReq("v", "target", vc)
	ro.Readonly = true
	_, err = e.n.NodePublishVolume(ctx, ro)
	wantCode(t, "publish read-only where read-write is", err, codes.AlreadyExists)
	ro.TargetPath = e.path("target-ro")
	if _, err := e.n.NodePublishVolume(ctx, ro); err != nil {
		t.Fatal(err)
	}
	if got := e.calls("Mount"); got[len(got)-1] != "Mount "+e.path("stage-v")+" "+e.path("target-ro")+"  bind,ro" {
		t.Errorf("read-only bind: %q", got[len(got)-1])
	}

	// Stats on the target, not elsewhere.
	st, err := e.n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: e.path("target")})
	if err != nil || len(st.Usage) != 2 || st.Usage[0].Total != 64<<20 {
		t.Errorf("stats %v %v", st, err)
	}
	_, err = e.n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "some/path"})
	wantCode(t, "stats at a wrong path", err, codes.NotFound)

	// Unstage refuses while published.
	_, err = e.n.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: e.path("stage-v")})
	wantCode(t, "unstage while published", err, codes.FailedPrecondition)

	for _, tg := range []string{"target", "target-ro", "target"} {
		if _, err := e.n.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: e.path(tg)}); err != nil {
			t.Fatalf("unpublish %s: %v", tg, err)
		}
		if _, err := os.Stat(e.path(tg)); !os.IsNotExist(err) {
			t.Errorf("target %s not removed: %v", tg, err)
		}
	}
	for i := 0; i < 2; i++ {
		if _, err := e.n.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: e.path("stage-v")}); err != nil {
			t.Fatalf("unstage %d: %v", i, err)
		}
	}
	if got := e.calls("Unmount", "Disconnect"); !slices.Equal(got, []string{
		"Unmount " + e.path("target"), "Unmount " + e.path("target-ro"), "Unmount " + e.path("stage-v"),
		"Disconnect nqn.2024-01.io.blk:vol:v"}) {
		t.Errorf("teardown calls %q", got)
	}
	if _, err := os.Stat(e.path("stage-v")); err != nil {
		t.Errorf("the staging directory is the CO's and stays: %v", err)
	}
}

func TestNodeSingleWriter(t *testing.T) {
	e := newNodeEnv(t)
	vc := mountCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, "")
	e.stage("v", vc)
	if _, err := e.n.NodePublishVolume(t.Context(), e.publishReq("v", "target", vc)); err != nil {
		t.Fatal(err)
	}
	_, err := e.n.NodePublishVolume(t.Context(), e.publishReq("v", "other_target", vc))
	wantCode(t, "second target of a single writer", err, codes.FailedPrecondition)
	if _, err := e.n.NodePublishVolume(t.Context(), e.publishReq("v", "target", vc)); err != nil {
		t.Errorf("the same target again: %v", err)
	}
}

func TestNodeUnpublishForeignMount(t *testing.T) {
	e := newNodeEnv(t)
	vc := mountCap(snw, "")
	e.stage("a", vc)
	if _, err := e.n.NodePublishVolume(t.Context(), e.publishReq("a", "target", vc)); err != nil {
		t.Fatal(err)
	}
	// Volume b is not staged here: its unpublish must not unmount a's.
	_, err := e.n.NodeUnpublishVolume(t.Context(), &csipb.NodeUnpublishVolumeRequest{VolumeId: "b", TargetPath: e.path("target")})
	wantCode(t, "unpublish another volume's mount", err, codes.FailedPrecondition)
	// Nothing published for b: success, nothing touched.
	if _, err := e.n.NodeUnpublishVolume(t.Context(), &csipb.NodeUnpublishVolumeRequest{VolumeId: "b", TargetPath: e.path("nothing")}); err != nil {
		t.Error(err)
	}
	if _, err := e.n.NodeUnstageVolume(t.Context(), &csipb.NodeUnstageVolumeRequest{VolumeId: "b", StagingTargetPath: e.path("stage-a")}); err != nil {
		t.Error(err)
	}
	if len(e.calls("Unmount", "Disconnect")) != 0 {
		t.Errorf("volume b's calls touched volume a: %v", e.calls("Unmount", "Disconnect"))
	}
}

func TestNodeBlockVolume(t *testing.T) {
	e := newNodeEnv(t)
	ctx := t.Context()
	vc := blockCap(snw)
	e.stage("b", vc)
	if got := e.calls("Mkfs", "Mount", "FSType"); len(got) != 0 {
		t.Errorf("a block stage formatted or mounted: %v", got)
	}
	_, err := e.n.NodePublishVolume(ctx, e.publishReq("b", "pods/p1/dev", mountCap(snw, "")))
	wantCode(t, "publish a block stage as mount", err, codes.InvalidArgument)
	if _, err := e.n.NodePublishVolume(ctx, e.publishReq("b", "pods/p1/dev", vc)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(e.path("pods/p1/dev")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("block target not a file: %v", err)
	}
	if got := e.calls("Mount"); !slices.Equal(got, []string{"Mount /dev/nvme1n1 " + e.path("pods/p1/dev") + "  bind"}) {
		t.Errorf("mount calls %q", got)
	}
	st, err := e.n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "b", VolumePath: e.path("pods/p1/dev")})
	if err != nil || len(st.Usage) != 1 || st.Usage[0].Total != 64<<20 || st.Usage[0].Unit != csipb.VolumeUsage_BYTES {
		t.Errorf("block stats %v %v", st, err)
	}
	e.h.sizes["/dev/nvme1n1"] = 128 << 20
	ex, err := e.n.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: "b", VolumePath: e.path("pods/p1/dev"),
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20}})
	if err != nil || ex.CapacityBytes != 128<<20 || len(e.calls("Resize")) != 0 {
		t.Errorf("block expand %v %v %v", ex, err, e.calls("Resize"))
	}
}

func TestNodeExpandMount(t *testing.T) {
	e := newNodeEnv(t)
	ctx := t.Context()
	vc := mountCap(snw, "")
	e.stage("v", vc)
	if _, err := e.n.NodePublishVolume(ctx, e.publishReq("v", "target", vc)); err != nil {
		t.Fatal(err)
	}
	// The kernel sees the new size a moment after the resize.
	go func() {
		e.h.mu.Lock()
		e.h.sizes["/dev/nvme1n1"] = 128 << 20
		e.h.mu.Unlock()
	}()
	ex, err := e.n.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: "v", VolumePath: e.path("target"),
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20}, VolumeCapability: vc})
	if err != nil || ex.CapacityBytes != 128<<20 {
		t.Fatalf("expand %v %v", ex, err)
	}
	if got := e.calls("Resize"); !slices.Equal(got, []string{"Resize /dev/nvme1n1 " + e.path("stage-v") + " ext4"}) {
		t.Errorf("resize calls %q", got)
	}
	_, err = e.n.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: "v", VolumePath: e.path("nowhere")})
	wantCode(t, "expand at a wrong path", err, codes.NotFound)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = e.n.NodeExpandVolume(cctx, &csipb.NodeExpandVolumeRequest{VolumeId: "v", VolumePath: e.path("target"),
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 1 << 30}})
	wantCode(t, "expand beyond what the kernel sees, cancelled", err, codes.Canceled)
}

func TestNodeRestartConverges(t *testing.T) {
	e := newNodeEnv(t)
	ctx := t.Context()
	vc := mountCap(snw, "")
	e.stage("v", vc)
	if _, err := e.n.NodePublishVolume(ctx, e.publishReq("v", "target", vc)); err != nil {
		t.Fatal(err)
	}
	e.restart()
	// Every call finds the volume from its record and the mount table.
	if _, err := e.n.NodeStageVolume(ctx, e.stageReq("v", vc)); err != nil {
		t.Fatalf("stage after restart: %v", err)
	}
	if got := e.calls("Mkfs"); len(got) != 1 {
		t.Errorf("mkfs calls %v", got)
	}
	if _, err := e.n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: e.path("target")}); err != nil {
		t.Errorf("stats after restart: %v", err)
	}
	// The node itself restarted: the kernel lost its connection and mounts.
	e.h.mu.Lock()
	delete(e.h.conns, "nqn.2024-01.io.blk:vol:v")
	clear(e.h.mounts)
	e.h.mu.Unlock()
	e.restart()
	_, err := e.n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: e.path("target")})
	wantCode(t, "stats after a reboot", err, codes.NotFound)
	h, err := e.n.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: "v"})
	if err != nil || len(h.VolumeHealth.HealthStatuses) != 1 || h.VolumeHealth.HealthStatuses[0].Status != csipb.VolumeHealthErrorType_INACCESSIBLE {
		t.Errorf("health after a reboot %v %v", h, err)
	}
	// The filesystem is on the volume, which comes back under another name.
	e.h.fs["/dev/nvme2n1"] = "ext4"
	e.stage("v", vc) // kubelet stages again: connect and mount again
	if rec, _ := e.n.state.load("v"); rec.Device != "/dev/nvme2n1" {
		t.Errorf("record's device after a reboot: %s", rec.Device)
	}
	if _, err := e.n.NodePublishVolume(ctx, e.publishReq("v", "target", vc)); err != nil {
		t.Fatalf("publish after a reboot: %v", err)
	}
	if got := e.calls("Mkfs"); len(got) != 1 {
		t.Errorf("the filesystem was made again: %v", got)
	}
}

func TestNodeHealth(t *testing.T) {
	e := newNodeEnv(t)
	e.stage("v", blockCap(snw))
	h, err := e.n.NodeGetVolumeHealth(t.Context(), &csipb.NodeGetVolumeHealthRequest{VolumeId: "v"})
	if err != nil || h.VolumeHealth.VolumeId != "v" || len(h.VolumeHealth.HealthStatuses) != 0 {
		t.Errorf("healthy: %v %v", h, err)
	}
	e.h.unhealthy["nqn.2024-01.io.blk:vol:v"] = true
	h, err = e.n.NodeGetVolumeHealth(t.Context(), &csipb.NodeGetVolumeHealthRequest{VolumeId: "v"})
	if err != nil || len(h.VolumeHealth.HealthStatuses) != 1 || h.VolumeHealth.HealthStatuses[0].Status != csipb.VolumeHealthErrorType_DEGRADED {
		t.Errorf("a path down: %v %v", h, err)
	}
	_, err = e.n.NodeGetVolumeHealth(t.Context(), &csipb.NodeGetVolumeHealthRequest{VolumeId: "nope"})
	wantCode(t, "health of an unknown volume", err, codes.NotFound)
}

func TestNodeInfoAndCapabilities(t *testing.T) {
	e := newNodeEnv(t)
	info, err := e.n.NodeGetInfo(t.Context(), &csipb.NodeGetInfoRequest{})
	if err != nil || info.NodeId != testNodeNQN || info.AccessibleTopology.Segments[TopologyKey] != "z1" || info.MaxVolumesPerNode != 0 {
		t.Errorf("info %v %v", info, err)
	}
	caps, err := e.n.NodeGetCapabilities(t.Context(), &csipb.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range caps.Capabilities {
		got = append(got, c.GetRpc().GetType().String())
	}
	if want := []string{"STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME", "GET_VOLUME_STATS", "GET_VOLUME_HEALTH", "SINGLE_NODE_MULTI_WRITER"}; !slices.Equal(got, want) {
		t.Errorf("capabilities %v, want %v", got, want)
	}
	if err := e.n.probe(t.Context()); err != nil {
		t.Errorf("probe: %v", err)
	}
	os.Chmod(filepath.Join(e.state, "staged"), 0o500)
	defer os.Chmod(filepath.Join(e.state, "staged"), 0o700)
	if os.Geteuid() != 0 {
		if err := e.n.probe(t.Context()); err == nil {
			t.Error("probe with a read-only state directory: ready")
		}
	}
}

func TestNodeBusyVolume(t *testing.T) {
	e := newNodeEnv(t)
	unlock, err := e.d.lock("v")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	_, err = e.n.NodeStageVolume(t.Context(), e.stageReq("v", mountCap(snw, "")))
	wantCode(t, "stage while another call runs", err, codes.Aborted)
}

func TestStateFileNames(t *testing.T) {
	s, err := openStateDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"pvc-1", "../../etc/passwd", "a/b", ".hidden", strings.Repeat("x", 300)} {
		f := s.file(id)
		if filepath.Dir(f) != s.dir {
			t.Errorf("record of %q at %s, outside %s", id, f, s.dir)
		}
		r := &stageRecord{VolumeID: id, SubNQN: "nqn.2024-01.io.blk:vol:x"}
		if err := s.save(r); err != nil {
			t.Fatal(err)
		}
		got, err := s.load(id)
		if err != nil || got == nil || got.VolumeID != id {
			t.Errorf("load %q: %+v %v", id, got, err)
		}
	}
	if filepath.Base(s.file("pvc-1")) != "pvc-1.json" {
		t.Errorf("plain name hashed: %s", s.file("pvc-1"))
	}
	all, err := s.all()
	if err != nil || len(all) != 5 {
		t.Errorf("all: %d records, %v", len(all), err)
	}
	os.WriteFile(filepath.Join(s.dir, "broken.json"), []byte("{"), 0o600)
	all, err = s.all()
	if err == nil || len(all) != 5 {
		t.Errorf("a broken record: %d records, err %v", len(all), err)
	}
}

func TestKubeNodeZone(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("tok-123\n"), 0o600)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok-123" {
			http.Error(w, `{"kind":"Status","code":401}`, http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/api/v1/nodes/worker-1":
			fmt.Fprint(w, `{"kind":"Node","metadata":{"name":"worker-1","labels":{"topology.kubernetes.io/zone":"eu-1a","kubernetes.io/os":"linux"}}}`)
		case "/api/v1/nodes/worker-2":
			fmt.Fprint(w, `{"kind":"Node","metadata":{"name":"worker-2","labels":{"kubernetes.io/os":"linux"}}}`)
		default:
			http.Error(w, `{"kind":"Status","code":404}`, http.StatusNotFound)
		}
	}))
	defer srv.Close()
	k := &kube{base: srv.URL, tokenFile: token, hc: srv.Client()}
	if z, err := k.nodeZone(t.Context(), "worker-1"); z != "eu-1a" || err != nil {
		t.Errorf("worker-1: %q %v", z, err)
	}
	if z, err := k.nodeZone(t.Context(), "worker-2"); z != "" || err != nil {
		t.Errorf("worker-2 (no label): %q %v", z, err)
	}
	if _, err := k.nodeZone(t.Context(), "gone"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown node: %v", err)
	}
	os.WriteFile(token, []byte("other"), 0o600)
	if _, err := k.nodeZone(t.Context(), "worker-1"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong token: %v", err)
	}
}

func TestNodeRegistersHost(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	answer := http.StatusCreated
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if r.Method != http.MethodPost || r.URL.Path != "/v1/hosts" {
			http.Error(w, `{"error":"no route"}`, http.StatusNotFound)
			return
		}
		bodies = append(bodies, strings.TrimSpace(string(b)))
		w.WriteHeader(answer)
		switch answer {
		case http.StatusCreated:
			fmt.Fprint(w, `{}`)
		case http.StatusNotFound:
			fmt.Fprint(w, `{"error":"no route for POST /v1/hosts"}`)
		default:
			fmt.Fprint(w, `{"error":"registry unavailable"}`)
		}
	}))
	defer srv.Close()
	d, err := New(Config{Mode: ModeNode, API: srv.URL, HostNQN: testNodeNQN, NodeName: "worker-1", Zone: "z2",
		StateDir: t.TempDir(), Host: newFakeHost()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.node.NodeGetInfo(t.Context(), &csipb.NodeGetInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	want := `{"host_nqn":"` + testNodeNQN + `","name":"worker-1","zone":"z2"}`
	mu.Lock()
	if len(bodies) != 2 || bodies[0] != want || bodies[1] != want {
		t.Errorf("registrations %q, want two (start and NodeGetInfo) of %s", bodies, want)
	}
	answer = http.StatusNotFound // a blkd without the registry
	mu.Unlock()
	if _, err := d.node.NodeGetInfo(t.Context(), &csipb.NodeGetInfoRequest{}); err != nil {
		t.Errorf("blkd without a host registry: %v", err)
	}
	mu.Lock()
	answer = http.StatusServiceUnavailable
	mu.Unlock()
	_, err = d.node.NodeGetInfo(t.Context(), &csipb.NodeGetInfoRequest{})
	wantCode(t, "NodeGetInfo while the registry is unavailable", err, codes.Unavailable)
}

func TestNodeRestartReattachesNBD(t *testing.T) {
	e := newNodeEnv(t)
	for _, v := range []string{"plain", "secured"} {
		req := e.stageReq(v, blockCap(snw))
		req.PublishContext[PubTransport] = TransportNBD
		if v == "secured" {
			req.PublishContext[PubAuth] = AuthDHCHAP
			req.Secrets = map[string]string{secretDHCHAP: "DHHC-1:00:c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==:"}
		}
		if _, err := e.n.NodeStageVolume(t.Context(), req); err != nil {
			t.Fatal(err)
		}
	}
	// The plugin process ends: its NBD devices end with it.
	e.h.mu.Lock()
	clear(e.h.conns)
	e.h.calls = nil
	e.h.mu.Unlock()
	e.restart()
	got := e.calls("Connect")
	if !slices.Equal(got, []string{"Connect nqn.2024-01.io.blk:vol:plain"}) {
		t.Errorf("connects at start %q: want the NBD volume without a secret only (the secret is not kept)", got)
	}
	if c := e.h.conns["nqn.2024-01.io.blk:vol:plain"].c; c.Transport != TransportNBD || c.HostNQN != testNodeNQN || len(c.Endpoints) != 2 {
		t.Errorf("reattach connection %+v", c)
	}
}
