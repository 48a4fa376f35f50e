package main

import (
	"bytes"
	"errors"
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

// TestSizeRefusal: a decimal size that is not whole blocks is a usage
// error naming the nearest sizes and the binary unit, before any API call.
func TestSizeRefusal(t *testing.T) {
	var out, errb bytes.Buffer
	err := newApp(&out, &errb).Run([]string{"blkctl", "--api", "http://127.0.0.1:1", "volume", "create", "v", "--size", "10GB"})
	var ue *usageError
	if !errors.As(err, &ue) {
		t.Fatalf("got %v, want a usage error", err)
	}
	const want = "--size 10GB is 10000000000 bytes, not a multiple of the block size 4096: use 9999998976 or 10000003072, or 10GiB"
	if err.Error() != want {
		t.Errorf("got %q\nwant %q", err.Error(), want)
	}
}
