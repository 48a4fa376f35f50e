package blkd

import (
	"context"
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

// logs are the node's logs, all text or JSON lines on one output
// (Config.LogOutput, standard error), each record with the node's ID,
// written through one handler so that their lines never interleave:
//
//   - event: the target's and the ports' events, raft's (component=raft,
//     raftlog.go) and the HTTP server's (component=http), the noise a
//     remote party can provoke at will; filtered by the level (LogLevel,
//     changed by Reload) and rate-limited (rl, flushed at shutdown);
//   - audit: the changes made to the node (audit.go), marked audit=true;
//     never filtered by level, never rate-limited, and its write errors
//     reach the caller;
//   - notice: the node's life — ready, shutting down, stopped — once each
//     per run: never filtered by level (an operator must always see that
//     the node serves, even at --log-level error) nor rate-limited.
type logs struct {
	event  *slog.Logger
	rl     *ratelog.Handler
	audit  *auditLog
	notice *slog.Logger
}

// Log is the node's event log, for what wires it (cmd/blkd: a reload
// refused, a notification systemd did not take).
func (d *Daemon) Log() *slog.Logger { return d.log }

// newLogger builds the event and audit logs of cfg (a valid Config with
// defaults); see logs.
func newLogger(cfg Config) (*slog.Logger, *ratelog.Handler, *auditLog) {
	l := newLogs(cfg, new(slog.LevelVar))
	return l.event, l.rl, l.audit
}

// newLoggerLevel is newLogger with the event log's level kept in level
// (set here from cfg.LogLevel), which Reload changes on a running node.
func newLoggerLevel(cfg Config, level *slog.LevelVar) (*slog.Logger, *ratelog.Handler, *auditLog) {
	l := newLogs(cfg, level)
	return l.event, l.rl, l.audit
}

// newLogs builds the logs of cfg, the event log's level kept in level
// (set here from cfg.LogLevel).
func newLogs(cfg Config, level *slog.LevelVar) logs {
	w := cfg.LogOutput
	if w == nil {
		w = os.Stderr
	}
	if f, ok := w.(flusher); ok {
		w = flushWriter{w, f}
	}
	l, _ := parseLevel(cfg.LogLevel)
	level.Set(l)
	// The handler itself takes every level: the event log's is filtered
	// by level through filtered, the others are not filtered at all.
	opts := &slog.HandlerOptions{Level: slog.LevelDebug - 8}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	node := slog.String("node", cfg.NodeID)
	rl := ratelog.New(filtered{h, level}, ratelog.Options{Burst: logBurst, Interval: logInterval})
	return logs{
		event:  slog.New(rl).With(node),
		rl:     rl,
		audit:  newAuditLog(h.WithAttrs([]slog.Attr{node, slog.Bool("audit", true)}), syncOf(cfg.LogOutput)),
		notice: slog.New(h.WithAttrs([]slog.Attr{node})),
	}
}

// filtered is a handler that takes the records of level and above.
type filtered struct {
	slog.Handler
	level slog.Leveler
}

func (f filtered) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= f.level.Level() && f.Handler.Enabled(ctx, l)
}

func (f filtered) WithAttrs(as []slog.Attr) slog.Handler {
	return filtered{f.Handler.WithAttrs(as), f.level}
}

func (f filtered) WithGroup(name string) slog.Handler {
	return filtered{f.Handler.WithGroup(name), f.level}
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
