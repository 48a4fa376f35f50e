package blkd

import (
	"log/slog"
	"os"
	"time"

	"github.com/blk-project/blk/internal/ratelog"
)

// The event log's rate limit: per kind of event (its message), at most
// logBurst records per logInterval, then one "suppressed similar events"
// record with the count. A host hammering Connect with a bad NQN costs
// 20 lines per 10 s, not one per attempt.
const (
	logBurst    = 20
	logInterval = 10 * time.Second
)

// newLogger builds the event log of cfg (a valid Config with defaults):
// the target's and the RDMA port's events, as text or JSON lines on
// LogOutput (standard error), rate-limited, each with the node's ID.
func newLogger(cfg Config) (*slog.Logger, *ratelog.Handler) {
	w := cfg.LogOutput
	if w == nil {
		w = os.Stderr
	}
	level, _ := parseLevel(cfg.LogLevel)
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	rl := ratelog.New(h, ratelog.Options{Burst: logBurst, Interval: logInterval})
	return slog.New(rl).With("node", cfg.NodeID), rl
}
