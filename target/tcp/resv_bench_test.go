package tcp_test

import (
	"testing"

	"github.com/blk-project/blk/nvme/resv"
	"github.com/blk-project/blk/target"
)

// holdReservation makes the test target's namespace serve reservations
// (LocalReservations) with Write Exclusive held by the raw host's host
// identifier and another host registered: the benchmark's I/O then
// passes the reservation check of a held reservation (the per-queue
// cache), the case "resv=held" measures.
func holdReservation(tb testing.TB, tt *testTarget) {
	tb.Helper()
	sub, ok := tt.t.Subsystem(testSubNQN)
	if !ok {
		tb.Fatal("no test subsystem")
	}
	me, other := resv.HostID{1, 2, 3, 4}, resv.HostID{0xee}
	st := &resv.State{Gen: 3, Type: resv.WriteExclusive, Holder: me, Index: 1,
		Regs: []resv.Registrant{{Host: me, Key: 0xa1}, {Host: other, Key: 0xb2}}}
	if err := sub.SetReservations(1, target.LocalReservations(), st); err != nil {
		tb.Fatal(err)
	}
}
