package logrec

import (
	"bytes"
	"log/slog"
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
