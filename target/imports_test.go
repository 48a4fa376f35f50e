package target_test

import (
	"go/build"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestImportGraph: the core knows no transport. Of blk's packages it sees
// only the wire codec (with in-band authentication and the reservation
// model) and the store (through its adapter).
func TestImportGraph(t *testing.T) {
	const mod = "github.com/blk-project/blk/"
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{mod + "nvme", mod + "nvme/auth", mod + "nvme/resv", mod + "store", mod + "store/aio"}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, mod+"transport") || strings.HasPrefix(imp, mod+"target/rdma") {
			t.Errorf("package target imports the transport package %s", imp)
		}
		// internal/lfstack: the Group's completion stack (async.go).
		if strings.HasPrefix(imp, mod) && !slices.Contains(allowed, imp) && imp != mod+"internal/lfstack" {
			t.Errorf("package target imports %s", imp)
		}
	}
}

// TestCoreStorageNeutral: of the core's files only the store adapter knows
// the store (its errors and types); the rest sees a Backend.
func TestCoreStorageNeutral(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(pkg.Dir, name), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if (path == "github.com/blk-project/blk/store" || path == "github.com/blk-project/blk/store/aio") && name != "store_backend.go" {
				t.Errorf("%s imports %s: only the store adapter (store_backend.go) may", name, path)
			}
		}
	}
}
