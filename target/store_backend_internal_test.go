package target

import (
	"errors"
	"fmt"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/store"
)

// TestStoreStatus: every store sentinel, wrapped as the store wraps it,
// becomes the status store/errors.go names, by operation for ErrIO; a
// status already carried wins; success allocates nothing.
func TestStoreStatus(t *testing.T) {
	all := []ioOp{opRead, opWrite, opWriteZeroes, opDeallocate, opFlush, opCompare}
	same := func(s nvme.Status) map[ioOp]nvme.Status {
		m := map[ioOp]nvme.Status{}
		for _, o := range all {
			m[o] = s
		}
		return m
	}
	cases := []struct {
		err  error
		want map[ioOp]nvme.Status
	}{
		{store.ErrOutOfRange, same(nvme.StatusLBAOutOfRange.WithDNR())},
		{store.ErrMisaligned, same(nvme.StatusSGLInvalidDataLength.WithDNR())},
		{store.ErrTooLarge, same(nvme.StatusInvalidField.WithDNR())},
		{store.ErrInvalid, same(nvme.StatusInvalidField.WithDNR())},
		{store.ErrWouldLoseData, same(nvme.StatusInvalidField.WithDNR())},
		{store.ErrNotFound, same(nvme.StatusInvalidNamespace.WithDNR())},
		{store.ErrReadOnly, same(nvme.StatusNamespaceWriteProtect.WithDNR())},
		{store.ErrClosed, same(nvme.StatusNamespaceNotReady)},
		{store.ErrNoSpace, same(nvme.StatusCapacityExceeded.WithDNR())},
		{store.ErrCorrupt, same(nvme.StatusInternalError.WithDNR())},
		{store.ErrExists, same(nvme.StatusInternalError.WithDNR())},
		{errors.New("something else"), same(nvme.StatusInternalError.WithDNR())},
		{store.ErrIO, map[ioOp]nvme.Status{
			opRead: nvme.StatusUnrecoveredReadError.WithDNR(), opCompare: nvme.StatusUnrecoveredReadError.WithDNR(),
			opWrite: nvme.StatusWriteFault.WithDNR(), opWriteZeroes: nvme.StatusWriteFault.WithDNR(),
			opDeallocate: nvme.StatusWriteFault.WithDNR(), opFlush: nvme.StatusInternalError.WithDNR()}},
		{WithStatus(store.ErrIO, nvme.StatusReservationConflict), same(nvme.StatusReservationConflict)},
	}
	for _, tc := range cases {
		for _, o := range all {
			err := storeError(o, fmt.Errorf("volume 1: lba 7: %w", tc.err))
			if got := statusOf(err); got != tc.want[o] {
				t.Errorf("%v in op %d: status %#x, want %#x", tc.err, o, got, tc.want[o])
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("%v in op %d: the translated error no longer wraps it", tc.err, o)
			}
		}
	}
	if storeError(opRead, nil) != nil {
		t.Fatal("nil became an error")
	}
	if n := testing.AllocsPerRun(100, func() { _ = storeError(opWrite, nil) }); n != 0 {
		t.Fatalf("%v allocations on success", n)
	}
}
