package blkd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/meta"
	"github.com/prometheus/client_golang/prometheus"
)

// Health for the platform (docs/operations.md §2.2): GET /livez says the
// process still works (its HTTP server answers and its main loops tick),
// GET /readyz says the node can do its job (started, store open, registry
// led and caught up, every configured port open). Both hold no secret and
// are readable without credentials (guard, publicRoute); both are served
// while the node starts (earlyRoute), so a slow start does not get a pod
// killed. blk_ready{check} exports the same checks for alerting, beside
// blk_store_full, blk_volume_state and
// blk_tls_cert_expiry_timestamp_seconds.

// loopStale is how long a main loop may go without a tick before /livez
// fails: three settle periods, thirty liveness probes.
const loopStale = 3 * settleInterval

// readyLag bounds how far this node's applied raft index may trail the
// commit index it knows and still count as caught up: a handful of
// entries is a batch being applied, more is a copy that is behind.
const readyLag = 64

// The loops /livez watches.
const (
	loopLiveness = iota // livenessLoop: the leader's probes
	loopSettle          // settleLoop: the owner's reconcile rounds
	numLoops
)

var loopNames = [numLoops]string{loopLiveness: "liveness", loopSettle: "settle"}

// heartbeats holds each main loop's last tick (unix nanoseconds; zero
// until the loop starts: a loop not started yet is a node still
// starting, which is alive).
type heartbeats [numLoops]atomic.Int64

func (h *heartbeats) beat(loop int) { h[loop].Store(time.Now().UnixNano()) }

// stale names the first loop whose last tick is older than loopStale at
// now, "" if none is.
func (h *heartbeats) stale(now time.Time) (loop string, age time.Duration) {
	for i := range h {
		if at := h[i].Load(); at != 0 {
			if age := now.Sub(time.Unix(0, at)); age > loopStale {
				return loopNames[i], age
			}
		}
	}
	return "", 0
}

// The readiness checks, in the order /readyz lists them.
var readyChecks = []string{"started", "store", "registry", "ports"}

// readyState is what the readiness checks read, taken at once.
type readyState struct {
	started  bool
	phase    string // what a starting node is doing
	stopping bool
	// store: opened, and its error (a failed store) if any.
	storeOpen bool
	storeErr  error
	// registry: the leader's ID ("" if none is known) and this node's
	// raft indexes.
	leader          string
	applied, commit uint64
	// ports: each configured listener by name, and whether it is open.
	ports []portOpen
}

type portOpen struct {
	name string // the flag that configures it
	open bool
}

// check is one readiness check's outcome: "" when it holds.
type check struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// readiness evaluates every check of s.
func readiness(s readyState) []check {
	out := make([]check, 0, len(readyChecks))
	for _, name := range readyChecks {
		why := s.failing(name)
		out = append(out, check{Name: name, OK: why == "", Error: why})
	}
	return out
}

// failing says why check name does not hold, "" if it does.
func (s readyState) failing(name string) string {
	switch name {
	case "started":
		switch {
		case s.stopping:
			return "the node is shutting down"
		case !s.started:
			return "the node is starting (" + s.phase + ")"
		}
	case "store":
		switch {
		case s.stopping:
			return "the store is closing"
		case !s.storeOpen:
			return "the store is not open yet"
		case s.storeErr != nil:
			return "the store failed: " + s.storeErr.Error()
		}
	case "registry":
		switch {
		case s.leader == "":
			return "the registry has no leader"
		case s.commit > s.applied+readyLag:
			return fmt.Sprintf("this node's registry copy is behind: applied index %d of %d committed", s.applied, s.commit)
		}
	case "ports":
		var closed []string
		for _, p := range s.ports {
			if !p.open || s.stopping {
				closed = append(closed, p.name)
			}
		}
		if len(closed) > 0 {
			return "not listening: " + strings.Join(closed, ", ")
		}
	}
	return ""
}

// readyState reads the node's state for the readiness checks.
func (d *Daemon) readyState() readyState {
	s := readyState{started: d.ready.Load(), phase: d.phase()}
	select {
	case <-d.stop:
		s.stopping = true
	default:
	}
	if d.store != nil {
		s.storeOpen, s.storeErr = true, d.store.Health()
	}
	if d.node != nil {
		_, s.leader = d.node.Leader()
		r := d.node.Raft()
		s.applied, s.commit = r.AppliedIndex(), r.CommitIndex()
	}
	// Start opens the NVMe ports while the API already serves: their
	// fields are read only once ready is set, after them (the atomic
	// orders the writes before this read); until then they count as not
	// open yet.
	s.ports = append(s.ports, portOpen{"--api-addr", d.ln != nil})
	if d.cfg.TCPOn() {
		s.ports = append(s.ports, portOpen{"--tcp-addr", s.started && d.tcp != nil})
	}
	if d.cfg.DiscoveryOn() {
		s.ports = append(s.ports, portOpen{"--discovery-addr", s.started && d.disc != nil})
	}
	if d.cfg.RDMAOn() {
		s.ports = append(s.ports, portOpen{"--nvme-addr", s.started && d.port != nil})
	}
	return s
}

// livez answers GET /livez: 200 "ok", or 503 naming the loop that
// stopped ticking.
func (d *Daemon) livez(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if loop, age := d.beats.stale(time.Now()); loop != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "the %s loop has not run for %v (limit %v)\n", loop, age.Round(time.Second), loopStale)
		return
	}
	fmt.Fprintln(w, "ok")
}

// readyResponse is the JSON body of GET /readyz.
type readyResponse struct {
	NodeID string  `json:"node_id"`
	Ready  bool    `json:"ready"`
	Checks []check `json:"checks"`
}

// readyz answers GET /readyz: 200 when every check holds, else 503; the
// body lists each check (JSON, or text lines with ?verbose).
func (d *Daemon) readyz(w http.ResponseWriter, r *http.Request) {
	checks := readiness(d.readyState())
	resp := readyResponse{NodeID: d.cfg.NodeID, Ready: true, Checks: checks}
	for _, c := range checks {
		resp.Ready = resp.Ready && c.OK
	}
	status := http.StatusOK
	if !resp.Ready {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Cache-Control", "no-store")
	if !r.URL.Query().Has("verbose") {
		writeJSON(w, status, resp)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	for _, c := range checks {
		if c.OK {
			fmt.Fprintf(w, "[+] %s ok\n", c.Name)
		} else {
			fmt.Fprintf(w, "[-] %s failed: %s\n", c.Name, c.Error)
		}
	}
	if resp.Ready {
		fmt.Fprintf(w, "node %s is ready\n", d.cfg.NodeID)
	} else {
		fmt.Fprintf(w, "node %s is not ready\n", d.cfg.NodeID)
	}
}

// readySummary is a /readyz answer as GET /v1/cluster?health=true shows
// it (api.Member.Ready): "ready", or "not ready: " and the failing
// checks' names.
func readySummary(ready bool, checks []check) string {
	var failing []string
	for _, c := range checks {
		if !c.OK {
			failing = append(failing, c.Name)
		}
	}
	if ready && len(failing) == 0 {
		return api.ReadyYes
	}
	if len(failing) == 0 {
		return strings.TrimSuffix(api.NotReadyPrefix, ": ")
	}
	return api.NotReadyPrefix + strings.Join(failing, ", ")
}

// memberReadiness fills in each member's Ready: this node's from its own
// checks, the others' from their GET /readyz, all at once, each within
// probeTimeout.
func (d *Daemon) memberReadiness(ctx context.Context, members []api.Member) {
	var wg sync.WaitGroup
	for i := range members {
		m := &members[i]
		switch {
		case m.ID == d.cfg.NodeID:
			checks := readiness(d.readyState())
			ready := true
			for _, c := range checks {
				ready = ready && c.OK
			}
			m.Ready = readySummary(ready, checks)
		case m.APIAddr == "":
			// A raft member the registry does not know yet: nowhere to
			// ask.
			m.Ready = api.ReadyUnreachable
		default:
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(ctx, probeTimeout)
				defer cancel()
				m.Ready = askReady(ctx, d.peers, d.peerURL(m.APIAddr, "/readyz"), m.ID)
			})
		}
	}
	wg.Wait()
}

// askReady asks url (a node's GET /readyz) whether node id is ready. It
// answers "unreachable" when no answer comes, or one not from id; ""
// (unknown) when the node answers but serves no /readyz (an older blkd).
func askReady(ctx context.Context, client *http.Client, url, id string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return api.ReadyUnreachable
	}
	resp, err := client.Do(req)
	if err != nil {
		return api.ReadyUnreachable
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		return ""
	}
	var r readyResponse
	if json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&r) != nil || r.NodeID != id {
		return api.ReadyUnreachable
	}
	return readySummary(r.Ready && resp.StatusCode == http.StatusOK, r.Checks)
}

// publicRoute says whether a route is readable by anyone who can reach
// the API: the probes, with or without TLS.
func publicRoute(method, path string) bool {
	return (method == http.MethodGet || method == http.MethodHead) && (path == "/livez" || path == "/readyz")
}

// openToLocalUsers says whether any local user may call a route without
// --tls-dir: the probes and /metrics, which hold no secret (volume
// names, NQNs derived from them, IDs, states; no host NQN, no
// DH-HMAC-CHAP material, no reservation key: docs/operations.md §2.2).
func openToLocalUsers(method, path string) bool {
	return publicRoute(method, path) || ((method == http.MethodGet || method == http.MethodHead) && path == "/metrics")
}

const readyHelp = "1 while a readiness check of GET /readyz holds, else 0: check=started (the node serves its volumes), store (open, not failed), registry (a leader, this copy caught up), ports (every configured listener open)."

// healthCollector exports the readiness checks and the states an
// operator must act on.
type healthCollector struct {
	d                          *Daemon
	ready, full, state, expiry *prometheus.Desc
}

func newHealthCollector(d *Daemon) healthCollector {
	return healthCollector{d: d,
		ready: prometheus.NewDesc("blk_ready", readyHelp, []string{"check"}, nil),
		full: prometheus.NewDesc("blk_store_full",
			"1 while the node's store refuses writes because its disk is full (free space under its reserve), else 0.", nil, nil),
		state: prometheus.NewDesc("blk_volume_state",
			"1 for each volume's state as the API shows it (creating, online, offline, deleting, failed, degraded, or unavailable: its node is down); exported by the registry leader only, so a volume whose node is gone still shows.", []string{"volume", "state"}, nil),
		expiry: prometheus.NewDesc("blk_tls_cert_expiry_timestamp_seconds",
			"When this node's certificate (--tls-dir) expires, in seconds since the Unix epoch. Absent without --tls-dir.", nil, nil)}
}

func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.ready
	ch <- c.full
	ch <- c.state
	ch <- c.expiry
}

func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	for _, k := range readiness(d.readyState()) {
		ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, boolValue(k.OK), k.Name)
	}
	if d.store != nil {
		ch <- prometheus.MustNewConstMetric(c.full, prometheus.GaugeValue, boolValue(d.store.Space().Full))
	}
	if d.node != nil && d.node.IsLeader() {
		// The state the API shows (views): the registry's, or
		// unavailable when the volume's node is down.
		var vols []api.Volume
		d.node.FSM().Read(func(s *meta.State) { vols = views(s, s.Export().Volumes...) })
		for _, v := range vols {
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, 1, v.Name, v.State)
		}
	}
	if d.apiTLS != nil && len(d.apiTLS.Certificates) > 0 && d.apiTLS.Certificates[0].Leaf != nil {
		ch <- prometheus.MustNewConstMetric(c.expiry, prometheus.GaugeValue, float64(d.apiTLS.Certificates[0].Leaf.NotAfter.Unix()))
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
