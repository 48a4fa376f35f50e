package target

import (
	"errors"

	"github.com/blk-project/blk/nvme"
)

// StatusError is implemented by backend errors that carry their NVMe
// status. A backend adapter translates its own errors into them, in one
// function, as nvmet's io-cmd-bdev.c does with blk_to_nvme_status: the
// store adapter's is storeStatus (store_backend.go), MemBackend's
// errors carry theirs, fault injection makes its own.
type StatusError interface {
	error
	NVMeStatus() nvme.Status
}

// WithStatus returns err carrying the status st (a StatusError), or nil
// for a nil err; errors.Is and errors.As still see err through it. It is
// how a backend adapter hands the core a translated error.
func WithStatus(err error, st nvme.Status) error {
	if err == nil {
		return nil
	}
	return &statusError{err: err, st: st}
}

type statusError struct {
	err error
	st  nvme.Status
}

func (e *statusError) Error() string           { return e.err.Error() }
func (e *statusError) Unwrap() error           { return e.err }
func (e *statusError) NVMeStatus() nvme.Status { return e.st }

// statusOf turns a backend error into the NVMe status the host gets: the
// status of the first StatusError in its chain, or Internal Error + DNR
// for an error no adapter translated. The core knows no storage's errors:
// each backend adapter translates its own. It allocates nothing for a nil
// error.
func statusOf(err error) nvme.Status {
	if err == nil {
		return nvme.StatusSuccess
	}
	var se StatusError
	if errors.As(err, &se) {
		return se.NVMeStatus()
	}
	return nvme.StatusInternalError.WithDNR()
}
