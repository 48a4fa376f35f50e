// Package importtest keeps blk's dependency graph pointing down: each
// package's own test names the blk packages it may import, and Only
// fails for any other.
package importtest

import (
	"go/build"
	"slices"
	"strings"
	"testing"
)

// Module is the prefix of blk's import paths.
const Module = "github.com/blk-project/blk/"

// Only fails t for every blk package that the package in dir (relative
// to the test's directory; "." for its own) imports and allowed does not
// name. allowed holds paths below Module ("nvme", "internal/epoll").
func Only(t testing.TB, dir string, allowed ...string) {
	t.Helper()
	pkg, err := build.ImportDir(dir, 0)
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	for _, imp := range pkg.Imports {
		if rel, ok := strings.CutPrefix(imp, Module); ok && !slices.Contains(allowed, rel) {
			t.Errorf("package %s (%s) imports %s", pkg.Name, dir, imp)
		}
	}
}
