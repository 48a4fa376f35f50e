package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme/auth"
	"github.com/blk-project/blk/store"
)

// Errors of Manager's operations, besides the registry's own (meta.Err*).
var (
	// ErrInvalid: the request breaks a limit of the store or target; it
	// was refused before anything was written to the registry.
	ErrInvalid = errors.New("control: invalid request")
	// ErrOwnerUnreachable: the registry holds the intent, but the
	// volume's owner node did not answer; it converges when it can (its
	// restart, or the leader's next settle round).
	ErrOwnerUnreachable = errors.New("control: owner node unreachable")
	// ErrOwnerFailed: the owner tried and could not; the reason follows.
	ErrOwnerFailed = errors.New("control: owner node failed")
	// ErrCapacity: the node cannot be promised more bytes of volumes (its
	// disk times its overcommit ratio); refused before anything is
	// written.
	ErrCapacity = errors.New("control: not enough capacity on the node")
)

// Registry is what Manager needs of the replicated registry (meta.Node,
// adapted in cmd/blkd; meta.State directly in tests). Manager runs on the
// registry leader.
type Registry interface {
	// Apply commits a command and returns its result; Result.Err is
	// returned as the error.
	Apply(ctx context.Context, c meta.Command) (meta.Result, error)
	// Volume reads one volume, linearizably; meta.ErrUnknownVolume if
	// the registry has none of that name.
	Volume(ctx context.Context, name string) (meta.Volume, error)
	// Volumes reads every volume, linearizably.
	Volumes(ctx context.Context) ([]meta.Volume, error)
	// Connections reads every attachment.
	Connections(ctx context.Context) ([]meta.Connection, error)
	// Node reads one node.
	Node(ctx context.Context, id string) (meta.NodeInfo, error)
	// Nodes reads every node.
	Nodes(ctx context.Context) ([]meta.NodeInfo, error)
	// Place chooses nodes for a new volume (meta.State.Place) from a
	// linearizable read of the registry.
	Place(ctx context.Context, req meta.PlaceRequest) ([]string, error)
}

// Owners reaches the reconciler of a volume's owner node: in process for
// the local node, over the network for the others.
type Owners interface {
	// Reconcile asks node to reconcile the volume called name from its
	// copy of the registry once that copy has applied index, and returns
	// the volume's local status there (StateDeleted if the registry no
	// longer has it). An error means the node did not answer.
	Reconcile(ctx context.Context, node, name string, index uint64) (Status, error)
}

// Answerer is an optional interface of Owners: whether node answers now.
// Create asks it of the node placement chose (not of a node the request
// names): the registry may still have a node up that died a moment ago,
// since the leader marks a node down only after it has been silent for a
// while (seconds; longer after a change of leader), and a volume placed on
// it would stay creating until the node came back.
type Answerer interface {
	Answers(ctx context.Context, node string) bool
}

// DiskReporter is an optional interface of Owners: why node's store
// refuses new clusters now (its disk is full), "" if it has room or
// cannot say. The registry promises a node's capacity by its volumes'
// sizes, not its snapshots' (docs/snapshots.md §2.2: what a snapshot
// holds grows with the writes after it, which the registry does not
// see), so a node can fill up under its promise; placement then leaves
// it out, and a create pinned to it is refused, rather than make a
// volume whose first write fails.
type DiskReporter interface {
	DiskFull(ctx context.Context, node string) string
}

// Manager runs the management operations on the registry leader: each
// is a short sequence of registry commands around one call to the
// owner's Reconcile, so that a crash between any two steps leaves intent
// in the registry that a later Reconcile (restart, retry, settle round)
// completes. Requests are checked against every limit before anything is
// written. Operations on the same volume are serialized; different
// volumes proceed in parallel.
type Manager struct {
	reg    Registry
	owners Owners

	// DetachAfter is how long a registry attachment may have no live
	// controller behind it before Settle removes it (the host
	// disconnected for good). Zero keeps attachments forever. A host
	// reconnecting within it (a blkd restart, a network blip) keeps it.
	DetachAfter time.Duration
	// Now is the clock (tests replace it).
	Now func() time.Time
	// MaxReplicas is the most replicas a volume may have, and caps the
	// default (3 with three zones); 0 means 1. blkd sets 1 until its data
	// path replicates writes.
	MaxReplicas int
	// Log receives the replica changes this manager commits
	// ("replica state", "replica primary"); nil discards them. blkd
	// passes its audit log.
	Log *slog.Logger
	// missing: when each attachment was first seen without a controller.
	mmu     sync.Mutex
	missing map[attachKey]time.Time

	mu    sync.Mutex
	locks map[string]*nameLock

	// placeMu serializes choosing a new volume's node (or checking the
	// capacity of the one asked for) with committing the volume, so that
	// two creates at once each see the other's bytes promised.
	placeMu sync.Mutex
}

type nameLock struct {
	mu   sync.Mutex
	refs int
}

// NewManager returns a manager over reg and owners.
func NewManager(reg Registry, owners Owners) *Manager {
	return &Manager{reg: reg, owners: owners, locks: make(map[string]*nameLock), Now: time.Now, missing: make(map[attachKey]time.Time)}
}

type attachKey struct{ host, volume, node string }

// lock serializes operations on one volume name.
func (m *Manager) lock(name string) func() {
	m.mu.Lock()
	l := m.locks[name]
	if l == nil {
		l = &nameLock{}
		m.locks[name] = l
	}
	l.refs++
	m.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.locks, name)
		}
		m.mu.Unlock()
	}
}

// CreateRequest asks for a new volume.
type CreateRequest struct {
	Name      string
	SizeBytes uint64
	BlockSize uint32 // 0: store.DefaultBlockSize
	// Node pins the volume to a node; "": the registry places it
	// (meta.State.Place).
	Node string
	NQN  string // "": meta.DefaultNQN(Name)
	// Replicas is how many copies, each on a node of its own zone
	// (Node, when set, holds the first: the primary); 0: 3 if the
	// cluster has three eligible zones, else 1 — capped by
	// Manager.MaxReplicas. The choice is stored (meta.Volume.Want).
	Replicas int
}

// Create registers a volume, has its owner create and serve it, and
// marks it online. If the owner cannot, the volume is deleted again and
// the error says why; if the owner does not answer, the volume stays
// creating and is finished by the owner when it can.
//
// Placement runs here, on the registry leader, from a linearizable read
// of the registry: a follower's copy may lag (a node just marked down,
// a volume just created), so a follower's choice could be stale. The
// chosen node travels in the CreateVolume command and the state machine
// checks again, when the entry is applied, that it is known and up; the
// capacity is checked here, under placeMu, which orders every create's
// choice after the previous create's commit.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (meta.Volume, error) {
	if req.BlockSize == 0 {
		req.BlockSize = store.DefaultBlockSize
	}
	if err := checkShape(req.SizeBytes, req.BlockSize); err != nil {
		return meta.Volume{}, fmt.Errorf("%w: volume %q: %v", ErrInvalid, req.Name, err)
	}
	cmd := meta.CreateVolume{
		Name: req.Name, SizeBytes: req.SizeBytes, BlockSize: req.BlockSize,
		Node: req.Node, NQN: req.NQN, At: m.Now().UnixNano(),
	}
	if err := cmd.Check(); err != nil {
		return meta.Volume{}, err // the registry's own error: 400 with its hint
	}
	n, explicit, err := m.replicaCount(ctx, req.Replicas)
	if err != nil {
		return meta.Volume{}, err
	}
	defer m.lock(req.Name)()
	res, err := m.place(ctx, cmd, n, explicit)
	if err != nil {
		return meta.Volume{}, err
	}
	return m.finishCreate(ctx, *res.Volume, res.Index, "create")
}

// finishCreate has the nodes of v, a volume just registered (creating)
// at index, make it, and puts it online; what ("create", "clone") names
// the operation in errors. A node that fails undoes it all.
func (m *Manager) finishCreate(ctx context.Context, v meta.Volume, index uint64, what string) (meta.Volume, error) {
	sts, errs := m.reconcileReplicas(ctx, v, index)
	for _, node := range replicaNodes(v) {
		if st, ok := sts[node]; ok && st.State != readyState(v, node) {
			// Leave nothing half-made: delete what the nodes made, forget it.
			ctx := context.WithoutCancel(ctx)
			if r, err := m.reg.Apply(ctx, meta.DeleteVolume{Name: v.Name, Force: true}); err == nil {
				if d, errs := m.reconcileReplicas(ctx, *r.Volume, r.Index); len(errs) == 0 && allDeleted(d) {
					_, _ = m.reg.Apply(ctx, meta.PurgeVolume{Name: v.Name})
				}
			}
			return meta.Volume{}, fmt.Errorf("%w: %s volume %q on node %s: %s", ErrOwnerFailed, what, v.Name, node, st.Reason)
		}
	}
	for _, node := range replicaNodes(v) {
		if err := errs[node]; err != nil {
			return v, fmt.Errorf("%w: volume %q is registered (creating) but node %s did not create it yet: %v; it finishes when the node is reachable", ErrOwnerUnreachable, v.Name, node, err)
		}
	}
	return m.settle(ctx, v, sts[v.Node], true)
}

// readyState is the local state a node reports for a new volume it
// holds a replica of: online on the primary, standby elsewhere.
func readyState(v meta.Volume, node string) State {
	if node == v.Node {
		return StateOnline
	}
	return StateStandby
}

func allDeleted(sts map[string]Status) bool {
	for _, st := range sts {
		if st.State != StateDeleted {
			return false
		}
	}
	return true
}

// reconcileReplicas has every replica node of v reconcile it as of
// index: the primary first, then the secondaries in placement order. It
// returns the statuses of the nodes that answered and the errors of those
// that did not.
func (m *Manager) reconcileReplicas(ctx context.Context, v meta.Volume, index uint64) (map[string]Status, map[string]error) {
	sts := make(map[string]Status)
	var errs map[string]error
	// Secondaries first: a primary starting to serve connects to their
	// replica subsystems.
	nodes := replicaNodes(v)
	if len(nodes) > 1 && nodes[0] == v.Node {
		nodes = append(nodes[1:len(nodes):len(nodes)], nodes[0])
	}
	for _, node := range nodes {
		st, err := m.owners.Reconcile(ctx, node, v.Name, index)
		if err != nil {
			if errs == nil {
				errs = make(map[string]error)
			}
			errs[node] = err
			continue
		}
		sts[node] = st
	}
	return sts, errs
}

// Delete moves a volume to deleting (refused while hosts are connected,
// unless force), has its owner remove it, and forgets it. A volume left
// deleting by an earlier failure is finished.
func (m *Manager) Delete(ctx context.Context, name string, force bool) error {
	return m.DeleteWith(ctx, name, force, false)
}

// DeleteWith is Delete; withSnapshots deletes the volume's snapshots
// with it (refused while one has clones), where Delete refuses a volume
// that has snapshots (meta.ErrHasSnapshots, naming them).
func (m *Manager) DeleteWith(ctx context.Context, name string, force, withSnapshots bool) error {
	defer m.lock(name)()
	v, err := m.reg.Volume(ctx, name)
	if err != nil {
		return err
	}
	index := uint64(0)
	if v.State != meta.VolumeDeleting && !force {
		// Live controllers count as users, attached through blk or not:
		// ask the owner who is connected before deleting anything.
		st, err := m.owners.Reconcile(ctx, v.Node, name, 0)
		switch {
		case err != nil:
			return fmt.Errorf("%w: volume %q: node %s did not answer, so whether hosts are connected to it is unknown: %v; delete with force to go ahead anyway", ErrOwnerUnreachable, name, v.Node, err)
		case len(st.Connected) > 0:
			return fmt.Errorf("meta: volume %q: hosts connected to it now: %s: %w", name, strings.Join(st.Connected, ", "), meta.ErrHasConnections)
		}
	}
	if v.State != meta.VolumeDeleting {
		res, err := m.reg.Apply(ctx, meta.DeleteVolume{Name: name, Force: force, WithSnapshots: withSnapshots})
		if err != nil {
			return err
		}
		v, index = *res.Volume, res.Index
	}

	// Every replica node removes its copy; the registry forgets the
	// volume only once all did, or a node never would.
	sts, errs := m.reconcileReplicas(ctx, v, index)
	for _, node := range replicaNodes(v) {
		err := errs[node]
		if err != nil && force {
			// A forced delete of a volume whose node the cluster has
			// marked down forgets it without the node: otherwise a dead
			// node's volumes could never be purged, nor the node removed.
			// If the node comes back, its reconcile finds the data
			// unknown to the registry and reports it as an orphan (kept,
			// not served).
			if n, nerr := m.reg.Node(ctx, node); nerr == nil && n.State == meta.NodeDown {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("%w: volume %q is deleting, but node %s did not remove it yet: %v; delete again, or it finishes when the node restarts (or, once the cluster shows the node down, delete with force to forget it)", ErrOwnerUnreachable, name, node, err)
		}
		if st := sts[node]; st.State != StateDeleted {
			return fmt.Errorf("%w: delete volume %q on node %s: %s", ErrOwnerFailed, name, node, st.Reason)
		}
	}
	return m.purgeVolume(ctx, v)
}

// purgeVolume forgets v, deleted on every node: its snapshots (each
// node deleted its copies of them with the volume) first.
func (m *Manager) purgeVolume(ctx context.Context, v meta.Volume) error {
	for _, s := range v.Snapshots {
		if _, err := m.reg.Apply(ctx, meta.PurgeSnapshot{Volume: v.Name, Name: s.Name}); err != nil && !errors.Is(err, meta.ErrUnknownSnapshot) {
			return err
		}
	}
	_, err := m.reg.Apply(ctx, meta.PurgeVolume{Name: v.Name})
	return err
}

// Resize grows a volume to size bytes; the size is checked against the
// store's limits before the registry changes.
func (m *Manager) Resize(ctx context.Context, name string, size uint64) (meta.Volume, error) {
	defer m.lock(name)()
	v, err := m.reg.Volume(ctx, name)
	if err != nil {
		return v, err
	}
	if err := checkShape(size, v.BlockSize); err != nil {
		return v, fmt.Errorf("%w: resize volume %q: %v", ErrInvalid, name, err)
	}
	if size > v.SizeBytes {
		for _, node := range replicaNodes(v) {
			if err := m.checkCapacity(ctx, node, size-v.SizeBytes, name); err != nil {
				return v, err
			}
		}
	}
	res, err := m.reg.Apply(ctx, meta.ResizeVolume{Name: name, SizeBytes: size})
	if err != nil {
		return v, err
	}
	// Every replica grows, the secondaries first: a primary that shows
	// hosts the new size while a copy is still short could not replicate
	// writes past its end.
	v = *res.Volume
	for _, node := range replicaNodes(v) {
		if node == v.Node {
			continue
		}
		st, err := m.owners.Reconcile(ctx, node, v.Name, res.Index)
		switch {
		case err != nil:
			return v, fmt.Errorf("%w: volume %q: the registry is updated, but replica node %s did not grow it yet: %v; it does when it is reachable", ErrOwnerUnreachable, v.Name, node, err)
		case st.State == StateFailed:
			return v, fmt.Errorf("%w: volume %q: replica on node %s: %s", ErrOwnerFailed, v.Name, node, st.Reason)
		}
	}
	return m.converge(ctx, v, res.Index)
}

// AllowHost adds host to a volume's allowed hosts; with secrets (Host
// set), the host must authenticate with them.
func (m *Manager) AllowHost(ctx context.Context, name, host string, secrets meta.HostSecret) (meta.Volume, error) {
	cmd := meta.AllowHost{Volume: name, HostNQN: host, Secret: secrets.Host, CtrlSecret: secrets.Ctrl}
	if err := cmd.Check(); err != nil {
		return meta.Volume{}, err
	}
	if err := checkSecrets(secrets); err != nil {
		return meta.Volume{}, err
	}
	defer m.lock(name)()
	res, err := m.reg.Apply(ctx, cmd)
	if err != nil {
		return meta.Volume{}, err
	}
	return m.converge(ctx, *res.Volume, res.Index)
}

// DisallowHost removes host from a volume's allowed hosts (refused while
// it is connected, unless force).
func (m *Manager) DisallowHost(ctx context.Context, name, host string, force bool) (meta.Volume, error) {
	defer m.lock(name)()
	res, err := m.reg.Apply(ctx, meta.DisallowHost{Volume: name, HostNQN: host, Force: force})
	if err != nil {
		return meta.Volume{}, err
	}
	return m.converge(ctx, *res.Volume, res.Index)
}

// converge has v's owner reconcile it as of index and records the outcome.
func (m *Manager) converge(ctx context.Context, v meta.Volume, index uint64) (meta.Volume, error) {
	return m.convergeOn(ctx, v, index, true)
}

// convergeOn is converge; without secondaries, the other replicas' nodes
// are not asked (the caller has).
func (m *Manager) convergeOn(ctx context.Context, v meta.Volume, index uint64, secondaries bool) (meta.Volume, error) {
	st, err := m.owners.Reconcile(ctx, v.Node, v.Name, index)
	if err != nil {
		return v, fmt.Errorf("%w: volume %q: the registry is updated, but node %s did not apply it yet: %v; it does when it is reachable", ErrOwnerUnreachable, v.Name, v.Node, err)
	}
	v, err = m.settle(ctx, v, st, true)
	if err != nil {
		return v, err
	}
	if secondaries {
		m.reconcileSecondaries(ctx, v, index)
	}
	if st.State == StateFailed {
		return v, fmt.Errorf("%w: volume %q on node %s: %s", ErrOwnerFailed, v.Name, v.Node, st.Reason)
	}
	return v, nil
}

// reconcileSecondaries has every other replica's node that is up
// reconcile v: each exports the volume as a path to hosts (ANA
// inaccessible), with the volume's hosts and secrets, which must follow
// the registry there too. One that does not answer is logged and left to
// the settle rounds.
func (m *Manager) reconcileSecondaries(ctx context.Context, v meta.Volume, index uint64) {
	set := v.ReplicaSet()
	if len(set) < 2 {
		return
	}
	nodes, err := m.reg.Nodes(ctx)
	if err != nil {
		return
	}
	up := map[string]bool{}
	for _, n := range nodes {
		up[n.ID] = n.State == meta.NodeUp
	}
	for _, r := range set {
		if r.Node == v.Node || !up[r.Node] {
			continue
		}
		if _, err := m.owners.Reconcile(ctx, r.Node, v.Name, index); err != nil {
			m.logger().Warn("a secondary did not reconcile the volume", "volume", v.Name, "node", r.Node, "err", err)
		}
	}
}

// settle records the primary's status in the registry: a volume it
// serves becomes online (offline), one it cannot serve failed with the
// reason, one it deleted is purged. others says every other replica node
// is done too (deleted, or holding its copy): a deleting volume is purged,
// a creating one put online, only then. It returns the registry's volume
// afterwards.
func (m *Manager) settle(ctx context.Context, v meta.Volume, st Status, others bool) (meta.Volume, error) {
	var c meta.Command
	switch {
	case v.State == meta.VolumeDeleting:
		if st.State == StateDeleted && others {
			return v, m.purgeVolume(ctx, v)
		}
	case v.State == meta.VolumeCreating && !others:
	case st.State == StateOnline && v.State != meta.VolumeOnline:
		c = meta.SetVolumeState{Name: v.Name, State: meta.VolumeOnline}
	case st.State == StateOffline && v.State != meta.VolumeOffline:
		c = meta.SetVolumeState{Name: v.Name, State: meta.VolumeOffline}
	case st.State == StateFailed:
		reason := truncate(st.Reason, 1000)
		if v.State != meta.VolumeFailed || v.Reason != reason {
			c = meta.SetVolumeState{Name: v.Name, State: meta.VolumeFailed, Reason: reason}
		}
	case st.State == StateDegraded:
		reason := truncate(st.Reason, 1000)
		if v.State != meta.VolumeDegraded || v.Reason != reason {
			c = meta.SetVolumeState{Name: v.Name, State: meta.VolumeDegraded, Reason: reason}
		}
	}
	if c == nil {
		return v, nil
	}
	res, err := m.reg.Apply(ctx, c)
	if err != nil {
		return v, err
	}
	if res.Volume != nil {
		return *res.Volume, nil
	}
	return v, nil
}

// Settle is one round of the leader's control loop: every volume's owner
// reconciles it and the registry records the outcome (creating volumes
// finished, failed ones marked with their reason or back online,
// deleting ones purged). It returns the owners that did not answer; the
// rest proceed regardless.
func (m *Manager) Settle(ctx context.Context) (unreachable map[string]error, err error) {
	vols, err := m.reg.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	conns, err := m.reg.Connections(ctx)
	if err != nil {
		return nil, err
	}
	for _, v := range vols {
		if _, bad := unreachable[v.Node]; bad {
			continue
		}
		func() {
			defer m.lock(v.Name)()
			cur, err := m.reg.Volume(ctx, v.Name)
			if err != nil {
				return // purged meanwhile
			}
			st, err := m.owners.Reconcile(ctx, cur.Node, cur.Name, 0)
			if err != nil {
				if unreachable == nil {
					unreachable = make(map[string]error)
				}
				unreachable[cur.Node] = err
				return
			}
			// The secondaries: create, grow or delete their copies.
			others := true
			sts := map[string]Status{cur.Node: st}
			for _, node := range replicaNodes(cur) {
				if node == cur.Node {
					continue
				}
				if _, bad := unreachable[node]; bad {
					others = false
					continue
				}
				sst, err := m.owners.Reconcile(ctx, node, cur.Name, 0)
				if err != nil {
					if unreachable == nil {
						unreachable = make(map[string]error)
					}
					unreachable[node] = err
					others = false
					continue
				}
				sts[node] = sst
				if sst.State != readyState(cur, node) && sst.State != StateDeleted {
					others = false
				}
				if cur.State == meta.VolumeDeleting && sst.State != StateDeleted {
					others = false
				}
			}
			m.settleSnapshots(ctx, cur, sts, len(sts) == len(replicaNodes(cur)))
			_, _ = m.settle(ctx, cur, st, others)
			m.expireAttachments(ctx, cur, st, conns)
		}()
	}
	return unreachable, nil
}

// expireAttachments removes v's registry attachments on its owner that
// have had no live controller for DetachAfter.
func (m *Manager) expireAttachments(ctx context.Context, v meta.Volume, st Status, conns []meta.Connection) {
	if m.DetachAfter <= 0 || (st.State != StateOnline && st.State != StateDegraded) {
		return
	}
	m.mmu.Lock()
	defer m.mmu.Unlock()
	now := m.Now()
	for _, c := range conns {
		if c.Volume != v.Name || c.Node != v.Node {
			continue
		}
		k := attachKey{c.HostNQN, c.Volume, c.Node}
		if slices.Contains(st.Connected, c.HostNQN) {
			delete(m.missing, k)
			continue
		}
		first, ok := m.missing[k]
		if !ok {
			m.missing[k] = now
			continue
		}
		if now.Sub(first) >= m.DetachAfter {
			if _, err := m.reg.Apply(ctx, meta.Disconnect{HostNQN: c.HostNQN, Volume: c.Volume, Node: c.Node}); err == nil {
				delete(m.missing, k)
			}
		}
	}
}

// place commits cmd on the node it names, or, if it names none, on the
// node the registry places it on. A named node must be known, up and
// have the capacity; that is checked before anything is written, and the
// registry checks the first two again when it applies the command.
func (m *Manager) place(ctx context.Context, cmd meta.CreateVolume, replicas int, explicit bool) (meta.Result, error) {
	m.placeMu.Lock()
	defer m.placeMu.Unlock()
	if cmd.Node == "" {
		nodes, err := m.placeAnswering(ctx, meta.PlaceRequest{Replicas: replicas, SizeBytes: cmd.SizeBytes})
		if err != nil {
			return meta.Result{}, err
		}
		cmd.Node = nodes[0]
		if explicit {
			cmd.Replicas = nodes
		}
	} else {
		n, err := m.reg.Node(ctx, cmd.Node)
		switch {
		case errors.Is(err, meta.ErrUnknownNode):
			return meta.Result{}, fmt.Errorf("meta: node %q: %w", cmd.Node, meta.ErrUnknownNode)
		case err != nil:
			return meta.Result{}, err
		case n.State != meta.NodeUp:
			return meta.Result{}, fmt.Errorf("meta: node %q is %v: %w", n.ID, n.State, meta.ErrNodeNotUp)
		}
		if err := m.checkCapacity(ctx, cmd.Node, cmd.SizeBytes, ""); err != nil {
			return meta.Result{}, err
		}
		if d, ok := m.owners.(DiskReporter); ok {
			if why := d.DiskFull(ctx, cmd.Node); why != "" {
				return meta.Result{}, fmt.Errorf("%w: a new volume on node %s: %s; free space there (delete snapshots or volumes) or choose another node", ErrCapacity, cmd.Node, why)
			}
		}
		if explicit {
			cmd.Replicas = []string{cmd.Node}
		}
		if replicas > 1 {
			// The pinned node is the primary; the others are placed
			// outside its zone.
			others, err := m.placeAnswering(ctx, meta.PlaceRequest{Replicas: replicas - 1, SizeBytes: cmd.SizeBytes, Taken: []string{cmd.Node}})
			if err != nil {
				return meta.Result{}, err
			}
			cmd.Replicas = append(cmd.Replicas, others...)
		}
	}
	if len(cmd.Replicas) > 1 {
		rs, err := NewReplicaSecret()
		if err != nil {
			return meta.Result{}, err
		}
		cmd.ReplicaSecret = &rs
	}
	return m.reg.Apply(ctx, cmd)
}

// NewReplicaSecret makes a volume's replica key pair: two random
// 32-byte DH-HMAC-CHAP secrets (DHHC-1, SHA-256 transformed), the
// primary's and the replicas'. They live in the registry only.
func NewReplicaSecret() (meta.HostSecret, error) {
	var out [2]string
	for i := range out {
		k, err := auth.GenerateKey(auth.SHA256, 32)
		if err != nil {
			return meta.HostSecret{}, fmt.Errorf("replica secret: %w", err)
		}
		out[i] = k.Encode()
	}
	return meta.HostSecret{Host: out[0], Ctrl: out[1]}, nil
}

// checkCapacity refuses adding more bytes of volumes to node than its
// registered capacity leaves (what its volumes are promised already, the
// deleting ones excluded). A node that registered no capacity has no
// limit.
func (m *Manager) checkCapacity(ctx context.Context, node string, more uint64, volume string) error {
	n, err := m.reg.Node(ctx, node)
	if err != nil || n.CapacityBytes == 0 {
		return nil // an unknown node is the registry's to refuse
	}
	vols, err := m.reg.Volumes(ctx)
	if err != nil {
		return err
	}
	var promised uint64
	for _, v := range vols {
		promised += v.PromisedOn(node)
	}
	if promised > n.CapacityBytes || more > n.CapacityBytes-promised {
		what := "a new volume"
		if volume != "" {
			what = fmt.Sprintf("growing volume %q", volume)
		}
		return fmt.Errorf("%w: %s needs %d more bytes on node %s, which may be promised %d (its disk times its overcommit ratio) and has promised %d to its volumes: choose a smaller size, free space, or raise the node's --overcommit", ErrCapacity, what, more, node, n.CapacityBytes, promised)
	}
	return nil
}

// checkShape checks a size and block size against the store's limits,
// with a message that says what to do.
func checkShape(size uint64, bs uint32) error {
	switch {
	case bs != store.BlockSize4K && bs != store.BlockSize512:
		return fmt.Errorf("block size %d: use %d or %d", bs, store.BlockSize512, store.BlockSize4K)
	case size == 0:
		return errors.New("size 0: give a positive size")
	case size > store.MaxSizeBytes:
		return fmt.Errorf("size %d bytes is more than the largest volume the store holds, %d bytes (4 PiB)", size, uint64(store.MaxSizeBytes))
	case size%uint64(bs) != 0:
		return fmt.Errorf("size %d is not a multiple of the block size %d: use %d or %d", size, bs, size/uint64(bs)*uint64(bs), (size/uint64(bs)+1)*uint64(bs))
	}
	return store.CheckShape(size, bs)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// checkSecrets decodes a host's DH-HMAC-CHAP secrets (format, length,
// CRC) before they reach the registry; the errors never quote a secret.
func checkSecrets(s meta.HostSecret) error {
	var keys [][]byte
	for what, v := range map[string]string{"host secret": s.Host, "controller secret": s.Ctrl} {
		if v == "" {
			continue
		}
		k, err := auth.ParseKey(v)
		if err != nil {
			return fmt.Errorf("%s: %v: %w", what, err, meta.ErrInvalid)
		}
		keys = append(keys, k.Secret)
	}
	if len(keys) == 2 && bytes.Equal(keys[0], keys[1]) {
		return fmt.Errorf("the controller secret must differ from the host secret: %w", meta.ErrInvalid)
	}
	return nil
}
