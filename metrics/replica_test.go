package metrics_test

import (
	"testing"

	"github.com/blk-project/blk/metrics"
	"github.com/blk-project/blk/repl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// TestReplicationCollector: a volume with a replica being rebuilt
// incrementally and one out of sync with a dirty-region log gives the
// rebuild's copied bytes labelled with its mode and the logs' dirty
// bytes; promlint finds nothing to say about the names.
func TestReplicationCollector(t *testing.T) {
	c := metrics.NewReplicationCollector(func() []metrics.ReplicaVolume {
		return []metrics.ReplicaVolume{{Name: "v", Stats: repl.Stats{Epoch: 2, Serving: true,
			Peers: []repl.PeerStats{
				{Node: "n2", State: "in-sync"},
				{Node: "n3", State: "rebuilding", RebuildDone: 1 << 20, RebuildTotal: 3 << 20, RebuildCopied: 1 << 19, RebuildMode: "incremental"},
			},
			Dirty: []repl.DirtyStats{{Node: "n3", Bytes: 3 << 20}, {Node: "n4", Bytes: 64 << 10}},
		}}}
	})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName() + "{"
			for _, l := range m.GetLabel() {
				key += l.GetName() + "=" + l.GetValue() + ","
			}
			key += "}"
			switch {
			case m.GetCounter() != nil:
				got[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[key] = m.GetGauge().GetValue()
			}
		}
	}
	for key, want := range map[string]float64{
		"blk_replica_rebuild_copied_bytes_total{mode=incremental,node=n3,volume=v,}": 1 << 19,
		"blk_replica_dirty_bytes{node=n3,volume=v,}":                                 3 << 20,
		"blk_replica_dirty_bytes{node=n4,volume=v,}":                                 64 << 10,
		"blk_replica_rebuild_remaining_bytes{node=n3,volume=v,}":                     2 << 20,
		"blk_replica_rebuild_bytes_total{node=n3,volume=v,}":                         1 << 20,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
	if _, ok := got["blk_replica_rebuild_copied_bytes_total{mode=,node=n2,volume=v,}"]; ok {
		t.Error("copied bytes of a replica never rebuilt")
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}
