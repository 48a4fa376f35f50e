package csi

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// blkd's errors carry their registry sentinel only as text (its
// metaError writes the message, the status says the class). These are
// the stable substrings grpcCode tells the 409s apart by; the table test
// against a real blkd (errors_test.go) pins each, so a reworded message
// fails a test, not a cluster.
const (
	msgVolumeExists     = "volume name already in use"          // meta.ErrVolumeExists
	msgNQNInUse         = "subsystem NQN already in use"        // meta.ErrNQNInUse
	msgSnapshotExists   = "snapshot name already in use"        // meta.ErrSnapshotExists
	msgBusy             = "volume is busy"                      // meta.ErrBusy
	msgStaleEpoch       = "stale epoch"                         // meta.ErrStaleEpoch
	msgHasSnapshots     = "volume has snapshots"                // meta.ErrHasSnapshots
	msgHasClones        = "snapshot has clones"                 // meta.ErrHasClones
	msgHasChildren      = "snapshot is the base of more than"   // meta.ErrHasChildren
	msgHasConnections   = "volume has live connections"         // meta.ErrHasConnections
	msgNoPlacement      = "not enough nodes up to place"        // meta.ErrNoPlacement
	msgAlreadyConnected = "host already connected through node" // meta.ErrAlreadyConnected
	msgNotConnected     = "no such connection"                  // meta.ErrNotConnected
	msgNotOnline        = "volume is not online"                // meta.ErrVolumeNotOnline
	msgDeleting         = "volume is being deleted"             // meta.ErrVolumeDeleting
	msgSnapshotNotReady = "snapshot is not ready"               // meta.ErrSnapshotNotReady
	msgNodeNotUp        = "node is not up"                      // meta.ErrNodeNotUp
	msgFeatureMissing   = "lacks a feature the command needs"   // meta/control.ErrFeatureMissing
	msgUnknownVolume    = "unknown volume"                      // meta.ErrUnknownVolume
	msgUnknownSnapshot  = "unknown snapshot"                    // meta.ErrUnknownSnapshot
	msgHostNotAllowed   = "host is not allowed on volume"       // meta.ErrHostNotAllowed
)

// is reports whether err is blkd's answer status with msg in its text.
func is(err error, status int, msg string) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Status == status && strings.Contains(ae.Msg, msg)
}

// grpcCode translates an error of a blkd call into the gRPC code the CSI
// spec asks for, in one place (docs/operations.md §1.2.1). Errors that
// are not blkd's answers: a context's end is DeadlineExceeded or
// Canceled, anything else (blkd unreachable) Unavailable, which the
// sidecars retry.
func grpcCode(err error) codes.Code {
	var ae *apiError
	if !errors.As(err, &ae) {
		switch {
		case err == nil:
			return codes.OK
		case errors.Is(err, context.DeadlineExceeded):
			return codes.DeadlineExceeded
		case errors.Is(err, context.Canceled):
			return codes.Canceled
		}
		return codes.Unavailable
	}
	switch s := ae.Status; {
	case s == http.StatusBadRequest:
		return codes.InvalidArgument
	case s == http.StatusUnauthorized:
		return codes.Unauthenticated
	case s == http.StatusForbidden && strings.Contains(ae.Msg, msgHostNotAllowed):
		return codes.FailedPrecondition
	case s == http.StatusForbidden:
		return codes.PermissionDenied
	case s == http.StatusNotFound:
		return codes.NotFound
	case s == http.StatusConflict:
		return conflictCode(ae.Msg)
	case s == http.StatusNotImplemented:
		return codes.Unimplemented
	case s == http.StatusServiceUnavailable, s == http.StatusMisdirectedRequest, s == http.StatusBadGateway, s == http.StatusGatewayTimeout:
		return codes.Unavailable
	case s == http.StatusInsufficientStorage:
		return codes.ResourceExhausted
	}
	return codes.Internal
}

// conflictCode tells blkd's 409s apart by their message.
func conflictCode(msg string) codes.Code {
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(msg, s) {
				return true
			}
		}
		return false
	}
	switch {
	case has(msgVolumeExists, msgNQNInUse, msgSnapshotExists, msgAlreadyConnected):
		return codes.AlreadyExists
	case has(msgNoPlacement):
		return codes.ResourceExhausted
	case has(msgBusy, msgStaleEpoch, msgSnapshotNotReady):
		// Something else is under way on the object: retry later.
		return codes.Aborted
	case has(msgNodeNotUp):
		return codes.Unavailable
	}
	// Has snapshots, clones or connections, not online, being deleted, a
	// feature missing: the object is not in the state the call needs.
	return codes.FailedPrecondition
}

// rpcError is err as the gRPC status of a failed call: its code from
// grpcCode, its text prefixed with what was being done.
func rpcError(err error, what string) error {
	if _, ok := status.FromError(err); ok && err != nil {
		return err
	}
	return status.Errorf(grpcCode(err), "%s: %v", what, err)
}
