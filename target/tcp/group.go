//go:build linux

package tcp

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/internal/epoll"
	"github.com/blk-project/blk/internal/lfstack"
	"github.com/blk-project/blk/target"
)

// A poll group is one core's share of the port (transport/soft's
// poll_linux.go is its sibling; both run on internal/epoll): a goroutine
// (locked to an OS thread with Config.LockThreads, and pinned with
// Config.PinCores) that owns an epoll set, the sockets of its
// connections (registered edge-triggered), their requests, its data
// buffer pools and its target.Group. Each pass it
//
//   - reads every connection with input, non-blocking, and parses whole
//     PDUs (conn.pump), executing commands on this goroutine;
//   - handles completions: a backend's IOs completed from another
//     goroutine (the target.Group is the group's completion sink and
//     kicks its loop; Reap answers them here), and answers handed over
//     by any goroutine through the lock-free done stack; commits its
//     write group, starts commands that waited for a buffer;
//   - writes each connection's queued PDUs with one writev; a socket that
//     takes less waits for EPOLLOUT.
//
// Other goroutines hand it work through lock-free stacks (new
// connections, completions, disconnects) and a Kick of its epoll.Loop,
// which writes the loop's eventfd once when it sleeps. It sleeps by
// parking on its epoll fd in Go's netpoller (internal/epoll).
type group struct {
	p    *Port
	idx  int
	loop epoll.Loop // the epoll set, its wake-up and its timer

	// Handed over by other goroutines.
	adoptq   lfstack.Stack[conn] // linked by conn.anext
	ctlq     lfstack.Stack[conn] // linked by conn.cnext (Disconnect)
	done     lfstack.Stack[req]  // linked by req.dnext (Complete)
	stop     atomic.Bool
	exitedCh chan struct{}
	conns    atomic.Int32 // connections owned (for placement)
	tid      atomic.Int32 // the group's OS thread if locked (benchmarks read its CPU time), else 0

	// Owned by the group's goroutine.
	slots            epoll.Slots[conn] // connections by the slot their events carry
	ready, readyAlt  []*conn           // connections with input to read
	flushq, flushAlt []*conn           // connections with output to write
	timed            []*conn           // connections with a deadline (conn.timed)
	small, large     *pool
	capsule          *pool // in-capsule data only (see attachCapsule)
	waiting          reqFIFO
	waitingCapsule   reqFIFO
	// waitingFused and waitingCapsuleFused hold the commands right after
	// a fused first (PrevFuse 01b) that wait for a buffer: looked at
	// before the others, each in turn, as the reserve may serve them
	// (fused.go).
	waitingFused, waitingCapsuleFused reqFIFO
	freed                             bool // a data buffer was given back since runWaiters looked
	passWorked                        bool // settle handled completions this pass (PollSpin)
	tg                                *target.Group
	iov                               [maxIOV]syscall.Iovec
	iovN                              int

	st groupCounters
}

const (
	// maxIOV is the iovecs of one writev: 256 (IOV_MAX is 1024), 64
	// responses of a read with data digest; more wait for the next call.
	maxIOV = 256
	// groupPending bounds the writes one pass gathers for a commit
	// (target.Group); more are committed alone.
	groupPending = 1024
	// settleRounds bounds the rounds of completions, commits, buffer
	// waiters and writes in one pass before the group looks at its
	// sockets again.
	settleRounds = 4
)

type groupCounters struct {
	commands, inCapsule, r2ts, h2c, c2h, resps, successFlags atomic.Uint64
	hdgstErrs, ddgstErrs, terms, hostTerms, dataWaits        atomic.Uint64
	bytesIn, bytesOut, copies, copiedBytes, reads, writes    atomic.Uint64
	passes, connectTimeouts, spins                           atomic.Uint64
	states                                                   [numReqStates]atomic.Uint64
}

func newGroup(p *Port, idx int) (*group, error) {
	g := &group{p: p, idx: idx, exitedCh: make(chan struct{})}
	if err := g.loop.Init("tcp-poll-group", g.handedOver); err != nil {
		return nil, err
	}
	g.small = newPool(p.cfg.SmallBuffers, p.cfg.FusedReserve, smallBufferSize)
	g.large = newPool(p.cfg.LargeBuffers, p.cfg.FusedReserve, p.cfg.MaxTransfer)
	g.capsule = newPool(p.cfg.CapsuleBuffers, p.cfg.FusedReserve, p.maxCapsuleData)
	g.tg = p.t.NewGroup(groupPending)
	// The group is its goroutine's completion sink: an asynchronous
	// backend's completions come back here (settle reaps them).
	g.tg.SetWake(g.kick)
	// Backends' disk engines (an io_uring per group) are reaped here:
	// their eventfds wake the loop, settle polls them.
	g.tg.SetPollerHook(g.addPoller)
	return g, nil
}

// handedOver reports work handed over to the group, or a stop: the
// loop's last look before it sleeps (epoll.Loop.Init). It arms the
// backends' engines (target.Group.Arm): their next completion wakes the
// loop.
func (g *group) handedOver() bool {
	return !g.done.Empty() || g.tg.HasCompletions() || !g.adoptq.Empty() || !g.ctlq.Empty() || g.stop.Load() ||
		g.tg.Arm()
}

// diskSpin is how long a group with I/Os at the disk keeps polling after
// its last work before it sleeps: 1 ms, past a 4 KiB read at queue depth
// 32 on this class of disk (~300 µs) and a 128 KiB one at 8 (~750 µs),
// so completions are reaped as they land rather than after a wake-up.
const diskSpin = time.Millisecond

// pollerSlot is the epoll slot of a backend engine's eventfd: past every
// connection's, so the event names no connection (slots.Get is nil); it
// only wakes the loop, whose settle polls the engines.
const pollerSlot = 1<<31 - 1

// addPoller registers a backend engine's eventfd, level-triggered: it
// stays readable until the engine's Arm drains it.
func (g *group) addPoller(fd int) error { return g.loop.Add(fd, unix.EPOLLIN, pollerSlot, 0) }

// kick makes the loop look again (epoll.Loop.Kick).
func (g *group) kick() { g.loop.Kick() }

// adopt hands a new connection to the group; any goroutine.
func (g *group) adopt(c *conn) {
	g.adoptq.Push(c, &c.anext)
	g.kick()
}

// pushCtl asks the group to disconnect c; any goroutine, once per conn.
func (g *group) pushCtl(c *conn) {
	g.ctlq.Push(c, &c.cnext)
	g.kick()
}

// pushDone hands a completed request back; any goroutine, no lock, no
// allocation.
func (g *group) pushDone(r *req) {
	g.done.Push(r, &r.dnext)
	g.kick()
}

// run is the group's goroutine.
func (g *group) run(started chan<- struct{}) {
	defer close(g.exitedCh)
	if g.p.cfg.LockThreads || g.p.cfg.PinCores {
		runtime.LockOSThread()
		g.tid.Store(int32(unix.Gettid()))
	}
	if g.p.cfg.PinCores {
		pinThread(g.idx % runtime.NumCPU())
	}
	close(started)
	block := false // first pass: look at once
	spin := g.p.cfg.PollSpin
	var lastWork time.Time
	for {
		evs := g.loop.Wait(block)
		g.st.passes.Add(1)
		for i := range evs {
			if g.event(&evs[i]) {
				g.passWorked = true
			}
		}
		g.takeAdopt()
		g.takeCtl()
		g.readPass()
		for round := 0; round < settleRounds; round++ {
			g.settle()
			if !g.flushPass() {
				break
			}
		}
		if len(g.timed) > 0 {
			g.checkDeadlines()
		}
		if g.stop.Load() && g.conns.Load() == 0 && g.adoptq.Empty() {
			g.tg.ClosePollers()
			g.loop.End() // the group takes no Holds: it always ends
			return
		}
		// Sleep unless this pass left work of its own: input not yet
		// read, output not yet written, completions, or waiting commands
		// a freed buffer can start.
		block = !(len(g.ready) > 0 || len(g.flushq) > 0 || !g.done.Empty() || g.tg.HasCompletions() ||
			g.freed && g.waiters() > 0)
		// Spin (look without sleeping) for PollSpin after the last
		// work: a wake from sleep costs more than a few empty looks.
		if spin > 0 {
			now := time.Now()
			if g.passWorked {
				lastWork = now
			}
			if idle := now.Sub(lastWork); block && (idle < spin || idle < diskSpin && g.tg.InFlight() > 0) {
				block = false
				g.st.spins.Add(1)
			}
		}
		g.passWorked = false
	}
}

// event takes one epoll event of a connection's socket; false if it was
// not a connection's (a disk engine's eventfd, which only wakes the loop:
// it stays readable until the engine is armed, so it is no sign of work).
func (g *group) event(ev *unix.EpollEvent) bool {
	c := g.slots.Get(ev)
	if c == nil {
		return false
	}
	if ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.readable = true
		g.markReady(c)
	}
	if ev.Events&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.writable = true
		if c.tx.n > 0 {
			g.markFlush(c)
		}
	}
	return true
}

// takeAdopt registers the connections handed over since the last pass.
func (g *group) takeAdopt() {
	for c := g.adoptq.TakeAll(); c != nil; {
		next := c.anext
		c.anext = nil
		g.register(c)
		c = next
	}
}

// register adds c's socket to the epoll set, edge-triggered: the group
// keeps c.readable and c.writable itself.
func (g *group) register(c *conn) {
	slot, gen := g.slots.Put(c)
	c.pslot = slot
	var cerr error
	err := c.rc.Control(func(fd uintptr) {
		cerr = g.loop.Add(int(fd), unix.EPOLLIN|unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLET, slot, gen)
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		g.p.logPortError("register", c.remote, err)
		c.closeSocket(err)
		return
	}
	c.readable, c.writable = true, true
	c.registered.Store(true)
	g.markReady(c)
	if g.stop.Load() || g.p.isClosing() {
		c.closeStart(false, errPortClosed)
		return
	}
	g.setDeadline(c, time.Now().Add(g.p.cfg.ConnectTimeout))
}

// unregister takes c's socket out of the epoll set (before it is closed).
func (g *group) unregister(c *conn) {
	if c.pslot < 0 {
		return
	}
	c.rc.Control(func(fd uintptr) { g.loop.Del(int(fd)) })
	g.slots.Free(c.pslot)
	c.pslot = -1
}

// takeCtl disconnects the connections the core (or Port.Close) asked to.
func (g *group) takeCtl() {
	for c := g.ctlq.TakeAll(); c != nil; {
		next := c.cnext
		c.cnext = nil
		if c.pslot >= 0 || c.state != connClosed {
			c.closeStart(true, *c.discReason.Load())
		}
		c = next
	}
}

func (g *group) markReady(c *conn) {
	if !c.inReady {
		c.inReady = true
		g.ready = append(g.ready, c)
	}
}

func (g *group) markFlush(c *conn) {
	if !c.inFlush {
		c.inFlush = true
		g.flushq = append(g.flushq, c)
	}
}

// readPass reads every connection with input once (up to its budget).
func (g *group) readPass() {
	cur := g.ready
	g.ready = g.readyAlt[:0]
	for i, c := range cur {
		cur[i] = nil
		c.inReady = false
		c.pump()
		if c.readable && c.canRead() {
			g.markReady(c)
		}
	}
	g.readyAlt = cur[:0]
}

// settle handles completions (the backends' IOs, then the core's
// answers), commits the write group and starts commands that waited for
// a buffer, until none of them has work.
func (g *group) settle() {
	for {
		worked := g.tg.Poll()          // the disk: submit, reap (IO.Done)
		worked = g.tg.Reap() || worked // answers land on the done stack
		worked = g.drainDone() || worked
		if g.tg.Pending() > 0 {
			g.tg.Commit() // its completions land on the done stack
			worked = g.drainDone() || worked
		}
		if g.freed && g.waiters() > 0 {
			worked = g.runWaiters() || worked
		}
		g.freed = false
		if !worked {
			return
		}
		g.passWorked = true
	}
}

// flushPass writes every connection with output; it reports whether a
// write freed a data buffer a waiting command can use.
func (g *group) flushPass() bool {
	cur := g.flushq
	g.flushq = g.flushAlt[:0]
	for i, c := range cur {
		cur[i] = nil
		c.inFlush = false
		if c.writable && c.tx.n > 0 && c.state != connClosed {
			c.flush()
		}
	}
	g.flushAlt = cur[:0]
	return g.freed && g.waiters() > 0 || !g.done.Empty() || g.tg.HasCompletions()
}

// drainDone handles the requests completed since the last look, in the
// order they completed.
func (g *group) drainDone() bool {
	top := g.done.TakeAll()
	if top == nil {
		return false
	}
	var rev *req
	for r := top; r != nil; {
		next := r.dnext
		r.dnext = rev
		rev = r
		r = next
	}
	for r := rev; r != nil; {
		next := r.dnext
		r.dnext = nil
		r.c.completed(r)
		r = next
	}
	return true
}

// attach gives r a data buffer of at least r.Len bytes: a small one if it
// fits and one is free, else a large one; or reports there is none.
func (g *group) attach(r *req) bool {
	var b *dataBuf
	reserve := r.c.firstRun.MayReserve(&r.Request)
	if !reserve && r.c.firstRun.SecondEarly(&r.Request) {
		return false // no buffer before its first runs (fused.go)
	}
	if r.Len <= g.small.size {
		b = g.small.get()
		if b == nil && reserve {
			b = g.small.getAny()
		}
	}
	if b == nil && r.Len <= g.large.size {
		b = g.large.get()
		if b == nil && reserve {
			b = g.large.getAny()
		}
	}
	if b == nil {
		return false
	}
	r.buf = b
	r.Data = b.data[:r.Len]
	return true
}

// attachCapsule gives r a buffer for its in-capsule data, from the
// pool only in-capsule data uses. A command waiting for it holds its
// connection's input back; were it to wait for buffers that commands
// awaiting H2CData hold, whose data is behind it on that input, neither
// would ever move. In-capsule buffers are held only by commands that run
// without more input, so the wait always ends.
func (g *group) attachCapsule(r *req) bool {
	b := g.capsule.get()
	if b == nil && r.c.firstRun.MayReserve(&r.Request) {
		b = g.capsule.getAny()
	}
	if b == nil {
		return false
	}
	r.buf = b
	r.Data = b.data[:r.Len]
	return true
}

// unwait takes c's commands out of both buffer FIFOs and reclaims them.
func (g *group) unwait(c *conn) {
	each := func(r *req) {
		g.release(r)
		c.reclaim(r)
	}
	g.waiting.removeConn(c, each)
	g.waitingCapsule.removeConn(c, each)
	g.waitingFused.removeConn(c, each)
	g.waitingCapsuleFused.removeConn(c, each)
}

// release gives r's data buffer back.
func (g *group) release(r *req) {
	if r.buf != nil {
		r.buf.pool.put(r.buf)
		r.buf = nil
		g.freed = true
	}
	r.Data = nil
}

// runWaiters starts waiting commands, in order, while buffers last: the
// data buffer FIFO and the in-capsule one, each on its own pools.
func (g *group) runWaiters() bool {
	worked := g.runFusedWaiters()
	for g.waiting.head != nil && g.attach(g.waiting.head) {
		worked = true
		r := g.waiting.pop()
		r.c.gotBuffer(r)
	}
	for g.waitingCapsule.head != nil && g.attachCapsule(g.waitingCapsule.head) {
		worked = true
		r := g.waitingCapsule.pop()
		r.c.gotBuffer(r)
	}
	return worked
}

// setDeadline gives c a deadline (checkDeadlines says what happens at it)
// and sets the timer.
func (g *group) setDeadline(c *conn, d time.Time) {
	c.deadline = d
	if !c.timed {
		c.timed = true
		g.timed = append(g.timed, c)
	}
	g.checkDeadlines()
}

// checkDeadlines acts on the connections whose deadline passed and sets
// the timer for the next. An establishing connection — no ICReq, or no
// command after its ICResp — is closed at its connect deadline (once its
// first capsule made the core's queue, the core's own connect timeout
// takes over); a closing one is closed at its linger deadline.
func (g *group) checkDeadlines() {
	now := time.Now()
	var next time.Duration
	k := 0
	for _, c := range g.timed {
		establishing := c.state < connClosing
		if c.state == connClosed || establishing && c.q != nil {
			c.timed = false
			continue
		}
		if d := c.deadline.Sub(now); d <= 0 {
			c.timed = false
			if !establishing {
				c.closeSocket(errCloseTimeout)
				continue
			}
			g.st.connectTimeouts.Add(1)
			what := "no ICReq"
			if c.state == connLive {
				what = "no command after the ICResp"
			}
			c.closeSocket(fmt.Errorf("%w: %s within %v", errConnectTimeout, what, g.p.cfg.ConnectTimeout))
			continue
		} else if next == 0 || d < next {
			next = d
		}
		g.timed[k] = c
		k++
	}
	clear(g.timed[k:])
	g.timed = g.timed[:k]
	if next > 0 {
		g.loop.SetTimer(next)
	}
}

// pinThread restricts the calling (locked) thread to cpu.
func pinThread(cpu int) bool {
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(0, &set) == nil
}
