package metrics

import (
	"github.com/blk-project/blk/target"
	"github.com/prometheus/client_golang/prometheus"
)

// LatencyBuckets returns the upper bounds, in seconds, of the latency
// histograms: the target's (target.LatencyBounds, a 1-2-5 series from
// 10 µs to 1 s, where target/stats.go says why), then +Inf.
func LatencyBuckets() []float64 {
	b := target.LatencyBounds()
	s := make([]float64, len(b))
	for i, d := range b {
		// d/1e9 is the nearest float64 to the decimal bound: the
		// exposition reads 0.0001, not 0.00010000000000000002.
		s[i] = float64(d) / 1e9
	}
	return s
}

// latencyHistogram is the exposition of one target.LatencyHistogram:
// the target's buckets hold each range's own count, Prometheus's the
// running total.
func latencyHistogram(desc *prometheus.Desc, bounds []float64, h *target.LatencyHistogram, lv ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(bounds))
	var cum uint64
	for i, le := range bounds {
		cum += h.Buckets[i]
		buckets[le] = cum
	}
	return prometheus.MustNewConstHistogram(desc, h.Count, h.Sum.Seconds(), buckets, lv...)
}
