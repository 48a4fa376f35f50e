package transport_test

import (
	"testing"

	"github.com/blk-project/blk/internal/importtest"
)

// TestImportGraph: dependencies point down only. The transport knows
// nothing of NVMe, volumes or meta (its cores' poll sets run on
// internal/epoll, which sees no blk package); the soft provider sees only the API,
// its framing package, the poll groups' event loop (internal/epoll) and
// hand-over stack (internal/lfstack), which see no blk package; the framing package sees no blk package;
// the conformance suite only the API.
func TestImportGraph(t *testing.T) {
	allowed := map[string][]string{
		".":             {"internal/epoll"},
		"soft":          {"transport", "transport/soft/wire", "internal/epoll", "internal/lfstack"},
		"soft/wire":     nil,
		"transporttest": {"transport"},
		"providers":     {"transport", "transport/soft", "transport/verbs"},
	}
	for dir, ok := range allowed {
		importtest.Only(t, dir, ok...)
	}
}
