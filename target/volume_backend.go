package target

import (
	"errors"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target/volume"
)

// The volume adapter: the one file of the target that knows the volume
// store. It calls a volume for each backend operation and translates the
// volume's errors into NVMe status (volumeStatus), as nvmet's
// io-cmd-bdev.c does for a block device with blk_to_nvme_status; the core
// only reads the status back (statusOf).

// VolumeBackend adapts a target/volume Volume. Its errors carry the NVMe
// status volumeStatus gives them and still wrap the volume's.
func VolumeBackend(v *volume.Volume) Backend { return volumeBackend{v} }

type volumeBackend struct{ v *volume.Volume }

// ioOp is the operation a volume error came from: I/O errors become
// media errors of the matching direction.
type ioOp uint8

const (
	opRead ioOp = iota
	opWrite
	opWriteZeroes
	opDeallocate
	opFlush
	opCompare
)

// volumeErrors are volume's sentinels, translated by storeSentinels'
// table (store_errors.go): the only place where volume errors become
// status codes.
var volumeErrors = storeSentinels{
	outOfRange: volume.ErrOutOfRange, misaligned: volume.ErrMisaligned, tooLarge: volume.ErrTooLarge,
	invalid: volume.ErrInvalid, wouldLoseData: volume.ErrWouldLoseData, notFound: volume.ErrNotFound,
	readOnly: volume.ErrReadOnly, closed: volume.ErrClosed, noSpace: volume.ErrNoSpace, io: volume.ErrIO,
}

// volumeStatus is the NVMe status of err, from a volume operation op.
func volumeStatus(op ioOp, err error) nvme.Status { return volumeErrors.status(op, err) }

// volumeError is err, from a volume operation op, with its status: what the
// adapter returns. nil stays nil (no allocation on success).
func volumeError(op ioOp, err error) error { return volumeErrors.wrap(op, err) }

// Geometry implements Backend. Its error is not a command's: returned as
// the volume gave it.
func (b volumeBackend) Geometry() (Geometry, error) {
	info, err := b.v.Info()
	if err != nil {
		return Geometry{}, err
	}
	return Geometry{BlockSize: info.BlockSize, Blocks: info.Blocks(), ReadOnly: info.State == volume.StateReadOnly}, nil
}

func (b volumeBackend) Read(lba uint64, buf []byte) error {
	return volumeError(opRead, b.v.Read(lba, buf))
}

func (b volumeBackend) Write(lba uint64, data []byte, fua bool) error {
	var f volume.WriteFlags
	if fua {
		f = volume.FUA
	}
	return volumeError(opWrite, b.v.Write(lba, data, f))
}

func (b volumeBackend) WriteZeroes(lba, n uint64, fua bool) error {
	var f volume.WriteFlags
	if fua {
		f = volume.FUA
	}
	return volumeError(opWriteZeroes, b.v.WriteZeroes(lba, n, f))
}

func (b volumeBackend) Deallocate(lba, n uint64) error {
	return volumeError(opDeallocate, b.v.Deallocate(lba, n))
}

func (b volumeBackend) Flush() error { return volumeError(opFlush, b.v.Flush()) }

// View implements Viewer (the core uses it for Compare).
func (b volumeBackend) View(lba, n uint64, fn func(lba uint64, data []byte)) error {
	return volumeError(opCompare, b.v.View(lba, n, fn))
}

// NewWriteGroup implements Backend: one pebble batch per commit.
func (b volumeBackend) NewWriteGroup() WriteGroup { return &volumeGroup{g: b.v.NewWriteGroup()} }

// volumeGroup adapts a volume's WriteGroup: its errors translated, and
// the volume's ErrGroupFull turned into the target's.
type volumeGroup struct{ g *volume.WriteGroup }

func (g *volumeGroup) Add(lba uint64, data []byte) error {
	err := g.g.Add(lba, data)
	if errors.Is(err, volume.ErrGroupFull) {
		return ErrGroupFull
	}
	return volumeError(opWrite, err)
}

func (g *volumeGroup) Commit() error { return volumeError(opWrite, g.g.Commit()) }

func (g *volumeGroup) Len() int { return g.g.Len() }
