package blkd

import (
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// namespace prefixes the metric names, as in package metrics.
const namespace = "blk"

// raftStates are the values of blk_raft_state's state label.
var raftStates = []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown}

// RaftCollector lives here, not in package metrics, because metrics must
// not import meta (metrics.TestImportGraph).
//
// RaftCollector exports the health of a meta registry node: its raft
// state, term and log indexes, the time since a follower last heard from
// the leader, the number of servers in the configuration, and the FSM's
// command counters.
//
//	blk_raft_state{state}             1 for the node's state (leader,
//	                                  follower, candidate, shutdown), 0 else
//	blk_raft_term                     current term
//	blk_raft_last_log_index           last index in the log
//	blk_raft_commit_index             highest committed index
//	blk_raft_applied_index            highest index applied to the FSM
//	blk_raft_last_contact_seconds     followers and candidates: time since
//	                                  the leader was last heard (absent if
//	                                  never, and on the leader)
//	blk_raft_peers                    servers in the configuration (voters
//	                                  and nonvoters, this node included)
//	blk_meta_commands_applied_total   commands applied, refused ones included
//	blk_meta_commands_refused_total   commands the registry refused
//	blk_meta_snapshots_restored_total snapshots restored
type RaftCollector struct {
	n *meta.Node

	state, term, lastLog, commit, applied, contact, peers *prometheus.Desc
	fsmApplied, fsmRefused, fsmRestored                   *prometheus.Desc
}

// NewRaftCollector returns a collector for n.
func NewRaftCollector(n *meta.Node) *RaftCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(namespace+"_"+name, help, labels, nil)
	}
	return &RaftCollector{
		n:           n,
		state:       d("raft_state", "1 for the raft state the node is in, 0 for the others.", "state"),
		term:        d("raft_term", "Current raft term."),
		lastLog:     d("raft_last_log_index", "Last index in the raft log."),
		commit:      d("raft_commit_index", "Highest committed raft log index."),
		applied:     d("raft_applied_index", "Highest raft log index applied to the registry."),
		contact:     d("raft_last_contact_seconds", "Seconds since this follower last heard from the leader."),
		peers:       d("raft_peers", "Servers in the raft configuration, this node included."),
		fsmApplied:  d("meta_commands_applied_total", "Registry commands applied, refused ones included."),
		fsmRefused:  d("meta_commands_refused_total", "Registry commands refused (their result carried an error)."),
		fsmRestored: d("meta_snapshots_restored_total", "Registry snapshots restored."),
	}
}

// Describe implements prometheus.Collector.
func (c *RaftCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.state, c.term, c.lastLog, c.commit, c.applied, c.contact, c.peers,
		c.fsmApplied, c.fsmRefused, c.fsmRestored} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *RaftCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.n.Raft()
	st := r.State()
	for _, s := range raftStates {
		v := 0.0
		if s == st {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, v, stateLabel(s))
	}
	g := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	g(c.term, r.CurrentTerm())
	g(c.lastLog, r.LastIndex())
	g(c.commit, r.CommitIndex())
	g(c.applied, r.AppliedIndex())
	if st == raft.Follower || st == raft.Candidate {
		if last := r.LastContact(); !last.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.contact, prometheus.GaugeValue, time.Since(last).Seconds())
		}
	}
	if f := r.GetConfiguration(); f.Error() == nil {
		g(c.peers, uint64(len(f.Configuration().Servers)))
	}
	s := c.n.FSM().Stats()
	ch <- prometheus.MustNewConstMetric(c.fsmApplied, prometheus.CounterValue, float64(s.Applied))
	ch <- prometheus.MustNewConstMetric(c.fsmRefused, prometheus.CounterValue, float64(s.Refused))
	ch <- prometheus.MustNewConstMetric(c.fsmRestored, prometheus.CounterValue, float64(s.Restored))
}

func stateLabel(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Candidate:
		return "candidate"
	case raft.Shutdown:
		return "shutdown"
	}
	return "follower"
}
