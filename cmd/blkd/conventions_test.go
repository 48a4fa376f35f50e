package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/blk-project/blk/internal/version"
)

// TestVersionAndMan: blkd --version prints internal/version's line, and
// --man a section 8 page naming every flag, without starting anything.
func TestVersionAndMan(t *testing.T) {
	var out, errb bytes.Buffer
	if err := newApp(&out, &errb).Run([]string{"blkd", "--version"}); err != nil {
		t.Fatalf("blkd --version: %v (%s)", err, errb.String())
	}
	if want := "blkd version " + version.String() + "\n"; out.String() != want {
		t.Errorf("--version: got %q, want %q", out.String(), want)
	}
	out.Reset()
	app := newApp(&out, &errb)
	if err := app.Run([]string{"blkd", "--man", "--data-dir", t.TempDir()}); err != nil {
		t.Fatalf("blkd --man: %v (%s)", err, errb.String())
	}
	man := out.String()
	if !strings.HasPrefix(man, ".nh\n.TH blkd 8") {
		t.Errorf("not a section 8 page: %.40q", man)
	}
	for _, f := range app.VisibleFlags() {
		if n := f.Names()[0]; n != "help" && n != "version" && !strings.Contains(man, "--"+n) {
			t.Errorf("man page lacks --%s", n)
		}
	}
}
