package nbd

import (
	"errors"
	"syscall"
)

// Sentinel errors. A Device returns errors wrapping them (or a
// syscall.Errno) to choose the NBD error value a client sees; anything
// else is EIO. Match with errors.Is.
var (
	// ErrInvalid: the request is malformed for the device (unaligned,
	// too large, unsupported). Sent as EINVAL.
	ErrInvalid = errors.New("nbd: invalid request")
	// ErrNoSpace: a write beyond the end of the device, or the device
	// is out of space. Sent as ENOSPC.
	ErrNoSpace = errors.New("nbd: no space")
	// ErrReadOnly: a write, trim or write-zeroes to a read-only device.
	// Sent as EPERM.
	ErrReadOnly = errors.New("nbd: read-only device")
	// ErrProtocol: the peer broke the NBD protocol (bad magic, short
	// stream, unknown client flags); the connection is closed.
	ErrProtocol = errors.New("nbd: protocol error")
	// ErrClosed: the Server was closed.
	ErrClosed = errors.New("nbd: server closed")
	// ErrNoModule: the nbd kernel module is not loaded (no /dev/nbd0).
	ErrNoModule = errors.New("nbd kernel module not loaded: modprobe nbd")
	// ErrInvalidConfig: a Config field or relationship is invalid.
	ErrInvalidConfig = errors.New("nbd: invalid configuration")
)

// errnoOf translates a device error into the NBD error value of a simple
// reply: the one place errors become wire values.
func errnoOf(err error) uint32 {
	var en syscall.Errno
	switch {
	case err == nil:
		return errnoOK
	case errors.Is(err, ErrInvalid):
		return errnoEINVAL
	case errors.Is(err, ErrNoSpace):
		return errnoENOSPC
	case errors.Is(err, ErrReadOnly):
		return errnoEPERM
	case errors.As(err, &en):
		switch en {
		case syscall.EPERM, syscall.EROFS, syscall.EACCES:
			return errnoEPERM
		case syscall.EINVAL, syscall.EOPNOTSUPP:
			return errnoEINVAL
		case syscall.ENOSPC, syscall.EFBIG:
			return errnoENOSPC
		case syscall.ENOMEM:
			return errnoENOMEM
		}
	}
	return errnoEIO
}
