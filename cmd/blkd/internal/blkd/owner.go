package blkd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/blk-project/blk/control"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme/auth"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
)

// The control plane (package control) runs here on its real parts: the
// raft registry, the pebble store and the NVMe target. The registry
// leader runs every management operation (control.Manager); the owner of
// the volume reconciles it from its own copy of the registry
// (control.Reconciler). When the owner is another node, the leader asks
// it through POST /v1/internal/reconcile with the volume's name and the
// registry index to reach first: the owner then does only what its
// registry copy says, so the route cannot make a node do anything the
// registry does not hold.

// ownerTimeout bounds one request from the leader to a volume's owner.
const ownerTimeout = 15 * time.Second

// settleInterval is how often the leader runs a settle round (every
// owner reconciles every volume; failures and recoveries are recorded).
const settleInterval = 10 * time.Second

// ownerCatchUp bounds how long an owner waits for its registry copy to
// reach the index the leader names.
const ownerCatchUp = 10 * time.Second

// reconcileRequest is the body of POST /v1/internal/reconcile.
type reconcileRequest struct {
	Name  string `json:"name"`
	Index uint64 `json:"index"`
}

// storeParts adapts the extent store to control.Store.
type storeParts struct {
	s *store.Store
	// limit is the node's rebuild limiter, which a flatten draws its
	// copies from (throttle.go; nil: unlimited).
	limit copyLimiter
}

func (p storeParts) Shape(id uint64) (uint64, uint32, error) {
	v, err := p.s.Volume(store.ID(id))
	if err != nil {
		return 0, 0, err
	}
	info, err := v.Info()
	if err != nil {
		return 0, 0, err
	}
	return info.SizeBytes, info.BlockSize, nil
}

func (p storeParts) Create(id, size uint64, bs uint32) error {
	_, err := p.s.Create(store.ID(id), store.CreateOptions{SizeBytes: size, BlockSize: bs})
	return err
}

func (p storeParts) Grow(id, size uint64) error { return p.s.Resize(store.ID(id), size, false) }
func (p storeParts) Delete(id uint64) error     { return p.s.Delete(store.ID(id)) }

func (p storeParts) Full() string {
	if sp := p.s.Space(); sp.Full {
		// No free-byte count: the reason must not change while the disk
		// stays full, or each settle round would rewrite it.
		return fmt.Sprintf("the node's disk is full (free space under its %d-byte reserve): writes are refused, reads go on", sp.ReserveBytes)
	}
	return ""
}

func (p storeParts) List() ([]uint64, error) {
	infos, err := p.s.List()
	if err != nil {
		return nil, err
	}
	ids := make([]uint64, 0, len(infos))
	for _, in := range infos {
		// Volumes only: the reconcile deletes what the registry does not
		// know, and a snapshot is never one of its volumes.
		if in.Kind == store.KindVolume {
			ids = append(ids, uint64(in.ID))
		}
	}
	return ids, nil
}

// targetParts adapts the NVMe target to control.Target.
type targetParts struct {
	d *Daemon
}

func (p *targetParts) Serve(v meta.Volume) error { return p.d.serve(v) }

// Served says whether v is served as this node serves it: a volume of
// one replica, by a subsystem under its NQN; a replicated one, by a
// primary term at v's epoch that still runs (failover.go). Otherwise
// reconcile serves it (again).
func (p *targetParts) Served(v meta.Volume) bool {
	if len(v.ReplicaSet()) > 1 {
		return p.d.primaryAt(v)
	}
	_, ok := p.d.tgt.Subsystem(v.NQN)
	return ok && p.d.hostVolumeOf(v.ID) == nil
}

func (p *targetParts) SetHosts(v meta.Volume) error {
	p.d.refreshPrimaryLeg(v)
	if err := p.d.refreshPaths(v); err != nil {
		return err
	}
	nqn, allowAny, hosts := v.NQN, v.AllowAny, v.Hosts
	keys, err := hostKeys(v)
	if err != nil {
		return err
	}
	sub, ok := p.d.tgt.Subsystem(nqn)
	if !ok {
		return fmt.Errorf("subsystem %s: %w", nqn, target.ErrNotFound)
	}
	if sub.AllowAnyHost() != allowAny {
		sub.SetAllowAnyHost(allowAny)
	}
	have := sub.Hosts()
	for _, h := range hosts {
		if !slices.Contains(have, h) {
			if err := sub.AllowHost(h); err != nil && !errors.Is(err, target.ErrExists) {
				return err
			}
		}
	}
	for _, h := range have {
		if !slices.Contains(hosts, h) {
			if err := sub.DenyHost(h); err != nil && !errors.Is(err, target.ErrNotFound) {
				return err
			}
		}
	}
	for h, k := range keys {
		if err := sub.SetHostKeys(h, &k); err != nil {
			return err
		}
	}
	for _, h := range sub.AuthenticatedHosts() {
		if _, ok := keys[h]; !ok {
			if err := sub.SetHostKeys(h, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// hostKeys parses a volume's host secrets for the target. The registry
// checked them; an error here names the host, never the secret.
func hostKeys(v meta.Volume) (map[string]target.HostKeys, error) {
	if len(v.Secrets) == 0 {
		return nil, nil
	}
	out := make(map[string]target.HostKeys, len(v.Secrets))
	for h, s := range v.Secrets {
		hk, err := auth.ParseKey(s.Host)
		if err != nil {
			return nil, fmt.Errorf("host %s: DH-HMAC-CHAP secret: %w", h, err)
		}
		k := target.HostKeys{Host: hk}
		if s.Ctrl != "" {
			ck, err := auth.ParseKey(s.Ctrl)
			if err != nil {
				return nil, fmt.Errorf("host %s: DH-HMAC-CHAP controller secret: %w", h, err)
			}
			k.Ctrl = &ck
		}
		out[h] = k
	}
	return out, nil
}

func (p *targetParts) Revalidate(nqn string) error {
	sub, ok := p.d.tgt.Subsystem(nqn)
	if !ok {
		return fmt.Errorf("subsystem %s: %w", nqn, target.ErrNotFound)
	}
	return sub.RevalidateNamespace(1)
}

func (p *targetParts) Connected(nqn string) []string {
	if sub, ok := p.d.tgt.Subsystem(nqn); ok {
		return sub.ConnectedHosts()
	}
	return nil
}

func (p *targetParts) Unserve(nqn string) error {
	if hv := p.d.hostVolumeByNQN(nqn); hv != nil {
		p.d.endTerm(hv, "not served")
	}
	if err := p.d.tgt.RemoveSubsystem(nqn); err != nil && !errors.Is(err, target.ErrNotFound) {
		return err
	}
	p.d.removeHostVolume(nqn)
	p.d.stopPrimaryLeg(nqn)
	return nil
}

func (p *targetParts) ServeReplica(v meta.Volume) error { return p.d.serveReplica(v) }
func (p *targetParts) UnserveReplica(id uint64) error   { return p.d.unserveReplica(id) }
func (p *targetParts) Demote(v meta.Volume) error       { return p.d.demote(v) }

// registryParts adapts the raft registry to control.Registry.
type registryParts struct{ n *meta.Node }

func (p registryParts) Apply(ctx context.Context, c meta.Command) (meta.Result, error) {
	return p.n.Apply(ctx, c)
}

func (p registryParts) Volume(ctx context.Context, name string) (meta.Volume, error) {
	return p.n.ReadVolume(ctx, name)
}

func (p registryParts) Volumes(ctx context.Context) ([]meta.Volume, error) {
	if err := p.n.Linearize(ctx); err != nil {
		return nil, err
	}
	return p.n.FSM().Export().Volumes, nil
}

func (p registryParts) Node(ctx context.Context, id string) (meta.NodeInfo, error) {
	var n meta.NodeInfo
	var ok bool
	p.n.FSM().Read(func(s *meta.State) { n, ok = s.Node(id) })
	if !ok {
		return n, meta.ErrUnknownNode
	}
	return n, nil
}

func (p registryParts) Nodes(ctx context.Context) ([]meta.NodeInfo, error) {
	if err := p.n.Linearize(ctx); err != nil {
		return nil, err
	}
	return p.n.FSM().Export().Nodes, nil
}

// Place reads the registry linearizably (the caller is the leader): a
// node marked down or a volume created a moment ago is seen.
func (p registryParts) Place(ctx context.Context, req meta.PlaceRequest) ([]string, error) {
	if err := p.n.Linearize(ctx); err != nil {
		return nil, err
	}
	var nodes []string
	var err error
	p.n.FSM().Read(func(s *meta.State) { nodes, err = s.Place(req) })
	return nodes, err
}

func (p registryParts) Connections(ctx context.Context) ([]meta.Connection, error) {
	return p.n.FSM().Export().Connections, nil
}

// ownerParts reaches a volume's owner: this node in process, others
// through their internal route.
type ownerParts struct{ d *Daemon }

// Answers implements control.Answerer: this node answers; another
// answers if its health route does, as itself, within probeTimeout (the
// liveness probe, asked once more at the moment a volume is placed).
func (p ownerParts) Answers(ctx context.Context, node string) bool {
	if node == p.d.cfg.NodeID {
		return true
	}
	n, err := registryParts{p.d.node}.Node(ctx, node)
	if err != nil || n.MgmtAddr == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return probe(ctx, p.d.peers, p.d.peerURL(n.MgmtAddr, "/v1/internal/health"), n) == probeAlive
}

// DiskFull implements control.DiskReporter: why node's store refuses
// new clusters now (storeParts.Full: its disk is full), asked of this
// node's store directly and of another through its health route; "" if
// it has room, or does not answer (Answers' business), or is older and
// does not say.
func (p ownerParts) DiskFull(ctx context.Context, node string) string {
	if node == p.d.cfg.NodeID {
		if p.d.store == nil {
			return ""
		}
		return storeParts{s: p.d.store}.Full()
	}
	n, err := registryParts{p.d.node}.Node(ctx, node)
	if err != nil || n.MgmtAddr == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	h, a := probeHealth(ctx, p.d.peers, p.d.peerURL(n.MgmtAddr, "/v1/internal/health"), n)
	if a != probeAlive {
		return ""
	}
	return h.Full
}

func (p ownerParts) Reconcile(ctx context.Context, node, name string, index uint64) (control.Status, error) {
	if node == p.d.cfg.NodeID {
		return p.d.reconcileLocal(ctx, name, index)
	}
	var api string
	p.d.node.FSM().Read(func(s *meta.State) {
		if n, ok := s.Node(node); ok {
			api = n.MgmtAddr
		}
	})
	if api == "" {
		return control.Status{}, fmt.Errorf("the registry knows no API address for node %s", node)
	}
	ctx, cancel := context.WithTimeout(ctx, ownerTimeout)
	defer cancel()
	var st control.Status
	if err := p.d.postPeer(ctx, api, "/v1/internal/reconcile", reconcileRequest{Name: name, Index: index}, &st); err != nil {
		return control.Status{}, fmt.Errorf("node %s at %s: %w", node, api, err)
	}
	return st, nil
}

// peerAnswer is a node's answer other than 200 to postPeer: its status
// and the error it gave (the JSON "error", else the body).
type peerAnswer struct {
	status int
	text   string
}

func (e *peerAnswer) Error() string {
	return fmt.Sprintf("answered %d %s: %s", e.status, http.StatusText(e.status), e.text)
}

// postPeer posts in, as JSON, to path on the node whose API is at api,
// and reads a 200's JSON answer into out (nil: none expected). Another
// status is a *peerAnswer.
func (d *Daemon) postPeer(ctx context.Context, api, path string, in, out any) error {
	body, _ := json.Marshal(in)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.peerURL(api, path), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	return d.askPeer(req, out)
}

// getPeer is postPeer's GET, with no body.
func (d *Daemon) getPeer(ctx context.Context, api, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.peerURL(api, path), nil)
	if err != nil {
		return err
	}
	return d.askPeer(req, out)
}

// askPeer sends req to a peer and reads its answer as postPeer says.
func (d *Daemon) askPeer(req *http.Request, out any) error {
	resp, err := d.peers.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return &peerAnswer{resp.StatusCode, e.Error}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("bad answer %q: %v", b, err)
	}
	return nil
}

// volumeAt waits, at most ownerCatchUp, for the local registry copy to
// apply index, then reads the volume called name from it (ok false: the
// registry holds none). A leader's request to this node names the index
// its decision was made at: answering from an older copy would act on a
// registry that does not yet say what the leader saw. A copy that does
// not get there in time is a 503, for the caller to retry.
func (d *Daemon) volumeAt(ctx context.Context, name string, index uint64) (v meta.Volume, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, ownerCatchUp)
	defer cancel()
	if d.node.WaitApplied(ctx, index) != nil {
		return v, false, &apiError{http.StatusServiceUnavailable, fmt.Sprintf("node %s: registry copy at index %d, not yet %d", d.cfg.NodeID, d.node.AppliedIndex(), index)}
	}
	d.node.FSM().Read(func(s *meta.State) { v, ok = s.Volume(name) })
	return v, ok, nil
}

// reconcileLocal reconciles the volume called name on this node from its
// registry copy, once that copy has applied index.
func (d *Daemon) reconcileLocal(ctx context.Context, name string, index uint64) (control.Status, error) {
	v, ok, err := d.volumeAt(ctx, name, index)
	if err != nil {
		return control.Status{}, err
	}
	if !ok {
		d.rec.Forget(name)
		return control.Status{Name: name, State: control.StateDeleted}, nil
	}
	if _, ok := v.Replica(d.cfg.NodeID); !ok {
		return control.Status{}, &apiError{http.StatusConflict, fmt.Sprintf("volume %q has no replica on node %s: its primary is node %s", name, d.cfg.NodeID, v.Node)}
	}
	return d.rec.Reconcile(v), nil
}

// internalReconcile serves POST /v1/internal/reconcile: the leader asks
// this node, a volume's owner, to reconcile it.
func (d *Daemon) internalReconcile(w http.ResponseWriter, r *http.Request) error {
	var req reconcileRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Name == "" {
		return badRequest(`missing "name"`)
	}
	st, err := d.reconcileLocal(r.Context(), req.Name, req.Index)
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return err
		}
		return &apiError{http.StatusServiceUnavailable, err.Error()}
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// startControl builds the reconciler and the manager and reconciles every
// volume this node owns (the restart path). A volume that cannot be
// served is reported and left failed; it never stops the node.
func (d *Daemon) startControl(ctx context.Context) {
	d.tparts = &targetParts{d: d}
	d.rec = control.NewReconciler(d.cfg.NodeID, storeParts{s: d.store, limit: d.copyLimit()}, d.tparts, d.audit.logger())
	d.rec.OnFlattenDone = func(string) {
		select {
		case d.settleNow <- struct{}{}:
		default:
		}
	}
	d.mgr = control.NewManager(registryParts{d.node}, ownerParts{d})
	d.mgr.MaxReplicas = meta.MaxReplicas // blkd replicates (replica.go)
	d.mgr.Log = d.audit.logger()
	if d.cfg.DetachAfter > 0 {
		d.mgr.DetachAfter = time.Duration(d.cfg.DetachAfter)
	}
	var vols []meta.Volume
	d.node.FSM().Read(func(s *meta.State) { vols = s.Export().Volumes })
	for _, st := range d.rec.ReconcileAll(vols) {
		if st.State == control.StateFailed {
			name := st.Name
			if name == "" {
				name = "id " + strconv.FormatUint(st.ID, 10)
			}
			d.log.Error("volume failed", slog.String("volume", name), slog.String("reason", st.Reason))
		}
	}
	if d.node.IsLeader() {
		// Record the outcome at once (failed volumes, creations and
		// deletions a crash interrupted), bounded: an owner that does not
		// answer must not hold up this node's start; the settle loop
		// finishes the rest.
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		d.settle(ctx)
		cancel()
	}
}

// settle runs one settle round if this node leads the registry, logging
// owners that did not answer when that changes.
func (d *Daemon) settle(ctx context.Context) {
	if !d.node.IsLeader() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*ownerTimeout)
	defer cancel()
	bad, err := d.mgr.Settle(ctx)
	if err != nil {
		return // lost leadership or shutting down
	}
	d.settleMu.Lock()
	defer d.settleMu.Unlock()
	for node, e := range bad {
		if _, known := d.unreachable[node]; !known {
			d.log.Warn("owner node unreachable: its volumes are not reconciled", slog.String("node", node), slog.String("err", e.Error()))
		}
	}
	for node := range d.unreachable {
		if _, still := bad[node]; !still {
			d.log.Info("owner node reachable again", slog.String("node", node))
		}
	}
	d.unreachable = bad
}

// settleLoop runs settle rounds until the daemon stops.
func (d *Daemon) settleLoop(stop <-chan struct{}) {
	t := time.NewTicker(settleInterval)
	defer t.Stop()
	legacy := legacyNames{}
	legacy.warn(d)
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		case <-d.settleNow:
		}
		d.beats.beat(loopSettle)
		legacy.warn(d)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		d.settle(ctx)
		cancel()
	}
}
