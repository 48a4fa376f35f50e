//go:build linux

package transport

import (
	"sync/atomic"
	"testing"
	"time"
)

// pollCounter is a PollHandler that gives every engine buffer back and
// counts its calls.
type pollCounter struct {
	completions, polls atomic.Uint64
}

func (h *pollCounter) HandleCompletion(c *Core, comp *Completion) {
	h.completions.Add(1)
	if b := c.RecvBuf(comp); b != nil {
		b.Repost()
	}
}

func (h *pollCounter) HandlePoll(*Core) bool {
	h.polls.Add(1)
	return false
}

// TestEnginePollSteadyStateAllocs guards the poll set's path: a CQ
// notification handed to the run token (and HandlePoll after it), and a
// Wake of an idle core through its poll set's goroutine, allocate
// nothing; and HandlePoll follows every notification.
func TestEnginePollSteadyStateAllocs(t *testing.T) {
	cfg := smallConfig()
	cfg.Cores = 1
	cfg.Moderation = ModerationConfig{}
	h := &pollCounter{}
	r := newRig(t, false, cfg, h)
	c := r.e.cores[0]
	if !c.Polling() {
		t.Fatal("a PollHandler's core has no poll set")
	}
	cq, srq := r.cq(0), r.srq(0)
	round := func() {
		r.deliver(t, 0, 8, nil)
		cq.fire()
		srq.pump()
		// A Wake of the idle core: its poll set's goroutine calls
		// HandlePoll; wait for it, so that its work is counted here.
		n := h.polls.Load()
		c.Wake()
		deadline := time.Now().Add(10 * time.Second)
		for h.polls.Load() == n {
			if time.Now().After(deadline) {
				t.Fatal("Wake of an idle core: no HandlePoll in 10 s")
			}
			time.Sleep(10 * time.Microsecond)
		}
	}
	for range 50 {
		round()
	}
	before := h.polls.Load()
	allocs := testing.AllocsPerRun(200, round)
	if allocs != 0 {
		t.Errorf("steady state: %v allocs per notification and Wake, want 0", allocs)
	}
	// 201 rounds (AllocsPerRun runs one more), each a notification and a
	// Wake: at least two HandlePoll calls per round.
	if got := h.polls.Load() - before; got < 2*201 {
		t.Errorf("%d HandlePoll calls in 201 rounds, want ≥ 402", got)
	}
	if st := r.e.Stats(); st.PollWakes < 201 || st.Completions == 0 {
		t.Errorf("stats %+v: want a poll wake per round", st)
	}
}
