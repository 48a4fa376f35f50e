// Package logrec is a log/slog handler for tests that keeps every record,
// its attributes as strings, so that a test can check what a component
// logged: take what came so far and compare it with what it wants, or
// wait for a record that another goroutine logs.
//
// What this package must never do: be imported by anything but tests (it
// keeps records without a bound, and fails tests).
package logrec

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// Recorder is a slog.Handler that keeps every record, at every level. The
// zero value is ready to use; attributes given through WithAttrs and
// groups are dropped.
type Recorder struct {
	mu   sync.Mutex
	recs []Record
}

// Record is one kept record.
type Record struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string // each value as slog.Value.String gives it
}

func (l Record) String() string {
	return fmt.Sprintf("%v %q %v", l.Level, l.Msg, l.Attrs)
}

func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *Recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *Recorder) WithGroup(string) slog.Handler            { return r }
func (r *Recorder) Handle(_ context.Context, x slog.Record) error {
	m := map[string]string{}
	x.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	r.mu.Lock()
	r.recs = append(r.recs, Record{x.Level, x.Message, m})
	r.mu.Unlock()
	return nil
}

// Take returns the records kept so far and forgets them.
func (r *Recorder) Take() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.recs
	r.recs = nil
	return out
}

// Records returns a copy of the records kept so far.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.recs...)
}

// Len is the number of records kept.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

// Count is the number of records kept with message msg.
func (r *Recorder) Count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.recs {
		if x.Msg == msg {
			n++
		}
	}
	return n
}

// Wait returns the first record kept with message msg and the attributes
// kv (key, value, key, value...), polling every 10 ms for up to 10 s; it
// fails t if none comes.
func (r *Recorder) Wait(t testing.TB, msg string, kv ...string) Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		for _, x := range r.recs {
			ok := x.Msg == msg
			for i := 0; ok && i+1 < len(kv); i += 2 {
				ok = x.Attrs[kv[i]] == kv[i+1]
			}
			if ok {
				r.mu.Unlock()
				return x
			}
		}
		all := fmt.Sprint(r.recs)
		r.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no %q record with %v within 10 s; records: %s", msg, kv, all)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Rec is the record at level l with message msg and the attributes kv
// (key, value, key, value...), for Expect.
func Rec(l slog.Level, msg string, kv ...string) Record {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return Record{l, msg, m}
}

// Expect checks that recs are exactly the messages of want, in order,
// each at its level and with at least its attributes; what names the
// step in the failure.
func Expect(t testing.TB, what string, recs []Record, want ...Record) {
	t.Helper()
	if len(recs) != len(want) {
		t.Fatalf("%s: %d records %v, want %d %v", what, len(recs), recs, len(want), want)
	}
	for i, w := range want {
		g := recs[i]
		if g.Msg != w.Msg || g.Level != w.Level {
			t.Errorf("%s: record %d is %v, want %v", what, i, g, w)
			continue
		}
		for k, v := range w.Attrs {
			if g.Attrs[k] != v {
				t.Errorf("%s: record %d (%s) has %s=%q, want %q (%v)", what, i, g.Msg, k, g.Attrs[k], v, g.Attrs)
			}
		}
	}
}

// TakeJSON decodes the JSON lines a slog.JSONHandler wrote to buf, one
// record a line (blank lines passed over), and empties buf; a line that
// is not JSON fails t.
func TakeJSON(t testing.TB, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%v: %q", err, l)
		}
		out = append(out, m)
	}
	buf.Reset()
	return out
}

// Buffer is log output that goroutines or a child process write while a
// test reads it: a bytes.Buffer behind a mutex. The zero value is ready
// to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TakeJSON is TakeJSON on what was written so far: the records, and
// the buffer emptied.
func (b *Buffer) TakeJSON(t testing.TB) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	return TakeJSON(t, &b.b)
}
