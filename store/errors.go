package store

import "errors"

// Sentinel errors. Every error this package returns wraps exactly one of
// them (ErrIO also wraps the underlying pebble or data-area error), so the
// caller (the target's backend adapter) turns any error into an NVMe status
// in one function with errors.Is. The status each is meant to become is
// noted beside it.
var (
	// ErrOutOfRange: the LBA range extends past the volume's last block.
	// NVMe: LBA Out of Range (0x80).
	ErrOutOfRange = errors.New("store: LBA range out of range")
	// ErrMisaligned: a buffer whose length is not a whole number of blocks.
	// NVMe: Data SGL Length Invalid (0x0F).
	ErrMisaligned = errors.New("store: buffer not a multiple of the block size")
	// ErrTooLarge: a transfer above Config.MaxTransferBytes. NVMe: Invalid
	// Field in Command (0x02).
	ErrTooLarge = errors.New("store: transfer larger than the maximum")
	// ErrNotFound: no volume with that ID. NVMe: Invalid Namespace or
	// Format (0x0B).
	ErrNotFound = errors.New("store: no such volume")
	// ErrExists: Create of an ID in use. NVMe: Namespace ID Unavailable.
	ErrExists = errors.New("store: volume already exists")
	// ErrReadOnly: a write to a read-only volume or store. NVMe: Namespace
	// is Write Protected (0x20).
	ErrReadOnly = errors.New("store: read-only")
	// ErrClosed: the store is closed. NVMe: Namespace Not Ready (0x82).
	ErrClosed = errors.New("store: closed")
	// ErrIO: pebble or the data area failed. A write that returns it is
	// not acknowledged. After a failed sync of the data area or of pebble's
	// WAL the store stays failed (every request returns ErrIO) until it is
	// reopened. NVMe: Internal Error, Write Fault or Unrecovered Read Error.
	ErrIO = errors.New("store: I/O error")
	// ErrInvalid: a bad argument (size, block size, state, config). NVMe:
	// Invalid Field in Command (0x02).
	ErrInvalid = errors.New("store: invalid argument")
	// ErrWouldLoseData: a shrink over written clusters without force.
	ErrWouldLoseData = errors.New("store: shrink would discard written blocks")
	// ErrNoSpace: a write needs a new cluster and the data area has none
	// free. Overwrites of allocated clusters never get it. NVMe: Capacity
	// Exceeded (0x81) + DNR, ENOSPC at a Linux host.
	ErrNoSpace = errors.New("store: no free cluster in the data area")
	// ErrCorrupt: the store holds a key, value or area header this package
	// did not write, or a map that names a cluster twice. NVMe: Internal
	// Error (0x06).
	ErrCorrupt = errors.New("store: corrupt")
	// ErrHasChildren: deleting a snapshot that two or more objects read
	// through (its volume and a clone, say): one of them must be deleted
	// or flattened first. NVMe: none (administrative).
	ErrHasChildren = errors.New("store: snapshot has children")
	// ErrNotAncestor: Changes between objects of which the first is not an
	// ancestor of the second.
	ErrNotAncestor = errors.New("store: not an ancestor")
	// ErrInUse: the data device is mounted, held by a device mapper or md
	// array, or open exclusively by another process (Open only).
	ErrInUse = errors.New("store: data device in use")
	// ErrNotBlank: creating a store on a data device that holds data (a
	// filesystem, a partition table, another blk store...) without
	// Config.WipeDevice (Open only).
	ErrNotBlank = errors.New("store: data device holds data")
)
