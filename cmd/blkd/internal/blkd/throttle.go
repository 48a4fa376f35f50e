package blkd

import (
	"context"
)

// Background copies and the node's rebuild rate (docs/snapshots.md §1.8,
// §5.3): a snapshot's export and a clone's flatten take disk bandwidth
// from hosts as a rebuild's copier does, so they draw their bytes from
// the same limiter (--rebuild-rate, repl.Limiter), and the rate bounds
// all of a node's background copies together. Without a limiter
// (--rebuild-rate 0) a copy costs a nil check per 1 MiB read (export)
// or per batch of up to 32 clusters (flatten).

// copyLimiter is what a background copy draws its bytes from: the
// node's *repl.Limiter, shared with its rebuilds (a fake in tests).
type copyLimiter interface {
	// Wait reserves n bytes and returns when their turn comes, or with
	// ctx's cause once ctx ends.
	Wait(ctx context.Context, n uint64) error
}

// copyLimit is the node's limiter, or nil (unlimited) when
// --rebuild-rate is 0: a nil interface, never a nil *repl.Limiter in
// one, so the callers' nil check is the whole cost of no limit.
func (d *Daemon) copyLimit() copyLimiter {
	if d.repl.limit == nil {
		return nil
	}
	return d.repl.limit
}
