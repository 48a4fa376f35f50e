package target

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/store/aio"
)

// The store adapter: the one file of the target that knows the extent
// store (package store, docs/store.md). It calls a store volume for each
// backend operation and translates the store's errors into NVMe status
// (storeStatus), as nvmet's io-cmd-bdev.c does for a block device with
// blk_to_nvme_status; the core only reads the status back (statusOf).
//
// It has no write group: a plain write into an allocated cluster is one
// pwrite with no metadata, and a first write's map commit is made under
// the volume's allocation mutex, unsynced (the syncer, a Flush or FUA
// syncs the WAL), so there is nothing a batch would save (NewWriteGroup
// returns nil and the core calls Write for each). It has no Viewer
// either: the data is on disk, not in memory to look at, so Compare reads
// into a buffer (the core's fallback), which is what a View would do.
//
// Atomic write units: the store honours one logical block (O_DIRECT never
// tears a block; docs/store.md, "Atomic write units"), which is what
// Identify already reports (AWUN = AWUPF = NAWUPF = 0): nothing to add.

// StoreBackend adapts a store Volume. Its errors carry the NVMe status
// storeStatus gives them and still wrap the store's.
func StoreBackend(v *store.Volume) Backend { return storeBackend{v} }

type storeBackend struct{ v *store.Volume }

// ioOp is the operation a store error came from: I/O errors become media
// errors of the matching direction.
type ioOp uint8

const (
	opRead ioOp = iota
	opWrite
	opWriteZeroes
	opDeallocate
	opFlush
	opCompare
)

// storeStatus is the NVMe status of err, from a store operation op: the
// only place where store errors become status codes (store/errors.go
// names them).
//
//	ErrOutOfRange      LBA Out of Range + DNR
//	ErrMisaligned      Data SGL Length Invalid + DNR
//	ErrTooLarge,
//	ErrInvalid,
//	ErrWouldLoseData   Invalid Field in Command + DNR
//	ErrNotFound        Invalid Namespace or Format + DNR
//	ErrReadOnly        Namespace is Write Protected + DNR
//	ErrClosed          Namespace Not Ready (retryable: a store reopened
//	                   or a path elsewhere may serve it)
//	ErrNoSpace         Capacity Exceeded + DNR (the Linux host: ENOSPC)
//	ErrIO              reads and compares: Unrecovered Read Error + DNR;
//	                   writes, write-zeroes, deallocates: Write Fault + DNR;
//	                   flush: Internal Error + DNR (as nvmet's
//	                   blk_to_nvme_status: a failed store stays failed)
//	anything else      Internal Error + DNR (ErrCorrupt, ErrExists too)
//
// An error that already carries a status (a StatusError) keeps it. ErrIO
// is tested last: a failed store answers it to everything, and a store
// error wraps exactly one of the others.
func storeStatus(op ioOp, err error) nvme.Status {
	var se StatusError
	switch {
	case errors.As(err, &se):
		return se.NVMeStatus()
	case errors.Is(err, store.ErrOutOfRange):
		return nvme.StatusLBAOutOfRange.WithDNR()
	case errors.Is(err, store.ErrMisaligned):
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	case errors.Is(err, store.ErrTooLarge), errors.Is(err, store.ErrInvalid), errors.Is(err, store.ErrWouldLoseData):
		return nvme.StatusInvalidField.WithDNR()
	case errors.Is(err, store.ErrNotFound):
		return nvme.StatusInvalidNamespace.WithDNR()
	case errors.Is(err, store.ErrReadOnly):
		return nvme.StatusNamespaceWriteProtect.WithDNR()
	case errors.Is(err, store.ErrClosed):
		return nvme.StatusNamespaceNotReady
	case errors.Is(err, store.ErrNoSpace):
		return nvme.StatusCapacityExceeded.WithDNR()
	case errors.Is(err, store.ErrIO):
		switch op {
		case opRead, opCompare:
			return nvme.StatusUnrecoveredReadError.WithDNR()
		case opWrite, opWriteZeroes, opDeallocate:
			return nvme.StatusWriteFault.WithDNR()
		}
	}
	return nvme.StatusInternalError.WithDNR()
}

// storeError is err, from a store operation op, with its status: what the
// adapter returns. nil stays nil (no allocation on success).
func storeError(op ioOp, err error) error {
	if err == nil {
		return nil
	}
	return WithStatus(err, storeStatus(op, err))
}

// Geometry implements Backend. Its error is not a command's: returned as
// the store gave it.
func (b storeBackend) Geometry() (Geometry, error) {
	info, err := b.v.Info()
	if err != nil {
		return Geometry{}, err
	}
	return storeGeometry(info), nil
}

func storeGeometry(info store.Info) Geometry {
	return Geometry{BlockSize: info.BlockSize, Blocks: info.Blocks(), ReadOnly: info.State == store.StateReadOnly}
}

func (b storeBackend) Read(lba uint64, buf []byte) error {
	return storeError(opRead, b.v.Read(lba, buf))
}

func (b storeBackend) Write(lba uint64, data []byte, fua bool) error {
	var f store.WriteFlags
	if fua {
		f = store.FUA
	}
	return storeError(opWrite, b.v.Write(lba, data, f))
}

func (b storeBackend) WriteZeroes(lba, n uint64, fua bool) error {
	var f store.WriteFlags
	if fua {
		f = store.FUA
	}
	return storeError(opWriteZeroes, b.v.WriteZeroes(lba, n, f))
}

func (b storeBackend) Deallocate(lba, n uint64) error {
	return storeError(opDeallocate, b.v.Deallocate(lba, n))
}

func (b storeBackend) Flush() error { return storeError(opFlush, b.v.Flush()) }

// NewWriteGroup implements Backend: none (see above).
func (b storeBackend) NewWriteGroup() WriteGroup { return nil }

// The asynchronous store adapter (issue 22): reads and overwrites go to
// the disk through an io_uring (store/aio) on the submitting poll group,
// completed there, so a poll group never waits for the disk and a queue
// depth of 32 is 32 I/Os at it. The store resolves each request
// (Volume.BeginDirect): into one I/O per run of physically contiguous
// clusters (the volume pinned until EndDirect; a read's unwritten
// clusters zeroed in its buffer), or done already (a read of unwritten
// clusters only), or "slow" — a first write (it allocates a cluster and
// commits its map key), more than maxDirectSegments runs, an unaligned
// buffer, a volume an administrative change is waiting for. Slow
// requests, Deallocate and Write Zeroes go to the StoreIO's workers, which
// may block; Flush and FUA writes go to the core's sync workers
// (Blocking), which serve them with the synchronous methods.
//
// Why never block a poll group on the volume: an I/O in flight pins its
// volume until its poll group reaps it; a Deallocate waiting to free a
// cluster waits for those pins; were it run on that poll group, or the
// group blocked on the volume behind it, neither would ever go on.
// BeginDirect only tries the lock, and whatever may wait runs elsewhere.
//
// A poll group without a poller (the RDMA binding has none yet; a group
// whose io_uring could not be made) is served as before: every operation
// by a blocking call on its goroutine.

// StoreIOConfig configures a StoreIO; the zero value is the default.
type StoreIOConfig struct {
	// Kind is the disk engine (aio.KindAuto: io_uring where usable, else
	// the worker pool).
	Kind aio.Kind
	// Depth is each poll group's most I/Os at the disk at once
	// (DefaultStoreIODepth); more wait on the StoreIO's workers.
	Depth int
	// Workers serve the requests that may block (DefaultStoreIOWorkers).
	Workers int
}

// Defaults of StoreIOConfig.
const (
	// DefaultStoreIODepth: 256 I/Os per poll group: eight queues at QD32
	// on one core without falling back to the workers; an io_uring of 256
	// entries is ~20 KiB of rings.
	DefaultStoreIODepth = 256
	// DefaultStoreIOWorkers: 4 goroutines for first writes (one cluster
	// allocation and an unsynced map commit each), deallocations and
	// split requests; all four may wait on one volume's allocation lock,
	// so more would only queue there.
	DefaultStoreIOWorkers = 4
	// storeIOQueue bounds the requests waiting for a worker; more get a
	// goroutine each (counted), never a blocked poll group.
	storeIOQueue = 4096
)

// StoreIO is a store's asynchronous I/O service: one disk engine per poll
// group (made on first use) and the workers of the slow path. Make one per
// store, give each volume's namespace StoreIO.Backend(v), and Close it
// after the target and before the store.
type StoreIO struct {
	s    *store.Store
	cfg  StoreIOConfig
	file *aio.File // nil: the area is not a file (tests): blocking path only

	slow     chan slowIO
	stop     chan struct{}
	wg       sync.WaitGroup
	overflow sync.WaitGroup
	closed   atomic.Bool

	requests, direct, zeros, deferred, overflows, engineErrs atomic.Uint64
}

type slowIO struct {
	b  *storeAsync
	io *IO
}

// StoreIOStats count how a StoreIO served its requests.
type StoreIOStats struct {
	Requests   uint64 // reads and writes served through a poll group's engine
	Direct     uint64 // disk I/Os through a poll group's engine (a request split over discontiguous clusters makes several)
	Zeros      uint64 // reads of unwritten clusters, served without the disk
	Deferred   uint64 // requests served by the workers (slow path)
	Overflows  uint64 // of those, served by a goroutine of their own (queue full)
	EngineErrs uint64 // engines that could not be made, submits that failed
}

// NewStoreIO makes the asynchronous I/O service of s.
func NewStoreIO(s *store.Store, cfg StoreIOConfig) (*StoreIO, error) {
	if cfg.Depth == 0 {
		cfg.Depth = DefaultStoreIODepth
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultStoreIOWorkers
	}
	if cfg.Depth < 1 || cfg.Depth > aio.MaxDepth {
		return nil, fmt.Errorf("target: store I/O depth %d outside 1..%d", cfg.Depth, aio.MaxDepth)
	}
	if cfg.Workers < 1 || cfg.Workers > 256 {
		return nil, fmt.Errorf("target: store I/O workers %d outside 1..256", cfg.Workers)
	}
	x := &StoreIO{s: s, cfg: cfg, slow: make(chan slowIO, storeIOQueue), stop: make(chan struct{})}
	if fd, path, ok := s.DirectFD(); ok {
		x.file = aio.Borrow(path, fd)
	}
	x.wg.Add(cfg.Workers)
	for range cfg.Workers {
		go x.work()
	}
	return x, nil
}

// Stats returns the service's counters; any goroutine.
func (x *StoreIO) Stats() StoreIOStats {
	return StoreIOStats{Requests: x.requests.Load(), Direct: x.direct.Load(), Zeros: x.zeros.Load(), Deferred: x.deferred.Load(),
		Overflows: x.overflows.Load(), EngineErrs: x.engineErrs.Load()}
}

// Close stops the workers once they have served what was queued. The
// target must be closed first (its poll groups close their engines).
func (x *StoreIO) Close() {
	if x.closed.Swap(true) {
		return
	}
	close(x.stop)
	x.wg.Wait()
	x.overflow.Wait()
	if x.file != nil {
		x.file.Close() // borrowed: the store closes the descriptor
	}
}

func (x *StoreIO) work() {
	defer x.wg.Done()
	for {
		select {
		case s := <-x.slow:
			s.io.Done(s.b.sync.do(s.io))
		case <-x.stop:
			for {
				select {
				case s := <-x.slow:
					s.io.Done(s.b.sync.do(s.io))
				default:
					return
				}
			}
		}
	}
}

// defer hands io to a worker; it never blocks.
func (x *StoreIO) deferIO(b *storeAsync, io *IO) {
	x.deferred.Add(1)
	if x.closed.Load() {
		io.Done(b.sync.do(io))
		return
	}
	select {
	case x.slow <- slowIO{b, io}:
	default:
		x.overflows.Add(1)
		x.overflow.Add(1)
		go func() {
			defer x.overflow.Done()
			io.Done(b.sync.do(io))
		}()
	}
}

// Backend is v's asynchronous backend (NamespaceConfig.Async).
func (x *StoreIO) Backend(v *store.Volume) AsyncBackend {
	b := &storeAsync{x: x, v: v}
	b.sync = inline{storeBackend{v}}
	b.mk = b.newPoller
	return b
}

type storeAsync struct {
	x    *StoreIO
	v    *store.Volume
	sync inline // the blocking path
	mk   func() (Poller, error)
}

func (b *storeAsync) Geometry() (Geometry, error) { return b.sync.Geometry() }

// TryGeometry implements GeometryTrier: Identify Namespace asks it on a
// poll group, where waiting for the volume could deadlock (see
// store.Volume.TryInfo).
func (b *storeAsync) TryGeometry() (Geometry, bool, error) {
	info, ok, err := b.v.TryInfo()
	if !ok || err != nil {
		return Geometry{}, ok, err
	}
	return storeGeometry(info), true, nil
}

// Blocking: Flush and FUA writes sync the disk; the core runs them on its
// sync workers.
func (b *storeAsync) Blocking() bool            { return true }
func (b *storeAsync) NewWriteGroup() WriteGroup { return nil }

func (b *storeAsync) Submit(io *IO) {
	if io.sync {
		io.Done(b.sync.do(io)) // a sync worker: it may block
		return
	}
	p := io.Poller(b.x, b.mk)
	if p == nil {
		io.Done(b.sync.do(io)) // no engine on this group: as before
		return
	}
	if (io.Op == OpRead || io.Op == OpWrite && !io.FUA) && p.(*storePoller).submit(b.v, io) {
		return
	}
	b.x.deferIO(b, io)
}

// newPoller makes the calling poll group's engine. The key is the
// StoreIO: one engine per group serves every volume of the store.
func (b *storeAsync) newPoller() (Poller, error) {
	x := b.x
	if x.file == nil {
		return nil, errors.New("target: the store's data area is not a file: no asynchronous engine")
	}
	e, err := aio.New(x.file, aio.Config{Kind: x.cfg.Kind, Depth: x.cfg.Depth, Workers: min(x.cfg.Depth, 32)})
	if err != nil {
		x.engineErrs.Add(1)
		return nil, fmt.Errorf("target: store I/O engine: %w", err)
	}
	p := &storePoller{x: x, e: e, slots: make([]pollerSlot, x.cfg.Depth), free: make([]uint32, x.cfg.Depth)}
	for i := range p.free {
		p.free[i] = uint32(len(p.free) - 1 - i)
	}
	return p, nil
}

// storePoller is one poll group's engine and the IOs it has in flight,
// by tag. Its goroutine's only: no lock.
type storePoller struct {
	x      *StoreIO
	e      aio.Engine
	slots  []pollerSlot
	free   []uint32
	queued int
	cs     [64]aio.Completion
	segs   [maxDirectSegments]store.Segment
}

// maxDirectSegments bounds the disk I/Os of one request: 32, a 1 MiB
// transfer over 64 KiB clusters none of which are contiguous is 17;
// more (small clusters, a larger transfer) take the slow path.
const maxDirectSegments = 32

type pollerSlot struct {
	io *IO
	v  *store.Volume
}

// submit starts io (a read or a plain write) at the disk, one I/O per
// physically contiguous run of its clusters, or completes it when the
// store served it already; false: it takes the slow path.
func (p *storePoller) submit(v *store.Volume, io *IO) bool {
	segs := p.segs[:min(len(p.segs), len(p.free))]
	if len(segs) == 0 {
		return false // the engine is full: a worker serves it
	}
	write := io.Op == OpWrite
	n, k, err := v.BeginDirect(write, io.LBA, io.Data, segs)
	switch k {
	case store.DirectSlow:
		return false
	case store.DirectDone:
		if err == nil {
			p.x.zeros.Add(1)
		}
		io.Done(storeError(ioOpOf(write), err))
		return true
	}
	io.parts, io.partErr = 0, nil
	for _, sg := range segs[:n] {
		tag := p.free[len(p.free)-1]
		buf := io.Data[sg.Pos : sg.Pos+sg.Len]
		if write {
			err = p.e.Write(uint64(tag), buf, sg.Off, false)
		} else {
			err = p.e.Read(uint64(tag), buf, sg.Off)
		}
		if err != nil {
			// Not queued (the checks BeginDirect made rule out all but a
			// closed engine): the segments queued before it complete
			// through Poll and carry this error.
			io.partErr = err
			break
		}
		p.free = p.free[:len(p.free)-1]
		p.slots[tag] = pollerSlot{io: io, v: v}
		io.parts++
		p.queued++
	}
	if io.parts == 0 {
		io.Done(storeError(ioOpOf(write), v.EndDirect(write, io.LBA, 0, io.partErr)))
		return true
	}
	p.x.requests.Add(1)
	return true
}

func ioOpOf(write bool) ioOp {
	if write {
		return opWrite
	}
	return opRead
}

// Poll implements Poller: one doorbell for everything queued this pass,
// then the completions.
func (p *storePoller) Poll() bool {
	worked := false
	if p.queued > 0 {
		if err := p.e.Submit(); err != nil {
			// Left in the rings (Arm reports them): the next pass tries
			// again. Counted; a disk that refuses every submit shows here.
			p.x.engineErrs.Add(1)
		} else {
			p.x.direct.Add(uint64(p.queued))
			p.queued = 0
		}
		worked = true
	}
	for {
		n := p.e.Reap(p.cs[:])
		if n == 0 {
			return worked
		}
		worked = true
		for i := range n {
			c := &p.cs[i]
			sl := p.slots[c.Tag]
			p.slots[c.Tag] = pollerSlot{}
			p.free = append(p.free, uint32(c.Tag))
			io := sl.io
			if err := c.Err(); err != nil && io.partErr == nil {
				io.partErr = err
			}
			if io.parts--; io.parts > 0 {
				continue // more segments at the disk
			}
			write := io.Op == OpWrite
			err := sl.v.EndDirect(write, io.LBA, len(io.Data), io.partErr)
			io.partErr = nil
			io.Done(storeError(ioOpOf(write), err))
		}
	}
}

func (p *storePoller) Arm() bool     { return p.queued > 0 || p.e.Arm() }
func (p *storePoller) EventFD() int  { return p.e.EventFD() }
func (p *storePoller) InFlight() int { return p.e.InFlight() }

// Close completes what is in flight (the disk owns those buffers and
// their volumes are pinned), then frees the engine.
func (p *storePoller) Close() {
	for p.e.InFlight() > 0 {
		if !p.Poll() {
			time.Sleep(50 * time.Microsecond)
		}
	}
	p.e.Close()
}
