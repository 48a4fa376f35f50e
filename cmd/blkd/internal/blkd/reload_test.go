package blkd

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// reloadDaemon is a Daemon with only what Reload needs: its config and
// its logs (JSON on out) at level.
func reloadDaemon(out *bytes.Buffer, level string) *Daemon {
	d := &Daemon{cfg: Config{LogFormat: "json", LogLevel: level, LogOutput: out}.WithDefaults(), level: new(slog.LevelVar)}
	d.log, d.rl, d.audit = newLoggerLevel(d.cfg, d.level)
	return d
}

// TestReloadLogLevel: Reload changes the event log's level in place,
// says so in the audit log whatever the level, and names the fields
// that need a restart without applying them.
func TestReloadLogLevel(t *testing.T) {
	var out bytes.Buffer
	d := reloadDaemon(&out, "info")
	d.log.Debug("before")
	if strings.Contains(out.String(), "before") {
		t.Fatalf("debug line at info:\n%s", out.String())
	}

	cfg := d.cfg
	cfg.LogLevel = "debug"
	restart, err := d.Reload(cfg)
	if err != nil || len(restart) != 0 {
		t.Fatalf("Reload = %v, %v; want no field, nil", restart, err)
	}
	d.log.Debug("after")
	recs := records(t, out.String())
	if !hasRecord(recs, "reload: log level changed", "from", "info", "to", "debug") || !hasRecord(recs, "after") {
		t.Fatalf("after a reload to debug:\n%s", out.String())
	}

	// To error, with two fields that need a restart: the audit record
	// still shows, the log format stays JSON, warn is filtered out.
	out.Reset()
	cfg.LogLevel, cfg.LogFormat, cfg.APIAddr = "error", "text", "127.0.0.1:1"
	restart, err = d.Reload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(restart, []string{"api_addr", "log_format"}) {
		t.Fatalf("needs restart %v, want [api_addr log_format]", restart)
	}
	d.log.Warn("filtered")
	recs = records(t, out.String())
	if !hasRecord(recs, "reload: log level changed", "from", "debug", "to", "error") || hasRecord(recs, "filtered") {
		t.Fatalf("after a reload to error:\n%s", out.String())
	}
	if d.cfg.APIAddr == "127.0.0.1:1" || d.cfg.LogFormat != "json" {
		t.Fatalf("Reload changed the running config: %+v", d.cfg)
	}

	// An invalid config changes nothing.
	out.Reset()
	cfg.LogLevel = "loud"
	if _, err := d.Reload(cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("Reload(log_level loud) = %v, want ErrConfig", err)
	}
	if d.level.Level() != slog.LevelError || out.Len() != 0 {
		t.Fatalf("invalid reload applied: level %v, log %q", d.level.Level(), out.String())
	}
}

// records decodes the JSON lines of s.
func records(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		out = append(out, m)
	}
	return out
}

// hasRecord reports whether a record has msg and the key/value pairs kv.
func hasRecord(recs []map[string]any, msg string, kv ...string) bool {
	for _, r := range recs {
		if r["msg"] != msg {
			continue
		}
		ok := true
		for i := 0; i+1 < len(kv); i += 2 {
			if r[kv[i]] != kv[i+1] {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func TestConfigDiff(t *testing.T) {
	a := Config{}.WithDefaults()
	b := a
	f := false
	b.Bootstrap, b.LogLevel, b.Zone = &f, "debug", "r1"
	if got := configDiff(a, b, "log_level"); !slices.Equal(got, []string{"bootstrap", "zone"}) {
		t.Fatalf("configDiff = %v, want [bootstrap zone]", got)
	}
	if got := configDiff(a, a); len(got) != 0 {
		t.Fatalf("configDiff(a, a) = %v", got)
	}
}
