package transport_test

import (
	"go/build"
	"slices"
	"strings"
	"testing"
)

// TestImportGraph: dependencies point down only. The transport knows
// nothing of NVMe, volumes or meta; the soft provider sees only the API,
// its framing package, the poll groups' event loop (internal/epoll) and
// hand-over stack (internal/lfstack), which see no blk package; the framing package sees no blk package;
// the conformance suite only the API.
func TestImportGraph(t *testing.T) {
	const mod = "github.com/blk-project/blk/"
	allowed := map[string][]string{
		".":             nil,
		"soft":          {mod + "transport", mod + "transport/soft/wire", mod + "internal/epoll", mod + "internal/lfstack"},
		"soft/wire":     nil,
		"transporttest": {mod + "transport"},
		"providers":     {mod + "transport", mod + "transport/soft", mod + "transport/verbs"},
	}
	for dir, ok := range allowed {
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		for _, imp := range pkg.Imports {
			if strings.HasPrefix(imp, mod) && !slices.Contains(ok, imp) {
				t.Errorf("transport/%s imports %s", dir, imp)
			}
		}
	}
}
