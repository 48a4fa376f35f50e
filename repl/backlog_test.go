package repl

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestBacklog: a replica connection of 2 slots and 6 host writes (one of
// them 3 commands long, a FUA Write Zeroes whose flush comes after):
// the legs that find it full wait and go out in arrival order as slots
// free; every write completes only once its legs were sent and
// completed; both replicas hold every write; nobody is reported.
func TestBacklog(t *testing.T) {
	g := newRig(t, 2, Config{HoldTimeout: time.Minute})
	g.b.tick = time.Hour // completions alone drain it: the counts below are exact
	slow := g.legs[1]
	slow.slots = 2
	if err := g.b.SetPeers(8, []Peer{{Node: "node-b", NS: g.legs[0]}, {Node: "node-c", NS: slow, MaxTransfer: testBlock}}); err != nil { // a new epoch: a new peer with the new MaxTransfer
		t.Fatal(err)
	}
	var hs []*hostIO
	for i := range 4 {
		hs = append(hs, g.write(uint64(10+i), byte(i+1), false))
	}
	big := pattern(3*testBlock, 9)
	hb := newHostIO(target.OpWrite, 20, 3, big, true)
	g.b.Submit(&hb.io)
	hz := newHostIO(target.OpWriteZeroes, 11, 1, nil, true) // after the write of block 11
	g.b.Submit(&hz.io)
	hs = append(hs, hb, hz)
	if n := len(slow.pending()); n != 2 {
		t.Fatalf("%d commands at the replica, want its 2 slots", n)
	}
	st := g.b.Stats()
	if p := st.Peers[1]; p.Queued != 4 || p.Backlogged != 4 || p.State != "in-sync" {
		t.Fatalf("stats %+v", st)
	}
	g.legs[0].completeAll(t)
	for len(g.local.pending()) > 0 {
		g.local.complete(t, 0, nil)
	}
	for _, h := range hs {
		if h.isDone() {
			t.Fatal("a write completed while its leg waits for a slot")
		}
	}
	// One completion at a time: each frees a slot for the next leg.
	for done := 0; len(slow.pending()) > 0; done++ {
		if n := len(slow.pending()); n > 2 {
			t.Fatalf("%d commands in flight on 2 slots", n)
		}
		slow.complete(t, 0, nil)
		if done > 20 {
			t.Fatal("the backlog does not drain")
		}
	}
	for i, h := range hs {
		if err := h.wait(t); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	// Arrival order on the replica: the 4 writes, the 3 commands of the
	// big one, the zeroes, then its flush.
	var lbas []uint64
	var ops []target.IOOp
	for _, c := range slow.received() {
		lbas = append(lbas, c.lba)
		ops = append(ops, c.op)
	}
	want := []uint64{10, 11, 12, 13, 20, 21, 22, 11, 0}
	if len(lbas) != len(want) || ops[7] != target.OpWriteZeroes || ops[8] != target.OpFlush {
		t.Fatalf("replica got %v %v, want lbas %v", ops, lbas, want)
	}
	for i := range want {
		if lbas[i] != want[i] {
			t.Fatalf("replica got lbas %v, want %v: a waiting leg was overtaken", lbas, want)
		}
	}
	for i, l := range g.legs {
		got := make([]byte, 3*testBlock)
		_ = l.mem.Read(20, got)
		one := make([]byte, testBlock)
		_ = l.mem.Read(11, one)
		if !bytes.Equal(got, big) || !bytes.Equal(one, make([]byte, testBlock)) {
			t.Fatalf("replica %d lacks a write", i)
		}
		for j := range 4 {
			_ = l.mem.Read(uint64(10+j), one)
			if j != 1 && !bytes.Equal(one, pattern(testBlock, byte(j+1))) {
				t.Fatalf("replica %d lacks block %d", i, 10+j)
			}
		}
	}
	st = g.b.Stats()
	if p := st.Peers[1]; p.Queued != 0 || p.Failures != 0 || p.State != "in-sync" || !st.Serving || g.rep.n.Load() != 0 || slow.refused() == 0 {
		t.Fatalf("stats %+v, %d reports, %d refused submits", st, g.rep.n.Load(), slow.refused())
	}
}

// TestBacklogPeerFails: a replica of 1 slot, three writes: the first is
// sent, the others wait. Its command fails (the connection died): the
// peer is reported once, the waiting legs are resolved as writes that
// skipped a failing peer — never sent, held until the registry confirms
// — and all three are acknowledged after the confirmation, not before.
// With a refusing registry they fail with the path status instead.
func TestBacklogPeerFails(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		g := newRig(t, 1, Config{HoldTimeout: time.Minute})
		g.b.tick = time.Hour // the failure alone drains it: the counts below are exact
		g.legs[0].slots = 1
		hs := []*hostIO{g.write(1, 1, false), g.write(2, 2, false), g.write(3, 3, false)}
		for range hs {
			g.local.complete(t, 0, nil)
		}
		if q := g.b.Stats().Peers[0].Queued; q != 2 {
			t.Fatalf("%d legs waiting, want 2", q)
		}
		g.legs[0].complete(t, 0, initiator.ErrConnectionLost)
		rep := g.rep.next(t)
		if st := g.b.Stats(); st.Peers[0].Queued != 0 || st.Peers[0].State != "failing" || st.Peers[0].Failures != 1 {
			t.Fatalf("stats %+v", st)
		}
		for _, h := range hs {
			if h.isDone() {
				t.Fatal("a write the replica lacks completed before the registry knew")
			}
		}
		if refuse {
			rep.answer <- errors.New("no quorum")
		} else {
			rep.answer <- nil
		}
		for i, h := range hs {
			err := h.wait(t)
			if refuse {
				mustStatus(t, err, nvme.StatusANAInaccessible)
			} else if err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
		}
		if n := len(g.legs[0].received()); n != 1 || g.rep.n.Load() != 1 {
			t.Fatalf("replica got %d commands, %d reports", n, g.rep.n.Load())
		}
		if st := g.b.Stats(); st.Peers[0].Held != 3 || st.Peers[0].Queued != 0 {
			t.Fatalf("stats %+v", st)
		}
	}
}

// TestBacklogTimeout: a replica that takes nothing more (its one slot
// busy, no completion coming): a leg waiting for a slot longer than
// HoldTimeout is a failed leg (found by the backlog's timer): the
// replica is reported, the write is held until confirmed, then
// acknowledged. The write in flight completes when its command does.
func TestBacklogTimeout(t *testing.T) {
	g := newRig(t, 1, Config{HoldTimeout: 30 * time.Millisecond})
	g.legs[0].slots = 1
	start := time.Now()
	h1, h2 := g.write(1, 1, false), g.write(2, 2, false)
	g.local.complete(t, 0, nil)
	g.local.complete(t, 0, nil)
	rep := g.rep.next(t)
	if !strings.Contains(rep.reason, ErrBacklogTimeout.Error()) || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("report %+v after %v: a full connection is not a failure before the hold timeout", rep, time.Since(start))
	}
	if h1.isDone() || h2.isDone() {
		t.Fatal("a write completed before the registry confirmed")
	}
	rep.answer <- nil
	if err := h2.wait(t); err != nil {
		t.Fatal(err)
	}
	if h1.isDone() {
		t.Fatal("the write in flight completed before its command")
	}
	g.legs[0].complete(t, 0, nil)
	if err := h1.wait(t); err != nil {
		t.Fatal(err)
	}
	st := g.b.Stats()
	if p := st.Peers[0]; p.State != "out-of-sync" || p.Queued != 0 || p.Failures != 1 || g.rep.n.Load() != 1 || len(g.legs[0].received()) != 1 {
		t.Fatalf("stats %+v, %d reports", st, g.rep.n.Load())
	}
}

// TestBacklogNewEpoch: legs waiting on a peer when SetPeers moves to a
// new epoch (with the same replica) still go out on the old peer as its
// slots free, and their writes complete.
func TestBacklogNewEpoch(t *testing.T) {
	g := newRig(t, 1, Config{HoldTimeout: time.Minute})
	l := g.legs[0]
	l.slots = 1
	h1, h2 := g.write(1, 1, false), g.write(2, 2, false)
	if err := g.b.SetPeers(8, []Peer{{Node: "node-b", NS: l}}); err != nil {
		t.Fatal(err)
	}
	h3 := g.write(3, 3, false) // the new peer: finds the slot busy too
	for len(g.local.pending()) > 0 {
		g.local.complete(t, 0, nil)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !(h1.isDone() && h2.isDone() && h3.isDone()) {
		if len(l.pending()) > 0 {
			l.complete(t, 0, nil)
		} else if time.Now().After(deadline) {
			t.Fatal("a leg stranded across SetPeers")
		} else {
			time.Sleep(time.Millisecond) // the tick retries the new peer's leg
		}
	}
	for _, h := range []*hostIO{h1, h2, h3} {
		if err := h.wait(t); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(l.received()); n != 3 || g.rep.n.Load() != 0 {
		t.Fatalf("replica got %d commands, %d reports", n, g.rep.n.Load())
	}
}
