package rdma_test

import (
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
)

// TestFusedOverWire: blk's initiator sends fused Compare and Write pairs
// over NVMe/RDMA (the soft provider) — 4 KiB in the capsules, 64 KiB
// fetched by RDMA READ, a pair with a write right behind its second,
// counters incremented from several goroutines beside plain writes — to
// a backend completing late and out of order: the pairs are paired by
// their arrival (none Missing), write only on a match, and are atomic.
func TestFusedOverWire(t *testing.T) {
	seed := uint64(testSeed(t))
	tt, _ := newAsyncTarget(t, seed, 100*time.Microsecond, false)
	c := connectHost(t, tt.addr, initiator.Config{Queues: 2, QueueDepth: 32})
	wrote, miscompared := initiatortest.FusedWorkload(t, c.Namespace(1), seed, 4)
	st := tt.t.Stats()
	if st.FusedPairs != wrote || st.FusedMiscompares != miscompared || st.FusedMissing != 0 {
		t.Errorf("stats: %d pairs, %d miscompares, %d missing; the host saw %d written, %d miscompared",
			st.FusedPairs, st.FusedMiscompares, st.FusedMissing, wrote, miscompared)
	}
	t.Logf("%d pairs wrote, %d miscompared, %d lock waits", wrote, miscompared, st.LockWaits)
}
