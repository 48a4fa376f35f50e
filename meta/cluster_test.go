package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// Generous timeouts: these run under -race on a loaded 2-core machine.
const waitFor = 30 * time.Second

func testConfig(t *testing.T, id, dir string) Config {
	cfg := Config{
		ID:                 id,
		DataDir:            dir,
		HeartbeatTimeout:   500 * time.Millisecond,
		ElectionTimeout:    500 * time.Millisecond,
		LeaderLeaseTimeout: 250 * time.Millisecond,
		CommitTimeout:      20 * time.Millisecond,
		// Snapshot and compact often so restarts exercise snapshot +
		// log replay and followers may need InstallSnapshot.
		SnapshotInterval:  100 * time.Millisecond,
		SnapshotThreshold: 16,
		TrailingLogs:      8,
		ApplyTimeout:      waitFor,
	}
	if os.Getenv("BLK_META_RAFT_LOG") != "" {
		cfg.LogOutput, cfg.LogLevel = os.Stderr, "debug"
	}
	return cfg
}

// eventually polls cond every 20ms until it holds or waitFor passes.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s: %v", waitFor, what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type inmemCluster struct {
	t     *testing.T
	dirs  []string
	trans []*raft.InmemTransport
	nodes []*Node // nil while down
}

func newInmemCluster(t *testing.T, n int) *inmemCluster {
	c := &inmemCluster{t: t, dirs: make([]string, n), trans: make([]*raft.InmemTransport, n), nodes: make([]*Node, n)}
	root := t.TempDir()
	for i := range n {
		c.dirs[i] = filepath.Join(root, fmt.Sprintf("m%d", i))
	}
	t.Cleanup(func() {
		for i := range c.nodes {
			c.stop(i)
		}
	})
	return c
}

func (c *inmemCluster) addr(i int) raft.ServerAddress {
	return raft.ServerAddress(fmt.Sprintf("m%d", i))
}

// start (re)starts member i from its data directory on a fresh transport
// wired to every other member's.
func (c *inmemCluster) start(i int, bootstrap bool) *Node {
	c.t.Helper()
	_, tr := raft.NewInmemTransport(c.addr(i))
	c.trans[i] = tr
	for j, o := range c.trans {
		if j != i && o != nil {
			tr.Connect(c.addr(j), o)
			o.Connect(c.addr(i), tr)
		}
	}
	cfg := testConfig(c.t, fmt.Sprintf("m%d", i), c.dirs[i])
	cfg.Transport, cfg.Bootstrap = tr, bootstrap
	n, err := NewNode(cfg)
	if err != nil {
		c.t.Fatalf("start m%d: %v", i, err)
	}
	c.nodes[i] = n
	return n
}

// stop shuts member i down and cuts it off, like a crash of its process.
func (c *inmemCluster) stop(i int) {
	if c.nodes[i] == nil {
		return
	}
	if err := c.nodes[i].Close(); err != nil {
		c.t.Errorf("close m%d: %v", i, err)
	}
	c.nodes[i] = nil
	for j, o := range c.trans {
		if j != i && o != nil {
			o.Disconnect(c.addr(i))
		}
	}
	_ = c.trans[i].Close()
	c.trans[i] = nil
}

func (c *inmemCluster) leader() (*Node, error) {
	var found *Node
	for _, n := range c.nodes {
		if n != nil && n.IsLeader() {
			if found != nil {
				return nil, fmt.Errorf("two leaders: %s and %s", found.ID(), n.ID())
			}
			found = n
		}
	}
	if found == nil {
		return nil, errors.New("no leader")
	}
	return found, nil
}

func (c *inmemCluster) waitLeader() *Node {
	c.t.Helper()
	var l *Node
	eventually(c.t, "a single leader", func() (err error) { l, err = c.leader(); return err })
	return l
}

// apply applies cmd on whichever node leads, retrying through elections.
// A command retried after ErrLeadershipLost may have committed: callers
// only use commands whose repetition is harmless or expected.
func (c *inmemCluster) apply(cmd Command) Result {
	c.t.Helper()
	var r Result
	eventually(c.t, fmt.Sprintf("apply %#v", cmd), func() error {
		l, err := c.leader()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err = l.Apply(ctx, cmd)
		if errors.Is(err, ErrNotLeader) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return nil
	})
	return r
}

// converged waits until every running member's registry is byte-identical
// to the leader's.
func (c *inmemCluster) converged() []byte {
	c.t.Helper()
	var want []byte
	eventually(c.t, "all registries equal", func() error {
		l, err := c.leader()
		if err != nil {
			return err
		}
		want = l.FSM().MarshalState()
		for _, n := range c.nodes {
			if n == nil {
				continue
			}
			if got := n.FSM().MarshalState(); !bytes.Equal(got, want) {
				return fmt.Errorf("%s differs from leader %s:\n%s\n%s", n.ID(), l.ID(), got, want)
			}
		}
		return nil
	})
	return want
}

func createVolumes(c *inmemCluster, from, to int) {
	for i := from; i < to; i++ {
		name := fmt.Sprintf("vol%03d", i)
		r := c.apply(CreateVolume{Name: name, SizeBytes: uint64(i+1) << 20, BlockSize: 4096, Node: "s1", At: int64(i)})
		if r.Err != nil && !errors.Is(r.Err, ErrVolumeExists) {
			c.t.Fatalf("create %s: %v", name, r.Err)
		}
		r = c.apply(SetVolumeState{Name: name, State: VolumeOnline})
		if r.Err != nil && !errors.Is(r.Err, ErrBadTransition) {
			c.t.Fatalf("online %s: %v", name, r.Err)
		}
	}
}

func TestClusterInmem(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	start := time.Now()
	c := newInmemCluster(t, 3)
	n0 := c.start(0, true)
	c.start(1, false)
	c.start(2, false)
	if l := c.waitLeader(); l != n0 {
		t.Fatalf("leader %s, want the bootstrapped m0", l.ID())
	}
	ctx := context.Background()
	for i := 1; i < 3; i++ {
		if err := n0.AddVoter(ctx, fmt.Sprintf("m%d", i), string(c.addr(i))); err != nil {
			t.Fatalf("add m%d: %v", i, err)
		}
	}
	c.apply(RegisterNode{ID: "s1", TargetAddr: "10.0.0.1:4420", MgmtAddr: "10.0.0.1:9000"})
	createVolumes(c, 0, 30)
	c.converged()

	// A follower refuses writes and names the leader.
	for i, n := range c.nodes {
		if n.IsLeader() {
			continue
		}
		_, err := n.Apply(ctx, RemoveNode{ID: "s1"})
		var nl *NotLeaderError
		if !errors.As(err, &nl) || !errors.Is(err, ErrNotLeader) {
			t.Fatalf("m%d: Apply on follower: %v", i, err)
		}
		if la, _ := n.Leader(); nl.LeaderAddr != la && la != "" {
			t.Errorf("m%d: NotLeaderError %+v, Leader() %s", i, nl, la)
		}
		if _, err := n.ReadVolume(ctx, "vol000"); !errors.Is(err, ErrNotLeader) {
			t.Errorf("m%d: ReadVolume on follower: %v", i, err)
		}
	}
	l := c.waitLeader()
	if v, err := l.ReadVolume(ctx, "vol007"); err != nil || v.SizeBytes != 8<<20 || v.State != VolumeOnline {
		t.Fatalf("ReadVolume: %+v, %v", v, err)
	}
	if _, err := l.ReadVolume(ctx, "nope"); !errors.Is(err, ErrUnknownVolume) {
		t.Fatalf("ReadVolume unknown: %v", err)
	}
	if _, err := l.Apply(ctx, CreateVolume{Name: "vol000", SizeBytes: 4096, BlockSize: 4096, Node: "s1"}); !errors.Is(err, ErrVolumeExists) {
		t.Fatalf("duplicate through raft: %v", err)
	}

	// Kill the leader; the other two elect one and keep taking writes.
	killed := -1
	for i, n := range c.nodes {
		if n == l {
			killed = i
		}
	}
	c.stop(killed)
	l2 := c.waitLeader()
	if l2 == l {
		t.Fatal("dead leader still leads")
	}
	createVolumes(c, 30, 70)
	c.apply(AllowHost{Volume: "vol031", HostNQN: h1})
	c.apply(Connect{HostNQN: h1, Volume: "vol031", Node: "s1", At: 12345})
	c.converged()

	// Restart the killed member from its data directory: pebble log and
	// stable store plus snapshots. It catches up (by log or snapshot).
	// Bootstrap is ignored: the member has raft state.
	c.start(killed, true)
	createVolumes(c, 70, 80)
	want := c.converged()
	for i, n := range c.nodes {
		var v Volume
		var ok bool
		n.FSM().Read(func(s *State) { v, ok = s.Volume("vol079") })
		if !ok || v.ID != 80 {
			t.Errorf("m%d: vol079 %+v %v", i, v, ok)
		}
	}
	snaps, _ := filepath.Glob(filepath.Join(c.dirs[killed], "snapshots", "*"))
	t.Logf("registry %d bytes; %d snapshots on the restarted member; %v", len(want), len(snaps), time.Since(start))

	// Membership: remove the restarted member, the rest carry on.
	l3 := c.waitLeader()
	victim := (killed + 1) % 3
	if c.nodes[victim] == l3 {
		victim = (victim + 1) % 3
	}
	if err := l3.RemoveServer(ctx, fmt.Sprintf("m%d", victim)); err != nil {
		t.Fatalf("remove m%d: %v", victim, err)
	}
	c.stop(victim)
	c.apply(Disconnect{HostNQN: h1, Volume: "vol031", Node: "s1"})
	c.converged()
}

func TestConfigValidate(t *testing.T) {
	good := Config{ID: "a", DataDir: "/x", BindAddr: "127.0.0.1:0"}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Config{
		{DataDir: "/x", BindAddr: "b"},
		{ID: "a", BindAddr: "b"},
		{ID: "a", DataDir: "/x"},
		{ID: "a", DataDir: "/x", BindAddr: "b", LeaderLeaseTimeout: 2 * time.Second},
		{ID: "a", DataDir: "/x", BindAddr: "b", LogLevel: "loud"},
		{ID: "a", DataDir: "/x", BindAddr: "b", SnapshotRetain: -1},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v validated", bad)
		}
	}
	d := good.WithDefaults()
	if !reflect.DeepEqual(d.WithDefaults(), d) {
		t.Error("WithDefaults is not idempotent")
	}
	if d.HeartbeatTimeout != time.Second || d.SnapshotRetain != 2 || d.ApplyTimeout != 10*time.Second {
		t.Errorf("defaults %+v", d)
	}
}
