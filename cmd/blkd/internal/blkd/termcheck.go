package blkd

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/repl"
	"github.com/blk-project/blk/store"
)

// The term check (docs/replication.md §5, "Built: the term check"): when
// a primary's term begins (a failover, a handover, a restart of the
// primary), its in-sync replicas may hold other bytes than its own copy
// where the previous term had writes in flight: a write that reached some
// copies and not others, never acknowledged. Nothing is lost (the host
// was not told it was written), but reads would then depend on which
// copy serves them, and could change at the next failover with no write
// in between: a journal's commit block present, then gone, then present
// again. So once the term serves, its primary compares every in-sync
// replica with its own copy (repl.DivergedRegions: digests of 64 KiB
// regions, both copies read whole, at --rebuild-rate), asks the regions
// that differ again termRechecks times (one may only look different
// because a host write was on its way to one copy), and takes a replica
// whose regions still differ out of sync (repl.Backend.Diverged, as a
// missed write: recorded before any write skipping it is acknowledged).
// The rebuild loop then copies the regions that differ back from the
// primary (a compare rebuild): the primary's copy wins, as a host that
// retries its unacknowledged writes expects. Before the live copy, each
// replica's snapshot chain is compared with the primary's (termsnap.go).

const (
	// termRechecks: how many more times a differing region is compared
	// before its replica is taken out of sync.
	termRechecks = 3
	// termRecheckPause: the pause before each recheck, long enough for a
	// host write in flight to land on every copy.
	termRecheckPause = 500 * time.Millisecond
	// termHoldBytes: the most a recheck at one instant (divergedAtOnce)
	// holds the host's writes over at once.
	termHoldBytes = verifyRegion
)

// divergedAtOnce compares the runs (LBA pairs, region-aligned) that
// still differed after the rechecks once more, a piece of at most
// termHoldBytes at a time while the term holds its writes there
// (repl.Backend.HoldRange): no write is then on its way to one copy, so a
// region hashed differently differs for real. The rechecks alone, the
// two copies hashed moments apart, may find a region the host rewrites
// without pause different every time. real: some region differs at
// one instant (the rest is not compared: the compare rebuild that
// follows compares everything).
func (d *Daemon) divergedAtOnce(ctx context.Context, pl *primaryLeg, src repl.DigestSource, remote repl.RemoteDigestsFunc, runs [][2]uint64) (real bool, err error) {
	piece := uint64(termHoldBytes) >> src.BlockShift
	for _, r := range runs {
		for lo := r[0]; lo < r[1]; lo += piece {
			hi := min(lo+piece, r[1])
			var differ [][2]uint64
			fctx, cancel := context.WithTimeout(ctx, verifyHoldTimeout)
			_, err := pl.b.HoldRange(fctx, lo, hi-lo, func() error {
				var err error
				differ, err = repl.DivergedRegions(fctx, src, remote, nil, [][2]uint64{{lo, hi}})
				return err
			})
			cancel()
			if err != nil {
				return false, fmt.Errorf("recheck at one instant of LBA %d to %d: %w", lo, hi, err)
			}
			if len(differ) > 0 {
				return true, nil
			}
		}
	}
	return false, nil
}

// termCheck compares pl's in-sync replicas of volume id with the local
// copy (see the top of the file), until ctx ends.
func (d *Daemon) termCheck(ctx context.Context, pl *primaryLeg, id uint64, name string) {
	vol, err := d.store.Volume(store.ID(id))
	if err != nil {
		return
	}
	info, err := vol.Info()
	if err != nil {
		return
	}
	shift := uint(bits.TrailingZeros(uint(info.BlockSize)))
	src := repl.DigestSource{Mapped: vol.Mapped, Read: vol.Read, BlockShift: shift, Blocks: info.SizeBytes >> shift}
	var nodes []string
	for _, p := range pl.b.Stats().Peers {
		if p.State == "in-sync" {
			nodes = append(nodes, p.Node)
		}
	}
	log := d.log.With(slog.String("volume", name), slog.Uint64("epoch", pl.epoch))
	for _, node := range nodes {
		if d.nodeHas(node, meta.FeatureSnapshots) {
			diff, lacks, err := d.snapshotSetCheck(ctx, node, name, id)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				log.Warn("term check of a replica's snapshots failed", slog.String("node", node), slog.String("err", err.Error()))
			case diff != "":
				// Unlisted before it leaves the in-sync set: its rebuild,
				// which may start at once, lists it again as it carries.
				for _, snap := range lacks {
					rctx, cancel := context.WithTimeout(ctx, ownerTimeout)
					err := d.snapshotNodes(rctx, snapshotNodesRequest{Volume: name, Snapshot: snap, Node: node, Remove: true})
					cancel()
					if err != nil {
						log.Warn("a replica lacking a snapshot is still listed among its copies", slog.String("node", node), slog.String("snapshot", snap), slog.String("err", err.Error()))
					} else {
						log.Info("a replica lacking a snapshot no longer listed among its copies", slog.String("node", node), slog.String("snapshot", snap))
					}
				}
				cause := fmt.Errorf("%w: %s, at the start of epoch %d", repl.ErrDiverged, diff, pl.epoch)
				if pl.b.Diverged(node, cause) {
					log.Warn("replica's snapshots differ from the primary's: taken out of sync, to be rebuilt", slog.String("node", node), slog.String("diff", diff))
				}
				continue // its rebuild compares the live copy too
			}
		}
		if !d.nodeHas(node, meta.FeatureDigests) {
			continue
		}
		started := time.Now()
		remote := d.remoteDigests(node, id, info.BlockSize)
		runs, err := repl.DivergedRegions(ctx, src, remote, d.repl.limit, nil)
		for try := 0; err == nil && len(runs) > 0 && try < termRechecks; try++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(termRecheckPause):
			}
			runs, err = repl.DivergedRegions(ctx, src, remote, nil, runs)
		}
		if err == nil && len(runs) > 0 {
			var real bool
			real, err = d.divergedAtOnce(ctx, pl, src, remote, runs)
			if err == nil && !real {
				log.Info("term check: the regions that differed are equal at one instant: a host write was on its way to one copy",
					slog.String("node", node), slog.Int("runs", len(runs)))
				runs = nil
			}
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Warn("term check of a replica failed", slog.String("node", node), slog.String("err", err.Error()))
			continue
		case len(runs) == 0:
			log.Info("term check: replica equal to the primary", slog.String("node", node), slog.Duration("took", time.Since(started).Round(time.Millisecond)))
			continue
		}
		per := uint64(repl.DigestRegionBytes) >> shift
		var regions uint64
		for _, r := range runs {
			regions += (r[1] - r[0] + per - 1) / per
		}
		cause := fmt.Errorf("%w: %d regions of %d KiB differ from primary %s's at the start of epoch %d, first at LBA %d (writes of the previous term that reached some copies only)",
			repl.ErrDiverged, regions, repl.DigestRegionBytes>>10, d.cfg.NodeID, pl.epoch, runs[0][0])
		if pl.b.Diverged(node, cause) {
			log.Warn("replica differs from the primary: taken out of sync, to be copied back", slog.String("node", node), slog.Uint64("regions", regions), slog.Uint64("first_lba", runs[0][0]))
		}
	}
}
