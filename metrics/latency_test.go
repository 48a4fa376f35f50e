package metrics_test

import (
	"testing"

	"github.com/blk-project/blk/metrics"
)

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

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
