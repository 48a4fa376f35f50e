package meta

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
)

// hostName shows a transcript's host IDs (32 hex digits ending in the
// host's letter, "0000…0a") as the letter.
func hostName(h resv.HostID) string {
	if h == (resv.HostID{15: h[15]}) && h[15] >= 0x0a && h[15] <= 0x0f {
		return fmt.Sprintf("%x", h[15])
	}
	return h.String()
}

func describeReservation(r *resv.State) string {
	var regs []string
	for _, g := range r.Regs {
		regs = append(regs, fmt.Sprintf("%s:%d", hostName(g.Host), g.Key))
	}
	s := fmt.Sprintf("resv(gen=%d type=%s", r.Gen, r.Type)
	if r.Holder != (resv.HostID{}) {
		s += " holder=" + hostName(r.Holder)
	}
	if r.PTPL {
		s += " ptpl"
	}
	if len(regs) > 0 {
		s += " regs=" + strings.Join(regs, ",")
	}
	if len(r.Recent) > 0 {
		var toks []string
		for _, d := range r.Recent {
			toks = append(toks, fmt.Sprint(d.Token))
		}
		s += " tokens=" + strings.Join(toks, ",")
	}
	return s + fmt.Sprintf(" index=%d)", r.Index)
}

func describeOutcome(o resv.Outcome) string {
	s := o.Status.String()
	for _, n := range o.Notices {
		s += " " + hostName(n.Host) + ":" + n.Kind.String()
	}
	for _, h := range o.Abort {
		s += " abort:" + hostName(h)
	}
	return s
}

// hostID is the transcripts' host n (0x0a for A, ...).
func hostID(n byte) resv.HostID { return resv.HostID{15: n} }

// resvBase: nodes a, b, c with reservations; volume "v" on a and b,
// online, at epoch 1; volume "w" on c.
func resvBase(t *testing.T) *State {
	t.Helper()
	s := NewState()
	for _, c := range []Command{
		RegisterNode{ID: "a", TCPAddr: "a:1", MgmtAddr: "a:2", Zone: "za", Features: []string{FeatureReservations}},
		RegisterNode{ID: "b", TCPAddr: "b:1", MgmtAddr: "b:2", Zone: "zb", Features: []string{FeatureReservations}},
		RegisterNode{ID: "c", TCPAddr: "c:1", MgmtAddr: "c:2", Zone: "zc", Features: []string{FeatureReservations}},
		CreateVolume{Name: "v", SizeBytes: 8192, BlockSize: 4096, Node: "a", Replicas: []string{"a", "b"}, At: 1},
		SetVolumeState{Name: "v", State: VolumeOnline},
		CreateVolume{Name: "w", SizeBytes: 8192, BlockSize: 4096, Node: "c", At: 2},
	} {
		mustApply(t, s, c)
	}
	return s
}

// resvCommand draws a reservation command (mostly well formed) from a
// small universe of hosts and keys, so that conflicts and preemptions
// happen.
func resvCommand(rng *rand.Rand) resv.Command {
	keys := []uint64{0, 1, 2, 3}
	c := resv.Command{
		Op:     resv.Op(1 + rng.IntN(5)),
		Action: uint8(rng.IntN(3)),
		Type:   resv.Type(1 + rng.IntN(6)),
		CRKEY:  keys[rng.IntN(4)],
		NRKEY:  keys[rng.IntN(4)],
		Host:   hostID(byte(0x0a + rng.IntN(4))),
		IEKEY:  rng.IntN(5) == 0,
	}
	switch c.Op {
	case resv.Register:
		c.CPTPL = []uint8{0, 2, 3}[rng.IntN(3)]
	case resv.Release:
		c.Action = uint8(rng.IntN(2))
	case resv.SetPTPL:
		c.CPTPL = 2 + uint8(rng.IntN(2))
	}
	if rng.IntN(3) == 0 {
		c.Token = uint64(1 + rng.IntN(30))
	}
	if rng.IntN(25) == 0 {
		c.Action = 7 // malformed: ErrInvalid
	}
	return c
}

// TestReservationRandom: random Op 29 (and a few Op 30) interleaved with
// SetPrimary on a replicated volume. The volume's reservation equals
// resv.Apply folded over the accepted commands; a command of a stale
// epoch or a malformed one is refused and changes nothing; every state
// round-trips through the snapshot encoding.
func TestReservationRandom(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 29))
	s := resvBase(t)
	index := s.index
	var model resv.State // resv.Apply folded over the accepted commands
	n := 3000
	if testing.Short() {
		n = 1000
	}
	count := map[string]int{}
	for i := 0; i < n; i++ {
		v, _ := s.Volume("v")
		var c Command
		switch k := rng.IntN(20); {
		case k == 0:
			other := "b"
			if v.Node == "b" {
				other = "a"
			}
			c = SetPrimary{Volume: "v", Node: other, Epoch: v.CurrentEpoch(), At: int64(i)}
		case k == 1:
			c = ClearReservation{Volume: "v"}
		default:
			epoch := v.CurrentEpoch()
			if rng.IntN(8) == 0 {
				epoch-- // a deposed primary's
			}
			c = Reservation{Volume: "v", Epoch: epoch, Cmd: resvCommand(rng)}
		}
		before := s.MarshalState()
		index++
		r := s.ApplyBytes(index, mustEncode(t, c))
		switch c := c.(type) {
		case Reservation:
			staleOrBad := c.Epoch != v.CurrentEpoch() || c.Cmd.Check() != nil
			if staleOrBad != (r.Err != nil) {
				t.Fatalf("entry %d %+v: err %v, stale or malformed %v", index, c, r.Err, staleOrBad)
			}
			if r.Err != nil {
				if c.Epoch != v.CurrentEpoch() && !errors.Is(r.Err, ErrStaleEpoch) {
					t.Fatalf("entry %d: stale epoch answered %v", index, r.Err)
				}
				count["refused"]++
				break
			}
			var out resv.Outcome
			model, out = resv.Apply(model, c.Cmd)
			if !reflect.DeepEqual(out, *r.Reservation) {
				t.Fatalf("entry %d %+v: outcome %+v, model %+v", index, c, *r.Reservation, out)
			}
			if !out.Status.Success() {
				count["conflict"]++
				if after := s.MarshalState(); !bytes.Equal(stripIndex(before), stripIndex(after)) {
					t.Fatalf("entry %d %+v refused (%v) but changed the registry", index, c, out.Status)
				}
			} else {
				count["ok"]++
			}
		case ClearReservation:
			model, _ = resv.ClearAll(model)
			count["clear"]++
		case SetPrimary:
			if r.Err != nil {
				t.Fatalf("entry %d %+v: %v", index, c, r.Err)
			}
		}
		got := resv.State{}
		if v, _ := s.Volume("v"); v.Reservation != nil {
			got = *v.Reservation
			if err := resv.Check(v.Reservation); err != nil {
				t.Fatalf("entry %d: %v", index, err)
			}
			if got.Index == 0 || got.Index > index {
				t.Fatalf("entry %d: reservation index %d", index, got.Index)
			}
		}
		got.Index = 0
		if !reflect.DeepEqual(got, model) && !(got.IsEmpty() && model.IsEmpty()) {
			t.Fatalf("entry %d %+v: registry\n%+v\nmodel\n%+v", index, c, got, model)
		}
		model.Index = 0
		if i%250 == 0 {
			s2, err := UnmarshalState(s.MarshalState())
			if err != nil {
				t.Fatalf("entry %d: %v", index, err)
			}
			if !bytes.Equal(s2.MarshalState(), s.MarshalState()) {
				t.Fatalf("entry %d: snapshot round trip differs", index)
			}
			checkInvariants(t, s)
		}
	}
	if count["ok"] == 0 || count["conflict"] == 0 || count["refused"] == 0 || count["clear"] == 0 {
		t.Errorf("the generator does not reach every case: %v", count)
	}
	t.Logf("seed %d: %v", seed, count)
}

// stripIndex drops the registry's applied index from an encoded state, so
// a refused command (which moves it) compares equal.
func stripIndex(b []byte) []byte {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	delete(m, "index")
	out, _ := json.Marshal(m)
	return out
}

// TestReservationLifecycle: a clone starts without a reservation, delete
// drops it, a snapshot with a broken reservation is refused, a state
// without reservations encodes without the field.
func TestReservationLifecycle(t *testing.T) {
	s := resvBase(t)
	if b := s.MarshalState(); bytes.Contains(b, []byte(`"reservation":`)) {
		t.Fatalf("no reservation, but the encoding names one: %s", b)
	}
	reg := resv.Command{Op: resv.Register, Host: hostID(0x0a), NRKEY: 5, CPTPL: nvme.CPTPLSet}
	r := mustApply(t, s, Reservation{Volume: "w", Epoch: 1, Cmd: reg})
	if !r.Reservation.Status.Success() || r.Volume.Reservation == nil || r.Volume.Reservation.Gen != 1 || r.Volume.Reservation.Index != s.index {
		t.Fatalf("register: %+v %+v", r.Reservation, r.Volume.Reservation)
	}
	// The result is a copy: changing it changes nothing in the registry.
	r.Volume.Reservation.Regs[0].Key = 99
	if v, _ := s.Volume("w"); v.Reservation.Regs[0].Key != 5 {
		t.Fatal("Result.Volume shares the reservation with the registry")
	}
	b := s.MarshalState()
	s2, err := UnmarshalState(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s2.MarshalState(), b) {
		t.Fatal("round trip differs")
	}
	// A holder that is not registered: refused at load.
	bad := bytes.Replace(b, []byte(`"gen":1`), []byte(`"gen":1,"type":1,"holder":"0000000000000000000000000000000b"`), 1)
	if _, err := UnmarshalState(bad); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("broken reservation loaded: %v", err)
	}
	// Delete drops it; Op 29 and 30 on a deleting volume are refused.
	r = mustApply(t, s, DeleteVolume{Name: "w"})
	if r.Volume.Reservation != nil {
		t.Fatalf("deleted volume keeps %+v", r.Volume.Reservation)
	}
	if r := s.Apply(s.index+1, Reservation{Volume: "w", Epoch: 1, Cmd: reg}); !errors.Is(r.Err, ErrVolumeDeleting) {
		t.Fatalf("reservation on a deleting volume: %v", r.Err)
	}
	if r := s.Apply(s.index+1, ClearReservation{Volume: "w"}); !errors.Is(r.Err, ErrVolumeDeleting) {
		t.Fatalf("clear on a deleting volume: %v", r.Err)
	}
}

// TestReservationFeatureGate: Node.Apply refuses to propose Op 29 and 30
// while a registered node lacks FeatureReservations (nothing reaches the
// log), and proposes them once every node has it; the outcome comes back
// in Result.Reservation with the entry's index.
func TestReservationFeatureGate(t *testing.T) {
	n := startSolo(t, t.TempDir(), vfs.NewMem(), nil)
	defer n.Close()
	ctx := context.Background()
	apply := func(c Command) (Result, error) { return n.Apply(ctx, c) }
	for _, c := range []Command{
		RegisterNode{ID: "a", TCPAddr: "a:1", MgmtAddr: "a:2", Features: []string{FeatureReservations}},
		RegisterNode{ID: "old", TCPAddr: "o:1", MgmtAddr: "o:2", Features: []string{FeatureSnapshots}},
		CreateVolume{Name: "v", SizeBytes: 4096, BlockSize: 4096, Node: "a", At: 1},
	} {
		if _, err := apply(c); err != nil {
			t.Fatal(err)
		}
	}
	reg := Reservation{Volume: "v", Epoch: 1, Cmd: resv.Command{Op: resv.Register, Host: hostID(0x0a), NRKEY: 7}}
	before := n.AppliedIndex()
	for _, c := range []Command{reg, ClearReservation{Volume: "v"}} {
		if _, err := apply(c); !errors.Is(err, ErrFeatureMissing) || !strings.Contains(err.Error(), "node old") {
			t.Fatalf("%v proposed while node old lacks the feature: %v", c.Op(), err)
		}
	}
	if n.AppliedIndex() != before {
		t.Fatal("a refused proposal reached the log")
	}
	if _, err := apply(RegisterNode{ID: "old", TCPAddr: "o:1", MgmtAddr: "o:2", Features: []string{FeatureReservations}}); err != nil {
		t.Fatal(err)
	}
	r, err := apply(reg)
	if err != nil || r.Reservation == nil || !r.Reservation.Status.Success() || r.Index == 0 ||
		r.Volume.Reservation == nil || r.Volume.Reservation.Index != r.Index {
		t.Fatalf("register once upgraded: %+v, %v", r, err)
	}
	// A conflict is an outcome, not an error.
	r, err = apply(Reservation{Volume: "v", Epoch: 1, Cmd: resv.Command{Op: resv.Register, Host: hostID(0x0a), NRKEY: 8}})
	if err != nil || r.Reservation.Status != nvme.StatusReservationConflict.WithDNR() {
		t.Fatalf("conflict: %+v, %v", r.Reservation, err)
	}
	if r, err = apply(ClearReservation{Volume: "v"}); err != nil || len(r.Reservation.Notices) != 1 || r.Volume.Reservation.Gen != 2 {
		t.Fatalf("clear: %+v, %v", r, err)
	}
	s := NewState()
	mustApply(t, s, RegisterNode{ID: "a", TCPAddr: "a:1", MgmtAddr: "a:2", Features: []string{FeatureReservations}})
	mustApply(t, s, RegisterNode{ID: "old", TCPAddr: "o:1", MgmtAddr: "o:2", Features: []string{FeatureSnapshots}})
	err = s.RequireFeature(FeatureReservations)
	if !errors.Is(err, ErrFeatureMissing) || !strings.Contains(err.Error(), "node old") {
		t.Fatalf("gate: %v", err)
	}
	mustApply(t, s, RegisterNode{ID: "old", TCPAddr: "o:1", MgmtAddr: "o:2", Features: []string{FeatureReservations}})
	if err := s.RequireFeature(FeatureReservations); err != nil {
		t.Fatalf("every node has it: %v", err)
	}
}
