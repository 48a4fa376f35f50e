package repl

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// rig is a Backend over a manual fake local backend and n manual legs.
type rig struct {
	b     *Backend
	local *fakeLocal
	legs  []*fakeLeg
	rep   *fakeReporter
	seq   seq
}

func newRig(t *testing.T, n int, cfg Config) *rig {
	t.Helper()
	g := &rig{rep: newFakeReporter()}
	g.local = newFakeLocal(t, false, &g.seq)
	cfg.Local = g.local
	if cfg.Reporter == nil {
		cfg.Reporter = g.rep
	}
	if cfg.Epoch == 0 {
		cfg.Epoch = 7
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.b = b
	var peers []Peer
	for i := range n {
		l := newFakeLeg(t, &g.seq)
		g.legs = append(g.legs, l)
		peers = append(peers, Peer{Node: "node-" + string(rune('b'+i)), NS: l})
	}
	if err := b.SetPeers(cfg.Epoch, peers); err != nil {
		t.Fatal(err)
	}
	return g
}

// write submits a one-block write of byte v at lba.
func (g *rig) write(lba uint64, v byte, fua bool) *hostIO {
	h := newHostIO(target.OpWrite, lba, 1, pattern(testBlock, v), fua)
	g.b.Submit(&h.io)
	return h
}

func mustStatus(t *testing.T, err error, want nvme.Status) {
	t.Helper()
	if got := statusOf(err); got != want {
		t.Fatalf("status %v (%v), want %v", got, err, want)
	}
}

// TestWriteWaitsForEveryLeg: a write goes to both remote legs before the
// local one, FUA on every leg, and completes only once the local leg and
// both remote ones did, whatever their order.
func TestWriteWaitsForEveryLeg(t *testing.T) {
	g := newRig(t, 2, Config{})
	h := g.write(5, 1, true)
	lp, l0, l1 := g.local.pending(), g.legs[0].pending(), g.legs[1].pending()
	if len(lp) != 1 || len(l0) != 1 || len(l1) != 1 {
		t.Fatalf("legs got %d local, %d, %d remote IOs; want one each", len(lp), len(l0), len(l1))
	}
	if !(l0[0].at < g.local.at[0] && l1[0].at < g.local.at[0]) {
		t.Fatalf("local leg submitted at %d, remote at %d and %d: remote legs go first", g.local.at[0], l0[0].at, l1[0].at)
	}
	if !lp[0].FUA || !l0[0].fua || !l1[0].fua || l0[0].lba != 5 {
		t.Fatalf("FUA local %v, remote %v %v; lba %d", lp[0].FUA, l0[0].fua, l1[0].fua, l0[0].lba)
	}
	g.legs[1].complete(t, 0, nil)
	g.local.complete(t, 0, nil)
	if h.isDone() {
		t.Fatal("write completed while one remote leg is at its replica")
	}
	g.legs[0].complete(t, 0, nil)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	// Another order: the local leg last.
	h = g.write(6, 2, false)
	g.legs[0].completeAll(t)
	g.legs[1].completeAll(t)
	if h.isDone() {
		t.Fatal("write completed before its local leg")
	}
	if g.legs[0].pending() != nil || g.legs[0].received()[1].fua {
		t.Fatal("second write: FUA sent without the host asking")
	}
	g.local.complete(t, 0, nil)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	for i, l := range g.legs {
		got := make([]byte, testBlock)
		_ = l.mem.Read(6, got)
		if !bytes.Equal(got, pattern(testBlock, 2)) {
			t.Fatalf("leg %d does not hold the write", i)
		}
	}
	if g.rep.n.Load() != 0 {
		t.Fatal("reported a replica with no failure")
	}
}

// TestFailedLegHeld: a leg fails; the write is held (not done) until the
// registry confirms the replica out of sync, then acknowledged; a write
// submitted meanwhile skips the replica but is held too; later writes
// skip it and complete without waiting; it is reported once.
func TestFailedLegHeld(t *testing.T) {
	g := newRig(t, 2, Config{HoldTimeout: time.Minute})
	h1 := g.write(1, 1, false)
	g.local.complete(t, 0, nil)
	g.legs[0].complete(t, 0, nil)
	g.legs[1].complete(t, 0, initiator.ErrConnectionLost)
	rep := g.rep.next(t)
	if rep.node != "node-c" || rep.epoch != 7 || !strings.Contains(rep.reason, "connection") {
		t.Fatalf("report %+v", rep)
	}
	// Submitted while the report is pending: node-c skipped, held.
	h2 := g.write(2, 2, false)
	if n := len(g.legs[1].received()); n != 1 {
		t.Fatalf("failing replica got %d commands, want only the first", n)
	}
	g.local.complete(t, 0, nil)
	g.legs[0].complete(t, 0, nil)
	if h1.isDone() || h2.isDone() {
		t.Fatal("a write node-c lacks completed before the registry knew")
	}
	if st := g.b.Stats(); st.Peers[1].State != "failing" || st.Peers[1].Failures != 1 {
		t.Fatalf("stats %+v", st)
	}
	rep.answer <- nil
	if err := h1.wait(t); err != nil {
		t.Fatal(err)
	}
	if err := h2.wait(t); err != nil {
		t.Fatal(err)
	}
	// Confirmed: node-c is out of the set; a write waits for no report.
	h3 := g.write(3, 3, false)
	g.local.complete(t, 0, nil)
	g.legs[0].complete(t, 0, nil)
	if err := h3.wait(t); err != nil {
		t.Fatal(err)
	}
	if n := len(g.legs[1].received()); n != 1 {
		t.Fatalf("out-of-sync replica got %d commands", n)
	}
	st := g.b.Stats()
	if !st.Serving || st.Peers[1].State != "out-of-sync" || st.Peers[1].Held != 2 || st.Peers[0].State != "in-sync" || st.Peers[0].Writes != 3 {
		t.Fatalf("stats %+v", st)
	}
	// The same set again at the same epoch (a reconcile that has not
	// seen the commit yet): node-c stays out.
	if err := g.b.SetPeers(7, []Peer{{Node: "node-b", NS: g.legs[0]}, {Node: "node-c", NS: g.legs[1]}}); err != nil {
		t.Fatal(err)
	}
	h4 := g.write(4, 4, false)
	g.local.complete(t, 0, nil)
	g.legs[0].complete(t, 0, nil)
	if err := h4.wait(t); err != nil {
		t.Fatal(err)
	}
	if n := len(g.legs[1].received()); n != 1 || g.rep.n.Load() != 1 {
		t.Fatalf("out-of-sync replica got %d commands, %d reports", n, g.rep.n.Load())
	}
	// A new epoch takes it back.
	if err := g.b.SetPeers(8, []Peer{{Node: "node-c", NS: g.legs[1]}}); err != nil {
		t.Fatal(err)
	}
	h5 := g.write(5, 5, false)
	g.local.complete(t, 0, nil)
	g.legs[1].complete(t, 0, nil)
	if err := h5.wait(t); err != nil {
		t.Fatal(err)
	}
}

// TestSubmitErrorFailsLeg: a leg whose submit fails (a lost connection)
// is a failed leg too. (A full queue is not: TestBacklog.)
func TestSubmitErrorFailsLeg(t *testing.T) {
	g := newRig(t, 1, Config{HoldTimeout: time.Minute})
	g.legs[0].submitErr = initiator.ErrConnectionLost
	h := g.write(1, 1, false)
	g.local.complete(t, 0, nil)
	rep := g.rep.next(t)
	if h.isDone() {
		t.Fatal("completed before the report was answered")
	}
	rep.answer <- nil
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
}

// TestReporterError: the registry refuses the report (deposed, no
// quorum): the held writes fail with the ANA Inaccessible path status (no
// DNR), the backend stops serving, and every later I/O fails so without
// reaching a leg.
func TestReporterError(t *testing.T) {
	g := newRig(t, 2, Config{HoldTimeout: time.Minute})
	h := g.write(1, 1, false)
	g.local.complete(t, 0, nil)
	g.legs[1].complete(t, 0, nil)
	g.legs[0].complete(t, 0, errors.New("replica gone"))
	g.rep.next(t).answer <- errors.New("meta: stale epoch")
	err := h.wait(t)
	mustStatus(t, err, nvme.StatusANAInaccessible)
	if !errors.Is(err, ErrUnconfirmed) {
		t.Fatalf("error %v", err)
	}
	if g.b.Serving() {
		t.Fatal("still serving after the registry refused")
	}
	before := g.local.ops.Load()
	for _, op := range []target.IOOp{target.OpRead, target.OpWrite, target.OpFlush} {
		h := newHostIO(op, 0, 1, make([]byte, testBlock), false)
		g.b.Submit(&h.io)
		mustStatus(t, h.wait(t), nvme.StatusANAInaccessible)
	}
	if g.local.ops.Load() != before || len(g.legs[1].received()) != 1 {
		t.Fatal("an I/O reached a replica while not serving")
	}
	g.b.SetServing(true)
	h = g.write(2, 2, false) // node-b refused: this write fails too
	g.local.complete(t, 0, nil)
	g.legs[1].complete(t, 0, nil)
	mustStatus(t, h.wait(t), nvme.StatusANAInaccessible)
}

// TestHoldTimeout: a registry that never answers: the held write fails
// with the path status after HoldTimeout and the backend stops serving.
// (The reporter never answers, so the outcome does not depend on timing.)
func TestHoldTimeout(t *testing.T) {
	g := newRig(t, 1, Config{HoldTimeout: 20 * time.Millisecond})
	h := g.write(1, 1, false)
	g.local.complete(t, 0, nil)
	g.legs[0].complete(t, 0, errors.New("timeout"))
	rep := g.rep.next(t)
	defer func() { rep.answer <- nil }()
	err := h.wait(t)
	mustStatus(t, err, nvme.StatusANAInaccessible)
	if g.b.Serving() || g.b.Stats().Peers[0].State != "unconfirmed" {
		t.Fatalf("stats %+v", g.b.Stats())
	}
	if rep.ctx.Err() == nil {
		t.Fatal("the reporter's context outlived the hold")
	}
}

// TestReadsLocalOnly: reads go to the local replica alone.
func TestReadsLocalOnly(t *testing.T) {
	g := newRig(t, 2, Config{})
	_ = g.local.mem.Write(3, pattern(testBlock, 9), false)
	h := newHostIO(target.OpRead, 3, 1, make([]byte, testBlock), false)
	g.b.Submit(&h.io)
	g.local.complete(t, 0, nil)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.io.Data, pattern(testBlock, 9)) {
		t.Fatal("read returned other data")
	}
	for i, l := range g.legs {
		if n := len(l.received()); n != 0 {
			t.Fatalf("leg %d got %d commands for a read", i, n)
		}
	}
}

// TestFlushEveryLeg: a flush goes to the local replica and every remote
// one, and completes after all.
func TestFlushEveryLeg(t *testing.T) {
	g := newRig(t, 3, Config{})
	h := newHostIO(target.OpFlush, 0, 0, nil, false)
	g.b.Submit(&h.io)
	if p := g.local.pending(); len(p) != 1 || p[0].Op != target.OpFlush {
		t.Fatal("no local flush")
	}
	for i, l := range g.legs {
		if p := l.pending(); len(p) != 1 || p[0].op != target.OpFlush {
			t.Fatalf("leg %d: %v", i, p)
		}
	}
	g.local.complete(t, 0, nil)
	g.legs[0].completeAll(t)
	g.legs[2].completeAll(t)
	if h.isDone() {
		t.Fatal("flush completed before every leg")
	}
	g.legs[1].completeAll(t)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
}

// TestLocalFailure: the local replica fails a write: the host gets its
// error, the backend stops serving and LocalFailed is told once.
func TestLocalFailure(t *testing.T) {
	told := make(chan error, 4)
	g := newRig(t, 1, Config{LocalFailed: func(err error) { told <- err }})
	h := g.write(1, 1, false)
	g.legs[0].completeAll(t)
	lerr := target.WithStatus(errors.New("disk"), nvme.StatusWriteFault)
	g.local.complete(t, 0, lerr)
	mustStatus(t, h.wait(t), nvme.StatusWriteFault)
	if g.b.Serving() {
		t.Fatal("serving after the local replica failed")
	}
	select {
	case err := <-told:
		if !errors.Is(err, lerr) {
			t.Fatalf("LocalFailed(%v)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LocalFailed not called")
	}
	if g.rep.n.Load() != 0 || g.b.Stats().LocalFailures != 1 {
		t.Fatalf("stats %+v, %d reports", g.b.Stats(), g.rep.n.Load())
	}
}

// TestZeroesDeallocateSplit: a FUA Write Zeroes larger than a leg's
// command takes is split (16-bit counts), then flushed on the leg (the
// initiator sends Write Zeroes without FUA); a Deallocate is one range;
// a write larger than the leg's MaxTransfer is split at it.
func TestZeroesDeallocateSplit(t *testing.T) {
	g := &rig{rep: newFakeReporter()}
	g.local = newFakeLocal(t, true, nil)
	b, err := New(Config{Local: g.local, Reporter: g.rep})
	if err != nil {
		t.Fatal(err)
	}
	leg := newFakeLeg(t, nil)
	leg.async = func(cmd) error { return nil }
	g.local.noop, leg.noop = true, true // the zeroes run past the memory backends
	if err := b.SetPeers(1, []Peer{{Node: "r", NS: leg, MaxTransfer: 8192}}); err != nil {
		t.Fatal(err)
	}
	h := newHostIO(target.OpWriteZeroes, 0, 3<<16+5, nil, true)
	b.Submit(&h.io)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	var got []cmd
	for _, c := range leg.received() {
		c.cb, c.data, c.at = nil, nil, 0
		got = append(got, c)
	}
	want := []cmd{{op: target.OpWriteZeroes, lba: 0, blocks: 1 << 16}, {op: target.OpWriteZeroes, lba: 1 << 16, blocks: 1 << 16},
		{op: target.OpWriteZeroes, lba: 2 << 16, blocks: 1 << 16}, {op: target.OpWriteZeroes, lba: 3 << 16, blocks: 5}, {op: target.OpFlush}}
	if len(got) != len(want) {
		t.Fatalf("leg got %+v, want %+v", got, want)
	}
	for i := range want {
		if g, w := got[i], want[i]; g.op != w.op || g.lba != w.lba || g.blocks != w.blocks || g.fua != w.fua {
			t.Fatalf("leg command %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	h = newHostIO(target.OpDeallocate, 100, 7, nil, false)
	b.Submit(&h.io)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	if c := leg.received()[5]; c.op != target.OpDeallocate || c.lba != 100 || c.blocks != 7 {
		t.Fatalf("deallocate sent as %+v", c)
	}
	g.local.noop, leg.noop = false, false
	data := pattern(5*testBlock, 3)
	h = newHostIO(target.OpWrite, 10, 5, data, false)
	b.Submit(&h.io)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	cs := leg.received()[6:]
	if len(cs) != 3 || cs[0].lba != 10 || cs[1].lba != 12 || cs[2].lba != 14 || cs[2].blocks != 1 {
		t.Fatalf("a 5-block write over 2-block commands sent as %+v", cs)
	}
	got5 := make([]byte, len(data))
	_ = leg.mem.Read(10, got5)
	if !bytes.Equal(got5, data) {
		t.Fatal("the split write's data differs on the leg")
	}
}

// TestOverflow: more host I/Os in flight than Depth: the extra one takes
// an allocated record and both complete.
func TestOverflow(t *testing.T) {
	g := newRig(t, 1, Config{Depth: 1})
	h1, h2 := g.write(1, 1, false), g.write(2, 2, false)
	g.local.complete(t, 1, nil)
	g.local.complete(t, 0, nil)
	g.legs[0].completeAll(t)
	if err := h1.wait(t); err != nil {
		t.Fatal(err)
	}
	if err := h2.wait(t); err != nil {
		t.Fatal(err)
	}
	if st := g.b.Stats(); st.Overflows != 1 {
		t.Fatalf("stats %+v", st)
	}
	h3 := g.write(3, 3, false)
	g.local.complete(t, 0, nil)
	g.legs[0].completeAll(t)
	if err := h3.wait(t); err != nil || g.b.Stats().Overflows != 1 {
		t.Fatalf("%v, %+v", err, g.b.Stats())
	}
}

// TestConfigAndPeers: bad configurations and peer sets are refused with
// clear errors, a stale epoch too.
func TestConfigAndPeers(t *testing.T) {
	local := newFakeLocal(t, true, nil)
	for _, c := range []Config{{}, {Local: local}, {Local: local, Reporter: &okReporter{}, Depth: -1}, {Local: local, Reporter: &okReporter{}, HoldTimeout: -1}} {
		if _, err := New(c); !errors.Is(err, ErrInvalid) {
			t.Fatalf("New(%+v): %v", c, err)
		}
	}
	b, err := New(Config{Local: local, Reporter: &okReporter{}, Epoch: 3})
	if err != nil {
		t.Fatal(err)
	}
	leg := newFakeLeg(t, nil)
	for _, ps := range [][]Peer{
		{{Node: "", NS: leg}},
		{{Node: "a"}},
		{{Node: "a", NS: leg}, {Node: "a", NS: leg}},
		{{Node: "a", NS: leg, MaxTransfer: 1000}},
		{{Node: "a", NS: leg}, {Node: "b", NS: leg}, {Node: "c", NS: leg}, {Node: "d", NS: leg}, {Node: "e", NS: leg}},
	} {
		if err := b.SetPeers(3, ps); !errors.Is(err, ErrInvalid) {
			t.Fatalf("SetPeers(%+v): %v", ps, err)
		}
	}
	if err := b.SetPeers(2, nil); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("SetPeers at an older epoch: %v", err)
	}
	if st := b.Stats(); st.Epoch != 3 || len(st.Peers) != 0 || !st.Serving {
		t.Fatalf("stats %+v", st)
	}
}

// TestNoPeersIsLocal: with no peers the backend is its local one: a
// write failing locally does not stop it (no replica to disagree with).
func TestNoPeersIsLocal(t *testing.T) {
	local := newFakeLocal(t, true, nil)
	local.fail = target.WithStatus(errors.New("full"), nvme.StatusCapacityExceeded)
	b, err := New(Config{Local: local, Reporter: &okReporter{}})
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	h := newHostIO(target.OpWrite, 0, 1, make([]byte, testBlock), false)
	h.io.SetComplete(func(_ *target.IO, err error) { n.Add(1); h.done <- err })
	b.Submit(&h.io)
	mustStatus(t, h.wait(t), nvme.StatusCapacityExceeded)
	if !b.Serving() || n.Load() != 1 {
		t.Fatal("a plain local backend stopped serving")
	}
}

// TestReadOnlyWhileConnecting: a primary still connecting its replicas
// (not serving, SetReadOnly) answers reads from its local replica and
// refuses every other I/O with the path status, touching no leg; once
// the backend stops by itself (the registry refused a report), reads are
// refused too.
func TestReadOnlyWhileConnecting(t *testing.T) {
	g := newRig(t, 2, Config{HoldTimeout: time.Minute})
	_ = g.local.mem.Write(3, pattern(testBlock, 7), false)
	g.b.SetServing(false)
	g.b.SetReadOnly(true)
	h := newHostIO(target.OpRead, 3, 1, make([]byte, testBlock), false)
	g.b.Submit(&h.io)
	g.local.complete(t, 0, nil)
	if err := h.wait(t); err != nil || !bytes.Equal(h.io.Data, pattern(testBlock, 7)) {
		t.Fatalf("read while connecting: %v", err)
	}
	before := g.local.ops.Load()
	for _, op := range []target.IOOp{target.OpWrite, target.OpWriteZeroes, target.OpFlush} {
		h := newHostIO(op, 0, 1, make([]byte, testBlock), false)
		g.b.Submit(&h.io)
		mustStatus(t, h.wait(t), nvme.StatusANAInaccessible)
	}
	if g.local.ops.Load() != before || len(g.legs[0].received())+len(g.legs[1].received()) != 0 {
		t.Fatal("a write reached a replica while connecting")
	}

	// Serving: a replica lost and the registry refusing the report stops
	// the backend, reads included.
	g.b.SetServing(true)
	w := g.write(1, 1, false)
	g.local.complete(t, 0, nil)
	g.legs[1].complete(t, 0, nil)
	g.legs[0].complete(t, 0, errors.New("replica gone"))
	g.rep.next(t).answer <- errors.New("meta: stale epoch")
	mustStatus(t, w.wait(t), nvme.StatusANAInaccessible)
	h = newHostIO(target.OpRead, 3, 1, make([]byte, testBlock), false)
	g.b.Submit(&h.io)
	mustStatus(t, h.wait(t), nvme.StatusANAInaccessible)
}
