package control

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/store"
)

// The fake store's snapshots (control.SnapshotStore), in miniature: the
// objects and their parent links, as package store keeps them
// (docs/snapshots.md §1). A snapshot takes its volume's place as the
// parent, the volume continues on top; a clone is a volume on top of a
// snapshot, at its size; Delete merges a snapshot with one child into
// it (fakeStore.Delete); a revert is applied once per token. Every
// mutating call goes through world.step but Flatten, which the
// reconciler calls on a goroutine of its own, where a crash (a panic)
// could not be recovered: its call waits in fakeStore.flat until the
// test runs it (runFlattens) on the test's goroutine, through a step; a
// crash there, or any crash while it waits, leaves it unfinished.

var _ SnapshotStore = (*fakeStore)(nil)
var _ Snapshotter = (*owners)(nil)

// errCrashed ends the flattens of a process that crashed.
var errCrashed = errors.New("the process crashed")

func (s *fakeStore) Snapshot(vol, snap uint64) error {
	if v, ok := s.vols[vol]; ok && snap != 0 && v.parent == snap {
		return nil
	}
	s.w.step("store.snapshot")
	if s.failSnapshot != nil {
		return s.failSnapshot
	}
	v, ok := s.vols[vol]
	switch {
	case !ok:
		return fmt.Errorf("volume %d: %w", vol, store.ErrNotFound)
	case v.snap:
		return fmt.Errorf("volume %d is a snapshot: %w", vol, store.ErrInvalid)
	}
	if _, ok := s.vols[snap]; ok {
		return fmt.Errorf("volume %d: %w", snap, store.ErrExists)
	}
	s.vols[snap] = shape{size: v.size, bs: v.bs, snap: true, parent: v.parent}
	v.parent = snap
	s.vols[vol] = v
	return nil
}

func (s *fakeStore) Clone(snap, clone uint64) error {
	if c, ok := s.vols[clone]; ok && !c.snap && c.parent == snap {
		return nil
	}
	s.w.step("store.clone")
	if s.failCreate != nil {
		return s.failCreate
	}
	p, ok := s.vols[snap]
	switch {
	case !ok:
		return fmt.Errorf("snapshot %d: %w", snap, store.ErrNotFound)
	case !p.snap:
		return fmt.Errorf("volume %d is not a snapshot: %w", snap, store.ErrInvalid)
	}
	if _, ok := s.vols[clone]; ok {
		return fmt.Errorf("volume %d: %w", clone, store.ErrExists)
	}
	s.vols[clone] = shape{size: p.size, bs: p.bs, parent: snap}
	return nil
}

func (s *fakeStore) Revert(vol, snap, token uint64) error {
	v, ok := s.vols[vol]
	switch {
	case !ok:
		return fmt.Errorf("volume %d: %w", vol, store.ErrNotFound)
	case v.snap:
		return fmt.Errorf("volume %d is a snapshot: %w", vol, store.ErrInvalid)
	case token != 0 && v.token == token:
		return nil // applied already
	}
	s.w.step("store.revert")
	p, ok := s.vols[snap]
	switch {
	case !ok:
		return fmt.Errorf("snapshot %d: %w", snap, store.ErrNotFound)
	case !p.snap:
		return fmt.Errorf("volume %d is not a snapshot: %w", snap, store.ErrInvalid)
	}
	v.parent, v.size = snap, p.size
	if token != 0 {
		v.token = token
	}
	s.vols[vol] = v
	return nil
}

// Flatten queues the call for runFlattens and waits for its answer. It
// touches nothing of the store: it runs on the reconciler's goroutine.
func (s *fakeStore) Flatten(ctx context.Context, vol uint64, progress func(done, total uint64)) error {
	c := &flattenCall{ctx: ctx, id: vol, progress: progress, done: make(chan error, 1)}
	s.flat.mu.Lock()
	s.flat.calls = append(s.flat.calls, c)
	s.flat.mu.Unlock()
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *fakeStore) Parent(id uint64) (uint64, error) {
	o, ok := s.vols[id]
	if !ok {
		return 0, fmt.Errorf("volume %d: %w", id, store.ErrNotFound)
	}
	return o.parent, nil
}

func (s *fakeStore) Has(id uint64) (bool, error) {
	_, ok := s.vols[id]
	return ok, nil
}

// flatten is the store's side of a flatten, on the test's goroutine:
// the clone's shared clusters are copied, then it has no parent.
func (s *fakeStore) flatten(c *flattenCall) error {
	s.w.step("store.flatten")
	o, ok := s.vols[c.id]
	if !ok {
		return fmt.Errorf("volume %d: %w", c.id, store.ErrNotFound)
	}
	c.progress(0, o.size)
	o.parent = 0
	s.vols[c.id] = o
	c.progress(o.size, o.size)
	return nil
}

// clone is a copy of what the store holds on disk: its objects.
func (s *fakeStore) clone() *fakeStore {
	return &fakeStore{w: s.w, vols: maps(s.vols), full: s.full}
}

// flattenCall is one Flatten waiting for the test.
type flattenCall struct {
	ctx      context.Context
	id       uint64
	progress func(done, total uint64)
	done     chan error // buffered: the answer
}

// flattenQueue holds the Flatten calls of a store's reconciler
// goroutines.
type flattenQueue struct {
	mu    sync.Mutex
	calls []*flattenCall
}

// await returns volume id's Flatten call, waiting for the goroutine the
// reconciler started to make it (it does at once: no timing involved).
// Calls whose context was cancelled (the reconciler stopped the flatten)
// are dropped.
func (q *flattenQueue) await(id uint64) *flattenCall {
	for {
		q.mu.Lock()
		q.calls = slices.DeleteFunc(q.calls, func(c *flattenCall) bool { return c.ctx.Err() != nil })
		i := slices.IndexFunc(q.calls, func(c *flattenCall) bool { return c.id == id })
		var c *flattenCall
		if i >= 0 {
			c = q.calls[i]
		}
		q.mu.Unlock()
		if c != nil {
			return c
		}
		runtime.Gosched()
	}
}

// answer removes c from the queue and ends its Flatten with err.
func (q *flattenQueue) answer(c *flattenCall, err error) {
	q.mu.Lock()
	q.calls = slices.DeleteFunc(q.calls, func(o *flattenCall) bool { return o == c })
	q.mu.Unlock()
	c.done <- err
}

// runningFlattens are the volumes whose flatten r's goroutines run,
// sorted.
func runningFlattens(r *Reconciler) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []uint64
	for id, f := range r.flattens {
		f.mu.Lock()
		if f.running {
			ids = append(ids, id)
		}
		f.mu.Unlock()
	}
	slices.Sort(ids)
	return ids
}

// waitFlatten waits for the goroutine running volume id's flatten on r
// to record its end (it does once its Flatten call is answered).
func waitFlatten(r *Reconciler, id uint64) {
	for slices.Contains(runningFlattens(r), id) {
		runtime.Gosched()
	}
}

// runFlattens runs every flatten c's reconciler started, one step each,
// and waits for their goroutines to record the end.
func (c *cluster) runFlattens() {
	s := c.rec.store.(*fakeStore)
	for _, id := range runningFlattens(c.rec) {
		call := s.flat.await(id)
		err := s.flatten(call) // a crash leaves it unfinished, the call queued
		s.flat.answer(call, err)
		waitFlatten(c.rec, id)
	}
}

// flattening says whether a flatten runs on c's node.
func (c *cluster) flattening() bool { return len(runningFlattens(c.rec)) > 0 }

// stopFlattens ends the flattens r's goroutines run, unfinished, as a
// crash of its process does.
func stopFlattens(r *Reconciler) {
	s, ok := r.store.(*fakeStore)
	if !ok {
		return
	}
	for _, id := range runningFlattens(r) {
		s.flat.answer(s.flat.await(id), errCrashed)
		waitFlatten(r, id)
	}
}

// refusal is a primary's failure to take a snapshot (as opposed to no
// answer), as blkd's snapshotRefused.
type refusal struct{ error }

func (refusal) Refused() bool { return true }

// TakeSnapshot has the primary's store take the snapshot, as blkd's
// takeSnapshot does for a volume of one copy.
func (o *owners) TakeSnapshot(_ context.Context, node, volume, snap string, _ uint64) (Taken, error) {
	if o.stepCalls {
		o.reg.w.step("owner.take-snapshot")
	}
	if o.down[node] || o.takeDropped {
		return Taken{}, errors.New("connection refused")
	}
	r := o.recs[node]
	if r == nil {
		return Taken{}, fmt.Errorf("no node %s", node)
	}
	v, ok := o.reg.state.Volume(volume)
	if !ok {
		return Taken{}, refusal{fmt.Errorf("meta: volume %q: %w", volume, meta.ErrUnknownVolume)}
	}
	s, ok := v.Snapshot(snap)
	switch {
	case !ok:
		return Taken{}, refusal{fmt.Errorf("meta: snapshot %s@%s: %w", volume, snap, meta.ErrUnknownSnapshot)}
	case s.State != meta.SnapshotCreating:
		return Taken{}, refusal{fmt.Errorf("snapshot %s@%s is %v, not being taken", volume, snap, s.State)}
	case v.Node != node:
		return Taken{}, refusal{fmt.Errorf("node %s is not the primary of %q", node, volume)}
	}
	if err := r.store.(SnapshotStore).Snapshot(v.ID, s.ID); err != nil {
		return Taken{}, refusal{fmt.Errorf("snapshot %s@%s on node %s: %w", volume, snap, node, err)}
	}
	if o.takeLost {
		return Taken{}, errors.New("context deadline exceeded")
	}
	return Taken{Nodes: []string{node}}, nil
}

// checkSnapshots is check's part for snapshots, once recovered: every
// registry snapshot ready and in the store with the registry's parent,
// size and block size; every volume with the registry's parent and last
// revert; no flatten left; every clone reading through its origin.
// (check has made sure the store holds nothing else.)
func (c *cluster) checkSnapshots(vols []meta.Volume) error {
	for _, v := range vols {
		o := c.store.vols[v.ID]
		switch {
		case o.snap:
			return fmt.Errorf("volume %q: a snapshot in the store", v.Name)
		case o.parent != v.Parent:
			return fmt.Errorf("volume %q: store parent %d, registry %d", v.Name, o.parent, v.Parent)
		case v.Reverted != 0 && o.token != v.Reverted:
			return fmt.Errorf("volume %q: store revert token %d, registry %d", v.Name, o.token, v.Reverted)
		case v.Flatten != nil:
			return fmt.Errorf("volume %q: a flatten is still registered", v.Name)
		case v.CloneOf != nil && !c.storeAncestor(v.CloneOf.ID, v.ID):
			return fmt.Errorf("clone %q: its origin %s (%d) is not among its store parents", v.Name, v.CloneOf, v.CloneOf.ID)
		}
		for _, s := range v.Snapshots {
			so, ok := c.store.vols[s.ID]
			switch {
			case s.State != meta.SnapshotReady:
				return fmt.Errorf("snapshot %s@%s is %v after recovery, want ready", v.Name, s.Name, s.State)
			case !ok:
				return fmt.Errorf("snapshot %s@%s (id %d) not in the store", v.Name, s.Name, s.ID)
			case !so.snap:
				return fmt.Errorf("snapshot %s@%s (id %d) is a volume in the store", v.Name, s.Name, s.ID)
			case so.parent != s.Parent:
				return fmt.Errorf("snapshot %s@%s: store parent %d, registry %d", v.Name, s.Name, so.parent, s.Parent)
			case so.size != s.SizeBytes || so.bs != v.BlockSize:
				return fmt.Errorf("snapshot %s@%s: store %d bytes/%d, registry %d/%d", v.Name, s.Name, so.size, so.bs, s.SizeBytes, v.BlockSize)
			}
		}
	}
	return nil
}

// storeAncestor says whether a is among the store parents of id.
func (c *cluster) storeAncestor(a, id uint64) bool {
	for n, p := 0, c.store.vols[id].parent; p != 0 && n <= len(c.store.vols); n, p = n+1, c.store.vols[p].parent {
		if p == a {
			return true
		}
	}
	return false
}

// cop is a management operation on a cluster (the flatten op also runs
// the flatten and the settle round that records its end).
type cop func(ctx context.Context, c *cluster) error

// snapshotOps is a seeded sequence of management operations on four
// volume names and two snapshot names, snapshots and clones among
// them.
func snapshotOps(rng *rand.Rand, n int) ([]cop, []string) {
	var ops []cop
	var desc []string
	vols := []string{"a", "b", "c", "d"}
	snaps := []string{"s1", "s2"}
	for range n {
		name, snap := vols[rng.IntN(len(vols))], snaps[rng.IntN(len(snaps))]
		// Weighted towards the snapshot operations: most random ones
		// are refused by the registry (no such snapshot, a name taken).
		switch k := rng.IntN(16); k {
		case 0:
			size := uint64(1+rng.IntN(64)) << 20
			desc = append(desc, fmt.Sprintf("create %s %d", name, size))
			ops = append(ops, opCreate(name, size))
		case 1:
			add := uint64(1+rng.IntN(8)) << 20
			desc = append(desc, fmt.Sprintf("resize %s +%d", name, add))
			ops = append(ops, opGrow(name, add))
		case 2:
			host := fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:host-%d", rng.IntN(3))
			desc = append(desc, "allow "+name+" "+host)
			ops = append(ops, func(ctx context.Context, c *cluster) error {
				_, err := c.mgr.AllowHost(ctx, name, host, meta.HostSecret{})
				return err
			})
		case 3:
			desc = append(desc, "delete "+name)
			ops = append(ops, opDelete(name, false))
		case 4:
			desc = append(desc, "delete --snapshots "+name)
			ops = append(ops, opDelete(name, true))
		case 5, 6, 7:
			desc = append(desc, "snapshot "+name+"@"+snap)
			ops = append(ops, opSnapshot(name, snap))
		case 8:
			desc = append(desc, "delete "+name+"@"+snap)
			ops = append(ops, opDeleteSnapshot(name, snap))
		case 9, 10:
			to := vols[rng.IntN(len(vols))]
			desc = append(desc, "clone "+name+"@"+snap+" "+to)
			ops = append(ops, opClone(name, snap, to))
		case 11:
			desc = append(desc, "flatten "+name)
			ops = append(ops, opFlatten(name))
		case 12, 13:
			// A clone and its flatten, with what they need (each
			// refused if there already).
			to := vols[rng.IntN(len(vols))]
			desc = append(desc, "create "+name, "snapshot "+name+"@"+snap, "clone "+name+"@"+snap+" "+to, "flatten "+to)
			ops = append(ops, opCreate(name, 4<<20), opSnapshot(name, snap), opClone(name, snap, to), opFlatten(to))
		case 14, 15:
			desc = append(desc, "revert "+name+" "+snap)
			ops = append(ops, opRevert(name, snap))
		}
	}
	return ops, desc
}

// scriptedSnapshotOps is a sequence that does each operation at least
// once where the registry accepts it, whatever the seed. It leaves a
// with snapshots, so that the end state says what went before.
func scriptedSnapshotOps() ([]cop, []string) {
	ops := []cop{
		opCreate("a", 8<<20), opSnapshot("a", "s1"), opGrow("a", 1<<20), opSnapshot("a", "s2"),
		opClone("a", "s1", "b"), opFlatten("b"), opDeleteSnapshot("a", "s1"),
		opSnapshot("a", "s3"), opRevert("a", "s2"), opSnapshot("a", "s4"), opClone("a", "s2", "c"), opSnapshot("c", "t1"), opDelete("c", true),
		opSnapshot("b", "s1"), opRevert("b", "s1"), opDelete("b", true),
	}
	desc := []string{
		"create a", "snapshot a@s1", "resize a", "snapshot a@s2",
		"clone a@s1 b", "flatten b", "delete a@s1",
		"snapshot a@s3", "revert a s2", "snapshot a@s4", "clone a@s2 c", "snapshot c@t1", "delete --snapshots c",
		"snapshot b@s1", "revert b s1", "delete --snapshots b",
	}
	return ops, desc
}

func opCreate(name string, size uint64) cop {
	return func(ctx context.Context, c *cluster) error {
		_, err := c.mgr.Create(ctx, CreateRequest{Name: name, SizeBytes: size, Node: nodeID})
		return err
	}
}

func opGrow(name string, add uint64) cop {
	return func(ctx context.Context, c *cluster) error {
		v, err := c.mgr.reg.Volume(ctx, name)
		if err != nil {
			return err
		}
		_, err = c.mgr.Resize(ctx, name, v.SizeBytes+add)
		return err
	}
}

func opDelete(name string, withSnapshots bool) cop {
	return func(ctx context.Context, c *cluster) error { return c.mgr.DeleteWith(ctx, name, false, withSnapshots) }
}

func opSnapshot(name, snap string) cop {
	return func(ctx context.Context, c *cluster) error {
		_, _, _, err := c.mgr.Snapshot(ctx, name, snap)
		return err
	}
}

func opDeleteSnapshot(name, snap string) cop {
	return func(ctx context.Context, c *cluster) error { return c.mgr.DeleteSnapshot(ctx, name, snap) }
}

func opClone(name, snap, to string) cop {
	return func(ctx context.Context, c *cluster) error {
		_, err := c.mgr.Clone(ctx, name, snap, to, "")
		return err
	}
}

// opFlatten asks for the flatten, runs it, and has a settle round
// record its end (as `blkctl volume flatten --wait` waits for).
func opFlatten(name string) cop {
	return func(ctx context.Context, c *cluster) error {
		_, err := c.mgr.Flatten(ctx, name)
		c.runFlattens()
		if _, serr := c.mgr.Settle(ctx); serr != nil {
			return serr
		}
		return err
	}
}

func opRevert(name, snap string) cop {
	return func(ctx context.Context, c *cluster) error {
		_, err := c.mgr.Revert(ctx, name, snap)
		return err
	}
}

// runCops runs ops on c until the end or a crash: it reports the
// crash's step, and the first error that is not the registry's refusal
// (the owner is in process and its store works: it must not fail).
func runCops(c *cluster, ops []cop) (crashed string, err error) {
	crashed, err, _ = runCopsCount(c, ops)
	return crashed, err
}

// runCopsCount is runCops; done says which operations succeeded.
func runCopsCount(c *cluster, ops []cop) (crashed string, err error, done []bool) {
	done = make([]bool, len(ops))
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(errCrash)
			if !ok {
				panic(r)
			}
			crashed = e.step
		}
	}()
	for i, o := range ops {
		err := o(context.Background(), c)
		done[i] = err == nil
		if errors.Is(err, ErrOwnerFailed) || errors.Is(err, ErrOwnerUnreachable) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrFeatureMissing) {
			return "", fmt.Errorf("operation %d failed on the owner: %w", i, err), done
		}
	}
	return "", nil, done
}

// TestSnapshotCrashBetweenSteps is TestCrashBetweenSteps with snapshots,
// clones, flattens, reverts and deletes with snapshots: a crash before
// every step of a scripted sequence and of seeded ones (registry
// command, store change, target change, a flatten's copy), then before
// every step of the recovery, then a clean recovery: every registry
// snapshot ends ready (one left being taken or being deleted is
// settled), the store holds exactly the registry's volumes and
// snapshots with its parent links, and no flatten is left half-recorded.
func TestSnapshotCrashBetweenSteps(t *testing.T) {
	base := seed(t)
	t.Logf("seed %d (replay with BLK_SEED=%d)", base, base)
	const rounds = 12
	succeeded := map[string]int{} // by operation
	defer func() { t.Logf("operations the registry accepted, by kind: %v", succeeded) }()
	for round := range rounds + 1 {
		ops, desc := scriptedSnapshotOps()
		if round > 0 {
			ops, desc = snapshotOps(rand.New(rand.NewPCG(base, uint64(round))), 30)
		}
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d round %d: %s\nops: %s", base, round, fmt.Sprintf(format, args...), strings.Join(desc, "; "))
		}
		c := newCluster(t)
		c.w.steps, c.w.trace = 0, nil
		s, err, done := runCopsCount(c, ops)
		if s != "" || err != nil {
			fail("dry run: crashed at %q, %v", s, err)
		}
		for i, ok := range done {
			kind := strings.Fields(desc[i])[0]
			if strings.Contains(desc[i], "@") && kind != "clone" {
				kind += "@"
			} else if strings.Contains(desc[i], "--snapshots") {
				kind += " --snapshots"
			}
			if ok {
				succeeded[kind]++
			} else if round == 0 {
				fail("scripted operation %d (%s) refused", i, desc[i])
			}
		}
		if err := c.check(); err != nil {
			fail("without a crash: %v", err)
		}
		total := c.w.steps
		worlds := 0
		for k := 1; k <= total; k++ {
			c := newCluster(t)
			c.w.steps, c.w.crashAt = 0, k
			at, err := runCops(c, ops)
			if err != nil {
				fail("crash at step %d: %v", k, err)
			}
			if at == "" {
				fail("no crash at step %d of %d", k, total)
			}
			for j := 1; ; j++ {
				c2 := *c
				c2.store = c.store.clone()
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
					fail("crash at step %d (%s), recovery crash at %d: %v\nsteps: %s", k, at, j, err, strings.Join(c.w.trace, " "))
				}
				stopFlattens(c2.rec)
				if !crashed {
					break
				}
			}
		}
		t.Logf("round %d: %d steps, %d crash-and-recover worlds checked", round, total, worlds)
	}
}

// snapCluster is a cluster with volume a (8 MiB) and its snapshot s1.
func snapCluster(t *testing.T) *cluster {
	t.Helper()
	ctx := context.Background()
	c := newCluster(t)
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "a", SizeBytes: 8 << 20, Node: nodeID}); err != nil {
		t.Fatal(err)
	}
	if _, s, _, err := c.mgr.Snapshot(ctx, "a", "s1"); err != nil || s.State != meta.SnapshotReady {
		t.Fatalf("snapshot a@s1: %+v %v", s, err)
	}
	return c
}

// mustCheck fails t unless c is converged (check) after a settle round.
func mustCheck(t *testing.T, c *cluster) {
	t.Helper()
	if bad, err := c.mgr.Settle(context.Background()); err != nil || len(bad) != 0 {
		t.Fatalf("settle: %v %v", bad, err)
	}
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) volume(t *testing.T, name string) meta.Volume {
	t.Helper()
	v, ok := c.reg.state.Volume(name)
	if !ok {
		t.Fatalf("volume %q not registered", name)
	}
	return v
}

// TestDeleteSnapshotWithClone: a snapshot a clone reads through is not
// deleted (meta.ErrHasClones, naming the clone) and stays whole in the
// registry and the store; once the clone is flattened (no parent in the
// store), it is, and its clusters are merged into its volume.
func TestDeleteSnapshotWithClone(t *testing.T) {
	ctx := context.Background()
	c := snapCluster(t)
	if _, err := c.mgr.Clone(ctx, "a", "s1", "b", ""); err != nil {
		t.Fatal(err)
	}
	a := c.volume(t, "a")
	s1, _ := a.Snapshot("s1")
	b := c.volume(t, "b")
	if o := c.store.vols[b.ID]; o.parent != s1.ID || o.size != s1.SizeBytes || o.snap {
		t.Fatalf("clone in the store: %+v, want a volume on snapshot %d of %d bytes", o, s1.ID, s1.SizeBytes)
	}
	err := c.mgr.DeleteSnapshot(ctx, "a", "s1")
	if !errors.Is(err, meta.ErrHasClones) || !strings.Contains(err.Error(), `clones b`) {
		t.Fatalf("delete a@s1 with clone b: %v, want ErrHasClones naming b", err)
	}
	if a := c.volume(t, "a"); a.Snapshots[0].State != meta.SnapshotReady {
		t.Fatalf("a@s1 after a refused delete: %v, want ready", a.Snapshots[0].State)
	}
	mustCheck(t, c)

	if _, err := c.mgr.Flatten(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	c.runFlattens()
	mustCheck(t, c)
	if b := c.volume(t, "b"); b.CloneOf != nil || b.Parent != 0 || c.store.vols[b.ID].parent != 0 {
		t.Fatalf("b after its flatten: clone of %v, parent %d, store parent %d; want none", b.CloneOf, b.Parent, c.store.vols[b.ID].parent)
	}
	if err := c.mgr.DeleteSnapshot(ctx, "a", "s1"); err != nil {
		t.Fatalf("delete a@s1 once b is flat: %v", err)
	}
	if a := c.volume(t, "a"); len(a.Snapshots) != 0 || a.Parent != 0 {
		t.Fatalf("a after its snapshot's delete: %+v", a)
	}
	if _, ok := c.store.vols[s1.ID]; ok {
		t.Fatal("a@s1 still in the store")
	}
	mustCheck(t, c)
}

// TestRevertRefusedWhileConnected: a revert is refused while a host has
// a live controller on the volume (no attachment needed), naming it,
// and leaves the registry and the store as they were; with the host
// gone it is applied once (by its token), the volume at the snapshot's
// size.
func TestRevertRefusedWhileConnected(t *testing.T) {
	ctx := context.Background()
	c := snapCluster(t)
	if _, err := c.mgr.Resize(ctx, "a", 16<<20); err != nil {
		t.Fatal(err)
	}
	a := c.volume(t, "a")
	const h1 = "nqn.2014-08.org.nvmexpress:uuid:h1"
	c.tgt.subs[a.NQN].connected = []string{h1}
	before, stored := c.reg.index, c.store.vols[a.ID]
	_, err := c.mgr.Revert(ctx, "a", "s1")
	if !errors.Is(err, meta.ErrHasConnections) || !strings.Contains(err.Error(), h1) {
		t.Fatalf("revert with %s connected: %v, want ErrHasConnections naming it", h1, err)
	}
	if c.reg.index != before || c.store.vols[a.ID] != stored {
		t.Fatalf("a refused revert changed the registry (index %d → %d) or the store (%+v → %+v)", before, c.reg.index, stored, c.store.vols[a.ID])
	}

	c.tgt.subs[a.NQN].connected = nil
	v, err := c.mgr.Revert(ctx, "a", "s1")
	if err != nil {
		t.Fatal(err)
	}
	s1, _ := v.Snapshot("s1")
	if o := c.store.vols[a.ID]; v.SizeBytes != 8<<20 || v.Reverted == 0 || o.size != 8<<20 || o.parent != s1.ID || o.token != v.Reverted {
		t.Fatalf("after the revert: registry %d bytes, token %d; store %+v; want 8 MiB on snapshot %d, the token applied", v.SizeBytes, v.Reverted, o, s1.ID)
	}
	reverts := func() int { return strings.Count(strings.Join(c.w.trace, " "), "store.revert") }
	if n := reverts(); n != 1 {
		t.Fatalf("%d store reverts, want 1", n)
	}
	// Applied once: neither the settle rounds nor a restart revert again
	// (which would drop what was written since).
	mustCheck(t, c)
	c.restart()
	c.recover(t)
	if n := reverts(); n != 1 {
		t.Fatalf("%d store reverts after a restart, want 1", n)
	}
	mustCheck(t, c)
}

// TestDeleteWithSnapshotsLeavesNothing: a volume with snapshots is not
// deleted plainly (meta.ErrHasSnapshots), nor with them while one has a
// clone (meta.ErrHasClones); once the clone is gone, deleting it with
// its snapshots — a forest after a revert — leaves nothing in the
// registry or the store.
func TestDeleteWithSnapshotsLeavesNothing(t *testing.T) {
	ctx := context.Background()
	c := snapCluster(t)
	for _, step := range []func() error{
		func() error { _, err := c.mgr.Resize(ctx, "a", 12<<20); return err },
		func() error { _, _, _, err := c.mgr.Snapshot(ctx, "a", "s2"); return err },
		func() error { _, err := c.mgr.Revert(ctx, "a", "s1"); return err },
		func() error { _, _, _, err := c.mgr.Snapshot(ctx, "a", "s3"); return err },
		func() error { _, err := c.mgr.Clone(ctx, "a", "s2", "b", ""); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	mustCheck(t, c)
	if err := c.mgr.Delete(ctx, "a", false); !errors.Is(err, meta.ErrHasSnapshots) {
		t.Fatalf("plain delete of a volume with snapshots: %v, want ErrHasSnapshots", err)
	}
	if err := c.mgr.DeleteWith(ctx, "a", false, true); !errors.Is(err, meta.ErrHasClones) || !strings.Contains(err.Error(), "b") {
		t.Fatalf("delete with snapshots, one with clone b: %v, want ErrHasClones naming b", err)
	}
	if len(c.store.vols) != 5 {
		t.Fatalf("after refused deletes the store holds %d objects, want 5 (a, s1..s3, b)", len(c.store.vols))
	}
	mustCheck(t, c)
	if err := c.mgr.Delete(ctx, "b", false); err != nil {
		t.Fatal(err)
	}
	if err := c.mgr.DeleteWith(ctx, "a", false, true); err != nil {
		t.Fatalf("delete with snapshots: %v", err)
	}
	if vols, _ := c.reg.Volumes(ctx); len(vols) != 0 {
		t.Fatalf("registry after the deletes: %+v", vols)
	}
	if len(c.store.vols) != 0 {
		t.Fatalf("store after the deletes: %v, want nothing", c.store.vols)
	}
	mustCheck(t, c)
}

// TestSnapshotStoreFailure: a primary whose store fails the snapshot
// makes Snapshot fail with ErrOwnerFailed and the store's reason; the
// snapshot is deleted again (registry and store), and its name can be
// taken once the store works.
func TestSnapshotStoreFailure(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "a", SizeBytes: 8 << 20, Node: nodeID}); err != nil {
		t.Fatal(err)
	}
	c.store.failSnapshot = errors.New("no space left on device")
	_, _, _, err := c.mgr.Snapshot(ctx, "a", "s1")
	if !errors.Is(err, ErrOwnerFailed) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("snapshot on a failing store: %v, want ErrOwnerFailed with the reason", err)
	}
	if a := c.volume(t, "a"); len(a.Snapshots) != 0 || a.Parent != 0 {
		t.Fatalf("registry after a failed snapshot: snapshots %+v, parent %d", a.Snapshots, a.Parent)
	}
	if len(c.store.vols) != 1 {
		t.Fatalf("store after a failed snapshot: %v, want volume a only", c.store.vols)
	}
	mustCheck(t, c)
	c.store.failSnapshot = nil
	if _, s, _, err := c.mgr.Snapshot(ctx, "a", "s1"); err != nil || s.State != meta.SnapshotReady {
		t.Fatalf("snapshot once the store works: %+v %v", s, err)
	}
	mustCheck(t, c)
}

// TestSnapshotAfterUnappliedRevert: a revert the registry holds but the
// node has not applied yet (its reconcile was lost) is applied before a
// snapshot is taken: the snapshot holds what the volume reads after the
// revert (the reverted-to snapshot's content and size), not what it
// read before, and the store's parent links are the registry's.
func TestSnapshotAfterUnappliedRevert(t *testing.T) {
	ctx := context.Background()
	c := snapCluster(t)
	if _, err := c.mgr.Resize(ctx, "a", 12<<20); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.mgr.Snapshot(ctx, "a", "s2"); err != nil {
		t.Fatal(err)
	}
	// Revert asks the node for its connected hosts, registers the
	// revert, then asks the node to apply it: that call is lost.
	calls := 0
	c.owners.lose = func(string) bool { calls++; return calls == 2 }
	if _, err := c.mgr.Revert(ctx, "a", "s1"); !errors.Is(err, ErrOwnerUnreachable) {
		t.Fatalf("revert whose reconcile is lost: %v, want ErrOwnerUnreachable", err)
	}
	c.owners.lose = nil
	a := c.volume(t, "a")
	s1, _ := a.Snapshot("s1")
	s2, _ := a.Snapshot("s2")
	if o := c.store.vols[a.ID]; a.Reverted == 0 || o.token != 0 || o.parent != s2.ID {
		t.Fatalf("setup: registry token %d, store %+v: want the revert registered and not applied", a.Reverted, o)
	}
	// The node does not answer: whether it applied the revert is
	// unknown, so no snapshot is taken.
	c.owners.lose = func(string) bool { return true }
	if _, _, _, err := c.mgr.Snapshot(ctx, "a", "s3"); !errors.Is(err, ErrOwnerUnreachable) {
		t.Fatalf("snapshot with the node unreachable: %v, want ErrOwnerUnreachable", err)
	}
	c.owners.lose = nil
	if len(c.store.vols) != 3 {
		t.Fatalf("store after an unanswered snapshot: %v, want a, s1, s2", c.store.vols)
	}
	_, s4, _, err := c.mgr.Snapshot(ctx, "a", "s4")
	if err != nil {
		t.Fatal(err)
	}
	if o := c.store.vols[s4.ID]; o.parent != s1.ID || o.size != s1.SizeBytes || s4.Parent != s1.ID {
		t.Fatalf("a@s4 in the store: %+v, registry parent %d; want the reverted volume's: on a@s1 (%d), %d bytes", o, s4.Parent, s1.ID, s1.SizeBytes)
	}
	mustCheck(t, c)
	if a := c.volume(t, "a"); len(a.Snapshots) != 3 {
		t.Fatalf("a's snapshots after a settle round: %+v, want s1, s2, s4 (s3, never taken, forgotten)", a.Snapshots)
	}
}

// TestCloneFailureLeavesNothing: a clone the store cannot make fails
// with ErrOwnerFailed and the store's reason, and leaves no registry
// entry and no store object; the snapshot stays ready and can be
// deleted (it has no clone).
func TestCloneFailureLeavesNothing(t *testing.T) {
	ctx := context.Background()
	c := snapCluster(t)
	c.store.failCreate = errors.New("no space left on device")
	_, err := c.mgr.Clone(ctx, "a", "s1", "b", "")
	if !errors.Is(err, ErrOwnerFailed) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("clone on a failing store: %v, want ErrOwnerFailed with the reason", err)
	}
	if _, ok := c.reg.state.Volume("b"); ok {
		t.Fatal("clone registered after a failed clone")
	}
	if len(c.store.vols) != 2 {
		t.Fatalf("store after a failed clone: %v, want a and a@s1", c.store.vols)
	}
	mustCheck(t, c)
	c.store.failCreate = nil
	if err := c.mgr.DeleteSnapshot(ctx, "a", "s1"); err != nil {
		t.Fatalf("delete a@s1, whose clone failed: %v", err)
	}
	mustCheck(t, c)
}

// TestSnapshotUnanswered: a snapshot whose primary does not answer is
// ErrOwnerUnreachable. Asked to take it, it stays creating (another
// snapshot of the volume is refused meanwhile); the settle rounds leave
// it so for snapshotSettle, then mark it ready if the primary's store
// took it (the answer was lost) or delete it if not (the request was).
// Down before (it does not answer the reconcile that comes first), the
// snapshot is deleted at once and the next settle round forgets it.
func TestSnapshotUnanswered(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	now := time.Unix(1000, 0)
	c.mgr.Now = func() time.Time { return now }
	for _, n := range []string{"a", "b", "c"} {
		if _, err := c.mgr.Create(ctx, CreateRequest{Name: n, SizeBytes: 8 << 20, Node: nodeID}); err != nil {
			t.Fatal(err)
		}
	}
	c.owners.takeLost = true
	if _, _, _, err := c.mgr.Snapshot(ctx, "a", "s"); !errors.Is(err, ErrOwnerUnreachable) {
		t.Fatalf("snapshot whose answer is lost: %v, want ErrOwnerUnreachable", err)
	}
	c.owners.takeLost = false
	if _, _, _, err := c.mgr.Snapshot(ctx, "a", "s2"); !errors.Is(err, meta.ErrBusy) {
		t.Fatalf("a second snapshot while one is being taken: %v, want ErrBusy", err)
	}
	c.owners.takeDropped = true
	if _, _, _, err := c.mgr.Snapshot(ctx, "b", "s"); !errors.Is(err, ErrOwnerUnreachable) {
		t.Fatalf("snapshot whose request is lost: %v, want ErrOwnerUnreachable", err)
	}
	c.owners.takeDropped = false
	c.owners.down[nodeID] = true
	if _, _, _, err := c.mgr.Snapshot(ctx, "c", "s"); !errors.Is(err, ErrOwnerUnreachable) {
		t.Fatalf("snapshot with the primary down: %v, want ErrOwnerUnreachable", err)
	}
	c.owners.down[nodeID] = false
	state := func(name string) string {
		if v := c.volume(t, name); len(v.Snapshots) == 1 {
			return v.Snapshots[0].State.String()
		}
		return "gone"
	}
	if s := state("c"); s != "deleting" {
		t.Fatalf("c@s, its primary down: %s, want deleting", s)
	}
	for _, step := range []struct {
		after   time.Duration
		a, b, c string
	}{
		{0, "creating", "creating", "gone"},
		{snapshotSettle - time.Second, "creating", "creating", "gone"},
		{time.Second, "ready", "deleting", "gone"},
		{0, "ready", "gone", "gone"},
	} {
		now = now.Add(step.after)
		if _, err := c.mgr.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		if a, b, cs := state("a"), state("b"), state("c"); a != step.a || b != step.b || cs != step.c {
			t.Fatalf("%v after the snapshots: a@s %s, b@s %s, c@s %s; want %s, %s, %s", now.Sub(time.Unix(1000, 0)), a, b, cs, step.a, step.b, step.c)
		}
	}
	a := c.volume(t, "a")
	if s, _ := a.Snapshot("s"); a.Parent != s.ID || c.store.vols[a.ID].parent != s.ID {
		t.Fatalf("a's parent: registry %d, store %d; want a@s (%d)", a.Parent, c.store.vols[a.ID].parent, s.ID)
	}
	mustCheck(t, c)
}

// TestFlattenProgressAndDelete: a flatten runs in the background: the
// node's status shows it unfinished until the store's copy ends, then
// done with its progress, and a settle round records it; a clone
// deleted while its flatten runs has the flatten stopped and leaves
// nothing in the store.
func TestFlattenProgressAndDelete(t *testing.T) {
	ctx := context.Background()
	c := snapCluster(t)
	for _, n := range []string{"b", "d"} {
		if _, err := c.mgr.Clone(ctx, "a", "s1", n, ""); err != nil {
			t.Fatal(err)
		}
	}
	b := c.volume(t, "b")
	v, err := c.mgr.Flatten(ctx, "b")
	if err != nil || v.Flatten == nil {
		t.Fatalf("flatten b: %+v %v, want it registered", v.Flatten, err)
	}
	st := c.rec.Reconcile(c.volume(t, "b"))
	if st.Flatten == nil || st.Flatten.Finished || c.store.vols[b.ID].parent == 0 {
		t.Fatalf("before the store's copy: status %+v, store %+v; want a flatten running", st.Flatten, c.store.vols[b.ID])
	}
	if _, _, _, err := c.mgr.Snapshot(ctx, "b", "t"); !errors.Is(err, meta.ErrBusy) {
		t.Fatalf("snapshot of a clone being flattened: %v, want ErrBusy", err)
	}
	c.runFlattens()
	p, ok := c.rec.FlattenProgress(b.ID)
	if !ok || !p.Finished || p.TotalBytes != b.SizeBytes || p.DoneBytes != p.TotalBytes || p.Err != "" {
		t.Fatalf("after the store's copy: %+v, want finished, %d of %d bytes", p, b.SizeBytes, b.SizeBytes)
	}
	mustCheck(t, c)
	if v := c.volume(t, "b"); v.Flatten != nil || v.CloneOf != nil {
		t.Fatalf("b after a settle round: flatten %+v, clone of %v; want neither", v.Flatten, v.CloneOf)
	}

	d := c.volume(t, "d")
	if _, err := c.mgr.Flatten(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if err := c.mgr.Delete(ctx, "d", false); err != nil {
		t.Fatalf("delete a clone being flattened: %v", err)
	}
	if c.flattening() {
		t.Fatal("the flatten of a deleted clone still runs")
	}
	if _, ok := c.store.vols[d.ID]; ok {
		t.Fatal("a deleted clone is still in the store")
	}
	mustCheck(t, c)
	if err := c.mgr.DeleteSnapshot(ctx, "a", "s1"); err != nil {
		t.Fatalf("delete a@s1, its clones flat or gone: %v", err)
	}
	mustCheck(t, c)
}

// runCopsAt is runCops; at is the index of the operation that crashed
// (len(ops) if none did).
func runCopsAt(c *cluster, ops []cop) (at int, crashed string, err error) {
	at = len(ops)
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(errCrash)
			if !ok {
				panic(r)
			}
			crashed = e.step
		}
	}()
	for i, o := range ops {
		at = i
		err := o(context.Background(), c)
		if errors.Is(err, ErrOwnerFailed) || errors.Is(err, ErrOwnerUnreachable) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrFeatureMissing) {
			return i, "", fmt.Errorf("operation %d failed on the owner: %w", i, err)
		}
	}
	return len(ops), "", nil
}

// TestSnapshotCrashThenGoOn: a crash before every step, then the
// operations that follow the one it cut go on before any settle round,
// as they do in a cluster: a crash before a registry command or a call
// to the node is the leader's (a new leader takes the next requests; the
// node keeps its process and has not heard of what the lost one was
// about to ask), one before a store or target step the node's (it
// restarts, reconciling what the registry holds). Then the settle rounds: the same end state
// as TestSnapshotCrashBetweenSteps's. This is where a revert registered
// but not applied meets a snapshot taken after it
// (TestSnapshotAfterUnappliedRevert).
func TestSnapshotCrashThenGoOn(t *testing.T) {
	base := seed(t)
	t.Logf("seed %d (replay with BLK_SEED=%d)", base, base)
	const rounds = 12
	for round := range rounds + 1 {
		ops, desc := scriptedSnapshotOps()
		if round > 0 {
			ops, desc = snapshotOps(rand.New(rand.NewPCG(base, uint64(round))), 30)
		}
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d round %d: %s\nops: %s", base, round, fmt.Sprintf(format, args...), strings.Join(desc, "; "))
		}
		c := newCluster(t)
		c.w.steps, c.owners.stepCalls = 0, true
		if _, s, err := runCopsAt(c, ops); s != "" || err != nil {
			fail("dry run: crashed at %q, %v", s, err)
		}
		total := c.w.steps
		for k := 1; k <= total; k++ {
			c := newCluster(t)
			c.w.steps, c.w.crashAt, c.owners.stepCalls = 0, k, true
			i, at, err := runCopsAt(c, ops)
			if err != nil || at == "" {
				fail("crash at step %d: %q, %v", k, at, err)
			}
			c.w.crashAt = 0
			if strings.HasPrefix(at, "registry.") || strings.HasPrefix(at, "owner.") {
				c.mgr = NewManager(c.reg, c.owners)
			} else {
				c.restart()
				vols, _ := c.reg.Volumes(context.Background())
				c.rec.ReconcileAll(vols)
			}
			if _, s, err := runCopsAt(c, ops[i+1:]); s != "" || err != nil {
				fail("crash at step %d (%s, operation %d): then %q, %v\nsteps: %s", k, at, i, s, err, strings.Join(c.w.trace, " "))
			}
			c.settleAll(t)
			if err := c.check(); err != nil {
				fail("crash at step %d (%s, operation %d), then the rest: %v\nsteps: %s", k, at, i, err, strings.Join(c.w.trace, " "))
			}
			stopFlattens(c.rec)
		}
		t.Logf("round %d: %d steps", round, total)
	}
}

// settleAll is recover without the node's restart: the leader's settle
// rounds, past snapshotSettle, until one changes nothing.
func (c *cluster) settleAll(t *testing.T) {
	c.mgr.Now = func() time.Time { return time.Now().Add(time.Hour) }
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

// TestOrphanSnapshotDropped: a store snapshot on a volume's chain that
// the registry does not know (a replica took it after its barrier had
// failed and the snapshot was dropped) is merged away by the next
// reconcile, leaving the chain the registry's.
func TestOrphanSnapshotDropped(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	if _, err := c.mgr.Create(ctx, CreateRequest{Name: "a", SizeBytes: 8 << 20, Node: nodeID}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.mgr.Snapshot(ctx, "a", "s1"); err != nil {
		t.Fatal(err)
	}
	a := c.volume(t, "a")
	const orphan = 1 << 40
	if err := c.store.Snapshot(a.ID, orphan); err != nil {
		t.Fatal(err)
	}
	if p, _ := c.store.Parent(a.ID); p != orphan {
		t.Fatalf("store parent %d, want the orphan", p)
	}
	c.recover(t)
	if has, _ := c.store.Has(orphan); has {
		t.Fatal("the orphan snapshot is still in the store")
	}
	if p, _ := c.store.Parent(a.ID); p != a.Parent {
		t.Fatalf("store parent %d after the reconcile, registry %d", p, a.Parent)
	}
	mustCheck(t, c)
}
