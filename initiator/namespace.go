package initiator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/blk-project/blk/nvme"
)

// Namespace is one namespace of a controller: a block device of Blocks()
// blocks of BlockSize() bytes. It stays valid across reconnects (I/O then
// goes to the new association); a rescan updates its size.
//
// Two ways to do I/O:
//
//   - Asynchronous (ReadAsync, WriteAsync, FlushAsync, WriteZeroesAsync,
//     DeallocateAsync): one command each, at most MaxTransfer bytes, to the
//     next I/O queue with a free slot (round robin). When every queue is
//     at its depth the call returns ErrQueueFull at once; while the
//     controller reconnects it returns an error matching
//     ErrConnectionLost at once (fail fast: the caller decides whether to
//     wait, e.g. with WaitLive). It allocates nothing in the steady state.
//   - Blocking (ReadAt, WriteAt, Flush/Sync, WriteZeroes, Deallocate):
//     split into commands at MaxTransfer (up to 32 in flight per call);
//     they wait for free slots, and wait out a reconnect (at most
//     CtrlLossTimeout), resubmitting commands that failed with
//     ErrConnectionLost up to 5 times (like Linux's nvme_max_retries).
//
// Offsets and lengths must be multiples of BlockSize (ErrNotAligned).
type Namespace struct {
	c    *Controller
	id   uint32
	info atomic.Pointer[nsInfo]
}

type nsInfo struct {
	blocks    uint64
	blockSize int
	shift     uint
	removed   bool
}

var (
	_ io.ReaderAt = (*Namespace)(nil)
	_ io.WriterAt = (*Namespace)(nil)
)

func (ns *Namespace) set(id nsIdentity) {
	ns.info.Store(&nsInfo{
		blocks:    id.Blocks,
		blockSize: id.BlockSize,
		shift:     uint(bits.TrailingZeros(uint(id.BlockSize))),
	})
}

func (ns *Namespace) markRemoved() {
	if old := ns.info.Load(); old != nil && !old.removed {
		n := *old
		n.removed = true
		ns.info.Store(&n)
	}
}

// ID is the namespace identifier (NSID).
func (ns *Namespace) ID() uint32 { return ns.id }

// Controller returns the namespace's controller.
func (ns *Namespace) Controller() *Controller { return ns.c }

// BlockSize is the size of a logical block in bytes (2^LBADS).
func (ns *Namespace) BlockSize() int { return ns.info.Load().blockSize }

// Blocks is the namespace size in logical blocks (NSZE).
func (ns *Namespace) Blocks() uint64 { return ns.info.Load().blocks }

// Size is the namespace size in bytes.
func (ns *Namespace) Size() int64 {
	i := ns.info.Load()
	return int64(i.blocks) << i.shift
}

// Removed reports whether the namespace is gone (see ErrNamespaceRemoved).
func (ns *Namespace) Removed() bool { return ns.info.Load().removed }

// IOFlags modify a write.
type IOFlags uint8

const (
	// FUA (Force Unit Access): the write is durable when it completes,
	// even with a volatile write cache.
	FUA IOFlags = 1 << 0
)

// Range is a run of blocks for Deallocate.
type Range struct {
	LBA    uint64
	Blocks uint32
}

// blocksFor checks a transfer of n bytes at block lba and returns its
// block count.
func (inf *nsInfo) blocksFor(lba uint64, n int) (uint32, error) {
	if inf.removed {
		return 0, ErrNamespaceRemoved
	}
	if n <= 0 || n&(inf.blockSize-1) != 0 {
		return 0, fmt.Errorf("%w: %d bytes with %d-byte blocks", ErrNotAligned, n, inf.blockSize)
	}
	nb := uint64(n) >> inf.shift
	if err := inf.inRange(lba, nb); err != nil {
		return 0, err
	}
	return uint32(nb), nil
}

func (inf *nsInfo) inRange(lba, nb uint64) error {
	if lba >= inf.blocks || nb > inf.blocks-lba {
		return fmt.Errorf("%w: blocks [%d, +%d) of %d", ErrOutOfRange, lba, nb, inf.blocks)
	}
	return nil
}

// acquireIO takes a slot on one of the association's I/O queues, round
// robin: the first queue with a free slot; when all are full, ErrQueueFull
// (block false) or a wait on the next queue in turn (block true).
func (c *Controller) acquireIO(a *association, block bool) (*queue, *slot, error) {
	n := uint32(len(a.io))
	if n == 0 {
		return nil, nil, fmt.Errorf("%w: no I/O queues", ErrNotSupported)
	}
	start := c.rr.Add(1)
	for i := uint32(0); i < n; i++ {
		q := a.io[(start+i)%n]
		if s := q.tryAcquire(); s != nil {
			return q, s, nil
		}
	}
	if !block {
		c.st.queueFull.Add(1)
		return nil, nil, ErrQueueFull
	}
	q := a.io[start%n]
	s, err := q.acquire(context.Background())
	return q, s, err
}

// ReadAsync reads len(buf) bytes from block lba into buf (at most
// MaxTransfer bytes, a multiple of the block size). buf must not be
// touched until cb runs; the data is copied into it just before.
func (ns *Namespace) ReadAsync(lba uint64, buf []byte, cb Callback) error {
	return ns.rwAsync(nvme.IORead, lba, buf, 0, cb)
}

// WriteAsync writes buf to block lba (at most MaxTransfer bytes, a
// multiple of the block size). buf is copied before WriteAsync returns and
// may be reused at once. With FUA the data is durable on completion.
func (ns *Namespace) WriteAsync(lba uint64, buf []byte, flags IOFlags, cb Callback) error {
	return ns.rwAsync(nvme.IOWrite, lba, buf, flags, cb)
}

func (ns *Namespace) rwAsync(op nvme.IOOpcode, lba uint64, buf []byte, flags IOFlags, cb Callback) error {
	blocks, err := ns.info.Load().blocksFor(lba, len(buf))
	if err != nil {
		return err
	}
	a, err := ns.c.liveAssoc()
	if err != nil {
		return err
	}
	if len(buf) > a.maxXfer {
		return fmt.Errorf("%w: %d bytes, MaxTransfer %d", ErrTooLarge, len(buf), a.maxXfer)
	}
	q, s, err := ns.c.acquireIO(a, false)
	if err != nil {
		return err
	}
	return ns.submitRW(q, s, op, lba, blocks, buf, flags, cb)
}

// submitRW fills a Read or Write into slot s and submits it.
func (ns *Namespace) submitRW(q *queue, s *slot, op nvme.IOOpcode, lba uint64, blocks uint32, buf []byte, flags IOFlags, cb Callback) error {
	rwCmd(&s.cmd, op, ns.id, lba, blocks, flags&FUA != 0)
	s.cb = cb
	dir := nvme.DirCtrlToHost
	if op == nvme.IOWrite {
		copy(s.data, buf)
		dir = nvme.DirHostToCtrl
	} else {
		s.dst = buf
	}
	return q.submit(s, dir, len(buf), q.timeout)
}

// FlushAsync commits the volatile write cache (Flush).
func (ns *Namespace) FlushAsync(cb Callback) error {
	if ns.info.Load().removed {
		return ErrNamespaceRemoved
	}
	a, err := ns.c.liveAssoc()
	if err != nil {
		return err
	}
	q, s, err := ns.c.acquireIO(a, false)
	if err != nil {
		return err
	}
	flushCmd(&s.cmd, ns.id)
	s.cb = cb
	return q.submit(s, nvme.DirNone, 0, q.timeout)
}

// WriteZeroesAsync zeroes blocks blocks from lba (at most 65536), if the
// controller supports Write Zeroes (ONCS bit 3; else ErrNotSupported).
func (ns *Namespace) WriteZeroesAsync(lba uint64, blocks uint32, cb Callback) error {
	inf := ns.info.Load()
	if err := ns.checkZeroes(inf, lba, blocks); err != nil {
		return err
	}
	a, err := ns.c.liveAssoc()
	if err != nil {
		return err
	}
	if a.id.ONCS&oncsWriteZeroes == 0 {
		return fmt.Errorf("%w: Write Zeroes (ONCS %#x)", ErrNotSupported, a.id.ONCS)
	}
	q, s, err := ns.c.acquireIO(a, false)
	if err != nil {
		return err
	}
	writeZeroesCmd(&s.cmd, ns.id, lba, blocks, false)
	s.cb = cb
	return q.submit(s, nvme.DirNone, 0, q.timeout)
}

func (ns *Namespace) checkZeroes(inf *nsInfo, lba uint64, blocks uint32) error {
	switch {
	case inf.removed:
		return ErrNamespaceRemoved
	case blocks == 0:
		return fmt.Errorf("%w: zero blocks", ErrNotAligned)
	case blocks > maxWriteZeroesBlocks:
		return fmt.Errorf("%w: %d blocks, Write Zeroes takes at most %d", ErrTooLarge, blocks, maxWriteZeroesBlocks)
	}
	return inf.inRange(lba, uint64(blocks))
}

// DeallocateAsync deallocates (discards) the ranges (at most 256) with
// Dataset Management, attribute Deallocate, if the controller supports it
// (ONCS bit 2; else ErrNotSupported). The ranges are copied before it
// returns.
func (ns *Namespace) DeallocateAsync(ranges []Range, cb Callback) error {
	inf := ns.info.Load()
	if err := ns.checkRanges(inf, ranges); err != nil {
		return err
	}
	a, err := ns.c.liveAssoc()
	if err != nil {
		return err
	}
	if a.id.ONCS&oncsDSM == 0 {
		return fmt.Errorf("%w: Dataset Management (ONCS %#x)", ErrNotSupported, a.id.ONCS)
	}
	q, s, err := ns.c.acquireIO(a, false)
	if err != nil {
		return err
	}
	return ns.submitDSM(q, s, ranges, cb)
}

func (ns *Namespace) checkRanges(inf *nsInfo, ranges []Range) error {
	switch {
	case inf.removed:
		return ErrNamespaceRemoved
	case len(ranges) == 0:
		return fmt.Errorf("%w: no ranges", ErrNotAligned)
	case len(ranges) > maxDSMRanges:
		return fmt.Errorf("%w: %d ranges, Dataset Management takes at most %d", ErrTooLarge, len(ranges), maxDSMRanges)
	}
	for _, r := range ranges {
		if r.Blocks == 0 {
			return fmt.Errorf("%w: empty range at %d", ErrNotAligned, r.LBA)
		}
		if err := inf.inRange(r.LBA, uint64(r.Blocks)); err != nil {
			return err
		}
	}
	return nil
}

// submitDSM writes the range list into the slot (16 bytes a range: in the
// capsule when it fits, else RDMA-READ by the controller) and submits.
func (ns *Namespace) submitDSM(q *queue, s *slot, ranges []Range, cb Callback) error {
	dsmCmd(&s.cmd, ns.id, len(ranges))
	for i, r := range ranges {
		putDSMRange(s.data[i*dsmRangeSize:], r.LBA, r.Blocks)
	}
	s.cb = cb
	return q.submit(s, nvme.DirHostToCtrl, len(ranges)*dsmRangeSize, q.timeout)
}

// Blocking calls.

const (
	// batchParts is the most commands one blocking call has in flight.
	batchParts = 32
	// maxRetries is how often a blocking call resubmits a command that
	// failed with ErrConnectionLost (Linux: nvme_max_retries, 5).
	maxRetries = 5
)

// batch tracks the commands of one blocking call in flight: pooled, so a
// blocking call allocates nothing in the steady state either.
type batch struct {
	pending atomic.Int32
	done    chan struct{}
	parts   [batchParts]part
	lens    [batchParts]int
}

type part struct {
	b   *batch
	err error
}

func (p *part) IODone(err error) {
	p.err = err
	if p.b.pending.Add(-1) == 0 {
		p.b.done <- struct{}{}
	}
}

var batchPool = sync.Pool{New: func() any {
	b := &batch{done: make(chan struct{}, 1)}
	for i := range b.parts {
		b.parts[i].b = b
	}
	return b
}}

// ReadAt reads len(p) bytes at byte offset off (io.ReaderAt); off and
// len(p) must be multiples of BlockSize. Reading past the end returns
// what lies before it and io.EOF.
func (ns *Namespace) ReadAt(p []byte, off int64) (int, error) {
	inf := ns.info.Load()
	if err := inf.checkBytes(off, len(p)); err != nil {
		return 0, err
	}
	size := int64(inf.blocks) << inf.shift
	if off >= size {
		return 0, io.EOF
	}
	want, eof := p, false
	if int64(len(p)) > size-off {
		want, eof = p[:size-off], true
	}
	n, err := ns.transfer(nvme.IORead, want, off, 0)
	if err == nil && eof {
		err = io.EOF
	}
	return n, err
}

// WriteAt writes p at byte offset off (io.WriterAt); off and len(p) must
// be multiples of BlockSize and lie within the namespace (else
// ErrOutOfRange, nothing written).
func (ns *Namespace) WriteAt(p []byte, off int64) (int, error) {
	return ns.WriteAtFlags(p, off, 0)
}

// WriteAtFlags is WriteAt with IOFlags (FUA) on every command.
func (ns *Namespace) WriteAtFlags(p []byte, off int64, flags IOFlags) (int, error) {
	inf := ns.info.Load()
	if err := inf.checkBytes(off, len(p)); err != nil {
		return 0, err
	}
	if err := inf.inRange(uint64(off)>>inf.shift, uint64(len(p))>>inf.shift); err != nil && len(p) > 0 {
		return 0, err
	}
	return ns.transfer(nvme.IOWrite, p, off, flags)
}

func (inf *nsInfo) checkBytes(off int64, n int) error {
	if inf.removed {
		return ErrNamespaceRemoved
	}
	if off < 0 || off&int64(inf.blockSize-1) != 0 || n&(inf.blockSize-1) != 0 {
		return fmt.Errorf("%w: offset %d, length %d with %d-byte blocks", ErrNotAligned, off, n, inf.blockSize)
	}
	return nil
}

// transfer moves p at byte offset off in commands of at most MaxTransfer,
// up to batchParts at once. It returns the bytes done from the start
// (commands after a failed one are not counted, even if they succeeded).
func (ns *Namespace) transfer(op nvme.IOOpcode, p []byte, off int64, flags IOFlags) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	b := batchPool.Get().(*batch)
	defer batchPool.Put(b)
	done, retries := 0, 0
	for done < len(p) {
		a, err := ns.c.waitLive(context.Background())
		if err != nil {
			return done, err
		}
		inf := ns.info.Load()
		if inf.removed {
			return done, ErrNamespaceRemoved
		}
		chunk := a.maxXfer &^ (inf.blockSize - 1)
		b.pending.Store(1) // held while submitting
		k, pos := 0, done
		var subErr error
		for k < batchParts && pos < len(p) {
			n := min(chunk, len(p)-pos)
			q, s, err := ns.c.acquireIO(a, true)
			if err != nil {
				subErr = err
				break
			}
			pt := &b.parts[k]
			pt.err = nil
			b.pending.Add(1)
			lba := uint64(off+int64(pos)) >> inf.shift
			if err := ns.submitRW(q, s, op, lba, uint32(n>>inf.shift), p[pos:pos+n], flags, pt); err != nil {
				b.pending.Add(-1)
				subErr = err
				break
			}
			b.lens[k] = n
			k++
			pos += n
		}
		if b.pending.Add(-1) != 0 {
			<-b.done
		}
		err = subErr
		for i := 0; i < k; i++ {
			if b.parts[i].err != nil {
				err = b.parts[i].err
				break
			}
			done += b.lens[i]
		}
		if err == nil {
			continue
		}
		if errors.Is(err, ErrConnectionLost) && retries < maxRetries {
			retries++
			continue
		}
		return done, err
	}
	return done, nil
}

// syncCmd runs one non-data-path command (Flush, Write Zeroes, Dataset
// Management) on an I/O queue and waits, retrying like transfer.
func (ns *Namespace) syncCmd(build func(a *association, q *queue, s *slot) error) error {
	for retries := 0; ; retries++ {
		a, err := ns.c.waitLive(context.Background())
		if err != nil {
			return err
		}
		q, s, err := ns.c.acquireIO(a, true)
		if err == nil {
			w := &waiter{ch: make(chan error, 1)}
			s.cb = w
			if err = build(a, q, s); err == nil {
				err = <-w.ch
			}
		}
		if err == nil || !errors.Is(err, ErrConnectionLost) || retries >= maxRetries {
			return err
		}
	}
}

// Flush commits the volatile write cache to media and waits.
func (ns *Namespace) Flush() error {
	if ns.Removed() {
		return ErrNamespaceRemoved
	}
	return ns.syncCmd(func(a *association, q *queue, s *slot) error {
		flushCmd(&s.cmd, ns.id)
		return q.submit(s, nvme.DirNone, 0, q.timeout)
	})
}

// Sync is Flush (os.File's name for it).
func (ns *Namespace) Sync() error { return ns.Flush() }

// WriteZeroes zeroes blocks blocks from lba, in commands of at most 65536
// blocks, and waits.
func (ns *Namespace) WriteZeroes(lba, blocks uint64) error {
	inf := ns.info.Load()
	if inf.removed {
		return ErrNamespaceRemoved
	}
	if err := inf.inRange(lba, blocks); err != nil {
		return err
	}
	for blocks > 0 {
		n := uint32(min(blocks, maxWriteZeroesBlocks))
		err := ns.syncCmd(func(a *association, q *queue, s *slot) error {
			if a.id.ONCS&oncsWriteZeroes == 0 {
				q.abandon(s)
				return fmt.Errorf("%w: Write Zeroes (ONCS %#x)", ErrNotSupported, a.id.ONCS)
			}
			writeZeroesCmd(&s.cmd, ns.id, lba, n, false)
			return q.submit(s, nvme.DirNone, 0, q.timeout)
		})
		if err != nil {
			return err
		}
		lba += uint64(n)
		blocks -= uint64(n)
	}
	return nil
}

// Deallocate discards the ranges, 256 per command, and waits.
func (ns *Namespace) Deallocate(ranges ...Range) error {
	inf := ns.info.Load()
	for len(ranges) > 0 {
		part := ranges[:min(len(ranges), maxDSMRanges)]
		ranges = ranges[len(part):]
		if err := ns.checkRanges(inf, part); err != nil {
			return err
		}
		err := ns.syncCmd(func(a *association, q *queue, s *slot) error {
			if a.id.ONCS&oncsDSM == 0 {
				q.abandon(s)
				return fmt.Errorf("%w: Dataset Management (ONCS %#x)", ErrNotSupported, a.id.ONCS)
			}
			return ns.submitDSM(q, s, part, s.cb)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// WaitLive waits until the controller is live (returns nil), lost or
// closed (returns why), or ctx ends.
func (c *Controller) WaitLive(ctx context.Context) error {
	_, err := c.waitLive(ctx)
	return err
}
