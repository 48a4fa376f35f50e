package target_test

import (
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestFirstRun: the bits are sized for twice the queue, a mark is seen
// only at its own number until that number comes round again, and the
// zero FirstRun records nothing.
func TestFirstRun(t *testing.T) {
	f := target.NewFirstRun(100) // 256 bits
	if len(f) != 4 {
		t.Fatalf("words for 100 entries: %d, want 4", len(f))
	}
	f.Mark(7, true)
	if !f.Ran(7) || f.Ran(6) || f.Ran(8) || !f.Ran(7+256) {
		t.Fatalf("after marking 7: ran 6 %v, 7 %v, 8 %v, 263 %v", f.Ran(6), f.Ran(7), f.Ran(8), f.Ran(263))
	}
	second := &target.Request{Seq: 8, PrevFuse: nvme.FlagFuseFirst}
	second.Cmd.Flags = nvme.FlagFuseSecond
	plain := &target.Request{Seq: 9, PrevFuse: nvme.FlagFuseFirst}
	if !f.MayReserve(second) || f.SecondEarly(second) || !f.MayReserve(plain) {
		t.Fatalf("second after a first that ran: may reserve %v, early %v; plain after a first: may reserve %v",
			f.MayReserve(second), f.SecondEarly(second), f.MayReserve(plain))
	}
	f.Mark(7, false)
	if f.Ran(7) || f.MayReserve(second) || !f.SecondEarly(second) {
		t.Fatalf("after clearing 7: ran %v, may reserve %v, early %v", f.Ran(7), f.MayReserve(second), f.SecondEarly(second))
	}
	var zero target.FirstRun
	zero.Mark(3, true)
	if zero.Ran(3) {
		t.Fatal("the zero FirstRun recorded a first")
	}
}
