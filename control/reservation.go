package control

import (
	"context"
	"fmt"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme/resv"
)

// Reservation proposes one NVMe reservation command (meta.Reservation, Op
// 29) for volume at epoch, the epoch of the primary term that executed
// it (docs/reservations.md §1.5). It answers the outcome the registry
// computed (a Reservation Conflict is an outcome, not an error) and the
// log index of the entry, which the serving node waits for in its own
// copy (meta.Node.WaitApplied) before it publishes the volume's
// Reservation to its data path and completes the host's command.
//
// Errors, nothing written: ErrFeatureMissing while a registered node lacks
// meta.FeatureReservations; meta.ErrUnknownVolume, meta.ErrVolumeDeleting,
// meta.ErrStaleEpoch (the primary was deposed) and meta.ErrInvalid (a
// malformed command) from the registry; and the registry's own errors
// (not the leader, raft), after which the keeper retries with the same
// cmd.Token. Not serialized with the volume's other operations: a
// reservation must not wait behind a snapshot; the keeper runs one command
// of a volume at a time.
func (m *Manager) Reservation(ctx context.Context, volume string, epoch uint64, cmd resv.Command) (resv.Outcome, uint64, error) {
	if err := m.requireFeature(ctx, meta.FeatureReservations); err != nil {
		return resv.Outcome{}, 0, err
	}
	if err := cmd.Check(); err != nil {
		return resv.Outcome{}, 0, fmt.Errorf("%w: volume %q: %v", ErrInvalid, volume, err)
	}
	return m.applyReservation(ctx, meta.Reservation{Volume: volume, Epoch: epoch, Cmd: cmd})
}

// ClearReservation proposes the operator's break-glass (meta.
// ClearReservation, Op 30: every registration and the reservation
// removed, every registrant told Reservation Preempted) and answers its
// outcome, whose notices the volume's serving node posts, and the entry's
// index. ErrFeatureMissing as Reservation.
func (m *Manager) ClearReservation(ctx context.Context, volume string) (resv.Outcome, uint64, error) {
	if err := m.requireFeature(ctx, meta.FeatureReservations); err != nil {
		return resv.Outcome{}, 0, err
	}
	return m.applyReservation(ctx, meta.ClearReservation{Volume: volume})
}

func (m *Manager) applyReservation(ctx context.Context, c meta.Command) (resv.Outcome, uint64, error) {
	res, err := m.reg.Apply(ctx, c)
	if err != nil {
		return resv.Outcome{}, res.Index, err
	}
	if res.Reservation == nil {
		return resv.Outcome{}, res.Index, fmt.Errorf("control: %v answered no outcome", c.Op())
	}
	return *res.Reservation, res.Index, nil
}
