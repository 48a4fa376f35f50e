package initiator

import (
	"go/build"
	"strings"
	"testing"
)

// TestImportGraph: the initiator stands on the wire codec (with in-band
// authentication), the transport API and the lock-free hand-over stack
// (internal/lfstack, which sees no blk package) only; it never sees the target (nothing may depend on
// blk's target being the peer) nor a particular provider.
func TestImportGraph(t *testing.T) {
	const mod = "github.com/blk-project/blk/"
	allowed := map[string]bool{mod + "nvme": true, mod + "nvme/auth": true, mod + "transport": true, mod + "internal/lfstack": true}
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, mod) && !allowed[imp] {
			t.Errorf("initiator imports %s", imp)
		}
	}
}
