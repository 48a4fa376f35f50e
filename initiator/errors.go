package initiator

import (
	"errors"
	"fmt"

	"github.com/blk-project/blk/nvme"
)

// Sentinel errors. Errors returned by this package wrap them with context;
// match with errors.Is.
var (
	// ErrConnectionLost: the association with the controller failed (QP
	// gone, keep-alive unanswered, timeout, protocol error) while the
	// command was in flight, or the controller is reconnecting. Commands
	// that fail with it were not necessarily executed — or may have been.
	// The controller is reconnecting; retrying later may succeed.
	ErrConnectionLost = errors.New("initiator: connection to controller lost")
	// ErrControllerLost: the controller could not be reconnected within
	// CtrlLossTimeout, or a reconnect was refused with Do Not Retry. It is
	// permanent: the Controller only fails from then on.
	ErrControllerLost = errors.New("initiator: controller lost")
	// ErrClosed: the Controller was closed.
	ErrClosed = errors.New("initiator: controller closed")
	// ErrQueueFull: an asynchronous submission found every I/O queue at
	// its depth. The blocking calls wait instead.
	ErrQueueFull = errors.New("initiator: every I/O queue is full")
	// ErrNotAligned: an offset or length is not a multiple of the
	// namespace's block size.
	ErrNotAligned = errors.New("initiator: offset or length not block aligned")
	// ErrOutOfRange: the blocks lie (partly) beyond the namespace's size.
	ErrOutOfRange = errors.New("initiator: beyond the end of the namespace")
	// ErrTooLarge: an asynchronous transfer longer than the controller's
	// MaxTransfer, or too many ranges (the blocking calls split instead).
	ErrTooLarge = errors.New("initiator: transfer too large for one command")
	// ErrNotSupported: the controller does not support the command
	// (Identify ONCS), or the namespace was removed.
	ErrNotSupported = errors.New("initiator: not supported by the controller")
	// ErrNamespaceRemoved: the namespace is no longer active on the
	// controller (a rescan did not find it) or the controller is lost.
	ErrNamespaceRemoved = errors.New("initiator: namespace removed")
	// ErrProtocol: the controller broke the NVMe-oF protocol (bad
	// response capsule, unknown command identifier, a required Identify
	// field missing). During Connect it fails the connect; later it fails
	// the association.
	ErrProtocol = errors.New("initiator: protocol error")
	// ErrAuthRequired: the controller requires in-band authentication
	// and the host has no secret, or the exchange failed (wrong secret,
	// a controller that failed to prove its own).
	ErrAuthRequired = errors.New("initiator: authentication failed")
	// ErrInvalidConfig: a Config field or relationship is invalid.
	ErrInvalidConfig = errors.New("initiator: invalid configuration")
)

// StatusError is a command that the controller completed with an error
// status. Match it with errors.As; its Status carries SCT, SC, DNR, More.
type StatusError struct {
	// Command names the command ("Connect", "Identify", "Read", ...).
	Command string
	// QID is the queue the command ran on.
	QID uint16
	// Status is the completion's status field.
	Status nvme.Status
	// DW0 is the completion's command-specific result (for Connect
	// Invalid Parameters: IPO and IATTR).
	DW0 uint32
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("initiator: %s on queue %d failed: %v (SCT %d SC %#02x)",
		e.Command, e.QID, e.Status, e.Status.SCT(), e.Status.SC())
	if e.Command == "Connect" && e.Status.Code() == nvme.StatusConnectInvalidParameters {
		ipo, inData := nvme.ConnectInvalidParam(e.DW0)
		where := "command"
		if inData {
			where = "data"
		}
		s += fmt.Sprintf(", invalid parameter at %s offset %d", where, ipo)
	}
	return s
}

// DNR reports the Do Not Retry bit of the status.
func (e *StatusError) DNR() bool { return e.Status.DNR() }

// statusError builds the error of a failed command (the error path only:
// it allocates).
func statusError(command string, qid uint16, cqe *nvme.Completion) error {
	return &StatusError{Command: command, QID: qid, Status: cqe.Status, DW0: cqe.DW0}
}

// lostError is the error every in-flight command of a failed association
// completes with: one value per failure, shared, so that failing a deep
// queue allocates once. It matches ErrConnectionLost and its cause.
type lostError struct {
	cause error
}

func (e *lostError) Error() string {
	return "initiator: connection to controller lost: " + e.cause.Error()
}

func (e *lostError) Unwrap() []error { return []error{ErrConnectionLost, e.cause} }

// isConnectDNR reports whether err is a Connect command refused with Do Not
// Retry, which stops reconnecting (Linux: nvmf_should_reconnect).
func isConnectDNR(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Command == "Connect" && se.Status.DNR()
}
