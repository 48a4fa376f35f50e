package repl

import (
	"fmt"
	"testing"

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
