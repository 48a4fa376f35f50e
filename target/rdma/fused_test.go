package rdma_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/target/targettest"
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
	targettest.FusedOverWire(t, tt.t, c.Namespace(1), seed)
}

// TestFusedBufferExhaustion (docs/reservations.md §2.2, §9 question 10):
// data buffers of 4 per core and class, a reserve of 8 and of 1, and 64
// pairs in flight from 8 queues (4 KiB in the capsules, 64 KiB by RDMA
// READ), halves executing out of order while waiting halves hold every
// ordinary buffer: every pair completes and writes.
func TestFusedBufferExhaustion(t *testing.T) {
	for _, reserve := range []uint32{8, 1} {
		t.Run(fmt.Sprintf("reserve=%d", reserve), func(t *testing.T) {
			seed := uint64(testSeed(t))
			d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: 4096, Blocks: 16384,
				Seed: seed, MaxDelay: 200 * time.Microsecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(d.Close)
			tt := serveAsyncCfg(t, d, rdma.Config{Addr: "127.0.0.1:0", Cores: 2, SmallBuffers: 4, MidBuffers: 4,
				LargeBuffers: 4, FusedReserve: reserve})
			c := connectHost(t, tt.addr, initiator.Config{Queues: 8, QueueDepth: 16})
			targettest.FusedFloods(t, tt.t, c.Namespace(1))
		})
	}
}
