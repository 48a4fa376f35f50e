package meta

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/blk-project/blk/nvme/resv"
)

// FeatureReservations: the node applies Reservation (Op 29) and
// ClearReservation (Op 30) and keeps Volume.Reservation. An older binary
// fails to decode those commands: Node.Apply proposes them only when
// every registered node has it (docs/reservations.md §1.3, "Upgrade").
const FeatureReservations = "reservations"

// Reservation applies one NVMe reservation command (Register, Acquire,
// Release, Set Features Reservation Persistence, or the PowerLoss of a
// new serving term) to volume Volume's reservation state through
// resv.Apply, and records the outcome: the status the host gets (a
// refusal, e.g. Reservation Conflict, is an outcome, logged like a
// success), the notices, the hosts to drain.
//
// Refused with an error, changing nothing: an unknown volume
// (ErrUnknownVolume), one being deleted (ErrVolumeDeleting), an Epoch that
// is not the volume's current one (ErrStaleEpoch: the primary that
// executed it was deposed; SetPrimary bumped the epoch), a malformed Cmd
// (resv.Command.Check: ErrInvalid). A Cmd.Token already in the state's
// Recent gets the recorded outcome and changes nothing (the keeper's
// retry after a leader change).
type Reservation struct {
	Volume string       `json:"volume"`
	Epoch  uint64       `json:"epoch"`
	Cmd    resv.Command `json:"cmd"`
}

// ClearReservation is the operator's break-glass (`blkctl volume
// reservation clear`): every registration and the reservation of volume
// Volume are removed, Gen + 1, every registrant is told Reservation
// Preempted (resv.ClearAll). No epoch: it is proposed by the leader, not
// by the serving node, which learns it from its copy of the registry.
// Refused for an unknown volume (ErrUnknownVolume) and one being deleted
// (ErrVolumeDeleting: it has no reservation any more).
type ClearReservation struct {
	Volume string `json:"volume"`
}

// reservation applies Op 29 at log index index.
func (s *State) reservation(index uint64, c Reservation) Result {
	v, err := s.replicaVolume(c.Volume, c.Epoch, true)
	if err != nil {
		return Result{Err: err}
	}
	if err := c.Cmd.Check(); err != nil {
		return Result{Err: fmt.Errorf("meta: volume %q: reservation command: %v: %w", c.Volume, err, ErrInvalid)}
	}
	st, out := resv.Apply(v.current(), c.Cmd)
	v.setReservation(index, st)
	cp := v.clone()
	return Result{Volume: &cp, Reservation: &out}
}

// clearReservation applies Op 30 at log index index.
func (s *State) clearReservation(index uint64, c ClearReservation) Result {
	v, err := s.replicaVolume(c.Volume, 0, false)
	if err != nil {
		return Result{Err: err}
	}
	st, out := resv.ClearAll(v.current())
	v.setReservation(index, st)
	cp := v.clone()
	return Result{Volume: &cp, Reservation: &out}
}

// current is the volume's reservation state, the empty one for nil.
// resv.Apply and ClearAll never modify it, so it need not be copied.
func (v *Volume) current() resv.State {
	if v.Reservation == nil {
		return resv.State{}
	}
	return *v.Reservation
}

// setReservation stores st if it differs from the volume's state, with
// Index the log index of the change (which orders the serving node's
// views, docs/reservations.md §1.4); nil when st holds nothing. A
// refusal, a replayed token or a command that changed nothing leaves the
// volume, Index included, as it was.
func (v *Volume) setReservation(index uint64, st resv.State) {
	if reflect.DeepEqual(st, v.current()) {
		return
	}
	if st.IsEmpty() {
		v.Reservation = nil
		return
	}
	st.Index = index
	v.Reservation = &st
}

// RequireFeature reports ErrFeatureMissing, naming the node, unless every
// registered node registered feature f.
func (s *State) RequireFeature(f string) error {
	ids := make([]string, 0, len(s.nodes))
	for id, n := range s.nodes {
		if !n.HasFeature(f) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	slices.Sort(ids)
	return fmt.Errorf("meta: node %s did not register feature %q (an older blkd, or it joined through one): upgrade every node, then restart node %s: %w", ids[0], f, ids[0], ErrFeatureMissing)
}

// requireFeature is the proposal gate of a command op that only nodes
// with feature f can apply: it reads this node's copy of the registry,
// which on the leader holds every registration committed before.
func (n *Node) requireFeature(f string, op Op) error {
	var err error
	n.fsm.Read(func(s *State) { err = s.RequireFeature(f) })
	if err != nil {
		return fmt.Errorf("meta: %v not proposed: %w", op, err)
	}
	return nil
}
