//go:build linux

package epoll

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MaxEvents is the most events one Wait takes from the kernel (the loop's
// own included); more wait for the next Wait, which a loop with work
// does at once.
const MaxEvents = 64

// The slots of the loop's own fds; the caller's are 0 and up.
const (
	slotWake  = -1
	slotTimer = -2
)

// one is an eventfd increment: 1 on a little-endian machine, and not 0
// on any, which is all a wake needs.
var one = [8]byte{1}

var errSlot = errors.New("epoll: negative slot (the loop's own)")

// Loop is an epoll set one goroutine waits on, with the eventfd and the
// timerfd that wake it (the package comment tells the protocol). Embed it
// in the poll group, whose goroutine calls Init, Wait, SetTimer and End;
// Kick, Hold and Release are for any goroutine. A Loop must not be copied
// after Init.
type Loop struct {
	epfd, evfd, tfd int
	// f is the epoll fd as Go's netpoller sees it, rc its RawConn: a
	// blocking Wait parks on it until the set has events.
	f       *os.File
	rc      syscall.RawConn
	waitFn  func(fd uintptr) bool // l.waitFD, bound once: no closure per Wait
	hasWork func() bool
	waitN   int
	events  [MaxEvents]unix.EpollEvent
	buf     [8]byte // eventfd and timerfd reads

	kicked   atomic.Bool // work was handed over since the last Wait
	sleeping atomic.Bool // the loop is (about to be) parked in Wait

	// mu guards ended against the eventfd write of a late Kick and a
	// Hold on a loop that ended; taken only by a Kick that found the
	// loop asleep, never on the busy path.
	mu    sync.Mutex
	ended bool
	holds atomic.Int32

	wakes  atomic.Uint64 // eventfd writes
	sleeps atomic.Uint64 // Waits that parked
}

// Init opens the loop's epoll set, eventfd and timerfd; on error it holds
// none. name names the epoll fd's os.File. hasWork, which may be nil, is
// asked once more after a blocking Wait has announced its sleep: work it
// reports (handed over, its Kick still to come) keeps the loop from a
// sleep that the Kick would end at once.
func (l *Loop) Init(name string, hasWork func() bool) error {
	l.epfd, l.evfd, l.tfd = -1, -1, -1
	l.hasWork = hasWork
	fail := func(what string, err error) error {
		l.close()
		return &os.SyscallError{Syscall: what, Err: err}
	}
	var err error
	if l.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fail("epoll_create1", err)
	}
	if err = unix.SetNonblock(l.epfd, true); err != nil {
		return fail("epoll nonblock", err)
	}
	l.f = os.NewFile(uintptr(l.epfd), name)
	if l.rc, err = l.f.SyscallConn(); err != nil {
		return fail("epoll", err)
	}
	l.waitFn = l.waitFD
	if l.evfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return fail("eventfd", err)
	}
	if l.tfd, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err != nil {
		return fail("timerfd", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: slotWake}
	if err = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, l.evfd, &ev); err != nil {
		return fail("epoll_ctl", err)
	}
	ev = unix.EpollEvent{Events: unix.EPOLLIN, Fd: slotTimer}
	if err = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, l.tfd, &ev); err != nil {
		return fail("epoll_ctl", err)
	}
	return nil
}

// close closes what Init opened (the os.File closes the epoll fd).
func (l *Loop) close() {
	if l.f != nil {
		l.f.Close()
		l.f, l.epfd = nil, -1
	}
	for _, fd := range []*int{&l.epfd, &l.evfd, &l.tfd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// Add adds fd to the set with the events of interest (unix.EPOLLIN,
// EPOLLOUT, EPOLLET, ...). The events Wait reports for it carry slot in
// EpollEvent.Fd and gen in EpollEvent.Pad; slot must be 0 or more.
func (l *Loop) Add(fd int, events uint32, slot, gen int32) error {
	return l.ctl(unix.EPOLL_CTL_ADD, fd, events, slot, gen)
}

// Mod changes fd's events of interest, slot and gen.
func (l *Loop) Mod(fd int, events uint32, slot, gen int32) error {
	return l.ctl(unix.EPOLL_CTL_MOD, fd, events, slot, gen)
}

// Del takes fd out of the set. Closing fd does as much, once no other
// descriptor refers to its file.
func (l *Loop) Del(fd int) error {
	return unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

func (l *Loop) ctl(op, fd int, events uint32, slot, gen int32) error {
	if slot < 0 {
		return errSlot
	}
	ev := unix.EpollEvent{Events: events, Fd: slot, Pad: gen}
	return unix.EpollCtl(l.epfd, op, fd, &ev)
}

// Kick makes the loop look again: a Wait that has not yet announced its
// sleep will not sleep, and a sleeping one wakes. It writes the eventfd
// only when the loop sleeps, once per sleep. Any goroutine; no allocation,
// and no lock unless the loop sleeps.
func (l *Loop) Kick() {
	l.kicked.Store(true)
	if l.sleeping.Load() {
		l.wake()
	}
}

// wake writes the eventfd for the Kick that is first to find the loop
// asleep; a loop that ended has no eventfd to write.
func (l *Loop) wake() {
	if !l.sleeping.CompareAndSwap(true, false) {
		return
	}
	l.mu.Lock()
	if !l.ended {
		unix.Write(l.evfd, one[:])
		l.wakes.Add(1)
	}
	l.mu.Unlock()
}

// Wait takes the events of the set. With block false it only looks
// (epoll_wait with timeout 0). With block true it sleeps until an event,
// a Kick or the timer, unless work was handed over meanwhile (a Kick
// since the last Wait, or hasWork), when it only looks. It returns the
// caller's events, in the loop's own buffer, good until the next Wait;
// the eventfd's and the timerfd's it reads itself. The loop's goroutine
// only.
func (l *Loop) Wait(block bool) []unix.EpollEvent {
	if block {
		l.sleeping.Store(true)
		if l.kicked.Load() || l.hasWork != nil && l.hasWork() {
			l.sleeping.Store(false)
			block = false
		} else {
			l.sleeps.Add(1)
		}
	}
	n := 0
	if block {
		l.waitN = 0
		l.rc.Read(l.waitFn) // parks in Go's netpoller until the set has events
		l.sleeping.Store(false)
		n = l.waitN
	} else {
		for {
			k, err := unix.EpollWait(l.epfd, l.events[:], 0)
			if err == unix.EINTR {
				continue
			}
			if err == nil {
				n = k
			}
			break
		}
	}
	// A hand-over before this store is seen by the pass that follows
	// (the caller looks after Wait); one after it sets kicked again, and
	// the next Wait does not sleep.
	l.kicked.Store(false)
	return l.callers(n)
}

// waitFD looks at the set without blocking; false (nothing yet) makes
// RawConn.Read park until the epoll fd is readable.
func (l *Loop) waitFD(fd uintptr) bool {
	for {
		n, err := unix.EpollWait(int(fd), l.events[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return true
		}
		l.waitN = n
		return n > 0
	}
}

// callers reads the eventfd and the timerfd if the first n events name
// them, and returns the others, in order.
func (l *Loop) callers(n int) []unix.EpollEvent {
	evs := l.events[:n]
	k := 0
	for i := range evs {
		switch evs[i].Fd {
		case slotWake:
			unix.Read(l.evfd, l.buf[:])
			continue
		case slotTimer:
			unix.Read(l.tfd, l.buf[:])
			continue
		}
		if k != i {
			evs[k] = evs[i]
		}
		k++
	}
	return evs[:k]
}

// SetTimer makes a Wait d from now return (d > 0), if none did meanwhile;
// it replaces the deadline set before. The loop's goroutine only.
func (l *Loop) SetTimer(d time.Duration) {
	its := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	unix.TimerfdSettime(l.tfd, 0, &its, nil)
}

// Hold counts a user of the loop (a connection handed to it, say) that
// keeps End from ending it; false if the loop has ended. Any goroutine.
func (l *Loop) Hold() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	l.holds.Add(1)
	return true
}

// Release gives back one Hold. Any goroutine.
func (l *Loop) Release() { l.holds.Add(-1) }

// Holds is the number of Holds not yet released.
func (l *Loop) Holds() int32 { return l.holds.Load() }

// End ends the loop unless a Hold is outstanding, and reports whether it
// did: its fds are closed, a Kick writes nothing and Hold fails from then
// on. The loop's goroutine only, once it will not Wait again.
func (l *Loop) End() bool {
	l.mu.Lock()
	if l.holds.Load() == 0 {
		l.ended = true
	}
	ended := l.ended
	l.mu.Unlock()
	if ended {
		l.close()
	}
	return ended
}

// Wakes is the number of eventfd writes: Kicks that woke the loop.
func (l *Loop) Wakes() uint64 { return l.wakes.Load() }

// Sleeps is the number of Waits that parked.
func (l *Loop) Sleeps() uint64 { return l.sleeps.Load() }
