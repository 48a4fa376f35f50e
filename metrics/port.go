package metrics

import (
	"github.com/blk-project/blk/target/rdma"
	"github.com/prometheus/client_golang/prometheus"
)

// PortCollector exports an RDMA port's binding counters (rdma.Port.Stats)
// with the constant label port (the listening address). The port's
// engine, per core, is an EngineCollector: Registry.RegisterPort
// registers both.
type PortCollector struct {
	p *rdma.Port
	t table[rdma.Stats]
}

// NewPortCollector returns a collector for p, labelled
// port=p.Addr().String().
func NewPortCollector(p *rdma.Port) *PortCollector {
	type S = rdma.Stats
	return &PortCollector{p: p, t: newTable(prometheus.Labels{"port": p.Addr().String()}, nil,
		counter("rdma_accepts_total", "Connections accepted.", func(s *S) uint64 { return s.Accepts }),
		counter("rdma_rejects_total", "Connection requests rejected.", func(s *S) uint64 { return s.Rejects }),
		counter("rdma_commands_total", "Command capsules received.", func(s *S) uint64 { return s.Commands }),
		counter("rdma_protocol_errors_total", "Malformed capsules (each dropped its connection).", func(s *S) uint64 { return s.ProtocolErrors }),
		counter("rdma_in_capsule_writes_total", "Writes whose data came in the command capsule.", func(s *S) uint64 { return s.InCapsuleWrites }),
		counter("rdma_grouped_writes_total", "Plain writes a core gathered into its write group (target.Group) to commit together.", func(s *S) uint64 { return s.GroupedWrites }),
		counter("rdma_group_commits_total", "Commits of the cores' write groups, one per namespace with writes per pass: group_commits/grouped_writes is the commits per grouped write.", func(s *S) uint64 { return s.GroupCommits }),
		counter("rdma_reads_total", "RDMA READs issued to fetch host data.", func(s *S) uint64 { return s.RDMAReads }),
		counter("rdma_writes_total", "RDMA WRITEs issued to place data in host memory.", func(s *S) uint64 { return s.RDMAWrites }),
		counter("rdma_data_waits_total", "Commands that waited for a data buffer.", func(s *S) uint64 { return s.DataWaits }),
		counter("rdma_capsule_copies_total", "In-capsule writes copied into an aligned data buffer before going to the disk: 0 while the receive buffers place in-capsule data on a page; rising with in_capsule_writes means every small write pays a copy.", func(s *S) uint64 { return s.CapsuleCopies }),
		gauge("rdma_disk_in_flight", "I/Os the cores have at the disk through their own engines (io_uring), as of each core's last pass: near the hosts' queue depth means the disk, not the target, holds the work; 0 under load means the backend serves I/O inline or on workers.", func(s *S) float64 { return float64(s.DiskInFlight) }),
		gauge("rdma_disk_in_flight_peak", "The most I/Os one core has had at the disk at once since the port opened: the depth the disk was actually given.", func(s *S) float64 { return float64(s.DiskInFlightPeak) }),
	)}
}

// Describe implements prometheus.Collector.
func (c *PortCollector) Describe(ch chan<- *prometheus.Desc) { c.t.describe(ch) }

// Collect implements prometheus.Collector.
func (c *PortCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.Stats()
	c.t.collect(ch, &s)
}
