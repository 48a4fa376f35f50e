package main

import (
	"strings"
	"testing"

	"github.com/blk-project/blk/internal/logline"
)

// TestLogStream: blkd writes everything to its standard error, as
// records of its one log, and nothing to standard output (launchBlkd
// fails the test otherwise). At --log-level error the start-up events
// (listening) are filtered, but ready, shutting down and stopped are
// written: an operator always sees that the node serves and that it
// stopped. Raft's records are in the same format, with component=raft.
func TestLogStream(t *testing.T) {
	d := startBlkd(t, t.TempDir(), "--log-level", "error", "--log-format", "json")
	d.stop(t)
	out := d.output()
	for _, msg := range []string{"ready", "shutting down", "stopped"} {
		if _, ok := logline.Find(out, msg, "node", "node1", "level", "INFO"); !ok {
			t.Errorf("no %q record at --log-level error:\n%s", msg, out)
		}
	}
	if _, ok := logline.Find(out, "listening"); ok {
		t.Errorf("an info event at --log-level error:\n%s", out)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		if _, ok := logline.Fields(line); !ok || !strings.HasPrefix(line, "{") {
			t.Errorf("a line that is no JSON record: %q", line)
		}
	}
	if d.stdoutText() != "" {
		t.Errorf("standard output: %q", d.stdoutText())
	}

	// At the default level (info, text) the start-up events and raft's
	// leadership records are there, one listening record per port.
	d = startBlkd(t, t.TempDir())
	d.stop(t)
	out = d.output()
	for _, port := range []string{"raft", "api", "nvme-tcp", "nvme-rdma"} {
		if _, ok := logline.Find(out, "listening", "port", port); !ok {
			t.Errorf("no listening record for %s:\n%s", port, out)
		}
	}
	if _, ok := logline.Find(out, "entering leader state", "component", "raft", "node", "node1"); !ok {
		t.Errorf("raft's leadership record missing or not in blkd's format:\n%s", out)
	}
	if strings.Contains(out, "[INFO]") || strings.Contains(out, "raft/node1") {
		t.Errorf("hclog's own format in the log:\n%s", out)
	}
}
