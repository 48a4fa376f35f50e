package initiator

import (
	"testing"
	"time"
)

// ioCounter is a preallocated Callback: the pattern the asynchronous API
// is designed for (a caller's own request struct).
type ioCounter struct {
	done chan struct{}
	errs int
}

func (c *ioCounter) IODone(err error) {
	if err != nil {
		c.errs++
	}
	c.done <- struct{}{}
}

// The steady state of the asynchronous path allocates nothing: submit →
// capsule → target → response → callback, for writes in the capsule,
// keyed writes and keyed reads (host and fake target in one process, so
// this also holds the fake to it). The blocking calls reuse pooled state
// and allocate nothing either.
func TestZeroAllocIO(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	cfg.KATO = time.Minute
	c := connectFake(t, f, cfg)
	checkZeroAllocIO(t, c.Namespace(1))
}

// checkZeroAllocIO runs a 4 KiB write (in the capsule), a 32 KiB FUA
// write and a 32 KiB read on ns, asynchronously and then blocking, after
// a warm-up, and fails t for any allocation per run or any I/O error.
// Both transports' zero-allocation tests use it: on RDMA the large write
// is fetched by RDMA READ and the read placed by RDMA WRITE, on TCP they
// go by R2T/H2CData and C2HData.
func checkZeroAllocIO(t *testing.T, ns *Namespace) {
	t.Helper()
	small := make([]byte, 4096)
	large := make([]byte, 32<<10)
	out := make([]byte, 32<<10)
	cb := &ioCounter{done: make(chan struct{}, 4)}
	var d Callback = cb
	run := func() {
		if err := ns.WriteAsync(8, small, 0, d); err != nil {
			t.Fatal(err)
		}
		<-cb.done
		if err := ns.WriteAsync(64, large, FUA, d); err != nil {
			t.Fatal(err)
		}
		<-cb.done
		if err := ns.ReadAsync(64, out, d); err != nil {
			t.Fatal(err)
		}
		<-cb.done
	}
	for i := 0; i < 50; i++ { // warm up: pools, goroutine stacks
		run()
	}
	if allocs := testing.AllocsPerRun(200, run); allocs != 0 {
		t.Errorf("async write+write+read: %.1f allocations per run, want 0", allocs)
	}
	if cb.errs != 0 {
		t.Fatalf("%d errors", cb.errs)
	}
	blocking := func() {
		if _, err := ns.WriteAt(large, 512<<10); err != nil {
			t.Fatal(err)
		}
		if _, err := ns.ReadAt(out, 512<<10); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 50; i++ {
		blocking()
	}
	if allocs := testing.AllocsPerRun(200, blocking); allocs != 0 {
		t.Errorf("WriteAt+ReadAt: %.1f allocations per run, want 0", allocs)
	}
}
