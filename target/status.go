package target

import (
	"errors"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target/volume"
)

// StatusError is implemented by backend errors that carry their own NVMe
// status (fault injection, backends that are not volumes). statusOf
// returns it unchanged, before looking for a volume sentinel.
type StatusError interface {
	error
	NVMeStatus() nvme.Status
}

// ioOp is the kind of backend request an error came from: I/O errors
// become media errors of the matching direction.
type ioOp uint8

const (
	opRead ioOp = iota
	opWrite
	opWriteZeroes
	opDeallocate
	opFlush
	opCompare
	opGeometry
)

// statusOf turns a backend error into the NVMe status the host gets. It is
// the only place where errors become status codes; volume/errors.go says
// what each volume sentinel is meant to become:
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
// It allocates nothing for a nil error.
func statusOf(op ioOp, err error) nvme.Status {
	if err == nil {
		return nvme.StatusSuccess
	}
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
