package metrics

import (
	"github.com/blk-project/blk/repl"
	"github.com/prometheus/client_golang/prometheus"
)

// ReplicaVolume is a replicated volume this node serves as its primary:
// its name and its replication's counters (repl.Backend.Stats).
type ReplicaVolume struct {
	Name  string
	Stats repl.Stats
}

// ReplicationCollector exports the replication of the volumes a node is
// primary of (docs/replication.md §2): per volume its epoch and whether
// it serves, per replica the writes sent, failed and held, and the legs
// that waited for a free slot of the replica connection, a rebuild's
// progress and the bytes it copied (by mode: full, incremental or compare), and
// the size of the dirty regions the primary tracks for a replica out of
// sync (what an incremental rebuild would copy). A volume of one
// replica, or served by another node, has none of these series.
type ReplicationCollector struct {
	vols    func() []ReplicaVolume
	vol     table[repl.Stats]
	peer    table[repl.PeerStats]
	rebuild table[repl.PeerStats]
	dirty   table[repl.DirtyStats]
}

// NewReplicationCollector returns a collector of what vols returns at
// each scrape.
func NewReplicationCollector(vols func() []ReplicaVolume) *ReplicationCollector {
	type S = repl.Stats
	type P = repl.PeerStats
	return &ReplicationCollector{vols: vols,
		vol: newTable(nil, []string{"volume"},
			gauge("volume_epoch", "The volume's epoch (changes of primary) this node serves it at as its primary.", func(s *S) float64 { return float64(s.Epoch) }),
			gauge("volume_replication_serving", "1 while this primary serves the volume's I/O; 0 while it connects its replicas (reads only) or after the registry could not be told of a lost replica.", func(s *S) float64 { return b2f(s.Serving) }),
			counter("volume_replication_overflows_total", "Host I/Os that found every preallocated replication record in use and took an allocated one.", func(s *S) uint64 { return s.Overflows }),
			counter("volume_replication_local_failures_total", "Writes and flushes the primary's own copy failed (the volume then stops being served here).", func(s *S) uint64 { return s.LocalFailures }),
		),
		peer: newTable(nil, []string{"volume", "node"},
			gauge("replica_in_sync", "1 while the primary sends the replica every write; 0 once it missed one (reported to the registry, or the report failed).", func(p *P) float64 { return b2f(p.State == "in-sync") }),
			counter("replica_writes_total", "Writes, write zeroes, deallocates and flushes sent to the replica.", func(p *P) uint64 { return p.Writes }),
			counter("replica_write_failures_total", "Of those, failed (the replica is then reported out of sync).", func(p *P) uint64 { return p.Failures }),
			counter("replica_held_writes_total", "Host I/Os held until the registry recorded the replica out of sync.", func(p *P) uint64 { return p.Held }),
			counter("replica_backlogged_total", "Commands that found every slot of the replica connection busy and waited for one.", func(p *P) uint64 { return p.Backlogged }),
			gauge("replica_backlog", "Commands waiting for a slot of the replica connection now.", func(p *P) float64 { return float64(p.Queued) }),
			counter("replica_rebuild_bytes_total", "Bytes the replica's rebuild has passed, copied or holes cleared: of the volume (a full copy) or of its dirty regions (an incremental one).", func(p *P) uint64 { return p.RebuildDone }),
			gauge("replica_rebuild_remaining_bytes", "Bytes the replica's rebuild has still to pass (0: none running, or done).", func(p *P) float64 { return float64(p.RebuildTotal - p.RebuildDone) }),
		),
		rebuild: newTable(nil, []string{"volume", "node", "mode"},
			counter("replica_rebuild_copied_bytes_total", "Bytes the replica's last rebuild on this primary wrote to it (holes not counted), by mode: full (every allocated extent), incremental (the dirty regions only) or compare (the regions whose digests differed).", func(p *P) uint64 { return p.RebuildCopied }),
		),
		dirty: newTable(nil, []string{"volume", "node"},
			gauge("replica_dirty_bytes", "Bytes of the volume the primary's dirty-region log marks for a replica out of sync: what an incremental rebuild copies at most.", func(d *repl.DirtyStats) float64 { return float64(d.Bytes) }),
		),
	}
}

// Describe implements prometheus.Collector.
func (c *ReplicationCollector) Describe(ch chan<- *prometheus.Desc) {
	c.vol.describe(ch)
	c.peer.describe(ch)
	c.rebuild.describe(ch)
	c.dirty.describe(ch)
}

// Collect implements prometheus.Collector.
func (c *ReplicationCollector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.vols() {
		c.vol.collect(ch, &v.Stats, v.Name)
		for i := range v.Stats.Peers {
			p := &v.Stats.Peers[i]
			c.peer.collect(ch, p, v.Name, p.Node)
			if p.RebuildMode != "" {
				c.rebuild.collect(ch, p, v.Name, p.Node, p.RebuildMode)
			}
		}
		for i := range v.Stats.Dirty {
			c.dirty.collect(ch, &v.Stats.Dirty[i], v.Name, v.Stats.Dirty[i].Node)
		}
	}
}
