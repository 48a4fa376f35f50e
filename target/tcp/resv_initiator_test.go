package tcp_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestReservationHelpersOverTCP: blk's initiator's reservation commands
// (initiator/resv.go) against a namespace kept by LocalReservations over
// NVMe/TCP: two hosts (one NQN, two host identifiers), Write Exclusive,
// the other host's write refused and its read served, the reports
// (extended; EDS 0 refused; truncated), preempt and abort, release and
// clear.
func TestReservationHelpersOverTCP(t *testing.T) {
	m, err := target.NewMemBackend(testBlock, testBlocks)
	if err != nil {
		t.Fatal(err)
	}
	tt, _ := serveSub(t, target.SubsystemConfig{Hosts: []string{testHostNQN}}, target.NamespaceConfig{Backend: m, Reservations: target.LocalReservations()})
	idA, idB := [16]byte{0xA, 1}, [16]byte{0xB, 2}
	ca := connectTCP(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 8, HostID: idA})
	a := ca.Namespace(1)
	b := connectTCP(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 8, HostID: idB}).Namespace(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conflict := func(what string, err error) {
		t.Helper()
		var se *initiator.StatusError
		if !errors.As(err, &se) || se.Status.Code() != nvme.StatusReservationConflict {
			t.Fatalf("%s: %v, want Reservation Conflict", what, err)
		}
	}
	ok := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	ok("A registers", a.ReservationRegister(ctx, nvme.RREGARegister, 0, 0xA1, false, nvme.CPTPLSet))
	ok("B registers", b.ReservationRegister(ctx, nvme.RREGARegister, 0, 0xB2, false, nvme.CPTPLNoChange))
	conflict("B registers again with another key", b.ReservationRegister(ctx, nvme.RREGARegister, 0, 0xB3, false, nvme.CPTPLNoChange))
	ok("A acquires WE", a.ReservationAcquire(ctx, nvme.RACQAAcquire, 1, 0xA1, 0, false))
	data := pattern(testBlock, 3)
	if _, err := a.WriteAt(data, 0); err != nil {
		t.Fatalf("A's write: %v", err)
	}
	_, err = b.WriteAt(pattern(testBlock, 4), 0)
	conflict("B's write", err)
	got := make([]byte, testBlock)
	if _, err := b.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("B's read: %v (equal %v)", err, bytes.Equal(got, data))
	}
	for who, ns := range map[string]*initiator.Namespace{"A": a, "B": b} {
		st, err := ns.ReservationReport(ctx)
		ok(who+"'s report", err)
		if st.Gen != 2 || st.Type != 1 || !st.PTPL || st.Count != 2 || len(st.Registrants) != 2 ||
			st.Registrants[0].HostID != idA || !st.Registrants[0].Holder || st.Registrants[0].Key != 0xA1 ||
			st.Registrants[1].HostID != idB || st.Registrants[1].Holder || st.Registrants[1].Key != 0xB2 {
			t.Fatalf("%s's report: %+v", who, st)
		}
	}
	_, err = a.ReservationReportRaw(ctx, false, 4096)
	var se *initiator.StatusError
	if !errors.As(err, &se) || se.Status.Code() != nvme.StatusHostIDInconsistent {
		t.Fatalf("report without EDS: %v, want Host Identifier Inconsistent Format", err)
	}
	raw, err := a.ReservationReportRaw(ctx, true, nvme.ResvStatusHeaderSize+nvme.ResvStatusEntrySize)
	ok("truncated report", err)
	if raw[5] != 2 || !bytes.Equal(raw[nvme.ResvStatusHeaderSize+16:nvme.ResvStatusHeaderSize+32], idA[:]) {
		t.Fatalf("truncated report: REGCTL %d, first host %x", raw[5], raw[nvme.ResvStatusHeaderSize+16:nvme.ResvStatusHeaderSize+32])
	}
	if _, err := a.ReservationReportRaw(ctx, true, 3); err == nil {
		t.Fatalf("a report buffer of 3 bytes was sent")
	}

	ok("B preempts and aborts A", b.ReservationAcquire(ctx, nvme.RACQAPreemptAndAbort, 1, 0xB2, 0xA1, false))
	if n, err := ca.ReservationNotice(ctx); err != nil || n.Count != 1 || n.Type != nvme.ResvNotifRegistrationPreempted || n.NSID != 1 || n.Available != 0 {
		t.Fatalf("A's notice after the preempt: %+v, %v, want one Registration Preempted", n, err)
	}
	if n, err := ca.ReservationNotice(ctx); err != nil || n.Count != 0 {
		t.Fatalf("A's log after reading its one notice: %+v, %v, want empty", n, err)
	}
	_, err = a.WriteAt(pattern(testBlock, 5), 0)
	conflict("A's write after the preempt", err)
	conflict("A's release: not registered any more", a.ReservationRelease(ctx, nvme.RRELARelease, 1, 0xA1, false))
	if _, err := b.WriteAt(pattern(testBlock, 6), 0); err != nil {
		t.Fatalf("B's write after the preempt: %v", err)
	}
	ok("B releases", b.ReservationRelease(ctx, nvme.RRELARelease, 1, 0xB2, false))
	if _, err := a.WriteAt(pattern(testBlock, 7), 0); err != nil {
		t.Fatalf("A's write after the release: %v", err)
	}
	ok("B clears", b.ReservationRelease(ctx, nvme.RRELAClear, 0, 0xB2, false))
	st, err := a.ReservationReport(ctx)
	ok("report after the clear", err)
	if st.Gen != 4 || st.Type != 0 || st.Count != 0 {
		t.Fatalf("report after the clear: %+v, want generation 4 and nothing", st)
	}
}
