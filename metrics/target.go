package metrics

import (
	"fmt"

	"github.com/blk-project/blk/target"
	"github.com/prometheus/client_golang/prometheus"
)

// TargetCollector exports a target core's counters (target.Target.Stats):
// completions by status code, request state entries, controllers, and the
// I/O counters of every namespace labelled {volume, role}: the name of
// the volume it serves and its subsystem's role (RoleHost, RoleReplica).
// The target core knows no volumes: the names function, read once per
// scrape, maps namespaces to them; a namespace it does not map (a
// subsystem being added or removed, or no names function) is left out
// of that scrape and counted in blk_target_unnamed_namespaces, so that
// the volume label has one meaning in every family.
type TargetCollector struct {
	t        *target.Target
	names    func() map[Namespace]NamespaceLabel
	unnamed  *prometheus.Desc
	commands *prometheus.Desc
	states   *prometheus.Desc
	busy     *prometheus.Desc
	latency  *prometheus.Desc
	resvOps  *prometheus.Desc
	fused    *prometheus.Desc
	bounds   []float64
	top      table[target.Stats]
	ns       table[target.NamespaceStats]
}

// Namespace identifies a namespace of the target: its subsystem's NQN
// and its NSID.
type Namespace struct {
	Subsystem string
	NSID      uint32
}

// NamespaceLabel names what a namespace serves: the volume's name and
// the role of its subsystem.
type NamespaceLabel struct{ Volume, Role string }

// The roles of a subsystem serving a volume.
const (
	// RoleHost: the volume's own subsystem, which hosts connect to.
	RoleHost = "host"
	// RoleReplica: a replica subsystem, which only the volume's primary
	// writes to.
	RoleReplica = "replica"
)

// NewTargetCollector returns a collector for t; names maps its
// namespaces to the volumes they serve (nil: none is named).
func NewTargetCollector(t *target.Target, names func() map[Namespace]NamespaceLabel) *TargetCollector {
	type S = target.Stats
	type N = target.NamespaceStats
	nl := []string{"volume", "role"}
	return &TargetCollector{
		t:     t,
		names: names,
		unnamed: prometheus.NewDesc("blk_target_unnamed_namespaces",
			"Namespaces left out of this scrape because no volume names them: a subsystem being added or removed.", nil, nil),
		commands: prometheus.NewDesc("blk_target_commands_total",
			"Commands completed, by NVMe status code (status: SCT<<8|SC in hex; name: its name).",
			[]string{"status", "name"}, nil),
		states: prometheus.NewDesc("blk_target_request_state_entries_total",
			"Requests entering each state: executing (every Execute), queued (handed to the sync workers), held (AERs waiting for an event), keeper (reservation commands handed to the namespace's reservation keeper), done (every completion).",
			[]string{"state"}, nil),
		busy: prometheus.NewDesc("blk_target_connects_busy_total",
			"Admin Connects refused with Controller Busy (no DNR) because a controller budget was full, by budget: controllers (MaxControllers), discovery (MaxDiscoveryControllers), discovery_per_source (MaxDiscoveryPerSource).",
			[]string{"budget"}, nil),
		latency: prometheus.NewDesc("blk_target_namespace_io_latency_seconds",
			"Time the namespace's backend took per call, by operation, failed calls included; a grouped write is timed by the commit that applied it, a compare as a read.",
			append(nl, "op"), nil),
		resvOps: prometheus.NewDesc("blk_target_reservation_commands_total",
			"Reservation commands received on I/O queues, by command (register, acquire, release, report), refused ones included.",
			[]string{"op"}, nil),
		fused: prometheus.NewDesc("blk_target_fused_total",
			"Fused Compare and Write halves and pairs by outcome: pair (the Write succeeded), miscompare (the Compare failed), missing and failed (halves ended with Missing or Failed Fused Command), waited (halves that waited for their partner).",
			[]string{"outcome"}, nil),
		bounds: LatencyBuckets(),
		top: newTable(nil, nil,
			gauge("target_requests_in_flight", "Requests executed and not yet completed.", func(s *S) float64 {
				if s.Completed >= s.Executed {
					return 0 // read at different instants: never negative
				}
				return float64(s.Executed - s.Completed)
			}),
			counter("target_request_misuse_total", "Execute calls on a request the core had not completed (a binding bug).", func(s *S) uint64 { return s.Misuse }),
			counter("target_sync_overflow_total", "Sync commands that found the worker queue full and ran on their own goroutine.", func(s *S) uint64 { return s.SyncOverflow }),
			counter("target_keep_alive_expired_total", "Controllers torn down by keep-alive expiry.", func(s *S) uint64 { return s.KeepAliveExpired }),
			counter("target_keep_alive_traffic_total", "Keep-alive timeouts that restarted instead of expiring because commands had run (traffic-based keep-alive).", func(s *S) uint64 { return s.KeepAliveTraffic }),
			counter("target_controllers_created_total", "Controllers created.", func(s *S) uint64 { return s.ControllersCreated }),
			counter("target_controllers_torn_down_total", "Controllers torn down.", func(s *S) uint64 { return s.ControllersTornDown }),
			gauge("target_controllers", "Live controllers.", func(s *S) float64 { return float64(s.Controllers) }),
			gauge("target_discovery_controllers", "Live discovery controllers (of target_controllers).", func(s *S) float64 { return float64(s.DiscoveryControllers) }),
			counter("target_discovery_idle_total", "Discovery controllers torn down for sending nothing after their Connect (DiscoveryIdleTimeout).", func(s *S) uint64 { return s.DiscoveryIdle }),
			counter("target_connects_refused_total", "Fabrics Connect commands that failed.", func(s *S) uint64 { return s.ConnectsRefused }),
			counter("target_connects_timed_out_total", "Queues dropped because no Connect succeeded on them in time (target.Config.ConnectTimeout).", func(s *S) uint64 { return s.ConnectsTimedOut }),
			counter("target_auth_succeeded_total", "Queues whose host authenticated (DH-HMAC-CHAP).", func(s *S) uint64 { return s.AuthSucceeded }),
			counter("target_auth_failed_total", "Queues ended by a failed or timed-out authentication (wrong secret, protocol violation, no common hash or group, a host that skipped it).", func(s *S) uint64 { return s.AuthFailed }),
			counter("target_auth_timed_out_total", "Queues ended because their host did not authenticate in time (of target_auth_failed_total).", func(s *S) uint64 { return s.AuthTimedOut }),
			counter("target_auth_required_total", "Commands refused with Authentication Required on a queue not yet authenticated.", func(s *S) uint64 { return s.AuthRequired }),
			counter("target_events_dropped_total", "Asynchronous events lost with no AER to take them.", func(s *S) uint64 { return s.EventsDropped }),
			counter("target_range_lock_waits_total", "Requests the namespace's range lock parked behind an overlapping write or fused pair (plain writes against pairs, pairs against writes).", func(s *S) uint64 { return s.LockWaits }),
			counter("target_reservation_conflicts_total", "I/O commands refused with Reservation Conflict (the holder's reservation type excludes the host).", func(s *S) uint64 { return s.ReservationConflicts }),
		),
		ns: newTable(nil, nl,
			counter("target_namespace_reads_total", "Read commands that succeeded.", func(s *N) uint64 { return s.Reads }),
			counter("target_namespace_writes_total", "Write commands that succeeded (FUA included).", func(s *N) uint64 { return s.Writes }),
			counter("target_namespace_fua_writes_total", "Write commands with FUA that succeeded.", func(s *N) uint64 { return s.FUAWrites }),
			counter("target_namespace_compares_total", "Compare commands that succeeded.", func(s *N) uint64 { return s.Compares }),
			counter("target_namespace_flushes_total", "Flush commands that succeeded.", func(s *N) uint64 { return s.Flushes }),
			counter("target_namespace_write_zeroes_total", "Write Zeroes commands that succeeded.", func(s *N) uint64 { return s.WriteZeroes }),
			counter("target_namespace_deallocates_total", "Dataset Management deallocate commands that succeeded.", func(s *N) uint64 { return s.Deallocates }),
			counter("target_namespace_read_bytes_total", "Bytes read by successful commands.", func(s *N) uint64 { return s.ReadBytes }),
			counter("target_namespace_write_bytes_total", "Bytes written by successful commands.", func(s *N) uint64 { return s.WriteBytes }),
			counter("target_namespace_deallocated_blocks_total", "Blocks deallocated by successful commands.", func(s *N) uint64 { return s.DeallocatedBlocks }),
			counter("target_namespace_errors_total", "Commands that failed after reaching the namespace.", func(s *N) uint64 { return s.Errors }),
			counter("target_namespace_grouped_writes_total", "Plain writes committed in a write group with others of the same poll group's pass (failed ones included).", func(s *N) uint64 { return s.GroupedWrites }),
			counter("target_namespace_group_commits_total", "Backend commits of write groups: group_commits/grouped_writes is the commits per grouped write.", func(s *N) uint64 { return s.GroupCommits }),
		),
	}
}

// Describe implements prometheus.Collector.
func (c *TargetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.commands
	ch <- c.states
	ch <- c.busy
	ch <- c.latency
	ch <- c.resvOps
	ch <- c.fused
	ch <- c.unnamed
	c.top.describe(ch)
	c.ns.describe(ch)
}

// Collect implements prometheus.Collector.
func (c *TargetCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.t.Stats()
	for st, n := range s.Commands {
		ch <- prometheus.MustNewConstMetric(c.commands, prometheus.CounterValue, float64(n),
			fmt.Sprintf("0x%03x", uint16(st.Code())), st.Code().String())
	}
	for _, e := range [...]struct {
		state string
		n     uint64
	}{{"executing", s.Executed}, {"queued", s.Queued}, {"held", s.Held}, {"keeper", s.AtKeeper}, {"done", s.Completed}} {
		ch <- prometheus.MustNewConstMetric(c.states, prometheus.CounterValue, float64(e.n), e.state)
	}
	for _, e := range [...]struct {
		budget string
		n      uint64
	}{{"controllers", s.BusyControllers}, {"discovery", s.BusyDiscovery}, {"discovery_per_source", s.BusyDiscoverySource}} {
		ch <- prometheus.MustNewConstMetric(c.busy, prometheus.CounterValue, float64(e.n), e.budget)
	}
	for _, e := range [...]struct {
		outcome string
		n       uint64
	}{{"pair", s.FusedPairs}, {"miscompare", s.FusedMiscompares}, {"missing", s.FusedMissing}, {"failed", s.FusedFailed}, {"waited", s.FusedWaiting}} {
		ch <- prometheus.MustNewConstMetric(c.fused, prometheus.CounterValue, float64(e.n), e.outcome)
	}
	for op, n := range s.ReservationCommands {
		ch <- prometheus.MustNewConstMetric(c.resvOps, prometheus.CounterValue, float64(n), target.ResvOp(op).String())
	}
	c.top.collect(ch, &s)
	var names map[Namespace]NamespaceLabel
	if c.names != nil {
		names = c.names()
	}
	unnamed := 0
	for i := range s.Namespaces {
		n := &s.Namespaces[i]
		l, ok := names[Namespace{n.Subsystem, n.NSID}]
		if !ok || l.Volume == "" {
			unnamed++
			continue
		}
		c.ns.collect(ch, n, l.Volume, l.Role)
		for op := range target.NumLatencyOps {
			ch <- latencyHistogram(c.latency, c.bounds, &n.Latency[op], l.Volume, l.Role, op.String())
		}
	}
	ch <- prometheus.MustNewConstMetric(c.unnamed, prometheus.GaugeValue, float64(unnamed))
}
