package control

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/store"
)

// The fakes below stand for the store, the target and the registry's
// replication; the registry's state machine is the real meta.State. Each
// mutating call first calls world.step, which is where a crash is
// injected: a crash stops the "process" (a panic the test recovers), the
// store and the registry keep what they committed, the target (in
// memory) is lost.

type errCrash struct{ step string }

type world struct {
	steps   int
	crashAt int // 0: never
	trace   []string
}

func (w *world) step(name string) {
	w.steps++
	w.trace = append(w.trace, name)
	if w.crashAt != 0 && w.steps == w.crashAt {
		panic(errCrash{name})
	}
}

// shape is one store object: a volume (a plain volume or a clone) or a
// snapshot, with the parent link and revert token the store keeps
// (snapshots_test.go has the snapshot calls).
type shape struct {
	size   uint64
	bs     uint32
	snap   bool   // a read-only snapshot, not a volume
	parent uint64 // the snapshot it reads through; 0: none
	token  uint64 // the last revert token applied
}

type fakeStore struct {
	w *world
	// vols are the store's objects, volumes and snapshots, by ID.
	vols map[uint64]shape
	// failSnapshot makes Snapshot fail (a store error, not a crash).
	failSnapshot error
	// flat holds the Flatten calls of the reconciler's goroutines until
	// the test runs them (snapshots_test.go).
	flat flattenQueue
	// failCreate makes Create fail (a store error, not a crash).
	failCreate error
	// full is what Full says.
	full string
}

func (s *fakeStore) Full() string { return s.full }

func (s *fakeStore) Shape(id uint64) (uint64, uint32, error) {
	v, ok := s.vols[id]
	if !ok {
		return 0, 0, fmt.Errorf("volume %d: %w", id, store.ErrNotFound)
	}
	return v.size, v.bs, nil
}

func (s *fakeStore) Create(id, size uint64, bs uint32) error {
	s.w.step("store.create")
	if s.failCreate != nil {
		return s.failCreate
	}
	if _, ok := s.vols[id]; ok {
		return fmt.Errorf("volume %d: %w", id, store.ErrExists)
	}
	if err := store.CheckShape(size, bs); err != nil {
		return err
	}
	s.vols[id] = shape{size: size, bs: bs}
	return nil
}

func (s *fakeStore) Grow(id, size uint64) error {
	s.w.step("store.grow")
	v, ok := s.vols[id]
	if !ok {
		return fmt.Errorf("volume %d: %w", id, store.ErrNotFound)
	}
	if v.snap {
		return fmt.Errorf("volume %d is a snapshot: %w", id, store.ErrReadOnly)
	}
	if err := store.CheckShape(size, v.bs); err != nil {
		return err
	}
	v.size = size
	s.vols[id] = v
	return nil
}

// Delete removes an object, as the store does: a snapshot with one
// child is merged into it (the child reads through the snapshot's
// parent), one with more is refused.
func (s *fakeStore) Delete(id uint64) error {
	s.w.step("store.delete")
	o, ok := s.vols[id]
	if !ok {
		return fmt.Errorf("volume %d: %w", id, store.ErrNotFound)
	}
	kids := s.children(id)
	switch {
	case len(kids) > 1:
		return fmt.Errorf("volume %d: delete: %d objects read through it (%d...): %w", id, len(kids), kids[0], store.ErrHasChildren)
	case len(kids) == 1:
		c := s.vols[kids[0]]
		c.parent = o.parent
		s.vols[kids[0]] = c
	}
	delete(s.vols, id)
	return nil
}

// children are the objects whose parent is id, sorted.
func (s *fakeStore) children(id uint64) []uint64 {
	var out []uint64
	for k, o := range s.vols {
		if o.parent == id {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// List returns the volumes only, as blkd's adapter does.
func (s *fakeStore) List() ([]uint64, error) {
	var ids []uint64
	for id, o := range s.vols {
		if !o.snap {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

type sub struct {
	connected []string // hosts with a live controller
	allowAny  bool
	hosts     []string
	size      uint64
	revals    int
}

type fakeTarget struct {
	w    *world
	subs map[string]*sub
	// sizes reads the store, as the real target's namespace does.
	store *fakeStore
	// replicas are the replica subsystems served (ReplicaTarget): the
	// primary and epoch each admits, by volume ID.
	replicas map[uint64]string
}

func (t *fakeTarget) ServeReplica(v meta.Volume) error {
	want := fmt.Sprintf("%s@%d", v.Node, v.CurrentEpoch())
	if t.replicas[v.ID] == want {
		return nil
	}
	if _, ok := t.store.vols[v.ID]; !ok {
		return fmt.Errorf("volume %d not in the store", v.ID)
	}
	t.w.step("target.serve-replica")
	if t.replicas == nil {
		t.replicas = map[uint64]string{}
	}
	t.replicas[v.ID] = want
	return nil
}

// Demote removes the subsystem, as a target that keeps no standby
// paths does.
func (t *fakeTarget) Demote(v meta.Volume) error { return t.Unserve(v.NQN) }

func (t *fakeTarget) UnserveReplica(id uint64) error {
	if _, ok := t.replicas[id]; !ok {
		return nil
	}
	t.w.step("target.unserve-replica")
	delete(t.replicas, id)
	return nil
}

func (t *fakeTarget) Serve(v meta.Volume) error {
	t.w.step("target.serve")
	if _, ok := t.subs[v.NQN]; ok {
		return fmt.Errorf("subsystem %s exists", v.NQN)
	}
	sh, ok := t.store.vols[v.ID]
	if !ok {
		return fmt.Errorf("volume %d not in the store", v.ID)
	}
	t.subs[v.NQN] = &sub{allowAny: v.AllowAny, hosts: slices.Clone(v.Hosts), size: sh.size}
	return nil
}

func (t *fakeTarget) Served(v meta.Volume) bool { _, ok := t.subs[v.NQN]; return ok }

func (t *fakeTarget) SetHosts(v meta.Volume) error {
	nqn, allowAny, hosts := v.NQN, v.AllowAny, v.Hosts
	s, ok := t.subs[nqn]
	if !ok {
		return fmt.Errorf("subsystem %s not served", nqn)
	}
	if s.allowAny == allowAny && slices.Equal(s.hosts, hosts) {
		return nil
	}
	t.w.step("target.hosts")
	s.allowAny, s.hosts = allowAny, slices.Clone(hosts)
	return nil
}

func (t *fakeTarget) Revalidate(nqn string) error {
	t.w.step("target.revalidate")
	s, ok := t.subs[nqn]
	if !ok {
		return fmt.Errorf("subsystem %s not served", nqn)
	}
	s.revals++
	for id, sh := range t.store.vols {
		_ = id
		s.size = max(s.size, sh.size)
	}
	return nil
}

func (t *fakeTarget) Connected(nqn string) []string {
	if s, ok := t.subs[nqn]; ok {
		return slices.Clone(s.connected)
	}
	return nil
}

func (t *fakeTarget) Unserve(nqn string) error {
	if _, ok := t.subs[nqn]; !ok {
		return nil
	}
	t.w.step("target.unserve")
	delete(t.subs, nqn)
	return nil
}

type fakeRegistry struct {
	w     *world
	state *meta.State
	index uint64
}

func (r *fakeRegistry) Apply(_ context.Context, c meta.Command) (meta.Result, error) {
	r.w.step("registry." + c.Op().String())
	r.index++
	res := r.state.Apply(r.index, c)
	res.Index = r.index
	return res, res.Err
}

func (r *fakeRegistry) Volume(_ context.Context, name string) (meta.Volume, error) {
	v, ok := r.state.Volume(name)
	if !ok {
		return v, fmt.Errorf("meta: volume %q: %w", name, meta.ErrUnknownVolume)
	}
	return v, nil
}

func (r *fakeRegistry) Volumes(context.Context) ([]meta.Volume, error) {
	return r.state.Export().Volumes, nil
}

func (r *fakeRegistry) Node(_ context.Context, id string) (meta.NodeInfo, error) {
	n, ok := r.state.Node(id)
	if !ok {
		return n, meta.ErrUnknownNode
	}
	return n, nil
}

func (r *fakeRegistry) Nodes(context.Context) ([]meta.NodeInfo, error) {
	return r.state.Export().Nodes, nil
}

func (r *fakeRegistry) Place(_ context.Context, req meta.PlaceRequest) ([]string, error) {
	return r.state.Place(req)
}

func (r *fakeRegistry) Connections(context.Context) ([]meta.Connection, error) {
	return r.state.Export().Connections, nil
}

// owners reaches the reconcilers in process, reading the one registry
// (every node's copy is caught up in these tests).
type owners struct {
	reg  *fakeRegistry
	recs map[string]*Reconciler
	down map[string]bool
	// lose, if set, says whether a call to Reconcile is lost (not
	// answered) before it reaches node.
	lose func(node string) bool
	// takeLost: TakeSnapshot's answer is lost after the primary took
	// it; takeDropped: its request is lost before.
	takeLost, takeDropped bool
	// stepCalls makes each call to a node a step ("owner.*"): a crash
	// there is the caller's, before the node hears of it.
	stepCalls bool
}

func (o *owners) Reconcile(_ context.Context, node, name string, _ uint64) (Status, error) {
	if o.stepCalls {
		o.reg.w.step("owner.reconcile")
	}
	if o.down[node] || (o.lose != nil && o.lose(node)) {
		return Status{}, errors.New("connection refused")
	}
	r := o.recs[node]
	if r == nil {
		return Status{}, fmt.Errorf("no node %s", node)
	}
	v, ok := o.reg.state.Volume(name)
	if !ok {
		r.Forget(name)
		return Status{Name: name, State: StateDeleted}, nil
	}
	return r.Reconcile(v), nil
}

// node is one storage node's process: it dies with a crash.
type cluster struct {
	w      *world
	reg    *fakeRegistry
	store  *fakeStore
	tgt    *fakeTarget
	rec    *Reconciler
	owners *owners
	mgr    *Manager
}

const nodeID = "n1"

func newCluster(t *testing.T) *cluster {
	w := &world{}
	c := &cluster{w: w, reg: &fakeRegistry{w: w, state: meta.NewState()}, store: &fakeStore{w: w, vols: map[uint64]shape{}}}
	if _, err := c.reg.Apply(context.Background(), meta.RegisterNode{ID: nodeID, TargetAddr: "127.0.0.1:4420", MgmtAddr: "127.0.0.1:7070", Features: []string{meta.FeatureSnapshots}}); err != nil {
		t.Fatal(err)
	}
	c.restart()
	return c
}

// restart is a new process on the same store and registry: the old
// one's flattens end unfinished first.
func (c *cluster) restart() {
	if c.rec != nil {
		stopFlattens(c.rec)
	}
	c.tgt = &fakeTarget{w: c.w, subs: map[string]*sub{}, store: c.store}
	c.rec = NewReconciler(nodeID, c.store, c.tgt, nil)
	c.owners = &owners{reg: c.reg, recs: map[string]*Reconciler{nodeID: c.rec}, down: map[string]bool{}}
	c.mgr = NewManager(c.reg, c.owners)
}

// recover is the restart path: reconcile what the registry says this
// node owns, then the leader's settle rounds record the outcome, until
// one changes nothing. The clock is past snapshotSettle, so a snapshot
// left being taken is decided; the flattens the reconciler starts run
// to their end between rounds.
func (c *cluster) recover(t *testing.T) {
	c.mgr.Now = func() time.Time { return time.Now().Add(time.Hour) }
	vols, _ := c.reg.Volumes(context.Background())
	c.rec.ReconcileAll(vols)
	for round := 0; ; round++ {
		c.runFlattens()
		before := c.reg.index
		if bad, err := c.mgr.Settle(context.Background()); err != nil || len(bad) != 0 {
			t.Fatalf("settle: %v %v", bad, err)
		}
		if c.reg.index == before && !c.flattening() {
			return
		}
		if round == 5 {
			t.Fatalf("settle rounds still change the registry after %d rounds", round+1)
		}
	}
}

// check asserts the converged state: every registry volume online, in the
// store at its size and block size, served with exactly its hosts; nothing
// in the store or the target that the registry does not have.
func (c *cluster) check() error {
	vols, _ := c.reg.Volumes(context.Background())
	ids := map[uint64]bool{}
	nqns := map[string]bool{}
	for _, v := range vols {
		ids[v.ID], nqns[v.NQN] = true, true
		for _, s := range v.Snapshots {
			ids[s.ID] = true
		}
		if v.State != meta.VolumeOnline {
			return fmt.Errorf("volume %q is %v (%s), want online", v.Name, v.State, v.Reason)
		}
		sh, ok := c.store.vols[v.ID]
		if !ok {
			return fmt.Errorf("volume %q (id %d) online but not in the store", v.Name, v.ID)
		}
		if sh.size != v.SizeBytes || sh.bs != v.BlockSize {
			return fmt.Errorf("volume %q: store %d bytes/%d, registry %d/%d", v.Name, sh.size, sh.bs, v.SizeBytes, v.BlockSize)
		}
		s, ok := c.tgt.subs[v.NQN]
		if !ok {
			return fmt.Errorf("volume %q online but not served", v.Name)
		}
		if s.allowAny != v.AllowAny || !slices.Equal(s.hosts, v.Hosts) {
			return fmt.Errorf("volume %q: served hosts %v (any %v), registry %v (any %v)", v.Name, s.hosts, s.allowAny, v.Hosts, v.AllowAny)
		}
		if st, ok := c.rec.Status(v.Name); !ok || st.State != StateOnline {
			return fmt.Errorf("volume %q: local status %+v, want online", v.Name, st)
		}
	}
	for id := range c.store.vols {
		if !ids[id] {
			return fmt.Errorf("store object %d has no registry entry (half-made or half-deleted)", id)
		}
	}
	for nqn := range c.tgt.subs {
		if !nqns[nqn] {
			return fmt.Errorf("subsystem %s served without a registry entry", nqn)
		}
	}
	return c.checkSnapshots(vols)
}

type op func(ctx context.Context, m *Manager) error

// randomOps is a seeded sequence of management operations on three names.
func randomOps(rng *rand.Rand, n int) ([]op, []string) {
	var ops []op
	var desc []string
	names := []string{"a", "b", "c"}
	for range n {
		name := names[rng.IntN(len(names))]
		switch k := rng.IntN(6); k {
		case 0, 1:
			size := uint64(1+rng.IntN(64)) << 20
			desc = append(desc, fmt.Sprintf("create %s %d", name, size))
			ops = append(ops, func(ctx context.Context, m *Manager) error {
				_, err := m.Create(ctx, CreateRequest{Name: name, SizeBytes: size, Node: nodeID})
				return err
			})
		case 2:
			add := uint64(1+rng.IntN(8)) << 20
			desc = append(desc, fmt.Sprintf("resize %s +%d", name, add))
			ops = append(ops, func(ctx context.Context, m *Manager) error {
				v, err := m.reg.Volume(ctx, name)
				if err != nil {
					return err
				}
				_, err = m.Resize(ctx, name, v.SizeBytes+add)
				return err
			})
		case 3:
			host := fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:host-%d", rng.IntN(3))
			desc = append(desc, "allow "+name+" "+host)
			ops = append(ops, func(ctx context.Context, m *Manager) error {
				_, err := m.AllowHost(ctx, name, host, meta.HostSecret{})
				return err
			})
		case 4:
			host := fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:host-%d", rng.IntN(3))
			desc = append(desc, "disallow "+name+" "+host)
			ops = append(ops, func(ctx context.Context, m *Manager) error {
				_, err := m.DisallowHost(ctx, name, host, false)
				return err
			})
		case 5:
			desc = append(desc, "delete "+name)
			ops = append(ops, func(ctx context.Context, m *Manager) error { return m.Delete(ctx, name, false) })
		}
	}
	return ops, desc
}

// run runs ops until the end or a crash; it reports the crash's step.
func run(c *cluster, ops []op) (crashed string) { return runOps(c.mgr, ops) }

// runOps runs ops on m until the end or a crash; it reports the crash's
// step.
func runOps(m *Manager, ops []op) (crashed string) {
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(errCrash)
			if !ok {
				panic(r)
			}
			crashed = e.step
		}
	}()
	for _, o := range ops {
		err := o(context.Background(), m)
		// Only the registry may refuse (unknown volume, exists, ...): the
		// owner is in process and its store works.
		if errors.Is(err, ErrOwnerFailed) || errors.Is(err, ErrOwnerUnreachable) || errors.Is(err, ErrInvalid) {
			panic(fmt.Sprintf("operation failed on the owner: %v", err))
		}
	}
	return ""
}

func seed(t *testing.T) uint64 {
	if s := os.Getenv("BLK_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("BLK_SEED=%q: %v", s, err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// TestCrashBetweenSteps: for seeded sequences of operations, a crash
// before every step (registry command, store change, target change), then
// a crash before every step of the recovery too, then a clean recovery:
// the node always converges to the registry's intent and leaves nothing
// half-made.
func TestCrashBetweenSteps(t *testing.T) {
	base := seed(t)
	t.Logf("seed %d (replay with BLK_SEED=%d)", base, base)
	for round := range 8 {
		rng := rand.New(rand.NewPCG(base, uint64(round)))
		ops, desc := randomOps(rng, 12)
		// Dry run: count the steps.
		c := newCluster(t)
		c.w.steps, c.w.trace = 0, nil
		if s := run(c, ops); s != "" {
			t.Fatalf("dry run crashed at %s", s)
		}
		if err := c.check(); err != nil {
			t.Fatalf("seed %d round %d: without a crash: %v\nops: %s", base, round, err, strings.Join(desc, "; "))
		}
		total := c.w.steps
		worlds := 0
		defer func() { t.Logf("round %d: %d steps, %d crash-and-recover worlds checked", round, total, worlds) }()
		for k := 1; k <= total; k++ {
			c := newCluster(t)
			c.w.steps, c.w.crashAt = 0, k
			at := run(c, ops)
			if at == "" {
				t.Fatalf("seed %d round %d: no crash at step %d of %d", base, round, k, total)
			}
			// A crash in the middle of recovery, at each of its steps.
			for j := 1; ; j++ {
				c2 := *c
				c2.store = &fakeStore{w: c.w, vols: maps(c.store.vols)}
				c2.reg = &fakeRegistry{w: c.w, state: cloneState(t, c.reg.state), index: c.reg.index}
				c2.restart()
				c2.w.steps, c2.w.crashAt = 0, j
				crashed := func() (crashed bool) {
					defer func() {
						if r := recover(); r != nil {
							if _, ok := r.(errCrash); !ok {
								panic(r)
							}
							crashed = true
						}
					}()
					c2.recover(t)
					return false
				}()
				c2.w.crashAt = 0
				c2.restart()
				c2.recover(t)
				worlds++
				if err := c2.check(); err != nil {
					t.Fatalf("seed %d round %d: crash at step %d (%s), recovery crash at %d: %v\nops: %s\nsteps: %s",
						base, round, k, at, j, err, strings.Join(desc, "; "), strings.Join(c.w.trace, " "))
				}
				if !crashed {
					break
				}
			}
		}
	}
}

func maps(m map[uint64]shape) map[uint64]shape {
	out := make(map[uint64]shape, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func cloneState(t *testing.T, s *meta.State) *meta.State {
	c, err := meta.UnmarshalState(s.MarshalState())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestBadVolumeFailsAloneAndRecovers: a registry/store disagreement on one
// volume (data missing, a size beyond the store's limit, another block
// size) fails that volume with the reason; the node serves the rest, and
// the leader's settle round records each failure in the registry. Before
// the control package, any of these stopped blkd from starting.
func TestBadVolumeFailsAloneAndRecovers(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	for _, n := range []string{"good", "missing", "huge", "blocks"} {
		if _, err := c.mgr.Create(ctx, CreateRequest{Name: n, SizeBytes: 8 << 20, Node: nodeID}); err != nil {
			t.Fatalf("create %s: %v", n, err)
		}
	}
	vid := func(n string) uint64 { v, _ := c.reg.state.Volume(n); return v.ID }
	delete(c.store.vols, vid("missing"))
	// 4 EiB + 1 TiB: what `resize --size 4194305TiB` wrote before sizes
	// were checked against the store before the registry.
	if _, err := c.reg.Apply(ctx, meta.ResizeVolume{Name: "huge", SizeBytes: 4194305 << 40}); err != nil {
		t.Fatal(err)
	}
	c.store.vols[vid("blocks")] = shape{size: 8 << 20, bs: 512}

	c.restart()
	vols, _ := c.reg.Volumes(ctx)
	byName := map[string]Status{}
	for _, s := range c.rec.ReconcileAll(vols) {
		byName[s.Name] = s
	}
	if s := byName["good"]; s.State != StateOnline {
		t.Fatalf("good: %+v, want online", s)
	}
	for n, want := range map[string]string{"missing": "the store has no volume", "huge": "grow store volume", "blocks": "512-byte blocks"} {
		s := byName[n]
		if s.State != StateFailed || !strings.Contains(s.Reason, want) {
			t.Errorf("%s: %+v, want failed with %q", n, s, want)
		}
		v, _ := c.reg.state.Volume(n)
		if c.tgt.Served(v) {
			t.Errorf("%s: served while failed", n)
		}
	}
	if !c.tgt.Served(meta.Volume{NQN: meta.DefaultNQN("good")}) {
		t.Fatal("good: not served")
	}
	if _, err := c.mgr.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"missing", "huge", "blocks"} {
		v, _ := c.reg.state.Volume(n)
		if v.State != meta.VolumeFailed || v.Reason == "" {
			t.Errorf("registry %s: %v %q, want failed with a reason", n, v.State, v.Reason)
		}
	}
	// A failed volume can still be deleted.
	if err := c.mgr.Delete(ctx, "missing", false); err != nil {
		t.Fatalf("delete a failed volume whose data is gone: %v", err)
	}
	if _, ok := c.reg.state.Volume("missing"); ok {
		t.Fatal("missing: still registered after delete")
	}
}

// TestValidationBeforeIntent: sizes the store cannot hold are refused
// with ErrInvalid and leave the registry untouched.
func TestValidationBeforeIntent(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 30, Node: nodeID}); err != nil {
		t.Fatal(err)
	}
	before := c.reg.index
	for _, tc := range []struct {
		name string
		f    func() error
	}{
		{"resize to 4194305 TiB", func() error { _, err := c.mgr.Resize(ctx, "v", 4194305<<40); return err }},
		{"resize to a non-multiple", func() error { _, err := c.mgr.Resize(ctx, "v", 1<<30+100); return err }},
		{"create 8 EiB", func() error {
			_, err := c.mgr.Create(ctx, CreateRequest{Name: "w", SizeBytes: 8 << 60, Node: nodeID})
			return err
		}},
		{"create with a name of spaces", func() error {
			_, err := c.mgr.Create(ctx, CreateRequest{Name: "a b", SizeBytes: 1 << 20, Node: nodeID})
			if errors.Is(err, meta.ErrInvalid) {
				return fmt.Errorf("%w: %v", ErrInvalid, err) // the registry's check, run before proposing
			}
			return err
		}},
		{"create with block size 1000", func() error {
			_, err := c.mgr.Create(ctx, CreateRequest{Name: "w", SizeBytes: 1 << 20, BlockSize: 1000, Node: nodeID})
			return err
		}},
	} {
		if err := tc.f(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", tc.name, err)
		}
	}
	if c.reg.index != before {
		t.Fatalf("registry index moved from %d to %d: a refused request wrote intent", before, c.reg.index)
	}
}

// TestCreateFailureLeavesNothing: a store that refuses the volume makes
// Create fail with the owner's reason and leaves no registry entry.
func TestCreateFailureLeavesNothing(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	c.store.failCreate = errors.New("no space left on device")
	_, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: nodeID})
	if !errors.Is(err, ErrOwnerFailed) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("create on a failing store: %v, want ErrOwnerFailed with the reason", err)
	}
	if _, ok := c.reg.state.Volume("v"); ok {
		t.Fatal("volume registered after a failed create")
	}
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
}

// TestOwnerUnreachable: intent stays in the registry while the owner is
// down and is finished by the settle round once it is back.
func TestOwnerUnreachable(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	c.owners.down[nodeID] = true
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: nodeID}); !errors.Is(err, ErrOwnerUnreachable) {
		t.Fatalf("create with the owner down: %v, want ErrOwnerUnreachable", err)
	}
	if v, _ := c.reg.state.Volume("v"); v.State != meta.VolumeCreating {
		t.Fatalf("after an unanswered create: %v, want creating", v.State)
	}
	bad, err := c.mgr.Settle(ctx)
	if err != nil || bad[nodeID] == nil {
		t.Fatalf("settle with the owner down: %v %v, want it named unreachable", bad, err)
	}
	c.owners.down[nodeID] = false
	if bad, err := c.mgr.Settle(ctx); err != nil || len(bad) != 0 {
		t.Fatalf("settle: %v %v", bad, err)
	}
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
}

// TestLiveControllersAreUsers: a host connected without `attach` (no
// registry attachment) still counts: a plain delete is refused naming it,
// a forced one goes ahead. An attachment whose host stays disconnected is
// removed by Settle after DetachAfter, and kept while the host is back.
func TestLiveControllersAreUsers(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	v, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: nodeID})
	if err != nil {
		t.Fatal(err)
	}
	const h1, h2 = "nqn.2014-08.org.nvmexpress:uuid:h1", "nqn.2014-08.org.nvmexpress:uuid:h2"
	c.tgt.subs[v.NQN].connected = []string{h1}
	if err := c.mgr.Delete(ctx, "v", false); !errors.Is(err, meta.ErrHasConnections) || !strings.Contains(err.Error(), h1) {
		t.Fatalf("delete with a live controller: %v, want ErrHasConnections naming %s", err, h1)
	}
	if _, ok := c.reg.state.Volume("v"); !ok {
		t.Fatal("volume gone after a refused delete")
	}

	// Attachments: h1 attached and connected, h2 attached and gone.
	for _, h := range []string{h1, h2} {
		if _, err := c.mgr.AllowHost(ctx, "v", h, meta.HostSecret{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.reg.Apply(ctx, meta.Connect{HostNQN: h, Volume: "v", Node: nodeID, At: 1}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Unix(1000, 0)
	c.mgr.Now = func() time.Time { return now }
	c.mgr.DetachAfter = time.Minute
	attached := func() []string {
		var hs []string
		for _, k := range c.reg.state.Export().Connections {
			hs = append(hs, k.HostNQN)
		}
		return hs
	}
	for _, step := range []struct {
		after time.Duration
		want  []string
	}{{0, []string{h1, h2}}, {30 * time.Second, []string{h1, h2}}, {31 * time.Second, []string{h1}}, {time.Hour, []string{h1}}} {
		now = now.Add(step.after)
		if _, err := c.mgr.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		if got := attached(); !slices.Equal(got, step.want) {
			t.Fatalf("after %v more: attachments %v, want %v", step.after, got, step.want)
		}
	}
	if err := c.mgr.Delete(ctx, "v", true); err != nil {
		t.Fatalf("forced delete: %v", err)
	}
}

// TestCapacity: a node that registered its capacity cannot be promised
// more: a create or a growth past it is refused before the registry
// changes; deleting a volume gives its bytes back.
func TestCapacity(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	if _, err := c.reg.Apply(ctx, meta.RegisterNode{ID: nodeID, TargetAddr: "127.0.0.1:4420", MgmtAddr: "127.0.0.1:7070", CapacityBytes: 100 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "a", SizeBytes: 60 << 20, Node: nodeID}); err != nil {
		t.Fatal(err)
	}
	before := c.reg.index
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "b", SizeBytes: 41 << 20, Node: nodeID}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("create past the capacity: %v, want ErrCapacity", err)
	}
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "b", SizeBytes: 41 << 20}); !errors.Is(err, meta.ErrNoCapacity) {
		t.Fatalf("placing past every node's capacity: %v, want meta.ErrNoCapacity", err)
	}
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "b", SizeBytes: 1 << 20, Node: "ghost"}); !errors.Is(err, meta.ErrUnknownNode) {
		t.Fatalf("create on an unknown node: %v, want meta.ErrUnknownNode", err)
	}
	if _, err := c.mgr.Resize(ctx, "a", 101<<20); !errors.Is(err, ErrCapacity) {
		t.Fatalf("grow past the capacity: %v, want ErrCapacity", err)
	}
	if c.reg.index != before {
		t.Fatal("a refused request wrote to the registry")
	}
	if v, err := c.mgr.Create(ctx, CreateRequest{Name: "b", SizeBytes: 40 << 20}); err != nil || v.Node != nodeID {
		t.Fatalf("placing up to the capacity: %+v, %v", v, err)
	}
	if err := c.mgr.Delete(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.mgr.Resize(ctx, "b", 100<<20); err != nil {
		t.Fatalf("grow into the space a deleted volume gave back: %v", err)
	}
}

// TestFullDiskDegrades: a store that refuses writes (disk under its
// reserve) makes its served volumes degraded with the reason, recorded by
// the settle round; hosts may still attach (reads work); when space
// returns, online again.
func TestFullDiskDegrades(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: nodeID}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.mgr.AllowHost(ctx, "v", "nqn.2014-08.org.nvmexpress:uuid:h1", meta.HostSecret{}); err != nil {
		t.Fatal(err)
	}
	c.store.full = "disk full: 1 bytes free, reserve 2"
	if _, err := c.mgr.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.reg.state.Volume("v"); v.State != meta.VolumeDegraded || v.Reason != c.store.full {
		t.Fatalf("on a full disk: %v %q, want degraded with the reason", v.State, v.Reason)
	}
	if !c.tgt.Served(meta.Volume{NQN: meta.DefaultNQN("v")}) {
		t.Fatal("a degraded volume is not served")
	}
	if _, err := c.reg.Apply(ctx, meta.Connect{HostNQN: "nqn.2014-08.org.nvmexpress:uuid:h1", Volume: "v", Node: nodeID, At: 1}); err != nil {
		t.Fatalf("attach to a degraded volume: %v", err)
	}
	c.store.full = ""
	if _, err := c.mgr.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.reg.state.Volume("v"); v.State != meta.VolumeOnline || v.Reason != "" {
		t.Fatalf("with space back: %v %q, want online", v.State, v.Reason)
	}
}

// TestForcedDeleteOnDeadNode: a volume whose node is down (and stays
// down) is forgotten by a forced delete, so the node can be removed; a
// plain delete, or a forced one while the node is merely unreachable (not
// marked down), leaves it deleting.
func TestForcedDeleteOnDeadNode(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20, Node: nodeID}); err != nil {
		t.Fatal(err)
	}
	c.owners.down[nodeID] = true
	if err := c.mgr.Delete(ctx, "v", false); !errors.Is(err, ErrOwnerUnreachable) {
		t.Fatalf("plain delete, owner unreachable: %v", err)
	}
	if err := c.mgr.Delete(ctx, "v", true); !errors.Is(err, ErrOwnerUnreachable) {
		t.Fatalf("forced delete, owner unreachable but not down: %v", err)
	}
	if v, _ := c.reg.state.Volume("v"); v.State != meta.VolumeDeleting {
		t.Fatalf("after it: %v, want deleting", v.State)
	}
	if _, err := c.reg.Apply(ctx, meta.SetNodeState{ID: nodeID, State: meta.NodeDown}); err != nil {
		t.Fatal(err)
	}
	if err := c.mgr.Delete(ctx, "v", true); err != nil {
		t.Fatalf("forced delete, node down: %v", err)
	}
	if _, ok := c.reg.state.Volume("v"); ok {
		t.Fatal("still registered")
	}
	// The node comes back: its data is an orphan, kept and reported.
	c.owners.down[nodeID] = false
	c.restart()
	vols, _ := c.reg.Volumes(ctx)
	sts := c.rec.ReconcileAll(vols)
	if len(sts) != 1 || sts[0].State != StateFailed || !strings.Contains(sts[0].Reason, "orphan") {
		t.Fatalf("after the node returned: %+v, want one orphan", sts)
	}
}
