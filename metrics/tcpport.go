package metrics

import (
	"github.com/blk-project/blk/target/tcp"
	"github.com/prometheus/client_golang/prometheus"
)

// TCPPortCollector exports an NVMe/TCP port's binding counters
// (tcp.Port.Stats) with the constant label port (the listening address).
type TCPPortCollector struct {
	p *tcp.Port
	t table[tcp.Stats]
}

// NewTCPPortCollector returns a collector for p, labelled
// port=p.Addr().String().
func NewTCPPortCollector(p *tcp.Port) *TCPPortCollector {
	type S = tcp.Stats
	return &TCPPortCollector{p: p, t: newTable(prometheus.Labels{"port": p.Addr().String()}, nil,
		counter("tcp_accepts_total", "NVMe/TCP connections accepted.", func(s *S) uint64 { return s.Accepts }),
		counter("tcp_rejected_total", "NVMe/TCP connections closed as they were accepted: too many of the port (MaxPending) or of their source address (MaxPendingPerSource) were waiting to connect.", func(s *S) uint64 { return s.Rejected }),
		counter("tcp_rejected_per_source_total", "NVMe/TCP connections closed as they were accepted because their source address had MaxPendingPerSource waiting to connect (of tcp_rejected_total).", func(s *S) uint64 { return s.RejectedSource }),
		counter("tcp_evicted_total", "Pending NVMe/TCP connections closed so that a connection of a source address with fewer pending got their place (MaxPending full).", func(s *S) uint64 { return s.Evicted }),
		gauge("tcp_pending_connections", "NVMe/TCP connections accepted and not connected yet.", func(s *S) float64 { return float64(s.Pending) }),
		counter("tcp_connect_timeouts_total", "NVMe/TCP connections closed for sending no ICReq or no command in time.", func(s *S) uint64 { return s.ConnectTimeouts }),
		gauge("tcp_connections", "NVMe/TCP connections open.", func(s *S) float64 { return float64(s.Connections) }),
		counter("tcp_digest_connections_total", "Connections that negotiated a header or data digest.", func(s *S) uint64 { return s.DigestConnections }),
		counter("tcp_commands_total", "Command capsules received.", func(s *S) uint64 { return s.Commands }),
		counter("tcp_in_capsule_total", "Commands whose data came in the command capsule.", func(s *S) uint64 { return s.InCapsule }),
		counter("tcp_r2t_total", "R2T PDUs sent.", func(s *S) uint64 { return s.R2Ts }),
		counter("tcp_h2c_data_total", "H2CData PDUs received.", func(s *S) uint64 { return s.H2CData }),
		counter("tcp_c2h_data_total", "C2HData PDUs sent.", func(s *S) uint64 { return s.C2HData }),
		counter("tcp_success_flag_total", "Reads answered by a C2HData with SUCCESS and no response capsule.", func(s *S) uint64 { return s.SuccessFlags }),
		counter("tcp_header_digest_errors_total", "Header digest mismatches (each terminated its connection).", func(s *S) uint64 { return s.HeaderDigestErrors }),
		counter("tcp_data_digest_errors_total", "Data digest mismatches (each closed its connection).", func(s *S) uint64 { return s.DataDigestErrors }),
		counter("tcp_terminations_total", "C2HTermReqs sent for protocol errors.", func(s *S) uint64 { return s.Terminations }),
		counter("tcp_host_terminations_total", "H2CTermReqs received from hosts.", func(s *S) uint64 { return s.HostTerminations }),
		counter("tcp_received_bytes_total", "Bytes read from the port's sockets.", func(s *S) uint64 { return s.BytesIn }),
		counter("tcp_sent_bytes_total", "Bytes written to the port's sockets.", func(s *S) uint64 { return s.BytesOut }),
		counter("tcp_copies_total", "User-space copies of host data (staging buffer to data buffer).", func(s *S) uint64 { return s.Copies }),
		counter("tcp_data_waits_total", "Commands that waited for a data buffer.", func(s *S) uint64 { return s.DataWaits }),
		counter("tcp_grouped_writes_total", "Plain writes a poll group gathered into its write group (target.Group) to commit together.", func(s *S) uint64 { return s.GroupedWrites }),
		counter("tcp_group_commits_total", "Commits of the poll groups' write groups, one per namespace with writes per pass: group_commits/grouped_writes is the commits per grouped write.", func(s *S) uint64 { return s.GroupCommits }),
	)}
}

// Describe implements prometheus.Collector.
func (c *TCPPortCollector) Describe(ch chan<- *prometheus.Desc) { c.t.describe(ch) }

// Collect implements prometheus.Collector.
func (c *TCPPortCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.Stats()
	c.t.collect(ch, &s)
}
