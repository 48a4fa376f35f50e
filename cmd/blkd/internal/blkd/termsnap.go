package blkd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/blk-project/blk/meta"
)

// The term check's snapshot sets (docs/snapshots.md §4.4): besides the
// live copy, an in-sync replica must hold the volume's snapshots as the
// primary does, or a failover to it would lose one (a host's backup, a
// revert target), or serve a chain the registry does not describe. So
// the primary compares each in-sync replica's store chain of the volume
// (GET /v1/internal/snapshots: the volume and its ancestors) with its
// own, over the snapshots the registry has ready and lists the replica
// in; creating and deleting ones are left out (a barrier or a delete in
// progress changes the stores while the check reads them). A replica
// that lacks one, reads through a store object the registry does not
// know, or holds them in another parent order is taken out of sync like
// a diverged replica, and its rebuild carries the snapshots back
// (rebuildsnap.go). Before that, the registry stops listing it among
// the copies of the snapshots it lacks (SnapshotNodes Remove): it says
// what the stores hold, also if no rebuild can carry one back (one
// taken before a grow), and the rebuild lists it again as it carries
// each. Contents are not compared here: snapshots are
// immutable and were taken at a barrier (verify --snapshots digests
// them).

// snapshotSetDiff says how replica, the replica node's store chain of
// volume v (the volume first, then its ancestors), differs from
// primary, the primary's, over the snapshots of v the registry (v,
// known) has ready and lists node in; "" if it does not. lacks: the
// names of those snapshots replica's chain does not hold. known says
// whether the registry knows a store object as a snapshot of any
// volume (a clone's chain runs into its origin's).
func snapshotSetDiff(v meta.Volume, node string, known func(id uint64) bool, primary, replica []chainObject) (why string, lacks []string) {
	listed := func(id uint64) bool {
		s, ok := v.SnapshotByID(id)
		return ok && s.State == meta.SnapshotReady && slices.Contains(s.Nodes, node)
	}
	name := func(id uint64) string {
		s, _ := v.SnapshotByID(id)
		return v.Name + "@" + s.Name
	}
	var unknown []string
	var theirs []uint64
	for i, o := range replica {
		if i == 0 {
			continue // the volume itself
		}
		if !known(o.ID) {
			unknown = append(unknown, fmt.Sprintf("store object %d", o.ID))
		}
		if listed(o.ID) {
			theirs = append(theirs, o.ID)
		}
	}
	var ours []uint64
	for i, o := range primary {
		if i > 0 && listed(o.ID) {
			ours = append(ours, o.ID)
		}
	}
	var lacking, extra []string
	for _, id := range ours {
		if !slices.Contains(theirs, id) {
			lacking = append(lacking, name(id))
			s, _ := v.SnapshotByID(id)
			lacks = append(lacks, s.Name)
		}
	}
	for _, id := range theirs {
		if !slices.Contains(ours, id) {
			extra = append(extra, name(id))
		}
	}
	var parts []string
	if len(lacking) > 0 {
		parts = append(parts, "lacks "+strings.Join(lacking, ", "))
	}
	if len(unknown) > 0 {
		parts = append(parts, "reads through "+strings.Join(unknown, ", ")+" the registry does not know")
	}
	if len(extra) > 0 {
		parts = append(parts, "reads through "+strings.Join(extra, ", ")+", which the primary's copy does not")
	}
	if len(parts) == 0 && !slices.Equal(ours, theirs) {
		names := func(ids []uint64) string {
			out := make([]string, len(ids))
			for i, id := range ids {
				out[i] = name(id)
			}
			return strings.Join(out, ", ")
		}
		parts = append(parts, "holds them in another order (newest first): "+names(theirs)+"; the primary: "+names(ours))
	}
	if len(parts) == 0 {
		return "", nil
	}
	return "replica's snapshots differ from the primary's: " + strings.Join(parts, "; "), lacks
}

// snapshotSetCheck compares node's snapshot chain of volume name (store
// ID id) with this primary's (snapshotSetDiff), asking again after
// termRecheckPause up to termRechecks times while they differ (a
// snapshot or a revert may be changing the stores while they are read).
// It returns the difference that stayed, "" if none, and the names of
// the snapshots node lacks; an error if the node could not say.
func (d *Daemon) snapshotSetCheck(ctx context.Context, node, name string, id uint64) (string, []string, error) {
	api := d.apiOf(node)
	if api == "" {
		return "", nil, fmt.Errorf("the registry knows no API address for node %s", node)
	}
	for try := 0; ; try++ {
		var their snapshotChain
		qctx, cancel := context.WithTimeout(ctx, ownerTimeout)
		err := d.getPeer(qctx, api, fmt.Sprintf("/v1/internal/snapshots?id=%d", id), &their)
		cancel()
		if err != nil {
			return "", nil, fmt.Errorf("node %s's snapshots: %w", node, err)
		}
		ours, err := d.localChain(id, nil)
		if err != nil {
			return "", nil, err
		}
		var v meta.Volume
		var ok bool
		known := map[uint64]bool{}
		d.node.FSM().Read(func(s *meta.State) {
			v, ok = s.Volume(name)
			for _, o := range their.Chain {
				_, _, k := s.SnapshotByID(o.ID)
				known[o.ID] = k
			}
		})
		if !ok || v.ID != id {
			return "", nil, fmt.Errorf("volume %q: no longer in the registry as store object %d", name, id)
		}
		diff, lacks := snapshotSetDiff(v, node, func(id uint64) bool { return known[id] }, ours.Chain, their.Chain)
		if diff == "" || try == termRechecks {
			return diff, lacks, nil
		}
		select {
		case <-ctx.Done():
			return "", nil, ctx.Err()
		case <-time.After(termRecheckPause):
		}
	}
}
