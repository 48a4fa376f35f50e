package rdma_test

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/target/targettest"
	"github.com/blk-project/blk/transport/soft"
)

// ioDone is an initiator.Callback delivering its error on a channel.
type ioDone chan error

func (d ioDone) IODone(err error) { d <- err }

// TestEvictOverRDMA: EvictAndDrain through the RDMA binding (soft
// provider), as TestEvictOverTCP through TCP: the admitted host's write
// is held at the backend; the fence moves and evicts; the controller is
// torn down at once, the drain waits for the write, the evicted host's
// reconnect is refused with DNR, and no write's data changed under the
// backend. The core's teardown is the binding's Disconnect, then its
// Queue.Close: nothing here is TCP's or RDMA's own.
func TestEvictOverRDMA(t *testing.T) {
	seed := uint64(testSeed(t))
	d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: 4096, Blocks: 16384, Seed: seed, MaxDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := target.New(target.Config{})
	if err != nil {
		t.Fatal(err)
	}
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
	sub, err := tgt.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Admit: admit})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Async: d}); err != nil {
		t.Fatal(err)
	}
	port, err := rdma.Listen(tgt, a, rdma.Config{Addr: "127.0.0.1:0", Cores: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		port.Close()
		tgt.Close()
		a.Close()
	})
	c := connectHost(t, port.Addr().String(), initiator.Config{Queues: 1, QueueDepth: 8,
		ReconnectDelay: 10 * time.Millisecond, CtrlLossTimeout: 5 * time.Second})
	ns := c.Namespace(1)

	d.Pause()
	before := tgt.Stats().AtBackend
	wrote := make(ioDone, 1)
	if err := ns.WriteAsync(3, bytes.Repeat([]byte{0x31}, 4096), 0, wrote); err != nil {
		t.Fatal(err)
	}
	targettest.WaitUntil(t, "the write at the backend", func() bool { return tgt.Stats().AtBackend > before })

	mu.Lock()
	admitted = "nqn.2024-01.io.blk:node:n2:epoch:2"
	mu.Unlock()
	targettest.EvictHeldWrite(t, tgt, sub, d, c, wrote, testHostNQN)
}
