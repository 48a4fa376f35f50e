package hclogslog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/blk-project/blk/internal/importtest"
	"github.com/blk-project/blk/internal/logrec"
	"github.com/hashicorp/go-hclog"
)

func newJSON(level slog.Leveler) (*bytes.Buffer, *Logger) {
	var buf bytes.Buffer
	return &buf, New(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level})))
}

// TestLevels: each hclog level lands at its slog level, below the
// handler's level nothing is written, and a change of the handler's
// LevelVar applies at once (IsX and GetLevel follow it, SetLevel does
// not touch it).
func TestLevels(t *testing.T) {
	var lv slog.LevelVar
	lv.Set(LevelTrace)
	buf, g := newJSON(&lv)
	g.Trace("t")
	g.Debug("d")
	g.Info("i")
	g.Warn("w")
	g.Error("e")
	g.Log(hclog.NoLevel, "n")
	g.Log(hclog.Off, "off")
	want := []struct{ msg, level string }{{"t", "DEBUG-4"}, {"d", "DEBUG"}, {"i", "INFO"}, {"w", "WARN"}, {"e", "ERROR"}, {"n", "INFO"}}
	rs := logrec.TakeJSON(t, buf)
	if len(rs) != len(want) {
		t.Fatalf("%d records, want %d: %v", len(rs), len(want), rs)
	}
	for i, w := range want {
		if rs[i]["msg"] != w.msg || rs[i]["level"] != w.level {
			t.Errorf("record %d: %v, want msg %q at %s", i, rs[i], w.msg, w.level)
		}
	}
	if !g.IsTrace() || g.GetLevel() != hclog.Trace {
		t.Errorf("at trace: IsTrace %v, GetLevel %v", g.IsTrace(), g.GetLevel())
	}

	lv.Set(slog.LevelWarn)
	g.SetLevel(hclog.Trace) // the handler's level rules
	g.Info("hidden")
	g.Debug("hidden")
	g.Warn("shown")
	if rs := logrec.TakeJSON(t, buf); len(rs) != 1 || rs[0]["msg"] != "shown" {
		t.Errorf("at warn: %v", rs)
	}
	if g.IsTrace() || g.IsDebug() || g.IsInfo() || !g.IsWarn() || !g.IsError() || g.GetLevel() != hclog.Warn {
		t.Errorf("at warn: IsTrace %v IsDebug %v IsInfo %v IsWarn %v IsError %v GetLevel %v",
			g.IsTrace(), g.IsDebug(), g.IsInfo(), g.IsWarn(), g.IsError(), g.GetLevel())
	}
	lv.Set(slog.LevelError + 8)
	if g.GetLevel() != hclog.Off {
		t.Errorf("nothing enabled: GetLevel %v, want Off", g.GetLevel())
	}
}

// TestNamesAndAttrs: Named joins names with dots into the logger
// attribute, ResetNamed replaces it, With's pairs ride on every record
// of the derived logger (and only there), and hclog's argument forms
// (a non-string key, a value without a key, Format, Hex, errors) come
// out readable.
func TestNamesAndAttrs(t *testing.T) {
	buf, g := newJSON(slog.LevelDebug)
	n := g.Named("raft").Named("net")
	if n.Name() != "raft.net" || g.Name() != "" {
		t.Fatalf("names %q %q", n.Name(), g.Name())
	}
	w := n.With("peer", "n2", "term", 3)
	if got := w.ImpliedArgs(); len(got) != 4 || got[0] != "peer" || got[3] != 3 {
		t.Errorf("ImpliedArgs %v", got)
	}
	w.Info("append", "index", 7, 42, "odd key", "error", errors.New("boom"), "fmt", hclog.Fmt("%d-%s", 1, "x"), "hex", hclog.Hex(255), "extra")
	r := w.ResetNamed("other")
	r.Warn("reset")
	g.Info("plain")
	rs := logrec.TakeJSON(t, buf)
	if len(rs) != 3 {
		t.Fatalf("%d records: %v", len(rs), rs)
	}
	first := rs[0]
	for k, v := range map[string]any{"logger": "raft.net", "peer": "n2", "term": float64(3), "index": float64(7), "42": "odd key",
		"error": "boom", "fmt": "1-x", "hex": "0xff", "EXTRA_VALUE_AT_END": "extra"} {
		if first[k] != v {
			t.Errorf("record %v: %s = %v, want %v", first, k, first[k], v)
		}
	}
	if rs[1]["logger"] != "other" || rs[1]["peer"] != "n2" || rs[1]["level"] != "WARN" {
		t.Errorf("ResetNamed record %v", rs[1])
	}
	if _, ok := rs[2]["logger"]; ok || rs[2]["peer"] != nil {
		t.Errorf("the root logger's record carries the derived ones' attributes: %v", rs[2])
	}
}

// TestStandardLogger: the standard logger's lines become records, at
// Info by default, at the level of their [LEVEL] prefix with
// InferLevels (prefix stripped), at ForceLevel when set; the text
// handler shows the name and the message as one stream would.
func TestStandardLogger(t *testing.T) {
	buf, g := newJSON(slog.LevelDebug)
	named := g.Named("raft")
	named.StandardLogger(nil).Print("plain line")
	named.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}).Print("[ERR] broken pipe")
	named.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}).Print("[DEBUG] chatter")
	named.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true, InferLevelsWithTimestamp: true}).Print("2026/11/27 10:00:00 [WARN] late")
	named.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Error}).Print("[INFO] forced")
	if _, err := named.StandardWriter(nil).Write([]byte("two\nlines\n")); err != nil {
		t.Fatal(err)
	}
	want := []struct{ msg, level string }{{"plain line", "INFO"}, {"broken pipe", "ERROR"}, {"chatter", "DEBUG"}, {"late", "WARN"}, {"forced", "ERROR"}, {"two", "INFO"}, {"lines", "INFO"}}
	rs := logrec.TakeJSON(t, buf)
	if len(rs) != len(want) {
		t.Fatalf("%d records, want %d: %v", len(rs), len(want), rs)
	}
	for i, w := range want {
		if rs[i]["msg"] != w.msg || rs[i]["level"] != w.level || rs[i]["logger"] != "raft" {
			t.Errorf("record %d: %v, want msg %q at %s from logger raft", i, rs[i], w.msg, w.level)
		}
	}

	var text bytes.Buffer
	tg := New(slog.New(slog.NewTextHandler(&text, nil)).With("component", "raft"))
	tg.Info("entering leader state", "leader", "127.0.0.1:7000")
	tg.Debug("below the level")
	if got := text.String(); !strings.Contains(got, `level=INFO msg="entering leader state" component=raft leader=127.0.0.1:7000`) || strings.Contains(got, "below") {
		t.Errorf("text: %q", got)
	}
}

// TestImports: the adapter depends on no blk package.
func TestImports(t *testing.T) { importtest.Only(t, ".") }
