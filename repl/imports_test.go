package repl

import (
	"testing"

	"github.com/blk-project/blk/internal/importtest"
)

// TestImports: repl sits over the target core and the initiator; it
// knows nothing of the registry (the Reporter is the daemon's), the
// store (the local backend is any target.AsyncBackend) or a binding.
func TestImports(t *testing.T) {
	importtest.Only(t, ".", "initiator", "internal/lfstack", "nvme", "target")
}
