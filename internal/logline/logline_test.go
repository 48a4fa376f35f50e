package logline

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/importtest"
)

// TestBothFormats: the records slog's text and JSON handlers write read
// back to the same fields, quoted values and all.
func TestBothFormats(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		var h slog.Handler = slog.NewTextHandler(&buf, nil)
		if format == "json" {
			h = slog.NewJSONHandler(&buf, nil)
		}
		l := slog.New(h).With("node", "n1")
		l.Info("ready")
		l.Info("listening", "port", "nvme-tcp", "addr", "127.0.0.1:4420", "serves", "I/O and discovery")
		l.Warn("reload refused, nothing changed", "err", errors.New(`bad "x" = y`), "took", time.Second)
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: %q", format, buf.String())
		}
		if Msg(lines[0]) != "ready" || !Has(lines[0], "ready", "node", "n1") || Has(lines[0], "ready", "node", "n2") {
			t.Errorf("%s: %q", format, lines[0])
		}
		if !Has(lines[1], "listening", "port", "nvme-tcp", "addr", "127.0.0.1:4420", "serves", "I/O and discovery") {
			t.Errorf("%s: %q: %v", format, lines[1], must(Fields(lines[1])))
		}
		if f := must(Fields(lines[2])); f["err"] != `bad "x" = y` || f["level"] != "WARN" || f["msg"] != "reload refused, nothing changed" {
			t.Errorf("%s: %q: %v", format, lines[2], f)
		}
		if line, ok := Find(buf.String(), "listening", "port", "nvme-tcp"); !ok || line != lines[1] {
			t.Errorf("%s: Find: %q %v", format, line, ok)
		}
		if _, ok := Find(buf.String(), "listening", "port", "api"); ok {
			t.Errorf("%s: Find found a record that is not there", format)
		}
	}
}

func must(f map[string]string, _ bool) map[string]string { return f }

// TestNotRecords: lines of neither format, and text that merely contains
// the word, are not a record whose msg is ready.
func TestNotRecords(t *testing.T) {
	for _, line := range []string{"ready", "", "blkd: ready", `msg="ready`, "{not json", "time=1 level=INFO", "x msg=ready", `time=1 msg=not-ready`, `{"msg":"ready!"}`} {
		if Msg(line) == "ready" {
			t.Errorf("%q read as a ready record", line)
		}
	}
	if Msg(`{"time":"t","msg":"ready","n":3}`) != "ready" || Msg("time=t level=INFO msg=ready") != "ready" {
		t.Error("ready records not read")
	}
}

// TestImports: the reader depends on no blk package.
func TestImports(t *testing.T) { importtest.Only(t, ".") }
