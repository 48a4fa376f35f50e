package target

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error the package returns wraps one of them, so
// callers test with errors.Is. They are also the reasons given to
// Responder.Disconnect.
var (
	// ErrClosed: the target is closed.
	ErrClosed = errors.New("target: closed")
	// ErrExists: a port, subsystem, namespace or host that is already
	// there.
	ErrExists = errors.New("target: already exists")
	// ErrNotFound: no such port, subsystem, namespace or host.
	ErrNotFound = errors.New("target: not found")
	// ErrInvalid: a bad argument or configuration.
	ErrInvalid = errors.New("target: invalid argument")

	// ErrKeepAliveExpired: no Keep Alive within the controller's
	// keep-alive timeout; the controller was torn down.
	ErrKeepAliveExpired = errors.New("target: keep-alive timeout expired")
	// ErrDiscoveryIdle: a discovery controller sent nothing after its
	// Connect within Config.DiscoveryIdleTimeout; it was torn down.
	ErrDiscoveryIdle = errors.New("target: discovery controller idle since its Connect")
	// ErrAdminQueueClosed: the controller's admin queue closed; the
	// controller was torn down.
	ErrAdminQueueClosed = errors.New("target: admin queue closed")
	// ErrConnectTimeout: no Connect succeeded on the queue within
	// Config.ConnectTimeout; its connection is dropped.
	ErrConnectTimeout = errors.New("target: no Connect in time")
	// ErrControllerRemoved: the controller was torn down by the target
	// (its subsystem removed, its host denied, or the target closed).
	ErrControllerRemoved = errors.New("target: controller removed")
)

// Why the target removed a controller: the reasons given to
// Responder.Disconnect, each wrapping ErrControllerRemoved.
var (
	errHostRevoked      = fmt.Errorf("%w: host access revoked", ErrControllerRemoved)
	errAuthNowRequired  = fmt.Errorf("%w: the host must now authenticate (DH-HMAC-CHAP secrets set)", ErrControllerRemoved)
	errSubsystemRemoved = fmt.Errorf("%w: subsystem removed", ErrControllerRemoved)
	errTargetClosed     = fmt.Errorf("%w: target closed", ErrControllerRemoved)
)
