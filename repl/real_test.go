package repl

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

const (
	realSubNQN  = "nqn.2024-01.io.blk:test:repl"
	realHostNQN = "nqn.2024-01.io.blk:test:host"
	realBlocks  = 4096 // 16 MiB
)

// serve serves realSubNQN with one namespace on b through NVMe/TCP on
// loopback (2 poll groups); closed at the test's end or by stop.
func serve(t testing.TB, b target.AsyncBackend) (addr string, stop func()) {
	t.Helper()
	port, stop := servePort(t, b, tcp.Config{})
	return port.Addr().String(), stop
}

// servePort is serve with cfg (its address and Cores are serve's),
// giving the port (its counters).
func servePort(t testing.TB, b target.AsyncBackend, cfg tcp.Config) (port *tcp.Port, stop func()) {
	t.Helper()
	cfg.Addr, cfg.Cores = "127.0.0.1:0", 2
	lim, err := tcp.Limits(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := target.New(target.Config{Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := tgt.AddSubsystem(target.SubsystemConfig{NQN: realSubNQN, Serial: "blk-repl", Model: "blk test", Hosts: []string{realHostNQN}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Async: b}); err != nil {
		t.Fatal(err)
	}
	port, err = tcp.Listen(tgt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			port.Close()
			tgt.Close()
		})
	}
	t.Cleanup(stop)
	return port, stop
}

func connect(t testing.TB, addr string, cfg initiator.Config) *initiator.Namespace {
	t.Helper()
	cfg.Transport = initiator.TransportTCP
	cfg.HostNQN = realHostNQN
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, cfg, addr, realSubNQN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	ns := c.Namespace(1)
	if ns == nil {
		t.Fatal("namespace 1 not found")
	}
	return ns
}

// TestRealLegs: a primary serving a store volume (its io_uring path
// through a StoreIO) through a Backend whose one leg is blk's initiator
// connected to a replica target over NVMe/TCP. A host runs seeded random
// reads, writes (some FUA), write zeroes and flushes at QD 64 on the
// primary; afterwards the replica, read through its own connection, holds
// exactly what the host reads on the primary, no leg failed, and the
// local leg's reads and overwrites went to the primary's disk engine on
// the host's poll groups (IO.Inherit), not the blocking path. (Without
// Inherit the local legs take the blocking path on the poll group, and a
// Write Zeroes there waits for the volume's lock, held by direct I/Os
// only that group reaps: the test hangs.)
func TestRealLegs(t *testing.T) {
	realLegs(t, initiator.Config{Queues: 2, QueueDepth: 128}, false, nil)
}

// TestRealBarrier: TestRealLegs with barriers taken every 10 ms while
// the host writes: at a barrier's fn the replica, read through its
// connection, and the primary's store hold the same bytes everywhere
// (the point a snapshot of each would be taken at); the writes a
// barrier held are released off their poll groups (their local legs on
// the store's blocking path) and complete; in the end the replica holds
// what the host reads.
func TestRealBarrier(t *testing.T) {
	realLegs(t, initiator.Config{Queues: 2, QueueDepth: 128}, false, takeBarriers)
}

// TestRealLegsFewSlots: TestRealLegs with a replica connection of one
// queue of 2 entries (the least there is) under the host's QD 64 (up to 128 commands at
// once over its two queues): legs find the connection full all the
// time and wait in the backlog; still no replica is reported and the
// replica holds exactly what the primary does.
func TestRealLegsFewSlots(t *testing.T) {
	realLegs(t, initiator.Config{Queues: 1, QueueDepth: initiator.MinQueueDepth}, true, nil)
}

// gateTaker takes barriers or range holds on b while the host writes, each
// comparing the local volume v with the replica behind leg; stop returns
// how many were taken.
type gateTaker func(t *testing.T, b *Backend, v *store.Volume, leg *initiator.Namespace) (stop func() int)

// realLegs: see TestRealLegs; gates, if set, takes barriers or range holds
// meanwhile.
func realLegs(t *testing.T, legCfg initiator.Config, wantBacklog bool, gates gateTaker) {
	seed := testSeed(t)
	replica, err := target.NewMemBackend(testBlock, realBlocks)
	if err != nil {
		t.Fatal(err)
	}
	raddr, _ := serve(t, target.Inline(replica))
	leg := connect(t, raddr, legCfg)

	s, err := store.Open(store.Config{Dir: filepath.Join(t.TempDir(), "meta"), ClusterBytes: 16 << 10, AreaBytes: 64 << 20, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Create(1, store.CreateOptions{SizeBytes: realBlocks * testBlock, BlockSize: testBlock})
	if err != nil {
		t.Fatal(err)
	}
	sio, err := target.NewStoreIO(s, target.StoreIOConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sio.Close()
		_ = s.Close()
	})
	rep := newFakeReporter()
	b, err := New(Config{Local: sio.Backend(v), Reporter: rep, Epoch: 1, Depth: 128})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetPeers(1, []Peer{{Node: "replica", NS: leg, MaxTransfer: leg.Controller().Info().MaxTransfer}}); err != nil {
		t.Fatal(err)
	}
	haddr, _ := serve(t, b)
	host := connect(t, haddr, initiator.Config{Queues: 2, QueueDepth: 64})

	ops := 800
	if testing.Short() {
		ops = 300
	}
	stopGates := func() int { return 0 }
	if gates != nil {
		stopGates = gates(t, b, v, leg)
	}
	initiatortest.RandomWorkload(t, host, seed, 64, ops)
	all := initiatortest.RandomWorkload(t, host, seed+1, 64, ops) // overwrites: the direct path
	if n, st := stopGates(), b.Stats(); gates != nil {
		if n == 0 || st.HeldIOs == 0 || uint64(n) != st.Barriers+st.RangeHolds {
			t.Fatalf("%d barriers or range holds (stats: %d and %d) held %d writes", n, st.Barriers, st.RangeHolds, st.HeldIOs)
		}
		t.Logf("%d barriers or range holds held %d writes", n, st.HeldIOs)
	}
	if err := host.Flush(); err != nil {
		t.Fatal(err)
	}
	remote := make([]byte, len(all))
	if _, err := leg.ReadAt(remote, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(remote, all); i >= 0 {
		t.Fatalf("the replica differs from the primary at byte %d (block %d)", i, i/testBlock)
	}
	local := make([]byte, len(all))
	for lba := uint64(0); lba < realBlocks; lba += 256 {
		if err := v.Read(lba, local[lba*testBlock:(lba+256)*testBlock]); err != nil {
			t.Fatal(err)
		}
	}
	if i := firstDiff(local, all); i >= 0 {
		t.Fatalf("the local store differs from what the host read at byte %d", i)
	}
	st := b.Stats()
	if len(st.Peers) != 1 || st.Peers[0].State != "in-sync" || st.Peers[0].Failures != 0 || st.Peers[0].Writes < uint64(ops) || rep.n.Load() != 0 {
		t.Fatalf("stats %+v, %d reports", st, rep.n.Load())
	}
	if wantBacklog && (st.Peers[0].Backlogged == 0 || st.Peers[0].Queued != 0) {
		t.Fatalf("stats %+v: no leg waited for a slot, or one is still waiting", st)
	}
	if ss := sio.Stats(); ss.Direct == 0 {
		t.Fatalf("store I/O %+v: the local leg never used the poll groups' engine", ss)
	}
	t.Logf("repl %+v; store I/O %+v", st, sio.Stats())
}

// TestRealLegLost: the replica's target goes away under a primary on a
// memory backend: the next write is held until the registry (the fake
// reporter) confirms the replica out of sync, then acknowledged; later
// writes skip the replica; the host reads every acknowledged write back.
func TestRealLegLost(t *testing.T) {
	replica, _ := target.NewMemBackend(testBlock, realBlocks)
	raddr, stopReplica := serve(t, target.Inline(replica))
	leg := connect(t, raddr, initiator.Config{Queues: 1, QueueDepth: 32, CtrlLossTimeout: time.Second})
	local, _ := target.NewMemBackend(testBlock, realBlocks)
	rep := newFakeReporter()
	b, err := New(Config{Local: target.Inline(local), Reporter: rep, Epoch: 4, Depth: 32})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetPeers(4, []Peer{{Node: "replica", NS: leg}}); err != nil {
		t.Fatal(err)
	}
	haddr, _ := serve(t, b)
	host := connect(t, haddr, initiator.Config{Queues: 1, QueueDepth: 32})
	w1 := pattern(2*testBlock, 1)
	if _, err := host.WriteAt(w1, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(w1))
	if _, err := leg.ReadAt(got, 0); err != nil || !bytes.Equal(got, w1) {
		t.Fatalf("the replica lacks the first write (%v)", err)
	}
	stopReplica()
	w2 := pattern(2*testBlock, 2)
	res := make(chan error, 1)
	go func() { _, err := host.WriteAt(w2, 8*testBlock); res <- err }()
	r := rep.next(t)
	if r.node != "replica" || r.epoch != 4 {
		t.Fatalf("report %+v", r)
	}
	select {
	case err := <-res:
		t.Fatalf("write completed (%v) before the registry confirmed", err)
	default:
	}
	r.answer <- nil
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	w3 := pattern(testBlock, 3)
	if _, err := host.WriteAt(w3, 20*testBlock); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off  int64
		want []byte
	}{{0, w1}, {8 * testBlock, w2}, {20 * testBlock, w3}} {
		got := make([]byte, len(c.want))
		if _, err := host.ReadAt(got, c.off); err != nil || !bytes.Equal(got, c.want) {
			t.Fatalf("read at %d: %v", c.off, err)
		}
	}
	st := b.Stats()
	if st.Peers[0].State != "out-of-sync" || !st.Serving || rep.n.Load() != 1 {
		t.Fatalf("stats %+v, %d reports", st, rep.n.Load())
	}
}

// takeBarriers takes barriers on b every 10 ms until stop, the first
// four fns comparing the whole of the local volume v with the replica
// behind leg; stop returns how many were taken.
func takeBarriers(t *testing.T, b *Backend, v *store.Volume, leg *initiator.Namespace) (stop func() int) {
	quit := make(chan struct{})
	done := make(chan int)
	local, remote := make([]byte, realBlocks*testBlock), make([]byte, realBlocks*testBlock)
	go func() {
		n := 0
		defer func() { done <- n }()
		for {
			select {
			case <-quit:
				return
			case <-time.After(10 * time.Millisecond):
			}
			_, err := b.Barrier(context.Background(), func(in []string) ([]string, error) {
				if len(in) != 1 || in[0] != "replica" {
					return nil, fmt.Errorf("in sync: %v", in)
				}
				if n >= 4 {
					return in, nil // enough compared (32 MiB read each, slow under -race)
				}
				for lba := uint64(0); lba < realBlocks; lba += 256 {
					if err := v.Read(lba, local[lba*testBlock:(lba+256)*testBlock]); err != nil {
						return nil, err
					}
				}
				if _, err := leg.ReadAt(remote, 0); err != nil {
					return nil, err
				}
				if i := firstDiff(local, remote); i >= 0 {
					return nil, fmt.Errorf("at the barrier the replica differs from the primary at byte %d (block %d)", i, i/testBlock)
				}
				return in, nil
			})
			if err != nil {
				t.Errorf("barrier %d: %v", n, err)
				return
			}
			n++
		}
	}()
	return func() int {
		close(quit)
		return <-done
	}
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
