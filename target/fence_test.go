package target_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/auth"
	"github.com/blk-project/blk/target"
)

// gateBackend is an asynchronous backend that holds every IO until the
// test releases it: what a replica's disk looks like to EvictAndDrain
// while an old primary's write is still at it.
type gateBackend struct {
	m       *target.MemBackend
	arrived chan *target.IO
	reached atomic.Int64 // IOs Submit received
}

func newGateBackend(tb testing.TB) *gateBackend {
	m, err := target.NewMemBackend(4096, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return &gateBackend{m: m, arrived: make(chan *target.IO, 16)}
}

func (g *gateBackend) Geometry() (target.Geometry, error) { return g.m.Geometry() }
func (g *gateBackend) Blocking() bool                     { return false }
func (g *gateBackend) NewWriteGroup() target.WriteGroup   { return nil }
func (g *gateBackend) Submit(io *target.IO) {
	g.reached.Add(1)
	g.arrived <- io
}

// next returns the IO that reached the backend next.
func (g *gateBackend) next(tb testing.TB) *target.IO {
	tb.Helper()
	select {
	case io := <-g.arrived:
		return io
	case <-time.After(10 * time.Second):
		tb.Fatal("no IO reached the backend")
		return nil
	}
}

// release applies a held write (or reads) and completes it.
func (g *gateBackend) release(io *target.IO) {
	var err error
	switch io.Op {
	case target.OpWrite:
		err = g.m.Write(io.LBA, io.Data, io.FUA)
	case target.OpRead:
		err = g.m.Read(io.LBA, io.Data)
	}
	io.Done(err)
}

// fence is an Admit that admits one host NQN, the fence's, refuses
// newer ones for now and every other one for good.
type fence struct {
	mu    sync.Mutex
	host  string
	newer map[string]bool
}

func (f *fence) set(host string, newer ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.host, f.newer = host, map[string]bool{}
	for _, h := range newer {
		f.newer[h] = true
	}
}

func (f *fence) admit(host string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case host == f.host:
		return nil
	case f.newer[host]:
		return fmt.Errorf("epoch newer than the fence: %w", target.ErrAdmitRetry)
	}
	return errors.New("stale epoch")
}

const (
	epoch1 = "nqn.2024-01.io.blk:node:n1:epoch:1"
	epoch2 = "nqn.2024-01.io.blk:node:n2:epoch:2"
	subRep = "nqn.2024-01.io.blk:replica:vol-a"
)

// replicaHarness is a target serving subRep through a gateBackend, with
// Admit admitting epoch1.
func replicaHarness(t *testing.T) (*harness, *target.Subsystem, *gateBackend, *fence) {
	h := newHarness(t)
	f := &fence{}
	f.set(epoch1, epoch2)
	s, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subRep, Admit: f.admit})
	if err != nil {
		t.Fatal(err)
	}
	g := newGateBackend(t)
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1, Async: g}); err != nil {
		t.Fatal(err)
	}
	return h, s, g, f
}

// evictAsync runs EvictAndDrain of match on its own goroutine.
func evictAsync(ctx context.Context, s *target.Subsystem, match func(string) bool) <-chan error {
	done := make(chan error, 1)
	go func() {
		n, err := s.EvictAndDrain(ctx, match)
		if err == nil && n != 1 {
			err = fmt.Errorf("%d controllers evicted, want 1", n)
		}
		done <- err
	}()
	return done
}

// waitDisconnect waits until q got Responder.Disconnect.
func waitDisconnect(t *testing.T, q *tq) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for q.disconnected() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s never disconnected", q.name)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEvictDrainsHeldWrite is the fence's promise: a write of the old
// epoch held at the backend when EvictAndDrain is called keeps it from
// returning until the write completes; the controller is torn down at
// once; a command sent on the old connections afterwards never reaches
// the backend; the old epoch cannot connect again, the new one can.
func TestEvictDrainsHeldWrite(t *testing.T) {
	h, s, g, f := replicaHarness(t)
	admin, cntlid := h.adminConnect("admin", epoch1, subRep, 5000)
	io := h.ioConnect("io1", 1, epoch1, subRep, cntlid)

	held := h.submit(io, ioCmd(nvme.IOWrite, 1, 3, 1, 0), fill(4096, 0xE1))
	w := g.next(t)

	f.set(epoch2) // the fence rises first, then the eviction
	done := evictAsync(context.Background(), s, func(host string) bool { return host != epoch2 })
	waitDisconnect(t, admin)
	waitDisconnect(t, io)
	// Torn down, not drained: the write is still at the backend.
	select {
	case err := <-done:
		t.Fatalf("EvictAndDrain returned (%v) with a write at the backend", err)
	default:
	}
	// A command on the old connection, before and after the binding
	// closes it, is aborted without reaching the backend.
	if c := h.exec(io, ioCmd(nvme.IOWrite, 1, 4, 1, 0), fill(4096, 0xE2)); c.status() != nvme.StatusAbortSQDeleted {
		t.Fatalf("write after the eviction: %s", fmtStatus(c.status()))
	}
	io.q.Close()
	admin.q.Close()
	if c := h.exec(io, ioCmd(nvme.IOWrite, 1, 5, 1, 0), fill(4096, 0xE3)); c.status() != nvme.StatusAbortSQDeleted {
		t.Fatalf("write on the closed queue: %s", fmtStatus(c.status()))
	}
	select {
	case err := <-done:
		t.Fatalf("EvictAndDrain returned (%v) with a write at the backend", err)
	default:
	}
	if n := g.reached.Load(); n != 1 {
		t.Fatalf("%d IOs reached the backend, want the held write only", n)
	}

	g.release(w)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("EvictAndDrain did not return after the write completed")
	}
	held.wait(t)
	if n := g.reached.Load(); n != 1 {
		t.Fatalf("%d IOs reached the backend", n)
	}

	// The old epoch is refused for good, the new one admitted.
	q := h.queue("old", target.QueueParams{QID: 0, SQSize: 31})
	if c := h.exec(q, connectCmd(0, 31, 5000), connectData(epoch1, subRep, 0xFFFF, hostIDA)); c.status() != nvme.StatusConnectInvalidHost.WithDNR() {
		t.Fatalf("old epoch connect: %s", fmtStatus(c.status()))
	}
	_, c2 := h.adminConnect("new", epoch2, subRep, 5000)
	io2 := h.ioConnect("new-io", 1, epoch2, subRep, c2)
	wr := h.submit(io2, ioCmd(nvme.IOWrite, 1, 6, 1, 0), fill(4096, 0xE4))
	g.release(g.next(t))
	wr.wait(t)
	mustOK(t, wr, "new epoch write")
}

// TestEvictWaitsForDeadController: a controller torn down before the
// fence rose (its admin connection dropped) whose I/O queue still has a
// write at the backend is waited for too: the eviction matches queues by
// host, not only live controllers.
func TestEvictWaitsForDeadController(t *testing.T) {
	h, s, g, f := replicaHarness(t)
	admin, cntlid := h.adminConnect("admin", epoch1, subRep, 5000)
	io := h.ioConnect("io1", 1, epoch1, subRep, cntlid)
	h.submit(io, ioCmd(nvme.IOWrite, 1, 3, 1, 0), fill(4096, 0xE1))
	w := g.next(t)
	admin.q.Close() // the controller goes: its I/O queue is disconnected
	waitDisconnect(t, io)
	io.q.Close()

	f.set(epoch2)
	n, err := s.EvictAndDrain(canceled(), func(host string) bool { return host == epoch1 })
	if n != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("EvictAndDrain with a write of a dead controller held: %d, %v", n, err)
	}
	g.release(w)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := s.EvictAndDrain(ctx, func(host string) bool { return host == epoch1 }); n != 0 || err != nil {
		t.Fatalf("after the write: %d, %v", n, err)
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// TestEvictDuringConnect: an eviction that runs after Admit said yes to
// a Connect but before its controller was registered does not see it;
// the Connect then asks Admit again, and the fence (raised before the
// eviction) refuses it.
func TestEvictDuringConnect(t *testing.T) {
	h := newHarness(t)
	var s *target.Subsystem
	f := &fence{}
	f.set(epoch1)
	var calls atomic.Int32
	admit := func(host string) error {
		err := f.admit(host)
		if calls.Add(1) == 1 {
			// The fence rises and evicts while this Connect is between
			// Admit and its registration.
			f.set(epoch2)
			if n, err := s.EvictAndDrain(context.Background(), func(h string) bool { return h == epoch1 }); n != 0 || err != nil {
				t.Errorf("evict: %d, %v", n, err)
			}
		}
		return err
	}
	var err error
	s, err = h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subRep, Admit: admit})
	if err != nil {
		t.Fatal(err)
	}
	q := h.queue("admin", target.QueueParams{QID: 0, SQSize: 31})
	c := h.exec(q, connectCmd(0, 31, 5000), connectData(epoch1, subRep, 0xFFFF, hostIDA))
	if c.status() != nvme.StatusConnectInvalidHost.WithDNR() || calls.Load() != 2 {
		t.Fatalf("connect racing an eviction: %s after %d Admit calls", fmtStatus(c.status()), calls.Load())
	}
	if st := h.tgt.Stats(); st.Controllers != 0 {
		t.Fatalf("%d controllers live", st.Controllers)
	}
	// The CNTLID went back: the next controller gets 1.
	if _, id := h.adminConnect("admin2", epoch2, subRep, 5000); id != 1 {
		t.Fatalf("CNTLID %d", id)
	}
}

// TestRefuseDuringConnect: a Refuse that runs after a Connect was
// admitted but before its controller was registered reports no host;
// the Connect then asks again and is refused, so that nothing connects
// behind the caller's back (blkd's import counts on it), without DNR
// when the reason wraps ErrAdmitRetry. The controller ID goes back.
func TestRefuseDuringConnect(t *testing.T) {
	h := newHarness(t)
	var s *target.Subsystem
	var calls atomic.Int32
	why := fmt.Errorf("an import writes the volume: %w", target.ErrAdmitRetry)
	admit := func(host string) error {
		if calls.Add(1) == 1 {
			if hosts := s.Refuse(why); len(hosts) != 0 {
				t.Errorf("Refuse during the first Connect: hosts %v connected", hosts)
			}
		}
		return nil
	}
	var err error
	s, err = h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subRep, Admit: admit})
	if err != nil {
		t.Fatal(err)
	}
	q := h.queue("admin", target.QueueParams{QID: 0, SQSize: 31})
	c := h.exec(q, connectCmd(0, 31, 5000), connectData(epoch1, subRep, 0xFFFF, hostIDA))
	if c.status() != nvme.StatusConnectInvalidHost || calls.Load() != 2 {
		t.Fatalf("connect racing a refusal: %s after %d Admit calls", fmtStatus(c.status()), calls.Load())
	}
	if st := h.tgt.Stats(); st.Controllers != 0 {
		t.Fatalf("%d controllers live", st.Controllers)
	}
	if hosts := s.Refuse(nil); len(hosts) != 0 {
		t.Fatalf("lifted: hosts %v connected", hosts)
	}
	if _, id := h.adminConnect("admin2", epoch1, subRep, 5000); id != 1 {
		t.Fatalf("CNTLID %d", id)
	}
	if hosts := s.Refuse(why); len(hosts) != 1 || hosts[0] != epoch1 {
		t.Fatalf("refused with a controller live: hosts %v, want [%s]", hosts, epoch1)
	}
}

// TestAdmitThenAuthenticate: Admit replaces the host list, not
// DH-HMAC-CHAP: an admitted host with secrets must still authenticate.
func TestAdmitThenAuthenticate(t *testing.T) {
	h, s, _, _ := replicaHarness(t)
	hk, _ := auth.GenerateKey(auth.SHA256, 32)
	if err := s.SetHostKeys(epoch1, &target.HostKeys{Host: hk}); err != nil {
		t.Fatal(err)
	}
	q := h.queue("admin", target.QueueParams{QID: 0, SQSize: 31})
	c := h.exec(q, connectCmd(0, 31, 5000), connectData(epoch1, subRep, 0xFFFF, hostIDA))
	mustOK(t, c, "connect")
	if c.dw0()&nvme.ConnectAuthReqATR == 0 {
		t.Fatalf("Connect DW0 %#x: an admitted host with secrets was not asked to authenticate", c.dw0())
	}
	if c := h.exec(q, propSet(nvme.PropCC, ccEnable), nil); c.status() != nvme.StatusAuthenticationRequired.WithDNR() {
		t.Fatalf("command before authentication: %s", fmtStatus(c.status()))
	}
}

// TestCNTLIDRanges: two targets exporting one subsystem NQN with
// disjoint CNTLID ranges hand out IDs within their own range only, so a
// host holding a controller of each never sees a duplicate; a full range
// is Controller Busy without DNR, as a full MaxControllers.
func TestCNTLIDRanges(t *testing.T) {
	ranges := [][2]uint16{{0x401, 0x403}, {0x801, 0x803}}
	hs := make([]*harness, len(ranges))
	seen := map[uint16]bool{}
	for i, r := range ranges {
		hs[i] = newHarness(t, func(c *target.Config) { c.CNTLIDMin, c.CNTLIDMax = r[0], r[1] })
		if c := hs[i].tgt.Config(); c.MaxControllers != 3 || c.MaxDiscoveryControllers != 1 {
			t.Fatalf("target %d: MaxControllers %d, MaxDiscoveryControllers %d", i, c.MaxControllers, c.MaxDiscoveryControllers)
		}
		hs[i].mustSubsystem(subA, 8)
		for j := range 3 {
			_, id := hs[i].adminConnect(fmt.Sprintf("a%d", j), hostA, subA, 5000)
			if id < r[0] || id > r[1] || seen[id] {
				t.Fatalf("target %d handed out CNTLID %#x (range %#x-%#x, seen %v)", i, id, r[0], r[1], seen[id])
			}
			seen[id] = true
		}
		q := hs[i].queue("full", target.QueueParams{QID: 0, SQSize: 31})
		if c := hs[i].exec(q, connectCmd(0, 31, 5000), connectData(hostA, subA, 0xFFFF, hostIDA)); c.status() != nvme.StatusConnectControllerBusy {
			t.Fatalf("target %d, range full: %s", i, fmtStatus(c.status()))
		}
	}
}

// TestSetCNTLIDRange: a range set after New, with controllers live, is
// where new controllers' IDs come from; a live controller keeps its ID,
// inside the new range or not, and no new one takes an ID a live one
// holds; an ID outside the range is not handed out again once freed;
// bad ranges, and ranges smaller than MaxControllers, are refused and
// change nothing; Config reports the range in force.
func TestSetCNTLIDRange(t *testing.T) {
	h := newHarness(t, func(c *target.Config) { c.MaxControllers = 3 })
	h.mustSubsystem(subA, 8)
	a, idA := h.adminConnect("a", hostA, subA, 5000)
	b, idB := h.adminConnect("b", hostA, subA, 5000)
	if idA != 1 || idB != 2 {
		t.Fatalf("default range gave %d, %d", idA, idB)
	}
	for _, r := range [][2]uint16{{0, 5}, {5, 4}, {1, 0xFFF0}, {7, 8}} {
		if err := h.tgt.SetCNTLIDRange(r[0], r[1]); !errors.Is(err, target.ErrInvalid) {
			t.Fatalf("SetCNTLIDRange(%#x, %#x): %v", r[0], r[1], err)
		}
	}
	if c := h.tgt.Config(); c.CNTLIDMin != 1 || c.CNTLIDMax != 0xFFEF {
		t.Fatalf("refused ranges changed the range: %#x-%#x", c.CNTLIDMin, c.CNTLIDMax)
	}
	if err := h.tgt.SetCNTLIDRange(2, 4); err != nil {
		t.Fatal(err)
	}
	if c := h.tgt.Config(); c.CNTLIDMin != 2 || c.CNTLIDMax != 4 || c.MaxControllers != 3 {
		t.Fatalf("Config after SetCNTLIDRange: %#x-%#x, MaxControllers %d", c.CNTLIDMin, c.CNTLIDMax, c.MaxControllers)
	}
	// 2 is b's: the next is 3.
	_, idC := h.adminConnect("c", hostA, subA, 5000)
	if idC != 3 {
		t.Fatalf("after the change: %d, want 3 (2 is live)", idC)
	}
	// a (1, outside the range) ends: its ID is not reused.
	a.q.Close()
	_, idD := h.adminConnect("d", hostA, subA, 5000)
	if idD != 4 {
		t.Fatalf("after a ended: %d, want 4", idD)
	}
	// b (2, inside) ends: the range wraps to it.
	b.q.Close()
	_, idE := h.adminConnect("e", hostA, subA, 5000)
	if idE != 2 {
		t.Fatalf("after b ended: %d, want 2", idE)
	}
	// Three live (3, 4, 2): MaxControllers, Controller Busy.
	q := h.queue("full", target.QueueParams{QID: 0, SQSize: 31})
	if c := h.exec(q, connectCmd(0, 31, 5000), connectData(hostA, subA, 0xFFFF, hostIDA)); c.status() != nvme.StatusConnectControllerBusy {
		t.Fatalf("full: %s", fmtStatus(c.status()))
	}
}

// fill returns n bytes of b.
func fill(n int, b byte) []byte {
	d := make([]byte, n)
	for i := range d {
		d[i] = b
	}
	return d
}
