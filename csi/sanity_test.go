package csi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
)

// sanityNodeNQN is the node ID the sanity run's node service reports.
const sanityNodeNQN = "nqn.2014-08.org.nvmexpress:uuid:0f6b3c52-5b8e-4d38-9e0e-3a3c2a1d6b11"

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
	// Both services: the node's over the fake host (fakehost_test.go),
	// the kernel's part being the e2e guest's (e2e/csi_test.go).
	host := newFakeHost()
	d, err := New(Config{Mode: ModeAll, API: api, Version: "v0.0.0-sanity", HostNQN: sanityNodeNQN,
		StateDir: t.TempDir(), Host: host, NodeName: "sanity-node"})
	if err != nil {
		t.Fatal(err)
	}
	// The fake kernel sees the namespace's size as blkd has it (volume
	// NQNs are meta.DefaultNQN's).
	host.volumeSize = func(subNQN string) (int64, bool) {
		name, ok := strings.CutPrefix(subNQN, "nqn.2024-01.io.blk:volume:")
		if !ok {
			return 0, false
		}
		v, err := d.ctrl.api.volume(context.Background(), name)
		if err != nil {
			return 0, false
		}
		return int64(v.SizeBytes), true
	}
	addr, _ := serve(t, d, nil)

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
	suite.Timeout = 5 * time.Minute
	start := time.Now()
	ginkgo.RunSpecs(t, "blk CSI sanity", suite, reporter)
	sc.Finalize()
	t.Logf("csi-sanity took %v", time.Since(start).Round(time.Millisecond))
}
