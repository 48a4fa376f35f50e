package csi

import (
	"context"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

func zoneTopo(zones ...string) []*csipb.Topology {
	var out []*csipb.Topology
	for _, z := range zones {
		out = append(out, &csipb.Topology{Segments: map[string]string{TopologyKey: z}})
	}
	return out
}

// TestTopologyAndCapacity: against a blkd in zone z1, a volume asked for
// in z1 lands there and is reachable from every requisite zone (only z1
// with zoneLocal); one asked for in zones without a node is
// ResourceExhausted; GetCapacity counts z1's node, nothing for z2, and
// nothing for three replicas on one zone (§1.5, §1.8).
func TestTopologyAndCapacity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs blkd")
	}
	_, cc := newController(t, startBlkd(t, "--zone", "z1"))
	ctx := context.Background()
	caps := []*csipb.VolumeCapability{mountVC(singleWriter)}

	req := &csipb.CreateVolumeRequest{Name: "pvc-z", VolumeCapabilities: caps, CapacityRange: &csipb.CapacityRange{RequiredBytes: 8 << 20},
		AccessibilityRequirements: &csipb.TopologyRequirement{Requisite: zoneTopo("z1", "z2"), Preferred: zoneTopo("z2", "z1")}}
	vol := twice(t, "CreateVolume in z1", func() (*csipb.CreateVolumeResponse, error) { return cc.CreateVolume(ctx, req) }).Volume
	if got := vol.AccessibleTopology; len(got) != 2 || got[0].Segments[TopologyKey] != "z1" || got[1].Segments[TopologyKey] != "z2" {
		t.Fatalf("accessible topology %v; want z1 and z2", got)
	}
	local := &csipb.CreateVolumeRequest{Name: "pvc-zl", VolumeCapabilities: caps, CapacityRange: &csipb.CapacityRange{RequiredBytes: 8 << 20},
		Parameters:                map[string]string{ParamZoneLocal: "true"},
		AccessibilityRequirements: &csipb.TopologyRequirement{Requisite: zoneTopo("z2", "z1")}}
	lv, err := cc.CreateVolume(ctx, local)
	if err != nil || len(lv.Volume.AccessibleTopology) != 1 || lv.Volume.AccessibleTopology[0].Segments[TopologyKey] != "z1" {
		t.Fatalf("zone-local volume: %v, %v; want z1 only", lv, err)
	}
	_, err = cc.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-nowhere", VolumeCapabilities: caps,
		AccessibilityRequirements: &csipb.TopologyRequirement{Requisite: zoneTopo("z7")}})
	wantStatus(t, "CreateVolume in a zone without a node", err, codes.ResourceExhausted)

	all, err := cc.GetCapacity(ctx, &csipb.GetCapacityRequest{})
	if err != nil || all.AvailableCapacity <= 0 || all.MaximumVolumeSize.GetValue() != all.AvailableCapacity {
		t.Fatalf("GetCapacity: %v, %v; want one node's free promise", all, err)
	}
	z1, err := cc.GetCapacity(ctx, &csipb.GetCapacityRequest{AccessibleTopology: zoneTopo("z1")[0]})
	if err != nil || z1.AvailableCapacity != all.AvailableCapacity {
		t.Fatalf("GetCapacity z1: %v, %v; want %d", z1, err, all.AvailableCapacity)
	}
	z2, err := cc.GetCapacity(ctx, &csipb.GetCapacityRequest{AccessibleTopology: zoneTopo("z2")[0]})
	if err != nil || z2.AvailableCapacity != 0 {
		t.Fatalf("GetCapacity z2: %v, %v; want 0", z2, err)
	}
	r3, err := cc.GetCapacity(ctx, &csipb.GetCapacityRequest{Parameters: map[string]string{ParamReplicas: "3"}})
	if err != nil || r3.AvailableCapacity != 0 {
		t.Fatalf("GetCapacity with 3 replicas on one zone: %v, %v; want 0", r3, err)
	}
	_, err = cc.GetCapacity(ctx, &csipb.GetCapacityRequest{Parameters: map[string]string{"replica": "3"}})
	wantStatus(t, "GetCapacity with an unknown parameter", err, codes.InvalidArgument)
}

// TestFlattenClones: with flattenClones a volume made from a snapshot is
// flattened in the background, so that the snapshot can be deleted (§1.6),
// and the same CreateVolume after the flatten is still answered as the
// first.
func TestFlattenClones(t *testing.T) {
	if testing.Short() {
		t.Skip("runs blkd")
	}
	api := startBlkd(t)
	_, cc := newController(t, api)
	ctx := context.Background()
	caps := []*csipb.VolumeCapability{mountVC(singleWriter)}
	vol, err := cc.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "src", VolumeCapabilities: caps, CapacityRange: &csipb.CapacityRange{RequiredBytes: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := cc.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "s", SourceVolumeId: vol.Volume.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	req := &csipb.CreateVolumeRequest{Name: "flat", VolumeCapabilities: caps, Parameters: map[string]string{ParamFlattenClones: "true"},
		VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}}
	first, err := cc.CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newBlkAPI(api, "", "")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		v, err := c.volume(ctx, "flat")
		if err != nil {
			t.Fatal(err)
		}
		if v.CloneOf == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("clone not flattened after 30 s: %+v", v)
		}
	}
	again, err := cc.CreateVolume(ctx, req)
	if err != nil || again.Volume.VolumeId != first.Volume.VolumeId || again.Volume.CapacityBytes != first.Volume.CapacityBytes {
		t.Fatalf("CreateVolume after the flatten: %v, %v; want %v", again, err, first)
	}
	if _, err := cc.DeleteSnapshot(ctx, &csipb.DeleteSnapshotRequest{SnapshotId: snap.Snapshot.SnapshotId}); err != nil {
		t.Fatalf("DeleteSnapshot after its clone's flatten: %v", err)
	}
}
