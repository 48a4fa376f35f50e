package csi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/blk-project/blk/api"
	"google.golang.org/grpc/codes"
)

const testHost = "nqn.2014-08.org.nvmexpress:uuid:6d1f3c2a-2b4e-4f7a-9c1d-7e5a2b9c0d42"

// TestGRPCCodeAgainstBlkd provokes each error answer the controller
// relies on from a real blkd and checks its status, the stable substring
// grpcCode matches (errors.go) and the gRPC code it becomes
// (docs/operations.md §1.2.1): a reworded blkd message fails here.
func TestGRPCCodeAgainstBlkd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs blkd")
	}
	c, err := newBlkAPI(startBlkd(t), "", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	size := func(n uint64) *api.Size { s := api.Size(n); return &s }
	must := func(method, path string, body any) {
		t.Helper()
		if err := c.do(ctx, method, path, body, nil); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	must("POST", "/v1/volumes", api.CreateVolumeRequest{Name: "v", Size: size(64 << 20)})
	must("POST", "/v1/volumes", api.CreateVolumeRequest{Name: "w", Size: size(64 << 20)})
	must("POST", "/v1/volumes/v/snapshots", api.SnapshotRequest{Name: "s"})
	must("POST", "/v1/volumes/v/snapshots/s/clone", api.CloneRequest{Name: "clone"})
	must("POST", "/v1/volumes/w/hosts", api.HostRequest{HostNQN: testHost})
	must("POST", "/v1/volumes/w/attach", api.HostRequest{HostNQN: testHost})

	for _, tc := range []struct {
		name         string
		method, path string
		body         any
		status       int
		msg          string // "" when the status alone decides
		code         codes.Code
	}{
		{"bad block size", "POST", "/v1/volumes", api.CreateVolumeRequest{Name: "x", Size: size(1 << 20), BlockSize: 1000}, 400, "", codes.InvalidArgument},
		{"unknown volume", "GET", "/v1/volumes/nosuch", nil, 404, msgUnknownVolume, codes.NotFound},
		{"unknown snapshot", "GET", "/v1/volumes/v/snapshots/nosuch", nil, 404, msgUnknownSnapshot, codes.NotFound},
		{"volume exists", "POST", "/v1/volumes", api.CreateVolumeRequest{Name: "v", Size: size(64 << 20)}, 409, msgVolumeExists, codes.AlreadyExists},
		{"clone name in use", "POST", "/v1/volumes/v/snapshots/s/clone", api.CloneRequest{Name: "w"}, 409, msgVolumeExists, codes.AlreadyExists},
		{"snapshot exists", "POST", "/v1/volumes/v/snapshots", api.SnapshotRequest{Name: "s"}, 409, msgSnapshotExists, codes.AlreadyExists},
		{"has snapshots", "DELETE", "/v1/volumes/v", nil, 409, msgHasSnapshots, codes.FailedPrecondition},
		{"has clones", "DELETE", "/v1/volumes/v/snapshots/s", nil, 409, msgHasClones, codes.FailedPrecondition},
		{"has connections", "DELETE", "/v1/volumes/w", nil, 409, msgHasConnections, codes.FailedPrecondition},
		{"already attached", "POST", "/v1/volumes/w/attach", api.HostRequest{HostNQN: testHost}, 409, msgAlreadyConnected, codes.AlreadyExists},
		{"not attached", "POST", "/v1/volumes/v/detach", api.HostRequest{HostNQN: testHost}, 409, msgNotConnected, codes.FailedPrecondition},
		{"host not allowed", "POST", "/v1/volumes/v/attach", api.HostRequest{HostNQN: testHost}, 403, msgHostNotAllowed, codes.FailedPrecondition},
		{"no placement", "POST", "/v1/volumes", api.CreateVolumeRequest{Name: "r3", Size: size(64 << 20), Replicas: 3}, 409, msgNoPlacement, codes.ResourceExhausted},
		{"no capacity", "POST", "/v1/volumes", api.CreateVolumeRequest{Name: "huge", Size: size(1 << 50)}, 507, "", codes.ResourceExhausted},
		{"shrink", "POST", "/v1/volumes/w/resize", api.ResizeRequest{Size: size(4096)}, 400, "", codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.do(ctx, tc.method, tc.path, tc.body, nil)
			if statusOf(err) != tc.status || !is(err, tc.status, tc.msg) {
				t.Fatalf("%s %s: %v; want status %d with %q", tc.method, tc.path, err, tc.status, tc.msg)
			}
			if got := grpcCode(err); got != tc.code {
				t.Fatalf("grpcCode(%v) = %v, want %v", err, got, tc.code)
			}
		})
	}
}

// TestGRPCCodeTable covers the answers a single healthy blkd cannot be
// made to give (a follower, a node starting) and errors that are not
// blkd's answers.
func TestGRPCCodeTable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{nil, codes.OK},
		{&apiError{Status: 503, Msg: "not the raft leader"}, codes.Unavailable},
		{&apiError{Status: 421, Msg: "not the leader"}, codes.Unavailable},
		{&apiError{Status: 502, Msg: "owner unreachable"}, codes.Unavailable},
		{&apiError{Status: 409, Msg: `meta: volume "v": volume is busy: retry once it is done`}, codes.Aborted},
		{&apiError{Status: 409, Msg: "stale epoch"}, codes.Aborted},
		{&apiError{Status: 409, Msg: "node is not up"}, codes.Unavailable},
		{&apiError{Status: 409, Msg: "volume is not online"}, codes.FailedPrecondition},
		{&apiError{Status: 403, Msg: "role reader may not POST"}, codes.PermissionDenied},
		{&apiError{Status: 401, Msg: "no certificate"}, codes.Unauthenticated},
		{&apiError{Status: 500, Msg: "boom"}, codes.Internal},
		{&apiError{Status: 501, Msg: "not implemented"}, codes.Unimplemented},
		{fmt.Errorf("cannot reach blkd: %w", errors.New("connection refused")), codes.Unavailable},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
	} {
		if got := grpcCode(tc.err); got != tc.code {
			t.Errorf("grpcCode(%v) = %v, want %v", tc.err, got, tc.code)
		}
	}
}
