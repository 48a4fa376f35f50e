package hclogslog

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// LevelTrace is the slog level of hclog's Trace records.
const LevelTrace = slog.LevelDebug - 4

// NameKey is the attribute that carries an hclog logger's name.
const NameKey = "logger"

// Logger is an hclog.Logger over a *slog.Logger. Create it with New; it
// is safe for concurrent use, as the slog handler under it must be.
type Logger struct {
	l       *slog.Logger // with the implied pairs bound
	name    string
	implied []any
}

var _ hclog.Logger = (*Logger)(nil)

// New returns an hclog.Logger writing to l, without a name.
func New(l *slog.Logger) *Logger { return &Logger{l: l} }

// Level is the slog level of an hclog level. NoLevel is Info (hclog
// writes such records too); Off is above every slog level used.
func Level(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return LevelTrace
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	case hclog.Off:
		return slog.LevelError + 4
	}
	return slog.LevelInfo
}

// Log writes msg at level with args, alternating keys and values.
func (g *Logger) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	g.log(Level(level), msg, args)
}

func (g *Logger) Trace(msg string, args ...any) { g.log(LevelTrace, msg, args) }
func (g *Logger) Debug(msg string, args ...any) { g.log(slog.LevelDebug, msg, args) }
func (g *Logger) Info(msg string, args ...any)  { g.log(slog.LevelInfo, msg, args) }
func (g *Logger) Warn(msg string, args ...any)  { g.log(slog.LevelWarn, msg, args) }
func (g *Logger) Error(msg string, args ...any) { g.log(slog.LevelError, msg, args) }

func (g *Logger) log(level slog.Level, msg string, args []any) {
	ctx := context.Background()
	if !g.l.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 1+len(args)/2)
	if g.name != "" {
		attrs = append(attrs, slog.String(NameKey, g.name))
	}
	attrs = appendPairs(attrs, args)
	g.l.LogAttrs(ctx, level, msg, attrs...)
}

// appendPairs turns hclog's alternating keys and values into attributes:
// a key that is no string is formatted as one, a value left without a
// key is kept under EXTRA_VALUE_AT_END (hclog's own name for it).
func appendPairs(attrs []slog.Attr, args []any) []slog.Attr {
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			attrs = append(attrs, slog.Any("EXTRA_VALUE_AT_END", value(args[i])))
			break
		}
		key, ok := args[i].(string)
		if !ok {
			key = fmt.Sprint(args[i])
		}
		attrs = append(attrs, slog.Any(key, value(args[i+1])))
	}
	return attrs
}

// value renders hclog's formatting types as hclog does; everything else
// is the handler's to format (an error as its message).
func value(v any) any {
	switch v := v.(type) {
	case hclog.Format:
		if len(v) == 0 {
			return ""
		}
		if f, ok := v[0].(string); ok {
			return fmt.Sprintf(f, v[1:]...)
		}
		return fmt.Sprint(v...)
	case hclog.Hex:
		return "0x" + strconv.FormatUint(uint64(v), 16)
	case hclog.Octal:
		return "0" + strconv.FormatUint(uint64(v), 8)
	case hclog.Binary:
		return "0b" + strconv.FormatUint(uint64(v), 2)
	case hclog.Quote:
		return strconv.Quote(string(v))
	}
	return v
}

func (g *Logger) enabled(l slog.Level) bool { return g.l.Enabled(context.Background(), l) }

func (g *Logger) IsTrace() bool { return g.enabled(LevelTrace) }
func (g *Logger) IsDebug() bool { return g.enabled(slog.LevelDebug) }
func (g *Logger) IsInfo() bool  { return g.enabled(slog.LevelInfo) }
func (g *Logger) IsWarn() bool  { return g.enabled(slog.LevelWarn) }
func (g *Logger) IsError() bool { return g.enabled(slog.LevelError) }

// ImpliedArgs returns the pairs given to With, in order.
func (g *Logger) ImpliedArgs() []any { return append([]any(nil), g.implied...) }

// With returns a logger whose records carry args (key, value pairs) too.
func (g *Logger) With(args ...any) hclog.Logger {
	if len(args) == 0 {
		return g
	}
	attrs := appendPairs(nil, args)
	as := make([]any, len(attrs))
	for i, a := range attrs {
		as[i] = a
	}
	return &Logger{l: g.l.With(as...), name: g.name, implied: append(g.ImpliedArgs(), args...)}
}

// Name is the logger's name ("" for New's).
func (g *Logger) Name() string { return g.name }

// Named returns a logger named name under g's name, joined by a dot as
// hclog joins them.
func (g *Logger) Named(name string) hclog.Logger {
	if g.name != "" {
		name = g.name + "." + name
	}
	return g.ResetNamed(name)
}

// ResetNamed returns a logger named name, whatever g's name.
func (g *Logger) ResetNamed(name string) hclog.Logger {
	return &Logger{l: g.l, name: name, implied: g.implied}
}

// SetLevel does nothing: the level is the slog handler's (a
// slog.LevelVar that the program owns).
func (g *Logger) SetLevel(hclog.Level) {}

// GetLevel is the lowest hclog level the handler takes now; Off if none.
func (g *Logger) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if g.enabled(Level(l)) {
			return l
		}
	}
	return hclog.Off
}

// StandardLogger returns a log.Logger whose lines are records of g
// (StandardWriter).
func (g *Logger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(g.StandardWriter(opts), "", 0)
}

// StandardWriter returns a writer that makes each line written to it a
// record of g: at opts.ForceLevel if set; else, with InferLevels, at the
// level of a leading [TRACE], [DEBUG], [INFO], [WARN] or [ERROR] (or
// [ERR]; with InferLevelsWithTimestamp after a timestamp), which is
// stripped; else at Info.
func (g *Logger) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	w := &stdWriter{g: g}
	if opts != nil {
		w.opts = *opts
	}
	return w
}

type stdWriter struct {
	g    *Logger
	opts hclog.StandardLoggerOptions
}

func (w *stdWriter) Write(p []byte) (int, error) {
	for line := range bytes.SplitSeq(bytes.TrimRight(p, "\n"), []byte("\n")) {
		level, msg := w.level(string(line))
		w.g.log(level, msg, nil)
	}
	return len(p), nil
}

// level picks a line's level and strips its level prefix.
func (w *stdWriter) level(line string) (slog.Level, string) {
	if w.opts.ForceLevel != hclog.NoLevel {
		_, rest, ok := prefixLevel(line)
		if !ok {
			rest = line
		}
		return Level(w.opts.ForceLevel), rest
	}
	if !w.opts.InferLevels {
		return slog.LevelInfo, line
	}
	if l, rest, ok := prefixLevel(line); ok {
		return Level(l), rest
	}
	if w.opts.InferLevelsWithTimestamp {
		if i := strings.Index(line, "["); i > 0 {
			if l, rest, ok := prefixLevel(line[i:]); ok {
				return Level(l), rest
			}
		}
	}
	return slog.LevelInfo, line
}

// prefixLevel reads a leading "[LEVEL] ".
func prefixLevel(line string) (hclog.Level, string, bool) {
	for _, p := range []struct {
		tag   string
		level hclog.Level
	}{{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info}, {"[WARN]", hclog.Warn}, {"[ERROR]", hclog.Error}, {"[ERR]", hclog.Error}} {
		if rest, ok := strings.CutPrefix(line, p.tag); ok {
			return p.level, strings.TrimSpace(rest), true
		}
	}
	return hclog.NoLevel, line, false
}
