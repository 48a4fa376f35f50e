//go:build !race

package rdma_test

import (
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
	"github.com/blk-project/blk/target/rdma"
)

// TestSteadyStateAllocationsFused: fused Compare and Write pairs through
// blk's initiator, the soft RDMA provider, the binding and the core (4 KiB
// in the capsules, 64 KiB by RDMA READ), on the test target's namespace
// and on an asynchronous one, allocate nothing in steady state.
func TestSteadyStateAllocationsFused(t *testing.T) {
	t.Run("store", func(t *testing.T) {
		tt := newTestTarget(t, rdma.Config{})
		initiatortest.FusedAllocs(t, connectHost(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 16}).Namespace(1))
	})
	t.Run("async", func(t *testing.T) {
		tt, _ := newAsyncTarget(t, 1, 20*time.Microsecond, false)
		initiatortest.FusedAllocs(t, connectHost(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 16}).Namespace(1))
	})
}
