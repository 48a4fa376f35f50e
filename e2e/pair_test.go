//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestTwoGuests: blkd on the soft provider in a storage guest, and in a
// host guest on the link between them (MTU 9000) the Linux nvme-rdma host
// over siw (discover, connect, fio crc32c verify, ext4 + fsck) and blk's
// initiator on the soft provider (blkverify: seeded writes, flush, read
// back equal). The same guests and scripts carry the verbs provider's
// scenarios.
func TestTwoGuests(t *testing.T) {
	if env.skip != "" {
		t.Skip(env.skip)
	}
	bin := filepath.Join(env.bin, "blkverify")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./blkverify")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building blkverify: %v\n%s", err, out)
	}
	s := newScenario(t)
	s.pair(env.bin, "ROLE", "blkd", "S_DEVKIND", "none", "S_PROVIDER", "soft",
		"H_DEVKIND", "siw", "H_PROVIDER", "soft", "TASKS", "kernel verify",
		"KERNELSUB", "nqn.2024-01.io.blk:volume:v1", "VERIFYSUB", "nqn.2024-01.io.blk:volume:v2")
	s.fioResult("fio-kernel.json")
}
