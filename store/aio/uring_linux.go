//go:build linux

package aio

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The io_uring ABI this file speaks, from the kernel's
// include/uapi/linux/io_uring.h (written here, not generated): the
// mmap offsets of the rings, the opcodes and flags used, and the shapes
// of io_uring_params, the SQE and the CQE, whose sizes are checked at
// compile time below.
const (
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	featSingleMmap = 1 << 0 // SQ and CQ rings share one mapping (5.4)
	featNoDrop     = 1 << 1 // the kernel never drops a CQE (5.5)
	featRWCurPos   = 1 << 3 // with IORING_OP_READ/WRITE (5.6), which we use

	setupClamp = 1 << 4 // clamp entries to the kernel's maximum instead of failing

	opNop        = 0
	opFsync      = 3
	opReadFixed  = 4
	opWriteFixed = 5
	opRead       = 22
	opWrite      = 23

	fsyncDatasync = 1 // IORING_FSYNC_DATASYNC: fdatasync, not fsync

	enterGetEvents = 1 // IORING_ENTER_GETEVENTS

	registerBuffers   = 0
	registerEventfd   = 4
	unregisterEventfd = 5
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// sqe is struct io_uring_sqe as the READ, WRITE, FSYNC and NOP opcodes
// use it (the unions' other members are not needed).
type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	opFlags     uint32 // rw_flags (RWF_DSYNC) or fsync_flags
	userData    uint64
	bufIndex    uint16
	personality uint16
	fileIndex   int32
	addr3       uint64
	pad         uint64
}

type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// Compile-time checks of the ABI sizes: either array length is negative
// (a build error) if a size is wrong.
var (
	_ [unsafe.Sizeof(uringParams{}) - 120]byte
	_ [120 - unsafe.Sizeof(uringParams{})]byte
	_ [unsafe.Sizeof(sqe{}) - 64]byte
	_ [64 - unsafe.Sizeof(sqe{})]byte
	_ [unsafe.Sizeof(cqe{}) - 16]byte
	_ [16 - unsafe.Sizeof(cqe{})]byte
)

// ring is one io_uring instance: the SQ and CQ rings and the SQE array
// mapped from the kernel.
type ring struct {
	fd               int
	sqMem, cqMem     []byte // cqMem aliases sqMem under featSingleMmap
	sqeMem           []byte
	sqHead, sqTail   *uint32
	sqMask           uint32
	sqArray          []uint32
	sqes             []sqe
	cqHead, cqTail   *uint32
	cqMask           uint32
	cqes             []cqe
	tail             uint32 // the next SQE to fill; published at submit
	features         uint32
	sqEntries, cqLen uint32
	single           bool // featSingleMmap: cqMem is sqMem
}

func setupRing(entries uint32) (*ring, error) {
	var p uringParams
	p.flags = setupClamp
	fd, _, errno := unix.RawSyscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, &os.SyscallError{Syscall: "io_uring_setup", Err: errno}
	}
	r := &ring{fd: int(fd), features: p.features, sqEntries: p.sqEntries, cqLen: p.cqEntries}
	if err := r.mapRings(&p); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *ring) mapRings(p *uringParams) error {
	sqSize := int(p.sqOff.array) + int(p.sqEntries)*4
	cqSize := int(p.cqOff.cqes) + int(p.cqEntries)*int(unsafe.Sizeof(cqe{}))
	single := p.features&featSingleMmap != 0
	r.single = single
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	prot, flags := unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE
	if r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqSize, prot, flags); err != nil {
		return &os.SyscallError{Syscall: "mmap io_uring SQ ring", Err: err}
	}
	if single {
		r.cqMem = r.sqMem
	} else if r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, prot, flags); err != nil {
		return &os.SyscallError{Syscall: "mmap io_uring CQ ring", Err: err}
	}
	sqeSize := int(p.sqEntries) * int(unsafe.Sizeof(sqe{}))
	if r.sqeMem, err = unix.Mmap(r.fd, offSQEs, sqeSize, prot, flags); err != nil {
		return &os.SyscallError{Syscall: "mmap io_uring SQEs", Err: err}
	}
	sq, cq := unsafe.Pointer(&r.sqMem[0]), unsafe.Pointer(&r.cqMem[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.sqOff.head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.sqOff.tail))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.sqOff.ringMask))
	r.sqArray = unsafe.Slice((*uint32)(unsafe.Add(sq, p.sqOff.array)), p.sqEntries)
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	r.cqHead = (*uint32)(unsafe.Add(cq, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(cq, p.cqOff.tail))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.cqOff.ringMask))
	r.cqes = unsafe.Slice((*cqe)(unsafe.Add(cq, p.cqOff.cqes)), p.cqEntries)
	r.tail = atomic.LoadUint32(r.sqTail)
	return nil
}

func (r *ring) close() {
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
	}
	if r.cqMem != nil && !r.single {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	r.sqeMem, r.cqMem, r.sqMem = nil, nil, nil
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}

// next returns the SQE to fill for the next request; the caller has
// made sure the SQ has room (requests in flight ≤ Depth ≤ SQ entries).
func (r *ring) next() *sqe {
	s := &r.sqes[r.tail&r.sqMask]
	r.sqArray[r.tail&r.sqMask] = r.tail & r.sqMask
	r.tail++
	return s
}

// unconsumed is the SQEs filled that the kernel has not taken yet.
func (r *ring) unconsumed() uint32 { return r.tail - atomic.LoadUint32(r.sqHead) }

// enter publishes the filled SQEs and calls io_uring_enter: to submit
// them and, with wait, to wait for one completion.
func (r *ring) enter(wait bool) error {
	atomic.StoreUint32(r.sqTail, r.tail)
	n := r.unconsumed()
	var min, flags uintptr
	if wait {
		min, flags = 1, enterGetEvents
	}
	if n == 0 && !wait {
		return nil
	}
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n), min, flags, 0, 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			n = r.unconsumed()
			continue
		case unix.EAGAIN, unix.EBUSY:
			// The kernel is short of memory for requests or the CQ is
			// full; what it did not take is taken at the next enter.
			return nil
		}
		return &os.SyscallError{Syscall: "io_uring_enter", Err: errno}
	}
}

// cqReady is the CQEs posted and not yet consumed.
func (r *ring) cqReady() uint32 { return atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead) }

// probe is the outcome of one attempt to use io_uring, taken once.
var probe struct {
	once sync.Once
	err  error
}

// URingUnavailable is nil where this process can use io_uring, or an
// error wrapping ErrUnavailable that says why not: a kernel without it
// or older than 5.6, the kernel.io_uring_disabled sysctl, a seccomp
// filter (a container runtime's default profile refuses it), or the
// memlock limit. It tries once (a ring of two entries and a NOP) and
// remembers.
func URingUnavailable() error {
	probe.once.Do(func() { probe.err = tryURing() })
	return probe.err
}

func tryURing() error {
	r, err := setupRing(2)
	if err != nil {
		return explainSetup(err)
	}
	defer r.close()
	if r.features&featRWCurPos == 0 || r.features&featNoDrop == 0 {
		return fmt.Errorf("%w: kernel older than 5.6 (io_uring features %#x lack READ/WRITE and NODROP)", ErrUnavailable, r.features)
	}
	s := r.next()
	*s = sqe{opcode: opNop, fd: -1, userData: ^uint64(0)}
	if err := r.enter(true); err != nil {
		return fmt.Errorf("%w: a NOP failed: %v", ErrUnavailable, err)
	}
	if r.cqReady() != 1 {
		return fmt.Errorf("%w: a NOP did not complete", ErrUnavailable)
	}
	c := r.cqes[atomic.LoadUint32(r.cqHead)&r.cqMask]
	if c.userData != ^uint64(0) || c.res != 0 {
		return fmt.Errorf("%w: a NOP completed as %d (user data %#x)", ErrUnavailable, c.res, c.userData)
	}
	return nil
}

// explainSetup turns a failed io_uring_setup into the reason an
// operator can act on.
func explainSetup(err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	switch errno {
	case unix.ENOSYS:
		return fmt.Errorf("%w: io_uring_setup: ENOSYS (a kernel built without io_uring, or a seccomp filter, as a container runtime's default profile, refuses it)", ErrUnavailable)
	case unix.EPERM:
		b, _ := os.ReadFile("/proc/sys/kernel/io_uring_disabled")
		switch strings.TrimSpace(string(b)) {
		case "2":
			return fmt.Errorf("%w: io_uring_setup: EPERM (sysctl kernel.io_uring_disabled=2 disables it for everyone)", ErrUnavailable)
		case "1":
			return fmt.Errorf("%w: io_uring_setup: EPERM (sysctl kernel.io_uring_disabled=1 allows it only to root and kernel.io_uring_group)", ErrUnavailable)
		}
		return fmt.Errorf("%w: io_uring_setup: EPERM (a seccomp filter or security module refuses it)", ErrUnavailable)
	case unix.ENOMEM:
		return fmt.Errorf("%w: io_uring_setup: ENOMEM (RLIMIT_MEMLOCK too low for the rings on a kernel before 5.12)", ErrUnavailable)
	}
	return fmt.Errorf("%w: io_uring_setup: %v", ErrUnavailable, errno)
}

// uring is the io_uring Engine: one ring per engine, so per poll group,
// whose SQ and CQ only the owning goroutine touches (no lock; the
// kernel is the other side). A request's slot index is its SQE's
// user_data.
type uring struct {
	r      *ring
	fd     int32 // the data file's
	efd    int
	s      slots
	depth  int
	queued int // filled SQEs not yet handed to the kernel by Submit
	// fixed is the registered pool's memory, [fixLo, fixHi): a request
	// inside it goes as READ_FIXED/WRITE_FIXED on buffer index 0.
	fixLo, fixHi uintptr
	fixed        *Pool
	closed       bool
	st           Stats
}

func newURing(f *File, cfg Config) (Engine, error) {
	if err := URingUnavailable(); err != nil {
		return nil, err
	}
	// The SQ holds Depth entries; the CQ is twice that (the kernel's
	// default), and never fills since at most Depth are in flight.
	r, err := setupRing(uint32(cfg.Depth))
	if err != nil {
		return nil, explainSetup(err)
	}
	if int(r.sqEntries) < cfg.Depth {
		r.close()
		return nil, fmt.Errorf("aio: io_uring gave %d entries, Depth %d asked", r.sqEntries, cfg.Depth)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		r.close()
		return nil, &os.SyscallError{Syscall: "eventfd", Err: err}
	}
	e32 := int32(efd)
	if _, _, errno := unix.RawSyscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerEventfd, uintptr(unsafe.Pointer(&e32)), 1, 0, 0); errno != 0 {
		unix.Close(efd)
		r.close()
		return nil, &os.SyscallError{Syscall: "io_uring_register eventfd", Err: errno}
	}
	return &uring{r: r, fd: int32(f.fd), efd: efd, s: newSlots(cfg.Depth), depth: cfg.Depth}, nil
}

func (u *uring) Kind() Kind    { return KindURing }
func (u *uring) Depth() int    { return u.depth }
func (u *uring) EventFD() int  { return u.efd }
func (u *uring) InFlight() int { return u.s.inUse() }
func (u *uring) Stats() Stats  { return u.st }
func (u *uring) Read(tag uint64, buf []byte, off int64) error {
	return u.rw(tag, OpRead, buf, off)
}

func (u *uring) Write(tag uint64, buf []byte, off int64, fua bool) error {
	if fua {
		return u.rw(tag, OpWriteFUA, buf, off)
	}
	return u.rw(tag, OpWrite, buf, off)
}

func (u *uring) rw(tag uint64, op Op, buf []byte, off int64) error {
	if u.closed {
		return ErrClosed
	}
	if err := check(buf, off); err != nil {
		u.st.Unaligned++
		return err
	}
	sl := u.s.get()
	if sl == nil {
		u.st.FullRefuse++
		return ErrFull
	}
	sl.tag, sl.op, sl.len, sl.buf = tag, op, int32(len(buf)), buf
	s := u.r.next()
	*s = sqe{opcode: opRead, fd: u.fd, off: uint64(off), addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), len: uint32(len(buf)), userData: uint64(sl.idx)}
	if op != OpRead {
		s.opcode = opWrite
		if op == OpWriteFUA {
			s.opFlags = unix.RWF_DSYNC
		}
	}
	if a := uintptr(s.addr); a >= u.fixLo && a+uintptr(len(buf)) <= u.fixHi {
		s.opcode = opReadFixed
		if op != OpRead {
			s.opcode = opWriteFixed
		}
		u.st.Fixed++
	}
	u.queued++
	return nil
}

// maxFixed is the largest buffer io_uring registers: 1 GiB.
const maxFixed = 1 << 30

func (u *uring) Register(p *Pool) error {
	switch {
	case u.closed:
		return ErrClosed
	case u.fixed != nil:
		return fmt.Errorf("aio: register: a pool is registered already")
	case p == nil || p.mem == nil:
		return fmt.Errorf("aio: register: no pool, or a closed one")
	case len(p.mem) > maxFixed:
		return fmt.Errorf("aio: register: pool of %d bytes exceeds io_uring's %d", len(p.mem), maxFixed)
	}
	iov := unix.Iovec{Base: &p.mem[0]}
	iov.SetLen(len(p.mem))
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(u.r.fd), registerBuffers, uintptr(unsafe.Pointer(&iov)), 1, 0, 0); errno != 0 {
		if errno == unix.ENOMEM {
			return fmt.Errorf("aio: register %d bytes of buffers: %w (RLIMIT_MEMLOCK too low; requests still work, unregistered)", len(p.mem), errno)
		}
		return fmt.Errorf("aio: register %d bytes of buffers: %w", len(p.mem), errno)
	}
	u.fixed = p
	u.fixLo = uintptr(unsafe.Pointer(&p.mem[0]))
	u.fixHi = u.fixLo + uintptr(len(p.mem))
	return nil
}

func (u *uring) Sync(tag uint64) error {
	if u.closed {
		return ErrClosed
	}
	sl := u.s.get()
	if sl == nil {
		u.st.FullRefuse++
		return ErrFull
	}
	sl.tag, sl.op, sl.len = tag, OpSync, 0
	s := u.r.next()
	*s = sqe{opcode: opFsync, fd: u.fd, opFlags: fsyncDatasync, userData: uint64(sl.idx)}
	u.queued++
	return nil
}

func (u *uring) Submit() error {
	if u.closed {
		return ErrClosed
	}
	if u.queued == 0 && u.r.unconsumed() == 0 {
		return nil
	}
	u.st.Doorbells++
	if err := u.r.enter(false); err != nil {
		return err
	}
	u.st.Submitted += uint64(u.queued)
	u.queued = 0
	return nil
}

func (u *uring) Reap(cs []Completion) int {
	if u.closed {
		return 0
	}
	r := u.r
	head, tail := atomic.LoadUint32(r.cqHead), atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail && n < len(cs); head++ {
		c := &r.cqes[head&r.cqMask]
		sl := &u.s.reqs[c.userData]
		sl.res, sl.err = c.res, 0
		if c.res < 0 {
			sl.res, sl.err = 0, unix.Errno(-c.res)
		}
		u.s.complete(&cs[n], sl, &u.st)
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}

// Arm empties the eventfd (signals of completions already seen), then
// looks at the CQ: the kernel posts a CQE before it signals, so a CQE
// this look misses is signalled after the drain and wakes the sleep.
func (u *uring) Arm() bool {
	if u.closed {
		return false
	}
	drainEventfd(u.efd)
	// SQEs the kernel left in the SQ (EAGAIN: short of memory) complete
	// only once a Submit hands them over again: no sleep until then.
	if u.r.cqReady() > 0 || u.r.unconsumed() > 0 {
		return true
	}
	u.st.Arms++
	return false
}

func (u *uring) Close() error {
	if u.closed {
		return nil
	}
	u.closed = true
	// Requests queued but never submitted go too: their buffers must not
	// be touched after Close either. Then wait for every CQE.
	out := u.s.inUse()
	var err error
	for out > 0 && err == nil {
		err = u.r.enter(true)
		head, tail := atomic.LoadUint32(u.r.cqHead), atomic.LoadUint32(u.r.cqTail)
		out -= int(tail - head)
		atomic.StoreUint32(u.r.cqHead, tail)
	}
	unix.RawSyscall6(unix.SYS_IO_URING_REGISTER, uintptr(u.r.fd), unregisterEventfd, 0, 0, 0, 0)
	u.r.close() // unregisters the buffers too
	u.fixed, u.fixLo, u.fixHi = nil, 0, 0
	unix.Close(u.efd)
	for i := range u.s.reqs {
		u.s.reqs[i].buf = nil
	}
	if err != nil {
		return fmt.Errorf("aio: close: waiting for %d requests: %w", out, err)
	}
	return nil
}
