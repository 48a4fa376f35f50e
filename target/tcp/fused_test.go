package tcp_test

import (
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
)

// TestFusedOverWire: blk's initiator sends fused Compare and Write pairs
// over NVMe/TCP — 4 KiB with the data in the capsules, 64 KiB by R2T, a
// pair whose second needs an R2T with a write right behind it, counters
// incremented from several goroutines beside plain writes — to a
// backend completing late and out of order: the pairs are paired by
// their arrival (none Missing), write only on a match, and are atomic.
func TestFusedOverWire(t *testing.T) {
	seed := testSeed(t)
	tt, _ := newAsyncTarget(t, seed, 100*time.Microsecond, false)
	c := connectTCP(t, tt.addr, initiator.Config{Queues: 2, QueueDepth: 32})
	wrote, miscompared := initiatortest.FusedWorkload(t, c.Namespace(1), seed, 4)
	st := tt.t.Stats()
	if st.FusedPairs != wrote || st.FusedMiscompares != miscompared || st.FusedMissing != 0 {
		t.Errorf("stats: %d pairs, %d miscompares, %d missing; the host saw %d written, %d miscompared",
			st.FusedPairs, st.FusedMiscompares, st.FusedMissing, wrote, miscompared)
	}
	t.Logf("%d pairs wrote, %d miscompared, %d lock waits", wrote, miscompared, st.LockWaits)
}
