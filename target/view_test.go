package target_test

import (
	"bytes"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// sparseView is a memory backend whose View gives nil for a block that
// reads as zeros, as a store that keeps no data for unwritten blocks
// would (the Viewer contract): a Compare must then check the host's data
// against zeros itself.
type sparseView struct {
	*target.MemBackend
	nils int // blocks viewed as nil
}

func (s *sparseView) View(lba, n uint64, fn func(lba uint64, data []byte)) error {
	return s.MemBackend.View(lba, n, func(lba uint64, data []byte) {
		if bytes.Count(data, []byte{0}) == len(data) {
			s.nils++
			data = nil
		}
		fn(lba, data)
	})
}

// TestCompareThroughView: Compare on a Viewer backend compares each block
// the backend shows, and a block shown as nil (unwritten) with zeros: equal
// data succeeds, any differing byte is a Compare Failure, on written and
// unwritten blocks and across both.
func TestCompareThroughView(t *testing.T) {
	mem, err := target.NewMemBackend(512, 64)
	if err != nil {
		t.Fatal(err)
	}
	sv := &sparseView{MemBackend: mem}
	h := newHarness(t)
	_, _, io, _ := h.serve(target.NamespaceConfig{NSID: 1, Backend: sv})
	w := pattern(4*512, 7)
	mustOK(t, h.exec(io, ioCmd(nvme.IOWrite, 1, 8, 4, 0), w), "write")

	zeros := make([]byte, 4*512)
	mustOK(t, h.exec(io, ioCmd(nvme.IOCompare, 1, 20, 4, 0), zeros), "compare unwritten blocks with zeros")
	if sv.nils != 4 {
		t.Fatalf("%d blocks viewed as nil, want the 4 unwritten ones", sv.nils)
	}
	mustOK(t, h.exec(io, ioCmd(nvme.IOCompare, 1, 8, 4, 0), w), "compare written blocks")
	// Blocks 10-13: two written, two unwritten.
	across := append(append([]byte(nil), w[2*512:]...), make([]byte, 2*512)...)
	mustOK(t, h.exec(io, ioCmd(nvme.IOCompare, 1, 10, 4, 0), across), "compare across written and unwritten")

	for _, c := range []struct {
		name string
		lba  uint64
		data []byte
		flip int
	}{
		{"unwritten", 20, zeros, 3*512 + 17},
		{"written", 8, w, 100},
		{"across, in the unwritten part", 10, across, 3*512 + 511},
	} {
		d := append([]byte(nil), c.data...)
		d[c.flip] ^= 1
		if s := h.exec(io, ioCmd(nvme.IOCompare, 1, c.lba, 4, 0), d).status(); s != nvme.StatusCompareFailure.WithDNR() {
			t.Errorf("compare of %s blocks with a differing byte: %s, want Compare Failure", c.name, fmtStatus(s))
		}
	}
}
