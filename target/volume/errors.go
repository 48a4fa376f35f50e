package volume

import "errors"

// Sentinel errors. Every error this package returns wraps exactly one of
// them (ErrIO also wraps the underlying pebble or filesystem error), so the
// NVMe target can turn any error into a status code in one function with
// errors.Is. The status each is meant to become is noted beside it.
var (
	// ErrOutOfRange: the LBA range extends past the volume's last block.
	// NVMe: LBA Out of Range (SCT 0, SC 0x80).
	ErrOutOfRange = errors.New("volume: LBA range out of range")
	// ErrMisaligned: a data buffer whose length is not a whole number of
	// the volume's blocks. NVMe: Data SGL Length Invalid (0x0F) or
	// Invalid Field in Command (0x02).
	ErrMisaligned = errors.New("volume: buffer not a multiple of the block size")
	// ErrTooLarge: a transfer longer than Config.MaxTransferBytes.
	// NVMe: Invalid Field in Command (0x02); the target advertises MDTS
	// so that a well-behaved host never sends one.
	ErrTooLarge = errors.New("volume: transfer larger than the maximum")
	// ErrNotFound: no volume with that ID (never created, or deleted).
	// NVMe: Invalid Namespace or Format (0x0B).
	ErrNotFound = errors.New("volume: no such volume")
	// ErrExists: Create with an ID that is already in use.
	// NVMe (namespace management): Namespace ID Unavailable (SCT 1, 0x16).
	ErrExists = errors.New("volume: volume already exists")
	// ErrReadOnly: a write to a read-only volume or a store opened
	// read-only. NVMe: Namespace is Write Protected (0x20).
	ErrReadOnly = errors.New("volume: read-only")
	// ErrClosed: the store (and with it every volume handle) is closed.
	// NVMe: Namespace Not Ready (0x82) or Command Aborted.
	ErrClosed = errors.New("volume: store closed")
	// ErrIO: pebble or the filesystem failed. The request may or may not
	// have reached storage, and the store claims nothing about it: a write
	// that returns ErrIO is not acknowledged. After a failed WAL write or
	// sync the store stays failed and every later request returns ErrIO
	// until it is closed and reopened. NVMe: Internal Error (0x06), Write
	// Fault (SCT 2, 0x80) or Unrecovered Read Error (SCT 2, 0x81).
	ErrIO = errors.New("volume: I/O error")
	// ErrInvalid: a bad argument to an administrative call: block size,
	// volume size, state. NVMe: Invalid Field in Command (0x02).
	ErrInvalid = errors.New("volume: invalid argument")
	// ErrWouldLoseData: shrinking a volume that holds data past the new
	// size, without force. NVMe: Invalid Field in Command (0x02).
	ErrWouldLoseData = errors.New("volume: shrink would discard written blocks")
	// ErrNoSpace: the filesystem's free space is under the store's
	// reserve (Config.ReserveBytes): writes are refused until space
	// returns; reads go on. NVMe: Capacity Exceeded (0x81) + DNR, which
	// the Linux host reports as ENOSPC.
	ErrNoSpace = errors.New("volume: no space left for writes")
	// ErrCorrupt: the store holds a key or value this package did not
	// write. NVMe: Internal Error (0x06).
	ErrCorrupt = errors.New("volume: store corrupt")
)
