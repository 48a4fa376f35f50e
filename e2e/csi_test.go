//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/blk-project/blk/nvme/auth"
)

// TestCSISanityNode is the CSI node part (docs/operations.md §8.2): blk's
// driver (blk-csi --mode all) runs in a guest as root over the Linux
// nvme-tcp host, blkd on the host. The real csi-sanity binary runs all
// its specs there (the node's staging connects through /dev/nvme-fabrics,
// mkfs.ext4, mounts, bind mounts, block volumes, expansion, unstage
// disconnects). Then the test drives the driver over gRPC itself: a file
// written through a published mount reads back after an unstage (every
// controller deleted) and a new stage; an online expansion reaches the
// mounted ext4; a DH-HMAC-CHAP volume refuses a stage with a wrong secret
// and accepts the right one; a volume of transport nbd stages over NBD;
// a volume whose blkd was killed unstages while the kernel reconnects.
func TestCSISanityNode(t *testing.T) {
	s := newScenario(t)
	port := ports(25400)
	api, grpcPort := addr(port()), port()
	d := s.startDaemon("blkd", api, "--raft-addr", addr(port()), "--nvme-addr", addr(port()), "--tcp-addr", addr(port()),
		"--advertise-addr", "10.0.2.2", "--dhchap-dhgroups", "null")

	start := time.Now()
	build := exec.Command("go", "build", "-trimpath", "-o", s.share+"/", "../cmd/blk-csi",
		"github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building blk-csi and csi-sanity: %v\n%s", err, out)
	}
	t.Logf("static blk-csi and csi-sanity built in %v", time.Since(start).Round(time.Second))

	const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:e2e00000-0000-4000-8000-000000000026"
	s.setEnv("APIPORT", strings.TrimPrefix(api, "127.0.0.1:"), "HOSTNQN", hostNQN)
	s.script("csi.sh")
	g := s.boot(vmConfig{name: "csinode", script: "csi.sh", timeout: 20 * time.Minute,
		hostFwd: []string{fmt.Sprintf("127.0.0.1:%d-:10000", grpcPort)}})

	s.waitMark("sanity-done", g, 15*time.Minute)
	out := string(s.readShare("csi-sanity.txt"))
	ran := regexp.MustCompile(`Ran (\d+) of (\d+) Specs in ([0-9.]+) seconds`).FindStringSubmatch(out)
	if ran == nil || !strings.Contains(out, "SUCCESS!") {
		t.Fatalf("csi-sanity did not pass:\n%s", lastLines([]byte(out), 40))
	}
	if n, _ := strconv.Atoi(ran[1]); n < 80 {
		t.Errorf("csi-sanity ran %s specs, want at least 80 (the host's TestSanity runs 83)", ran[1])
	}
	t.Logf("csi-sanity in the guest: %s of %s specs in %s s (guest wall %s s)", ran[1], ran[2], ran[3],
		strings.TrimSpace(string(s.readShare("csi-sanity-seconds"))))
	if left := strings.TrimSpace(string(s.readShare("nvme-after-sanity.txt"))); left != "" {
		t.Errorf("controllers left after csi-sanity's clean-up: %s", left)
	}

	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	c := &csiDriver{t: t, ctx: cctx, ctrl: csipb.NewControllerClient(conn), node: csipb.NewNodeClient(conn)}
	info := c.nodeInfo()
	if info.NodeId != hostNQN {
		t.Fatalf("NodeGetInfo node_id %q, want --host-nqn %q", info.NodeId, hostNQN)
	}

	// Data survives an unstage (the kernel's controllers deleted) and a
	// stage again.
	vol := c.createVolume("csi-data", 64<<20, nil)
	pc := c.publish(vol, hostNQN, nil)
	c.stage(vol, pc, nil)
	c.publishNode(vol, pc)
	s.mark("write")
	s.waitMark("written", g, 5*time.Minute)
	c.unpublishNode(vol)
	c.unstage(vol)
	if _, err := c.node.NodeGetVolumeStats(c.ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: vol.VolumeId, VolumePath: "/tmp/e2e-target"}); status.Code(err) != codes.NotFound {
		t.Errorf("stats after unstage: %v, want NotFound", err)
	}
	s.mark("unstaged")
	s.waitMark("checked-unstaged", g, 5*time.Minute)
	if left := strings.TrimSpace(string(s.readShare("nvme-unstaged.txt"))); left != "" {
		t.Errorf("controllers left after NodeUnstageVolume: %s", left)
	}
	c.stage(vol, pc, nil)
	c.publishNode(vol, pc)
	s.mark("read")
	s.waitMark("read-ok", g, 5*time.Minute)

	// Online expansion: the kernel learns the new size from the target's
	// namespace change notice, resize2fs grows the mounted ext4.
	before := c.statsTotal(vol)
	exp, err := c.ctrl.ControllerExpandVolume(c.ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: vol.VolumeId,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20}, VolumeCapability: mountCapability()})
	if err != nil || !exp.NodeExpansionRequired {
		t.Fatalf("ControllerExpandVolume: %v %v", exp, err)
	}
	start = time.Now()
	nexp, err := c.node.NodeExpandVolume(c.ctx, &csipb.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: "/tmp/e2e-target",
		StagingTargetPath: "/tmp/e2e-stage", CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20}, VolumeCapability: mountCapability()})
	if err != nil || nexp.CapacityBytes < 128<<20 {
		t.Fatalf("NodeExpandVolume: %v %v", nexp, err)
	}
	after := c.statsTotal(vol)
	t.Logf("online expansion 64 → 128 MiB: NodeExpandVolume took %v; ext4 %d → %d bytes", time.Since(start).Round(time.Millisecond), before, after)
	if after < before+50<<20 {
		t.Errorf("the mounted ext4 did not grow: %d → %d bytes", before, after)
	}
	c.unpublishNode(vol)
	c.unstage(vol)
	c.unpublish(vol, hostNQN)
	c.deleteVolume(vol)

	// DH-HMAC-CHAP: the node stage secret must be the host's.
	var keys [2]auth.Key
	for i := range keys {
		if keys[i], err = auth.GenerateKey(auth.SHA256, 32); err != nil {
			t.Fatal(err)
		}
	}
	good, wrong := map[string]string{"dhchapSecret": keys[0].Encode()}, map[string]string{"dhchapSecret": keys[1].Encode()}
	avol := c.createVolume("csi-auth", 16<<20, map[string]string{"authentication": "dhchap"})
	apc := c.publish(avol, hostNQN, good)
	if apc["auth"] != "dhchap" {
		t.Errorf("publish context %v: want auth dhchap", apc)
	}
	start = time.Now()
	_, err = c.node.NodeStageVolume(c.ctx, c.stageReq(avol, apc, wrong))
	if err == nil {
		t.Fatal("NodeStageVolume with a wrong DH-HMAC-CHAP secret succeeded")
	}
	t.Logf("stage with a wrong secret refused in %v: %v", time.Since(start).Round(time.Millisecond), err)
	mustContain(t, "the refused stage's error", err.Error(), "node-stage secret")
	for _, k := range []auth.Key{keys[0], keys[1]} {
		if strings.Contains(err.Error(), k.Encode()) {
			t.Errorf("the error shows a secret: %v", err)
		}
	}
	c.stage(avol, apc, good)
	c.unstage(avol)
	c.unpublish(avol, hostNQN)
	c.deleteVolume(avol)

	// The NBD fallback (§1.10.1): blk's initiator in blk-csi's process
	// serves the volume to the kernel as /dev/nbdN.
	nvol := c.createVolume("csi-nbd", 32<<20, map[string]string{"transport": "nbd"})
	npc := c.publish(nvol, hostNQN, nil)
	c.stage(nvol, npc, nil)
	c.publishNode(nvol, npc)
	if total := c.statsTotal(nvol); total < 20<<20 || total > 32<<20 {
		t.Errorf("ext4 on the NBD volume: %d bytes", total)
	}
	health, err := c.node.NodeGetVolumeHealth(c.ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: nvol.VolumeId})
	if err != nil || len(health.VolumeHealth.HealthStatuses) != 0 {
		t.Errorf("NBD volume health: %v %v", health, err)
	}
	c.unpublishNode(nvol)
	c.unstage(nvol)
	c.unpublish(nvol, hostNQN)
	c.deleteVolume(nvol)

	// NodeUnstageVolume of a volume whose node is gone: the kernel keeps
	// reconnecting (ctrl_loss_tmo -1) and delete_controller must still
	// end it (docs/operations.md §10 R2). A block volume: an ext4 on a
	// dead device would hold its unmount on the journal's writes.
	gvol := c.createVolume("csi-gone", 16<<20, nil)
	gpc := c.publish(gvol, hostNQN, nil)
	greq := c.stageReq(gvol, gpc, nil)
	greq.VolumeCapability = &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if _, err := c.node.NodeStageVolume(c.ctx, greq); err != nil {
		t.Fatalf("NodeStageVolume csi-gone: %v", err)
	}
	d.kill()
	killed := time.Now()
	for {
		h, err := c.node.NodeGetVolumeHealth(c.ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: gvol.VolumeId})
		if err != nil {
			t.Fatalf("NodeGetVolumeHealth csi-gone: %v", err)
		}
		if len(h.VolumeHealth.HealthStatuses) > 0 {
			t.Logf("blkd killed: the volume's health %v after %v", h.VolumeHealth.HealthStatuses[0].Status, time.Since(killed).Round(time.Millisecond))
			break
		}
		if time.Since(killed) > time.Minute {
			t.Fatal("the volume still healthy a minute after its blkd was killed")
		}
		time.Sleep(200 * time.Millisecond)
	}
	start = time.Now()
	c.unstage(gvol)
	t.Logf("NodeUnstageVolume with the controller reconnecting to a dead node: %v", time.Since(start).Round(time.Millisecond))
	d.start()
	c.unpublish(gvol, hostNQN)
	c.deleteVolume(gvol)

	s.mark("done")
	s.wait(g)
	logText := string(s.readShare("blk-csi.log"))
	for _, k := range keys {
		if strings.Contains(logText, k.Encode()) {
			t.Errorf("blk-csi's log shows a DH-HMAC-CHAP secret")
		}
	}
	mustContain(t, "blk-csi.log", logText, "nvme-tcp path connected", "nvme controller deleted", "filesystem grown",
		"volume attached over NBD", "device=/dev/nbd")
}

func mountCapability() *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
}

// csiDriver is the test's CSI client of the guest's blk-csi: the calls
// kubelet and the external attacher would make, each fatal on error.
type csiDriver struct {
	t    *testing.T
	ctx  context.Context // bounds every call: the scenario's remaining time
	ctrl csipb.ControllerClient
	node csipb.NodeClient
}

func (c *csiDriver) nodeInfo() *csipb.NodeGetInfoResponse {
	c.t.Helper()
	r, err := c.node.NodeGetInfo(c.ctx, &csipb.NodeGetInfoRequest{})
	if err != nil {
		c.t.Fatalf("NodeGetInfo: %v", err)
	}
	return r
}

func (c *csiDriver) createVolume(name string, size int64, params map[string]string) *csipb.Volume {
	c.t.Helper()
	r, err := c.ctrl.CreateVolume(c.ctx, &csipb.CreateVolumeRequest{Name: name, Parameters: params,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csipb.VolumeCapability{mountCapability()}})
	if err != nil {
		c.t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return r.Volume
}

func (c *csiDriver) publish(v *csipb.Volume, nodeID string, secrets map[string]string) map[string]string {
	c.t.Helper()
	r, err := c.ctrl.ControllerPublishVolume(c.ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: v.VolumeId, NodeId: nodeID,
		VolumeCapability: mountCapability(), VolumeContext: v.VolumeContext, Secrets: secrets})
	if err != nil {
		c.t.Fatalf("ControllerPublishVolume %s: %v", v.VolumeId, err)
	}
	return r.PublishContext
}

func (c *csiDriver) stageReq(v *csipb.Volume, pc, secrets map[string]string) *csipb.NodeStageVolumeRequest {
	return &csipb.NodeStageVolumeRequest{VolumeId: v.VolumeId, StagingTargetPath: "/tmp/e2e-stage", VolumeCapability: mountCapability(),
		PublishContext: pc, VolumeContext: v.VolumeContext, Secrets: secrets}
}

func (c *csiDriver) stage(v *csipb.Volume, pc, secrets map[string]string) {
	c.t.Helper()
	start := time.Now()
	if _, err := c.node.NodeStageVolume(c.ctx, c.stageReq(v, pc, secrets)); err != nil {
		c.t.Fatalf("NodeStageVolume %s: %v", v.VolumeId, err)
	}
	c.t.Logf("NodeStageVolume %s: %v", v.VolumeId, time.Since(start).Round(time.Millisecond))
}

func (c *csiDriver) publishNode(v *csipb.Volume, pc map[string]string) {
	c.t.Helper()
	if _, err := c.node.NodePublishVolume(c.ctx, &csipb.NodePublishVolumeRequest{VolumeId: v.VolumeId, StagingTargetPath: "/tmp/e2e-stage",
		TargetPath: "/tmp/e2e-target", VolumeCapability: mountCapability(), PublishContext: pc, VolumeContext: v.VolumeContext}); err != nil {
		c.t.Fatalf("NodePublishVolume %s: %v", v.VolumeId, err)
	}
}

func (c *csiDriver) unpublishNode(v *csipb.Volume) {
	c.t.Helper()
	if _, err := c.node.NodeUnpublishVolume(c.ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: v.VolumeId, TargetPath: "/tmp/e2e-target"}); err != nil {
		c.t.Fatalf("NodeUnpublishVolume %s: %v", v.VolumeId, err)
	}
}

func (c *csiDriver) unstage(v *csipb.Volume) {
	c.t.Helper()
	start := time.Now()
	if _, err := c.node.NodeUnstageVolume(c.ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: v.VolumeId, StagingTargetPath: "/tmp/e2e-stage"}); err != nil {
		c.t.Fatalf("NodeUnstageVolume %s: %v", v.VolumeId, err)
	}
	c.t.Logf("NodeUnstageVolume %s: %v", v.VolumeId, time.Since(start).Round(time.Millisecond))
}

func (c *csiDriver) unpublish(v *csipb.Volume, nodeID string) {
	c.t.Helper()
	if _, err := c.ctrl.ControllerUnpublishVolume(c.ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.VolumeId, NodeId: nodeID}); err != nil {
		c.t.Fatalf("ControllerUnpublishVolume %s: %v", v.VolumeId, err)
	}
}

func (c *csiDriver) deleteVolume(v *csipb.Volume) {
	c.t.Helper()
	if _, err := c.ctrl.DeleteVolume(c.ctx, &csipb.DeleteVolumeRequest{VolumeId: v.VolumeId}); err != nil {
		c.t.Fatalf("DeleteVolume %s: %v", v.VolumeId, err)
	}
}

func (c *csiDriver) statsTotal(v *csipb.Volume) int64 {
	c.t.Helper()
	r, err := c.node.NodeGetVolumeStats(c.ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: v.VolumeId, VolumePath: "/tmp/e2e-target"})
	if err != nil || len(r.Usage) == 0 {
		c.t.Fatalf("NodeGetVolumeStats %s: %v %v", v.VolumeId, r, err)
	}
	return r.Usage[0].Total
}
