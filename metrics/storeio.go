package metrics

import (
	"github.com/blk-project/blk/target"
	"github.com/prometheus/client_golang/prometheus"
)

// StoreIOCollector exports how the target served a store's volumes
// (target.StoreIO.Stats): straight to the disk through a poll group's
// engine, without the disk, or on the workers of the slow path.
type StoreIOCollector struct {
	x *target.StoreIO
	t table[target.StoreIOStats]
}

// NewStoreIOCollector returns a collector for x.
func NewStoreIOCollector(x *target.StoreIO) *StoreIOCollector {
	type S = target.StoreIOStats
	return &StoreIOCollector{x: x, t: newTable(nil, nil,
		counter("store_io_direct_requests_total", "Reads and writes served asynchronously: submitted to the disk by the NVMe/TCP poll group that received them, completed there.", func(s *S) uint64 { return s.Requests }),
		counter("store_io_disk_ios_total", "Disk I/Os of those requests (one per physically contiguous run of clusters: disk_ios/direct_requests above 1 means requests split over discontiguous clusters).", func(s *S) uint64 { return s.Direct }),
		counter("store_io_zero_reads_total", "Reads of unwritten clusters, answered with zeros without the disk.", func(s *S) uint64 { return s.Zeros }),
		counter("store_io_deferred_total", "Requests served by the store's workers, which may block: first writes of clusters, Deallocate and Write Zeroes, reads and writes split too finely, on a volume an administrative change waits for, or with the engine full.", func(s *S) uint64 { return s.Deferred }),
		counter("store_io_overflows_total", "Deferred requests that found the workers' queue full and ran on a goroutine of their own.", func(s *S) uint64 { return s.Overflows }),
		counter("store_io_engine_errors_total", "Disk engines that could not be made and submissions the kernel refused.", func(s *S) uint64 { return s.EngineErrs }),
	)}
}

// Describe implements prometheus.Collector.
func (c *StoreIOCollector) Describe(ch chan<- *prometheus.Desc) { c.t.describe(ch) }

// Collect implements prometheus.Collector.
func (c *StoreIOCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.x.Stats()
	c.t.collect(ch, &s)
}
