package metrics_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/blk-project/blk/metrics"
	"github.com/blk-project/blk/repl"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
)

// populated registers every collector of the package over a live target,
// RDMA port, store (a volume, a snapshot of it and an object the names
// do not know), store I/O, host controller and replicated volume, does
// a little I/O, and gathers.
func populated(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	tt := newTestTarget(t)
	if err := tt.store.Snapshot(1, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := tt.store.Create(3, store.CreateOptions{SizeBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	names := func() map[uint64]metrics.VolumeLabel {
		m := tt.volumeNames()
		m[2] = metrics.VolumeLabel{Name: testVolume, Snapshot: "s1"}
		return m // 3: created between the registry's read and the store's
	}
	sio, err := target.NewStoreIO(tt.store, target.StoreIOConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sio.Close() })
	reg := metrics.NewRegistry(prometheus.NewPedanticRegistry())
	must(t, reg.RegisterTarget(tt.t, tt.namespaceNames))
	must(t, reg.RegisterPort(tt.port))
	must(t, reg.RegisterStore(tt.store, names))
	must(t, reg.RegisterStoreIO(sio))
	must(t, reg.RegisterProcess())
	must(t, reg.Prometheus().Register(metrics.NewReplicationCollector(func() []metrics.ReplicaVolume {
		return []metrics.ReplicaVolume{{Name: testVolume, Stats: repl.Stats{Epoch: 1, Serving: true,
			Peers: []repl.PeerStats{{Node: "n2", State: "in-sync"},
				{Node: "n3", State: "rebuilding", RebuildDone: 1 << 20, RebuildTotal: 2 << 20, RebuildCopied: 1 << 20, RebuildMode: "full"}},
			Dirty: []repl.DirtyStats{{Node: "n3", Bytes: 64 << 10}}}}}
	})))
	c := connectHost(t, tt.addr)
	must(t, reg.RegisterController(c, testSubNQN, tt.addr))
	if _, err := c.Namespace(1).WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Prometheus().Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// TestPromlint: promlint (what promtool check metrics runs) finds no
// problem in any family a populated registry exports.
func TestPromlint(t *testing.T) {
	mfs := populated(t)
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	for _, name := range []string{"blk_transport_moderation_count", "blk_volume_store_write_stall_seconds"} {
		if slices.ContainsFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == name }) {
			t.Errorf("%s is still exported (renamed)", name)
		}
	}
	for name, typ := range map[string]dto.MetricType{
		"blk_transport_moderation_completions":       dto.MetricType_GAUGE,
		"blk_volume_store_write_stall_seconds_total": dto.MetricType_COUNTER,
	} {
		i := slices.IndexFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == name })
		if i < 0 || mfs[i].GetType() != typ {
			t.Errorf("%s: missing or not a %v", name, typ)
		}
	}
}

// TestVolumeLabel: every family that labels a volume or a namespace does
// so with one label, volume, whose values are volume names (never a
// store ID, an NQN or an NSID); snapshots add snapshot, their name; the
// store ID is a label of blk_volume_info only; what the names do not
// know is left out and counted; no label value is the host's NQN.
func TestVolumeLabel(t *testing.T) {
	mfs := populated(t)
	names := []string{testVolume, testBatchVolume}
	seen := map[string]bool{}
	for _, mf := range mfs {
		name := mf.GetName()
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
				if lp.GetValue() == testHostNQN {
					t.Errorf("%s: label %s is the host NQN", name, lp.GetName())
				}
			}
			if strings.HasPrefix(name, "blk_initiator_") {
				continue // a host controller names the remote subsystem
			}
			for _, k := range []string{"subsystem", "nsid", "id", "parent"} {
				if _, ok := l[k]; ok && !(k == "id" && name == "blk_volume_info") {
					t.Errorf("%s%v: label %s", name, l, k)
				}
			}
			v, ok := l["volume"]
			if !ok {
				continue
			}
			seen[name] = true
			if !slices.Contains(names, v) {
				t.Errorf("%s%v: volume %q is not a volume's name", name, l, v)
			}
			if strings.HasPrefix(name, "blk_snapshot_") && l["snapshot"] != "s1" {
				t.Errorf("%s%v: want snapshot s1", name, l)
			}
		}
	}
	for _, name := range []string{"blk_volume_writes_total", "blk_volume_info", "blk_snapshot_disk_bytes",
		"blk_target_namespace_writes_total", "blk_target_namespace_io_latency_seconds", "blk_replica_in_sync", "blk_volume_epoch"} {
		if !seen[name] {
			t.Errorf("%s: no series labelled volume", name)
		}
	}
	info := family(mfs, "blk_volume_info")
	if info == nil || len(info.GetMetric()) != 1 {
		t.Fatalf("blk_volume_info: %v, want one series (volume 1)", info)
	}
	got := map[string]string{}
	for _, lp := range info.GetMetric()[0].GetLabel() {
		got[lp.GetName()] = lp.GetValue()
	}
	if got["volume"] != testVolume || got["id"] != "1" || got["nqn"] != testSubNQN {
		t.Errorf("blk_volume_info%v, want volume=%s id=1 nqn=%s", got, testVolume, testSubNQN)
	}
	if f := family(mfs, "blk_volume_unnamed_objects"); f == nil || f.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Errorf("blk_volume_unnamed_objects: %v, want 1 (object 3)", f)
	}
	if f := family(mfs, "blk_target_unnamed_namespaces"); f == nil || f.GetMetric()[0].GetGauge().GetValue() != 0 {
		t.Errorf("blk_target_unnamed_namespaces: %v, want 0", f)
	}
}

// TestUnnamedNamespaces: without names, the target's namespaces are left
// out and counted, never exported under another label.
func TestUnnamedNamespaces(t *testing.T) {
	tt := newTestTarget(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewTargetCollector(tt.t, nil))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if f := family(mfs, "blk_target_namespace_reads_total"); f != nil {
		t.Errorf("unnamed namespaces exported: %v", f)
	}
	if f := family(mfs, "blk_target_unnamed_namespaces"); f == nil || f.GetMetric()[0].GetGauge().GetValue() != 2 {
		t.Errorf("blk_target_unnamed_namespaces: %v, want 2", f)
	}
}

func family(mfs []*dto.MetricFamily, name string) *dto.MetricFamily {
	if i := slices.IndexFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == name }); i >= 0 {
		return mfs[i]
	}
	return nil
}
