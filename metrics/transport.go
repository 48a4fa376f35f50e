package metrics

import (
	"strconv"

	"github.com/blk-project/blk/transport"
	"github.com/prometheus/client_golang/prometheus"
)

// EngineCollector exports a transport engine's counters per core,
// labelled {port, core}: what transport.Core.Stats returns, and, when the
// core's CQ counts its provider's own work (transport.CQCounter: soft and
// verbs do), those counters labelled {port, core, provider}; when the
// adapter counts its device's asynchronous events (transport.AdapterCounter:
// verbs), those labelled {port, provider, event}.
type EngineCollector struct {
	e     *transport.Engine
	core  table[transport.Stats]
	cq    table[transport.CQCounters]
	async *prometheus.Desc
}

// NewEngineCollector returns a collector for e, whose metrics carry the
// constant label port="port" (the listening address, for a target port).
func NewEngineCollector(port string, e *transport.Engine) *EngineCollector {
	cl := prometheus.Labels{"port": port}
	vl := []string{"core"}
	type S = transport.Stats
	type P = transport.CQCounters
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
			counter("transport_poll_wakes_total", "Times the core's poll set woke its goroutine (a disk engine's eventfd fired, or a completion from another goroutine found the core idle): per I/O near 1 means each disk completion costs a wake-up rather than being reaped while the core spins.", func(s *S) uint64 { return s.PollWakes }),
			gauge("transport_moderation_interval_seconds", "Current interrupt moderation interval (0: off).", func(s *S) float64 { return float64(s.Moderation.Interval) / 1e6 }),
			gauge("transport_moderation_completions", "Current interrupt moderation completion count: completions the CQ gathers before it notifies (0 or 1: off).", func(s *S) float64 { return float64(s.Moderation.Count) }),
			gauge("transport_qps", "QPs placed on the core.", func(s *S) float64 { return float64(s.QPs) }),
			gauge("transport_srq_queued", "Receives queued on the core's SRQ.", func(s *S) float64 { return float64(s.SRQQueued) }),
		),
		cq: newTable(cl, []string{"core", "provider"},
			counter("provider_cq_completions_total", "Completions that went through the provider's CQ.", func(s *P) uint64 { return s.Completions }),
			counter("provider_cq_notifications_total", "Notification callbacks the provider's CQ ran.", func(s *P) uint64 { return s.Notifications }),
			counter("provider_cq_device_events_total", "Times the device woke the CQ's notification thread (verbs: completion-channel events).", func(s *P) uint64 { return s.DeviceEvents }),
			gauge("provider_cq_pinned", "1 if the CQ's notification thread is pinned to its CPU.", func(s *P) float64 { return b2f(s.Pinned) }),
			gauge("provider_cq_hardware_moderation", "1 if interrupt moderation is the device's, 0 if the provider's in software.", func(s *P) float64 { return b2f(s.HardwareModeration) }),
		),
		async: prometheus.NewDesc(namespace+"_provider_async_events_total", "Asynchronous events the RDMA device reported, by kind.", []string{"provider", "event"}, cl),
	}
}

// Describe implements prometheus.Collector.
func (c *EngineCollector) Describe(ch chan<- *prometheus.Desc) {
	c.core.describe(ch)
	c.cq.describe(ch)
	ch <- c.async
}

// Collect implements prometheus.Collector.
func (c *EngineCollector) Collect(ch chan<- prometheus.Metric) {
	for _, core := range c.e.Cores() {
		idx := strconv.Itoa(core.Index())
		s := core.Stats()
		c.core.collect(ch, &s, idx)
		if pc, ok := core.CQ().(transport.CQCounter); ok {
			cs := pc.CQCounters()
			c.cq.collect(ch, &cs, idx, cs.Provider)
		}
	}
	if ac, ok := c.e.Adapter().(transport.AdapterCounter); ok {
		s := ac.AdapterCounters()
		for _, ev := range []struct {
			name string
			n    uint64
		}{{"qp_fatal", s.QPFatal}, {"qp_access", s.QPAccess}, {"srq_limit", s.SRQLimit}, {"cq_error", s.CQError}, {"device_fatal", s.DeviceFatal}, {"other", s.Other}} {
			ch <- prometheus.MustNewConstMetric(c.async, prometheus.CounterValue, float64(ev.n), s.Provider, ev.name)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
