package logrec

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// TestTakeJSON: each JSON line is one record, blank lines are passed
// over and the buffer is empty afterwards.
func TestTakeJSON(t *testing.T) {
	var buf bytes.Buffer
	if got := TakeJSON(t, &buf); got != nil {
		t.Fatalf("empty buffer: %v", got)
	}
	l := slog.New(slog.NewJSONHandler(&buf, nil))
	l.Info("one", "k", "v")
	buf.WriteString("\n")
	l.Warn("two", "n", 2)
	got := TakeJSON(t, &buf)
	if len(got) != 2 || got[0]["msg"] != "one" || got[0]["k"] != "v" || got[1]["msg"] != "two" || got[1]["n"] != 2.0 || got[1]["level"] != "WARN" {
		t.Fatalf("records %v", got)
	}
	if buf.Len() != 0 {
		t.Fatalf("buffer not emptied: %q", buf.String())
	}
}

// TestBuffer: writes from several goroutines all land (go test -race
// checks the locking), String shows them and TakeJSON takes them.
func TestBuffer(t *testing.T) {
	var b Buffer
	l := slog.New(slog.NewJSONHandler(&b, nil))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.Info("hello", "i", i)
			_ = b.String()
		}()
	}
	wg.Wait()
	if n := strings.Count(b.String(), `"msg":"hello"`); n != 8 {
		t.Fatalf("%d records in %q, want 8", n, b.String())
	}
	if got := b.TakeJSON(t); len(got) != 8 {
		t.Fatalf("TakeJSON: %v", got)
	}
	if s := b.String(); s != "" {
		t.Fatalf("after TakeJSON: %q", s)
	}
}
