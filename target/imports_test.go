package target_test

import (
	"go/build"
	"slices"
	"strings"
	"testing"
)

// TestImportGraph: the core knows no transport. Of blk's packages it sees
// only the wire codec (with in-band authentication) and the volume store.
func TestImportGraph(t *testing.T) {
	const mod = "github.com/blk-project/blk/"
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{mod + "nvme", mod + "nvme/auth", mod + "target/volume"}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, mod+"transport") || strings.HasPrefix(imp, mod+"target/rdma") {
			t.Errorf("package target imports the transport package %s", imp)
		}
		if strings.HasPrefix(imp, mod) && !slices.Contains(allowed, imp) {
			t.Errorf("package target imports %s", imp)
		}
	}
}
