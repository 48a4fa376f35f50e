package repl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// modelReporter confirms (or, for a chosen node, refuses) after a few
// yields, stamping the confirmation on the test's clock of events.
type modelReporter struct {
	clock   *atomic.Int64
	refuse  string
	mu      sync.Mutex
	confirm map[string]int64
	calls   map[string]int
}

func (m *modelReporter) ReplicaFailed(_ context.Context, node string, _ uint64, _ string) error {
	for range 50 {
		runtime.Gosched()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls[node]++
	if node == m.refuse {
		return errors.New("no quorum")
	}
	m.confirm[node] = m.clock.Add(1)
	return nil
}

// write is one host write (or write zeroes) of the model.
type modelWrite struct {
	lba   uint64
	data  []byte // one block
	acked int64  // clock at the acknowledgement; 0: failed
}

// TestRandomWrites: 8 writers, each on its own blocks, issue seeded
// random writes and write zeroes (and flushes) through a Backend with
// three remote legs that complete on goroutines of their own, out of
// order; each leg starts failing at a random command. At the end, for
// every block whose last write was acknowledged, the local replica holds
// it, and each remote replica either holds it or was confirmed out of
// sync by the registry before the acknowledgement. A write that failed
// has the path status, which comes only from a refused report. Every
// failing replica is reported exactly once. Some legs have a connection
// of 1 to 3 slots: their legs wait in the backlog, which a full
// connection never turns into a failure (a replica that never fails is
// never reported), and which a failure drains through the failure path.
func TestRandomWrites(t *testing.T) {
	seed := testSeed(t)
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) { randomWrites(t, seed+uint64(round)) })
	}
}

func randomWrites(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 23))
	var clock atomic.Int64
	rep := &modelReporter{clock: &clock, confirm: map[string]int64{}, calls: map[string]int{}}
	nodes := []string{"b", "c", "d"}
	if rng.IntN(3) == 0 {
		rep.refuse = nodes[rng.IntN(len(nodes))]
	}
	local := newFakeLocal(t, true, nil)
	b, err := New(Config{Local: local, Reporter: rep, Depth: 8, HoldTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	const writers, per, span = 8, 150, testBlocks / 8
	var legs []*fakeLeg
	var peers []Peer
	var lmu sync.Mutex
	for _, n := range nodes {
		l := newFakeLeg(t, nil)
		// A connection of a few slots for some: the writers have up to 8
		// writes in flight, so legs wait in the backlog.
		l.slots = []int{0, 1, 2, 3}[rng.IntN(4)]
		failAt := int64(rng.IntN(3 * writers * per / 2)) // some never fail
		lseed := rng.Uint64()
		var cmds atomic.Int64
		lrng := rand.New(rand.NewPCG(lseed, 1))
		l.async = func(cmd) error {
			for range 1 + int(cmds.Load()%5) {
				runtime.Gosched()
			}
			if cmds.Add(1) <= failAt {
				return nil
			}
			lmu.Lock()
			fail := lrng.IntN(2) == 0
			lmu.Unlock()
			if fail {
				return errors.New("replica lost")
			}
			return nil
		}
		legs = append(legs, l)
		peers = append(peers, Peer{Node: n, NS: l})
	}
	if err := b.SetPeers(1, peers); err != nil {
		t.Fatal(err)
	}
	last := make([]*modelWrite, testBlocks) // the last write of each block, by its writer
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wseed := rng.Uint64()
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(wseed, uint64(w)))
			for i := range per {
				lba := uint64(w*span + r.IntN(span))
				var h *hostIO
				mw := &modelWrite{lba: lba}
				switch p := r.IntN(10); {
				case p == 0:
					h = newHostIO(target.OpFlush, 0, 0, nil, false)
				case p < 3:
					mw.data = make([]byte, testBlock)
					h = newHostIO(target.OpWriteZeroes, lba, 1, nil, r.IntN(2) == 0)
				default:
					mw.data = pattern(testBlock, byte(w*per+i))
					h = newHostIO(target.OpWrite, lba, 1, mw.data, r.IntN(4) == 0)
				}
				b.Submit(&h.io)
				err := <-h.done
				if err == nil {
					mw.acked = clock.Add(1)
				} else if st := statusOf(err); st != nvme.StatusANAInaccessible || rep.refuse == "" {
					errs <- fmt.Errorf("write %d of writer %d: %v (status %v)", i, w, err, st)
					return
				}
				if mw.data != nil {
					last[lba] = mw
				}
			}
		}()
	}
	wg.Wait()
	for _, l := range legs {
		l.wg.Wait()
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := b.Stats()
	got := make([]byte, testBlock)
	checked := 0
	for _, mw := range last {
		if mw == nil || mw.acked == 0 {
			continue // never written, or its outcome unknown
		}
		checked++
		_ = local.mem.Read(mw.lba, got)
		if !bytes.Equal(got, mw.data) {
			t.Fatalf("block %d: the local replica lacks its acknowledged write", mw.lba)
		}
		for i, l := range legs {
			_ = l.mem.Read(mw.lba, got)
			if bytes.Equal(got, mw.data) {
				continue
			}
			c, ok := rep.confirm[nodes[i]]
			if !ok || c > mw.acked {
				t.Fatalf("block %d: replica %s lacks the write acknowledged at %d; confirmed out of sync: %v at %d (stats %+v)",
					mw.lba, nodes[i], mw.acked, ok, c, st)
			}
		}
	}
	for i, p := range st.Peers {
		want := 0
		if p.Failures > 0 {
			want = 1
		}
		if rep.calls[nodes[i]] != want {
			t.Fatalf("replica %s: %d failures, %d reports", nodes[i], p.Failures, rep.calls[nodes[i]])
		}
	}
	for i, p := range st.Peers {
		if p.Queued != 0 {
			t.Fatalf("replica %s: %d legs left in the backlog", nodes[i], p.Queued)
		}
	}
	t.Logf("refuse %q: %d blocks checked; stats %+v", rep.refuse, checked, st)
}
