package blkd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/metrics"
	"github.com/blk-project/blk/nvme/auth"
	"github.com/blk-project/blk/repl"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
)

// Replicated volumes on a node (docs/replication.md §2–3).
//
// A volume of several replicas is served to hosts by its primary (the
// registry's Volume.Node) through a repl.Backend: reads from the local
// store, writes to the local store and to every in-sync replica. Each
// other replica's node serves the volume's replica subsystem,
// nqn.2024-01.io.blk:replica:<volume ID>, on its NVMe/TCP port, which
// admits only the primary of the registry's current epoch: the primary
// connects with the host NQN nqn.2024-01.io.blk:node:<node>:epoch:<E>
// and authenticates with the volume's replica secret (DH-HMAC-CHAP, both
// directions), which only the registry holds. So a host, or an attacker
// on the network who does not hold the secret, never writes a replica,
// and a primary of an older epoch is refused at Connect.

const (
	replicaNQNPrefix  = "nqn.2024-01.io.blk:replica:"
	replicaHostPrefix = "nqn.2024-01.io.blk:node:"
	replicaHostEpoch  = ":epoch:"
)

// replicaNQN is the subsystem NQN a replica node serves volume id under.
func replicaNQN(id uint64) string { return replicaNQNPrefix + strconv.FormatUint(id, 10) }

// replicaHostNQN is the host NQN a primary connects to its replicas with.
func replicaHostNQN(node string, epoch uint64) string {
	return replicaHostPrefix + node + replicaHostEpoch + strconv.FormatUint(epoch, 10)
}

// parseReplicaHostNQN reads back replicaHostNQN's node and epoch.
func parseReplicaHostNQN(nqn string) (node string, epoch uint64, ok bool) {
	rest, found := strings.CutPrefix(nqn, replicaHostPrefix)
	if !found {
		return "", 0, false
	}
	i := strings.LastIndex(rest, replicaHostEpoch)
	if i <= 0 {
		return "", 0, false
	}
	e, err := strconv.ParseUint(rest[i+len(replicaHostEpoch):], 10, 64)
	if err != nil || e == 0 {
		return "", 0, false
	}
	return rest[:i], e, true
}

// Timing of the replica connections.
const (
	// replicaIOTimeout bounds one write on a replica: a replica that does
	// not answer within it is reported out of sync (the host's own
	// timeout, nvme_core.io_timeout, is 30 s).
	replicaIOTimeout = 2 * time.Second
	// replicaKATO is the replica connection's keep-alive timeout.
	replicaKATO = 2 * time.Second
	// replicaConnectGrace is how long a primary that starts serving
	// tries to reach an in-sync replica before it reports it out of sync
	// (every node of a cluster restarted at once comes up within it).
	replicaConnectGrace = 20 * time.Second
	// replicaHold bounds how long a write a replica missed waits for the
	// registry to record that (repl.Config.HoldTimeout): long enough for
	// an election when the node lost led the registry (~1–3 s with
	// meta.Config's timeouts), well inside the host's 30 s I/O timeout.
	// Failover (docs/replication.md §3's lease) will want it within the
	// lease.
	replicaHold = 8 * time.Second
	// replicaReadyWait is how long serving a replicated volume waits for
	// its replica connections before it returns (the volume is then
	// online with them: a create answers once writes replicate); the
	// rest happens in the background (a node restarting before its
	// peers).
	replicaReadyWait = 5 * time.Second
	// replicaQueueDepth and replicaQueues size each replica connection:
	// 2 queues of 64 commands of MaxTransfer bytes of registered memory.
	replicaQueueDepth = 64
	replicaQueues     = 2
)

// fence is what a replica node admits on a volume's replica subsystem:
// the primary of one epoch.
type fence struct {
	primary string
	epoch   uint64
}

// replicas is a node's replication state: the fences of the volumes it
// is a secondary of, and the legs of the volumes it is primary of.
type replicas struct {
	mu      sync.Mutex
	fences  map[uint64]fence       // by volume ID, secondaries
	primary map[uint64]*primaryLeg // by volume ID, primaries
	host    map[uint64]*hostVolume // by volume ID, the ANA paths (failover.go)
	// limit is --rebuild-rate, shared by the node's rebuilds (nil:
	// unlimited).
	limit *repl.Limiter
}

// primaryLeg is a primary's replication of one volume.
type primaryLeg struct {
	nqn    string
	b      *repl.Backend
	epoch  uint64
	cancel context.CancelFunc
	done   chan struct{}
	ready  chan struct{} // closed once the backend serves
	leased chan struct{} // closed once the path serves: a lease (failover.go)
	lease  atomic.Int64  // mono() until which the term may serve (failover.go)
	lease1 sync.Once     // closes leased
	// imports counts an import's writes at the term's backend
	// (imagewrite.go): endTerm waits for them as for the hosts'.
	imports atomic.Int64
	mu      sync.Mutex
	ctrls   map[string]*initiator.Controller // by node, connected legs
	// boots is, by node, the boot ID of the replica's run that the leg
	// connected to (fetched before the connection; "": unknown): a
	// rebuild trusts the dirty-region log only if that run still answers
	// (boot.go).
	boots map[string]string
	// rebuilt is closed when the rebuild loop (rebuild.go) ended; nil
	// if it never started.
	rebuilt chan struct{}
	rebuild *repl.Rebuild // the last one started, under mu
}

// admit is the replica subsystem's admission of volume id: only the
// primary of the fence's epoch. An older epoch, or another node, is
// refused for good (DNR): that primary was deposed. A newer epoch than
// this node applied is refused for now: the registry copy catches up and
// the primary's next try is admitted.
func (rs *replicas) admit(id uint64, host string) error {
	node, epoch, ok := parseReplicaHostNQN(host)
	if !ok {
		return fmt.Errorf("host %s is not a replica connection", host)
	}
	rs.mu.Lock()
	f, have := rs.fences[id]
	rs.mu.Unlock()
	switch {
	case !have:
		return fmt.Errorf("this node holds no replica of the volume: %w", target.ErrAdmitRetry)
	case epoch < f.epoch:
		return fmt.Errorf("epoch %d is over: the volume is at epoch %d", epoch, f.epoch)
	case epoch > f.epoch:
		return fmt.Errorf("epoch %d not yet applied here (at %d): %w", epoch, f.epoch, target.ErrAdmitRetry)
	case node != f.primary:
		return fmt.Errorf("node %s is not the primary of epoch %d (%s is)", node, epoch, f.primary)
	}
	return nil
}

// replicaKeys are the replica subsystem's DH-HMAC-CHAP keys, for the
// primary's host NQN: it proves it holds the volume's replica secret and
// asks the replica to prove it too.
func replicaKeys(v meta.Volume) (target.HostKeys, error) {
	if v.ReplicaSecret == nil {
		return target.HostKeys{}, errors.New("the registry holds no replica secret for the volume")
	}
	hk, err := auth.ParseKey(v.ReplicaSecret.Host)
	if err != nil {
		return target.HostKeys{}, fmt.Errorf("replica secret: %w", err)
	}
	ck, err := auth.ParseKey(v.ReplicaSecret.Ctrl)
	if err != nil {
		return target.HostKeys{}, fmt.Errorf("replica controller secret: %w", err)
	}
	return target.HostKeys{Host: hk, Ctrl: &ck}, nil
}

// replicaReport is the body of POST /v1/internal/replica: a primary
// reports that a replica missed a write.
type replicaReport struct {
	Volume string `json:"volume"`
	Epoch  uint64 `json:"epoch"`
	Node   string `json:"node"`
	Reason string `json:"reason"`
	// State is what the primary asks for: out-of-sync (none: a replica
	// that missed a write), rebuilding (a rebuild starts), in-sync (a
	// rebuild copied everything).
	State meta.ReplicaState `json:"state,omitempty"`
}

// state is the state rep asks for.
func (rep replicaReport) state() meta.ReplicaState {
	if rep.State == "" {
		return meta.ReplicaOutOfSync
	}
	return rep.State
}

// reporter is a primary's repl.Reporter for one volume: it has the
// leader record the replica out of sync.
type reporter struct {
	d      *Daemon
	volume string
}

func (r reporter) ReplicaFailed(ctx context.Context, node string, epoch uint64, reason string) error {
	return r.d.reportReplica(ctx, replicaReport{Volume: r.volume, Epoch: epoch, Node: node, Reason: reason})
}

// reportReplica asks the leader to record rep's replica out of sync; nil
// once committed. It tries until ctx ends (repl's hold), every
// reportRetry, finding the leader again each time: the node lost may be
// the registry's leader, and the report then waits for the election.
// A refusal that trying again cannot change (a stale epoch: this node is
// no longer primary) ends it at once.
func (d *Daemon) reportReplica(ctx context.Context, rep replicaReport) error {
	for {
		err := d.reportOnce(ctx, rep)
		if err == nil || errors.Is(err, meta.ErrStaleEpoch) || errors.Is(err, errReportRefused) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(reportRetry):
		}
	}
}

// reportRetry is the pause between two tries of a replica report.
const reportRetry = 200 * time.Millisecond

// errReportRefused: the leader refused a replica report (4xx other than
// 421): trying again does not help.
var errReportRefused = errors.New("replica report refused")

func (d *Daemon) reportOnce(ctx context.Context, rep replicaReport) error {
	if d.node.IsLeader() {
		return d.mgr.SetReplicaState(ctx, rep.Volume, rep.Epoch, rep.Node, rep.state(), rep.Reason, false)
	}
	_, api := d.leaderAPI()
	if api == "" {
		return errors.New("no registry leader known")
	}
	err := d.postPeer(ctx, api, "/v1/internal/replica", rep, nil)
	var pa *peerAnswer
	if errors.As(err, &pa) && pa.status >= 400 && pa.status < 500 && pa.status != http.StatusMisdirectedRequest {
		return fmt.Errorf("%w: leader at %s %v", errReportRefused, api, err)
	}
	if err != nil {
		return fmt.Errorf("leader at %s: %w", api, err)
	}
	return nil
}

// internalReplica serves POST /v1/internal/replica on the leader.
func (d *Daemon) internalReplica(w http.ResponseWriter, r *http.Request) error {
	var rep replicaReport
	if err := decode(r, &rep); err != nil {
		return err
	}
	if rep.Volume == "" || rep.Node == "" || rep.Epoch == 0 {
		return badRequest(`"volume", "node" and "epoch" are required`)
	}
	switch rep.state() {
	case meta.ReplicaOutOfSync, meta.ReplicaRebuilding, meta.ReplicaInSync:
	default:
		return badRequest("state %q: a primary reports out-of-sync, rebuilding or in-sync", rep.State)
	}
	// Only the volume's primary reports on its replicas: a node
	// certificate naming another node is refused.
	if name, bound := certNode(r); bound {
		v, err := registryParts{d.node}.Volume(r.Context(), rep.Volume)
		if err != nil {
			return metaError(err, "")
		}
		if name != v.Node {
			return &apiError{http.StatusForbidden, fmt.Sprintf("node %s is not the primary of volume %q (%s is): only the primary reports its replicas", name, rep.Volume, v.Node)}
		}
	}
	if err := d.mgr.SetReplicaState(r.Context(), rep.Volume, rep.Epoch, rep.Node, rep.state(), rep.Reason, false); err != nil {
		return metaError(err, "")
	}
	writeJSON(w, http.StatusOK, map[string]string{"volume": rep.Volume, "node": rep.Node, "state": string(rep.state())})
	return nil
}

// legConfig is the initiator configuration of a primary's connection to
// one replica of v at epoch.
func (d *Daemon) legConfig(v meta.Volume, epoch uint64) initiator.Config {
	var sec meta.HostSecret
	if v.ReplicaSecret != nil {
		sec = *v.ReplicaSecret
	}
	return initiator.Config{
		Transport: initiator.TransportTCP, HostNQN: replicaHostNQN(d.cfg.NodeID, epoch),
		DHCHAPSecret: sec.Host, DHCHAPCtrlSecret: sec.Ctrl,
		Queues: replicaQueues, QueueDepth: replicaQueueDepth,
		KATO: replicaKATO, IOTimeout: replicaIOTimeout, AdminTimeout: 5 * time.Second,
		ConnectTimeout: 5 * time.Second, CtrlLossTimeout: replicaKATO,
		// A replica connection never comes back by itself: the replica's
		// process may have restarted and lost what it acknowledged
		// (boot.go). watchLeg reports it; a rebuild connects anew.
		NoReconnect: true,
		Logf: func(format string, args ...any) {
			d.log.Debug("replica connection", slog.String("volume", v.Name), slog.String("msg", fmt.Sprintf(format, args...)))
		},
	}
}

// startLegs connects the primary's legs to every other in-sync replica
// of v in the background and then lets the backend serve: until then
// its I/O is refused as inaccessible (a path error the host retries). A
// replica that cannot be reached within replicaConnectGrace is reported
// out of sync; if that report fails too, the backend keeps refusing and
// the next reconcile tries again.
func (d *Daemon) startLegs(pl *primaryLeg, v meta.Volume) {
	ctx, cancel := context.WithCancel(context.Background())
	pl.cancel = cancel
	pl.done = make(chan struct{})
	go func() {
		defer close(pl.done)
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			peers []repl.Peer
			bad   bool
		)
		for _, r := range v.ReplicaSet() {
			if r.Node == d.cfg.NodeID || r.State != meta.ReplicaInSync {
				continue
			}
			wg.Add(1)
			go func(node string) {
				defer wg.Done()
				boot := d.bootOf(ctx, node) // before the connection: see boot.go
				c, err := d.connectLeg(ctx, v, pl.epoch, node)
				if err == nil {
					ns := c.Namespace(1)
					if ns == nil {
						c.Close()
						err = errors.New("the replica subsystem has no namespace 1")
					} else {
						pl.mu.Lock()
						pl.ctrls[node] = c
						pl.boots[node] = boot
						pl.mu.Unlock()
						go d.watchLeg(ctx, pl, v.Name, node, c, ns)
						mu.Lock()
						peers = append(peers, repl.Peer{Node: node, NS: ns, MaxTransfer: c.Info().MaxTransfer})
						mu.Unlock()
						return
					}
				}
				if ctx.Err() != nil {
					return
				}
				reason := fmt.Sprintf("unreachable when node %s started serving at epoch %d: %v", d.cfg.NodeID, pl.epoch, err)
				rctx, rcancel := context.WithTimeout(ctx, ownerTimeout)
				defer rcancel()
				if rerr := (reporter{d, v.Name}).ReplicaFailed(rctx, node, pl.epoch, reason); rerr != nil {
					d.log.Error("replica unreachable and not recorded out of sync: the volume is not served", slog.String("volume", v.Name), slog.String("node", node), slog.String("err", rerr.Error()))
					mu.Lock()
					bad = true
					mu.Unlock()
				}
			}(r.Node)
		}
		wg.Wait()
		if ctx.Err() != nil || bad {
			return
		}
		if err := pl.b.SetPeers(pl.epoch, peers); err != nil {
			d.log.Error("replicated volume not served", slog.String("volume", v.Name), slog.String("err", err.Error()))
			return
		}
		pl.b.SetServing(true)
		pl.mu.Lock()
		pl.rebuilt = make(chan struct{})
		pl.mu.Unlock()
		close(pl.ready)
		d.log.Info("replicated volume served", slog.String("volume", v.Name), slog.Uint64("epoch", pl.epoch), slog.Int("legs", len(peers)))
		d.kickLease() // the path turns optimized with the lease
		go d.rebuildLoop(ctx, pl, v.ID, v.Name)
	}()
}

// connectLeg connects to node's replica subsystem of v, retrying until
// replicaConnectGrace passes or the replica refuses for good.
func (d *Daemon) connectLeg(ctx context.Context, v meta.Volume, epoch uint64, node string) (*initiator.Controller, error) {
	ctx, cancel := context.WithTimeout(ctx, replicaConnectGrace)
	defer cancel()
	var last error
	for {
		var addr string
		d.node.FSM().Read(func(s *meta.State) {
			if n, ok := s.Node(node); ok {
				addr = n.ReplicaTCPAddr()
			}
		})
		if addr == "" {
			last = fmt.Errorf("node %s has no NVMe/TCP address", node)
		} else {
			c, err := initiator.Connect(ctx, d.legConfig(v, epoch), addr, replicaNQN(v.ID))
			if err == nil {
				return c, nil
			}
			last = err
		}
		select {
		case <-ctx.Done():
			return nil, last
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// stop ends the legs' connections (the volume is no longer served here).
func (pl *primaryLeg) stop() {
	if pl.cancel != nil {
		pl.cancel()
		<-pl.done
	}
	pl.mu.Lock()
	rebuilt := pl.rebuilt
	pl.mu.Unlock()
	if rebuilt != nil {
		<-rebuilt
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for n, c := range pl.ctrls {
		c.Close()
		delete(pl.ctrls, n)
	}
}

// serveReplica serves (or brings up to date) v's replica subsystem on
// this node, a secondary of v: the fence admits v's primary at v's
// epoch, and a primary of an older epoch still connected is torn down,
// its writes at the store drained, before serveReplica returns — so no
// write of a deposed primary lands after the registry moved on.
func (d *Daemon) serveReplica(v meta.Volume) error {
	keys, err := replicaKeys(v)
	if err != nil {
		return err
	}
	want := fence{primary: v.Node, epoch: v.CurrentEpoch()}
	host := replicaHostNQN(want.primary, want.epoch)
	nqn := replicaNQN(v.ID)
	rs := &d.repl
	sub, ok := d.tgt.Subsystem(nqn)
	if !ok {
		vol, err := d.store.Volume(store.ID(v.ID))
		if err != nil {
			return err
		}
		rs.mu.Lock()
		rs.fences[v.ID] = want
		rs.mu.Unlock()
		id := v.ID
		sub, err = d.tgt.AddSubsystem(target.SubsystemConfig{
			NQN: nqn, Serial: fmt.Sprintf("blk-r%d", v.ID), Model: "blk replica",
			HostKeys: map[string]target.HostKeys{host: keys},
			Admit:    func(h string) error { return rs.admit(id, h) },
		})
		if err != nil {
			return err
		}
		if err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Async: d.sio.Backend(vol)}); err != nil {
			_ = d.tgt.RemoveSubsystem(nqn)
			return err
		}
		return d.serveStandby(v)
	}
	rs.mu.Lock()
	old := rs.fences[v.ID]
	rs.mu.Unlock()
	if old == want {
		return d.serveStandby(v)
	}
	if want.epoch < old.epoch {
		return fmt.Errorf("registry copy at epoch %d, the fence at %d", want.epoch, old.epoch)
	}
	if err := sub.SetHostKeys(host, &keys); err != nil {
		return err
	}
	rs.mu.Lock()
	rs.fences[v.ID] = want
	rs.mu.Unlock()
	oldHost := replicaHostNQN(old.primary, old.epoch)
	ctx, cancel := context.WithTimeout(context.Background(), ownerTimeout)
	defer cancel()
	n, err := sub.EvictAndDrain(ctx, func(h string) bool { return h != host })
	if err != nil {
		return fmt.Errorf("fence of epoch %d: %w", want.epoch, err)
	}
	_ = sub.SetHostKeys(oldHost, nil)
	d.log.Info("fence raised", slog.String("volume", v.Name), slog.String("primary", want.primary), slog.Uint64("epoch", want.epoch), slog.Int("evicted", n))
	return d.serveStandby(v)
}

// unserveReplica removes v's replica subsystem from this node, once
// every write its primary had submitted here completed: this node
// becomes the primary (or stops holding the volume), and none of the
// old primary's writes may land after that.
func (d *Daemon) unserveReplica(id uint64) error {
	if sub, ok := d.tgt.Subsystem(replicaNQN(id)); ok {
		ctx, cancel := context.WithTimeout(context.Background(), ownerTimeout)
		n, err := sub.EvictAndDrain(ctx, func(string) bool { return true })
		cancel()
		if err != nil {
			return fmt.Errorf("replica subsystem of volume %d: drain: %w", id, err)
		}
		if n > 0 {
			d.log.Info("replica connections closed and drained", slog.Uint64("volume_id", id), slog.Int("evicted", n))
		}
	}
	if err := d.tgt.RemoveSubsystem(replicaNQN(id)); err != nil && !errors.Is(err, target.ErrNotFound) {
		return err
	}
	d.repl.mu.Lock()
	delete(d.repl.fences, id)
	d.repl.mu.Unlock()
	return nil
}

// newPrimaryLeg makes the replication of v, served by this node as its
// primary over the local backend: it serves nothing until startLegs has
// connected (or recorded out of sync) every other in-sync replica.
func (d *Daemon) newPrimaryLeg(v meta.Volume, local target.AsyncBackend) (*primaryLeg, error) {
	name := v.Name
	b, err := repl.New(repl.Config{
		Local: local, Reporter: reporter{d, name}, Epoch: v.CurrentEpoch(), HoldTimeout: replicaHold,
		Logger: d.log.With(slog.String("volume", name)),
		LocalFailed: func(err error) {
			d.log.Error("replicated volume: the local copy failed a write; the volume is no longer served here", slog.String("volume", name), slog.String("err", err.Error()))
		},
	})
	if err != nil {
		return nil, err
	}
	// Until its replicas are connected: reads from the local copy (in
	// sync: this node is the primary of the registry's epoch), writes
	// refused with the path status (a host retries them).
	b.SetServing(false)
	b.SetReadOnly(true)
	return &primaryLeg{nqn: v.NQN, b: b, epoch: v.CurrentEpoch(), ctrls: map[string]*initiator.Controller{}, boots: map[string]string{}, ready: make(chan struct{}), leased: make(chan struct{})}, nil
}

// stopPrimaryLeg ends the replication of the volume served under nqn,
// once its subsystem is gone (no host I/O is left at the backend).
func (d *Daemon) stopPrimaryLeg(nqn string) {
	d.repl.mu.Lock()
	var pl *primaryLeg
	for id, p := range d.repl.primary {
		if p.nqn == nqn {
			pl = p
			delete(d.repl.primary, id)
			break
		}
	}
	d.repl.mu.Unlock()
	if pl != nil {
		pl.stop()
	}
}

// refreshPrimaryLeg closes the connections of the replicas v no longer
// holds in sync (the backend stopped writing to them when their leg
// failed; the registry has recorded it now).
func (d *Daemon) refreshPrimaryLeg(v meta.Volume) {
	d.repl.mu.Lock()
	pl := d.repl.primary[v.ID]
	d.repl.mu.Unlock()
	if pl == nil {
		return
	}
	d.dropRemovedPeers(pl, v) // replace.go
	// A replica the backend counts in sync while v does not: v is older
	// than the rebuild's commit (rebuild.go), not a loss.
	inSync := map[string]bool{}
	for _, p := range pl.b.Stats().Peers {
		inSync[p.Node] = p.State == "in-sync"
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for node, c := range pl.ctrls {
		if r, ok := v.Replica(node); (!ok || r.State != meta.ReplicaInSync) && !(ok && inSync[node]) {
			c.Close()
			delete(pl.ctrls, node)
		}
	}
}

// dead says whether pl no longer serves and will not again by itself:
// its legs were set up (or failed to be) and the backend stopped serving
// (a replica's loss the registry could not record, a local failure). The
// next reconcile serves the volume again, from scratch (targetParts.Served).
func (pl *primaryLeg) dead() bool {
	select {
	case <-pl.done:
		return !pl.b.Serving()
	default:
		return false
	}
}

// deadPrimaryLeg says whether the volume served under nqn is a
// replicated one whose replication is dead.
func (d *Daemon) deadPrimaryLeg(nqn string) bool {
	d.repl.mu.Lock()
	defer d.repl.mu.Unlock()
	for _, pl := range d.repl.primary {
		if pl.nqn == nqn {
			return pl.dead()
		}
	}
	return false
}

// waitPrimaryLegs waits until every replicated volume this node is
// primary of serves (its replicas connected or recorded out of sync, its
// lease granted), at most for limit.
func (d *Daemon) waitPrimaryLegs(ctx context.Context, limit time.Duration) {
	d.repl.mu.Lock()
	var pls []*primaryLeg
	for _, pl := range d.repl.primary {
		pls = append(pls, pl)
	}
	d.repl.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for _, pl := range pls {
		select {
		case <-pl.leased:
		case <-pl.done:
		case <-ctx.Done():
			d.log.Warn("replicated volumes still connecting their replicas: serving reads only until they do", slog.Duration("waited", limit))
			return
		}
	}
}

// replicationStats is what metrics.ReplicationCollector exports: the
// replication of every volume this node is primary of.
func (d *Daemon) replicationStats() []metrics.ReplicaVolume {
	d.repl.mu.Lock()
	pls := make(map[uint64]*primaryLeg, len(d.repl.primary))
	for id, pl := range d.repl.primary {
		pls[id] = pl
	}
	d.repl.mu.Unlock()
	names := d.volumeLabels()
	out := make([]metrics.ReplicaVolume, 0, len(pls))
	for id, pl := range pls {
		name := names[id].Name
		if name == "" {
			name = strconv.FormatUint(id, 10)
		}
		out = append(out, metrics.ReplicaVolume{Name: name, Stats: pl.b.Stats()})
	}
	return out
}
