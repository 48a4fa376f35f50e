package blkd

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/blk-project/blk/internal/logrec"
	"github.com/blk-project/blk/internal/ratelog"
)

// TestRaftLogger: raft's records are the event log's, with
// component=raft and the node's ID; its Info chatter is Debug but for
// leadership and membership; its "node" attribute does not replace the
// node ID; the level follows the event log's LevelVar (SIGHUP's reload)
// and a flood of one message is rate-limited.
func TestRaftLogger(t *testing.T) {
	var buf bytes.Buffer
	level := new(slog.LevelVar)
	l := newLogs(Config{NodeID: "n1", LogFormat: "json", LogLevel: "info", LogOutput: &buf}.WithDefaults(), level)
	raft := raftLogger(l.event)

	raft.Info("entering leader state", "leader", "Node at 127.0.0.1:7000 [Leader]")
	raft.Info("entering candidate state", "node", "Node at 127.0.0.1:7000 [Candidate]", "term", 2)
	raft.Info("pipelining replication", "peer", "{Voter n2 127.0.0.1:7001}") // chatter
	raft.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "")
	raft.Debug("vote granted")
	rs := logrec.TakeJSON(t, &buf)
	if len(rs) != 3 {
		t.Fatalf("%d records at info, want the two on leadership and the warning: %v", len(rs), rs)
	}
	if r := rs[0]; r["msg"] != "entering leader state" || r["level"] != "INFO" || r["component"] != "raft" || r["node"] != "n1" || r["leader"] != "Node at 127.0.0.1:7000 [Leader]" {
		t.Errorf("leader record %v", r)
	}
	if r := rs[1]; r["node"] != "n1" || r["raft_node"] != "Node at 127.0.0.1:7000 [Candidate]" || r["term"] != float64(2) {
		t.Errorf("candidate record %v: raft's node attribute must not replace the node ID", r)
	}
	if r := rs[2]; r["level"] != "WARN" || r["component"] != "raft" {
		t.Errorf("warning %v", r)
	}
	if !raft.IsWarn() || raft.IsDebug() {
		t.Errorf("at info: IsWarn %v IsDebug %v", raft.IsWarn(), raft.IsDebug())
	}

	level.Set(slog.LevelDebug) // what Reload does
	raft.Info("pipelining replication", "peer", "n2")
	raft.Debug("vote granted")
	rs = logrec.TakeJSON(t, &buf)
	if len(rs) != 2 || rs[0]["msg"] != "pipelining replication" || rs[0]["level"] != "DEBUG" || rs[1]["msg"] != "vote granted" {
		t.Errorf("at debug: %v", rs)
	}
	if !raft.IsDebug() {
		t.Error("IsDebug false at debug")
	}

	level.Set(slog.LevelError)
	raft.Warn("failed to contact", "server-id", "n2")
	for range logBurst + 10 {
		raft.Error("failed to heartbeat to", "peer", "127.0.0.1:7001")
	}
	l.rl.Flush()
	rs = logrec.TakeJSON(t, &buf)
	if len(rs) != logBurst+1 {
		t.Fatalf("%d records at error for %d failures, want %d and a count", len(rs), logBurst+10, logBurst)
	}
	if last := rs[len(rs)-1]; last["msg"] != ratelog.SuppressedMsg || last["event"] != "failed to heartbeat to" || last["suppressed"] != float64(10) {
		t.Errorf("summary %v", last)
	}
}
