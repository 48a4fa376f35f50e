package transport

import "errors"

// Sentinel errors. Each names the NTSTATUS code of ndkpi.h it stands for; a
// provider returns (or wraps with %w) exactly these so that callers can use
// errors.Is.
var (
	// ErrInvalidParameter is STATUS_INVALID_PARAMETER: a size or count
	// above the adapter's limit (C2, Q2, S2), or a malformed argument.
	ErrInvalidParameter = errors.New("transport: invalid parameter (STATUS_INVALID_PARAMETER)")
	// ErrInvalidParameterMix is STATUS_INVALID_PARAMETER_MIX: a
	// combination of arguments that is not allowed (M8).
	ErrInvalidParameterMix = errors.New("transport: invalid parameter mix (STATUS_INVALID_PARAMETER_MIX)")
	// ErrInsufficientResources is STATUS_INSUFFICIENT_RESOURCES: a queue is
	// full or the provider ran out of something (C7, Q4, Q7, S3, S5).
	ErrInsufficientResources = errors.New("transport: insufficient resources (STATUS_INSUFFICIENT_RESOURCES)")
	// ErrNotSupported is STATUS_NOT_SUPPORTED: the provider does not
	// implement the feature (M9; memory windows on providers without them).
	ErrNotSupported = errors.New("transport: not supported (STATUS_NOT_SUPPORTED)")
	// ErrCancelled is STATUS_CANCELLED: the request was flushed because its
	// queue pair was disconnected, closed or put into the error state.
	ErrCancelled = errors.New("transport: request cancelled (STATUS_CANCELLED)")
	// ErrInvalidDeviceState is STATUS_INVALID_DEVICE_STATE: the object is
	// not in a state that allows the call (posting a send on a QP that is
	// not connected, arming a closed CQ).
	ErrInvalidDeviceState = errors.New("transport: invalid device state (STATUS_INVALID_DEVICE_STATE)")
	// ErrAccessViolation is STATUS_ACCESS_VIOLATION: a memory access was
	// refused: unknown or invalidated key, out of the region's bounds, or
	// without the needed access right. Locally detected violations fail the
	// post; remote ones complete the request with this status and put the
	// connection in error.
	ErrAccessViolation = errors.New("transport: access violation (STATUS_ACCESS_VIOLATION)")
	// ErrBufferTooSmall is STATUS_BUFFER_TOO_SMALL: an incoming message was
	// longer than the receive buffer that it consumed.
	ErrBufferTooSmall = errors.New("transport: receive buffer too small (STATUS_BUFFER_TOO_SMALL)")
	// ErrConnectionRefused is STATUS_CONNECTION_REFUSED: the peer rejected
	// the connection (its private data is in a *RejectError) or nothing
	// listens at the address.
	ErrConnectionRefused = errors.New("transport: connection refused (STATUS_CONNECTION_REFUSED)")
	// ErrConnectionReset is STATUS_CONNECTION_RESET: the connection failed:
	// the peer sent a Terminate, the byte stream broke, or a protocol rule
	// was violated. Requests outstanding at that moment complete with
	// ErrCancelled; the request that caused it (if any) with its own error.
	ErrConnectionReset = errors.New("transport: connection reset (STATUS_CONNECTION_RESET)")
	// ErrDisconnected is STATUS_CONNECTION_DISCONNECTED: the connection was
	// closed in an orderly way by either side.
	ErrDisconnected = errors.New("transport: disconnected (STATUS_CONNECTION_DISCONNECTED)")
	// ErrIOTimeout is STATUS_IO_TIMEOUT: connection establishment did not
	// finish in time.
	ErrIOTimeout = errors.New("transport: timed out (STATUS_IO_TIMEOUT)")
	// ErrCQOverflow is STATUS_INTERNAL_ERROR reported to a CQ's
	// notification callback: more completions arrived than the CQ holds
	// (C3). The CQ is in error afterwards and the QPs using it fail.
	ErrCQOverflow = errors.New("transport: completion queue overrun (STATUS_INTERNAL_ERROR)")
	// ErrClosed is STATUS_FILE_CLOSED: the object was closed.
	ErrClosed = errors.New("transport: object closed (STATUS_FILE_CLOSED)")
)

// RejectError is returned by a connect that the peer rejected. It matches
// ErrConnectionRefused with errors.Is and carries the peer's private data.
type RejectError struct {
	PrivateData []byte
}

func (e *RejectError) Error() string {
	return "transport: connection rejected by peer (STATUS_CONNECTION_REFUSED)"
}

// Is makes errors.Is(err, ErrConnectionRefused) true.
func (e *RejectError) Is(target error) bool { return target == ErrConnectionRefused }
