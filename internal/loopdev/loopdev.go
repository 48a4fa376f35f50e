// Package loopdev gives tests a block device: a loop device over a sparse
// file in the test's temporary directory, detached when the test ends.
package loopdev

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Attach attaches a loop device over a sparse file of size bytes in
// t.TempDir() and detaches it when the test ends, failed or not; it skips
// the test where loop devices cannot be made (not root, no
// /dev/loop-control, no losetup). It returns the device's path.
func Attach(t testing.TB, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: a loop device needs root")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("skipped: no loop devices here (%v)", err)
	}
	losetup, err := exec.LookPath("losetup")
	if err != nil {
		t.Skipf("skipped: no losetup (%v)", err)
	}
	backing := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(losetup, "--find", "--show", backing).CombinedOutput()
	if err != nil {
		t.Skipf("skipped: losetup --find --show: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command(losetup, "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	return dev
}
