package rdma

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/transport"
)

// coreState is one engine core's share of the port: a request per receive
// buffer of the core's SRQ (indexed by the buffer), the data buffer pools
// (small, mid, large: by increasing size) and the queue of commands
// waiting for a data buffer. Everything but the
// pools' put and the counters is touched only by the core's notification
// goroutine, so the request path takes no lock.
type coreState struct {
	p     *Port
	core  *transport.Core
	index int
	reqs  []req
	pools [3]*pool

	// wait is a FIFO ring of commands waiting for a data buffer (owned by
	// the notification goroutine). It holds at most every request of the
	// core: the SRQ's plus the admin queues' (QPsPerCore of them at most).
	wait      []*req
	whead, wn int
	// fwait holds the commands right after a fused first (PrevFuse
	// 01b) that wait for a buffer, looked at before wait and each in
	// turn (fused.go).
	fwait []*req

	// alignCapsule: in-capsule writes not on a page are copied into a
	// data buffer when one is free (alignData); set with the poller hook.
	alignCapsule bool
	// lastDisk is when poll last found work (the core's only): it keeps
	// polling a disk with I/Os in flight for diskSpin after it.
	lastDisk time.Time
	spin     time.Duration // diskSpin, unless the port's config says other
	// lastYield is when the spin last gave the processor up
	// (diskSpinYield).
	lastYield time.Time

	// group gathers the plain writes executed during one notification;
	// committed by HandleBatchEnd at its end. With the core's poll set it
	// is also the core's completion sink and holds its backends' disk
	// engines (see HandlePoll).
	group *target.Group

	st coreCounters
}

type coreCounters struct {
	commands, protocolErrors, inCapsule, reads, writes, waits atomic.Uint64
	capsuleCopies                                             atomic.Uint64
	// diskNow and diskPeak are the I/Os the core's pollers have at the
	// disk as of the core's last pass, and the most they had (written by
	// the core only).
	diskNow, diskPeak atomic.Uint64
}

func newCoreState(p *Port, c *transport.Core) (cs *coreState, err error) {
	cfg := p.engine.Config()
	cs = &coreState{p: p, core: c, index: c.Index(), reqs: make([]req, cfg.Buffers)}
	for i := range cs.reqs {
		cs.reqs[i].init(cs)
	}
	cs.wait = make([]*req, int(cfg.Buffers)+int(cfg.QPsPerCore)*AdminQueueEntries)
	cs.fwait = make([]*req, 0, len(cs.wait))
	cs.group = p.t.NewGroup(len(cs.wait))
	if c.Polling() && !p.cfg.syncDisk {
		// The group is the core's completion sink: an IO completed on
		// another goroutine (a store's worker) is queued on it and the
		// core woken, to be answered in HandlePoll. And backends keep
		// their disk engines (an io_uring) here: each eventfd joins the
		// core's poll set. Both or neither: IO.Poller hands out engines
		// only to a group whose completions come back to its goroutine.
		cs.group.SetWake(c.Wake)
		cs.group.SetPollerHook(c.AddPollFD)
		cs.alignCapsule = true
	}
	cs.spin = diskSpin
	if d := p.cfg.diskSpin; d != 0 {
		cs.spin = max(d, 0)
	}
	z := p.size
	for i, c := range [len(cs.pools)]struct{ n, size uint32 }{
		{z.SmallBuffers, smallBufferSize}, {z.MidBuffers, z.MidBufferSize}, {z.LargeBuffers, z.Limits.MaxTransfer},
	} {
		if cs.pools[i], err = newPool(p.engine.PD(), c.n, p.cfg.FusedReserve, c.size, z.ReadSink); err != nil {
			cs.close()
			return nil, err
		}
	}
	return cs, nil
}

// close frees the core's disk engines and buffers; the engine is closed
// (no handler call runs any more, so the group is the caller's) and every
// queue has drained. An engine's I/Os still at the disk (none, once the
// queues drained) are waited for before the data buffers they use go.
func (cs *coreState) close() error {
	var errs []error
	if cs.group != nil {
		cs.group.ClosePollers()
		cs.group.Reap()
	}
	for _, p := range cs.pools {
		if p != nil {
			errs = append(errs, p.close())
		}
	}
	return errors.Join(errs...)
}

// req is the binding's state of one command: the core's Request plus the
// receive buffer it arrived in, its data buffer and the remote buffer of
// its keyed SGL.
type req struct {
	target.Request
	cs    *coreState
	conn  *conn
	rb    *transport.RecvBuf // SRQ buffer; nil on an admin queue
	ownRQ bool               // buffer of an admin queue's private receive queue
	buf   []byte             // the receive buffer (capsule in, response out)
	// inl is where in-capsule data lands: the receive buffer past its
	// SQE, or, split (engine HeaderSize), the buffer's own payload
	// pages.
	inl   []byte
	sge   [1]transport.SGE // admin: the receive buffer's SGE
	data  *dataBuf
	raddr uint64
	rkey  uint32
	inval bool // SGL subtype 0xF: answer with Send with Invalidate of rkey
	tmp   [1]transport.SGE
}

func (r *req) init(cs *coreState) {
	r.cs = cs
	// Set once: storing the pointer in the interface now means nothing
	// is allocated per command.
	r.Binding = r
}

// handler is the port seen as the engine's completion handler.
type handler Port

// HandleCompletion implements transport.Handler. It runs on the core's
// notification goroutine.
func (h *handler) HandleCompletion(core *transport.Core, c *transport.Completion) {
	p := (*Port)(h)
	cs := p.cores[core.Index()]
	switch c.Type {
	case transport.OpReceive:
		var r *req
		if rb := core.RecvBuf(c); rb != nil {
			r = &cs.reqs[rb.Index()]
			r.rb = rb
			r.buf = rb.Bytes()
			if r.inl = rb.Payload(); r.inl == nil {
				r.inl = r.buf[capsuleSize:]
			}
		} else if ar, ok := c.RequestContext.(*req); ok {
			r = ar
		} else {
			return
		}
		cn, _ := c.QPContext.(*conn)
		r.conn = cn
		// Every Execute of this request runs on this goroutine (here,
		// from its RDMA READ's completion, or from runWaiters).
		r.Group = cs.group
		if c.Status != nil || cn == nil || cn.dead.Load() {
			r.recycle()
			return
		}
		cs.receive(r, c.Bytes)
	case transport.OpRead:
		r := c.RequestContext.(*req)
		if c.Status != nil || r.conn.dead.Load() {
			if c.Status != nil && !r.conn.dead.Load() {
				r.conn.fail(fmt.Errorf("RDMA READ of command %#x data: %w", r.Cmd.CID, c.Status))
			}
			r.recycle()
			break
		}
		if d := r.data; d.frmr != nil {
			// The data is in: the host's key to the sink dies before
			// the command runs. The response SEND comes after it in
			// send-queue order, so its completion says it has run.
			if err := r.conn.qp.(transport.FastRegisterQP).Invalidate(nil, d.frmr, transport.FlagSilentSuccess); err != nil {
				r.conn.fail(fmt.Errorf("post invalidate of a READ sink: %w", err))
				r.recycle()
				break
			}
		}
		r.execute()
	case transport.OpSend:
		if d, ok := c.RequestContext.(*dataBuf); ok && d != nil {
			if c.Status == nil {
				d.lent = false // the invalidate before this SEND has run
			}
			d.pool.release(d)
		}
		if c.Status != nil {
			if cn, _ := c.QPContext.(*conn); cn != nil && !cn.dead.Load() {
				cn.fail(fmt.Errorf("response send: %w", c.Status))
			}
		}
	case transport.OpWrite:
		// Writes are posted silent; only a failure completes.
		if cn, _ := c.QPContext.(*conn); cn != nil && c.Status != nil && !cn.dead.Load() {
			cn.fail(fmt.Errorf("RDMA WRITE of read data: %w", c.Status))
		}
	}
	if cs.wn+len(cs.fwait) > 0 {
		cs.runWaiters()
	}
}

// HandleBatchEnd implements transport.BatchHandler: the plain writes the
// notification executed are committed together, then answered.
func (h *handler) HandleBatchEnd(core *transport.Core) {
	(*Port)(h).cores[core.Index()].group.Commit()
}

// HandlePoll implements transport.PollHandler: the core's disk, served
// as a TCP poll group serves it (target/tcp's settle), serialized with
// HandleCompletion. The engine calls it after every CQ notification (so
// the I/Os the notification's commands queued reach the disk with one
// doorbell), when a disk engine's eventfd fires, and when a completion
// from another goroutine woke the core.
func (h *handler) HandlePoll(core *transport.Core) bool {
	return (*Port)(h).cores[core.Index()].poll()
}

// poll submits what the core's commands queued for the disk and reaps
// what completed, answers the IOs completed here or handed back by other
// goroutines, commits the writes that gathered meanwhile and starts
// commands a freed buffer lets run, until none of it has work; then arms
// the disk engines (true: one has work already, call again).
func (cs *coreState) poll() bool {
	g := cs.group
	for {
		worked := g.Poll() // the disk: submit, reap (IO.Done)
		n := uint64(g.InFlight())
		cs.st.diskNow.Store(n)
		if n > cs.st.diskPeak.Load() {
			cs.st.diskPeak.Store(n)
		}
		worked = g.Reap() || worked // answers
		if g.Pending() > 0 {
			g.Commit()
			worked = true
		}
		if cs.wn+len(cs.fwait) > 0 {
			cs.runWaiters()
		}
		if worked {
			cs.lastDisk = time.Now()
			continue
		}
		if g.InFlight() > 0 {
			now := time.Now()
			if now.Sub(cs.lastDisk) < cs.spin {
				if now.Sub(cs.lastYield) >= diskSpinYield {
					cs.lastYield = now
					yieldCPU()
				}
				return true // look again rather than sleep (see diskSpin)
			}
		}
		return g.Arm()
	}
}

// diskSpin is how long a core with I/Os at the disk keeps polling after
// its last work before it sleeps on its engines' eventfds: 200 µs, about
// a 4 KiB read on this class of disk, so that at low depth a completion
// is reaped as it lands rather than after a wake-up of the poll set's
// goroutine through the netpoller. Shorter than target/tcp's (1 ms): the
// core's goroutine also serves its CQ, whose provider may need the
// processor the spin holds. The spin runs inside HandlePoll's calls
// (true: call again), so CQ notifications arriving meanwhile are handled
// in between.
const diskSpin = 200 * time.Microsecond

// diskSpinYield is how often a spinning core gives its processor up to
// the kernel's scheduler (sched_yield): every 20 µs. An O_DIRECT write's
// completion is not posted from the disk's interrupt as a read's is: the
// kernel finishes it in another thread's context (a workqueue, or task
// work on the thread that submitted it), which must get a processor
// first. A core spinning without a break kept that thread off the
// processor until its spin ran out: measured on this 2-processor VM,
// ~18% of 4 KiB writes at QD1 waited the whole 200 µs spin (10 µs
// buckets of submit-to-reap time: 850 of 5400 between 200 and 230 µs),
// none with the yield. A yield with nothing else to run costs a system
// call (~1 µs), so the spin stays a spin.
const diskSpinYield = 20 * time.Microsecond

// receive starts a command that arrived in r's buffer (n bytes).
func (cs *coreState) receive(r *req, n uint32) {
	cs.st.commands.Add(1)
	if n < capsuleSize {
		r.conn.fail(fmt.Errorf("capsule of %d bytes, shorter than an SQE", n))
		r.recycle()
		return
	}
	r.Rsp = nvme.Completion{}
	r.Data, r.Len, r.data, r.inval = nil, 0, nil, false
	if err := r.Cmd.Unmarshal(r.buf[:capsuleSize]); err != nil {
		r.conn.fail(fmt.Errorf("bad SQE: %w", err))
		r.recycle()
		return
	}
	r.Dir = r.Cmd.DataDirection()
	// Fused commands are paired by arrival: receive completions come in
	// QP order, on this core only.
	r.Seq, r.PrevFuse = r.conn.seq, r.conn.prevFuse
	r.conn.firstRun.Mark(r.Seq, false)
	r.conn.seq++
	r.conn.prevFuse = r.Cmd.Fuse()
	sgl := r.Cmd.DPTR
	switch {
	case sgl.Keyed():
		if st := sgl.Subtype(); st != nvme.SGLSubtypeAddress && st != nvme.SGLSubtypeInvalidate {
			r.fail(nvme.StatusSGLInvalidType)
			return
		}
		r.inval = sgl.Subtype() == nvme.SGLSubtypeInvalidate
		r.raddr, r.rkey = sgl.Addr, sgl.Key
		if sgl.Length == 0 || r.Dir == nvme.DirNone {
			break
		}
		if r.Dir == nvme.DirBidirectional {
			r.fail(nvme.StatusInvalidField)
			return
		}
		if sgl.Length > cs.p.size.Limits.MaxTransfer {
			r.fail(nvme.StatusSGLInvalidDataLength)
			return
		}
		r.Len = sgl.Length
		if !cs.attach(r) {
			cs.st.waits.Add(1)
			cs.wait1(r)
			return
		}
		cs.start(r)
		return
	case sgl.ID == nvme.SGLIDInCapsule:
		if sgl.Length == 0 {
			break
		}
		if r.Dir != nvme.DirHostToCtrl {
			r.fail(nvme.StatusInvalidField)
			return
		}
		limit := uint64(cs.p.size.Limits.InCapsule)
		if r.conn.admin {
			limit = uint64(len(r.inl))
		}
		end := sgl.Addr + uint64(sgl.Length)
		if end < sgl.Addr || end > limit || capsuleSize+end > uint64(n) {
			r.fail(nvme.StatusSGLInvalidOffset)
			return
		}
		cs.st.inCapsule.Add(1)
		r.Len = sgl.Length
		r.Data = r.inl[sgl.Addr:end]
		if cs.alignCapsule && !r.conn.admin && !pageAligned(r.Data) {
			cs.alignData(r)
		}
	default:
		r.fail(nvme.StatusSGLInvalidType)
		return
	}
	r.execute()
}

// pageAligned reports whether b starts on a page: where O_DIRECT takes it.
func pageAligned(b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%pageSize == 0
}

// alignData moves an in-capsule write's data into a small data buffer
// when one is free. It runs only where the data is not on a page: the
// receive buffers are not split (splitHeader: an adapter with one SGE
// per receive, or in-capsule data that is not whole pages), or the host
// put the data at an offset into the capsule. There the data sits 64
// bytes (or the offset) into its
// receive buffer, an address O_DIRECT cannot take: a store would serve
// the write on its workers (a hand-off to another goroutine and a bounce
// copy there); from a data buffer (page-aligned pools) it goes to the
// disk from this core. One copy of at most a small buffer's 4 KiB,
// counted (Stats.CapsuleCopies); with no small buffer free the data stays
// in the capsule, never waiting for one. The buffer goes back as any
// command's, with the response's SEND completion.
func (cs *coreState) alignData(r *req) {
	p := cs.pools[0]
	if r.Len > p.size {
		return
	}
	if d := p.get(); d != nil {
		copy(d.data, r.Data)
		r.data = d
		r.Data = d.data[:r.Len]
		cs.st.capsuleCopies.Add(1)
	}
}

// attach gives r a data buffer of at least its length: from the smallest
// class that holds it and has one free, else from a larger class; or it
// reports there is none. An empty class (no mid buffers) never has one.
func (cs *coreState) attach(r *req) bool {
	reserve := r.conn.firstRun.MayReserve(&r.Request)
	if !reserve && r.conn.firstRun.SecondEarly(&r.Request) {
		return false // no buffer before its first runs (fused.go)
	}
	for _, p := range cs.pools {
		if r.Len > p.size {
			continue
		}
		d := p.get()
		if d == nil && reserve {
			d = p.getAny()
		}
		if d != nil {
			r.data = d
			r.Data = d.data[:r.Len]
			return true
		}
	}
	return false
}

// start moves a command with a data buffer on: host data is fetched by
// RDMA READ (Execute follows its completion), read data is produced now.
func (cs *coreState) start(r *req) {
	if r.Dir == nvme.DirHostToCtrl {
		cs.st.reads.Add(1)
		r.tmp[0] = r.data.sge
		r.tmp[0].Length = r.Len
		if d := r.data; d.frmr != nil {
			// ReadSinkPerRead: the sink is this READ's alone; the
			// fast-register runs before it (send-queue order).
			d.lent = true
			key, err := r.conn.qp.(transport.FastRegisterQP).FastRegister(nil, d.frmr, d.data[:r.Len],
				transport.AccessLocalWrite|transport.AccessRemoteWrite, transport.FlagSilentSuccess|transport.FlagDefer)
			if err != nil {
				r.conn.fail(fmt.Errorf("post fast-register of a READ sink: %w", err))
				r.recycle()
				return
			}
			r.tmp[0].LKey = key
		}
		if err := r.conn.qp.Read(r, r.tmp[:], r.raddr, r.rkey, 0); err != nil {
			r.conn.fail(fmt.Errorf("post RDMA READ: %w", err))
			r.recycle()
		}
		return
	}
	r.execute()
}

func (cs *coreState) push(r *req) {
	cs.wait[(cs.whead+cs.wn)%len(cs.wait)] = r
	cs.wn++
}

// runWaiters starts waiting commands, in order, while buffers last.
func (cs *coreState) runWaiters() {
	if len(cs.fwait) > 0 {
		cs.runFusedWaiters()
	}
	for cs.wn > 0 {
		r := cs.wait[cs.whead]
		if r.conn.dead.Load() {
			r.recycle()
		} else if !cs.attach(r) {
			return
		}
		cs.wait[cs.whead] = nil
		cs.whead = (cs.whead + 1) % len(cs.wait)
		cs.wn--
		if !r.conn.dead.Load() {
			cs.start(r)
		}
	}
}

// fail completes r with status (and DNR) without the core: the binding
// refused its data descriptor.
func (r *req) fail(status nvme.Status) {
	if c := r.conn; c != nil {
		if r.Seq+1 == c.seq {
			c.prevFuse = 0 // refused here: a second after it finds no first
		}
		if r.PrevFuse == nvme.FlagFuseFirst && c.q != nil {
			c.q.Refused(&r.Request) // the first before it has lost its second
		}
	}
	r.Rsp.Status = status | nvme.StatusDNR
	r.Dir = nvme.DirNone
	r.complete()
}

// complete sends r's data and response, then gives its receive buffer
// back. Any goroutine.
func (r *req) complete() {
	c := r.conn
	cs := r.cs
	var err error
	if r.Rsp.Status == nvme.StatusSuccess && r.Dir == nvme.DirCtrlToHost && r.Len > 0 && r.data != nil {
		cs.st.writes.Add(1)
		r.tmp[0] = r.data.sge
		r.tmp[0].Length = r.Len
		err = c.qp.Write(nil, r.tmp[:], r.raddr, r.rkey, transport.FlagSilentSuccess|transport.FlagDefer)
	}
	r.Rsp.SQID = c.qid
	r.Rsp.CID = r.Cmd.CID
	if c.q != nil && c.q.SQFlowControlDisabled() {
		r.Rsp.SQHead = 0xFFFF // the host turned SQ flow control off at Connect
	} else {
		r.Rsp.SQHead = uint16((c.sqhd.Add(1)) % c.entries)
	}
	r.Rsp.Marshal((*[nvme.CQESize]byte)(r.buf[:nvme.CQESize]))
	if r.rb != nil {
		r.tmp[0] = r.rb.SGE(nvme.CQESize)
	} else {
		r.tmp[0] = r.sge[0]
		r.tmp[0].Length = nvme.CQESize
	}
	// The response is inline: copied at post, so the receive buffer it
	// was built in can be reposted right after. The SEND's completion
	// gives the data buffer back (the RDMA WRITE before it has then been
	// sent too); without a data buffer it is silent.
	flags := transport.FlagInline
	var ctx any
	if r.data != nil {
		ctx = r.data
	} else {
		flags |= transport.FlagSilentSuccess
	}
	if err == nil {
		if r.inval {
			err = c.qp.SendInvalidate(ctx, r.tmp[:], r.rkey, flags)
		} else {
			err = c.qp.Send(ctx, r.tmp[:], flags)
		}
	}
	if err != nil {
		if r.data != nil {
			r.data.pool.release(r.data)
		}
		if !c.dead.Load() {
			c.fail(fmt.Errorf("post response: %w", err))
		}
	}
	r.data = nil
	r.repost()
}

// recycle gives back everything r holds without answering.
func (r *req) recycle() {
	if r.data != nil {
		r.data.pool.release(r.data)
		r.data = nil
	}
	r.repost()
}

// repost gives the receive buffer back: to the core's SRQ, or to the
// admin queue's private receive queue (which fails once the QP is gone;
// the buffer is then simply dropped with the connection).
func (r *req) repost() {
	if r.rb != nil {
		rb := r.rb
		r.rb = nil
		rb.Repost()
		return
	}
	if r.ownRQ && r.conn != nil && !r.conn.dead.Load() {
		r.conn.qp.PostReceive(r, r.sge[:])
	}
}
