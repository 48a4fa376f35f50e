package blkd

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestLogger: the event log is JSON or text at the configured level,
// carries the node ID, and holds back a flood of one kind past logBurst,
// reporting the count when flushed.
func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	log, rl := newLogger(Config{NodeID: "n7", LogFormat: "json", LogLevel: "warn", LogOutput: &buf}.WithDefaults())
	log.Info("controller created") // below the level
	for range logBurst + 15 {
		log.Warn("connect refused", "host_nqn", "nqn.2026-01.io.example:bad")
	}
	rl.Flush()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != logBurst+1 {
		t.Fatalf("%d lines, want %d refusals and a summary:\n%s", len(lines), logBurst, buf.String())
	}
	var first, last map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatal(err)
	}
	if first["msg"] != "connect refused" || first["level"] != "WARN" || first["node"] != "n7" || first["host_nqn"] != "nqn.2026-01.io.example:bad" {
		t.Errorf("first line %v", first)
	}
	if last["msg"] != "suppressed similar events" || last["event"] != "connect refused" || last["suppressed"] != float64(15) || last["node"] != "n7" {
		t.Errorf("summary line %v", last)
	}

	buf.Reset()
	log, _ = newLogger(Config{LogOutput: &buf}.WithDefaults())
	log.Debug("connection accepted")
	log.Info("controller created", "cntlid", 1)
	if got := buf.String(); !strings.Contains(got, `level=INFO msg="controller created" node=node1 cntlid=1`) || strings.Contains(got, "accepted") {
		t.Errorf("text log:\n%s", got)
	}
}
