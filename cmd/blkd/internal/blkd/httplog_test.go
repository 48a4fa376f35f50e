package blkd

import (
	"crypto/tls"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/blk-project/blk/internal/logrec"
	"github.com/blk-project/blk/internal/ratelog"
)

// TestHTTPErrorLogBurst: a burst of refused TLS handshakes against the
// API's server (apiServer) yields at most logBurst "http: TLS handshake
// error" events, each with the peer's address out of the message, and
// one record counting the rest; nothing reaches package log. Before, the
// server had no ErrorLog: one plain line per handshake on standard error.
func TestHTTPErrorLogBurst(t *testing.T) {
	var out logrec.Buffer
	d := &Daemon{cfg: Config{Insecure: true, NodeID: "n1", LogFormat: "json", LogLevel: "info", LogOutput: &out}.WithDefaults()}
	d.log, d.rl, d.audit = newLogger(d.cfg)
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = d.apiServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.StartTLS()
	const n = 100
	for range n {
		// The client does not trust the server's certificate: it aborts
		// the handshake with a bad certificate alert, which the server
		// logs.
		c, err := tls.Dial("tcp", srv.Listener.Addr().String(), &tls.Config{ServerName: "example.com"})
		if err == nil {
			c.Close()
			t.Fatal("handshake with an untrusted certificate succeeded")
		}
	}
	srv.Close() // waits for every connection's goroutine: all is logged
	d.rl.Flush()
	rs := out.TakeJSON(t)
	lines, suppressed := 0, 0
	for _, r := range rs {
		switch r["msg"] {
		case "http: TLS handshake error":
			lines++
			if r["component"] != "http" || r["node"] != "n1" || r["level"] != "WARN" || r["remote_addr"] == nil || r["err"] == nil {
				t.Errorf("record %v", r)
			}
		case ratelog.SuppressedMsg:
			if r["event"] != "http: TLS handshake error" {
				t.Errorf("summary %v", r)
			}
			suppressed++
		default:
			t.Errorf("unexpected record %v", r)
		}
	}
	if lines == 0 || lines > logBurst || suppressed != 1 {
		t.Errorf("%d handshakes refused: %d records and %d summaries, want 1..%d and one", n, lines, suppressed, logBurst)
	}
}

// TestHTTPRecord: net/http's lines split into a kind and attributes.
func TestHTTPRecord(t *testing.T) {
	for _, tc := range []struct {
		line  string
		level slog.Level
		msg   string
		attrs map[string]string
	}{
		{"http: TLS handshake error from 192.0.2.1:5432: remote error: tls: bad certificate\n", slog.LevelWarn, "http: TLS handshake error",
			map[string]string{"remote_addr": "192.0.2.1:5432", "err": "remote error: tls: bad certificate"}},
		{"http: TLS handshake error from [::1]:5432: EOF", slog.LevelWarn, "http: TLS handshake error", map[string]string{"remote_addr": "[::1]:5432", "err": "EOF"}},
		{"http: panic serving 192.0.2.1:5432: boom\ngoroutine 7 [running]:\nmain.f()", slog.LevelError, "http: panic serving",
			map[string]string{"remote_addr": "192.0.2.1:5432", "err": "boom", "detail": "goroutine 7 [running]:\nmain.f()"}},
		{"http: Accept error: accept tcp: too many open files; retrying in 5ms", slog.LevelWarn, "http: Accept error",
			map[string]string{"err": "accept tcp: too many open files; retrying in 5ms"}},
		{"http: superfluous response.WriteHeader call from x.f (a.go:12)", slog.LevelWarn, "http: superfluous response.WriteHeader call", map[string]string{"from": "x.f (a.go:12)"}},
		{"something else", slog.LevelWarn, "something else", map[string]string{}},
	} {
		level, msg, attrs := httpRecord(tc.line)
		got := map[string]string{}
		for _, a := range attrs {
			got[a.Key] = a.Value.String()
		}
		if level != tc.level || msg != tc.msg || len(got) != len(tc.attrs) {
			t.Errorf("%q: %v %q %v, want %v %q %v", tc.line, level, msg, got, tc.level, tc.msg, tc.attrs)
			continue
		}
		for k, v := range tc.attrs {
			if got[k] != v {
				t.Errorf("%q: %s=%q, want %q", tc.line, k, got[k], v)
			}
		}
	}
}
