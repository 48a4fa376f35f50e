package target

import (
	"errors"

	"github.com/blk-project/blk/nvme"
)

// storeSentinels names a block store's error sentinels, so that one
// function turns the errors of every store the core is adapted to
// (target/volume's in volume_backend.go, store's in store_backend.go)
// into the status the host gets, by one table:
//
//	outOfRange        LBA Out of Range + DNR
//	misaligned        Data SGL Length Invalid + DNR
//	tooLarge,
//	invalid,
//	wouldLoseData     Invalid Field in Command + DNR
//	notFound          Invalid Namespace or Format + DNR
//	readOnly          Namespace is Write Protected + DNR
//	closed            Namespace Not Ready (retryable: a store reopened
//	                  or a path elsewhere may serve it)
//	noSpace           Capacity Exceeded + DNR (the Linux host: ENOSPC)
//	io                reads and compares: Unrecovered Read Error + DNR;
//	                  writes, write-zeroes, deallocates: Write Fault + DNR;
//	                  flush: Internal Error + DNR (as nvmet's
//	                  blk_to_nvme_status: a failed store stays failed)
//	anything else     Internal Error + DNR (a store's ErrCorrupt too)
//
// An error that already carries a status (a StatusError) keeps it. io is
// tested last: a failed store answers io to everything, and a store error
// wraps exactly one of the others.
type storeSentinels struct {
	outOfRange, misaligned, tooLarge, invalid, wouldLoseData error
	notFound, readOnly, closed, noSpace, io                  error
}

// status is the NVMe status of err, from a store operation op.
func (s *storeSentinels) status(op ioOp, err error) nvme.Status {
	var se StatusError
	switch {
	case errors.As(err, &se):
		return se.NVMeStatus()
	case errors.Is(err, s.outOfRange):
		return nvme.StatusLBAOutOfRange.WithDNR()
	case errors.Is(err, s.misaligned):
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	case errors.Is(err, s.tooLarge), errors.Is(err, s.invalid), errors.Is(err, s.wouldLoseData):
		return nvme.StatusInvalidField.WithDNR()
	case errors.Is(err, s.notFound):
		return nvme.StatusInvalidNamespace.WithDNR()
	case errors.Is(err, s.readOnly):
		return nvme.StatusNamespaceWriteProtect.WithDNR()
	case errors.Is(err, s.closed):
		return nvme.StatusNamespaceNotReady
	case errors.Is(err, s.noSpace):
		return nvme.StatusCapacityExceeded.WithDNR()
	case errors.Is(err, s.io):
		switch op {
		case opRead, opCompare:
			return nvme.StatusUnrecoveredReadError.WithDNR()
		case opWrite, opWriteZeroes, opDeallocate:
			return nvme.StatusWriteFault.WithDNR()
		}
	}
	return nvme.StatusInternalError.WithDNR()
}

// wrap is err, from a store operation op, with its status: what an
// adapter returns. nil stays nil (no allocation on success).
func (s *storeSentinels) wrap(op ioOp, err error) error {
	if err == nil {
		return nil
	}
	return WithStatus(err, s.status(op, err))
}
