package benchbook

import (
	"testing"
	"time"

	"github.com/blk-project/blk/internal/importtest"
)

// TestMedian: the sizing runs (shorter than half the longest) are left
// out, the median of the rest is taken; a name with no run says so.
func TestMedian(t *testing.T) {
	var b Book
	if _, ok := b.Median("x"); ok {
		t.Fatal("median of no runs")
	}
	b.Record("x", 1, 1)      // sizing run: left out
	b.Record("x", 100, 9000) // left out too (< 1000/2)
	b.Record("x", 1000, 30)
	b.Record("x", 1000, 10)
	b.Record("x", 600, 20)
	b.Record("y", 5, 7)
	if m, ok := b.Median("x"); !ok || m != 20 {
		t.Fatalf("median %v %v, want 20", m, ok)
	}
	if m, ok := b.Median("y"); !ok || m != 7 {
		t.Fatalf("median of y %v %v, want 7", m, ok)
	}
}

// TestLatency: mean, and the nearest-rank 99th percentile.
func TestLatency(t *testing.T) {
	lat := make([]int64, 200)
	for i := range lat {
		lat[i] = int64(200 - i) // 200..1, unsorted
	}
	mean, p99 := Latency(lat)
	if mean != time.Duration(100) || p99 != time.Duration(198) {
		t.Fatalf("mean %v p99 %v, want 100ns and 198ns", mean, p99)
	}
	if m, p := Latency(nil); m != 0 || p != 0 {
		t.Fatal("latency of nothing")
	}
}

func TestImports(t *testing.T) { importtest.Only(t, ".") }
