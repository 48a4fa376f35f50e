package blkd

import (
	"bytes"
	"log/slog"
	"net/http"
)

// serveRead serves r, a read (not audited: audit.go) by who, through h,
// and at debug logs it as an "api request" event with its status and,
// from 400 up, the error text of the answer (err, read back from the
// body as auditCall reads it), so that a refused or failed read says why
// in the log as a change does. Without debug it only serves.
//
// guard (auth.go) calls it for every request it does not audit.
func (d *Daemon) serveRead(w http.ResponseWriter, r *http.Request, who string, h http.Handler) {
	if !d.log.Enabled(r.Context(), slog.LevelDebug) {
		h.ServeHTTP(w, r)
		return
	}
	rec := &readRecorder{ResponseWriter: w, status: http.StatusOK}
	h.ServeHTTP(rec, r)
	attrs := []any{slog.String("who", who), slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", rec.status)}
	if rec.status >= 400 {
		attrs = append(attrs, slog.String("err", errorText(rec.body.Bytes())))
	}
	d.log.Debug("api request", attrs...)
}

// readRecorder keeps the status a read's handler wrote and, for an
// error answer, the start of its body (enough for errorText).
type readRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	body   bytes.Buffer
}

func (s *readRecorder) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *readRecorder) Write(p []byte) (int, error) {
	if !s.wrote {
		s.status, s.wrote = http.StatusOK, true
	}
	if s.status >= 400 {
		// An error answer is a small JSON object; past twice errorText's
		// bound the rest is not kept.
		if room := 2*maxErrText - s.body.Len(); room > 0 {
			s.body.Write(p[:min(len(p), room)])
		}
	}
	return s.ResponseWriter.Write(p)
}
