package blkd

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/blk-project/blk/control"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
)

// TestReservationErr pins the one translation of a keeper's failure into
// the host's status (docs/reservations.md §1.5), and that the leader's
// refusal crosses POST /v1/internal/reservation as the same error.
func TestReservationErr(t *testing.T) {
	for _, c := range []struct {
		err   error
		want  nvme.Status
		retry bool
	}{
		{fmt.Errorf("x: %w", meta.ErrStaleEpoch), nvme.StatusANATransition, false},
		{errNotServing, nvme.StatusANATransition, false},
		{fmt.Errorf("x: %w", meta.ErrFeatureMissing), nvme.StatusInternalError.WithDNR(), false},
		{fmt.Errorf("x: %w", control.ErrFeatureMissing), nvme.StatusInternalError.WithDNR(), false},
		{fmt.Errorf("x: %w", meta.ErrVolumeDeleting), nvme.StatusInvalidNamespace.WithDNR(), false},
		{fmt.Errorf("x: %w", meta.ErrUnknownVolume), nvme.StatusInvalidNamespace.WithDNR(), false},
		{fmt.Errorf("x: %w", control.ErrInvalid), nvme.StatusInvalidField.WithDNR(), false},
		{errKeeperClosed, nvme.StatusInvalidNamespace.WithDNR(), true},
		{errKeeperBusy, nvme.StatusNamespaceNotReady, true},
		{errViewUnknown, nvme.StatusNamespaceNotReady, true},
		{fmt.Errorf("%w within 10s", errNoLeader), nvme.StatusNamespaceNotReady, true},
		{fmt.Errorf("%w: x", errFenceFailed), nvme.StatusInternalError, true},
		{&peerAnswer{http.StatusMisdirectedRequest, "not the leader"}, nvme.StatusNamespaceNotReady, true},
	} {
		var se interface{ NVMeStatus() nvme.Status } // target.WithStatus's
		got := reservationErr(c.err)
		if !errors.As(got, &se) {
			t.Fatalf("%v: no status carried", c.err)
		}
		if se.NVMeStatus() != c.want {
			t.Errorf("%v: status %v, want %v", c.err, se.NVMeStatus(), c.want)
		}
		if !errors.Is(got, c.err) {
			t.Errorf("%v: the status hides the error", c.err)
		}
		if r := retryable(c.err); r != c.retry && !errors.Is(c.err, errKeeperClosed) && !errors.Is(c.err, errKeeperBusy) && !errors.Is(c.err, errFenceFailed) && !errors.Is(c.err, errViewUnknown) {
			t.Errorf("%v: retryable %v, want %v", c.err, r, c.retry)
		}
	}
	// The leader's refusals, as HTTP statuses and back.
	for _, sentinel := range []error{meta.ErrStaleEpoch, meta.ErrFeatureMissing, meta.ErrUnknownVolume, meta.ErrVolumeDeleting, meta.ErrInvalid} {
		err := fmt.Errorf("leader: %w", sentinel)
		back := resvError(&peerAnswer{resvStatus(err), err.Error()})
		if !errors.Is(back, sentinel) || retryable(back) {
			t.Errorf("%v: crossed as %v (retryable %v)", sentinel, back, retryable(back))
		}
	}
	if resvError(&peerAnswer{http.StatusServiceUnavailable, "raft"}) != nil || !retryable(&peerAnswer{http.StatusServiceUnavailable, "raft"}) {
		t.Errorf("a leader's 503 is not retried")
	}
}

func TestParseResvHolds(t *testing.T) {
	h := parseResvHolds("leader=1s, keeper=4s,bringup=250ms,bogus=1s,keeper")
	if h != (resvHolds{leader: time.Second, keeper: 4 * time.Second, bringUp: 250 * time.Millisecond}) {
		t.Fatalf("%+v", h)
	}
	if parseResvHolds("") != (resvHolds{}) {
		t.Fatalf("unset: holds")
	}
}

func TestReservationView(t *testing.T) {
	a, b := resv.HostID{1}, resv.HostID{2}
	if v := reservationView(nil); v.Gen != 0 || v.Type != "none" || v.Holder != "" || len(v.Registrants) != 0 {
		t.Fatalf("nil state: %+v", v)
	}
	st := &resv.State{Gen: 3, Type: resv.WriteExclusive, Holder: a, PTPL: true,
		Regs: []resv.Registrant{{Host: a, Key: 0xA1, NQN: "nqn.a"}, {Host: b, Key: 0xB2}}}
	v := reservationView(st)
	if v.Gen != 3 || v.Type != "write-exclusive" || v.Holder != a.String() || v.HolderNQN != "nqn.a" || !v.PTPL ||
		len(v.Registrants) != 2 || !v.Registrants[0].Holder || v.Registrants[1].Holder || v.Registrants[1].Key != 0xB2 || v.Registrants[1].HostID != b.String() {
		t.Fatalf("WE: %+v", v)
	}
	st.Type, st.Holder = resv.ExclusiveAccessAllRegs, resv.HostID{}
	v = reservationView(st)
	if v.Type != "exclusive-access-all-registrants" || v.Holder != "" || !v.Registrants[0].Holder || !v.Registrants[1].Holder {
		t.Fatalf("EA-AR: %+v", v)
	}
}

func TestResvTokensUnique(t *testing.T) {
	ks := newResvKeepers()
	seen := map[uint64]bool{}
	for range 10000 {
		tok := ks.token()
		if tok == 0 || seen[tok] {
			t.Fatalf("token %d given twice or zero", tok)
		}
		seen[tok] = true
	}
	if newResvKeepers().tokenBase == ks.tokenBase {
		t.Fatalf("two processes' token bases equal")
	}
}

func TestRedactReservation(t *testing.T) {
	r := reservationView(&resv.State{Gen: 2, Type: resv.WriteExclusive, Holder: resv.HostID{1},
		Regs: []resv.Registrant{{Host: resv.HostID{1}, Key: 7, NQN: "nqn.a"}}})
	c := redactReservation(&r)
	if c.HolderNQN != "" || c.Registrants[0].HostNQN != "" || c.Registrants[0].Key != 7 || c.Gen != 2 || c.Holder == "" {
		t.Fatalf("redacted: %+v", c)
	}
	if r.HolderNQN != "nqn.a" || r.Registrants[0].HostNQN != "nqn.a" {
		t.Fatalf("redact changed its input: %+v", r)
	}
	if redactReservation(nil) != nil {
		t.Fatalf("nil")
	}
}
