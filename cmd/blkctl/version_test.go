package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/blk-project/blk/internal/version"
)

// TestVersion: --version prints internal/version's line, the one
// blk_build_info carries too.
func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if err := newApp(&out, &errb).Run([]string{"blkctl", "--version"}); err != nil {
		t.Fatalf("blkctl --version: %v (%s)", err, errb.String())
	}
	want := "blkctl version " + version.String() + "\n"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
	if !strings.Contains(out.String(), "(rev ") {
		t.Errorf("no revision in %q", out.String())
	}
}
