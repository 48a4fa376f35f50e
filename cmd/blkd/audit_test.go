package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/peercred"
	"github.com/blk-project/blk/pki"
)

// startBlkdLogTo starts blkd as startBlkd does, with its standard error
// (the event and audit logs) on stderr instead of d.output().
func startBlkdLogTo(t *testing.T, dir string, stderr *os.File, extra ...string) *daemon {
	t.Helper()
	api := freeAddr(t)
	args := append([]string{"--data-dir", dir, "--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--api-addr", api,
		"--tcp-addr", freeAddr(t)}, extra...)
	d, ready := launchBlkd(t, api, stderr, args...)
	d.waitReady(t, ready, 60*time.Second)
	return d
}

// logTail reads the records appended to a JSON log file since the last
// call.
type logTail struct {
	f   *os.File
	off int64
}

func (l *logTail) next(t *testing.T) []map[string]any {
	t.Helper()
	b, err := io.ReadAll(io.NewSectionReader(l.f, l.off, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	// Only whole lines: a record is one write, but read what is complete.
	b = b[:bytes.LastIndexByte(b, '\n')+1]
	l.off += int64(len(b))
	var out []map[string]any
	for line := range strings.SplitSeq(string(b), "\n") {
		var m map[string]any
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// tracedCall does one API request and returns its status, its error
// message and the client's address of the connection it went over (the
// remote_addr blkd sees).
func (d *daemon) tracedCall(t *testing.T, method, path, body string) (int, string, string) {
	t.Helper()
	var local string
	req, err := http.NewRequest(method, d.url(path), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { local = i.Conn.LocalAddr().String() },
	}))
	resp, err := d.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error string `json:"error"`
	}
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error, local
}

// TestAuditEveryChange: 1,000 state-changing API calls against a real
// blkd, successes and refusals mixed, each leave two audit records —
// "api call received" and "api call" with who, remote_addr, method, path,
// status and (from 400 up) the error the client got — already in the
// log file when the client has its answer, at --log-level warn (audit
// records are not filtered by level) and far past the event log's rate
// limit. Deleting the volume leaves its api call and its volume state
// records. On the old main, 20 "api call" records per 10 s were written.
func TestAuditEveryChange(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "blkd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := startBlkdLogTo(t, t.TempDir(), f, "--log-format", "json", "--log-level", "warn")
	tail := &logTail{f: f}
	tail.next(t)
	who := "local " + peercred.Name(uint32(os.Getuid()))

	calls := 0
	// do makes one call and checks its records are in the log file by the
	// time the answer is here; it returns the other audit records
	// written meanwhile (volume state).
	do := func(method, path, body string, want int) []map[string]any {
		t.Helper()
		status, msg, local := d.tracedCall(t, method, path, body)
		if status != want {
			t.Fatalf("%s %s %s: %d %q, want %d", method, path, body, status, msg, want)
		}
		calls++
		var rec, out []map[string]any
		for _, r := range tail.next(t) {
			if r["audit"] != true {
				continue
			}
			switch r["msg"] {
			case "api call received", "api call":
				rec = append(rec, r)
			default:
				out = append(out, r)
			}
		}
		if len(rec) != 2 || rec[0]["msg"] != "api call received" || rec[1]["msg"] != "api call" {
			t.Fatalf("call %d, %s %s answered %d: audit records %v, want its api call received and api call", calls, method, path, status, rec)
		}
		for _, r := range rec {
			if r["call"] != float64(calls) || r["who"] != who || r["remote_addr"] != local || r["method"] != method || r["path"] != path || r["node"] != "node1" {
				t.Fatalf("call %d by %s from %s, %s %s: record %v", calls, who, local, method, path, r)
			}
		}
		if r := rec[1]; r["status"] != float64(status) || (status >= 400) != (r["err"] != nil) || (status >= 400 && r["err"] != msg) {
			t.Fatalf("call %d, %s %s answered %d %q: record %v", calls, method, path, status, msg, r)
		}
		return out
	}

	do("POST", "/v1/volumes", `{"name": "a", "size": "1MiB"}`, 201)
	const n = 1000
	for i := range n {
		nqn := fmt.Sprintf("nqn.2026-01.io.example:host-%d", i/4)
		switch i % 4 {
		case 0:
			do("POST", "/v1/volumes/a/hosts", `{"host_nqn": "`+nqn+`"}`, 200)
		case 1:
			do("DELETE", "/v1/volumes/a/hosts/"+nqn, "", 200)
		case 2:
			do("POST", "/v1/volumes/missing/attach", `{"host_nqn": "`+nqn+`"}`, 404)
		case 3:
			do("POST", "/v1/volumes", `{"name": "a", "size": "1MiB"}`, 409)
		}
	}
	states := do("DELETE", "/v1/volumes/a", "", 204)
	var to []string
	for _, r := range states {
		if r["msg"] == "volume state" && r["volume"] == "a" {
			to = append(to, fmt.Sprint(r["to"]))
		}
	}
	if strings.Join(to, ",") != "deleting,deleted" {
		t.Errorf("volume state records of the deletion: %v (all %v), want deleting then deleted", to, states)
	}
	if calls != n+2 {
		t.Fatalf("%d calls", calls)
	}
}

// TestAuditLogUnwritable: when blkd cannot write its log (standard error
// on a full disk), a change is refused with 503 and not made, and the
// failure is counted; reads go on. On the old main the volume was created
// and nothing said its record was lost.
func TestAuditLogUnwritable(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer full.Close()
	d := startBlkdLogTo(t, t.TempDir(), full)
	d.refuse(t, "POST", "/v1/volumes", `{"name": "a", "size": "1MiB"}`, 503,
		`^POST /v1/volumes not applied: audit log not written: write /dev/stderr: no space left on device`)
	if vs := d.volumes(t); len(vs) != 0 {
		t.Errorf("volumes %v after a change that could not be recorded", vs)
	}
	if n := d.metric(t, "blk_audit_write_errors_total"); n != 1 {
		t.Errorf("blk_audit_write_errors_total %v, want 1", n)
	}
}

// TestAuditBesideNoise: with --tls-dir, refused handshakes (noise anyone
// can make) are still rate-limited and counted, while every change an
// admin makes in the same window is recorded with the certificate's name.
func TestAuditBesideNoise(t *testing.T) {
	ca, tlsDir, _ := nodeTLSDir(t, "node1")
	d := startBlkd(t, t.TempDir(), "--tls-dir", tlsDir)
	d.useTLS(operatorTLS(t, ca, "alice", pki.RoleAdmin))
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "1MiB"}`, 201, nil)
	const n = 30
	// Another CA's certificate: refused in the handshake (one without
	// any gets a 401 instead, for the probes: health_test.go).
	other, err := pki.NewCA("blk other", 0)
	if err != nil {
		t.Fatal(err)
	}
	mc, mk, err := other.Issue(pki.Request{Name: "mallory", Role: pki.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(mc, mk)
	if err != nil {
		t.Fatal(err)
	}
	// Sent whatever CAs the server names (Go's client would otherwise
	// send none, and get a 401).
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }}}, Timeout: 10 * time.Second}
	// The refusals in a burst, well within one 10 s window.
	for range n {
		if resp, err := anon.Post(d.url("/v1/volumes/v/hosts"), "application/json", nil); err == nil {
			resp.Body.Close()
			t.Fatalf("a client without a certificate got %s", resp.Status)
		}
	}
	for i := range n {
		d.must(t, "POST", "/v1/volumes/v/hosts", fmt.Sprintf(`{"host_nqn": "nqn.2026-01.io.example:h%d"}`, i), 200, nil)
	}
	d.stop(t) // writes the counts of what was held back
	out := d.output()
	for i := range n {
		re := fmt.Sprintf(`msg="api call" node=node1 audit=true call=%d who=admin:alice method=POST path=/v1/volumes/v/hosts status=200 remote_addr=127\.0\.0\.1:\d+`, i+2)
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("no record of alice's call %d (%s) in:\n%s", i+2, re, out)
		}
	}
	refused := strings.Count(out, `msg="api handshake refused"`)
	suppressed := 0
	for _, m := range regexp.MustCompile(`msg="suppressed similar events" node=node1 event="api handshake refused" suppressed=(\d+)`).FindAllStringSubmatch(out, -1) {
		var k int
		fmt.Sscan(m[1], &k)
		suppressed += k
	}
	if refused > 20 || suppressed == 0 || refused+suppressed != n {
		t.Errorf("%d refused handshakes: %d records, %d counted as held back; want at most 20 per 10 s and the rest counted", n, refused, suppressed)
	}
}
