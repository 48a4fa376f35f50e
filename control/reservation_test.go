package control

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
)

// TestReservationFeatureGate: while a registered node lacks
// meta.FeatureReservations, Reservation and ClearReservation are refused
// naming it and nothing is written; once every node has it, the outcome
// and the entry's index come back, a conflict as an outcome.
func TestReservationFeatureGate(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t) // node n1, without the feature
	v, err := c.mgr.Create(ctx, CreateRequest{Name: "v", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	a := resv.HostID{15: 0x0a}
	reg := resv.Command{Op: resv.Register, Host: a, NRKEY: 1, CPTPL: nvme.CPTPLSet}
	before := c.reg.state.MarshalState()
	_, _, err1 := c.mgr.Reservation(ctx, "v", v.CurrentEpoch(), reg)
	_, _, err2 := c.mgr.ClearReservation(ctx, "v")
	for i, err := range []error{err1, err2} {
		if !errors.Is(err, ErrFeatureMissing) || !strings.Contains(err.Error(), "node n1") {
			t.Errorf("%d: %v", i, err)
		}
	}
	if after := c.reg.state.MarshalState(); !bytes.Equal(before, after) {
		t.Fatal("a refused request changed the registry")
	}
	if _, err := c.reg.Apply(ctx, meta.RegisterNode{ID: nodeID, TargetAddr: "127.0.0.1:4420", MgmtAddr: "127.0.0.1:7070", Features: []string{meta.FeatureSnapshots, meta.FeatureReservations}}); err != nil {
		t.Fatal(err)
	}
	out, index, err := c.mgr.Reservation(ctx, "v", v.CurrentEpoch(), reg)
	if err != nil || !out.Status.Success() || index != c.reg.index {
		t.Fatalf("register: %+v %d %v", out, index, err)
	}
	got, _ := c.reg.Volume(ctx, "v")
	if got.Reservation == nil || got.Reservation.Index != index || !got.Reservation.PTPL || len(got.Reservation.Regs) != 1 {
		t.Fatalf("registry holds %+v", got.Reservation)
	}
	out, _, err = c.mgr.Reservation(ctx, "v", v.CurrentEpoch(), resv.Command{Op: resv.Register, Host: a, NRKEY: 2})
	if err != nil || out.Status != nvme.StatusReservationConflict.WithDNR() {
		t.Fatalf("conflict: %+v %v", out, err)
	}
	if _, _, err := c.mgr.Reservation(ctx, "v", v.CurrentEpoch()+1, reg); !errors.Is(err, meta.ErrStaleEpoch) {
		t.Fatalf("stale epoch: %v", err)
	}
	if _, _, err := c.mgr.Reservation(ctx, "v", v.CurrentEpoch(), resv.Command{Op: resv.Register}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("zero host: %v", err)
	}
	out, _, err = c.mgr.ClearReservation(ctx, "v")
	if err != nil || len(out.Notices) != 1 || out.Notices[0] != (resv.Notice{Host: a, Kind: resv.ReservationPreempted}) {
		t.Fatalf("clear: %+v %v", out, err)
	}
}
