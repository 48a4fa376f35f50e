package nbd

import (
	"errors"
	"fmt"
	"math"

	"github.com/blk-project/blk/initiator"
)

// Device is what the server exports: a block device of Size bytes in
// blocks of BlockSize bytes. The server calls it from several goroutines
// at once and only with requests it has checked: offsets and lengths are
// multiples of BlockSize, within Size, and lengths are not zero (except
// for ReadAt/WriteAt of length zero, which it does not pass on).
type Device interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Flush makes every write completed before it durable.
	Flush() error
	// Trim discards length bytes at off; they may read back as anything.
	Trim(off, length int64) error
	// WriteZeroes makes length bytes at off read back as zeros.
	WriteZeroes(off, length int64) error
	Size() int64
	// BlockSize is the logical block size: a power of two in [512, 64 KiB].
	BlockSize() int
}

// FUAWriter is an optional extra: a Device that can make one write
// durable by itself (Force Unit Access). Without it, a write with
// NBD_CMD_FLAG_FUA becomes WriteAt then Flush.
type FUAWriter interface {
	WriteAtFUA(p []byte, off int64) (int, error)
}

// ZeroDeallocator is an optional extra: a Device whose deallocated blocks
// read back as zeros. WRITE_ZEROES without NBD_CMD_FLAG_NO_HOLE (the
// client allows a hole) then calls DeallocateZeroes; with NO_HOLE, or
// without this extra, it calls WriteZeroes.
type ZeroDeallocator interface {
	DeallocateZeroes(off, length int64) error
}

// NamespaceDevice exports an initiator Namespace. It implements Device
// and FUAWriter; NVMe errors come back wrapped in the package sentinels
// (alignment and size errors as ErrInvalid, range errors as ErrNoSpace),
// everything else as is (sent as EIO).
func NamespaceDevice(ns *initiator.Namespace) Device { return nsDevice{ns} }

type nsDevice struct{ ns *initiator.Namespace }

func (d nsDevice) Size() int64    { return d.ns.Size() }
func (d nsDevice) BlockSize() int { return d.ns.BlockSize() }

func (d nsDevice) ReadAt(p []byte, off int64) (int, error) {
	n, err := d.ns.ReadAt(p, off)
	return n, nsErr(err)
}

func (d nsDevice) WriteAt(p []byte, off int64) (int, error) {
	n, err := d.ns.WriteAt(p, off)
	return n, nsErr(err)
}

func (d nsDevice) WriteAtFUA(p []byte, off int64) (int, error) {
	n, err := d.ns.WriteAtFlags(p, off, initiator.FUA)
	return n, nsErr(err)
}

func (d nsDevice) Flush() error { return nsErr(d.ns.Flush()) }

// Trim deallocates with Dataset Management, in ranges of at most
// MaxUint32 blocks (a range's block count is 32 bits).
func (d nsDevice) Trim(off, length int64) error {
	lba, blocks, err := d.blocks(off, length)
	if err != nil {
		return err
	}
	for blocks > 0 {
		n := min(blocks, math.MaxUint32)
		if err := d.ns.Deallocate(initiator.Range{LBA: lba, Blocks: uint32(n)}); err != nil {
			return nsErr(err)
		}
		lba += n
		blocks -= n
	}
	return nil
}

func (d nsDevice) WriteZeroes(off, length int64) error {
	lba, blocks, err := d.blocks(off, length)
	if err != nil {
		return err
	}
	return nsErr(d.ns.WriteZeroes(lba, blocks))
}

func (d nsDevice) blocks(off, length int64) (lba, blocks uint64, err error) {
	bs := int64(d.ns.BlockSize())
	if off < 0 || length <= 0 || off%bs != 0 || length%bs != 0 {
		return 0, 0, fmt.Errorf("%w: offset %d, length %d with %d-byte blocks", ErrInvalid, off, length, bs)
	}
	return uint64(off / bs), uint64(length / bs), nil
}

// nsErr wraps initiator errors in the sentinel that picks their NBD
// error value.
func nsErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, initiator.ErrNotAligned), errors.Is(err, initiator.ErrTooLarge),
		errors.Is(err, initiator.ErrNotSupported):
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	case errors.Is(err, initiator.ErrOutOfRange):
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}
