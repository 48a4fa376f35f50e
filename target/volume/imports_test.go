package volume

import (
	"go/build"
	"strings"
	"testing"
)

// TestImports: the block store sits below the target and beside the
// transport; it imports no other blk package.
func TestImports(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, "github.com/blk-project/blk/") {
			t.Errorf("package volume imports %s", imp)
		}
	}
}
