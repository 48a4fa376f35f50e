//go:build linux

package aio

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Align is the alignment of every buffer address, file offset and length
// that an Engine accepts: 4096, the page and the logical block of every
// disk blk serves. O_DIRECT asks for the device's logical block (512 or
// 4096); demanding 4096 everywhere makes one rule that holds on both.
const Align = 4096

// MaxIO is the largest single request: 1 MiB, eight times the target's
// MDTS (128 KiB). A completion carries its byte count in an int32, and a
// bound here keeps one request from holding the disk for long.
const MaxIO = 1 << 20

// Op is what a request does.
type Op uint8

// The operations. OpWriteFUA is a write that is durable when it
// completes (RWF_DSYNC: the data and the metadata needed to read it
// back), as NVMe's FUA. OpSync is fdatasync of the whole file.
const (
	OpRead Op = iota + 1
	OpWrite
	OpWriteFUA
	OpSync
)

var opNames = [...]string{"?", "read", "write", "write-fua", "sync"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "?"
}

// Kind names an implementation.
type Kind uint8

// The implementations. KindAuto (the zero value) is io_uring where the
// kernel lets this process use it, else the worker pool.
const (
	KindAuto Kind = iota
	KindURing
	KindWorkers
)

func (k Kind) String() string {
	switch k {
	case KindURing:
		return "io_uring"
	case KindWorkers:
		return "workers"
	}
	return "auto"
}

// The package's sentinels; errors wrap them with %w and say more.
var (
	// ErrAlign: a buffer address, offset or length that is not a
	// multiple of Align, empty, negative or above MaxIO. Returned before
	// anything is submitted.
	ErrAlign = errors.New("aio: buffer, offset or length not aligned to 4096")
	// ErrFull: Depth requests are queued or in flight already; reap
	// completions first.
	ErrFull = errors.New("aio: queue full")
	// ErrClosed: the engine or the file was closed.
	ErrClosed = errors.New("aio: engine closed")
	// ErrShort: a request moved fewer bytes than asked, which O_DIRECT
	// does only at the end of the file or device (a read past EOF) or
	// when the disk is full.
	ErrShort = errors.New("aio: short transfer (past the end of the file or device, or disk full)")
	// ErrUnavailable: io_uring cannot be used here; the error wrapping
	// it says why (URingUnavailable).
	ErrUnavailable = errors.New("aio: io_uring unavailable")
)

// Completion is the outcome of one request, harvested by Reap.
type Completion struct {
	Tag   uint64     // the caller's tag, as submitted
	Op    Op         // the request's operation
	Len   int32      // bytes asked (0 for OpSync)
	N     int32      // bytes moved
	Errno unix.Errno // the kernel's error, 0 if none
}

// Err is nil if the request did all it was asked, the kernel's error
// (errors.Is(err, unix.EIO) works), or ErrShort. It does not allocate.
func (c *Completion) Err() error {
	if c.Errno != 0 {
		return c.Errno
	}
	if c.N < c.Len {
		return ErrShort
	}
	return nil
}

// Engine submits requests against one O_DIRECT file and hands their
// completions back. One Engine belongs to one goroutine (a poll group):
// every method but EventFD and Kind is that goroutine's only, and none
// of them takes a lock.
//
// The cycle: Read, Write and Sync queue a request (validated first:
// nothing misaligned ever reaches the kernel), Submit hands everything
// queued to the disk in one go (one io_uring_enter), and Reap takes
// completions without blocking. A request's buffer belongs to the disk
// from the call that queues it until its completion is reaped: the
// caller must not touch it (the engine keeps a reference, so a buffer
// from the Go heap is not collected meanwhile; Pool buffers are outside
// the heap altogether).
//
// To sleep, the owner calls Arm: false means nothing is pending and the
// eventfd will become readable when a completion arrives; true means
// there is work (a completion to reap, or, rarely, requests the kernel
// did not take yet, which the next Submit hands over): loop instead of
// sleeping. Call Submit before Arm: queued requests are not at the disk
// until then. Park
// EventFD in the poll group's epoll set (internal/epoll.Loop.Add, with
// Arm as, or inside, the Loop's hasWork).
type Engine interface {
	// Read queues a read of len(buf) bytes at off into buf.
	Read(tag uint64, buf []byte, off int64) error
	// Write queues a write of buf at off; fua makes it durable on
	// completion (OpWriteFUA).
	Write(tag uint64, buf []byte, off int64, fua bool) error
	// Sync queues an fdatasync: the writes that completed before it was
	// submitted are durable when it completes. It does not wait for
	// writes still in flight, as an NVMe Flush covers only commands
	// completed before it.
	Sync(tag uint64) error
	// Register offers the engine a Pool whose buffers most requests
	// will use, so that it can map them once instead of per request
	// (io_uring's registered buffers: no page pinning per I/O). Requests
	// on other buffers keep working. An error (a memlock limit too low,
	// a second pool) leaves the engine as it was; the caller may log it
	// and go on. The pool must outlive the engine.
	Register(p *Pool) error
	// Submit hands the queued requests to the disk.
	Submit() error
	// Reap copies up to len(cs) completions into cs and returns how
	// many; it never blocks.
	Reap(cs []Completion) int
	// Arm prepares a sleep: it reports whether there is work (see
	// above); if not, EventFD becomes readable when a completion arrives.
	Arm() bool
	// EventFD is readable when completions arrived after an Arm.
	EventFD() int
	// InFlight is the number of requests queued or submitted and not
	// yet reaped.
	InFlight() int
	// Depth is the most requests in flight at once (Config.Depth).
	Depth() int
	// Kind is the implementation.
	Kind() Kind
	// Stats are the engine's counters (the owner's goroutine: an
	// exporter asks the poll group for them).
	Stats() Stats
	// Close waits for the requests in flight to complete (the disk owns
	// their buffers until then), then frees the engine. The file stays
	// open; a completion not reaped is dropped.
	Close() error
}

// Stats count an engine's work: plain counters the owner updates, no
// atomics on the data path.
type Stats struct {
	Submitted  uint64 // requests handed to the disk
	Completed  uint64 // completions reaped
	Errors     uint64 // completions with an error (ErrShort included)
	Doorbells  uint64 // io_uring_enter calls, or worker wake-ups
	Notifies   uint64 // eventfd signals sent by a worker (the kernel's are not counted)
	Arms       uint64 // calls to Arm that found nothing pending
	Fixed      uint64 // requests on registered buffers (io_uring)
	Unaligned  uint64 // requests refused with ErrAlign
	FullRefuse uint64 // requests refused with ErrFull
}

// Defaults of Config, each with its reason.
const (
	// DefaultDepth is Depth: 64 requests in flight per engine, twice the
	// deepest queue the goals measure (QD32), so a poll group serving
	// two such queues keeps 32 each at the disk.
	DefaultDepth = 64
	// MaxDepth bounds Depth: 4096, io_uring's SQ limit in older kernels
	// and far past what one core's NVMe queue gains from.
	MaxDepth = 4096
)

// Config configures an Engine.
type Config struct {
	// Kind picks the implementation (KindAuto: io_uring if usable).
	Kind Kind
	// Depth is the most requests in flight (DefaultDepth; 1..MaxDepth).
	Depth int
	// Workers is the worker pool's goroutines, each doing one blocking
	// pread/pwrite at a time (default Depth, so that Depth requests are
	// at the disk at once; 1..Depth). Ignored by io_uring.
	Workers int
}

func (c Config) withDefaults() Config {
	if c.Depth == 0 {
		c.Depth = DefaultDepth
	}
	if c.Workers == 0 {
		c.Workers = c.Depth
	}
	return c
}

// Validate checks the configuration, defaults applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Kind > KindWorkers:
		return fmt.Errorf("aio: unknown Kind %d", c.Kind)
	case c.Depth < 1 || c.Depth > MaxDepth:
		return fmt.Errorf("aio: Depth %d outside 1..%d", c.Depth, MaxDepth)
	case c.Workers < 1 || c.Workers > c.Depth:
		return fmt.Errorf("aio: Workers %d outside 1..Depth (%d)", c.Workers, c.Depth)
	}
	return nil
}

// New makes an engine for f, owned by the calling goroutine. KindAuto
// falls back to the worker pool where io_uring is unavailable
// (URingUnavailable says why; log it); KindURing fails there instead.
func New(f *File, cfg Config) (Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if f == nil || f.Fd() < 0 {
		return nil, ErrClosed
	}
	kind := cfg.Kind
	if kind == KindAuto {
		kind = KindURing
		if URingUnavailable() != nil {
			kind = KindWorkers
		}
	}
	if kind == KindURing {
		return newURing(f, cfg)
	}
	return newWorkers(f, cfg)
}

// check validates a read or write before it is queued: the error says
// which rule the request broke.
func check(buf []byte, off int64) error {
	n := len(buf)
	switch {
	case n == 0 || n > MaxIO:
		return fmt.Errorf("%w: length %d outside %d..%d", ErrAlign, n, Align, MaxIO)
	case n%Align != 0:
		return fmt.Errorf("%w: length %d", ErrAlign, n)
	case off < 0 || off%Align != 0:
		return fmt.Errorf("%w: offset %d", ErrAlign, off)
	case uintptr(unsafe.Pointer(unsafe.SliceData(buf)))%Align != 0:
		return fmt.Errorf("%w: buffer address %p", ErrAlign, unsafe.SliceData(buf))
	}
	return nil
}

// slots is the engine's request table, indexed by slot: a request's slot
// travels to the kernel (user_data) or the worker and back, so the
// completion finds the tag, the op and the length without a lookup. The
// free list is a plain stack: one goroutine owns it.
type slots struct {
	reqs []slot
	free []int32
}

type slot struct {
	tag  uint64
	op   Op
	len  int32
	buf  []byte // the worker pool's; io_uring keeps the address in its SQE
	off  int64
	res  int32      // written by a worker before it pushes the slot
	err  unix.Errno // idem
	next *slot      // the worker pool's completion stack
	idx  int32
}

func newSlots(n int) slots {
	s := slots{reqs: make([]slot, n), free: make([]int32, n)}
	for i := range s.reqs {
		s.reqs[i].idx = int32(i)
		s.free[i] = int32(n - 1 - i)
	}
	return s
}

// get takes a free slot, or nil when Depth are in use.
func (s *slots) get() *slot {
	n := len(s.free)
	if n == 0 {
		return nil
	}
	r := &s.reqs[s.free[n-1]]
	s.free = s.free[:n-1]
	return r
}

func (s *slots) put(r *slot) {
	r.buf = nil
	s.free = append(s.free, r.idx)
}

func (s *slots) inUse() int { return len(s.reqs) - len(s.free) }

// complete fills c from a finished slot and frees the slot.
func (s *slots) complete(c *Completion, r *slot, st *Stats) {
	*c = Completion{Tag: r.tag, Op: r.op, Len: r.len, N: r.res, Errno: r.err}
	if c.Errno != 0 || c.N < c.Len {
		st.Errors++
	}
	st.Completed++
	s.put(r)
}

// drainEventfd empties an eventfd's counter (non-blocking).
func drainEventfd(fd int) {
	var b [8]byte
	for {
		_, err := unix.Read(fd, b[:])
		if err != unix.EINTR {
			return
		}
	}
}
