package metrics

import (
	"strconv"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
	"github.com/prometheus/client_golang/prometheus"
)

// EngineCollector exports a transport engine's counters per core,
// labelled {port, core}: what transport.Core.Stats returns, and, when the
// core's CQ is the software provider's, its CQ counters
// (soft.CQStatsOf).
type EngineCollector struct {
	e    *transport.Engine
	core table[transport.Stats]
	soft table[soft.CQStats]
}

// NewEngineCollector returns a collector for e, whose metrics carry the
// constant label port="port" (the listening address, for a target port).
func NewEngineCollector(port string, e *transport.Engine) *EngineCollector {
	cl := prometheus.Labels{"port": port}
	vl := []string{"core"}
	type S = transport.Stats
	return &EngineCollector{
		e: e,
		core: newTable(cl, vl,
			counter("transport_completions_total", "Completions handed to the engine's handler.", func(s *S) uint64 { return s.Completions }),
			counter("transport_receives_total", "Completions that consumed an engine receive buffer.", func(s *S) uint64 { return s.Receives }),
			counter("transport_notifications_total", "CQ notifications handled.", func(s *S) uint64 { return s.Notifications }),
			counter("transport_empty_notifications_total", "CQ notifications that found the CQ empty.", func(s *S) uint64 { return s.EmptyNotifications }),
			counter("transport_reposts_total", "Receive buffers given back with Repost and posted at once.", func(s *S) uint64 { return s.Reposts }),
			counter("transport_releases_total", "Receive buffers given back with Release.", func(s *S) uint64 { return s.Releases }),
			counter("transport_repost_failures_total", "Reposts the SRQ refused (the buffer went to the free list).", func(s *S) uint64 { return s.RepostFailures }),
			counter("transport_srq_notifications_total", "SRQ limit (threshold) notifications.", func(s *S) uint64 { return s.SRQNotifications }),
			counter("transport_srq_refills_total", "SRQ refills that posted at least one buffer.", func(s *S) uint64 { return s.SRQRefills }),
			counter("transport_srq_refill_buffers_total", "Receive buffers posted by SRQ refills.", func(s *S) uint64 { return s.SRQRefillBuffers }),
			counter("transport_srq_starved_total", "Times the SRQ stayed below its threshold with no free buffer.", func(s *S) uint64 { return s.SRQStarved }),
			counter("transport_moderation_changes_total", "Successful interrupt moderation changes.", func(s *S) uint64 { return s.ModerationChanges }),
			counter("transport_moderation_errors_total", "Interrupt moderation changes the provider refused.", func(s *S) uint64 { return s.ModerationErrors }),
			counter("transport_moderation_ups_total", "Adaptive moderation probes up.", func(s *S) uint64 { return s.ModerationUps }),
			counter("transport_moderation_downs_total", "Adaptive moderation timer-driven steps down.", func(s *S) uint64 { return s.ModerationDowns }),
			counter("transport_moderation_failed_probes_total", "Adaptive moderation probes undone.", func(s *S) uint64 { return s.ModerationFailedProbes }),
			counter("transport_moderation_idle_resets_total", "Adaptive moderation returns to off after a silence.", func(s *S) uint64 { return s.ModerationIdleResets }),
			counter("transport_cq_errors_total", "CQ overruns and failed re-arms.", func(s *S) uint64 { return s.CQErrors }),
			gauge("transport_moderation_interval_seconds", "Current interrupt moderation interval (0: off).", func(s *S) float64 { return float64(s.Moderation.Interval) / 1e6 }),
			gauge("transport_moderation_count", "Current interrupt moderation completion count (0 or 1: off).", func(s *S) float64 { return float64(s.Moderation.Count) }),
			gauge("transport_qps", "QPs placed on the core.", func(s *S) float64 { return float64(s.QPs) }),
			gauge("transport_srq_queued", "Receives queued on the core's SRQ.", func(s *S) float64 { return float64(s.SRQQueued) }),
		),
		soft: newTable(cl, vl,
			counter("soft_cq_completions_total", "Completions delivered by the software provider's CQ.", func(s *soft.CQStats) uint64 { return s.Completions }),
			counter("soft_cq_notifications_total", "Notifications raised by the software provider's CQ.", func(s *soft.CQStats) uint64 { return s.Notifications }),
			gauge("soft_cq_pinned", "1 if the software CQ's notification goroutine is pinned to its CPU.", func(s *soft.CQStats) float64 { return b2f(s.Pinned) }),
		),
	}
}

// Describe implements prometheus.Collector.
func (c *EngineCollector) Describe(ch chan<- *prometheus.Desc) {
	c.core.describe(ch)
	c.soft.describe(ch)
}

// Collect implements prometheus.Collector.
func (c *EngineCollector) Collect(ch chan<- prometheus.Metric) {
	for _, core := range c.e.Cores() {
		idx := strconv.Itoa(core.Index())
		s := core.Stats()
		c.core.collect(ch, &s, idx)
		if cs, ok := soft.CQStatsOf(core.CQ()); ok {
			c.soft.collect(ch, &cs, idx)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
