package failover_test

import (
	"testing"

	"github.com/blk-project/blk/internal/importtest"
)

// TestImportGraph: the failover layer stands on the initiator, its NBD
// device and the NVMe statuses; it never sees the target, the API or a
// transport provider (Resolve and Connect bring those in).
func TestImportGraph(t *testing.T) {
	importtest.Only(t, ".", "initiator", "initiator/nbd", "nvme")
}
