//go:build linux

package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/internal/epoll"
	"github.com/blk-project/blk/internal/lfstack"
	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft/wire"
)

// Poll-group mode (Config.PollGroup): each CQ's goroutine, locked to its
// OS thread (and pinned when the CQ has an affinity), owns an epoll set and
// does the socket I/O of every QP whose receive CQ it is. A completion is
// read, placed, notified, handled and answered on that one thread:
//
//   - receive: the QP's socket is read non-blocking into its receive
//     buffer; every whole FPDU in the buffer is then placed by the same
//     code as the receiver goroutine's (receiveFPDU), which never needs to
//     read more since the FPDU is all there;
//   - notify: the CQ's moderation decision (cq.decide), then the callback;
//   - send: a QP with send work (a post, a peer's read request, a read
//     beyond ORD that may now start, a state change) is put once on the
//     group's dirty stack (lock-free, one entry per QP at most, so bounded
//     by the group's QPs); after the notifications the group builds
//     batches with the sender's code (emit, serveRead) and writes them
//     with a non-blocking writev. A partial write keeps the rest of the
//     batch and its completions, and waits for EPOLLOUT: sends complete
//     once their bytes are handed to TCP, as in the goroutine mode.
//
// A post from another thread wakes a sleeping group with one eventfd
// write (coalesced: only the poster that finds the group asleep writes).
// Moderation intervals and FirstFPDUDelay use a timerfd (microsecond
// grain, M4). The group sleeps by parking on its epoll fd in Go's
// netpoller. The epoll set, the eventfd, the timerfd and that wake
// protocol are an internal/epoll.Loop, shared with target/tcp's poll
// groups. With Config.PollSpin, a group that just found work first
// keeps polling (epoll_wait with timeout 0) for an adaptive window of
// pollSpinMin to PollSpin, so that queue-depth-1 traffic need not pay a
// wake-up per message; an idle group sleeps.
//
// Error paths (Terminates, flush on failure) keep the goroutine mode's
// semantics; the drain after an orderly Disconnect runs on a goroutine of
// its own once the group has let go of the QP.

const (
	// rxPollBufSize: the group reads only whole FPDUs into the parser, so
	// the buffer must hold the largest (wire.FPDULen(MaxULPDU), 64 KiB and
	// 9 bytes) after the bytes of the one before; 128 KiB leaves room for
	// bulk reads of small FPDUs behind a partial one.
	rxPollBufSize = 128 << 10
	// pollReadBudget: reads of one QP per wake-up before the group turns
	// to the others (level-triggered epoll reports the rest next time).
	pollReadBudget = 4
	// pollSpinMin is the shortest busy-poll window; the window doubles
	// (up to Config.PollSpin) when the group slept less than that and
	// found work, and halves when it expired idle.
	pollSpinMin = 2 * time.Microsecond
	// pollYieldPinned: a pinned group that has been busy this long yields
	// its processor once (see runPoll).
	pollYieldPinned = 100 * time.Microsecond
)

type pollGroup struct {
	c *cq
	// loop is the group's epoll set and its wake-up: the group sleeps by
	// parking on it in Go's netpoller, so that its processor goes to
	// other goroutines at once. A QP started on the group holds the loop
	// (epoll.Loop.Hold) until it is let go of (retire): the group ends
	// only when its CQ is closed and no QP holds it.
	loop epoll.Loop

	// dirty is a lock-free stack of QPs (linked by qp.pollNext) with work
	// for the group; qp.pollQueued keeps each QP on it at most once.
	dirty lfstack.Stack[qp]

	// Owned by the group's thread.
	slots   epoll.Slots[qp] // QPs by the slot their events carry
	work    []*qp           // QPs taken off dirty, to send for
	delayed []*qp           // QPs waiting out FirstFPDUDelay
	spin    time.Duration   // the busy-poll window, adapted
	spinMax time.Duration   // Config.PollSpin
	yieldAt time.Time       // a pinned group's last sleep or yield

	// full counts writes that found the socket full (then EPOLLOUT); the
	// loop counts wakes and sleeps.
	full atomic.Uint64
}

func newPollGroup(c *cq) (*pollGroup, error) {
	g := &pollGroup{c: c, spin: pollSpinMin, spinMax: c.a.cfg.PollSpin}
	if err := g.loop.Init("soft-poll-group", g.hasDirty); err != nil {
		return nil, fmt.Errorf("soft: poll group %v: %w", err, transport.ErrInsufficientResources)
	}
	return g, nil
}

// hasDirty reports QPs with work for the group: the loop's last look
// before it sleeps (epoll.Loop.Init).
func (g *pollGroup) hasDirty() bool { return !g.dirty.Empty() }

// kick makes the loop look again (epoll.Loop.Kick).
func (g *pollGroup) kick() { g.loop.Kick() }

// mark puts q on the dirty stack (once) and wakes the loop. Safe from any
// goroutine, without a lock or an allocation.
func (g *pollGroup) mark(q *qp) {
	if q.pollQueued.CompareAndSwap(false, true) {
		g.dirty.Push(q, &q.pollNext)
	}
	g.kick()
}

// adopt hands a connected QP to the group; false when the group has ended
// (its CQ was closed and its last QP let go).
func (g *pollGroup) adopt(q *qp) bool {
	if !g.loop.Hold() {
		return false
	}
	g.mark(q)
	return true
}

// takeDirty moves the dirty stack to g.work, registering new QPs.
func (g *pollGroup) takeDirty() {
	for q := g.dirty.TakeAll(); q != nil; {
		next := q.pollNext
		q.pollNext = nil
		q.pollQueued.Store(false)
		if !q.pollRetired {
			if q.pollSlot < 0 {
				g.register(q)
			}
			if !q.pollRetired {
				g.work = append(g.work, q)
			}
		}
		q = next
	}
}

// register adds q's socket to the epoll set.
func (g *pollGroup) register(q *qp) {
	slot, gen := g.slots.Put(q)
	q.pollSlot = slot
	if q.delay > 0 {
		q.txAt = time.Now().Add(q.delay)
		q.txDelayed = true
	}
	if q.state.Load() != stateConnected {
		g.retire(q)
		return
	}
	var cerr error
	err := q.rx.rc.Control(func(fd uintptr) { cerr = g.loop.Add(int(fd), unix.EPOLLIN|unix.EPOLLRDHUP, slot, gen) })
	if err == nil {
		err = cerr
	}
	if err != nil {
		if q.Err() == nil {
			q.fail(errConnection(err))
		}
		g.retire(q)
	}
}

// setOut turns EPOLLOUT interest on or off for q.
func (g *pollGroup) setOut(q *qp, on bool) {
	if q.pollOut == on {
		return
	}
	q.pollOut = on
	if on {
		g.full.Add(1)
	}
	g.setEvents(q)
}

// setEvents sets q's epoll interest: input unless its next message waits
// for a receive (pollRecvWait; the socket's data stays in the kernel and
// TCP holds the peer back), output while a write waits for room.
func (g *pollGroup) setEvents(q *qp) {
	if q.pollRetired || q.pollSlot < 0 {
		return
	}
	var events uint32
	if !q.pollRecvWait {
		events = unix.EPOLLIN | unix.EPOLLRDHUP
	}
	if q.pollOut {
		events |= unix.EPOLLOUT
	}
	slot, gen := q.pollSlot, g.slots.Gen(q.pollSlot)
	q.rx.rc.Control(func(fd uintptr) { g.loop.Mod(int(fd), events, slot, gen) })
}

// retire lets go of a failed QP: out of the epoll set, its send state
// flushed as the sender goroutine flushes it, its current receive flushed
// as the receiver does; the drain after an orderly Disconnect and the
// close of the socket go to a goroutine of their own.
func (g *pollGroup) retire(q *qp) {
	if q.pollRetired {
		return
	}
	q.pollRetired = true
	if g.slots.Holds(q.pollSlot, q) {
		// Control fails once the socket is closed, and the kernel has
		// then dropped it from the set already.
		q.rx.rc.Control(func(fd uintptr) { g.loop.Del(int(fd)) })
		g.slots.Free(q.pollSlot)
	}
	q.txAbort()
	q.flushSQ()
	q.flushCurrent()
	g.loop.Release()
	go func() {
		defer q.conn.Close()
		q.drainAfterDisconnect()
	}()
}

// runPoll is the CQ's goroutine in poll-group mode.
func (c *cq) runPoll(started chan<- struct{}) {
	g := c.group
	c.pinned.Store(pinThread(c.cpu))
	close(started)
	var applied uint64
	stopped := false
	spinUntil := time.Time{}
	block := false // first pass: look at once
	var sleptAt time.Time
	for {
		slept := block
		evs := g.loop.Wait(block)
		worked := false
		for i := range evs {
			ev := &evs[i]
			q := g.slots.Get(ev)
			if q == nil {
				continue
			}
			worked = true
			if ev.Events&unix.EPOLLOUT != 0 {
				g.mark(q)
			}
			if ev.Events&^uint32(unix.EPOLLOUT) != 0 {
				if q.pollRecvWait && ev.Events&(unix.EPOLLHUP|unix.EPOLLERR) != 0 {
					// Reported whatever the interest: the connection
					// ended while a message waited for a receive.
					if q.Err() == nil {
						q.fail(errConnection(io.ErrUnexpectedEOF))
					}
					g.retire(q)
					continue
				}
				g.readQP(q)
			}
		}
		if len(g.delayed) > 0 {
			g.startDelayed()
		}
		g.takeDirty()
		// Notifications; the callback's posts land on the dirty stack.
		var modWait time.Duration
		if !stopped {
			select {
			case <-c.stop:
				stopped = true
				if c.notify != nil {
					c.notify(c.nctx, transport.ErrClosed)
				}
			default:
				var fire bool
				var status error
				fire, status, modWait = c.decide(&applied)
				if fire {
					worked = true
					c.fire(status)
				}
			}
		}
		g.takeDirty()
		for i, q := range g.work {
			if q.pollRecvWait && !q.pollRetired && q.recvPosted.Swap(false) {
				g.resume(q)
			}
			g.sendQP(q)
			g.work[i] = nil
			worked = true
		}
		g.work = g.work[:0]
		// End only when no QP holds the loop, under the loop's lock: an
		// adopt racing this either holds it first or finds it ended.
		if stopped && g.loop.Holds() == 0 && g.dirty.Empty() && g.loop.End() {
			return
		}
		// What next: look again at once while the spin window is open,
		// else sleep until an event or a timer (Wait looks once more, and
		// does not sleep if work was handed over meanwhile).
		now := time.Now()
		if worked {
			// A busy group never blocks, so other goroutines of its
			// processor (an SRQ's refill notification, a consumer woken by
			// the callback) would wait for the runtime's preemption, 10 ms:
			// long enough to run an SRQ dry. Unpinned, yield after every
			// busy pass (cheap when nothing waits); pinned, where a yield
			// is two thread hand-offs, at most every pollYieldPinned.
			if !g.c.pinned.Load() {
				runtime.Gosched()
			} else if now.Sub(g.yieldAt) > pollYieldPinned {
				g.yieldAt = now
				runtime.Gosched()
			}
		}
		if worked && g.spinMax > 0 {
			if slept && now.Sub(sleptAt) < g.spinMax && g.spin < g.spinMax {
				g.spin *= 2 // the sleep was short: a longer window would have caught it
			}
			spinUntil = now.Add(min(g.spin, g.spinMax))
		}
		if now.Before(spinUntil) {
			if !worked && !g.c.pinned.Load() {
				runtime.Gosched() // let the goroutines of this processor run
			}
			block = false
			continue
		}
		if !spinUntil.IsZero() {
			spinUntil = time.Time{}
			if !worked && g.spin > pollSpinMin {
				g.spin /= 2 // the window expired idle
			}
		}
		block = true
		sleptAt = now
		g.yieldAt = now
		wait := modWait
		if d := g.delayWait(now); d > 0 && (wait == 0 || d < wait) {
			wait = d
		}
		if wait > 0 {
			g.loop.SetTimer(wait)
		}
	}
}

// delayWait is how long until the first delayed QP may send (0: none).
func (g *pollGroup) delayWait(now time.Time) time.Duration {
	var wait time.Duration
	for _, q := range g.delayed {
		d := q.txAt.Sub(now)
		if d <= 0 {
			d = time.Microsecond
		}
		if wait == 0 || d < wait {
			wait = d
		}
	}
	return wait
}

// startDelayed marks the QPs whose FirstFPDUDelay is over.
func (g *pollGroup) startDelayed() {
	now := time.Now()
	k := 0
	for _, q := range g.delayed {
		if q.pollRetired {
			q.pollDelayed = false
			continue
		}
		if !now.Before(q.txAt) {
			q.txDelayed, q.pollDelayed = false, false
			g.mark(q)
			continue
		}
		g.delayed[k] = q
		k++
	}
	clear(g.delayed[k:])
	g.delayed = g.delayed[:k]
}

// placeWhole places every whole FPDU in q's receive buffer; false when
// the QP was let go of or its next message waits for a receive (its
// socket is then not read until the SRQ's next post: resume).
func (g *pollGroup) placeWhole(q *qp) bool {
	r := &q.rx
	for r.whole() {
		if err := q.receiveFPDU(); err != nil {
			if err == errWaitRecv {
				q.pollRecvWait = true
				g.setEvents(q)
				if q.recvPosted.Swap(false) { // posted since it parked
					return g.resume(q)
				}
				return false
			}
			if q.Err() == nil {
				q.fail(errConnection(err))
			}
			g.retire(q)
			return false
		}
		if q.state.Load() != stateConnected {
			g.retire(q)
			return false
		}
	}
	return true
}

// resume places what waited for a receive and reads the socket again.
func (g *pollGroup) resume(q *qp) bool {
	q.pollRecvWait = false
	g.setEvents(q)
	return g.placeWhole(q)
}

// readQP reads what q's socket has and places every whole FPDU.
func (g *pollGroup) readQP(q *qp) {
	r := &q.rx
	if q.pollRecvWait || q.pollRetired {
		return
	}
	for i := 0; i < pollReadBudget; i++ {
		if q.state.Load() != stateConnected {
			g.retire(q)
			return
		}
		if r.r == r.w {
			r.r, r.w = 0, 0
		} else if len(r.buf)-r.r < maxFPDULen || r.w == len(r.buf) {
			// Room for the largest FPDU from its start (the second test
			// cannot hold while the first fails: a full buffer from r.r
			// would hold a whole FPDU, placed above; it keeps a read
			// into no room from looking like EOF).
			r.w = copy(r.buf, r.buf[r.r:r.w])
			r.r = 0
		}
		space := len(r.buf) - r.w
		k, err := q.readNB(r.buf[r.w:])
		if err == syscall.EAGAIN {
			return
		}
		if err == nil && k == 0 {
			err = io.EOF
		}
		if err != nil {
			if q.Err() == nil {
				q.fail(errConnection(err))
			}
			g.retire(q)
			return
		}
		r.w += k
		if !g.placeWhole(q) {
			return
		}
		if k < space {
			return // the socket is drained
		}
	}
}

// pollSupported: poll groups work here (epoll).
const pollSupported = true

// maxFPDULen is the largest FPDU on the wire.
var maxFPDULen = wire.FPDULen(wire.MaxULPDU)

// whole says the buffer holds at least one whole FPDU.
func (r *rxState) whole() bool {
	if r.w-r.r < wire.MPAHeaderLen {
		return false
	}
	return r.w-r.r >= wire.FPDULen(int(binary.BigEndian.Uint16(r.buf[r.r:])))
}

// readNB is one non-blocking read of the socket into b.
func (q *qp) readNB(b []byte) (int, error) {
	r := &q.rx
	r.nb = b
	err := r.rc.Read(r.readNBFn)
	r.nb = nil
	if err != nil {
		return 0, err
	}
	return r.rdN, r.rdErr
}

func (r *rxState) readNBFD(fd uintptr) bool {
	for {
		n, err := syscall.Read(int(fd), r.nb)
		if err == syscall.EINTR {
			continue
		}
		r.rdN, r.rdErr = max(n, 0), err
		return true // never wait in Go's netpoller: the group polls
	}
}

// sendQP runs q's sender work on the group's thread: finish a pending
// write, then build and write batches until the send queue and the peer's
// read requests are drained or the socket is full.
func (g *pollGroup) sendQP(q *qp) {
	if q.pollRetired {
		return
	}
	if q.state.Load() != stateConnected {
		g.retire(q)
		return
	}
	t := &q.tx
	if t.wpending && !q.writePending() {
		if q.state.Load() != stateConnected {
			g.retire(q)
		}
		return
	}
	if q.txDelayed {
		if !q.pollDelayed { // once, however many posts come meanwhile
			q.pollDelayed = true
			g.delayed = append(g.delayed, q)
		}
		return
	}
	for {
		progressed := false
		for q.serveRead() {
			progressed = true
			if t.full() {
				if !q.writeBatch() {
					g.afterWrite(q)
					return
				}
			}
		}
		if q.state.Load() != stateConnected {
			g.retire(q)
			return
		}
		p, r := q.drainSQ(true)
		switch r {
		case drainEmitFailed:
			g.retire(q)
			return
		case drainWriteFailed:
			g.afterWrite(q)
			return
		}
		if !progressed && !p {
			break
		}
	}
	if !q.writeBatch() {
		g.afterWrite(q)
		return
	}
	if q.pollOut {
		g.setOut(q, false)
	}
}

// afterWrite follows a write that did not finish: the QP failed, or the
// socket is full and the group waits for EPOLLOUT.
func (g *pollGroup) afterWrite(q *qp) {
	if q.state.Load() != stateConnected {
		g.retire(q)
		return
	}
	g.setOut(q, true)
}

// writeBatch starts writing the batch built so far; true when it was
// written in full (and its requests completed).
func (q *qp) writeBatch() bool {
	t := &q.tx
	if len(t.buf) > t.segStart {
		t.iov = append(t.iov, t.buf[t.segStart:])
		t.segStart = len(t.buf)
	}
	if len(t.iov) == 0 {
		q.txDone(nil)
		return true
	}
	t.wpending = true
	t.writes.Add(1)
	return q.writePending()
}

// writePending writes what is left of the batch without blocking; true
// when all of it was written (its requests are then completed), false when
// the socket is full or the write failed (the QP then failed).
func (q *qp) writePending() bool {
	t := &q.tx
	for {
		t.wrN, t.wrErr = 0, nil
		if err := q.rx.rc.Write(t.writevFn); err != nil {
			t.wrErr = err
		}
		if t.wrErr == syscall.EAGAIN {
			return false
		}
		if t.wrErr != nil {
			err := t.wrErr
			q.txDone(err)
			if q.Err() == nil {
				q.fail(errConnection(err))
			}
			return false
		}
		n := t.wrN
		for len(t.iov) > 0 && (n > 0 || len(t.iov[0]) == 0) {
			if n >= len(t.iov[0]) {
				n -= len(t.iov[0])
				t.iov[0] = nil
				t.iov = t.iov[1:]
				continue
			}
			t.iov[0] = t.iov[0][n:]
			n = 0
		}
		if len(t.iov) == 0 {
			q.txDone(nil)
			return true
		}
	}
}

// writevFD is one non-blocking writev of t.iov (run by RawConn.Write).
func (t *txState) writevFD(fd uintptr) bool {
	n := 0
	for _, b := range t.iov {
		if n == len(t.wiov) {
			break // one message can make more iovecs than a writev takes: the rest goes next
		}
		if len(b) == 0 {
			continue
		}
		t.wiov[n].Base = &b[0]
		t.wiov[n].SetLen(len(b))
		n++
	}
	if n == 0 {
		t.wrErr = errEmptyWrite
		return true
	}
	for {
		r, _, e := syscall.Syscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&t.wiov[0])), uintptr(n))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			t.wrErr = e
		} else {
			t.wrN = int(r)
		}
		clear(t.wiov[:n])
		return true // never wait in Go's netpoller: the group polls
	}
}

// txAbort drops a batch that will not be written (the QP failed).
func (q *qp) txAbort() {
	t := &q.tx
	if t.buf == nil {
		return // never started
	}
	t.wpending = false
	q.txDone(transport.ErrCancelled)
}

// finishPending writes the rest of a partly written batch, blocking (an
// error path: a Terminate must follow whole FPDUs on the stream).
func (q *qp) finishPending() {
	t := &q.tx
	if !t.wpending {
		return
	}
	bufs := t.iov
	_, err := bufs.WriteTo(q.conn)
	t.iov = t.iov[:0]
	q.txDone(err)
}

// startPoll starts the poll group of a CQ in poll-group mode.
func (c *cq) startPoll(started chan struct{}) error {
	g, err := newPollGroup(c)
	if err != nil {
		return err
	}
	c.group = g
	go c.runPoll(started)
	return nil
}

var errEmptyWrite = errors.New("soft: poll group: nothing left to write in a pending batch")

var errPollShort = errors.New("soft: poll group: FPDU not whole in the buffer")

func (g *pollGroup) counters() (wakes, sleeps, full uint64) {
	return g.loop.Wakes(), g.loop.Sleeps(), g.full.Load()
}
