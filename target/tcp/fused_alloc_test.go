//go:build !race

package tcp_test

import (
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
	"github.com/blk-project/blk/target/tcp"
)

// TestSteadyStateAllocationsFused: fused Compare and Write pairs through
// blk's initiator, the binding and the core (4 KiB in the capsules,
// 64 KiB by R2T), on a memory namespace and on an asynchronous one,
// allocate nothing in steady state, host and target together.
func TestSteadyStateAllocationsFused(t *testing.T) {
	t.Run("inline", func(t *testing.T) {
		tt := newTestTarget(t, tcp.Config{})
		initiatortest.FusedAllocs(t, connectTCP(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 16}).Namespace(1))
	})
	t.Run("async", func(t *testing.T) {
		tt, _ := newAsyncTarget(t, 1, 20*time.Microsecond, false)
		initiatortest.FusedAllocs(t, connectTCP(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 16}).Namespace(1))
	})
}
