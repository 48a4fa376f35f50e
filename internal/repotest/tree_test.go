package repotest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTracked bounds a tracked file's size. The largest source file is
// tens of KiB; a file over 1 MiB is a build output, an image or a data
// dump, and every clone pays for it forever.
const maxTracked = 1 << 20

// binaryMagic are the openings of executables and objects that a
// build writes: ELF (Linux), Mach-O 32/64 and universal (macOS), PE
// (Windows, "MZ"), and a Go archive.
var binaryMagic = [][]byte{
	{0x7f, 'E', 'L', 'F'},
	{0xcf, 0xfa, 0xed, 0xfe}, {0xce, 0xfa, 0xed, 0xfe},
	{0xfe, 0xed, 0xfa, 0xcf}, {0xfe, 0xed, 0xfa, 0xce},
	{0xca, 0xfe, 0xba, 0xbe},
	{'M', 'Z'},
	[]byte("!<arch>\n"),
}

// repoRoot is the checkout's top directory, or the test skips (a source
// tree without git, e.g. a module download, has nothing to check).
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v)", err)
	}
	return strings.TrimSpace(string(out))
}

// TestNoBuildOutputs fails for every tracked file that is an executable
// or object (by its magic) or larger than maxTracked: a 35 MB macOS
// build of blkd once sat at the root (issue 21, case 8).
func TestNoBuildOutputs(t *testing.T) {
	root := repoRoot(t)
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		path := filepath.Join(root, name)
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, a symlink or a submodule
		}
		if fi.Size() > maxTracked {
			t.Errorf("%s: %d bytes tracked (at most %d): a build output or data file?", name, fi.Size(), maxTracked)
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		head := make([]byte, 8)
		n, _ := f.Read(head)
		f.Close()
		for _, m := range binaryMagic {
			if bytes.HasPrefix(head[:n], m) {
				t.Errorf("%s is an executable or object file (starts % x); build outputs are not committed", name, m)
			}
		}
	}
}

// TestBuildOutputsIgnored checks that what the README's commands write
// in the checkout (go build's binaries, blkd's default data directory,
// deploy/local-cluster.sh's cluster) is ignored, so `git add -A` cannot
// commit it.
func TestBuildOutputsIgnored(t *testing.T) {
	root := repoRoot(t)
	for _, p := range []string{"blkd", "blkctl", "blk-data/volumes/000001.log", "blk-cluster/node1.pid", "e2e/work/x"} {
		cmd := exec.Command("git", "-C", root, "check-ignore", "-q", "--no-index", p)
		if err := cmd.Run(); err != nil {
			t.Errorf("%s is not ignored by .gitignore (git check-ignore: %v)", p, err)
		}
	}
}
