package blkd

import (
	"context"
	"log/slog"

	"github.com/blk-project/blk/internal/hclogslog"
	"github.com/hashicorp/go-hclog"
)

// raftLogger is the hclog.Logger blkd gives raft, its network transport
// and its snapshot store (meta.Config.Logger): the event log with
// component=raft, so raft's records have the node's format, honour
// --log-level (and SIGHUP's reload of it: the level is the event log's
// LevelVar) and are rate-limited like every other event.
//
// raft is chatty at Info while it starts and elects (starting snapshots,
// pipelines, follower restarts): its Info records are written at Debug,
// except those on leadership and membership (raftInfoKept), which an
// operator reads at the default level.
func raftLogger(event *slog.Logger) hclog.Logger {
	return hclogslog.New(slog.New(raftLevels{event.Handler()}).With(slog.String("component", "raft")))
}

// raftInfoKept are the raft Info messages kept at Info: who leads, and who
// is in the cluster (hashicorp/raft v1.8.0's wording).
var raftInfoKept = map[string]bool{
	"entering candidate state":                   true,
	"election won":                               true,
	"entering leader state":                      true,
	"initial configuration":                      true,
	"updating configuration":                     true,
	"added peer, starting replication":           true,
	"removed peer, stopping replication":         true,
	"removed ourself, shutting down":             true,
	"removed ourself, transitioning to follower": true,
}

// raftLevels lowers raft's Info records to Debug but for raftInfoKept,
// and renames the attributes of raft's that would clash with blkd's own
// (raftRenamed).
type raftLevels struct{ next slog.Handler }

// raftRenamed are raft's attribute keys that blkd's records use for
// something else: raft's "node" is a description of its node ("Node at
// 127.0.0.1:7000 [Candidate]"), blkd's the node ID on every record.
var raftRenamed = map[string]string{"node": "raft_node", "component": "raft_component"}

func (h raftLevels) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h raftLevels) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo && !raftInfoKept[r.Message] {
		if !h.next.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r.Level = slog.LevelDebug
	}
	clash := false
	r.Attrs(func(a slog.Attr) bool {
		_, clash = raftRenamed[a.Key]
		return !clash
	})
	if clash {
		out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
		r.Attrs(func(a slog.Attr) bool {
			if k, ok := raftRenamed[a.Key]; ok {
				a.Key = k
			}
			out.AddAttrs(a)
			return true
		})
		r = out
	}
	return h.next.Handle(ctx, r)
}

func (h raftLevels) WithAttrs(as []slog.Attr) slog.Handler {
	return raftLevels{h.next.WithAttrs(as)}
}

func (h raftLevels) WithGroup(name string) slog.Handler {
	return raftLevels{h.next.WithGroup(name)}
}
