package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Options bound a Handler. Zero fields take the defaults.
type Options struct {
	// Burst is how many records with the same message and level are
	// passed on per Interval. Default 20.
	Burst int
	// Interval is the window the Burst applies to, started by the first
	// record of a kind. Default 10 s.
	Interval time.Duration
}

// Defaults.
const (
	DefaultBurst    = 20
	DefaultInterval = 10 * time.Second
)

// SuppressedMsg is the message of the summary record written at the end
// of a window in which records were held back. Its attributes are
// "event" (the message of the records held back), "suppressed" (how
// many) and "interval"; its level is the highest of theirs.
const SuppressedMsg = "suppressed similar events"

// maxKinds bounds the windows kept: maxKinds-1 messages tracked one by
// one, and the window of otherKind that records of further messages
// share.
const (
	maxKinds  = 256
	otherKind = "(other messages)"
)

// Handler is a slog.Handler that rate-limits records by message (and
// level) before passing them to the handler it wraps. Handlers derived with WithAttrs
// and WithGroup share its windows. It is safe for concurrent use.
type Handler struct {
	next slog.Handler
	s    *state
}

type state struct {
	burst    int
	interval time.Duration
	now      func() time.Time
	after    func(time.Duration, func())

	mu    sync.Mutex
	kinds map[kind]*window
}

// kind is what records are counted by: the message and the level, so
// that a flood of debug records does not hold back warnings with the
// same message.
type kind struct {
	msg   string
	level slog.Level
}

// window is one message's current interval.
type window struct {
	start      time.Time
	gen        uint64 // counts windows; a summary timer names the one it is for
	passed     int
	suppressed int
	level      slog.Level   // highest level held back
	h          slog.Handler // writes the summary (the first suppressor's)
}

// New returns a Handler that passes records to next within o's bounds.
func New(next slog.Handler, o Options) *Handler {
	return newHandler(next, o, time.Now, func(d time.Duration, f func()) { time.AfterFunc(d, f) })
}

func newHandler(next slog.Handler, o Options, now func() time.Time, after func(time.Duration, func())) *Handler {
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	return &Handler{next: next, s: &state{burst: o.Burst, interval: o.Interval, now: now, after: after,
		kinds: make(map[kind]*window)}}
}

// Enabled reports whether the wrapped handler takes records of level l.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// WithAttrs implements slog.Handler; the result shares h's windows.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(as), s: h.s}
}

// WithGroup implements slog.Handler; the result shares h's windows.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), s: h.s}
}

// Handle passes r on unless its message has had Burst records in the
// current window. A window that ended with records held back has its
// summary written first.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	s := h.s
	now := s.now()
	s.mu.Lock()
	key := kind{r.Message, r.Level}
	w := s.kinds[key]
	if w == nil {
		// One slot is kept for the shared window.
		if len(s.kinds) >= maxKinds-1 {
			s.prune(now)
		}
		if len(s.kinds) >= maxKinds-1 {
			key = kind{msg: otherKind}
			w = s.kinds[key]
		}
		if w == nil {
			w = &window{}
			s.kinds[key] = w
		}
	}
	var sum *slog.Record
	var sumH slog.Handler
	if w.start.IsZero() || now.Sub(w.start) >= s.interval {
		sum, sumH = s.end(key, w, now)
		w.start = now
		w.gen++
	}
	pass := w.passed < s.burst
	if pass {
		w.passed++
	} else {
		if w.suppressed == 0 {
			w.h, w.level = h.next, r.Level
			gen := w.gen
			s.after(w.start.Add(s.interval).Sub(now), func() { s.flush(key, gen) })
		}
		w.suppressed++
		w.level = max(w.level, r.Level)
	}
	s.mu.Unlock()
	var err error
	if sum != nil {
		err = sumH.Handle(ctx, *sum)
	}
	if pass {
		err = h.next.Handle(ctx, r)
	}
	return err
}

// end closes w's window: it returns the summary record to write (nil if
// nothing was held back) and resets the counts. Requires s.mu.
func (s *state) end(key kind, w *window, now time.Time) (*slog.Record, slog.Handler) {
	var sum *slog.Record
	h := w.h
	if w.suppressed > 0 {
		r := slog.NewRecord(now, w.level, SuppressedMsg, 0)
		r.AddAttrs(slog.String("event", key.msg), slog.Int("suppressed", w.suppressed), slog.Duration("interval", s.interval))
		sum = &r
	}
	w.passed, w.suppressed, w.h = 0, 0, nil
	return sum, h
}

// flush writes the summary of window gen of key, if it is still the
// current window (a record after the window's end may have written it
// already). The window is over: the next record starts a new one.
func (s *state) flush(key kind, gen uint64) {
	s.mu.Lock()
	w := s.kinds[key]
	if w == nil || w.gen != gen || w.suppressed == 0 {
		s.mu.Unlock()
		return
	}
	sum, h := s.end(key, w, s.now())
	w.start = time.Time{}
	s.mu.Unlock()
	if sum != nil {
		_ = h.Handle(context.Background(), *sum)
	}
}

// prune forgets the windows with nothing held back that have ended.
// Requires s.mu.
func (s *state) prune(now time.Time) {
	for k, w := range s.kinds {
		if w.suppressed == 0 && (w.start.IsZero() || now.Sub(w.start) >= s.interval) {
			delete(s.kinds, k)
		}
	}
}

// Flush writes the summaries of every window with records held back, at
// once (blkd calls it when it stops, so that no count is lost).
func (h *Handler) Flush() {
	s := h.s
	type pending struct {
		r slog.Record
		h slog.Handler
	}
	var out []pending
	s.mu.Lock()
	now := s.now()
	for k, w := range s.kinds {
		if w.suppressed == 0 {
			continue
		}
		sum, wh := s.end(k, w, now)
		w.start = time.Time{}
		out = append(out, pending{*sum, wh})
	}
	s.mu.Unlock()
	for _, p := range out {
		_ = p.h.Handle(context.Background(), p.r)
	}
}
