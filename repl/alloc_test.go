package repl

import (
	"fmt"
	"testing"
	"time"

	"github.com/blk-project/blk/target"
)

// instantRig is a Backend over an inline memory backend and n legs that
// complete inside their submit, and a host write that completes into a
// counter: nothing in it allocates per I/O but the Backend.
type instantRig struct {
	b    *Backend
	host target.IO
	done int
	err  error
}

func newInstantRig(tb testing.TB, legs int) *instantRig {
	tb.Helper()
	local := newFakeLocal(tb, true, nil)
	b, err := New(Config{Local: local, Reporter: &okReporter{}, Depth: 4})
	if err != nil {
		tb.Fatal(err)
	}
	var peers []Peer
	for i := range legs {
		l := newFakeLeg(tb, nil)
		l.instant = true
		peers = append(peers, Peer{Node: fmt.Sprint("n", i), NS: l})
	}
	if err := b.SetPeers(1, peers); err != nil {
		tb.Fatal(err)
	}
	g := &instantRig{b: b}
	g.host.Op, g.host.LBA, g.host.Blocks, g.host.Data = target.OpWrite, 9, 1, make([]byte, testBlock)
	g.host.SetComplete(func(_ *target.IO, err error) { g.done++; g.err = err })
	return g
}

func (g *instantRig) write(tb testing.TB) {
	n := g.done
	g.b.Submit(&g.host)
	if g.done != n+1 || g.err != nil {
		tb.Fatalf("write: %d completions, %v", g.done-n, g.err)
	}
}

// TestZeroAllocWrite: a write over two remote legs allocates nothing
// (records preallocated, callbacks pointers into them, the leg set one
// atomic load), nor does a flush.
func TestZeroAllocWrite(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	g := newInstantRig(t, 2)
	if n := testing.AllocsPerRun(1000, func() { g.write(t) }); n != 0 {
		t.Fatalf("%v allocations per write", n)
	}
	g.host.Op, g.host.Data = target.OpFlush, nil
	if n := testing.AllocsPerRun(1000, func() { g.write(t) }); n != 0 {
		t.Fatalf("%v allocations per flush", n)
	}
	if st := g.b.Stats(); st.Overflows != 0 || st.Peers[0].Writes < 2000 {
		t.Fatalf("stats %+v", st)
	}
}

// TestZeroAllocBacklog: a 2-command write over a leg of 1 slot (its
// second command waits in the backlog until the first completes)
// allocates nothing either: the backlog links the legs themselves, its
// timer is the peer's.
func TestZeroAllocBacklog(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	local := newFakeLocal(t, true, nil)
	b, err := New(Config{Local: local, Reporter: &okReporter{}, Depth: 4, HoldTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	b.tick = time.Hour // the completions alone drain it, on this goroutine
	l := newFakeLeg(t, nil)
	l.slots, l.nolog, l.noop = 1, true, true
	l.q = make([]cmd, 0, 4)
	if err := b.SetPeers(1, []Peer{{Node: "n", NS: l, MaxTransfer: testBlock}}); err != nil {
		t.Fatal(err)
	}
	var host target.IO
	done := 0
	host.Op, host.LBA, host.Blocks, host.Data = target.OpWrite, 9, 2, make([]byte, 2*testBlock)
	host.SetComplete(func(_ *target.IO, err error) {
		if err == nil {
			done++
		}
	})
	write := func() {
		n := done
		b.Submit(&host)
		if len(l.q) != 1 || b.peerQueued() != 1 {
			t.Fatalf("%d commands at the leg, %d waiting", len(l.q), b.peerQueued())
		}
		l.complete(t, 0, nil) // frees the slot: the second command goes
		if len(l.q) != 1 || b.peerQueued() != 0 || done != n {
			t.Fatalf("%d commands at the leg, %d waiting", len(l.q), b.peerQueued())
		}
		l.complete(t, 0, nil)
		if done != n+1 {
			t.Fatal("the write did not complete")
		}
	}
	if n := testing.AllocsPerRun(1000, write); n != 0 {
		t.Fatalf("%v allocations per backlogged write", n)
	}
	if st := b.Stats(); st.Peers[0].Backlogged < 1000 || st.Overflows != 0 || st.Peers[0].Failures != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// peerQueued is the first peer's legs in the backlog.
func (b *Backend) peerQueued() int32 { return b.set.Load().peers[0].queued.Load() }

// BenchmarkWrite: one 4 KiB write through the Backend with 0, 1 and 2
// remote legs that complete at once: the cost of the fan-out itself.
func BenchmarkWrite(b *testing.B) {
	for _, legs := range []int{0, 1, 2} {
		b.Run(fmt.Sprint("legs=", legs), func(b *testing.B) {
			g := newInstantRig(b, legs)
			b.ReportAllocs()
			b.SetBytes(testBlock)
			for b.Loop() {
				g.write(b)
			}
		})
	}
}
