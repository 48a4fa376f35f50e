package initiator

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

// recQP is a QP that records sends and accepts receives; everything else
// panics (the embedded nil interface).
type recQP struct {
	transport.QP
	mu    sync.Mutex
	sends []recSend
}

type recSend struct {
	s    *slot
	sges []transport.SGE
}

func (q *recQP) Send(ctx any, sges []transport.SGE, _ transport.PostFlags) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sends = append(q.sends, recSend{s: ctx.(*slot), sges: append([]transport.SGE(nil), sges...)})
	return nil
}

func (q *recQP) PostReceive(any, []transport.SGE) error { return nil }

// slotRig is one queue with no transport under it: the test plays the
// provider, delivering send and receive completions by hand.
type slotRig struct {
	c  *Controller
	a  *association
	q  *queue
	qp *recQP
}

func newSlotRig(t *testing.T, depth, inCapsule int) *slotRig {
	ad, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ad.Close() })
	pd, _ := ad.CreatePD()
	c := &Controller{cfg: Config{Logf: t.Logf}, kick: make(chan struct{}, 1), closing: make(chan struct{})}
	a := newAssociation(c)
	q := &queue{a: a, qid: 1, depth: depth, bufSize: 4096, inCapsule: inCapsule}
	w, err := newRDMAWire(q, pd, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &slotRig{c: c, a: a, q: q, qp: &recQP{}}
	w.qp = r.qp
	a.queues = []*queue{q}
	return r
}

// submitRead submits a 512-byte read with a channel callback.
func (r *slotRig) submitRead(t *testing.T, done DoneChan) *slot {
	t.Helper()
	s := r.q.tryAcquire()
	if s == nil {
		t.Fatal("queue full")
	}
	rwCmd(&s.cmd, nvme.IORead, 1, 0, 1, false)
	s.cb = done
	s.dst = make([]byte, 512)
	if err := r.q.submit(s, nvme.DirCtrlToHost, 512, 0); err != nil {
		t.Fatal(err)
	}
	return s
}

func (r *slotRig) sent(s *slot) {
	r.c.HandleCompletion(nil, &transport.Completion{Type: transport.OpSend, RequestContext: s, QPContext: r.q})
}

// respond delivers a response capsule (msg) as a receive of the queue.
func (r *slotRig) respond(msg []byte, mod func(*transport.Completion)) {
	rs := &recvSlot{q: r.q, buf: make([]byte, responseSize)}
	copy(rs.buf, msg)
	comp := &transport.Completion{Type: transport.OpReceive, RequestContext: rs, QPContext: r.q, Bytes: uint32(len(msg))}
	if mod != nil {
		mod(comp)
	}
	r.c.HandleCompletion(nil, comp)
}

func cqeBytes(cid uint16, st nvme.Status) []byte {
	c := nvme.Completion{CID: cid, SQID: 1, Status: st}
	var b [nvme.CQESize]byte
	c.Marshal(&b)
	return b[:]
}

func TestCIDLayout(t *testing.T) {
	for _, c := range []struct {
		tag uint16
		gen uint8
		cid uint16
	}{{0, 0, 0}, {5, 1, 0x1005}, {0xFFF, 0xF, 0xFFFF}, {0x123, 0x11, 0x1123}} {
		if got := makeCID(c.tag, c.gen); got != c.cid {
			t.Errorf("makeCID(%#x, %d) = %#x, want %#x", c.tag, c.gen, got, c.cid)
		}
		tag, gen := splitCID(c.cid)
		if tag != c.tag&cidTagMask || gen != c.gen&cidGenMask {
			t.Errorf("splitCID(%#x) = %#x, %d", c.cid, tag, gen)
		}
	}
	if MaxQueueDepth > maxTag {
		t.Errorf("MaxQueueDepth %d exceeds the %d tags a CID holds", MaxQueueDepth, maxTag)
	}
}

// Every reuse of a slot bumps the generation in the CID (mod 16); a
// completion is taken only when both its send completion and response
// arrived, in either order.
func TestSlotGenerationAndOrder(t *testing.T) {
	r := newSlotRig(t, 1, 0)
	done := make(DoneChan, 1)
	for i := 0; i < 20; i++ {
		s := r.submitRead(t, done)
		cid := s.cmd.CID
		if want := makeCID(0, uint8(i)); cid != want {
			t.Fatalf("use %d: CID %#x, want %#x", i, cid, want)
		}
		if i%2 == 0 {
			r.sent(s)
			r.respond(cqeBytes(cid, 0), nil)
		} else {
			r.respond(cqeBytes(cid, 0), nil) // response before the send completion
			select {
			case <-done:
				t.Fatal("completed before the send completion")
			default:
			}
			r.sent(s)
		}
		if err := <-done; err != nil {
			t.Fatalf("use %d: %v", i, err)
		}
	}
	if r.a.failed.Load() {
		t.Fatal(r.a.lostErr())
	}
}

// The violations the Linux host treats as fatal fail the association;
// the command in flight completes with ErrConnectionLost and ErrProtocol.
func TestSlotProtocolErrors(t *testing.T) {
	cases := []struct {
		name string
		msg  func(cid uint16) []byte
		mod  func(*transport.Completion)
		want string
	}{
		{"stale generation", func(cid uint16) []byte { return cqeBytes(cid+1<<cidTagBits, 0) }, nil, "not in flight"},
		{"unknown tag", func(cid uint16) []byte { return cqeBytes(cid|7, 0) }, nil, "beyond depth"},
		{"short capsule", func(cid uint16) []byte { return cqeBytes(cid, 0)[:8] }, nil, "8 bytes"},
		{"remote invalidation", func(cid uint16) []byte { return cqeBytes(cid, 0) },
			func(c *transport.Completion) { c.Invalidated, c.InvalidatedKey = true, 0x1234 }, "remote invalidation of key 0x1234"},
		{"receive error", func(cid uint16) []byte { return cqeBytes(cid, 0) },
			func(c *transport.Completion) { c.Status = transport.ErrBufferTooSmall }, "too small"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newSlotRig(t, 2, 0)
			done := make(DoneChan, 1)
			s := r.submitRead(t, done)
			r.sent(s)
			r.respond(tc.msg(s.cmd.CID), tc.mod)
			err := <-done
			if !errors.Is(err, ErrConnectionLost) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrConnectionLost with %q", err, tc.want)
			}
			if !r.a.failed.Load() || !r.q.dead.Load() {
				t.Fatal("association not failed")
			}
			// A late, valid response after the failure is ignored.
			r.respond(cqeBytes(s.cmd.CID, 0), nil)
			select {
			case err := <-done:
				t.Fatalf("second completion: %v", err)
			default:
			}
		})
	}
}

// A duplicated response for a command already answered is fatal too.
func TestSlotDuplicateResponse(t *testing.T) {
	r := newSlotRig(t, 2, 0)
	done := make(DoneChan, 2)
	s := r.submitRead(t, done)
	cid := s.cmd.CID
	r.respond(cqeBytes(cid, 0), nil)
	r.respond(cqeBytes(cid, 0), nil)
	if err := <-done; !errors.Is(err, ErrProtocol) {
		t.Fatalf("err = %v", err)
	}
}

// Failing the association completes every command in flight exactly once
// with an error matching ErrConnectionLost and the cause; submissions on
// the dead queue fail synchronously.
func TestSlotFailAll(t *testing.T) {
	r := newSlotRig(t, 4, 0)
	done := make(DoneChan, 8)
	var slots []*slot
	for i := 0; i < 4; i++ {
		slots = append(slots, r.submitRead(t, done))
	}
	if r.q.tryAcquire() != nil {
		t.Fatal("a fifth slot on a queue of 4")
	}
	r.sent(slots[0])
	r.respond(cqeBytes(slots[0].cmd.CID, 0), nil) // completes normally
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.sent(slots[1])         // half done
	held := r.q.tryAcquire() // taken before the failure, submitted after
	if held == nil {
		t.Fatal("no slot free after a completion")
	}
	cause := errors.New("cable cut")
	r.a.fail(cause)
	for i := 0; i < 3; i++ {
		err := <-done
		if !errors.Is(err, ErrConnectionLost) || !errors.Is(err, cause) {
			t.Fatalf("err = %v", err)
		}
	}
	r.respond(cqeBytes(slots[1].cmd.CID, 0), nil)
	r.a.fail(errors.New("again"))
	if len(done) != 0 {
		t.Fatalf("%d extra completions", len(done))
	}
	// A dead queue hands out no slot: teardown gives its memory back once
	// every slot is free, so none may be filled after it died.
	if s := r.q.tryAcquire(); s != nil {
		t.Fatalf("tryAcquire on a dead queue returned slot %d", s.tag)
	}
	if _, err := r.q.acquire(context.Background()); !errors.Is(err, cause) {
		t.Fatalf("acquire on a dead queue: %v", err)
	}
	if r.q.idle() {
		t.Fatal("queue idle while a slot is held")
	}
	flushCmd(&held.cmd, 1)
	held.cb = done
	if err := r.q.submit(held, nvme.DirNone, 0, 0); !errors.Is(err, cause) {
		t.Fatalf("submit on a dead queue: %v", err)
	}
	if !r.q.idle() {
		t.Fatal("dead queue not idle after the last held slot was refused")
	}
}

// Where data goes: writes that fit the in-capsule size follow the SQE in
// the same SEND (SGL 0x01, offset 0), bigger writes and all reads are
// keyed (0x40) on the slot's registered buffer, no data is the zero keyed
// descriptor.
func TestSlotDataPlacement(t *testing.T) {
	r := newSlotRig(t, 4, 1024)
	submit := func(dir nvme.Direction, n int) (*slot, nvme.Command) {
		s := r.q.tryAcquire()
		rwCmd(&s.cmd, nvme.IOWrite, 1, 0, 1, false)
		s.cb = make(DoneChan, 1)
		if err := r.q.submit(s, dir, n, 0); err != nil {
			t.Fatal(err)
		}
		var c nvme.Command
		c.Unmarshal(s.sqe[:])
		return s, c
	}
	s, c := submit(nvme.DirHostToCtrl, 1024)
	last := r.qp.sends[len(r.qp.sends)-1]
	if c.DPTR != nvme.InCapsuleSGL(0, 1024) || len(last.sges) != 2 || last.sges[0].Length != 64 ||
		last.sges[1].Length != 1024 || last.sges[1].Addr != s.rdma.dataAddr {
		t.Errorf("in-capsule write: DPTR %+v, SGEs %+v", c.DPTR, last.sges)
	}
	s, c = submit(nvme.DirHostToCtrl, 1536)
	last = r.qp.sends[len(r.qp.sends)-1]
	if c.DPTR != nvme.KeyedSGL(s.rdma.dataAddr, 1536, r.q.w.(*rdmaWire).mr.RKey(), false) || len(last.sges) != 1 {
		t.Errorf("keyed write: DPTR %+v, SGEs %+v", c.DPTR, last.sges)
	}
	s, c = submit(nvme.DirCtrlToHost, 512)
	if c.DPTR != nvme.KeyedSGL(s.rdma.dataAddr, 512, r.q.w.(*rdmaWire).mr.RKey(), false) {
		t.Errorf("read: DPTR %+v", c.DPTR)
	}
	_, c = submit(nvme.DirNone, 0)
	if c.DPTR != (nvme.SGL{ID: nvme.SGLIDKeyed}) {
		t.Errorf("no data: DPTR %+v", c.DPTR)
	}
	// The slot's buffer is registered for the target's RDMA READ and
	// WRITE.
	if c.Flags != nvme.FlagSGLMetaBuf {
		t.Errorf("flags %#x", c.Flags)
	}
}

// A command past its deadline is reported by expired.
func TestSlotExpiry(t *testing.T) {
	r := newSlotRig(t, 2, 0)
	s := r.q.tryAcquire()
	keepAliveCmd(&s.cmd)
	s.cb = make(DoneChan, 1)
	r.q.submit(s, nvme.DirNone, 0, 1)
	if what := r.q.expired(monoNow() + 10); !strings.Contains(what, "(CID 0x0) on queue 1") {
		t.Errorf("expired = %q", what)
	}
	s2 := r.q.tryAcquire()
	aerCmd(&s2.cmd)
	s2.cb = make(DoneChan, 1)
	r.q.submit(s2, nvme.DirNone, 0, 0) // no deadline
	r.sent(s)
	r.respond(cqeBytes(s.cmd.CID, 0), nil)
	if what := r.q.expired(monoNow() + 1e12); what != "" {
		t.Errorf("expired = %q for a command without deadline", what)
	}
}
