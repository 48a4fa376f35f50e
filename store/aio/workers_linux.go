//go:build linux

package aio

import (
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/internal/lfstack"
)

// one is an eventfd increment.
var one = [8]byte{1}

// workers is the worker-pool Engine, for where io_uring is unavailable:
// Workers goroutines each doing one blocking pread/pwrite at a time, so
// up to Workers requests are at the disk at once.
//
// The owner hands a request to an idle worker (its job pointer, then a
// token on its wake channel, which the worker sleeps on); a worker that
// finishes pushes itself on the idle stack and then the request on the
// done stack (both lock-free, internal/lfstack), and writes the eventfd
// only if the owner armed it, once per Arm. Pushing itself idle before
// the completion keeps an invariant: a worker is busy only for a request
// not yet reaped, so with Workers == Depth a new request always finds an
// idle worker. With fewer workers, requests wait in the owner's FIFO and
// go out as workers come back (at Submit and Reap).
//
// What it costs per request beyond the syscall: one channel hand-off to
// wake the worker (the Go runtime's lock inside the channel, the reason
// io_uring wins), two lock-free pushes, and for the owner one swap per
// Reap.
type workers struct {
	fd    int
	efd   int
	s     slots
	depth int

	// fifo is the requests queued and not yet handed to a worker, a ring
	// of Depth slot pointers.
	fifo      []*slot
	fhead, fn int
	ws        []*worker
	idleLocal []*worker             // idle workers the owner has taken
	idle      lfstack.Stack[worker] // workers that finished, newest first
	done      lfstack.Stack[slot]   // finished requests, newest first
	ready     *slot                 // finished, taken from done, arrival order
	armed     atomic.Bool           // the owner sleeps: signal the eventfd
	notifies  atomic.Uint64
	wg        sync.WaitGroup
	closed    bool
	st        Stats
}

type worker struct {
	e    *workers
	next *worker // link of the idle stack
	job  atomic.Pointer[slot]
	wake chan struct{}
	iov  unix.Iovec // pwritev2's, for FUA writes
}

func newWorkers(f *File, cfg Config) (Engine, error) {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, &os.SyscallError{Syscall: "eventfd", Err: err}
	}
	e := &workers{
		fd: f.fd, efd: efd, s: newSlots(cfg.Depth), depth: cfg.Depth,
		fifo:      make([]*slot, cfg.Depth),
		ws:        make([]*worker, cfg.Workers),
		idleLocal: make([]*worker, 0, cfg.Workers),
	}
	e.wg.Add(cfg.Workers)
	for i := range e.ws {
		w := &worker{e: e, wake: make(chan struct{}, 1)}
		e.ws[i] = w
		e.idleLocal = append(e.idleLocal, w)
		go w.run()
	}
	return e, nil
}

func (e *workers) Kind() Kind    { return KindWorkers }
func (e *workers) Depth() int    { return e.depth }
func (e *workers) EventFD() int  { return e.efd }
func (e *workers) InFlight() int { return e.s.inUse() }
func (e *workers) Stats() Stats {
	st := e.st
	st.Notifies = e.notifies.Load()
	return st
}

func (e *workers) Read(tag uint64, buf []byte, off int64) error {
	return e.queue(tag, OpRead, buf, off)
}

func (e *workers) Write(tag uint64, buf []byte, off int64, fua bool) error {
	if fua {
		return e.queue(tag, OpWriteFUA, buf, off)
	}
	return e.queue(tag, OpWrite, buf, off)
}

func (e *workers) Sync(tag uint64) error { return e.queue(tag, OpSync, nil, 0) }

func (e *workers) queue(tag uint64, op Op, buf []byte, off int64) error {
	if e.closed {
		return ErrClosed
	}
	if op != OpSync {
		if err := check(buf, off); err != nil {
			e.st.Unaligned++
			return err
		}
	}
	sl := e.s.get()
	if sl == nil {
		e.st.FullRefuse++
		return ErrFull
	}
	sl.tag, sl.op, sl.len, sl.buf, sl.off = tag, op, int32(len(buf)), buf, off
	e.fifo[(e.fhead+e.fn)%e.depth] = sl
	e.fn++
	return nil
}

// Register has nothing to do: pread and pwrite take any buffer.
func (e *workers) Register(p *Pool) error {
	if e.closed {
		return ErrClosed
	}
	return nil
}

func (e *workers) Submit() error {
	if e.closed {
		return ErrClosed
	}
	e.dispatch()
	return nil
}

// dispatch hands queued requests to idle workers, in order.
func (e *workers) dispatch() {
	for e.fn > 0 {
		w := e.idleWorker()
		if w == nil {
			return
		}
		sl := e.fifo[e.fhead]
		e.fifo[e.fhead] = nil
		e.fhead = (e.fhead + 1) % e.depth
		e.fn--
		w.job.Store(sl)
		select {
		case w.wake <- struct{}{}:
		default: // a token is there already; the worker will look
		}
		e.st.Submitted++
		e.st.Doorbells++
	}
}

func (e *workers) idleWorker() *worker {
	if len(e.idleLocal) == 0 {
		for w := e.idle.TakeAll(); w != nil; {
			nx := w.next
			w.next = nil
			e.idleLocal = append(e.idleLocal, w)
			w = nx
		}
	}
	n := len(e.idleLocal)
	if n == 0 {
		return nil
	}
	w := e.idleLocal[n-1]
	e.idleLocal = e.idleLocal[:n-1]
	return w
}

func (e *workers) Reap(cs []Completion) int {
	if e.closed {
		return 0
	}
	if e.armed.Load() {
		e.armed.Store(false)
	}
	if e.ready == nil {
		// The done stack is newest first: reverse it into arrival order.
		var rev *slot
		for sl := e.done.TakeAll(); sl != nil; {
			nx := sl.next
			sl.next = rev
			rev = sl
			sl = nx
		}
		e.ready = rev
	}
	n := 0
	for e.ready != nil && n < len(cs) {
		sl := e.ready
		e.ready = sl.next
		sl.next = nil
		e.s.complete(&cs[n], sl, &e.st)
		n++
	}
	if e.fn > 0 {
		e.dispatch()
	}
	return n
}

// Arm empties the eventfd, announces the sleep, then looks once more:
// a worker pushes its completion before it looks at armed, so either
// this look sees the completion or the worker sees armed and signals.
func (e *workers) Arm() bool {
	if e.closed {
		return false
	}
	drainEventfd(e.efd)
	e.armed.Store(true)
	if e.ready != nil || !e.done.Empty() {
		e.armed.Store(false)
		return true
	}
	e.st.Arms++
	return false
}

// Close drops the requests not yet handed to a worker, lets every worker
// finish the one it holds, and stops them.
func (e *workers) Close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	for e.fn > 0 {
		e.fifo[e.fhead] = nil
		e.fhead = (e.fhead + 1) % e.depth
		e.fn--
	}
	for _, w := range e.ws {
		close(w.wake)
	}
	e.wg.Wait()
	unix.Close(e.efd)
	for i := range e.s.reqs {
		e.s.reqs[i].buf = nil
	}
	return nil
}

func (w *worker) run() {
	e := w.e
	defer e.wg.Done()
	for {
		sl := w.job.Swap(nil)
		if sl == nil {
			if _, ok := <-w.wake; !ok && w.job.Load() == nil {
				return
			}
			continue
		}
		w.do(sl)
		e.idle.Push(w, &w.next)
		e.done.Push(sl, &sl.next)
		if e.armed.Load() && e.armed.CompareAndSwap(true, false) {
			unix.Write(e.efd, one[:])
			e.notifies.Add(1)
		}
	}
}

// do runs one request with the blocking syscall, retrying EINTR.
func (w *worker) do(sl *slot) {
	fd := w.e.fd
	var n int
	var err error
	for {
		switch sl.op {
		case OpRead:
			n, err = unix.Pread(fd, sl.buf, sl.off)
		case OpWrite:
			n, err = unix.Pwrite(fd, sl.buf, sl.off)
		case OpWriteFUA:
			n, err = w.pwriteDsync(sl.buf, sl.off)
		case OpSync:
			n, err = 0, unix.Fdatasync(fd)
		}
		if err != unix.EINTR {
			break
		}
	}
	sl.res, sl.err = int32(max(n, 0)), 0
	if err != nil {
		sl.res = 0
		sl.err, _ = err.(unix.Errno)
		if sl.err == 0 {
			sl.err = unix.EIO
		}
	}
}

// pwriteDsync is pwritev2(RWF_DSYNC) of one buffer through the worker's
// own iovec: x/sys's Pwritev2 builds its iovecs per call.
func (w *worker) pwriteDsync(buf []byte, off int64) (int, error) {
	w.iov.Base = &buf[0]
	w.iov.SetLen(len(buf))
	n, _, errno := unix.Syscall6(unix.SYS_PWRITEV2, uintptr(w.e.fd), uintptr(unsafe.Pointer(&w.iov)), 1, uintptr(off), 0, unix.RWF_DSYNC)
	w.iov.Base = nil
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}
