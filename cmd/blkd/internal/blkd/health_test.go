package blkd

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// readyAll is a node for which every readiness check holds.
func readyAll() readyState {
	return readyState{started: true, storeOpen: true, leader: "n1", applied: 100, commit: 100,
		ports: []portOpen{{"--api-addr", true}, {"--tcp-addr", true}}}
}

// TestReadinessChecks: each check fails on its own, naming why, and the
// others still hold.
func TestReadinessChecks(t *testing.T) {
	for _, c := range []struct {
		check, want string
		mod         func(*readyState)
	}{
		{"started", "the node is starting (joining)", func(s *readyState) { s.started, s.phase = false, "joining" }},
		{"store", "the store is not open yet", func(s *readyState) { s.storeOpen = false }},
		{"store", "the store failed: disk gone", func(s *readyState) { s.storeErr = errors.New("disk gone") }},
		{"registry", "the registry has no leader", func(s *readyState) { s.leader = "" }},
		{"registry", "applied index 100 of 165 committed", func(s *readyState) { s.commit = 100 + readyLag + 1 }},
		{"ports", "not listening: --tcp-addr", func(s *readyState) { s.ports[1].open = false }},
	} {
		s := readyAll()
		c.mod(&s)
		for _, k := range readiness(s) {
			if k.Name == c.check {
				if k.OK || !strings.Contains(k.Error, c.want) {
					t.Errorf("%s: %+v, want failing with %q", c.check, k, c.want)
				}
			} else if !k.OK {
				t.Errorf("%s failing (%q) made %s fail too: %s", c.check, c.want, k.Name, k.Error)
			}
		}
	}
	// A copy within readyLag of the commit index is caught up.
	s := readyAll()
	s.commit = s.applied + readyLag
	for _, k := range readiness(s) {
		if !k.OK {
			t.Errorf("%s fails with the applied index %d behind: %s", k.Name, readyLag, k.Error)
		}
	}
	// Shutting down: nothing but the registry (another node's business)
	// holds.
	s = readyAll()
	s.stopping = true
	for _, k := range readiness(s) {
		if k.OK != (k.Name == "registry") {
			t.Errorf("while stopping: %+v", k)
		}
	}
}

// TestHeartbeats: a loop not started yet is alive; one that ticked
// recently is; one silent for longer than loopStale is named.
func TestHeartbeats(t *testing.T) {
	var h heartbeats
	now := time.Now()
	if loop, _ := h.stale(now.Add(time.Hour)); loop != "" {
		t.Fatalf("loops never started reported stale: %s", loop)
	}
	h.beat(loopLiveness)
	h.beat(loopSettle)
	if loop, _ := h.stale(now.Add(loopStale - time.Second)); loop != "" {
		t.Fatalf("%s stale within %v", loop, loopStale)
	}
	h[loopSettle].Store(now.Add(-loopStale - time.Second).UnixNano())
	if loop, age := h.stale(now); loop != "settle" || age <= loopStale {
		t.Fatalf("stale() = %q %v, want settle older than %v", loop, age, loopStale)
	}
}

// TestOpenRoutes: only the probes are open without credentials, and only
// they and /metrics to every local user; never a change.
func TestOpenRoutes(t *testing.T) {
	for _, c := range []struct {
		method, path  string
		public, local bool
	}{
		{"GET", "/livez", true, true},
		{"HEAD", "/readyz", true, true},
		{"GET", "/metrics", false, true},
		{"POST", "/livez", false, false},
		{"DELETE", "/metrics", false, false},
		{"GET", "/v1/volumes", false, false},
		{"GET", "/v1/internal/health", false, false},
		{"GET", "/livez/x", false, false},
	} {
		if got := publicRoute(c.method, c.path); got != c.public {
			t.Errorf("publicRoute(%s %s) = %v", c.method, c.path, got)
		}
		if got := openToLocalUsers(c.method, c.path); got != c.local {
			t.Errorf("openToLocalUsers(%s %s) = %v", c.method, c.path, got)
		}
	}
}

// TestCertificateLessRoutes walks every route api.go registers (read
// from its source, so a new route is covered the day it is added) with a
// caller that presented no certificate under TLS: guard lets through GET
// /livez and /readyz and nothing else, answering 401 and counting each
// refusal (docs/operations.md §10 R4).
func TestCertificateLessRoutes(t *testing.T) {
	src, err := os.ReadFile("api.go")
	if err != nil {
		t.Fatal(err)
	}
	routes := regexp.MustCompile(`m\.Handle(?:Func)?\("([A-Z]+) (/[^"]*)"`).FindAllStringSubmatch(string(src), -1)
	if len(routes) < 40 {
		t.Fatalf("found %d routes in api.go: has routes() changed its form?", len(routes))
	}
	d := &Daemon{cfg: Config{TLSDir: "tls"}, apiTLS: &tls.Config{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	reached := ""
	h := d.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached = r.Method + " " + r.URL.Path }))
	var open []string
	for _, rt := range routes {
		path := regexp.MustCompile(`\{[a-z]+\}`).ReplaceAllString(rt[2], "x")
		for _, method := range []string{rt[1], http.MethodPost, http.MethodDelete} {
			reached = ""
			req := httptest.NewRequest(method, "https://node1"+path, nil)
			req.TLS = &tls.ConnectionState{HandshakeComplete: true}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			switch {
			case reached != "":
				open = append(open, reached)
			case rec.Code != http.StatusUnauthorized:
				t.Errorf("%s %s without a certificate: %d, want 401", method, path, rec.Code)
			}
		}
	}
	slices.Sort(open)
	if want := []string{"GET /livez", "GET /readyz"}; !slices.Equal(slices.Compact(open), want) {
		t.Errorf("reached without a certificate: %v, want only %v", open, want)
	}
	if want := uint64(3*len(routes) - len(open)); d.refusedTLS.Load() != want {
		t.Errorf("refusals counted %d, want %d", d.refusedTLS.Load(), want)
	}
}

// TestHealthCollector: a node not started yet exports every readiness
// check as 0 (and nothing it does not have: no store, no leader, no
// certificate), and promlint finds nothing to say about the families.
func TestHealthCollector(t *testing.T) {
	d := &Daemon{stop: make(chan struct{})}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newHealthCollector(d))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "blk_ready" || mfs[0].GetHelp() != readyHelp {
		t.Fatalf("families %v, want blk_ready alone", mfs)
	}
	var checks []string
	for _, m := range mfs[0].GetMetric() {
		if v := m.GetGauge().GetValue(); v != 0 {
			t.Errorf("%v = %v on a node not started, want 0", m.GetLabel(), v)
		}
		checks = append(checks, m.GetLabel()[0].GetValue())
	}
	if want := []string{"ports", "registry", "started", "store"}; !slices.Equal(checks, want) {
		t.Errorf("checks %v, want %v", checks, want)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
}

// TestAskReady: a member's /readyz answer as GET /v1/cluster?health=true
// shows it: ready, not ready with the failing checks' names, unreachable
// when nothing (or another node) answers or the answer is late, and
// unknown ("") from a node that serves no /readyz.
func TestAskReady(t *testing.T) {
	notReady := readyAll()
	notReady.leader, notReady.ports[1].open = "", false
	answers := map[string]func(w http.ResponseWriter, r *http.Request){
		"/ready": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 200, readyResponse{NodeID: "n2", Ready: true, Checks: readiness(readyAll())})
		},
		"/not-ready": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 503, readyResponse{NodeID: "n2", Checks: readiness(notReady)})
		},
		"/other-node": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 200, readyResponse{NodeID: "n3", Ready: true, Checks: readiness(readyAll())})
		},
		"/garbage": func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200); io.WriteString(w, "<html>") },
		"/old": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 404, map[string]string{"error": "no route GET /readyz"})
		},
		"/slow": func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { answers[r.URL.Path](w, r) }))
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for _, c := range []struct{ url, want string }{
		{srv.URL + "/ready", "ready"},
		{srv.URL + "/not-ready", "not ready: registry, ports"},
		{srv.URL + "/other-node", "unreachable"},
		{srv.URL + "/garbage", "unreachable"},
		{srv.URL + "/old", ""},
		{srv.URL + "/slow", "unreachable"},
		{closed.URL + "/ready", "unreachable"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		if got := askReady(ctx, srv.Client(), c.url, "n2"); got != c.want {
			t.Errorf("%s: %q, want %q", c.url, got, c.want)
		}
		cancel()
	}
	if got := readySummary(false, readiness(readyAll())); got != "not ready" {
		t.Errorf("not ready with every check holding: %q", got)
	}
}
