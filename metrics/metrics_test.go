package metrics_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/metrics"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport/soft"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	// testVolume is the name of the extent store's volume 1, namespace 1;
	// testBatchVolume the name given to namespace 2 (a memory backend).
	testVolume      = "vol1"
	testBatchVolume = "batching"
	testSubNQN      = "nqn.2026-11.io.blk:test"
	testHostNQN     = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"
)

type testTarget struct {
	t     *target.Target
	port  *rdma.Port
	store *store.Store
	vol   *store.Volume
	// batching is namespace 2: a memory backend whose plain writes group
	// (the extent store's do not: an overwrite is one pwrite), so that the
	// write-batching counters are seen moving.
	batching *target.MemBackend
	addr     string
}

// newTestTarget serves one subsystem with a 64 MiB namespace 1 (4 KiB
// blocks, volume 1 of an extent store) and a 64 MiB namespace 2 (a memory
// backend that groups plain writes) on a soft adapter on loopback, with
// two cores (as target/rdma's newTestTarget).
func newTestTarget(t testing.TB) *testTarget {
	t.Helper()
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rdma.Config{Addr: "127.0.0.1:0", Cores: 2}
	// No Config.Limits: the port brings its own with every queue.
	tt := &testTarget{}
	if tt.t, err = target.New(target.Config{}); err != nil {
		t.Fatal(err)
	}
	// A thin 64 MiB volume in a 16 MiB area in memory: the test writes
	// a few clusters.
	if tt.store, err = store.Open(store.Config{FS: vfs.NewMem(), Dir: "/vol", Area: store.NewMemArea(16<<20, 512, 512),
		AreaMaxBytes: 16 << 20, ReadyClusters: 8}); err != nil {
		t.Fatal(err)
	}
	if tt.vol, err = tt.store.Create(1, store.CreateOptions{SizeBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	sub, err := tt.t.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Serial: "blk-test-1", Model: "blk test", Hosts: []string{testHostNQN}})
	if err != nil {
		t.Fatal(err)
	}
	if err = sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: target.StoreBackend(tt.vol)}); err != nil {
		t.Fatal(err)
	}
	if tt.batching, err = target.NewMemBackend(4096, 16384); err != nil {
		t.Fatal(err)
	}
	tt.batching.SetWriteGroups(64)
	if err = sub.AddNamespace(target.NamespaceConfig{NSID: 2, Backend: tt.batching}); err != nil {
		t.Fatal(err)
	}
	if tt.port, err = rdma.Listen(tt.t, a, cfg); err != nil {
		t.Fatal(err)
	}
	tt.addr = tt.port.Addr().String()
	t.Cleanup(func() {
		tt.port.Close()
		tt.t.Close()
		tt.store.Close()
		a.Close()
	})
	return tt
}

// volumeNames names the store's volume 1, as blkd's registry would.
func (tt *testTarget) volumeNames() map[uint64]metrics.VolumeLabel {
	return map[uint64]metrics.VolumeLabel{1: {Name: testVolume, NQN: testSubNQN}}
}

// namespaceNames names the subsystem's two namespaces.
func (tt *testTarget) namespaceNames() map[metrics.Namespace]metrics.NamespaceLabel {
	return map[metrics.Namespace]metrics.NamespaceLabel{
		{Subsystem: testSubNQN, NSID: 1}: {Volume: testVolume, Role: metrics.RoleHost},
		{Subsystem: testSubNQN, NSID: 2}: {Volume: testBatchVolume, Role: metrics.RoleHost},
	}
}

func connectHost(t testing.TB, addr string) *initiator.Controller {
	t.Helper()
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, initiator.Config{Adapter: a, HostNQN: testHostNQN, Queues: 2, QueueDepth: 16}, addr, testSubNQN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sample is one line of the text exposition.
type sample struct {
	labels map[string]string
	value  float64
}

// exposition is a scrape: samples by metric name, and the TYPE of each
// metric family.
type exposition struct {
	samples map[string][]sample
	types   map[string]string
	help    map[string]bool
}

// scrape GETs url and parses the text format: "# HELP name text",
// "# TYPE name type" and `name{k="v",...} value` lines. Label values here
// never hold a comma, quote or brace except the status names, which hold
// none of those either (checked by the parse succeeding).
func scrape(t *testing.T, url string) exposition {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %d, %v\n%s", resp.StatusCode, err, body)
	}
	e := exposition{samples: map[string][]sample{}, types: map[string]string{}, help: map[string]bool{}}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			e.types[name] = typ
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, text, _ := strings.Cut(rest, " ")
			e.help[name] = text != ""
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		head := line[:sp]
		s := sample{labels: map[string]string{}, value: v}
		name := head
		if i := strings.IndexByte(head, '{'); i >= 0 {
			name = head[:i]
			for _, kv := range strings.Split(strings.TrimSuffix(head[i+1:], "}"), ",") {
				k, q, ok := strings.Cut(kv, "=")
				uq, err := strconv.Unquote(q)
				if !ok || err != nil {
					t.Fatalf("line %q: label %q", line, kv)
				}
				s.labels[k] = uq
			}
		}
		e.samples[name] = append(e.samples[name], s)
	}
	return e
}

// sum adds the samples of name whose labels include want.
func (e exposition) sum(name string, want map[string]string) (float64, int) {
	var total float64
	var n int
	for _, s := range e.samples[name] {
		match := true
		for k, v := range want {
			if s.labels[k] != v {
				match = false
			}
		}
		if match {
			total += s.value
			n++
		}
	}
	return total, n
}

// atLeast fails unless the samples of name matching labels exist and sum
// to min or more.
func (e exposition) atLeast(t *testing.T, name string, labels map[string]string, min float64) float64 {
	t.Helper()
	v, n := e.sum(name, labels)
	if n == 0 {
		t.Errorf("%s%v: no sample", name, labels)
	} else if v < min {
		t.Errorf("%s%v = %v, want >= %v", name, labels, v, min)
	}
	return v
}

// TestScrapeAfterIO runs a real target, port and store with an initiator
// doing reads, writes, FUA writes, a flush and a write-zeroes, scrapes the
// handler over HTTP and checks every collector reported the I/O.
func TestScrapeAfterIO(t *testing.T) {
	reg := metrics.NewRegistry(prometheus.NewRegistry())
	tt := newTestTarget(t)
	for _, err := range []error{reg.RegisterTarget(tt.t, tt.namespaceNames), reg.RegisterPort(tt.port), reg.RegisterStore(tt.store, tt.volumeNames)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	c := connectHost(t, tt.addr)
	if err := reg.RegisterController(c, testSubNQN, tt.addr); err != nil {
		t.Fatal(err)
	}
	ns := c.Namespace(1)
	if ns == nil {
		t.Fatal("namespace 1 not found")
	}

	const (
		bs     = 4096
		writes = 40 // 16 KiB each: one command, under MaxTransfer
		fuas   = 5
		reads  = 60 // 4 KiB each
	)
	buf := bytes.Repeat([]byte{0xA5}, 4*bs)
	ns2 := c.Namespace(2)
	if ns2 == nil {
		t.Fatal("namespace 2 not found")
	}
	for i := 0; i < writes; i++ {
		if _, err := ns.WriteAt(buf, int64(i)*4*bs); err != nil {
			t.Fatal(err)
		}
		if _, err := ns2.WriteAt(buf, int64(i)*4*bs); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < fuas; i++ {
		if _, err := ns.WriteAtFlags(buf[:bs], int64(1000+i)*bs, initiator.FUA); err != nil {
			t.Fatal(err)
		}
	}
	rbuf := make([]byte, bs)
	for i := 0; i < reads; i++ {
		if _, err := ns.ReadAt(rbuf, int64(i)*bs); err != nil {
			t.Fatal(err)
		}
	}
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := ns.WriteZeroes(2000, 8); err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewServer(reg.Handler())
	defer srv.Close()
	e := scrape(t, srv.URL)

	// Every exported family has HELP and the right TYPE.
	for name, typ := range e.types {
		if !e.help[name] {
			t.Errorf("%s: no help", name)
		}
		if strings.HasSuffix(name, "_total") && typ != "counter" {
			t.Errorf("%s: type %s, want counter", name, typ)
		}
	}
	for name, typ := range map[string]string{
		"blk_transport_completions_total":            "counter",
		"blk_transport_moderation_interval_seconds":  "gauge",
		"blk_rdma_commands_total":                    "counter",
		"blk_rdma_capsule_copies_total":              "counter",
		"blk_rdma_disk_in_flight":                    "gauge",
		"blk_rdma_disk_in_flight_peak":               "gauge",
		"blk_transport_poll_wakes_total":             "counter",
		"blk_target_commands_total":                  "counter",
		"blk_target_controllers":                     "gauge",
		"blk_target_discovery_controllers":           "gauge",
		"blk_target_discovery_idle_total":            "counter",
		"blk_target_connects_busy_total":             "counter",
		"blk_target_namespace_reads_total":           "counter",
		"blk_volume_reads_total":                     "counter",
		"blk_volume_disk_bytes":                      "gauge",
		"blk_volume_store_l0_files":                  "gauge",
		"blk_volume_store_write_stalls_total":        "counter",
		"blk_volume_store_write_stall_seconds_total": "counter",
		"blk_transport_moderation_completions":       "gauge",
		"blk_volume_store_background_syncs_total":    "counter",
		"blk_volume_store_zeroed_at_open_clusters":   "gauge",
		"blk_target_namespace_io_latency_seconds":    "histogram",
		"blk_target_namespace_grouped_writes_total":  "counter",
		"blk_target_namespace_group_commits_total":   "counter",
		"blk_initiator_associations_total":           "counter",
		"blk_initiator_state":                        "gauge",
	} {
		if e.types[name] != typ {
			t.Errorf("%s: TYPE %q, want %q", name, e.types[name], typ)
		}
	}

	for _, name := range []string{"blk_volume_store_background_refills_total", "blk_volume_store_background_refill_errors_total"} {
		if e.types[name] != "counter" {
			t.Errorf("%s: TYPE %q, want counter", name, e.types[name])
		}
	}

	// A store opened fresh zeroed nothing at open.
	if v, n := e.sum("blk_volume_store_zeroed_at_open_clusters", nil); n != 1 || v != 0 {
		t.Errorf("blk_volume_store_zeroed_at_open_clusters: %v over %d samples, want 0 over 1", v, n)
	}

	port := map[string]string{"port": tt.addr}
	nsl := map[string]string{"volume": testVolume, "role": metrics.RoleHost}
	nsl2 := map[string]string{"volume": testBatchVolume, "role": metrics.RoleHost}
	vol := map[string]string{"volume": testVolume}
	ios := float64(2*writes + fuas + reads + 2)

	// Transport, per core: both cores present, completions moved.
	for _, core := range []string{"0", "1"} {
		if _, n := e.sum("blk_transport_completions_total", map[string]string{"port": tt.addr, "core": core}); n != 1 {
			t.Errorf("blk_transport_completions_total core %s: %d samples, want 1", core, n)
		}
	}
	// Each command is a receive and a send completion at least.
	e.atLeast(t, "blk_transport_completions_total", port, ios)
	e.atLeast(t, "blk_transport_receives_total", port, ios)
	e.atLeast(t, "blk_transport_notifications_total", port, 1)
	e.atLeast(t, "blk_provider_cq_completions_total", port, ios)

	// Binding: three connections (admin and two I/O queues), a command
	// per I/O, an RDMA WRITE per read, and writes by RDMA READ or in the
	// capsule.
	e.atLeast(t, "blk_rdma_accepts_total", port, 3)
	e.atLeast(t, "blk_rdma_commands_total", port, ios)
	e.atLeast(t, "blk_rdma_writes_total", port, reads)
	if g, _ := e.sum("blk_rdma_grouped_writes_total", port); g != writes {
		t.Errorf("blk_rdma_grouped_writes_total = %v, want namespace 2's %d plain writes", g, writes)
	}
	e.atLeast(t, "blk_rdma_group_commits_total", port, 1)
	rr, _ := e.sum("blk_rdma_reads_total", port)
	ic, _ := e.sum("blk_rdma_in_capsule_writes_total", port)
	if rr+ic < writes+fuas {
		t.Errorf("RDMA reads %v + in-capsule writes %v < %d writes", rr, ic, writes+fuas)
	}
	// The port's receive buffers are split (the in-capsule data on a
	// page of its own): no in-capsule write is copied.
	if cc, n := e.sum("blk_rdma_capsule_copies_total", port); n != 1 || cc != 0 || ic == 0 {
		t.Errorf("blk_rdma_capsule_copies_total = %v (%d samples) with %v in-capsule writes, want one sample of 0 and some in-capsule writes", cc, n, ic)
	}
	for _, g := range []string{"blk_rdma_disk_in_flight", "blk_rdma_disk_in_flight_peak"} {
		if _, n := e.sum(g, port); n != 1 {
			t.Errorf("%s: %d samples, want 1", g, n)
		}
	}
	if _, n := e.sum("blk_transport_poll_wakes_total", port); n != 2 {
		t.Errorf("blk_transport_poll_wakes_total: %d samples, want one per core (2)", n)
	}

	// Target: successes by status, states, namespace counters.
	e.atLeast(t, "blk_target_commands_total", map[string]string{"status": "0x000", "name": "Successful Completion"}, ios)
	ex := e.atLeast(t, "blk_target_request_state_entries_total", map[string]string{"state": "executing"}, ios)
	e.atLeast(t, "blk_target_request_state_entries_total", map[string]string{"state": "queued"}, fuas+1)
	e.atLeast(t, "blk_target_request_state_entries_total", map[string]string{"state": "done"}, ex-float64(20)) // AERs held, keep-alives in flight
	e.atLeast(t, "blk_target_controllers", nil, 1)
	for _, b := range []string{"controllers", "discovery", "discovery_per_source"} {
		if _, n := e.sum("blk_target_connects_busy_total", map[string]string{"budget": b}); n != 1 {
			t.Errorf("blk_target_connects_busy_total budget %s: %d samples, want 1", b, n)
		}
	}
	e.atLeast(t, "blk_target_namespace_reads_total", nsl, reads)
	e.atLeast(t, "blk_target_namespace_writes_total", nsl, writes+fuas)
	e.atLeast(t, "blk_target_namespace_fua_writes_total", nsl, fuas)
	e.atLeast(t, "blk_target_namespace_read_bytes_total", nsl, reads*bs)
	e.atLeast(t, "blk_target_namespace_write_bytes_total", nsl, writes*4*bs+fuas*bs)
	e.atLeast(t, "blk_target_namespace_flushes_total", nsl, 1)
	e.atLeast(t, "blk_target_namespace_write_zeroes_total", nsl, 1)
	// Plain writes to namespace 2 go through the binding's write group
	// (one at a time here: a commit each); FUA writes never do, nor
	// writes to the extent store, which has no group (0, exported).
	if g, _ := e.sum("blk_target_namespace_grouped_writes_total", nsl2); g != writes {
		t.Errorf("blk_target_namespace_grouped_writes_total = %v, want the %d plain writes", g, writes)
	}
	if c, _ := e.sum("blk_target_namespace_group_commits_total", nsl2); c < 1 || c > writes {
		t.Errorf("blk_target_namespace_group_commits_total = %v, want 1 to %d", c, writes)
	}
	if g, n := e.sum("blk_target_namespace_grouped_writes_total", nsl); g != 0 || n != 1 {
		t.Errorf("blk_target_namespace_grouped_writes_total of the extent store: %v in %d samples, want 0 in 1", g, n)
	}

	// Volume: counters and space.
	e.atLeast(t, "blk_volume_reads_total", vol, reads)
	e.atLeast(t, "blk_volume_writes_total", vol, writes+fuas)
	e.atLeast(t, "blk_volume_fua_writes_total", vol, fuas)
	e.atLeast(t, "blk_volume_read_bytes_total", vol, reads*bs)
	e.atLeast(t, "blk_volume_write_bytes_total", vol, writes*4*bs+fuas*bs)
	e.atLeast(t, "blk_volume_store_memtable_bytes", nil, 1)
	e.atLeast(t, "blk_volume_size_bytes", vol, 64<<20)
	e.atLeast(t, "blk_volume_store_healthy", nil, 1)
	// The extent store: the 40 writes fill 10 clusters of 64 KiB, the
	// FUA writes one more; each first write is a map commit; each FUA
	// write a sync (area, then WAL; the flush after them finds nothing
	// new to sync); the area is 16 MiB.
	e.atLeast(t, "blk_volume_disk_bytes", vol, 11*64<<10)
	e.atLeast(t, "blk_volume_store_map_commits_total", nil, 11)
	e.atLeast(t, "blk_volume_store_syncs_total", nil, fuas)
	e.atLeast(t, "blk_volume_store_area_mapped_bytes", nil, 11*64<<10)
	if a, _ := e.sum("blk_volume_store_area_bytes", nil); a != 16<<20 {
		t.Errorf("blk_volume_store_area_bytes = %v, want the 16 MiB area", a)
	}

	// Latency histograms: a count per backend call, +Inf equal to the
	// count, a positive sum, and the buckets cumulative.
	for op, n := range map[string]float64{"read": reads, "write": writes, "write_fua": fuas, "flush": 1, "write_zeroes": 1} {
		l := map[string]string{"volume": testVolume, "role": metrics.RoleHost, "op": op}
		cnt := e.atLeast(t, "blk_target_namespace_io_latency_seconds_count", l, n)
		if s, _ := e.sum("blk_target_namespace_io_latency_seconds_sum", l); s <= 0 {
			t.Errorf("latency %s: sum %v", op, s)
		}
		var prev float64
		buckets := 0
		for _, s := range e.samples["blk_target_namespace_io_latency_seconds_bucket"] {
			if s.labels["volume"] != testVolume || s.labels["role"] != metrics.RoleHost || s.labels["op"] != op {
				continue
			}
			buckets++
			if s.value < prev {
				t.Errorf("latency %s: bucket le=%s %v < previous %v", op, s.labels["le"], s.value, prev)
			}
			prev = s.value
			if s.labels["le"] == "+Inf" && s.value != cnt {
				t.Errorf("latency %s: +Inf bucket %v, count %v", op, s.value, cnt)
			}
		}
		if buckets != len(metrics.LatencyBuckets())+1 {
			t.Errorf("latency %s: %d buckets, want %d", op, buckets, len(metrics.LatencyBuckets())+1)
		}
	}

	// Initiator.
	ctl := map[string]string{"subsystem": testSubNQN, "addr": tt.addr}
	if v, _ := e.sum("blk_initiator_associations_total", ctl); v != 1 {
		t.Errorf("associations %v, want 1", v)
	}
	if v, _ := e.sum("blk_initiator_state", map[string]string{"subsystem": testSubNQN, "addr": tt.addr, "state": "live"}); v != 1 {
		t.Errorf("state live = %v, want 1", v)
	}
	if v, n := e.sum("blk_initiator_state", ctl); v != 1 || n != 4 {
		t.Errorf("state series: %d summing to %v, want 4 summing to 1", n, v)
	}

	// A second scrape sees the counters only grow.
	if _, err := ns.ReadAt(rbuf, 0); err != nil {
		t.Fatal(err)
	}
	e2 := scrape(t, srv.URL)
	before, _ := e.sum("blk_volume_reads_total", vol)
	e2.atLeast(t, "blk_volume_reads_total", vol, before+1)
}
