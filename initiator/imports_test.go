package initiator

import (
	"testing"

	"github.com/blk-project/blk/internal/importtest"
)

// TestImportGraph: the initiator stands on the wire codec (with in-band
// authentication), the transport API and the lock-free hand-over stack
// (internal/lfstack, which sees no blk package) only; it never sees the
// target (nothing may depend on blk's target being the peer) nor a
// particular provider.
func TestImportGraph(t *testing.T) {
	importtest.Only(t, ".", "nvme", "nvme/auth", "transport", "internal/lfstack")
}
