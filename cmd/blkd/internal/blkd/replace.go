package blkd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/control"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/repl"
)

// Replace and move (docs/replication.md §6): POST
// /v1/volumes/{name}/replicas/replace starts a replacement
// (control.Manager.ReplaceReplica); the leader's replaceRound, after
// each liveness round, finishes the ones whose new replica is in sync
// (control.Manager.FinishReplace) and, with --replace-after, starts one
// for a secondary whose node has been down that long. The registry
// holds every replacement (meta.Replica.ReplacedBy): a new leader
// finishes what the old one started.

// replacer is the leader's record for the automatic replacement.
type replacer struct {
	mu        sync.Mutex
	downSince map[string]time.Time // node → when this leader first saw it down
	last      time.Time            // the previous round
	warned    map[string]bool      // volume/node: "no node to replace it on" said once
}

// downFor says how long node has been down as this leader saw it.
func (r *replacer) downFor(now time.Time) func(string) time.Duration {
	return func(node string) time.Duration {
		if t, ok := r.downSince[node]; ok {
			return now.Sub(t)
		}
		return 0
	}
}

// replaceRound is the leader's: it finishes replacements whose new
// replica is in sync and starts the automatic ones that are due. Each
// runs in its own goroutine under the volume's claim (startFailover),
// so it never races a failover or failback of the same volume and
// never holds up the liveness loop.
func (d *Daemon) replaceRound() {
	now := time.Now()
	var vols []meta.Volume
	var nodes []meta.NodeInfo
	d.node.FSM().Read(func(s *meta.State) {
		snap := s.Export()
		vols, nodes = snap.Volumes, snap.Nodes
	})
	for _, v := range vols {
		for _, r := range v.Replicas {
			if n, ok := v.Replica(r.ReplacedBy); r.ReplacedBy != "" && ok && n.State == meta.ReplicaInSync && d.startFailover(v.Name) {
				go d.finishReplace(v.Name, r.Node)
			}
		}
	}
	after := time.Duration(d.cfg.ReplaceAfter)
	rp := &d.replacer
	rp.mu.Lock()
	if rp.downSince == nil || now.Sub(rp.last) > 3*probeInterval {
		// A new term, or this leader stalled: count from now.
		rp.downSince, rp.warned = map[string]time.Time{}, map[string]bool{}
	}
	rp.last = now
	for _, n := range nodes {
		if n.State != meta.NodeDown {
			delete(rp.downSince, n.ID)
		} else if _, ok := rp.downSince[n.ID]; !ok {
			rp.downSince[n.ID] = now
		}
	}
	var due []control.DueReplacement
	if after > 0 {
		due = control.DueReplacements(vols, nodes, rp.downFor(now), after)
	}
	rp.mu.Unlock()
	for _, r := range due {
		if d.startFailover(r.Volume) {
			go d.autoReplace(r, after)
		}
	}
}

// endClaim releases volume's claim (startFailover).
func (d *Daemon) endClaim(volume string) {
	d.failMu.Lock()
	delete(d.failing, volume)
	d.failMu.Unlock()
}

// finishReplace ends the replacement of volume's replica on node.
func (d *Daemon) finishReplace(volume, node string) {
	defer d.endClaim(volume)
	ctx, cancel := context.WithTimeout(context.Background(), 3*ownerTimeout)
	defer cancel()
	done, err := d.mgr.FinishReplace(ctx, volume, node)
	switch {
	case err != nil:
		d.log.Warn("replacement not finished; retried next round", slog.String("volume", volume), slog.String("node", node), slog.String("err", err.Error()))
	case done:
		d.log.Info("replacement done: the old replica left the volume", slog.String("volume", volume), slog.String("node", node))
	}
}

// autoReplace starts the replacement of a replica whose node has been
// down longer than after.
func (d *Daemon) autoReplace(r control.DueReplacement, after time.Duration) {
	defer d.endClaim(r.Volume)
	ctx, cancel := context.WithTimeout(context.Background(), 2*ownerTimeout)
	defer cancel()
	reason := fmt.Sprintf("replacing the replica on %s, down for %v (--replace-after %v)", r.Node, r.Down.Round(time.Second), after)
	v, err := d.mgr.ReplaceReplica(ctx, r.Volume, r.Node, "", reason)
	key := r.Volume + "/" + r.Node
	if err != nil && v.Name == "" {
		d.replacer.mu.Lock()
		warned := d.replacer.warned[key]
		if d.replacer.warned != nil {
			d.replacer.warned[key] = true
		}
		d.replacer.mu.Unlock()
		if !warned {
			d.log.Warn("automatic replacement impossible now; retried every round", slog.String("volume", r.Volume), slog.String("node", r.Node), slog.String("err", err.Error()))
		}
		return
	}
	var to string
	if old, ok := v.Replica(r.Node); ok {
		to = old.ReplacedBy
	}
	attrs := []any{slog.String("volume", r.Volume), slog.String("node", r.Node), slog.String("to", to), slog.Duration("down", r.Down.Round(time.Second))}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	d.log.Warn("automatic replacement started", attrs...)
}

// replaceReplica serves POST /v1/volumes/{name}/replicas/replace.
func (d *Daemon) replaceReplica(w http.ResponseWriter, r *http.Request) error {
	var req api.ReplaceReplicaRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	switch {
	case req.Node == "":
		return badRequest(`missing "node": give the node whose replica to replace, e.g. {"node": "n3"} (blkctl volume show lists them)`)
	case api.CheckName("node", req.Node) != nil:
		return badRequest("%v", api.CheckName("node", req.Node))
	case req.To != "" && api.CheckName("node", req.To) != nil:
		return badRequest("%v", api.CheckName("node", req.To))
	case req.To == req.Node:
		return badRequest("node %q replaced by itself: give another node in \"to\", or none to let placement choose", req.Node)
	}
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	v, err := d.mgr.ReplaceReplica(r.Context(), name, req.Node, req.To, "")
	if err != nil {
		if errors.Is(err, meta.ErrNoPlacement) {
			return &apiError{http.StatusConflict, strings.ReplaceAll(err.Error(), ": meta: ", ": ") + ": every other node up is in a zone of another replica of the volume, or full, or silent: add a node, or name one with \"to\" (blkctl volume replace-replica ... --to NODE)"}
		}
		return metaError(err, "")
	}
	d.log.Info("replacement started", slog.String("volume", name), slog.String("node", req.Node), slog.String("to", replacedBy(v, req.Node)))
	writeJSON(w, http.StatusAccepted, d.view(v))
	return nil
}

// replacedBy is the node replacing v's replica on node, or "".
func replacedBy(v meta.Volume, node string) string {
	r, _ := v.Replica(node)
	return r.ReplacedBy
}

// dropRemovedPeers takes the replicas v no longer has (removed at the end
// of a replacement or a move) out of pl's write set, at its epoch, so
// that closing their connections after (refreshPrimaryLeg) fails no
// host write and reports no loss of a replica the registry has
// forgotten. It changes nothing unless every peer kept has its
// connection at hand: dropping one the registry counts in sync would
// lose writes.
func (d *Daemon) dropRemovedPeers(pl *primaryLeg, v meta.Volume) {
	if v.CurrentEpoch() != pl.epoch {
		return
	}
	var keep []repl.Peer
	var removed []string
	pl.mu.Lock()
	for _, p := range pl.b.Stats().Peers {
		if _, ok := v.Replica(p.Node); !ok {
			removed = append(removed, p.Node)
			continue
		}
		c := pl.ctrls[p.Node]
		if c == nil || c.Namespace(1) == nil {
			if p.State == "in-sync" {
				pl.mu.Unlock()
				d.log.Warn("a removed replica's leg kept: another in-sync leg has no connection at hand", slog.String("volume", v.Name), slog.String("node", p.Node))
				return
			}
			continue
		}
		keep = append(keep, repl.Peer{Node: p.Node, NS: c.Namespace(1), MaxTransfer: c.Info().MaxTransfer})
	}
	pl.mu.Unlock()
	if len(removed) == 0 {
		return
	}
	if err := pl.b.SetPeers(pl.epoch, keep); err != nil {
		d.log.Warn("a removed replica's leg kept", slog.String("volume", v.Name), slog.Any("nodes", removed), slog.String("err", err.Error()))
		return
	}
	d.log.Info("removed replicas no longer written", slog.String("volume", v.Name), slog.Any("nodes", removed), slog.Uint64("epoch", pl.epoch))
}

// dropRequest is the body of POST /v1/internal/drop: the leader asks a
// node to delete its copy (store volume ID) of the volume called Name, a
// replica the registry no longer places there once it applied Index.
type dropRequest struct {
	Name  string `json:"name"`
	ID    uint64 `json:"id"`
	Index uint64 `json:"index"`
}

// DropRemoved implements control.Dropper: this node in process, another
// through its internal route.
func (p ownerParts) DropRemoved(ctx context.Context, node, name string, id, index uint64) error {
	if node == p.d.cfg.NodeID {
		return p.d.dropLocal(ctx, dropRequest{Name: name, ID: id, Index: index})
	}
	var api string
	p.d.node.FSM().Read(func(s *meta.State) {
		if n, ok := s.Node(node); ok {
			api = n.MgmtAddr
		}
	})
	if api == "" {
		return fmt.Errorf("the registry knows no API address for node %s", node)
	}
	ctx, cancel := context.WithTimeout(ctx, ownerTimeout)
	defer cancel()
	if err := p.d.postPeer(ctx, api, "/v1/internal/drop", dropRequest{Name: name, ID: id, Index: index}, nil); err != nil {
		return fmt.Errorf("node %s at %s: %w", node, api, err)
	}
	return nil
}

// dropLocal deletes this node's copy of a volume the registry, once
// applied up to req.Index, no longer places here
// (control.Reconciler.DropRemoved).
func (d *Daemon) dropLocal(ctx context.Context, req dropRequest) error {
	v, ok, err := d.volumeAt(ctx, req.Name, req.Index)
	if err != nil {
		return err
	}
	if !ok {
		return &apiError{http.StatusNotFound, fmt.Sprintf("no volume %q in the registry: its copy here, if any, is an orphan left for an operator", req.Name)}
	}
	if err := d.rec.DropRemoved(v, req.ID); err != nil {
		if errors.Is(err, control.ErrInvalid) {
			return &apiError{http.StatusConflict, err.Error()}
		}
		return err
	}
	return nil
}

// internalDrop serves POST /v1/internal/drop.
func (d *Daemon) internalDrop(w http.ResponseWriter, r *http.Request) error {
	var req dropRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Name == "" || req.ID == 0 {
		return badRequest(`missing "name" or "id"`)
	}
	if err := d.dropLocal(r.Context(), req); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}
