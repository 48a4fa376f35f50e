package blkd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/repl"
)

// Boot IDs. A replica acknowledges a write once its store has it, but
// not durably: the store's map of a newly written cluster is committed
// without a sync until the next Flush (store.go commit), so a replica
// whose process dies (SIGKILL, a crash, a power cut) may come back
// without writes it acknowledged. The primary's dirty-region log of a
// replica (repl/drl.go) counts a leg that completed as landed, so after
// such a death it under-reports what the replica lacks: cmd/blkd
// TestReplication found a returned replica, rebuilt incrementally and
// counted in sync, missing a block the host had written (one run in
// ten, under load).
//
// So every blkd run has a random boot ID (GET /v1/internal/boot). A
// primary fetches a replica's before it connects its leg there and keeps
// it (primaryLeg.boots); a rebuild that would copy from the log fetches
// it again once its own connection is up, and if the run differs (or
// either is unknown) the log is dropped and the rebuild compares
// instead (repl/resync.go), which finds whatever the replica lost. Why
// the order: the run that answers after the rebuild's connection was
// made is the one that connection reaches (a run that died meanwhile
// breaks it, and the rebuild fails); and equal IDs mean the run that
// answered before the leg connected is still up, so it is the one the
// leg wrote to, and it lost nothing.

// bootTimeout bounds a boot ID request.
const bootTimeout = 2 * time.Second

// bootAnswer is the body of GET /v1/internal/boot.
type bootAnswer struct {
	Node string `json:"node"`
	Boot string `json:"boot"`
}

// newBootID is 16 random bytes in hex.
func newBootID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// internalBoot serves GET /v1/internal/boot.
func (d *Daemon) internalBoot(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, bootAnswer{Node: d.cfg.NodeID, Boot: d.boot})
	return nil
}

// bootOf is node's boot ID, "" if it cannot be had (an older binary,
// without meta.FeatureDigests; the node not answering).
func (d *Daemon) bootOf(ctx context.Context, node string) string {
	var n meta.NodeInfo
	var ok bool
	d.node.FSM().Read(func(s *meta.State) { n, ok = s.Node(node) })
	if !ok || !n.HasFeature(meta.FeatureDigests) {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	var a bootAnswer
	if err := d.getPeer(ctx, n.MgmtAddr, "/v1/internal/boot", &a); err != nil || a.Node != node {
		return ""
	}
	return a.Boot
}

// watchLeg drops node's peer from pl's backend as soon as c, the
// connection its leg (or rebuild) writes through as ns, is lost for good
// (legConfig sets NoReconnect): without a command failing on it, a
// replica that went away while idle would stay counted in sync until the
// next write, and one whose process restarted meanwhile may have lost
// writes it acknowledged. A connection closed on purpose is not a loss.
func (d *Daemon) watchLeg(ctx context.Context, pl *primaryLeg, volume, node string, c *initiator.Controller, ns repl.Leg) {
	select {
	case <-c.Down():
	case <-ctx.Done():
		return
	}
	// The association is down; the controller is Lost once its
	// supervisor tore it down, or Closed if that was us.
	for i := 0; i < 200; i++ {
		if st := c.State(); st == initiator.StateLost || st == initiator.StateClosed {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
	if c.State() != initiator.StateLost {
		return
	}
	if pl.b.LegLost(node, ns, fmt.Errorf("%w: its connection was lost (the replica's node or process went away)", initiator.ErrControllerLost)) {
		d.log.Warn("replica connection lost while no write failed on it: reporting it out of sync", slog.String("volume", volume), slog.String("node", node), slog.Uint64("epoch", pl.epoch))
	}
}

// nodeHas says whether node registered feature f, as this node's
// registry copy has it.
func (d *Daemon) nodeHas(node, f string) bool {
	var has bool
	d.node.FSM().Read(func(s *meta.State) {
		if n, ok := s.Node(node); ok {
			has = n.HasFeature(f)
		}
	})
	return has
}
