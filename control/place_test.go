package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/meta"
)

// lockedRegistry is meta.State behind a mutex, for concurrent managers.
type lockedRegistry struct {
	mu    sync.Mutex
	s     *meta.State
	index uint64
}

func (r *lockedRegistry) Apply(_ context.Context, c meta.Command) (meta.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.index++
	res := r.s.Apply(r.index, c)
	return res, res.Err
}

func (r *lockedRegistry) Volume(_ context.Context, name string) (meta.Volume, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.s.Volume(name)
	if !ok {
		return v, fmt.Errorf("meta: volume %q: %w", name, meta.ErrUnknownVolume)
	}
	return v, nil
}

func (r *lockedRegistry) Volumes(context.Context) ([]meta.Volume, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.s.Export().Volumes, nil
}

func (r *lockedRegistry) Connections(context.Context) ([]meta.Connection, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.s.Export().Connections, nil
}

func (r *lockedRegistry) Node(_ context.Context, id string) (meta.NodeInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.s.Node(id)
	if !ok {
		return n, meta.ErrUnknownNode
	}
	return n, nil
}

func (r *lockedRegistry) Nodes(context.Context) ([]meta.NodeInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.s.Export().Nodes, nil
}

// Place answers after a millisecond, as a linearizable read takes a
// round trip: long enough that concurrent creates would all read the
// registry before any commits, if nothing ordered them.
func (r *lockedRegistry) Place(_ context.Context, req meta.PlaceRequest) ([]string, error) {
	r.mu.Lock()
	nodes, err := r.s.Place(req)
	r.mu.Unlock()
	time.Sleep(time.Millisecond)
	return nodes, err
}

// onlineOwners answers every reconcile with the volume online.
type onlineOwners struct{}

func (onlineOwners) Reconcile(_ context.Context, _, name string, _ uint64) (Status, error) {
	return Status{Name: name, State: StateOnline}, nil
}

// TestConcurrentPlacement: creates running at once see each other's
// promised bytes (Manager.place orders each choice after the previous
// commit): nine volumes of 30 MiB on three nodes of 100 MiB land three
// per node, none refused; a tenth fits nowhere (ErrNoCapacity, nothing
// written). Without the ordering two creates could both choose the node
// that was freest, putting four on one node and refusing the last.
func TestConcurrentPlacement(t *testing.T) {
	reg := &lockedRegistry{s: meta.NewState()}
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c"} {
		if _, err := reg.Apply(ctx, meta.RegisterNode{ID: id, TCPAddr: id + ":4420", MgmtAddr: id + ":7070", CapacityBytes: 100 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	m := NewManager(reg, onlineOwners{})
	var wg sync.WaitGroup
	errs := make([]error, 9)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = m.Create(ctx, CreateRequest{Name: fmt.Sprintf("v%d", i), SizeBytes: 30 << 20})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create v%d: %v", i, err)
		}
	}
	per := map[string]int{}
	vols, _ := reg.Volumes(ctx)
	for _, v := range vols {
		per[v.Node]++
	}
	if per["a"] != 3 || per["b"] != 3 || per["c"] != 3 {
		t.Fatalf("placed %v, want three per node", per)
	}
	before := reg.index
	if _, err := m.Create(ctx, CreateRequest{Name: "more", SizeBytes: 30 << 20}); !errors.Is(err, meta.ErrNoCapacity) || reg.index != before {
		t.Fatalf("a tenth: %v (index %d, was %d), want meta.ErrNoCapacity and nothing written", err, reg.index, before)
	}
}

// silentOwners answers every reconcile with the volume online, and
// Answers (control.Answerer) for every node but those in silent; asked
// records whom placement asked.
type silentOwners struct {
	silent map[string]bool
	mu     sync.Mutex
	asked  []string
}

func (o *silentOwners) Reconcile(_ context.Context, _, name string, _ uint64) (Status, error) {
	return Status{Name: name, State: StateOnline}, nil
}

func (o *silentOwners) Answers(_ context.Context, node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.asked = append(o.asked, node)
	return !o.silent[node]
}

// TestPlacementSkipsSilentNodes: a node the registry still has up but
// that does not answer (killed a moment ago: the leader marks it down
// only seconds later) is not where placement puts a volume; the next
// choice is asked in turn. With no node answering, the create fails with
// meta.ErrNoPlacement naming them and writes nothing. A pinned node is
// not asked (the request named it).
func TestPlacementSkipsSilentNodes(t *testing.T) {
	reg := &lockedRegistry{s: meta.NewState()}
	ctx := context.Background()
	for id, capacity := range map[string]uint64{"a": 300 << 20, "b": 200 << 20, "c": 100 << 20} {
		if _, err := reg.Apply(ctx, meta.RegisterNode{ID: id, TCPAddr: id + ":4420", MgmtAddr: id + ":7070", CapacityBytes: capacity}); err != nil {
			t.Fatal(err)
		}
	}
	owners := &silentOwners{silent: map[string]bool{"a": true}}
	m := NewManager(reg, owners)
	v, err := m.Create(ctx, CreateRequest{Name: "v", SizeBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if v.Node != "b" || !slices.Equal(owners.asked, []string{"a", "b"}) {
		t.Fatalf("placed on %s after asking %v; want b after asking [a b] (a has the most room but does not answer)", v.Node, owners.asked)
	}
	owners.silent = map[string]bool{"a": true, "b": true, "c": true}
	before := reg.index
	_, err = m.Create(ctx, CreateRequest{Name: "w", SizeBytes: 8 << 20})
	if !errors.Is(err, meta.ErrNoPlacement) || !strings.Contains(err.Error(), "did not answer") || reg.index != before {
		t.Fatalf("no node answering: %v (index %d, was %d), want meta.ErrNoPlacement naming them and nothing written", err, reg.index, before)
	}
	owners.asked = nil
	if v, err := m.Create(ctx, CreateRequest{Name: "pinned", SizeBytes: 8 << 20, Node: "a"}); err != nil || v.Node != "a" || len(owners.asked) != 0 {
		t.Fatalf("pinned to a: %+v, %v, asked %v; want it on a, nobody asked", v, err, owners.asked)
	}
}

// fullOwners answers every reconcile with the volume online on its
// primary and standby elsewhere, and DiskFull (control.DiskReporter)
// with full's reason for a node.
type fullOwners struct {
	reg  *lockedRegistry
	mu   sync.Mutex
	full map[string]string
}

func (o *fullOwners) Reconcile(ctx context.Context, node, name string, _ uint64) (Status, error) {
	v, err := o.reg.Volume(ctx, name)
	if err != nil {
		return Status{}, err
	}
	return Status{Name: name, State: readyState(v, node)}, nil
}

func (o *fullOwners) DiskFull(_ context.Context, node string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.full[node]
}

// TestPlacementSkipsFullNodes: a node whose disk is full (snapshots
// hold space the registry does not promise) is not where placement puts
// a volume although it has the most unpromised capacity; the next choice
// is taken, for a replica set too. With every node full, the create
// fails with meta.ErrNoCapacity (507 at the API) naming them and writes
// nothing; pinned to a full node, it is
// refused with ErrCapacity and the node's reason, nothing written.
func TestPlacementSkipsFullNodes(t *testing.T) {
	reg := &lockedRegistry{s: meta.NewState()}
	ctx := context.Background()
	for id, capacity := range map[string]uint64{"a": 300 << 20, "b": 200 << 20, "c": 100 << 20} {
		if _, err := reg.Apply(ctx, meta.RegisterNode{ID: id, TCPAddr: id + ":4420", MgmtAddr: id + ":7070", CapacityBytes: capacity, Zone: "z" + id, Features: []string{meta.FeatureReplication}}); err != nil {
			t.Fatal(err)
		}
	}
	const why = "the node's disk is full (test)"
	owners := &fullOwners{reg: reg, full: map[string]string{"a": why}}
	m := NewManager(reg, owners)
	m.MaxReplicas = 3
	v, err := m.Create(ctx, CreateRequest{Name: "v", SizeBytes: 8 << 20, Replicas: 1})
	if err != nil || v.Node != "b" {
		t.Fatalf("placed on %s (%v); want b (a has the most room but a full disk)", v.Node, err)
	}
	v, err = m.Create(ctx, CreateRequest{Name: "r", SizeBytes: 8 << 20, Replicas: 2})
	if got := slices.Sorted(slices.Values(replicaNodes(v))); err != nil || !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("two replicas on %v (%v); want b and c", got, err)
	}

	before := reg.index
	_, err = m.Create(ctx, CreateRequest{Name: "p", SizeBytes: 8 << 20, Node: "a", Replicas: 1})
	if !errors.Is(err, ErrCapacity) || !strings.Contains(err.Error(), why) || reg.index != before {
		t.Fatalf("pinned to a full node: %v (index %d, was %d), want ErrCapacity with its reason and nothing written", err, reg.index, before)
	}

	owners.mu.Lock()
	owners.full = map[string]string{"a": why, "b": why, "c": why}
	owners.mu.Unlock()
	_, err = m.Create(ctx, CreateRequest{Name: "w", SizeBytes: 8 << 20, Replicas: 1})
	if !errors.Is(err, meta.ErrNoCapacity) || !strings.Contains(err.Error(), "whose disk is full") || reg.index != before {
		t.Fatalf("every disk full: %v (index %d, was %d), want meta.ErrNoCapacity naming them and nothing written", err, reg.index, before)
	}
}
