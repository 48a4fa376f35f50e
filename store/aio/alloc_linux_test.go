//go:build linux && !race

package aio

import "testing"

// TestNoAllocPerIO: in steady state a request costs no allocation, from
// queueing through Submit and Reap to Arm, for reads, writes (FUA too)
// and syncs, one at a time and 16 at once.
func TestNoAllocPerIO(t *testing.T) {
	kinds(t, func(t *testing.T, k Kind) {
		f := dataFile(t, 4<<20)
		e := newEngine(t, f, Config{Kind: k, Depth: 16})
		p := newPool(t, Align, 16)
		if err := e.Register(p); err != nil {
			t.Fatal(err)
		}
		cs := make([]Completion, 16)
		var tag uint64
		round := func(n int) {
			for i := range n {
				tag++
				buf := p.Buf(int32(i))
				var err error
				switch tag % 4 {
				case 0:
					err = e.Read(tag, buf, int64(i)*Align)
				case 1:
					err = e.Write(tag, buf, int64(i)*Align, false)
				case 2:
					err = e.Write(tag, buf, int64(i)*Align, true)
				case 3:
					err = e.Sync(tag)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := e.Submit(); err != nil {
				t.Fatal(err)
			}
			for got := 0; got < n; {
				got += waitOne(t, e, cs)
			}
		}
		for _, n := range []int{1, 16} {
			round(n) // warm up: workers started, pages touched
			if a := testing.AllocsPerRun(200, func() { round(n) }); a != 0 {
				t.Errorf("%d requests at once: %.1f allocations per round, want 0", n, a)
			}
		}
	})
}
