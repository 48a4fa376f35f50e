package metrics_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/blk-project/blk/metrics"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/volume"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func memBackend(t testing.TB) *target.MemBackend {
	t.Helper()
	m, err := target.NewMemBackend(4096, 1024)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLatencyBackendNoAllocs guards the I/O path: a timed Read and Write
// allocate nothing (the histograms are resolved by Wrap, Observe is
// atomic).
func TestLatencyBackendNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	lat := metrics.NewLatency()
	b := lat.Wrap("7", memBackend(t))
	buf := make([]byte, 4096)
	var lba uint64
	allocs := testing.AllocsPerRun(1000, func() {
		if err := b.Write(lba, buf, false); err != nil {
			t.Fatal(err)
		}
		if err := b.Write(lba, buf, true); err != nil {
			t.Fatal(err)
		}
		if err := b.Read(lba, buf); err != nil {
			t.Fatal(err)
		}
		lba = (lba + 1) % 1024
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per timed write+FUA write+read, want 0", allocs)
	}
	// Wrap made one histogram per op, ready before the first I/O.
	if n := collectCount(lat); n != 6 {
		t.Errorf("%d histograms, want 6 (one per op)", n)
	}
}

// TestLatencyBackendPassesThrough: every call reaches the wrapped backend
// with its result, is counted under its op, and the Viewer extra is kept
// exactly when the wrapped backend has it.
func TestLatencyBackendPassesThrough(t *testing.T) {
	lat := metrics.NewLatency()
	m := memBackend(t)
	b := lat.Wrap("3", m)
	if _, ok := b.(target.Viewer); !ok {
		t.Error("wrapped MemBackend lost target.Viewer")
	}
	if _, ok := lat.Wrap("4", noView{m}).(target.Viewer); ok {
		t.Error("wrapped backend without View is a target.Viewer")
	}
	if g, err := b.Geometry(); err != nil || g.BlockSize != 4096 || g.Blocks != 1024 {
		t.Fatalf("geometry %+v, %v", g, err)
	}
	data := []byte(strings.Repeat("x", 4096))
	must(t, b.Write(5, data, false))
	must(t, b.Write(6, data, true))
	must(t, b.WriteZeroes(5, 1, false))
	must(t, b.Deallocate(6, 1))
	must(t, b.Flush())
	got := make([]byte, 4096)
	must(t, b.Read(5, got))
	if got[0] != 0 {
		t.Error("write zeroes did not reach the backend")
	}
	// Errors come back unchanged, and are timed too.
	if err := b.Read(4096, got); err == nil {
		t.Error("read past the end succeeded")
	}
	err := b.Write(0, data[:100], false)
	if !errors.Is(err, volume.ErrMisaligned) {
		t.Errorf("misaligned write: %v", err)
	}
	var viewed int
	must(t, b.(target.Viewer).View(5, 2, func(uint64, []byte) { viewed++ }))
	if viewed != 2 {
		t.Errorf("View saw %d blocks, want 2", viewed)
	}
	for op, want := range map[string]uint64{
		metrics.OpRead: 2, metrics.OpWrite: 2, metrics.OpWriteFUA: 1,
		metrics.OpWriteZeroes: 1, metrics.OpDeallocate: 1, metrics.OpFlush: 1,
	} {
		if got := histCount(t, lat, "3", op); got != want {
			t.Errorf("op %s: count %d, want %d", op, got, want)
		}
	}
	lat.Forget("3")
	if n := collectCount(lat); n != 6 {
		t.Errorf("%d series after Forget(3), want volume 4's 6", n)
	}
	lat.Forget("4")
	if n := collectCount(lat); n != 0 {
		t.Errorf("%d series after Forget(4), want 0", n)
	}
}

// TestLatencyBuckets: increasing, 10 µs to 1 s, exact decimal bounds.
func TestLatencyBuckets(t *testing.T) {
	b := metrics.LatencyBuckets()
	want := []float64{1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1}
	if len(b) != len(want) {
		t.Fatalf("buckets %v", b)
	}
	for i := range b {
		if b[i] != want[i] {
			t.Fatalf("bucket %d = %v, want %v (all: %v)", i, b[i], want[i], b)
		}
	}
}

func histCount(t *testing.T, c prometheus.Collector, volume, op string) uint64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		l := map[string]string{}
		for _, lp := range pb.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["volume"] == volume && l["op"] == op {
			return pb.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

type noView struct{ target.Backend }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// collectCount is the number of metrics c collects.
func collectCount(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}
