package main

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/pki"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// get fetches url with c and returns the status and body.
func get(t *testing.T, c *http.Client, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHealthProbes: a running node is live and ready, /readyz lists each
// check (JSON, or text with ?verbose), and blk_ready and the other health
// gauges say the same on /metrics.
func TestHealthProbes(t *testing.T) {
	d := startBlkd(t, t.TempDir())
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "8MiB"}`, 201, nil)
	if code, body := get(t, d.client(), "GET", d.url("/livez")); code != 200 || body != "ok\n" {
		t.Fatalf("/livez: %d %q", code, body)
	}
	code, body := get(t, d.client(), "GET", d.url("/readyz"))
	var r struct {
		NodeID string `json:"node_id"`
		Ready  bool   `json:"ready"`
		Checks []struct {
			Name string `json:"name"`
			OK   bool   `json:"ok"`
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || code != 200 || !r.Ready || len(r.Checks) != 4 {
		t.Fatalf("/readyz: %d %q (%v)", code, body, err)
	}
	for _, c := range r.Checks {
		if !c.OK {
			t.Errorf("/readyz check %s fails on a ready node: %s", c.Name, body)
		}
	}
	if code, body := get(t, d.client(), "GET", d.url("/readyz?verbose")); code != 200 ||
		!strings.Contains(body, "[+] registry ok\n") || !strings.Contains(body, "[+] ports ok\n") || !strings.HasSuffix(body, "is ready\n") {
		t.Fatalf("/readyz?verbose: %d %q", code, body)
	}
	if code, _ := get(t, d.client(), "POST", d.url("/readyz")); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /readyz: %d, want 405", code)
	}
	m := d.metricsText(t)
	for _, s := range []string{`blk_ready{check="started"}`, `blk_ready{check="store"}`, `blk_ready{check="registry"}`, `blk_ready{check="ports"}`,
		`blk_volume_state{state="online",volume="v"}`} {
		if got := sampleOf(m, s); got != 1 {
			t.Errorf("%s = %v, want 1", s, got)
		}
	}
	if got := sampleOf(m, "blk_store_full"); got != 0 {
		t.Errorf("blk_store_full = %v, want 0", got)
	}
	if strings.Contains(m, "blk_tls_cert_expiry_timestamp_seconds ") {
		t.Error("a certificate expiry without --tls-dir")
	}
}

// TestHealthWithoutCertificate: under --tls-dir a client with no
// certificate (a Kubernetes HTTPS probe) passes the handshake and reads
// /livez and /readyz, and nothing else: every other route answers 401
// naming the probes, and is counted as a certificate refusal. The
// node's certificate expiry is exported.
func TestHealthWithoutCertificate(t *testing.T) {
	ca, tlsDir, _ := nodeTLSDir(t, "node1")
	d := startBlkd(t, t.TempDir(), "--tls-dir", tlsDir)
	d.useTLS(operatorTLS(t, ca, "alice", pki.RoleAdmin))
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "8MiB"}`, 201, nil)
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}, Timeout: 10 * time.Second}
	base := "https://" + d.api
	for _, p := range []string{"/livez", "/readyz"} {
		if code, body := get(t, anon, "GET", base+p); code != 200 {
			t.Errorf("GET %s without a certificate: %d %q", p, code, body)
		}
	}
	refused := []string{
		"GET /metrics", "GET /v1/volumes", "GET /v1/volumes/v", "DELETE /v1/volumes/v", "POST /v1/volumes",
		"POST /v1/volumes/v/hosts", "POST /v1/volumes/v/attach", "GET /v1/volumes/v/snapshots",
		"GET /v1/volumes/v/snapshots/s/export", "PUT /v1/volumes/v/import", "GET /v1/cluster",
		"POST /v1/cluster/join", "POST /v1/cluster/remove", "GET /v1/internal/health", "POST /v1/internal/reconcile",
		"POST /livez", "DELETE /readyz", "GET /livez/x",
	}
	for _, call := range refused {
		method, path, _ := strings.Cut(call, " ")
		code, body := get(t, anon, method, base+path)
		if code != http.StatusUnauthorized || !strings.Contains(body, "presented no certificate: only GET /livez and /readyz") {
			t.Errorf("%s without a certificate: %d %q, want 401", call, code, body)
		}
	}
	if vs := d.volumes(t); len(vs) != 1 {
		t.Fatalf("volumes after certificate-less calls: %+v", vs)
	}
	m := d.metricsText(t)
	if got := sampleOf(m, `blk_api_refused_total{reason="certificate"}`); got != float64(len(refused)) {
		t.Errorf(`blk_api_refused_total{reason="certificate"} = %v, want %d`, got, len(refused))
	}
	exp := sampleOf(m, "blk_tls_cert_expiry_timestamp_seconds")
	if now := float64(time.Now().Unix()); exp <= now || exp > now+20*365*24*3600 {
		t.Errorf("blk_tls_cert_expiry_timestamp_seconds = %v, now %v", exp, now)
	}
	// promlint on the health families of a real scrape (the others are
	// metrics/'s to keep clean).
	problems, err := promlint.New(strings.NewReader(m)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		switch p.Metric {
		case "blk_ready", "blk_store_full", "blk_volume_state", "blk_tls_cert_expiry_timestamp_seconds":
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
	for _, f := range []string{"blk_ready", "blk_store_full", "blk_volume_state", "blk_tls_cert_expiry_timestamp_seconds"} {
		if !strings.Contains(m, "\n# TYPE "+f+" gauge\n") {
			t.Errorf("no gauge %s in the scrape", f)
		}
	}
	d.waitOutput(t, `msg="api call refused" .*who="unauthenticated 127\.0\.0\.1:\d+" method=GET path=/metrics err=`)
}

// readinessOf is GET /v1/cluster?health=true through d: each member's
// ready field, "node1=ready node2=unreachable ...".
func readinessOf(t *testing.T, d *daemon) string {
	t.Helper()
	var cl struct {
		Members []struct {
			ID    string `json:"id"`
			Ready string `json:"ready"`
		} `json:"members"`
	}
	d.must(t, "GET", "/v1/cluster?health=true", "", 200, &cl)
	var out []string
	for _, m := range cl.Members {
		out = append(out, m.ID+"="+m.Ready)
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// TestReadyzNoLeader: a node whose registry has lost its leader (two of
// three voters stopped) is live but not ready, saying why, on /readyz
// and in blk_ready; it is ready again once a leader is back. GET
// /v1/cluster?health=true says the same of every member: ready, a
// stopped one unreachable, the one left without a leader not ready.
func TestReadyzNoLeader(t *testing.T) {
	c := startCluster(t)
	d := c.procs["node3"]
	if code, body := get(t, d.client(), "GET", d.url("/readyz")); code != 200 {
		t.Fatalf("/readyz on a healthy cluster: %d %s", code, body)
	}
	// A node that has just joined may still be catching up.
	eventually(t, 30*time.Second, "every member ready", func() error {
		if got, want := readinessOf(t, d), "node1=ready node2=ready node3=ready"; got != want {
			return fmt.Errorf("readiness %q, want %q", got, want)
		}
		return nil
	})
	if code, body := get(t, d.client(), "GET", d.url("/v1/cluster")); code != 200 || strings.Contains(body, `"ready"`) {
		t.Errorf("GET /v1/cluster without health=true: %d %s", code, body)
	}
	if code, body := d.call(t, "GET", "/v1/cluster?health=yes", "", nil); code != 400 || !strings.Contains(body, "use health=true or health=false") {
		t.Errorf("GET /v1/cluster?health=yes: %d %s, want 400", code, body)
	}
	c.procs["node1"].stop(t)
	eventually(t, 30*time.Second, "node1 unreachable", func() error {
		if got, want := readinessOf(t, d), "node1=unreachable node2=ready node3=ready"; got != want {
			return fmt.Errorf("readiness %q, want %q", got, want)
		}
		return nil
	})
	c.procs["node2"].stop(t)
	eventually(t, 30*time.Second, "node3 not ready without a leader", func() error {
		if got, want := readinessOf(t, d), "node1=unreachable node2=unreachable node3=not ready: registry"; got != want {
			return fmt.Errorf("readiness %q, want %q", got, want)
		}
		code, body := get(t, d.client(), "GET", d.url("/readyz?verbose"))
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "[-] registry failed: the registry has no leader\n") ||
			!strings.Contains(body, "[+] store ok\n") || !strings.Contains(body, "[+] ports ok\n") {
			return fmt.Errorf("/readyz?verbose: %d %q", code, body)
		}
		return nil
	})
	m := d.metricsText(t)
	if r, s := sampleOf(m, `blk_ready{check="registry"}`), sampleOf(m, `blk_ready{check="store"}`); r != 0 || s != 1 {
		t.Errorf(`blk_ready{check="registry"} = %v, {check="store"} = %v; want 0 and 1`, r, s)
	}
	if code, body := get(t, d.client(), "GET", d.url("/livez")); code != 200 {
		t.Errorf("/livez without a leader: %d %q, want 200 (not ready is not dead)", code, body)
	}
	c.start("node1")
	eventually(t, 30*time.Second, "node3 ready with a leader again", func() error {
		if code, body := get(t, d.client(), "GET", d.url("/readyz")); code != 200 {
			return fmt.Errorf("/readyz: %d %q", code, body)
		}
		return nil
	})
}
