package metrics

import (
	"strconv"
	"sync/atomic"

	"github.com/blk-project/blk/store"
	"github.com/prometheus/client_golang/prometheus"
)

// StoreCollector exports the node's extent store (package store): its
// data area (clusters total, free, mapped, in the ready pool and in limbo),
// its counters (map commits, syncs, bounce copies), the space guard's
// reading of the filesystem, pebble's health (which now holds only the
// metadata: L0, compaction debt, write stalls) and, per volume labelled
// {volume} (its name), its counters, its size and the exact bytes its
// clusters take, plus blk_volume_info{volume, id, nqn} giving its store
// ID and NQN; per snapshot, labelled {volume, snapshot} (names), the
// bytes its clusters take and its size. Names come from the names
// function, read once per scrape: an object it does not name (created
// or deleted between the registry's read and the store's, or no names
// function at all) is left out of that scrape and counted in
// blk_volume_unnamed_objects, so that the volume label has one meaning.
// A scrape reads counters and pebble's table metadata only: its cost
// does not grow with the data the volumes hold.
type StoreCollector struct {
	s       *store.Store
	names   func() map[uint64]VolumeLabel
	vol     table[volStats]
	store   table[storeStats]
	engine  table[store.EngineStats]
	snap    table[volStats]
	info    *prometheus.Desc
	errors  *prometheus.Desc
	unnamed *prometheus.Desc
	// failed counts volumes whose counters failed during a scrape (deleted
	// in between, or the store failed): they are left out of that scrape.
	failed atomic.Uint64
}

// VolumeLabel names a store object for the volume label. For a volume,
// Name is its name and NQN its subsystem's; for a snapshot, Name is its
// volume's name and Snapshot its own (NQN empty: snapshots are not
// served).
type VolumeLabel struct{ Name, NQN, Snapshot string }

// volStats is what is exported per volume.
type volStats struct {
	store.VolumeStats
	info store.Info
}

// storeStats is what is exported per store: its counters, space guard
// and health, read once per scrape.
type storeStats struct {
	store.Stats
	space  store.SpaceStats
	health error
}

// NewStoreCollector returns a collector for s; names maps store object
// IDs (volumes and snapshots) to their names, read once per scrape. With
// names nil no object is named, and only the store-wide series are
// exported.
func NewStoreCollector(s *store.Store, names func() map[uint64]VolumeLabel) *StoreCollector {
	type V = volStats
	type St = storeStats
	type E = store.EngineStats
	vl := []string{"volume"}
	return &StoreCollector{
		s:     s,
		names: names,
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
			gauge("volume_disk_bytes", "Bytes of the data area the volume's clusters take (exact: allocated clusters times the cluster size).", func(s *V) float64 { return float64(s.AllocatedBytes) }),
			gauge("volume_size_bytes", "The volume's capacity.", func(s *V) float64 { return float64(s.info.SizeBytes) }),
		),
		snap: newTable(nil, []string{"volume", "snapshot"},
			gauge("snapshot_disk_bytes", "Bytes of the data area the snapshot's own clusters take (shared with the objects above it where they did not change them; what deleting it frees is exclusive_bytes in GET /v1/volumes/{name}/snapshots).", func(s *V) float64 { return float64(s.AllocatedBytes) }),
			gauge("snapshot_size_bytes", "The volume's capacity when the snapshot was taken.", func(s *V) float64 { return float64(s.info.SizeBytes) }),
		),
		store: newTable(nil, nil,
			gauge("volume_store_healthy", "1 while the store has not failed.", func(s *St) float64 { return b2f(s.health == nil) }),
			gauge("volume_store_free_bytes", "Free space on the store's filesystem (last reading).", func(s *St) float64 { return float64(s.space.FreeBytes) }),
			gauge("volume_store_fs_bytes", "Size of the store's filesystem.", func(s *St) float64 { return float64(s.space.TotalBytes) }),
			gauge("volume_store_reserve_bytes", "Free space under which writes to unallocated clusters are refused (ENOSPC to hosts).", func(s *St) float64 { return float64(s.space.ReserveBytes) }),
			gauge("volume_store_full", "1 while writes to unallocated clusters are refused for lack of space.", func(s *St) float64 { return b2f(s.space.Full) }),
			gauge("volume_store_area_bytes", "Size of the data area (the header's cluster included).", func(s *St) float64 { return float64(s.Clusters * s.ClusterBytes) }),
			gauge("volume_store_area_free_bytes", "Bytes of the data area in clusters no volume holds and none waits for (the area may still grow).", func(s *St) float64 { return float64(s.Free * s.ClusterBytes) }),
			gauge("volume_store_area_mapped_bytes", "Bytes of the data area in clusters volumes hold.", func(s *St) float64 { return float64(s.Mapped * s.ClusterBytes) }),
			gauge("volume_store_area_ready_bytes", "Bytes of the data area reserved, zeroed, next to be handed out.", func(s *St) float64 { return float64(s.Ready * s.ClusterBytes) }),
			gauge("volume_store_area_limbo_bytes", "Bytes of the data area freed and waiting for a flush before reuse.", func(s *St) float64 { return float64(s.Limbo * s.ClusterBytes) }),
			gauge("volume_store_cluster_bytes", "The store's unit of allocation.", func(s *St) float64 { return float64(s.ClusterBytes) }),
			gauge("volume_store_area_zeroed_bytes", "Bytes of the data area below its zeroed watermark (free clusters there read zeros); below volume_store_area_bytes on a block device not used up once, whose clusters are zeroed as they are first handed out.", func(s *St) float64 { return float64(s.Zeroed * s.ClusterBytes) }),
			gauge("volume_store_zeroed_at_open_clusters", "Clusters the store zeroed (and synced) when this process opened it: the reservations and interrupted deletes or shrinks a crash or kill left behind; 0 after a clean stop, which releases them. Large values mean slow starts after crashes.", func(s *St) float64 { return float64(s.ZeroedAtOpen) }),
			counter("volume_store_zeroed_ahead_clusters_total", "Clusters of a block device zeroed (and synced) by refills of the ready pool before their first use.", func(s *St) uint64 { return s.ZeroedAhead }),
			counter("volume_store_map_commits_total", "First writes of clusters (one unsynced pebble commit each).", func(s *St) uint64 { return s.MapCommits }),
			counter("volume_store_refills_total", "Refills of the ready pool (one synced pebble commit each).", func(s *St) uint64 { return s.Refills }),
			counter("volume_store_background_refills_total", "Refills of the ready pool made in the background when first writes left it below its low-water mark (among volume_store_refills_total; the rest were paid by a first write that found the pool empty).", func(s *St) uint64 { return s.BackgroundRefills }),
			counter("volume_store_background_refill_errors_total", "Background refills of the ready pool that failed (logged; first writes refill it until one succeeds).", func(s *St) uint64 { return s.BackgroundRefillErrors }),
			counter("volume_store_copies_on_write_total", "First writes that replaced a snapshot's cluster with one of the writer's own: covering it whole, or redirected into a partial cluster holding only the 4 KiB sub-blocks written (docs/snapshots.md §1.3).", func(s *St) uint64 { return s.CopiesOnWrite }),
			counter("volume_store_frees_total", "Batches of clusters freed by Deallocate and Write Zeroes.", func(s *St) uint64 { return s.Frees }),
			counter("volume_store_syncs_total", "Flushes that synced the data area and then pebble's WAL (Flush, FUA, the background syncer).", func(s *St) uint64 { return s.Flushes }),
			counter("volume_store_area_syncs_total", "fdatasyncs of the data area.", func(s *St) uint64 { return s.AreaSyncs }),
			counter("volume_store_bounce_copies_total", "Requests whose buffer was not aligned for O_DIRECT and went through a copy.", func(s *St) uint64 { return s.BounceCopies }),
			counter("volume_store_background_syncs_total", "Flushes by the store's background syncer, which makes acknowledged plain writes durable within the sync interval (none while idle).", func(s *St) uint64 { return s.BackgroundSyncs }),
		),
		engine: newTable(nil, nil,
			gauge("volume_store_l0_files", "Tables in pebble's level 0.", func(e *E) float64 { return float64(e.L0Files) }),
			gauge("volume_store_l0_sublevels", "Sublevels in pebble's level 0 (read amplification there).", func(e *E) float64 { return float64(e.L0Sublevels) }),
			gauge("volume_store_compaction_debt_bytes", "Pebble's estimate of the bytes compactions still have to rewrite.", func(e *E) float64 { return float64(e.CompactionDebtBytes) }),
			counter("volume_store_background_errors_total", "Pebble background errors (failed flushes and compactions).", func(e *E) uint64 { return e.BackgroundErrors }),
			counter("volume_store_compactions_total", "Pebble compactions completed.", func(e *E) uint64 { return uint64(e.Compactions) }),
			counter("volume_store_flushes_total", "Pebble memtable flushes completed.", func(e *E) uint64 { return uint64(e.Flushes) }),
			counter("volume_store_write_stalls_total", "Times pebble held writes back for flushes or compactions to catch up (first writes of clusters wait).", func(e *E) uint64 { return e.WriteStalls }),
			fcounter("volume_store_write_stall_seconds_total", "Time writes were held back by pebble for flushes or compactions to catch up.", func(e *E) float64 { return e.WriteStallSeconds }),
			gauge("volume_store_disk_bytes", "Pebble's on-disk size (the metadata; the data area is volume_store_area_bytes).", func(e *E) float64 { return float64(e.DiskBytes) }),
			gauge("volume_store_memtable_bytes", "Memory held by pebble's memtables.", func(e *E) float64 { return float64(e.MemtableBytes) }),
		),
		info: prometheus.NewDesc("blk_volume_info", "1 for each volume the store holds, labelled with its store ID and its subsystem's NQN.", []string{"volume", "id", "nqn"}, nil),
		errors: prometheus.NewDesc("blk_volume_stats_errors_total",
			"Volumes left out of a scrape because their counters failed.", nil, nil),
		unnamed: prometheus.NewDesc("blk_volume_unnamed_objects",
			"Store objects (volumes, snapshots) left out of this scrape because the registry names none of them: created or deleted between the two reads.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *StoreCollector) Describe(ch chan<- *prometheus.Desc) {
	c.vol.describe(ch)
	c.snap.describe(ch)
	c.store.describe(ch)
	c.engine.describe(ch)
	ch <- c.info
	ch <- c.errors
	ch <- c.unnamed
}

// Collect implements prometheus.Collector.
func (c *StoreCollector) Collect(ch chan<- prometheus.Metric) {
	st := storeStats{Stats: c.s.Stats(), space: c.s.Space(), health: c.s.Health()}
	c.store.collect(ch, &st)
	if st.health == nil {
		e := c.s.Engine()
		c.engine.collect(ch, &e)
	}
	var names map[uint64]VolumeLabel
	if c.names != nil {
		names = c.names()
	}
	infos, err := c.s.List()
	if err != nil {
		c.failed.Add(1)
	}
	unnamed := 0
	for _, info := range infos {
		n, ok := names[uint64(info.ID)]
		if !ok || n.Name == "" || (info.Kind != store.KindVolume) != (n.Snapshot != "") {
			unnamed++
			continue
		}
		v, err := c.s.Volume(info.ID)
		if err != nil {
			c.failed.Add(1)
			continue
		}
		st := volStats{info: info, VolumeStats: v.Stats()}
		if info.Kind != store.KindVolume {
			// Snapshots are not volumes (not served, not counted as one):
			// their own series, by volume and snapshot name.
			c.snap.collect(ch, &st, n.Name, n.Snapshot)
			continue
		}
		c.vol.collect(ch, &st, n.Name)
		ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1, n.Name, strconv.FormatUint(uint64(info.ID), 10), n.NQN)
	}
	ch <- prometheus.MustNewConstMetric(c.unnamed, prometheus.GaugeValue, float64(unnamed))
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(c.failed.Load()))
}
