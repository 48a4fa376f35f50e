//go:build !race

package rdma_test

import (
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/target/rdma"
)

// TestSteadyStateAllocations: a 4 KiB write in the capsule, a 128 KiB
// write fetched by RDMA READ and reads placed by RDMA WRITE, through the
// initiator, the soft transport, the binding, the core and a store volume
// (its reads and overwrites of allocated clusters: the warm-up's first
// writes allocate them), all in this process, allocate nothing in steady
// state. testing.AllocsPerRun counts every goroutine's allocations, both
// sides'.
//
// So do they on an asynchronous backend (a DelayedBackend: completions
// from its goroutines).
func TestSteadyStateAllocations(t *testing.T) {
	t.Run("store", func(t *testing.T) { steadyStateAllocations(t, newTestTarget(t, rdma.Config{})) })
	t.Run("async", func(t *testing.T) {
		tt, _ := newAsyncTarget(t, 1, 20*time.Microsecond, false)
		steadyStateAllocations(t, tt)
	})
}

func steadyStateAllocations(t *testing.T, tt *testTarget) {
	c := connectHost(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 8})
	ns := c.Namespace(1)
	done := make(initiator.DoneChan, 1)
	small := make([]byte, 4096)
	big := make([]byte, 128<<10)
	for _, tc := range []struct {
		name string
		op   func()
	}{
		{"write 4KiB in capsule", func() { ns.WriteAsync(3, small, 0, done) }},
		{"write 128KiB by RDMA READ", func() { ns.WriteAsync(64, big, 0, done) }},
		{"read 4KiB", func() { ns.ReadAsync(3, small, done) }},
		{"read 128KiB", func() { ns.ReadAsync(64, big, done) }},
	} {
		run := func() {
			tc.op()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < 50; i++ { // warm every pool
			run()
		}
		if a := testing.AllocsPerRun(150, run); a > 0.05 {
			t.Errorf("%s: %.2f allocations per I/O (both sides), want 0", tc.name, a)
		} else {
			t.Logf("%s: %.3f allocations per I/O", tc.name, a)
		}
	}
}
