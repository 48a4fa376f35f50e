package tcp_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/targettest"
	"github.com/blk-project/blk/target/tcp"
)

// serveSub serves testSubNQN configured by sc (NQN filled in) with one
// namespace on b through a port on loopback.
func serveSub(t *testing.T, sc target.SubsystemConfig, nc target.NamespaceConfig) (*testTarget, *target.Subsystem) {
	t.Helper()
	cfg := tcp.Config{Addr: "127.0.0.1:0", Cores: 2}
	lim, err := tcp.Limits(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tt := &testTarget{}
	if tt.t, err = target.New(target.Config{Limits: lim}); err != nil {
		t.Fatal(err)
	}
	sc.NQN = testSubNQN
	sub, err := tt.t.AddSubsystem(sc)
	if err != nil {
		t.Fatal(err)
	}
	nc.NSID = 1
	if err = sub.AddNamespace(nc); err != nil {
		t.Fatal(err)
	}
	if tt.port, err = tcp.Listen(tt.t, cfg); err != nil {
		t.Fatal(err)
	}
	tt.addr = tt.port.Addr().String()
	t.Cleanup(func() {
		tt.port.Close()
		tt.t.Close()
	})
	return tt, sub
}

// TestANAOverTCP: blk's initiator (which enables namespace notices only,
// not ANA ones) sees the path status of an inaccessible namespace as a
// StatusError — Asymmetric Access Inaccessible, no DNR — and stays
// connected, not reconnecting; back to optimized, I/O is served again.
func TestANAOverTCP(t *testing.T) {
	m, err := target.NewMemBackend(testBlock, testBlocks)
	if err != nil {
		t.Fatal(err)
	}
	tt, sub := serveSub(t, target.SubsystemConfig{Hosts: []string{testHostNQN}, ANA: true}, target.NamespaceConfig{Backend: m})
	c := connectTCP(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 8})
	ns := c.Namespace(1)
	data := pattern(testBlock, 7)
	if _, err := ns.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetANAState(nvme.ANAInaccessible); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, testBlock)
	_, err = ns.ReadAt(buf, 0)
	var se *initiator.StatusError
	if !errors.As(err, &se) || se.Status != nvme.StatusANAInaccessible {
		t.Fatalf("read of an inaccessible namespace: %v", err)
	}
	if _, err := ns.WriteAt(pattern(testBlock, 9), 0); !errors.As(err, &se) || se.Status != nvme.StatusANAInaccessible {
		t.Fatalf("write of an inaccessible namespace: %v", err)
	}
	if err := sub.SetANAState(nvme.ANAOptimized); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.ReadAt(buf, 0); err != nil || string(buf) != string(data) {
		t.Fatalf("read after optimized: %v (data equal %v)", err, string(buf) == string(data))
	}
	if st := c.Stats(); c.State() != initiator.StateLive || st.Failures != 0 || st.Associations != 1 {
		t.Fatalf("state %v, stats %+v: the path status made the initiator reconnect", c.State(), st)
	}
}

// ioDone is an initiator.Callback delivering its error on a channel.
type ioDone chan error

func (d ioDone) IODone(err error) { d <- err }

// TestEvictOverTCP: EvictAndDrain through the TCP binding. A write of
// the admitted host is held at the backend; the fence moves to another
// host NQN and evicts: the connection is torn down at once, the drain
// waits for the held write, and the evicted host's reconnect is refused
// with DNR (its initiator gives up: Lost), while the write's data is
// never changed under the backend.
func TestEvictOverTCP(t *testing.T) {
	seed := testSeed(t)
	d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: testBlock, Blocks: testBlocks, Seed: seed, MaxDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	var mu sync.Mutex
	admitted := testHostNQN
	admit := func(host string) error {
		mu.Lock()
		defer mu.Unlock()
		if host != admitted {
			return errors.New("stale epoch")
		}
		return nil
	}
	tt, sub := serveSub(t, target.SubsystemConfig{Admit: admit}, target.NamespaceConfig{Async: d})
	c := connectTCP(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 8,
		ReconnectDelay: 10 * time.Millisecond, CtrlLossTimeout: 5 * time.Second})
	ns := c.Namespace(1)

	d.Pause()
	before := tt.t.Stats().AtBackend
	wrote := make(ioDone, 1)
	if err := ns.WriteAsync(3, pattern(testBlock, 0x31), 0, wrote); err != nil {
		t.Fatal(err)
	}
	targettest.WaitUntil(t, "the write at the backend", func() bool { return tt.t.Stats().AtBackend > before })

	mu.Lock()
	admitted = "nqn.2024-01.io.blk:node:n2:epoch:2"
	mu.Unlock()
	targettest.EvictHeldWrite(t, tt.t, sub, d, c, wrote, testHostNQN)
}
