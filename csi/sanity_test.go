package csi

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// sanityNodeNQN is the node ID the sanity run's node service reports.
const sanityNodeNQN = "nqn.2014-08.org.nvmexpress:uuid:0f6b3c52-5b8e-4d38-9e0e-3a3c2a1d6b11"

// UNTIL MERGE (issue 26 pieces 2 and 3). The coordinator removes this
// block when the node service and blkd's host registry land:
//
//   - sanitySkip: csi-sanity's Node Service specs are skipped until the
//     node service (node.go, piece 2) replaces its placeholder. Nothing
//     else is skipped: "should fail when the node does not exist" passes
//     without the host registry, as the generated node ID is no host NQN
//     (NotFound before blkd is asked); with the registry (piece 3) a
//     valid NQN that is not registered is NotFound too (errors_test.go).
//   - sanityNode: a stand-in for the node service's NodeGetInfo (the
//     controller specs ask it for a node ID) and for the calls csi-sanity's
//     clean-up makes; with piece 2, TestSanity serves ModeAll with
//     newFakeHost() instead and sanityNode goes.
var sanitySkip = []string{`Node Service`}

type sanityNode struct {
	csipb.UnimplementedNodeServer
	api string
}

// NodeGetInfo registers the node's host as the node plugin does (when
// blkd has the registry) and names it.
func (n sanityNode) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	if err := registerHost(n.api, sanityNodeNQN); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csipb.NodeGetInfoResponse{NodeId: sanityNodeNQN}, nil
}

func (sanityNode) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

func (sanityNode) NodeUnpublishVolume(context.Context, *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// END UNTIL MERGE

// TestSanity runs the CSI community's conformance suite, csi-sanity
// (github.com/kubernetes-csi/csi-test/v5/pkg/sanity), against the driver
// served in-process over a unix socket and one real blkd
// (docs/operations.md §8.1): 64 MiB volumes expanded to 128 MiB,
// snapshots, every call repeated for idempotency.
func TestSanity(t *testing.T) {
	if testing.Short() {
		t.Skip("csi-sanity runs one blkd and ~100 volumes")
	}
	api := startBlkd(t)
	d, err := New(Config{Mode: ModeController, API: api, Version: "v0.0.0-sanity"})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, d, func(s *grpc.Server) { csipb.RegisterNodeServer(s, sanityNode{api: api}) })

	dir := shortTempDir(t)
	cfg := sanity.NewTestConfig()
	cfg.Address = addr
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = 64 << 20
	cfg.TestVolumeExpandSize = 128 << 20
	cfg.IdempotentCount = 2
	params := filepath.Join(dir, "snapshot-params.yaml")
	if err := os.WriteFile(params, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.TestSnapshotParametersFile = params

	sc := sanity.GinkgoTest(&cfg)
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.SkipStrings = append(suite.SkipStrings, sanitySkip...)
	suite.Timeout = 5 * time.Minute
	start := time.Now()
	ginkgo.RunSpecs(t, "blk CSI sanity", suite, reporter)
	sc.Finalize()
	t.Logf("csi-sanity took %v", time.Since(start).Round(time.Millisecond))
}
