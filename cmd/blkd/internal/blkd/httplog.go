package blkd

import (
	"context"
	"log"
	"log/slog"
	"strings"
)

// httpErrorLog is the management API server's ErrorLog: each line
// net/http writes (a refused TLS handshake, an accept error, a panic in
// a handler) becomes an event of the event log with component=http, so
// that it is rate-limited with the rest. net/http puts the peer's
// address into its text ("http: TLS handshake error from 192.0.2.1:5432:
// remote error: tls: bad certificate"); the rate limiter counts records
// by message, so the address and the error are taken out into attributes
// and the message is the kind alone ("http: TLS handshake error"): 100
// refused handshakes are logBurst lines and one count, not 100 lines.
// The TLS handshake line stays beside the "api handshake refused" event
// it duplicates: that one has the reason, this one the address.
func httpErrorLog(event *slog.Logger) *log.Logger {
	return log.New(httpLogWriter{event.With(slog.String("component", "http"))}, "", 0)
}

type httpLogWriter struct{ log *slog.Logger }

func (w httpLogWriter) Write(p []byte) (int, error) {
	level, msg, attrs := httpRecord(string(p))
	w.log.LogAttrs(context.Background(), level, msg, attrs...)
	return len(p), nil
}

// httpRecord splits a line of net/http's ErrorLog into a level, a
// message that names the kind of line, and attributes: the peer
// (remote_addr; "from" where it is no address), the error, and what
// follows the first line (a panic's stack).
func httpRecord(text string) (slog.Level, string, []slog.Attr) {
	text = strings.TrimRight(text, "\n")
	head, detail, _ := strings.Cut(text, "\n")
	prefix := ""
	for _, p := range []string{"http: ", "http2: "} {
		if strings.HasPrefix(head, p) {
			prefix = p
			break
		}
	}
	kind, errText, hasErr := strings.Cut(head[len(prefix):], ": ")
	var attrs []slog.Attr
	if k, from, ok := strings.Cut(kind, " from "); ok && prefix != "" {
		kind = k
		key := "from"
		if k == "TLS handshake error" {
			key = "remote_addr"
		}
		attrs = append(attrs, slog.String(key, from))
	}
	if k, addr, ok := strings.Cut(kind, "panic serving "); ok && k == "" && prefix != "" {
		kind = "panic serving"
		attrs = append(attrs, slog.String("remote_addr", addr))
	}
	if hasErr {
		attrs = append(attrs, slog.String("err", errText))
	}
	if detail != "" {
		attrs = append(attrs, slog.String("detail", detail))
	}
	level := slog.LevelWarn
	if kind == "panic serving" {
		level = slog.LevelError
	}
	return level, prefix + kind, attrs
}
