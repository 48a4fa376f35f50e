package metrics

import (
	"strconv"
	"sync/atomic"

	"github.com/blk-project/blk/target/volume"
	"github.com/prometheus/client_golang/prometheus"
)

// StoreCollector exports a volume store's health and, per volume
// labelled {volume} (its ID in decimal), volume.Volume.Stats and its
// size. Volume.Stats walks the volume's keys to count allocated bytes, so
// a scrape costs time in proportion to the blocks written: scrape every
// few seconds, not faster.
type StoreCollector struct {
	s      *volume.Store
	vol    table[volStats]
	store  table[volume.Store]
	errors *prometheus.Desc
	// failed counts volumes whose Stats failed during a scrape (deleted
	// in between, or the store failed): they are left out of that scrape.
	failed atomic.Uint64
}

// volStats is what is exported per volume.
type volStats struct {
	volume.Stats
	info volume.Info
}

// NewStoreCollector returns a collector for s.
func NewStoreCollector(s *volume.Store) *StoreCollector {
	type V = volStats
	type St = volume.Store
	vl := []string{"volume"}
	return &StoreCollector{
		s: s,
		vol: newTable(nil, vl,
			counter("volume_reads_total", "Reads that succeeded since the store was opened.", func(s *V) uint64 { return s.Reads }),
			counter("volume_writes_total", "Writes that succeeded (FUA included).", func(s *V) uint64 { return s.Writes }),
			counter("volume_fua_writes_total", "FUA writes that succeeded.", func(s *V) uint64 { return s.FUAWrites }),
			counter("volume_write_zeroes_total", "Write Zeroes requests that succeeded.", func(s *V) uint64 { return s.WriteZeroes }),
			counter("volume_deallocates_total", "Deallocate requests that succeeded.", func(s *V) uint64 { return s.Deallocates }),
			counter("volume_flushes_total", "Flushes that succeeded.", func(s *V) uint64 { return s.Flushes }),
			counter("volume_errors_total", "Requests that failed.", func(s *V) uint64 { return s.Errors }),
			counter("volume_read_bytes_total", "Bytes read by successful requests.", func(s *V) uint64 { return s.ReadBytes }),
			counter("volume_write_bytes_total", "Bytes written by successful requests.", func(s *V) uint64 { return s.WriteBytes }),
			counter("volume_removed_blocks_total", "Blocks named by successful Write Zeroes and Deallocate requests.", func(s *V) uint64 { return s.RemovedBlocks }),
			counter("volume_copied_bytes_total", "Bytes copied between callers' buffers and pebble.", func(s *V) uint64 { return s.CopiedBytes }),
			gauge("volume_allocated_bytes", "Space the volume's data takes before compression: written blocks times block size.", func(s *V) float64 { return float64(s.AllocatedBytes) }),
			gauge("volume_disk_bytes", "Pebble's estimate of the on-disk bytes of the volume's sstables.", func(s *V) float64 { return float64(s.DiskBytes) }),
			gauge("volume_size_bytes", "The volume's capacity.", func(s *V) float64 { return float64(s.info.SizeBytes) }),
		),
		store: newTable(nil, nil,
			counter("volume_store_background_errors_total", "Pebble background errors (failed flushes and compactions).", func(s *St) uint64 { return s.BackgroundErrors() }),
			gauge("volume_store_healthy", "1 while the store has not failed.", func(s *St) float64 { return b2f(s.Health() == nil) }),
		),
		errors: prometheus.NewDesc("blk_volume_stats_errors_total",
			"Volumes left out of a scrape because their Stats failed.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *StoreCollector) Describe(ch chan<- *prometheus.Desc) {
	c.vol.describe(ch)
	c.store.describe(ch)
	ch <- c.errors
}

// Collect implements prometheus.Collector.
func (c *StoreCollector) Collect(ch chan<- prometheus.Metric) {
	c.store.collect(ch, c.s)
	infos, err := c.s.List()
	if err != nil {
		c.failed.Add(1)
	}
	for _, info := range infos {
		v, err := c.s.Volume(info.ID)
		if err != nil {
			c.failed.Add(1)
			continue
		}
		st := volStats{info: info}
		if st.Stats, err = v.Stats(); err != nil {
			c.failed.Add(1)
			continue
		}
		c.vol.collect(ch, &st, strconv.FormatUint(uint64(info.ID), 10))
	}
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(c.failed.Load()))
}
