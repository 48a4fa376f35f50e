package target

import (
	"errors"
	"fmt"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/store"
)

// TestStoreStatus: the store adapter's one translation of its errors, and
// what the core reads back from them (statusOf): every store sentinel,
// wrapped as the store wraps it, becomes the status store/errors.go names,
// by operation for ErrIO; a status already carried wins, over a sentinel
// too; the translated error is still the store's, message and all; the
// core translates nothing itself; success allocates nothing.
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
		{fmt.Errorf("x: %w", testStatusErr(nvme.StatusReservationConflict)), same(nvme.StatusReservationConflict)},
		{fmt.Errorf("%w: %w", testStatusErr(nvme.StatusANATransition), store.ErrIO), same(nvme.StatusANATransition)},
	}
	for _, tc := range cases {
		for _, o := range all {
			err := storeError(o, fmt.Errorf("volume 1: lba 7: %w", tc.err))
			if got := statusOf(err); got != tc.want[o] {
				t.Errorf("%v in op %d: status %#x, want %#x", tc.err, o, got, tc.want[o])
			}
			if got := storeStatus(o, fmt.Errorf("volume 1: lba 7: %w", tc.err)); got != tc.want[o] {
				t.Errorf("storeStatus(%d, %v) = %#x, want %#x", o, tc.err, got, tc.want[o])
			}
			if !errors.Is(err, tc.err) || err.Error() != "volume 1: lba 7: "+tc.err.Error() {
				t.Errorf("%v in op %d: the translated error %q no longer is the store's", tc.err, o, err)
			}
		}
	}
	if storeError(opRead, nil) != nil || statusOf(nil) != nvme.StatusSuccess {
		t.Fatal("success is not success")
	}
	// The core translates no storage's errors: an untranslated error is
	// an Internal Error, whatever it wraps.
	if got := statusOf(fmt.Errorf("volume 1: %w", store.ErrOutOfRange)); got != nvme.StatusInternalError.WithDNR() {
		t.Errorf("statusOf(untranslated store error) = %v, want Internal Error", got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = statusOf(storeError(opRead, nil)) }); n != 0 {
		t.Errorf("statusOf(nil) allocates %v", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = storeError(opWrite, nil) }); n != 0 {
		t.Fatalf("%v allocations on success", n)
	}
}
