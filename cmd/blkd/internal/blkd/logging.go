package blkd

import (
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/blk-project/blk/internal/ratelog"
)

// The event log's rate limit: per kind of event (its message), at most
// logBurst records per logInterval, then one "suppressed similar events"
// record with the count. A host hammering Connect with a bad NQN costs
// 20 lines per 10 s, not one per attempt. The audit log (audit.go) has
// none.
const (
	logBurst    = 20
	logInterval = 10 * time.Second
)

// newLogger builds the two logs of cfg (a valid Config with defaults),
// both text or JSON lines on LogOutput (standard error), each record with
// the node's ID:
//
//   - the event log: the target's and the ports' events, the noise a
//     remote party can provoke at will; filtered by LogLevel and
//     rate-limited (the returned ratelog.Handler, flushed at shutdown);
//   - the audit log: the changes made to the node (audit.go), marked
//     audit=true; never filtered by level, never rate-limited, and its
//     write errors reach the caller.
//
// Both write through one handler, so their lines never interleave.
func newLogger(cfg Config) (*slog.Logger, *ratelog.Handler, *auditLog) {
	return newLoggerLevel(cfg, new(slog.LevelVar))
}

// newLoggerLevel is newLogger with the event log's level kept in level
// (set here from cfg.LogLevel), which Reload changes on a running node.
func newLoggerLevel(cfg Config, level *slog.LevelVar) (*slog.Logger, *ratelog.Handler, *auditLog) {
	w := cfg.LogOutput
	if w == nil {
		w = os.Stderr
	}
	if f, ok := w.(flusher); ok {
		w = flushWriter{w, f}
	}
	l, _ := parseLevel(cfg.LogLevel)
	level.Set(l)
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	node := slog.String("node", cfg.NodeID)
	rl := ratelog.New(h, ratelog.Options{Burst: logBurst, Interval: logInterval})
	return slog.New(rl).With(node), rl, newAuditLog(h.WithAttrs([]slog.Attr{node, slog.Bool("audit", true)}), syncOf(cfg.LogOutput))
}

// flusher is a log output that buffers (a bufio.Writer given as
// Config.LogOutput): every record is flushed once written, so that a
// record reported written has left blkd.
type flusher interface{ Flush() error }

type flushWriter struct {
	io.Writer
	f flusher
}

func (w flushWriter) Write(p []byte) (int, error) {
	n, err := w.Writer.Write(p)
	if err == nil {
		err = w.f.Flush()
	}
	return n, err
}

// syncOf returns what makes the audit records written to out durable:
// fsync when out (nil: standard error) is a regular file (blkd
// 2>>/var/log/blkd.log), nothing otherwise. A pipe, a socket (journald)
// or a terminal has the record once write returns; its reader keeps it.
func syncOf(out io.Writer) func() error {
	f, ok := out.(*os.File)
	if out == nil {
		f, ok = os.Stderr, true
	}
	if !ok {
		return nil
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil
	}
	return f.Sync
}
