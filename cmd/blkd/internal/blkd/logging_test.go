package blkd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/blk-project/blk/internal/ratelog"
)

// TestLogger: the event log is JSON or text at the configured level,
// carries the node ID, and holds back a flood of one kind past logBurst,
// reporting the count when flushed.
func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	log, rl, _ := newLogger(Config{NodeID: "n7", LogFormat: "json", LogLevel: "warn", LogOutput: &buf}.WithDefaults())
	log.Info("controller created") // below the level
	for range logBurst + 15 {
		log.Warn("connect refused", "host_nqn", "nqn.2026-01.io.example:bad")
	}
	rl.Flush()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != logBurst+1 {
		t.Fatalf("%d lines, want %d refusals and a summary:\n%s", len(lines), logBurst, buf.String())
	}
	var first, last map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatal(err)
	}
	if first["msg"] != "connect refused" || first["level"] != "WARN" || first["node"] != "n7" || first["host_nqn"] != "nqn.2026-01.io.example:bad" {
		t.Errorf("first line %v", first)
	}
	if last["msg"] != "suppressed similar events" || last["event"] != "connect refused" || last["suppressed"] != float64(15) || last["node"] != "n7" {
		t.Errorf("summary line %v", last)
	}

	buf.Reset()
	log, _, _ = newLogger(Config{LogOutput: &buf}.WithDefaults())
	log.Debug("connection accepted")
	log.Info("controller created", "cntlid", 1)
	if got := buf.String(); !strings.Contains(got, `level=INFO msg="controller created" node=node1 cntlid=1`) || strings.Contains(got, "accepted") {
		t.Errorf("text log:\n%s", got)
	}
}

// failWriter is a log output that fails every write once fail is set.
type failWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	fail func(line string) bool
}

func (w *failWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail != nil && w.fail(string(p)) {
		return 0, syscall.ENOSPC
	}
	return w.buf.Write(p)
}

func (w *failWriter) records(t *testing.T) []map[string]any {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(w.buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		out = append(out, m)
	}
	return out
}

// auditDaemon is a Daemon with only what guard needs: no authentication
// (--insecure), the logs of cfg on out.
func auditDaemon(out io.Writer, level string) *Daemon {
	d := &Daemon{cfg: Config{Insecure: true, LogFormat: "json", LogLevel: level, LogOutput: out}.WithDefaults()}
	d.log, d.rl, d.audit = newLogger(d.cfg)
	return d
}

// serveOne sends one request through guard to h.
func serveOne(d *Daemon, h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	d.guard(h).ServeHTTP(rec, req)
	return rec
}

// TestAuditNotRateLimited: every state-changing call gets its two audit
// records, at any log level and however many, while the event log
// beside it is still rate-limited; reads are not audited.
func TestAuditNotRateLimited(t *testing.T) {
	var out failWriter
	d := auditDaemon(&out, "error")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodDelete {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no volume " + strings.TrimPrefix(r.URL.Path, "/v1/volumes/")})
			return
		}
		writeJSON(w, http.StatusOK, json.RawMessage(b))
	})
	const calls = 1000
	for i := range calls {
		d.log.Error("connect refused") // noise, interleaved
		method, path, want := http.MethodPost, "/v1/volumes/v/hosts", http.StatusOK
		if i%3 == 0 {
			method, path, want = http.MethodDelete, fmt.Sprintf("/v1/volumes/v%d", i), http.StatusNotFound
		}
		body := fmt.Sprintf(`{"host_nqn":"nqn.2026-01.io.example:h%d","dhchap_secret":"DHHC-1:00:c2VjcmV0:"}`, i)
		if rec := serveOne(d, h, method, path, body); rec.Code != want || (want == http.StatusOK && rec.Body.String() != body+"\n") {
			t.Fatalf("call %d: %d %q, want %d with the handler's answer", i, rec.Code, rec.Body.String(), want)
		}
		serveOne(d, h, http.MethodGet, "/v1/volumes", "")
	}
	d.rl.Flush()
	var received, done, noise int
	for _, r := range out.records(t) {
		switch r["msg"] {
		case "api call received":
			i := received
			received++
			if r["call"] != float64(i+1) || r["audit"] != true || r["level"] != "INFO" || r["who"] != "unauthenticated 192.0.2.1:1234" || r["remote_addr"] != "192.0.2.1:1234" {
				t.Fatalf("record %v", r)
			}
			body, _ := r["body"].(map[string]any)
			if body["host_nqn"] != fmt.Sprintf("nqn.2026-01.io.example:h%d", i) || body["dhchap_secret"] != "(redacted)" {
				t.Fatalf("record %v: body", r)
			}
		case "api call":
			i := done
			done++
			if r["call"] != float64(i+1) || r["audit"] != true {
				t.Fatalf("record %v", r)
			}
			if i%3 == 0 {
				if r["level"] != "WARN" || r["method"] != "DELETE" || r["path"] != fmt.Sprintf("/v1/volumes/v%d", i) || r["status"] != float64(404) || r["err"] != fmt.Sprintf("no volume v%d", i) {
					t.Fatalf("record %v", r)
				}
			} else if r["level"] != "INFO" || r["method"] != "POST" || r["path"] != "/v1/volumes/v/hosts" || r["status"] != float64(200) || r["err"] != nil {
				t.Fatalf("record %v", r)
			}
		case "connect refused":
			noise++
		case ratelog.SuppressedMsg:
			if r["event"] != "connect refused" || r["suppressed"] != float64(calls-logBurst) {
				t.Errorf("summary %v", r)
			}
		default:
			t.Errorf("unexpected record %v", r)
		}
	}
	if received != calls || done != calls || noise != logBurst {
		t.Errorf("%d api call received, %d api call, %d noise records; want %d, %d, %d", received, done, noise, calls, calls, logBurst)
	}
	if strings.Contains(out.buf.String(), "c2VjcmV0") {
		t.Error("a DH-HMAC-CHAP secret is in the log")
	}
}

// TestAuditWriteFailure: a change whose record cannot be written is not
// applied (503); one whose outcome cannot be written is not acknowledged
// as a success (500 naming what was done); both are counted; reads are
// served whatever the log.
func TestAuditWriteFailure(t *testing.T) {
	var out failWriter
	d := auditDaemon(&out, "info")
	var applied int
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		applied++
		w.Header().Set("Location", "/v1/volumes/v")
		writeJSON(w, http.StatusCreated, map[string]string{"name": "v"})
	})

	out.fail = func(string) bool { return true }
	rec := serveOne(d, h, http.MethodPost, "/v1/volumes", `{"name":"v","size":"1GiB"}`)
	if rec.Code != http.StatusServiceUnavailable || applied != 0 || !strings.Contains(rec.Body.String(), "POST /v1/volumes not applied: audit log not written: no space left on device") {
		t.Fatalf("record of the request not written: %d %q, applied %d times", rec.Code, rec.Body.String(), applied)
	}
	if rec := serveOne(d, h, http.MethodGet, "/v1/volumes", ""); rec.Code != http.StatusCreated || applied != 1 {
		t.Fatalf("a read with the log failing: %d", rec.Code)
	}

	out.fail = func(l string) bool { return strings.Contains(l, `"msg":"api call"`) }
	rec = serveOne(d, h, http.MethodPost, "/v1/volumes", `{"name":"v","size":"1GiB"}`)
	if rec.Code != http.StatusInternalServerError || applied != 2 || rec.Header().Get("Location") != "" ||
		!strings.Contains(rec.Body.String(), "POST /v1/volumes was answered 201 Created but is not recorded: audit log not written") {
		t.Fatalf("record of the outcome not written: %d %q %v, applied %d times", rec.Code, rec.Body.String(), rec.Header(), applied)
	}
	if n := d.audit.failed.Load(); n != 2 {
		t.Errorf("%d audit write errors counted, want 2", n)
	}
	out.fail = nil
	if rec := serveOne(d, h, http.MethodPost, "/v1/volumes", `{"name":"w"}`); rec.Code != http.StatusCreated || applied != 3 {
		t.Fatalf("log back: %d", rec.Code)
	}
	rs := out.records(t)
	if len(rs) != 3 || rs[0]["msg"] != "api call received" || rs[1]["msg"] != "api call received" || rs[2]["msg"] != "api call" ||
		rs[1]["call"] != float64(3) || rs[2]["call"] != float64(3) || rs[2]["status"] != float64(201) {
		t.Errorf("records %v", rs)
	}
}

// TestAuditPanic: a handler that panics leaves its outcome in the audit
// log before the panic goes on to net/http.
func TestAuditPanic(t *testing.T) {
	var out failWriter
	d := auditDaemon(&out, "info")
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("half done") })
	func() {
		defer func() {
			if p := recover(); p != "half done" {
				t.Errorf("recovered %v", p)
			}
		}()
		serveOne(d, h, http.MethodDelete, "/v1/volumes/v", "")
	}()
	rs := out.records(t)
	if len(rs) != 2 || rs[1]["msg"] != "api call" || rs[1]["status"] != float64(500) || rs[1]["err"] != "panic: half done" || rs[1]["level"] != "ERROR" {
		t.Errorf("records %v", rs)
	}
}

// TestAuditFlushed: a buffered log output is flushed with every record,
// so a record reported written has left blkd.
func TestAuditFlushed(t *testing.T) {
	var sink bytes.Buffer
	bw := bufio.NewWriterSize(&sink, 64<<10)
	d := auditDaemon(bw, "info")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	if rec := serveOne(d, h, http.MethodDelete, "/v1/volumes/v", ""); rec.Code != http.StatusNoContent {
		t.Fatalf("%d", rec.Code)
	}
	if bw.Buffered() != 0 || strings.Count(sink.String(), `"audit":true`) != 2 {
		t.Errorf("%d bytes left in the buffer; out:\n%s", bw.Buffered(), sink.String())
	}
}

// TestNoticeEveryLevel: the notice log (ready, shutting down, stopped)
// is written at --log-level error, where the event log's Info records
// are not, and is never rate-limited; both carry the node ID.
func TestNoticeEveryLevel(t *testing.T) {
	var buf bytes.Buffer
	l := newLogs(Config{NodeID: "n3", LogLevel: "error", LogOutput: &buf}.WithDefaults(), new(slog.LevelVar))
	l.event.Info("listening", "port", "api")
	for range logBurst + 5 {
		l.notice.Info("ready")
	}
	l.rl.Flush()
	got := buf.String()
	if strings.Contains(got, "listening") || strings.Count(got, "level=INFO msg=ready node=n3\n") != logBurst+5 {
		t.Errorf("at error:\n%s", got)
	}
}
