package target_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// fakeClock is a Clock moved by hand: Advance runs the timers that come
// due, on the caller's goroutine, so keep-alive expiry is deterministic.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) target.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// Advance moves the clock and runs every timer due, earliest first,
// including timers armed by the ones it runs.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.stopped && !t.at.After(end) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			c.now = end
			c.timers = slices.DeleteFunc(c.timers, func(t *fakeTimer) bool { return t.stopped })
			c.mu.Unlock()
			return
		}
		next.stopped = true
		if next.at.After(c.now) {
			c.now = next.at
		}
		c.mu.Unlock()
		next.f()
	}
}

// call is one command a test executed: it records the completion and
// checks it comes exactly once.
type call struct {
	q    *tq
	req  *target.Request
	done chan struct{}

	mu        sync.Mutex
	completed int
	async     bool // nobody waits: report the completion as an event
	rsp       nvme.Completion
	data      []byte
}

// tq is a test queue: a target.Queue and its recording Responder.
type tq struct {
	h    *harness
	name string
	q    *target.Queue
	cid  uint16
	// seq and prevFuse are what a binding stamps on each capsule in
	// arrival order (Request.Seq, Request.PrevFuse), under h.mu.
	seq      uint32
	prevFuse uint8

	mu          sync.Mutex
	disconnects []error
}

// Complete implements target.Responder.
func (q *tq) Complete(r *target.Request) {
	c, ok := r.Binding.(*call)
	if !ok || c.q != q {
		q.h.tb.Errorf("queue %s: Complete of a request it did not execute", q.name)
		return
	}
	c.mu.Lock()
	c.completed++
	n := c.completed
	c.rsp = r.Rsp
	if r.Rsp.Status.Success() && r.Dir == nvme.DirCtrlToHost {
		c.data = slices.Clone(r.Data[:r.Len])
	}
	async := c.async
	c.mu.Unlock()
	if n != 1 {
		q.h.tb.Errorf("queue %s: CID %d completed %d times", q.name, r.Cmd.CID, n)
		return
	}
	if async {
		q.h.event(fmt.Sprintf("[%s cid=%d] %s", q.name, r.Cmd.CID, fmtRsp(r.Rsp)))
	}
	close(c.done)
}

// Disconnect implements target.Responder.
func (q *tq) Disconnect(reason error) {
	q.mu.Lock()
	q.disconnects = append(q.disconnects, reason)
	q.mu.Unlock()
	q.h.event(fmt.Sprintf("disconnect %s: %v", q.name, reason))
}

func (q *tq) disconnected() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.disconnects)
}

// harness is a target with a fake clock and recording queues.
type harness struct {
	tb    testing.TB
	clock *fakeClock
	tgt   *target.Target
	cfg   target.Config

	mu     sync.Mutex
	queues map[string]*tq
	calls  []*call
	events []string
}

// testLimits are an RDMA-like transport's: 128 KiB transfers, 4 KiB in
// capsule, 128-entry I/O queues, 32-entry admin queues, 4 I/O queues.
func testLimits() target.Limits {
	return target.Limits{MaxTransfer: 128 << 10, InCapsule: 4096, MaxQueueEntries: 128,
		AdminQueueEntries: 32, MaxIOQueues: 4, KeyedSGL: true}
}

func newHarness(tb testing.TB, opts ...func(*target.Config)) *harness {
	tb.Helper()
	h := &harness{tb: tb, clock: newFakeClock(), queues: make(map[string]*tq)}
	h.cfg = target.Config{Limits: testLimits(), Clock: h.clock, SyncWorkers: 4}
	for _, o := range opts {
		o(&h.cfg)
	}
	tgt, err := target.New(h.cfg)
	if err != nil {
		tb.Fatalf("target.New: %v", err)
	}
	h.tgt = tgt
	tb.Cleanup(h.finish)
	return h
}

// finish closes everything and checks that every command executed was
// completed exactly once.
func (h *harness) finish() {
	h.mu.Lock()
	qs := make([]*tq, 0, len(h.queues))
	for _, q := range h.queues {
		qs = append(qs, q)
	}
	h.mu.Unlock()
	for _, q := range qs {
		q.q.Close()
	}
	closed := make(chan struct{})
	go func() { _ = h.tgt.Close(); close(closed) }()
	deadline := time.After(10 * time.Second)
	select {
	case <-closed:
	case <-deadline:
		h.tb.Fatalf("Target.Close did not return")
	}
	for _, q := range qs {
		select {
		case <-q.q.Drained():
		case <-deadline:
			h.tb.Fatalf("queue %s never drained", q.name)
		}
	}
	h.mu.Lock()
	calls := h.calls
	h.mu.Unlock()
	for _, c := range calls {
		select {
		case <-c.done:
		case <-deadline:
			h.tb.Fatalf("queue %s: CID %d (opcode %#x) never completed", c.q.name, c.req.Cmd.CID, c.req.Cmd.Opcode)
		}
	}
	st := h.tgt.Stats()
	if st.Executed != st.Completed || st.Misuse != 0 {
		h.tb.Errorf("stats: executed %d, completed %d, misuse %d", st.Executed, st.Completed, st.Misuse)
	}
}

func (h *harness) event(s string) {
	h.mu.Lock()
	h.events = append(h.events, s)
	h.mu.Unlock()
}

// takeEvents returns and clears the asynchronous events so far.
func (h *harness) takeEvents() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ev := h.events
	h.events = nil
	return ev
}

// queue creates a queue for a new connection.
func (h *harness) queue(name string, p target.QueueParams) *tq {
	h.tb.Helper()
	q, err := h.newQueue(name, p)
	if err != nil {
		h.tb.Fatalf("NewQueue %s: %v", name, err)
	}
	return q
}

// newQueue creates a queue for a new connection, or says why the target
// refused it.
func (h *harness) newQueue(name string, p target.QueueParams) (*tq, error) {
	q := &tq{h: h, name: name}
	tgq, err := h.tgt.NewQueue(q, p)
	if err != nil {
		return nil, err
	}
	q.q = tgq
	h.mu.Lock()
	h.queues[name] = q
	h.mu.Unlock()
	return q, nil
}

// submit executes cmd with data (written to the target for
// host-to-controller commands, a buffer of that size otherwise) and
// returns without waiting. A CID of 0 is replaced by the queue's next.
func (h *harness) submit(q *tq, cmd nvme.Command, data []byte) *call {
	h.mu.Lock()
	q.seq++
	prev := q.prevFuse
	q.prevFuse = cmd.Flags & nvme.FlagFuseMask
	return h.submitLocked(q, cmd, data, q.seq, prev)
}

// submitLocked (h.mu held, released here) executes cmd stamped with its
// arrival (Request.Seq, Request.PrevFuse) and returns without waiting.
func (h *harness) submitLocked(q *tq, cmd nvme.Command, data []byte, seq uint32, prev uint8) *call {
	if cmd.CID == 0 {
		q.cid++
		cmd.CID = q.cid
	}
	r := &target.Request{Cmd: cmd, Dir: cmd.DataDirection(), Len: uint32(len(data)), Data: data, Seq: seq, PrevFuse: prev}
	c := &call{q: q, req: r, done: make(chan struct{})}
	r.Binding = c
	h.calls = append(h.calls, c)
	h.mu.Unlock()
	q.q.Execute(r)
	return c
}

// exec executes cmd and waits for its completion.
func (h *harness) exec(q *tq, cmd nvme.Command, data []byte) *call {
	h.tb.Helper()
	c := h.submit(q, cmd, data)
	c.wait(h.tb)
	return c
}

// execMayHold executes cmd and reports whether it completed before
// Execute returned; if not, its completion will be an event.
func (h *harness) execMayHold(q *tq, cmd nvme.Command, data []byte) (*call, bool) {
	c := h.submit(q, cmd, data)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.completed == 0 {
		c.async = true
		return c, false
	}
	return c, true
}

func (c *call) wait(tb testing.TB) {
	tb.Helper()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		tb.Fatalf("queue %s: CID %d not completed", c.q.name, c.req.Cmd.CID)
	}
}

func (c *call) status() nvme.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rsp.Status
}

func (c *call) dw0() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rsp.DW0
}

// fmtStatus prints a status as the wire doc writes them: "ok", or
// SCT/SC with the flags, e.g. "1/0x84+dnr".
func fmtStatus(s nvme.Status) string {
	if s == nvme.StatusSuccess {
		return "ok"
	}
	out := fmt.Sprintf("%d/%#02x", s.SCT(), s.SC())
	if s.More() {
		out += "+m"
	}
	if s.DNR() {
		out += "+dnr"
	}
	return out
}

// parseStatus reads fmtStatus's form back.
func parseStatus(s string) (nvme.Status, error) {
	if s == "ok" {
		return nvme.StatusSuccess, nil
	}
	var st nvme.Status
	main, flags, _ := strings.Cut(s, "+")
	var sct, sc uint8
	if _, err := fmt.Sscanf(main, "%d/0x%x", &sct, &sc); err != nil {
		return 0, fmt.Errorf("status %q: %v", s, err)
	}
	st = nvme.MakeStatus(sct, sc)
	for f := range strings.SplitSeq(flags, "+") {
		switch f {
		case "":
		case "dnr":
			st = st.WithDNR()
		case "m":
			st = st.WithMore()
		default:
			return 0, fmt.Errorf("status %q: flag %q", s, f)
		}
	}
	return st, nil
}

func fmtRsp(r nvme.Completion) string {
	s := "status=" + fmtStatus(r.Status)
	if r.DW0 != 0 {
		s += fmt.Sprintf(" dw0=%#x", r.DW0)
	}
	if r.DW1 != 0 {
		s += fmt.Sprintf(" dw1=%#x", r.DW1)
	}
	return s
}

// Command builders.

func fabricsCmd(fct nvme.FabricsType) nvme.Command {
	return nvme.Command{Opcode: nvme.OpcodeFabrics, Flags: nvme.FlagSGLMetaBuf, NSID: uint32(fct)}
}

func connectCmd(qid, sqsize uint16, kato uint32) nvme.Command {
	var c nvme.Command
	cc := nvme.ConnectCommand{Flags: nvme.FlagSGLMetaBuf, QID: qid, SQSize: sqsize, KATO: kato,
		DPTR: nvme.InCapsuleSGL(0, nvme.ConnectDataSize)}
	cc.Encode(&c)
	return c
}

func connectData(host, sub string, cntlid uint16, hostID [16]byte) []byte {
	d := nvme.ConnectData{HostID: hostID, CNTLID: cntlid}
	d.SubNQN, _ = nvme.MakeNQNField(sub)
	d.HostNQN, _ = nvme.MakeNQNField(host)
	var b [nvme.ConnectDataSize]byte
	d.Marshal(&b)
	return b[:]
}

func propGet(off uint32, size8 bool) nvme.Command {
	var c nvme.Command
	(&nvme.PropertyCommand{Flags: nvme.FlagSGLMetaBuf, Offset: off, Size8: size8}).Encode(&c)
	return c
}

func propSet(off uint32, v uint64) nvme.Command {
	var c nvme.Command
	(&nvme.PropertyCommand{Flags: nvme.FlagSGLMetaBuf, Set: true, Offset: off, Value: v}).Encode(&c)
	return c
}

func adminCmd(op nvme.AdminOpcode) nvme.Command {
	return nvme.Command{Opcode: uint8(op), Flags: nvme.FlagSGLMetaBuf}
}

func identifyCmd(cns uint8, nsid uint32) nvme.Command {
	c := adminCmd(nvme.AdminIdentify)
	(&nvme.IdentifyCommand{CNS: cns, NSID: nsid}).Encode(&c)
	return c
}

func getLogCmd(lid uint8, nsid uint32, n uint32, off uint64, rae bool) nvme.Command {
	c := adminCmd(nvme.AdminGetLogPage)
	(&nvme.GetLogPageCommand{LID: lid, NSID: nsid, NUMD: nvme.LogNUMD(n), LPO: off, RAE: rae}).Encode(&c)
	return c
}

func setFeatCmd(fid uint8, v uint32) nvme.Command {
	c := adminCmd(nvme.AdminSetFeatures)
	(&nvme.FeatureCommand{FID: fid, CDW11: v}).EncodeSet(&c)
	return c
}

func getFeatCmd(fid uint8, sel uint8) nvme.Command {
	c := adminCmd(nvme.AdminGetFeatures)
	(&nvme.FeatureCommand{FID: fid, SEL: sel}).EncodeGet(&c)
	return c
}

func ioCmd(op nvme.IOOpcode, nsid uint32, slba uint64, blocks uint32, flags uint32) nvme.Command {
	c := nvme.Command{Opcode: uint8(op), Flags: nvme.FlagSGLMetaBuf, NSID: nsid}
	c.SetRW(slba, blocks, flags)
	return c
}

// Well-known names of the tests.
const (
	hostA = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a"
	hostB = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b"
	subA  = "nqn.2026-01.io.blk:vol-a"
	subB  = "nqn.2026-01.io.blk:vol-b"
)

var hostIDA = [16]byte{0xa}

// ccEnable is the CC a Linux host writes to enable: IOSQES 6, IOCQES 4,
// CSS 0, EN.
const ccEnable = 0x00460001

// mustSubsystem adds a subsystem allowing any host with one memory
// namespace of blocks 4 KiB blocks.
func (h *harness) mustSubsystem(nqn string, blocks uint64) (*target.Subsystem, *target.MemBackend) {
	h.tb.Helper()
	s, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: nqn, AllowAnyHost: true})
	if err != nil {
		h.tb.Fatal(err)
	}
	if blocks == 0 {
		return s, nil
	}
	m, err := target.NewMemBackend(4096, blocks)
	if err != nil {
		h.tb.Fatal(err)
	}
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: m}); err != nil {
		h.tb.Fatal(err)
	}
	return s, m
}

// mustOK fails the test unless the call succeeded.
func mustOK(tb testing.TB, c *call, what string) {
	tb.Helper()
	if s := c.status(); s != nvme.StatusSuccess {
		tb.Fatalf("%s: status %s", what, fmtStatus(s))
	}
}

// adminConnect connects and enables an admin queue for host on sub and
// returns it with its CNTLID.
func (h *harness) adminConnect(name, host, sub string, kato uint32) (*tq, uint16) {
	h.tb.Helper()
	q := h.queue(name, target.QueueParams{QID: 0, SQSize: 31})
	c := h.exec(q, connectCmd(0, 31, kato), connectData(host, sub, 0xFFFF, hostIDA))
	mustOK(h.tb, c, "admin connect")
	mustOK(h.tb, h.exec(q, propSet(nvme.PropCC, ccEnable), nil), "enable")
	return q, uint16(c.dw0())
}

// ioConnect connects I/O queue qid of controller cntlid.
func (h *harness) ioConnect(name string, qid uint16, host, sub string, cntlid uint16) *tq {
	h.tb.Helper()
	q := h.queue(name, target.QueueParams{QID: qid, SQSize: 127})
	mustOK(h.tb, h.exec(q, connectCmd(qid, 127, 0), connectData(host, sub, cntlid, hostIDA)), "io connect")
	return q
}

// serve adds subA, open to any host, with ns as its namespace, and
// connects hostA: an admin queue and I/O queue 1.
func (h *harness) serve(ns target.NamespaceConfig) (sub *target.Subsystem, admin, io *tq, cntlid uint16) {
	h.tb.Helper()
	sub, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subA, AllowAnyHost: true})
	if err != nil {
		h.tb.Fatal(err)
	}
	if err := sub.AddNamespace(ns); err != nil {
		h.tb.Fatal(err)
	}
	admin, cntlid = h.adminConnect("admin", hostA, subA, 5000)
	io = h.ioConnect("io1", 1, hostA, subA, cntlid)
	return sub, admin, io, cntlid
}

// live sets up a subsystem with one namespace and a controller with one
// I/O queue.
func (h *harness) live(blocks uint64) (admin, io *tq, cntlid uint16, m *target.MemBackend) {
	h.tb.Helper()
	_, m = h.mustSubsystem(subA, blocks)
	admin, cntlid = h.adminConnect("admin", hostA, subA, 5000)
	io = h.ioConnect("io1", 1, hostA, subA, cntlid)
	return admin, io, cntlid, m
}
