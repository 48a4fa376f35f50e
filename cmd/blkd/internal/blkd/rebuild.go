package blkd

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/repl"
	"github.com/blk-project/blk/store"
)

// Rebuild of out-of-sync replicas (docs/replication.md §5): the primary
// of a replicated volume looks at its registry copy every rebuildPoll; a
// replica out of sync (or left rebuilding by a primary that stopped
// mid-copy) whose node is up is connected, committed rebuilding, copied
// while the host writes (repl.Backend.StartRebuild), and committed in
// sync; on failure it is committed out of sync again with the reason and
// tried again after rebuildBackoff. One rebuild per volume at a time.
//
// Which copy. Incremental (only the regions of the backend's
// dirty-region log of the replica) when the backend has one, which it
// keeps from the moment it saw the replica leave, at its epoch, until
// the replica is back in sync, and the replica's node still runs the
// process the leg wrote to (boot.go: a run that died may have lost
// writes it acknowledged, which no log marks). Full when the registry's
// record of the replica says Full: a new or replaced replica, or a node
// that lost its data. Otherwise a compare (repl/resync.go): a new primary after a
// failover (its term has no log: the old primary, back, lacks what the
// new one wrote and may hold writes it had in flight), a restarted
// primary (the logs are in memory), a rebuild interrupted by a crash
// (the replica copied up to a point nobody recorded); the replica's
// node sends a digest of each 64 KiB region and only the regions that
// differ are copied, so an interrupted rebuild resumes where the copy
// stands rather than starting over. A node without meta.FeatureDigests
// (an older binary) gets a full copy instead. A failed incremental
// rebuild leaves the log marking, so the next try is incremental too.

const (
	// rebuildPoll: how often a primary looks for a replica to rebuild.
	rebuildPoll = time.Second
	// rebuildBackoff: the pause after a failed rebuild of a replica.
	rebuildBackoff = 5 * time.Second
	// rebuildConnectWait bounds a rebuild's connection to its replica
	// (a replica's node comes up, or its failure is retried after
	// rebuildBackoff).
	rebuildConnectWait = 5 * time.Second
	// rebuildRegion: the copier's window, the store's largest read
	// (MaxTransferBytes, 1 MiB by default): read (4 reads of 256 KiB at
	// once), then written to the replica as commands of the connection's
	// MDTS. The copier keeps up to 4 MiB of windows in flight
	// (repl.copyBytes), reading the next while the others are on the
	// wire: deploy/bench/rebuild.sh measured a full copy of a 1 GiB
	// volume on loopback at 342-622 MB/s in 9 runs, median 508 (0.56-1.02x,
	// median 0.83x, the disk's copy rate: the ceiling on one machine), against
	// 207-404, median 306, for the serial copier of one window at a
	// time, on a machine shared with other builds (docs/replication.md
	// §5). A host write into a window waits for the copy of the windows
	// in flight up to it: at most 4 MiB, about 10 ms at 400 MB/s.
	rebuildRegion = 1 << 20
)

// rebuildLoop rebuilds v's out-of-sync replicas while pl serves, until
// ctx ends.
func (d *Daemon) rebuildLoop(ctx context.Context, pl *primaryLeg, id uint64, name string) {
	defer close(pl.rebuilt)
	// The term check (termcheck.go) beside it, ended with it.
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		d.termCheck(ctx, pl, id, name)
	}()
	defer func() { <-checked }()
	failed := map[string]time.Time{} // node → last failure
	t := time.NewTicker(rebuildPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !pl.b.Serving() {
			continue
		}
		// The backend knows better than the registry copy, which may not
		// have applied the last commit yet: a replica it writes to (in
		// sync, rebuilding) or is reporting is no candidate.
		busy := map[string]bool{}
		for _, p := range pl.b.Stats().Peers {
			switch p.State {
			case "in-sync", "failing", "rebuilding", "promoting":
				busy[p.Node] = true
			}
		}
		var (
			v    meta.Volume
			ok   bool
			node string
			left bool // the registry says rebuilding: a rebuild of an earlier primary's, or ours that could not be reported
			full bool // the registry says the replica lost its data (meta.Replica.Full)
		)
		d.node.FSM().Read(func(s *meta.State) {
			v, ok = s.Volume(name)
			if !ok || v.ID != id || v.Node != d.cfg.NodeID || v.CurrentEpoch() != pl.epoch {
				ok = false
				return
			}
			for _, r := range v.ReplicaSet() {
				if r.Node == d.cfg.NodeID || busy[r.Node] || (r.State != meta.ReplicaOutOfSync && r.State != meta.ReplicaRebuilding) {
					continue
				}
				if r.ReplacedBy != "" {
					continue // leaving: its replacement is the one to copy (replace.go)
				}
				if n, up := s.Node(r.Node); !up || n.State != meta.NodeUp {
					continue
				}
				if time.Since(failed[r.Node]) < rebuildBackoff {
					continue
				}
				node, left, full = r.Node, r.State == meta.ReplicaRebuilding, r.Full
				return
			}
		})
		if !ok || node == "" {
			continue
		}
		if err := d.rebuildReplica(ctx, pl, v, node, left, full); err != nil {
			// A snapshot's barrier ended the copy (or ran as it began):
			// it starts again at once, with no backoff.
			if !errors.Is(err, repl.ErrRebuildSnapshot) && !errors.Is(err, repl.ErrRebuildBusy) {
				failed[node] = time.Now()
			}
			if ctx.Err() == nil {
				d.log.Warn("replica rebuild failed", slog.String("volume", v.Name), slog.String("node", node), slog.String("err", err.Error()))
			}
		} else {
			delete(failed, node)
		}
	}
}

// rebuildReplica runs one copy of v's replica on node: incremental if
// the backend keeps a dirty-region log of it and the registry does not
// say full (see the top of the file).
func (d *Daemon) rebuildReplica(ctx context.Context, pl *primaryLeg, v meta.Volume, node string, left, full bool) error {
	epoch := pl.epoch
	// For the registry's reason; the log normally outlives the start (it
	// goes with a new epoch, which fails StartRebuild, or in sync), and
	// the log line and metrics say the mode that ran (rb.Mode).
	mode := "full"
	var digests repl.RemoteDigestsFunc
	if !full {
		// Without a log of its own (a failover, a restart, an
		// interrupted rebuild), a compare: only what differs is copied.
		if d.nodeHas(node, meta.FeatureDigests) {
			digests = d.remoteDigests(node, v.ID, v.BlockSize)
			mode = "compare"
		}
	}
	setCtx := func(ctx context.Context, state meta.ReplicaState, reason string) error {
		rctx, cancel := context.WithTimeout(ctx, ownerTimeout)
		defer cancel()
		return d.reportReplica(rctx, replicaReport{Volume: v.Name, Epoch: epoch, Node: node, State: state, Reason: reason})
	}
	set := func(state meta.ReplicaState, reason string) error { return setCtx(ctx, state, reason) }
	if left {
		// rebuilding → rebuilding is no legal move: back to out of sync
		// first, and a copy from the start (incremental only if it was
		// this backend's: its log still marks).
		if err := set(meta.ReplicaOutOfSync, fmt.Sprintf("rebuild restarted by primary %s at epoch %d", d.cfg.NodeID, epoch)); err != nil {
			return fmt.Errorf("out of sync before a new rebuild: %w", err)
		}
	}
	vol, err := d.store.Volume(store.ID(v.ID))
	if err != nil {
		return err
	}
	// A replica that does not answer within rebuildConnectWait is tried
	// again after rebuildBackoff: until then the loop copies no other
	// replica of the volume (a node killed a moment ago is still up in
	// the registry, and its replacement waits behind it).
	cctx, ccancel := context.WithTimeout(ctx, rebuildConnectWait)
	c, err := d.connectLeg(cctx, v, epoch, node)
	ccancel()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	ns := c.Namespace(1)
	if ns == nil {
		c.Close()
		return errors.New("the replica subsystem has no namespace 1")
	}
	// The log is trusted only if the replica's run that the leg wrote
	// to still answers, after this connection was made (boot.go).
	boot := d.bootOf(ctx, node)
	// A connection lost between the copier's commands ends the rebuild,
	// and once in sync it is the leg's watch.
	go d.watchLeg(ctx, pl, v.Name, node, c, ns)
	if _, ok := pl.b.DirtyBytes(node); ok && !full {
		pl.mu.Lock()
		was := pl.boots[node]
		pl.mu.Unlock()
		if was != "" && was == boot {
			mode = "incremental"
		} else {
			pl.b.DropDirtyLog(node)
			d.log.Info("replica's node ran again since it left (or says not which run it is): its dirty-region log is dropped, the rebuild compares",
				slog.String("volume", v.Name), slog.String("node", node), slog.String("mode", mode))
		}
	}
	// The snapshots the replica lacks, before the live copy
	// (rebuildsnap.go). Not to a replica that lost its data (Full): as
	// before, the live volume only.
	useLog := !full
	var own func(from, to uint64, fn func(lba, blocks uint64, zero bool) error) error
	if !full {
		got, err := d.carrySnapshots(ctx, v, epoch, node, ns, func() {
			pl.b.DropDirtyLog(node)
			if mode == "incremental" {
				mode = "full"
				if digests != nil {
					mode = "compare"
				}
			}
		})
		if err != nil {
			c.Close()
			return fmt.Errorf("snapshots not carried: %w", err)
		}
		if got.top != 0 {
			// The replica's live copy reads the newest snapshot now, not
			// what it held: its dirty-region log no longer says what
			// differs, but the live volume reads through that snapshot,
			// so only what it owns on top is copied. A snapshot taken
			// meanwhile: started again at once, to carry it too.
			if info, err := vol.Info(); err != nil || uint64(info.Parent) != got.top {
				c.Close()
				return fmt.Errorf("the volume's parent changed while snapshots were carried (%v): %w", err, repl.ErrRebuildSnapshot)
			}
			useLog, mode, digests = false, "own", nil
			top := store.ID(got.top)
			own = func(from, to uint64, fn func(lba, blocks uint64, zero bool) error) error {
				info, err := vol.Info()
				if err != nil {
					return err
				}
				if info.Parent != top {
					return fmt.Errorf("the volume reads through store object %d now, not %d, which the replica was brought to: %w", info.Parent, top, repl.ErrRebuildSnapshot)
				}
				return vol.MappedOwn(from, to, fn)
			}
			d.log.Info("snapshots carried to a replica", slog.String("volume", v.Name), slog.String("node", node),
				slog.Any("snapshots", got.names), slog.String("mode", mode))
		}
	}
	if err := set(meta.ReplicaRebuilding, fmt.Sprintf("%s copy from %s at epoch %d", mode, d.cfg.NodeID, epoch)); err != nil {
		c.Close()
		return fmt.Errorf("commit rebuilding: %w", err)
	}
	kept := false
	started := time.Now()
	rb, err := pl.b.StartRebuild(epoch, repl.RebuildConfig{
		Node: node, NS: ns, MaxTransfer: c.Info().MaxTransfer,
		Mapped: vol.Mapped, Read: vol.Read, RegionBytes: rebuildRegion, Limiter: d.repl.limit,
		UseDirtyLog: useLog, RemoteDigests: digests, MappedOwn: own,
		Logger: d.log.With(slog.String("volume", v.Name)),
		Promote: func(pctx context.Context) error {
			if err := setCtx(pctx, meta.ReplicaInSync, fmt.Sprintf("rebuilt: %s copy from %s at epoch %d", mode, d.cfg.NodeID, epoch)); err != nil {
				return err
			}
			// In sync now: the connection is one of the volume's legs,
			// closed by refreshPrimaryLeg when the replica leaves.
			pl.mu.Lock()
			if old := pl.ctrls[node]; old != nil && old != c {
				old.Close()
			}
			pl.ctrls[node] = c
			pl.boots[node] = boot
			kept = true
			pl.mu.Unlock()
			return nil
		},
	})
	if err != nil {
		c.Close()
		_ = set(meta.ReplicaOutOfSync, fmt.Sprintf("rebuild not started: %v", err))
		return err
	}
	pl.mu.Lock()
	pl.rebuild = rb
	pl.mu.Unlock()
	select {
	case <-rb.Done():
	case <-ctx.Done():
		rb.Cancel()
		<-rb.Done()
	}
	err = rb.Err()
	pl.mu.Lock()
	if !kept {
		c.Close()
	}
	pl.mu.Unlock()
	if err == nil {
		done, _ := rb.Progress()
		took := time.Since(started)
		d.log.Info("rebuild done", slog.String("volume", v.Name), slog.String("node", node), slog.Uint64("epoch", epoch),
			slog.String("mode", rb.Mode()), slog.Uint64("copied_bytes", rb.Copied()), slog.Uint64("bytes", done),
			slog.Duration("took", took.Round(time.Millisecond)), slog.Float64("copied_mb_per_s", float64(rb.Copied())/1e6/max(took.Seconds(), 1e-3)))
		return nil
	}
	if ctx.Err() == nil && !kept {
		// A failure after the commit in sync is the data path's: it
		// reported the replica out of sync itself.
		if rerr := set(meta.ReplicaOutOfSync, fmt.Sprintf("rebuild failed: %v", err)); rerr != nil {
			d.log.Warn("replica rebuild failed and not recorded out of sync", slog.String("volume", v.Name), slog.String("node", node), slog.String("err", rerr.Error()))
		}
	}
	return err
}

// remoteDigests is a compare rebuild's RemoteDigests: node's digests of
// its copy of volume id (of blocks of blockSize bytes), asked as
// checksums with region_bytes (served by localChecksums there).
func (d *Daemon) remoteDigests(node string, id uint64, blockSize uint32) repl.RemoteDigestsFunc {
	return func(ctx context.Context, lba uint64, out []repl.Digest) error {
		sums, err := d.checksums(ctx, node, id, lba*uint64(blockSize), len(out), repl.DigestRegionBytes)
		if err != nil {
			return err
		}
		if len(sums) != len(out) {
			return fmt.Errorf("node %s: %d digests for %d regions", node, len(sums), len(out))
		}
		for i, h := range sums {
			if len(h) != 2*len(out[i]) {
				return fmt.Errorf("node %s: digest %q", node, h)
			}
			if _, err := hex.Decode(out[i][:], []byte(h)); err != nil {
				return fmt.Errorf("node %s: digest %q: %w", node, h, err)
			}
		}
		return nil
	}
}

// rebuildProgress is the rebuild of v's replica on node that this
// node runs as primary, if any: bytes passed and bytes to pass (the
// volume's size, or its dirty regions' for an incremental rebuild).
func (d *Daemon) rebuildProgress(id uint64, node string) (done, total uint64, ok bool) {
	d.repl.mu.Lock()
	pl := d.repl.primary[id]
	d.repl.mu.Unlock()
	if pl == nil {
		return 0, 0, false
	}
	pl.mu.Lock()
	rb := pl.rebuild
	pl.mu.Unlock()
	if rb == nil || rb.Node() != node || rb.Err() != nil {
		return 0, 0, false
	}
	select {
	case <-rb.Done():
		return 0, 0, false
	default:
	}
	done, total = rb.Progress()
	return done, total, true
}
