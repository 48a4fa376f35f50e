package volume

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// Volume is the handle of one volume. Its methods are safe for concurrent
// use by any number of goroutines; each I/O takes the volume's lock in
// shared mode only, to exclude the administrative calls (Resize, SetState,
// Delete, Store.Close) that change what the request is checked against.
type Volume struct {
	s  *Store
	id ID

	mu    sync.RWMutex // R: every request; W: Resize, SetState, Delete, Close
	info  Info         // guarded by mu
	shift uint8        // log2(info.BlockSize), guarded by mu
	gone  error        // nil, or ErrNotFound after Delete, ErrClosed after Close; guarded by mu
	gen   uint64       // bumped by every change of info or gone, guarded by mu (WriteGroup)

	c counters
}

// WriteFlags modify a write.
type WriteFlags uint8

const (
	// FUA (force unit access): the write is durable when it is
	// acknowledged, as if a Flush covering it had completed.
	FUA WriteFlags = 1 << iota
)

func newVolume(s *Store, info Info) *Volume {
	v := &Volume{s: s, id: info.ID}
	v.setInfo(info)
	return v
}

// setInfo replaces the volume's Info. Requires v.mu held for writing (or
// v not yet shared).
func (v *Volume) setInfo(info Info) {
	v.info = info
	v.gen++
	v.shift = uint8(bits.TrailingZeros32(info.BlockSize))
}

// ID returns the volume's ID.
func (v *Volume) ID() ID { return v.id }

// Info returns the volume's current description.
func (v *Volume) Info() (Info, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.gone != nil {
		return Info{}, fmt.Errorf("volume %d: %w", v.id, v.gone)
	}
	return v.info, nil
}

// op names a request kind in errors.
type op uint8

const (
	opRead op = iota
	opWrite
	opWriteZeroes
	opDeallocate
	opFlush
)

func (o op) String() string {
	return [...]string{"read", "write", "write-zeroes", "deallocate", "flush"}[o]
}

// check validates a request of length bytes (data requests) or n blocks
// (length < 0: write-zeroes and deallocate) at lba, and returns the
// number of blocks. Requires v.mu held for reading.
func (v *Volume) check(o op, lba uint64, length int, n uint64) (uint64, error) {
	if v.gone != nil {
		return 0, v.fail(o, lba, v.gone)
	}
	if err := v.s.err(); err != nil {
		return 0, v.fail(o, lba, err)
	}
	if length >= 0 {
		if length&(int(v.info.BlockSize)-1) != 0 {
			return 0, v.fail(o, lba, fmt.Errorf("%d bytes: %w", length, ErrMisaligned))
		}
		if length > v.s.cfg.MaxTransferBytes {
			return 0, v.fail(o, lba, fmt.Errorf("%d bytes, maximum %d: %w",
				length, v.s.cfg.MaxTransferBytes, ErrTooLarge))
		}
		n = uint64(length) >> v.shift
	}
	if blocks := v.info.Blocks(); lba > blocks || n > blocks-lba {
		return 0, v.fail(o, lba, fmt.Errorf("%d blocks, capacity %d: %w", n, blocks, ErrOutOfRange))
	}
	if o != opRead && v.info.State == StateReadOnly && n > 0 {
		return 0, v.fail(o, lba, fmt.Errorf("volume state %v: %w", v.info.State, ErrReadOnly))
	}
	if o != opRead && v.s.cfg.ReadOnly && n > 0 {
		return 0, v.fail(o, lba, fmt.Errorf("store opened read-only: %w", ErrReadOnly))
	}
	if o == opWrite && n > 0 && v.s.noSpace.Load() {
		return 0, v.fail(o, lba, fmt.Errorf("%d bytes free, reserve %d: %w", v.s.freeBytes.Load(), v.s.reserve.Load(), ErrNoSpace))
	}
	return n, nil
}

// fail counts a failed request and wraps its error with the request.
func (v *Volume) fail(o op, lba uint64, err error) error {
	v.c.errors.Add(1)
	return fmt.Errorf("volume %d: %v at LBA %d: %w", v.id, o, lba, err)
}

// Read fills buf with the blocks starting at lba: len(buf) must be a
// multiple of the block size and at most Config.MaxTransferBytes. Blocks
// never written (or written with zeroes, or deallocated) read as zeros.
// Each byte of buf is written exactly once, either by one copy from
// pebble's block cache or memtable, or by clearing.
//
// A multi-block read sees one point in time: a write that covers it is
// either wholly visible or not at all. A zero-length buf is a no-op (lba
// is still checked against the capacity).
func (v *Volume) Read(lba uint64, buf []byte) error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	n, err := v.check(opRead, lba, len(buf), 0)
	if err != nil || n == 0 {
		return err
	}
	sc := v.s.scratch.Get().(*scratch)
	defer v.s.scratch.Put(sc)
	var copied uint64
	if n == 1 {
		copied, err = v.readOne(sc, lba, buf)
	} else {
		shift := v.shift
		err = v.visit(sc, lba, n, func(i uint64, val []byte) {
			dst := buf[i<<shift : (i+1)<<shift]
			if val == nil {
				clear(dst)
			} else {
				copied += uint64(copy(dst, val))
			}
		})
	}
	v.c.copiedBytes.Add(copied)
	if err != nil {
		return v.fail(opRead, lba, err)
	}
	v.c.reads.Add(1)
	v.c.readBytes.Add(uint64(len(buf)))
	return nil
}

// readOne reads one block and returns the bytes it copied. It uses a
// bounded iterator rather than DB.Get, which costs the same but allocates
// on every lookup that reaches an sstable (pebble's obsolete-points
// filter is appended to a slice Get gives no room; visit gives it one).
func (v *Volume) readOne(sc *scratch, lba uint64, buf []byte) (uint64, error) {
	var copied uint64
	err := v.visit(sc, lba, 1, func(_ uint64, val []byte) {
		if val == nil {
			clear(buf)
		} else {
			copied = uint64(copy(buf, val))
		}
	})
	return copied, err
}

// visit calls fn once for each block i in [0, n) of the range starting at
// lba, in LBA order, with the block's data, or nil for a block that reads
// as zeros. val is pebble's own memory and is valid only during the call.
// The whole range is read from one pebble iterator, so from one snapshot.
// Requires v.mu held for reading and the range checked.
func (v *Volume) visit(sc *scratch, lba, n uint64, fn func(i uint64, val []byte)) error {
	putDataKey(sc.lo[:], v.id, lba)
	putDataKey(sc.hi[:], v.id, lba+n)
	sc.iter = pebble.IterOptions{LowerBound: sc.lo[:], UpperBound: sc.hi[:], PointKeyFilters: sc.filters[:0]}
	it, err := v.s.db.NewIter(&sc.iter)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrIO, err)
	}
	bs := int(v.info.BlockSize)
	next := uint64(0) // first block index not yet passed to fn
	for valid := it.First(); valid; valid = it.Next() {
		l, ok := dataKeyLBA(it.Key(), v.id)
		if !ok || l < lba+next || l >= lba+n {
			_ = it.Close()
			return fmt.Errorf("key %x outside the request's range: %w", it.Key(), ErrCorrupt)
		}
		val, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("%w: %w", ErrIO, err)
		}
		if len(val) != bs {
			_ = it.Close()
			return fmt.Errorf("block %d of %d bytes, want %d: %w", l, len(val), bs, ErrCorrupt)
		}
		for ; next < l-lba; next++ {
			fn(next, nil)
		}
		fn(next, val)
		next++
	}
	// An iterator that stopped on an error must not be read as "no more
	// blocks": that would turn a failed read into zeros.
	if err := it.Close(); err != nil {
		return fmt.Errorf("%w: %w", ErrIO, err)
	}
	for ; next < n; next++ {
		fn(next, nil)
	}
	return nil
}

// View calls fn for each of the n blocks starting at lba, in LBA order,
// with the block's data straight from pebble (its block cache or memtable),
// or nil for a block that reads as zeros. data is only valid during the
// call and must not be modified. This is the read path without a copy,
// for a caller that only needs to look at the data (hash it, send it from
// memory pebble owns). All blocks come from one snapshot. n is bounded
// like a Read of n blocks. fn must not call back into the store.
func (v *Volume) View(lba, n uint64, fn func(lba uint64, data []byte)) error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	bytes := -1
	if n <= uint64(v.s.cfg.MaxTransferBytes) { // cannot overflow once shifted
		bytes = int(n << v.shift)
	}
	if bytes < 0 {
		return v.fail(opRead, lba, fmt.Errorf("%d blocks: %w", n, ErrTooLarge))
	}
	if _, err := v.check(opRead, lba, bytes, 0); err != nil || n == 0 {
		return err
	}
	sc := v.s.scratch.Get().(*scratch)
	defer v.s.scratch.Put(sc)
	if err := v.visit(sc, lba, n, func(i uint64, val []byte) { fn(lba+i, val) }); err != nil {
		return v.fail(opRead, lba, err)
	}
	v.c.reads.Add(1)
	v.c.readBytes.Add(uint64(bytes))
	return nil
}

// Write writes data to the blocks starting at lba: len(data) must be a
// multiple of the block size and at most Config.MaxTransferBytes. The
// whole write is one pebble batch, so it is atomic: after a crash, or to a
// concurrent reader, it is either wholly present or wholly absent, and of
// two overlapping writes every block ends with the same one. data is
// copied once, straight into the batch, and not retained.
//
// Without FUA the write is acknowledged once it is in pebble's memtable
// and queued for the WAL: it is durable (against a crash of the process
// or of the machine) after the next Flush, or once the background syncer
// has synced it, within Config.SyncInterval (doc.go, "Durability
// contract"). With FUA it is durable on return. A zero-length write is a
// no-op.
func (v *Volume) Write(lba uint64, data []byte, flags WriteFlags) error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	n, err := v.check(opWrite, lba, len(data), 0)
	if err != nil || n == 0 {
		return err
	}
	bs := int(v.info.BlockSize)
	b := v.s.db.NewBatchWithSize(batchBytes(int(n), bs), v.s.batchOpts...)
	for i := range n {
		d := b.SetDeferred(dataKeyLen, bs)
		putDataKey(d.Key, v.id, lba+i)
		copy(d.Value, data[i<<v.shift:])
		_ = d.Finish() // a non-indexed batch: Finish has nothing to do
	}
	if err := v.s.commit(b, flags&FUA != 0); err != nil {
		return v.fail(opWrite, lba, err)
	}
	v.c.writes.Add(1)
	v.c.writeBytes.Add(uint64(len(data)))
	v.c.copiedBytes.Add(uint64(len(data)))
	if flags&FUA != 0 {
		v.c.fua.Add(1)
	}
	return nil
}

// WriteZeroes makes the n blocks starting at lba read as zeros, by
// removing them: thin provisioning means zeros cost no space. With FUA the
// change is durable on return. n may be any count up to the capacity: no
// data moves, so MaxTransferBytes does not apply. n zero is a no-op.
func (v *Volume) WriteZeroes(lba, n uint64, flags WriteFlags) error {
	return v.remove(opWriteZeroes, lba, n, flags)
}

// Deallocate (NVMe Dataset Management, deallocate; SCSI UNMAP; "trim")
// releases the n blocks starting at lba. Deallocated blocks read as zeros,
// which the target advertises (DLFEAT). Durable as a plain write: after
// the next Flush, or within Config.SyncInterval.
func (v *Volume) Deallocate(lba, n uint64) error {
	return v.remove(opDeallocate, lba, n, 0)
}

// remove deletes the keys of n blocks at lba: one point deletion per block
// up to Config.PointDeleteMaxBlocks, else one range deletion. doc.go says
// why.
func (v *Volume) remove(o op, lba, n uint64, flags WriteFlags) error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if _, err := v.check(o, lba, -1, n); err != nil || n == 0 {
		return err
	}
	var b *pebble.Batch
	if n <= uint64(v.s.cfg.PointDeleteMaxBlocks) {
		b = v.s.db.NewBatchWithSize(deleteBatchBytes(int(n)), v.s.batchOpts...)
		for i := range n {
			d := b.DeleteDeferred(dataKeyLen)
			putDataKey(d.Key, v.id, lba+i)
			_ = d.Finish()
		}
	} else {
		b = v.s.db.NewBatchWithSize(rangeDeleteBatchBytes, v.s.batchOpts...)
		d := b.DeleteRangeDeferred(dataKeyLen, dataKeyLen)
		putDataKey(d.Key, v.id, lba)
		putDataKey(d.Value, v.id, lba+n)
		_ = d.Finish()
	}
	if err := v.s.commit(b, flags&FUA != 0); err != nil {
		return v.fail(o, lba, err)
	}
	if o == opWriteZeroes {
		v.c.writeZeroes.Add(1)
	} else {
		v.c.deallocates.Add(1)
	}
	v.c.removedBlocks.Add(n)
	return nil
}

// Flush makes every write to this volume that was acknowledged before the
// call durable. The WAL is shared by the store, so it makes every other
// volume's acknowledged writes durable too; if nothing was written since
// the last flush, it costs nothing.
func (v *Volume) Flush() error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.gone != nil {
		return v.fail(opFlush, 0, v.gone)
	}
	if err := v.s.err(); err != nil {
		return v.fail(opFlush, 0, err)
	}
	if v.s.cfg.ReadOnly {
		v.c.flushes.Add(1)
		return nil // nothing can have been written
	}
	if err := v.s.flush(); err != nil {
		return v.fail(opFlush, 0, err)
	}
	v.c.flushes.Add(1)
	return nil
}

// counters are a volume's request counters, since the store was opened.
type counters struct {
	reads, writes, fua, writeZeroes, deallocates, flushes, errors atomic.Uint64
	readBytes, writeBytes, removedBlocks, copiedBytes             atomic.Uint64
}

// Stats are a volume's counters and space use.
type Stats struct {
	// Requests completed successfully since the store was opened.
	Reads, Writes, FUAWrites, WriteZeroes, Deallocates, Flushes uint64
	// Errors counts requests that failed, for any reason.
	Errors uint64
	// ReadBytes and WriteBytes are the data moved by successful requests.
	ReadBytes, WriteBytes uint64
	// RemovedBlocks is the blocks named by successful WriteZeroes and
	// Deallocate requests (whether or not they were allocated).
	RemovedBlocks uint64
	// CopiedBytes is the data this package copied between callers' buffers
	// and pebble: one copy per byte written or read with Read, none for
	// View. CopiedBytes/(ReadBytes+WriteBytes) is the copies per byte.
	CopiedBytes uint64

	// AllocatedBytes is the exact space the volume's data takes before
	// pebble's compression: written blocks × block size. It is counted by
	// walking the volume's keys, so Stats costs time in proportion to the
	// blocks written: call it for Identify (NVMe NUSE) or an operator, not
	// per request.
	AllocatedBytes uint64
	// DiskBytes is pebble's estimate of the on-disk bytes of the volume's
	// sstables (compressed, excluding what is still only in the memtable
	// and WAL).
	DiskBytes uint64
}

// keysWalked counts the keys Stats has walked, process-wide: the guard
// that Counters (the metrics path) walks none.
var keysWalked atomic.Uint64

// Counters returns the volume's counters and DiskBytes without walking
// its keys (AllocatedBytes is left 0): cheap enough for every metrics
// scrape, whatever the volume holds.
func (v *Volume) Counters() (Stats, error) { return v.stats(false) }

// Stats returns the volume's counters and walks its keys for its space use.
func (v *Volume) Stats() (Stats, error) { return v.stats(true) }

// stats is Counters, and with walk the AllocatedBytes that need a walk of
// the volume's keys.
func (v *Volume) stats(walk bool) (Stats, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.gone != nil {
		return Stats{}, fmt.Errorf("volume %d: stats: %w", v.id, v.gone)
	}
	if err := v.s.err(); err != nil {
		return Stats{}, fmt.Errorf("volume %d: stats: %w", v.id, err)
	}
	st := Stats{
		Reads:         v.c.reads.Load(),
		Writes:        v.c.writes.Load(),
		FUAWrites:     v.c.fua.Load(),
		WriteZeroes:   v.c.writeZeroes.Load(),
		Deallocates:   v.c.deallocates.Load(),
		Flushes:       v.c.flushes.Load(),
		Errors:        v.c.errors.Load(),
		ReadBytes:     v.c.readBytes.Load(),
		WriteBytes:    v.c.writeBytes.Load(),
		RemovedBlocks: v.c.removedBlocks.Load(),
		CopiedBytes:   v.c.copiedBytes.Load(),
	}
	var lo, hi [dataKeyLen]byte
	putDataKey(lo[:], v.id, 0)
	putDataEnd(hi[:], v.id)
	if walk {
		it, err := v.s.db.NewIter(&pebble.IterOptions{LowerBound: lo[:], UpperBound: hi[:]})
		if err != nil {
			return Stats{}, fmt.Errorf("volume %d: stats: %w: %w", v.id, ErrIO, err)
		}
		var blocks uint64
		for valid := it.First(); valid; valid = it.Next() {
			blocks++
		}
		keysWalked.Add(blocks)
		if err := it.Close(); err != nil {
			return Stats{}, fmt.Errorf("volume %d: stats: %w: %w", v.id, ErrIO, err)
		}
		st.AllocatedBytes = blocks * uint64(v.info.BlockSize)
	}
	var err error
	if st.DiskBytes, err = v.s.db.EstimateDiskUsage(lo[:], hi[:]); err != nil {
		return Stats{}, fmt.Errorf("volume %d: stats: %w: %w", v.id, ErrIO, err)
	}
	return st, nil
}
