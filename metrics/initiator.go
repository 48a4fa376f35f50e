package metrics

import (
	"github.com/blk-project/blk/initiator"
	"github.com/prometheus/client_golang/prometheus"
)

// ControllerCollector exports a host controller's counters
// (initiator.Controller.Stats) and state, with the constant labels
// subsystem and addr.
type ControllerCollector struct {
	c     *initiator.Controller
	t     table[initiator.Stats]
	state *prometheus.Desc
}

// controllerStates are the states exported by blk_initiator_state, one
// series each.
var controllerStates = [...]initiator.State{
	initiator.StateLive, initiator.StateReconnecting, initiator.StateLost, initiator.StateClosed,
}

// NewControllerCollector returns a collector for c, connected to
// subsystem at addr (what was passed to initiator.Connect).
func NewControllerCollector(c *initiator.Controller, subsystem, addr string) *ControllerCollector {
	type S = initiator.Stats
	cl := prometheus.Labels{"subsystem": subsystem, "addr": addr}
	return &ControllerCollector{
		c: c,
		t: newTable(cl, nil,
			counter("initiator_associations_total", "Associations established (the first connect and every reconnect).", func(s *S) uint64 { return s.Associations }),
			counter("initiator_failures_total", "Association failures (each starts a reconnect).", func(s *S) uint64 { return s.Failures }),
			counter("initiator_reconnect_attempts_total", "Reconnect attempts, successful or not.", func(s *S) uint64 { return s.ReconnectAttempts }),
			counter("initiator_connect_retries_total", "Associations made anew because a Fabrics Connect went unanswered.", func(s *S) uint64 { return s.ConnectRetries }),
			counter("initiator_queue_full_total", "Asynchronous submissions refused with ErrQueueFull.", func(s *S) uint64 { return s.QueueFull }),
		),
		state: prometheus.NewDesc("blk_initiator_state",
			"1 for the controller's current state (live, reconnecting, lost, closed), 0 for the others.",
			[]string{"state"}, cl),
	}
}

// Describe implements prometheus.Collector.
func (c *ControllerCollector) Describe(ch chan<- *prometheus.Desc) {
	c.t.describe(ch)
	ch <- c.state
}

// Collect implements prometheus.Collector.
func (c *ControllerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.c.Stats()
	c.t.collect(ch, &s)
	cur := c.c.State()
	for _, st := range controllerStates {
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, b2f(st == cur), st.String())
	}
}
