package ratelog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// recorder keeps the records it is handed, with the attributes of
// WithAttrs first.
type recorder struct {
	mu    *sync.Mutex
	recs  *[]rec
	attrs []slog.Attr
}

type rec struct {
	msg   string
	level slog.Level
	attrs map[string]string
}

func newRecorder() recorder { return recorder{mu: new(sync.Mutex), recs: new([]rec)} }

func (r recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r recorder) WithAttrs(as []slog.Attr) slog.Handler {
	r.attrs = append(r.attrs[:len(r.attrs):len(r.attrs)], as...)
	return r
}
func (r recorder) WithGroup(string) slog.Handler { return r }
func (r recorder) Handle(_ context.Context, x slog.Record) error {
	m := map[string]string{}
	for _, a := range r.attrs {
		m[a.Key] = a.Value.String()
	}
	x.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	r.mu.Lock()
	*r.recs = append(*r.recs, rec{x.Message, x.Level, m})
	r.mu.Unlock()
	return nil
}

func (r recorder) take() []rec {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := *r.recs
	*r.recs = nil
	return out
}

// fakeClock is a manual clock with AfterFunc timers run by advance.
type fakeClock struct {
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	f  func()
}

func (c *fakeClock) Now() time.Time { return c.now }
func (c *fakeClock) after(d time.Duration, f func()) {
	c.timers = append(c.timers, fakeTimer{c.now.Add(d), f})
}
func (c *fakeClock) advance(d time.Duration) {
	c.now = c.now.Add(d)
	var due []func()
	rest := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t.f)
		} else {
			rest = append(rest, t)
		}
	}
	c.timers = rest
	for _, f := range due {
		f()
	}
}

func setup(o Options) (*slog.Logger, recorder, *fakeClock, *Handler) {
	rc := newRecorder()
	c := &fakeClock{now: time.Unix(1e9, 0)}
	h := newHandler(rc, o, c.Now, c.after)
	return slog.New(h), rc, c, h
}

func msgs(rs []rec) []string {
	var out []string
	for _, r := range rs {
		s := r.msg
		if r.msg == SuppressedMsg {
			s = fmt.Sprintf("%s event=%s suppressed=%s level=%v", r.msg, r.attrs["event"], r.attrs["suppressed"], r.level)
		}
		out = append(out, s)
	}
	return out
}

// TestSuppressAndReport: a flood of one kind passes Burst records per
// interval; the rest are counted and reported once the interval ends,
// while other kinds pass untouched.
func TestSuppressAndReport(t *testing.T) {
	log, rc, clk, _ := setup(Options{Burst: 3, Interval: 10 * time.Second})
	for i := range 50 {
		log.Warn("connect refused", "host_nqn", fmt.Sprintf("nqn.bad-%d", i))
	}
	log.Info("controller created", "cntlid", 1)
	got := rc.take()
	if len(got) != 4 || got[0].attrs["host_nqn"] != "nqn.bad-0" || got[2].attrs["host_nqn"] != "nqn.bad-2" || got[3].msg != "controller created" {
		t.Fatalf("passed %v, want the first 3 refusals and the other kind", msgs(got))
	}
	clk.advance(9 * time.Second)
	if got := rc.take(); len(got) != 0 {
		t.Fatalf("before the interval ended: %v", msgs(got))
	}
	// The interval ends: the summary comes without another record.
	clk.advance(time.Second)
	got = rc.take()
	if len(got) != 1 || got[0].msg != SuppressedMsg || got[0].attrs["event"] != "connect refused" ||
		got[0].attrs["suppressed"] != "47" || got[0].attrs["interval"] != "10s" || got[0].level != slog.LevelWarn {
		t.Fatalf("at the end of the interval: %v (%+v)", msgs(got), got)
	}
	// A new window: Burst records pass again, the count starts over.
	for range 5 {
		log.Warn("connect refused")
	}
	clk.advance(10 * time.Second)
	if got := msgs(rc.take()); len(got) != 4 || got[3] != SuppressedMsg+" event=connect refused suppressed=2 level=WARN" {
		t.Fatalf("second window: %v", got)
	}
}

// TestSummaryBeforeNextRecord: a record that arrives after the window
// ended but before its timer ran gets the summary written before it, and
// the timer then writes nothing more.
func TestSummaryBeforeNextRecord(t *testing.T) {
	log, rc, clk, _ := setup(Options{Burst: 1, Interval: time.Second})
	log.Info("connection closed")
	log.Info("connection closed")
	log.Info("connection closed")
	clk.now = clk.now.Add(2 * time.Second) // time passes; the timer has not run
	log.Info("connection closed", "n", 4)
	clk.advance(0)
	got := msgs(rc.take())
	want := []string{"connection closed", SuppressedMsg + " event=connection closed suppressed=2 level=INFO", "connection closed"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestLevelsApart: a flood of debug records does not hold back warnings
// with the same message.
func TestLevelsApart(t *testing.T) {
	log, rc, _, h := setup(Options{Burst: 2, Interval: time.Minute})
	for range 10 {
		log.Debug("connection closed", "qid", 1)
	}
	log.Info("connection closed", "qid", 0)
	h.Flush()
	got := msgs(rc.take())
	want := []string{"connection closed", "connection closed", "connection closed", SuppressedMsg + " event=connection closed suppressed=8 level=DEBUG"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestSharedAcrossWithAttrs: derived handlers count against the same
// window; the summary carries the attributes of the first suppressed
// record's handler.
func TestSharedAcrossWithAttrs(t *testing.T) {
	log, rc, _, h := setup(Options{Burst: 2, Interval: time.Minute})
	a, b := log.With("port", "a"), log.With("port", "b")
	a.Info("x")
	b.Info("x")
	b.Info("x")
	a.Info("x")
	h.Flush()
	got := rc.take()
	if len(got) != 3 || got[2].msg != SuppressedMsg || got[2].attrs["suppressed"] != "2" || got[2].attrs["port"] != "b" {
		t.Fatalf("got %+v", got)
	}
	h.Flush()
	if got := rc.take(); len(got) != 0 {
		t.Fatalf("a second Flush wrote %v", msgs(got))
	}
}

// TestKindsBounded: beyond maxKinds messages, new ones share one window.
func TestKindsBounded(t *testing.T) {
	log, rc, _, h := setup(Options{Burst: 1, Interval: time.Minute})
	for i := range maxKinds + 10 {
		log.Info(fmt.Sprintf("kind %d", i))
	}
	if n := len(h.s.kinds); n > maxKinds {
		t.Fatalf("%d kinds tracked, at most %d", n, maxKinds)
	}
	got := rc.take()
	if len(got) != maxKinds {
		t.Fatalf("%d records passed, want %d (one per tracked kind and one for the rest)", len(got), maxKinds)
	}
	h.Flush()
	if got := rc.take(); len(got) != 1 || got[0].attrs["event"] != otherKind || got[0].attrs["suppressed"] != "10" {
		t.Fatalf("summary %+v", got)
	}
}

// TestRealTimer: with the real clock the summary arrives by itself.
func TestRealTimer(t *testing.T) {
	rc := newRecorder()
	log := slog.New(New(rc, Options{Burst: 1, Interval: 20 * time.Millisecond}))
	for range 10 {
		log.Warn("connect refused")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := rc.take()
		for _, r := range got {
			if r.msg == SuppressedMsg && r.attrs["suppressed"] == "9" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no summary within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
