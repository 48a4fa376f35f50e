package version

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFrom(t *testing.T) {
	stamped := &debug.BuildInfo{
		Main: debug.Module{Version: "v0.3.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123abc"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	gov := runtime.Version()
	for _, c := range []struct {
		name     string
		bi       *debug.BuildInfo
		ldV, ldR string
		want     string
	}{
		{"no build info", nil, "", "", "(devel) (rev unknown, " + gov + ")"},
		{"devel", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "", "", "(devel) (rev unknown, " + gov + ")"},
		{"stamped dirty", stamped, "", "", "v0.3.0 (rev 0123abc+modified, " + gov + ")"},
		{"go says dirty", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.1-0.2026+dirty"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "ff"}, {Key: "vcs.modified", Value: "true"}}}, "", "", "v0.3.1-0.2026+dirty (rev ff, " + gov + ")"},
		{"ldflags win", stamped, "v9.9.9", "beef", "v9.9.9 (rev beef+modified, " + gov + ")"},
		{"ldflags without build info", nil, "v1.0.0", "", "v1.0.0 (rev unknown, " + gov + ")"},
	} {
		if got := from(c.bi, c.ldV, c.ldR).String(); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// TestLdflags builds testdata/printversion with -ldflags -X and checks that Get
// reports what the build set: the path the README and the Containerfile
// name must be this package's.
func TestLdflags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "v")
	ld := "-X github.com/blk-project/blk/internal/version.version=v7.7.7 -X github.com/blk-project/blk/internal/version.revision=abc123"
	build := exec.Command("go", "build", "-buildvcs=false", "-ldflags", ld, "-o", bin, "./testdata/printversion")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "v7.7.7 abc123" {
		t.Errorf("got %q, want %q", got, "v7.7.7 abc123")
	}
}
