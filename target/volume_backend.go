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

// volumeStatus turns an error of a volume operation into the NVMe status
// the host gets. It is the only place where volume errors become status
// codes; volume/errors.go says what each sentinel is meant to become:
//
//	ErrOutOfRange     LBA Out of Range + DNR
//	ErrMisaligned     Data SGL Length Invalid + DNR
//	ErrTooLarge       Invalid Field in Command + DNR
//	ErrNotFound       Invalid Namespace or Format + DNR
//	ErrReadOnly       Namespace is Write Protected + DNR
//	ErrClosed         Namespace Not Ready (retryable: a store reopened
//	                  or a path elsewhere may serve it)
//	ErrIO             reads and compares: Unrecovered Read Error + DNR;
//	                  writes, write-zeroes, deallocates: Write Fault + DNR;
//	                  flush: Internal Error + DNR (as nvmet's
//	                  blk_to_nvme_status: a failed store stays failed)
//	ErrInvalid,
//	ErrWouldLoseData  Invalid Field in Command + DNR
//	ErrCorrupt        Internal Error + DNR
//	ErrNoSpace        Capacity Exceeded + DNR (the Linux host: ENOSPC)
//	anything else     Internal Error + DNR
//
// An error that already carries a status (a StatusError) keeps it.
func volumeStatus(op ioOp, err error) nvme.Status {
	var se StatusError
	switch {
	case errors.As(err, &se):
		return se.NVMeStatus()
	case errors.Is(err, volume.ErrOutOfRange):
		return nvme.StatusLBAOutOfRange.WithDNR()
	case errors.Is(err, volume.ErrMisaligned):
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	case errors.Is(err, volume.ErrTooLarge), errors.Is(err, volume.ErrInvalid),
		errors.Is(err, volume.ErrWouldLoseData):
		return nvme.StatusInvalidField.WithDNR()
	case errors.Is(err, volume.ErrNotFound):
		return nvme.StatusInvalidNamespace.WithDNR()
	case errors.Is(err, volume.ErrReadOnly):
		return nvme.StatusNamespaceWriteProtect.WithDNR()
	case errors.Is(err, volume.ErrClosed):
		return nvme.StatusNamespaceNotReady
	case errors.Is(err, volume.ErrNoSpace):
		return nvme.StatusCapacityExceeded.WithDNR()
	case errors.Is(err, volume.ErrIO):
		switch op {
		case opRead, opCompare:
			return nvme.StatusUnrecoveredReadError.WithDNR()
		case opWrite, opWriteZeroes, opDeallocate:
			return nvme.StatusWriteFault.WithDNR()
		}
		return nvme.StatusInternalError.WithDNR()
	}
	return nvme.StatusInternalError.WithDNR()
}

// volumeError is err, from a volume operation op, with its status: what
// the adapter returns. nil stays nil (no allocation on success).
func volumeError(op ioOp, err error) error {
	if err == nil {
		return nil
	}
	return WithStatus(err, volumeStatus(op, err))
}

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
