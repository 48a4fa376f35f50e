package targettest

import (
	"testing"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
	"github.com/blk-project/blk/target"
)

// FusedOverWire runs initiatortest.FusedWorkload (4 goroutines, from
// seed) on ns, namespace 1 of tgt reached through a binding, and checks
// that tgt's fused counters agree with what the host saw: every pair
// that wrote counted, every miscompare counted, none Missing.
func FusedOverWire(t testing.TB, tgt *target.Target, ns *initiator.Namespace, seed uint64) {
	t.Helper()
	wrote, miscompared := initiatortest.FusedWorkload(t, ns, seed, 4)
	st := tgt.Stats()
	if st.FusedPairs != wrote || st.FusedMiscompares != miscompared || st.FusedMissing != 0 {
		t.Errorf("stats: %d pairs, %d miscompares, %d missing; the host saw %d written, %d miscompared",
			st.FusedPairs, st.FusedMiscompares, st.FusedMissing, wrote, miscompared)
	}
	t.Logf("%d pairs wrote, %d miscompared, %d lock waits", wrote, miscompared, st.LockWaits)
}

// FusedFloods runs three rounds of initiatortest.FusedFlood (64 pairs
// each, on distinct blocks) on ns, namespace 1 of a fresh tgt, and checks
// that tgt counted the 192 pairs and none Missing.
func FusedFloods(t testing.TB, tgt *target.Target, ns *initiator.Namespace) {
	t.Helper()
	for round := range 3 {
		initiatortest.FusedFlood(t, ns, uint64(round)*64*16, 64)
	}
	if st := tgt.Stats(); st.FusedPairs != 3*64 || st.FusedMissing != 0 {
		t.Errorf("stats: %d pairs, %d missing; want %d, 0", st.FusedPairs, st.FusedMissing, 3*64)
	}
}
