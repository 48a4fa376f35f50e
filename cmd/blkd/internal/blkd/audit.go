package blkd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"
)

// The audit log: the record of every change made to this node, kept apart
// from the event log (logging.go) because it must be complete. It shares
// the event log's output and format, and its records carry audit=true:
//
//	api call received   a state-changing API call, before it is applied:
//	                    call, who, method, path, remote_addr and the
//	                    body's non-secret fields (body.name, body.host_nqn, …)
//	api call            its outcome, before the client has it: the same
//	                    call number, who, method, path, status,
//	                    remote_addr, duration and, from 400 up, err
//	volume state        a volume's local state changed on this node
//	                    (control.Reconciler): created, online, deleting,
//	                    deleted, failed with its reason, …
//
// A state-changing call is every method but GET and HEAD on every route
// but /v1/internal/reconcile (the leader asking an owner to catch up with
// the registry: it changes nothing the registry does not already say,
// and what it does change on the node is a volume state record) and
// /v1/internal/checksum (a read of a replica's region hashes, for volume
// verify, which is audited itself). Reads
// change nothing and are event-log noise: "api request" at debug,
// rate-limited.
//
// Records are never rate-limited or filtered by --log-level: only the
// callers the API lets through (an admin or node certificate, root or
// blkd's own user) can cause them, one pair per change they make. A
// record is written with one write(2) (and fsync when the output is a
// regular file) before the change is applied, and the outcome before the
// response is sent. If the log cannot be written the change is not
// acknowledged: the request record failing answers 503 and nothing is
// applied; the outcome record failing answers 500 saying the change was
// made but not recorded. Either way blk_audit_write_errors_total counts
// it.

// errAudit is the error of an audit record that could not be written.
var errAudit = errors.New("audit log not written")

// auditLog writes audit records. It is safe for concurrent use.
type auditLog struct {
	h      slog.Handler // the output handler, with node and audit=true
	sync   func() error // makes a written record durable; nil: nothing to do
	calls  atomic.Uint64
	failed atomic.Uint64 // records not written (blk_audit_write_errors_total)
}

func newAuditLog(h slog.Handler, sync func() error) *auditLog {
	return &auditLog{h: h, sync: sync}
}

// write writes one record, durably when the output allows it, and says
// whether it was.
func (a *auditLog) write(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) error {
	r := slog.NewRecord(time.Now(), level, msg, 0)
	r.AddAttrs(attrs...)
	return a.handle(ctx, a.h, r)
}

func (a *auditLog) handle(ctx context.Context, h slog.Handler, r slog.Record) error {
	err := h.Handle(ctx, r)
	if err == nil && a.sync != nil {
		err = a.sync()
	}
	if err != nil {
		a.failed.Add(1)
		return fmt.Errorf("%w: %v", errAudit, err)
	}
	return nil
}

// logger is the audit log as a slog.Logger, for the control plane's
// records (control.Reconciler). Every level is written.
func (a *auditLog) logger() *slog.Logger { return slog.New(auditHandler{a, a.h}) }

// auditHandler passes every record to the audit log's output.
type auditHandler struct {
	a *auditLog
	h slog.Handler
}

func (h auditHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h auditHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.a.handle(ctx, h.h, r)
}
func (h auditHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return auditHandler{h.a, h.h.WithAttrs(as)}
}
func (h auditHandler) WithGroup(name string) slog.Handler {
	return auditHandler{h.a, h.h.WithGroup(name)}
}

// audited says whether a request changes state, and so is audited.
func audited(r *http.Request) bool {
	return r.Method != http.MethodGet && r.Method != http.MethodHead && r.URL.Path != "/v1/internal/reconcile" && r.URL.Path != "/v1/internal/checksum"
}

// auditCall serves r, a state-changing call by who, between its two
// audit records: "api call received" before h runs (not written: 503,
// h does not run), "api call" with h's outcome before h's answer, held
// back until then, is sent (not written: 500).
func (d *Daemon) auditCall(w http.ResponseWriter, r *http.Request, who string, h http.Handler) {
	ctx := r.Context()
	// The path as sent (escapes kept): a refused "/v1/volumes/%2e%2e"
	// is recorded as that, not as the ".." it decodes to.
	call := []slog.Attr{slog.Uint64("call", d.audit.calls.Add(1)), slog.String("who", who),
		slog.String("method", r.Method), slog.String("path", r.URL.EscapedPath())}
	received := append(call[:len(call):len(call)], slog.String("remote_addr", r.RemoteAddr))
	if b := bodyAttrs(r); len(b) > 0 {
		received = append(received, slog.Attr{Key: "body", Value: slog.GroupValue(b...)})
	}
	if err := d.audit.write(ctx, slog.LevelInfo, "api call received", received...); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": fmt.Sprintf(
			"%s %s not applied: %v (blkd records every change before making it; see its standard error)", r.Method, r.URL.Path, err)})
		return
	}
	start := time.Now()
	held := &heldResponse{header: w.Header()}
	outcome := func(status int, errText string) error {
		attrs := append(call[:len(call):len(call)], slog.Int("status", status), slog.String("remote_addr", r.RemoteAddr),
			slog.Duration("duration", time.Since(start)))
		level := slog.LevelInfo
		if status >= 400 {
			attrs = append(attrs, slog.String("err", errText))
			level = slog.LevelWarn
		}
		if status >= 500 {
			level = slog.LevelError
		}
		return d.audit.write(ctx, level, "api call", attrs...)
	}
	defer func() {
		// A handler that panics leaves a change half made: its record
		// says so before net/http drops the connection.
		if p := recover(); p != nil {
			_ = outcome(http.StatusInternalServerError, fmt.Sprintf("panic: %v", p))
			panic(p)
		}
	}()
	h.ServeHTTP(held, r)
	status := held.statusCode()
	errText := ""
	if status >= 400 {
		errText = errorText(held.body.Bytes())
	}
	if err := outcome(status, errText); err != nil {
		clear(w.Header())
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": fmt.Sprintf(
			"%s %s was answered %d %s but is not recorded: %v (the change, if any, was made; see blkd's standard error)",
			r.Method, r.URL.Path, status, http.StatusText(status), err)})
		return
	}
	w.WriteHeader(status)
	_, _ = w.Write(held.body.Bytes())
}

// heldResponse keeps a handler's answer until its audit record is
// written. The answers of state-changing calls are small JSON objects.
type heldResponse struct {
	header http.Header // the real writer's: nothing is sent before WriteHeader
	status int
	body   bytes.Buffer
}

func (h *heldResponse) Header() http.Header { return h.header }

func (h *heldResponse) WriteHeader(code int) {
	if h.status == 0 {
		h.status = code
	}
}

func (h *heldResponse) Write(p []byte) (int, error) {
	h.WriteHeader(http.StatusOK)
	return h.body.Write(p)
}

func (h *heldResponse) statusCode() int {
	if h.status == 0 {
		return http.StatusOK
	}
	return h.status
}

// maxErrText bounds the err attribute of a record.
const maxErrText = 1024

// errorText is the error message of an API error answer ({"error": …}),
// else its body, cut at maxErrText bytes.
func errorText(body []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	s := string(bytes.TrimSpace(body))
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		s = e.Error
	}
	if len(s) > maxErrText {
		s = s[:maxErrText] + "…"
	}
	return s
}

// auditFields are the request body fields an audit record carries, in
// this order; auditSecrets are recorded as present, never with their
// value. Fields in neither list are left out: a new field is recorded
// only once someone has said it is no secret.
var (
	auditFields  = []string{"name", "size", "block_size", "host_nqn", "node_id", "raft_addr", "api_addr", "nvme_addr", "tcp_addr", "cluster_id", "zone"}
	auditSecrets = []string{"dhchap_secret", "dhchap_ctrl_secret"}
)

// bodyAttrs reads r's body (at most maxBody+1 bytes: the handler refuses
// a larger one), gives it back to r for the handler, and returns the
// attributes of its auditFields and auditSecrets (none if it is not a
// JSON object).
func bodyAttrs(r *http.Request) []slog.Attr {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	r.Body = readCloser{io.MultiReader(bytes.NewReader(b), errReader{err}, r.Body), r.Body}
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	var out []slog.Attr
	for _, k := range auditFields {
		if v, ok := m[k]; ok {
			var s string
			if json.Unmarshal(v, &s) != nil {
				s = string(v)
			}
			out = append(out, slog.String(k, s))
		}
	}
	for _, k := range auditSecrets {
		var s string
		if v, ok := m[k]; ok && (json.Unmarshal(v, &s) != nil || s != "") {
			out = append(out, slog.String(k, "(redacted)"))
		}
	}
	return out
}

type readCloser struct {
	io.Reader
	io.Closer
}

// errReader returns err (nil: io.EOF, ending its part of a MultiReader).
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err == nil {
		return 0, io.EOF
	}
	return 0, e.err
}
