//go:build !race

package tcp_test

import (
	"testing"
	"time"

	"github.com/blk-project/blk/target/tcp"
)

// TestSteadyStateAllocations: 4 KiB writes in the capsule, 128 KiB writes
// by R2T and H2CData, and reads of both sizes, through the allocation-free
// bench host, the binding, the core and a memory namespace, all in this
// process, allocate nothing in steady state. testing.AllocsPerRun counts
// every goroutine's allocations, host's and target's. So do they on an
// asynchronous backend (a DelayedBackend: completions from its goroutines,
// reaped by the poll group). So do they with a reservation held by the
// host (the reservation check and its per-queue cache, resv_test.go).
func TestSteadyStateAllocations(t *testing.T) {
	t.Run("inline", func(t *testing.T) { steadyStateAllocations(t, newTestTarget(t, tcp.Config{})) })
	t.Run("resv=held", func(t *testing.T) {
		tt := newTestTarget(t, tcp.Config{})
		holdReservation(t, tt)
		steadyStateAllocations(t, tt)
	})
	t.Run("async", func(t *testing.T) {
		tt, _ := newAsyncTarget(t, 1, 20*time.Microsecond, false)
		steadyStateAllocations(t, tt)
	})
}

func steadyStateAllocations(t *testing.T, tt *testTarget) {
	for _, tc := range []struct {
		name  string
		write bool
		size  int
	}{
		{"write 4KiB in capsule", true, 4 << 10},
		{"write 128KiB by R2T", true, 128 << 10},
		{"read 4KiB", false, 4 << 10},
		{"read 128KiB", false, 128 << 10},
	} {
		h := dialBench(t, tt.addr, tc.write, tc.size, 4)
		done := make(chan error, 4)
		h.done = func(slot int, err error) { done <- err }
		run := func() {
			for slot := 0; slot < 4; slot++ {
				if err := h.submit(slot, uint64(slot*32)); err != nil {
					t.Fatal(err)
				}
			}
			for range 4 {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
		}
		for i := 0; i < 50; i++ { // warm every pool
			run()
		}
		if a := testing.AllocsPerRun(200, run) / 4; a > 0.02 {
			t.Errorf("%s: %.3f allocations per I/O (host and target), want 0", tc.name, a)
		} else {
			t.Logf("%s: %.3f allocations per I/O", tc.name, a)
		}
	}
}
