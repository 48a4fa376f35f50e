package metrics

import (
	"strconv"
	"time"

	"github.com/blk-project/blk/target"
	"github.com/prometheus/client_golang/prometheus"
)

// LatencyBuckets returns the upper bounds, in seconds, of the latency
// histograms: a 1-2-5 series from 10 µs to 1 s (16 buckets and +Inf),
// growing by ×2 or ×2.5 per bucket, so any quantile is known to within a
// factor of about 2.5 and the decade bounds an SLO names (100 µs, 1 ms,
// 10 ms, 100 ms) are exact.
//
//   - 10 µs at the bottom: a backend call that hits memory (MemBackend,
//     a pebble memtable write, a cached read) takes a few µs to ~20 µs;
//     finer buckets would only split what the network round trip around
//     it already hides.
//   - 100 µs–10 ms: a read from an NVMe SSD, a WAL sync for a FUA write or
//     Flush (~50 µs–2 ms on NVMe, ~5–10 ms on SATA), a write stalled
//     behind a memtable flush.
//   - 1 s at the top: beyond it a request is failing, not slow (a host's
//     default I/O timeout is 30 s); it lands in +Inf and is still counted.
//
// Each bucket costs one atomic counter per (volume, op) series, and
// Observe finds its bucket by a linear scan (client_golang scans linearly
// under 35 bounds): at most 16 comparisons, a few ns beside the clock
// reads.
func LatencyBuckets() []float64 {
	var b []float64
	for decade := 10e-6; decade < 1; decade *= 10 {
		b = append(b, decade, 2*decade, 5*decade)
	}
	// Rounded so the exposition reads 0.0001, not 0.00010000000000000002.
	for i := range b {
		b[i] = roundSig(b[i])
	}
	return append(b, 1)
}

// roundSig rounds v to one significant digit: v is d × 10^k with d in
// {1, 2, 5}, so this only removes the error of the repeated ×10.
func roundSig(v float64) float64 {
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 1, 64), 64)
	return r
}

// Operation names, the op label of blk_volume_io_latency_seconds.
const (
	OpRead        = "read"
	OpWrite       = "write"
	OpWriteFUA    = "write_fua"
	OpWriteZeroes = "write_zeroes"
	OpDeallocate  = "deallocate"
	OpFlush       = "flush"
)

// Indexes of LatencyBackend.h, one per op.
const (
	iRead = iota
	iWrite
	iWriteFUA
	iWriteZeroes
	iDeallocate
	iFlush
	numOps
)

var ops = [numOps]string{
	iRead: OpRead, iWrite: OpWrite, iWriteFUA: OpWriteFUA,
	iWriteZeroes: OpWriteZeroes, iDeallocate: OpDeallocate, iFlush: OpFlush,
}

// Latency holds the per volume, per operation latency histograms
// (blk_volume_io_latency_seconds{volume, op}) that LatencyBackends
// observe into. It is a prometheus.Collector: register it once.
type Latency struct {
	h *prometheus.HistogramVec
}

// NewLatency returns an empty set of latency histograms.
func NewLatency() *Latency {
	return &Latency{h: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace,
		Subsystem: "volume",
		Name:      "io_latency_seconds",
		Help:      "Time the namespace backend took per call, by operation, failed calls included.",
		Buckets:   LatencyBuckets(),
	}, []string{"volume", "op"})}
}

// Describe implements prometheus.Collector.
func (l *Latency) Describe(ch chan<- *prometheus.Desc) { l.h.Describe(ch) }

// Collect implements prometheus.Collector.
func (l *Latency) Collect(ch chan<- prometheus.Metric) { l.h.Collect(ch) }

// Wrap returns b timed into the histograms of volume (the label value:
// the volume's ID in decimal matches StoreCollector's). The histograms
// are created here, so the calls through the result only read the clock
// and Observe: no lock, no allocation. If b is a target.Viewer, so is the
// result (its View calls are passed through untimed).
func (l *Latency) Wrap(volume string, b target.Backend) target.Backend {
	lb := &LatencyBackend{b: b}
	for i, op := range ops {
		lb.h[i] = l.h.WithLabelValues(volume, op)
	}
	if v, ok := b.(target.Viewer); ok {
		return &latencyViewer{LatencyBackend: lb, v: v}
	}
	return lb
}

// Forget deletes the histograms of volume (a deleted volume). Backends
// wrapped for it still observe into the deleted series, which are no
// longer exported.
func (l *Latency) Forget(volume string) {
	for _, op := range ops {
		l.h.DeleteLabelValues(volume, op)
	}
}

// LatencyBackend is a target.Backend that times each call of another
// Backend into per-operation histograms. Make one with Latency.Wrap.
type LatencyBackend struct {
	b target.Backend
	h [numOps]prometheus.Observer // indexed like ops
}

// Unwrap returns the timed backend.
func (l *LatencyBackend) Unwrap() target.Backend { return l.b }

// Geometry implements target.Backend (untimed: not an I/O).
func (l *LatencyBackend) Geometry() (target.Geometry, error) { return l.b.Geometry() }

// Read implements target.Backend.
func (l *LatencyBackend) Read(lba uint64, buf []byte) error {
	t := time.Now()
	err := l.b.Read(lba, buf)
	l.h[iRead].Observe(time.Since(t).Seconds())
	return err
}

// Write implements target.Backend; FUA writes are timed apart.
func (l *LatencyBackend) Write(lba uint64, data []byte, fua bool) error {
	t := time.Now()
	err := l.b.Write(lba, data, fua)
	i := iWrite
	if fua {
		i = iWriteFUA
	}
	l.h[i].Observe(time.Since(t).Seconds())
	return err
}

// WriteZeroes implements target.Backend.
func (l *LatencyBackend) WriteZeroes(lba, n uint64, fua bool) error {
	t := time.Now()
	err := l.b.WriteZeroes(lba, n, fua)
	l.h[iWriteZeroes].Observe(time.Since(t).Seconds())
	return err
}

// Deallocate implements target.Backend.
func (l *LatencyBackend) Deallocate(lba, n uint64) error {
	t := time.Now()
	err := l.b.Deallocate(lba, n)
	l.h[iDeallocate].Observe(time.Since(t).Seconds())
	return err
}

// Flush implements target.Backend.
func (l *LatencyBackend) Flush() error {
	t := time.Now()
	err := l.b.Flush()
	l.h[iFlush].Observe(time.Since(t).Seconds())
	return err
}

// latencyViewer is a LatencyBackend over a backend that is also a Viewer:
// it keeps the optional extra visible to the target's type assertion.
type latencyViewer struct {
	*LatencyBackend
	v target.Viewer
}

// View implements target.Viewer.
func (l *latencyViewer) View(lba, n uint64, fn func(lba uint64, data []byte)) error {
	return l.v.View(lba, n, fn)
}
