package tcp_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

// newAsyncTarget serves testSubNQN with one 64 MiB namespace on a
// DelayedBackend (completions late, out of order, from its own
// goroutines) on a port with 2 poll groups.
func newAsyncTarget(t testing.TB, seed uint64, maxDelay time.Duration, durable bool) (*testTarget, *target.DelayedBackend) {
	t.Helper()
	d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: testBlock, Blocks: testBlocks,
		Seed: seed, MaxDelay: maxDelay, TrackDurable: durable})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close) // last: after the port and the target
	tt := serveAsync(t, d)
	t.Cleanup(func() {
		tt.port.Close()
		tt.t.Close()
	})
	return tt, d
}

// serveAsync serves testSubNQN with one namespace on b through a port on
// loopback with 2 poll groups; the caller closes the port, then the
// target.
func serveAsync(t testing.TB, b target.AsyncBackend) *testTarget {
	t.Helper()
	return serveAsyncCfg(t, b, tcp.Config{Addr: "127.0.0.1:0", Cores: 2})
}

// serveAsyncCfg is serveAsync on a port of configuration cfg.
func serveAsyncCfg(t testing.TB, b target.AsyncBackend, cfg tcp.Config) *testTarget {
	t.Helper()
	lim, err := tcp.Limits(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tt := &testTarget{}
	if tt.t, err = target.New(target.Config{Limits: lim}); err != nil {
		t.Fatal(err)
	}
	sub, err := tt.t.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Serial: "blk-test-1", Model: "blk test", Hosts: []string{testHostNQN}})
	if err != nil {
		t.Fatal(err)
	}
	if err = sub.AddNamespace(target.NamespaceConfig{NSID: 1, Async: b}); err != nil {
		t.Fatal(err)
	}
	if tt.port, err = tcp.Listen(tt.t, cfg); err != nil {
		t.Fatal(err)
	}
	tt.addr = tt.port.Addr().String()
	return tt
}

// TestAsyncBackend: seeded random reads, writes (some FUA), write zeroes
// and flushes at QD 64 over two I/O queues through blk's initiator, on a
// backend that completes each IO late, out of order and from another
// goroutine: every read returns what was written, no write's data
// changed while it was at the backend, and after the last Flush the
// durable image holds every write.
func TestAsyncBackend(t *testing.T) {
	seed := testSeed(t)
	tt, d := newAsyncTarget(t, seed, 200*time.Microsecond, true)
	c := connectTCP(t, tt.addr, initiator.Config{Queues: 2, QueueDepth: 64})
	ns := c.Namespace(1)
	ops := 2000
	if testing.Short() {
		ops = 500
	}
	all := initiatortest.RandomWorkload(t, ns, seed, 64, ops)
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := d.CheckFlushed(all); err != nil {
		t.Fatal(err)
	}
	if st := tt.t.Stats(); st.AtBackend < uint64(ops) {
		t.Fatalf("stats: %d IOs at the backend, want ≥ %d", st.AtBackend, ops)
	}
}

// TestAsyncDisconnect: connections close while their commands are at a
// slow backend (writes in the capsule and by R2T, reads): the target
// frees nothing the backend still owns (no write's data changes), answers
// nothing on the closed connections, lets every connection go once the
// backend is done, and serves a new host afterwards.
func TestAsyncDisconnect(t *testing.T) {
	seed := testSeed(t)
	tt, d := newAsyncTarget(t, seed, 3*time.Millisecond, false)
	rng := rand.New(rand.NewPCG(seed, 23))
	for round := range 4 {
		admin, cntlid := tt.adminUp(t, nvme.TCPDigests{})
		before := tt.t.Stats().AtBackend
		d.Pause()
		hosts := make([]*rawHost, 2)
		for q := range hosts {
			h := tt.ioUp(t, cntlid, uint16(q+1), 63, 0, nvme.TCPDigests{})
			hosts[q] = h
			for i := range 48 {
				n := uint32(1 + rng.IntN(2))
				cmd := rw(nvme.IORead, 1, uint64(rng.IntN(testBlocks-2)), n)
				var data []byte
				if rng.IntN(2) == 0 {
					cmd = rw(nvme.IOWrite, 1, cmd.SLBA(), n)
					data = pattern(int(n)*testBlock, byte(i))
					cmd.DPTR = nvme.InCapsuleSGL(0, uint32(len(data)))
				} else {
					cmd.DPTR = nvme.TransportSGL(n * testBlock)
				}
				cmd.CID = uint16(i)
				cmd.Flags = 0x40
				if err := h.write(h.capsulePDU(cmd, data)); err != nil {
					t.Fatal(err)
				}
			}
		}
		// Close while the commands are at the backend (held there):
		// the I/O queues first, or the admin queue (the controller's
		// teardown drops them), by round.
		deadline := time.Now().Add(10 * time.Second)
		for tt.t.Stats().AtBackend-before < 96 {
			if time.Now().After(deadline) {
				t.Fatalf("%d commands at the backend, want 96", tt.t.Stats().AtBackend-before)
			}
			time.Sleep(time.Millisecond)
		}
		if round%2 == 0 {
			for _, h := range hosts {
				h.nc.Close()
			}
			admin.nc.Close()
		} else {
			admin.nc.Close()
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
			for _, h := range hosts {
				h.nc.Close()
			}
		}
		// The I/O connections stay until the backend gives their
		// commands back (their buffers are the disk's until then).
		time.Sleep(20 * time.Millisecond)
		if n := tt.port.Stats().Connections; n < 2 {
			t.Fatalf("%d connections left while their commands are at the backend, want 2", n)
		}
		d.Resume()
		waitConns(t, tt, 0)
	}
	if n := d.Corrupt(); n != 0 {
		t.Fatalf("%d writes changed while at the backend", n)
	}
	// Every command the target took was completed (the connections
	// are gone, so none is held), and the backend saw them.
	if st := tt.t.Stats(); st.Executed != st.Completed || st.AtBackend == 0 {
		t.Fatalf("stats: executed %d, completed %d, %d at the backend", st.Executed, st.Completed, st.AtBackend)
	}
	// The target still serves.
	c := connectTCP(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 16})
	initiatortest.RandomWorkload(t, c.Namespace(1), seed, 16, 200)
}

// connectTCP connects blk's initiator over NVMe/TCP to testSubNQN at
// addr as testHostNQN.
func connectTCP(t testing.TB, addr string, cfg initiator.Config) *initiator.Controller {
	t.Helper()
	cfg.Transport = initiator.TransportTCP
	cfg.HostNQN = testHostNQN
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, cfg, addr, testSubNQN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if c.Namespace(1) == nil {
		t.Fatal(fmt.Errorf("namespace 1 not found"))
	}
	return c
}
