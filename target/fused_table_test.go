package target

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
)

// TestFusedTableModel drives a pairing table with seeded random puts and
// takes against a map and checks every take's answer, the count the
// look-ups stop by, and the eviction rule of a full table (a verdict
// goes, a waiting half never does).
func TestFusedTableModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 25))
	const depth = 16
	var tb fusedTable
	tb.slots = make([]fusedSlot, depth)
	model := map[uint32]fusedSlot{}
	reqs := make([]Request, 64)
	for step := range 20000 {
		seq := uint32(rng.IntN(48))
		switch {
		case rng.IntN(2) == 0:
			got, ok := tb.take(seq)
			want, wok := model[seq]
			if ok != wok || got != want {
				t.Fatalf("seed %d step %d: take(%d) = %+v %v, want %+v %v", seed, step, seq, got, ok, want, wok)
			}
			delete(model, seq)
		default:
			if _, dup := model[seq]; dup {
				continue // one entry per sequence number, as the core keeps it
			}
			e := fusedSlot{used: true, seq: seq, st: nvme.StatusAbortFusedMissing}
			if rng.IntN(2) == 0 {
				e.r, e.st = &reqs[seq], 0
			}
			waiting := 0
			for _, m := range model {
				if m.r != nil {
					waiting++
				}
			}
			full := len(model) == depth
			ok := tb.put(e)
			switch {
			case !full:
				if !ok {
					t.Fatalf("seed %d step %d: put into a table of %d refused", seed, step, len(model))
				}
				model[seq] = e
			case waiting == depth:
				if ok {
					t.Fatalf("seed %d step %d: put into a table full of waiting halves took it", seed, step)
				}
			default:
				if !ok {
					t.Fatalf("seed %d step %d: put into a full table with verdicts refused", seed, step)
				}
				// One verdict went; every waiting half stays.
				now := map[uint32]fusedSlot{}
				for _, s := range tb.slots {
					if s.used {
						now[s.seq] = s
					}
				}
				gone := 0
				for q, m := range model {
					if now[q] == m {
						continue
					}
					if m.r != nil {
						t.Fatalf("seed %d step %d: a waiting half (%d) was evicted", seed, step, q)
					}
					gone++
				}
				if gone != 1 || len(now) != depth || now[seq] != e {
					t.Fatalf("seed %d step %d: eviction left %d entries, %d gone, the new one in: %v", seed, step, len(now), gone, now[seq] == e)
				}
				model = now
			}
		}
		if tb.n != len(model) {
			t.Fatalf("seed %d step %d: table counts %d entries, holds %d", seed, step, tb.n, len(model))
		}
	}
}
