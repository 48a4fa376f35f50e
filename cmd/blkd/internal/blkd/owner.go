package blkd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/volume"
)

// The registry leader serves every management write: it applies the
// registry commands, and the owner of the volume does the local part
// (subsystem hosts, store resize, removal). When the owner is another
// node, the leader asks it through POST /v1/internal/local: one hop, no
// registry change on the owner, so a volume owned by a follower is
// managed like any other after a leader change.

// Local operations the owner performs.
const (
	opAllowHost = "allow-host"
	opDenyHost  = "deny-host"
	opResize    = "resize"
	opDelete    = "delete"
)

// ownerTimeout bounds one request from the leader to a volume's owner.
const ownerTimeout = 15 * time.Second

// localOp is the owner's part of a management operation, taken from the
// registry entry after the leader applied its commands.
type localOp struct {
	Op        string `json:"op"`
	Name      string `json:"name"`
	ID        uint64 `json:"id"`
	NQN       string `json:"nqn"`
	Node      string `json:"node"`
	SizeBytes uint64 `json:"size_bytes,omitempty"`
	HostNQN   string `json:"host_nqn,omitempty"`
}

func newLocalOp(op string, v meta.Volume, host string) localOp {
	return localOp{Op: op, Name: v.Name, ID: v.ID, NQN: v.NQN, Node: v.Node, SizeBytes: v.SizeBytes, HostNQN: host}
}

// onOwner runs op on the volume's owner: here, or through the owner's
// internal route. The caller holds d.mu.
func (d *Daemon) onOwner(ctx context.Context, op localOp) error {
	if op.Node == d.cfg.NodeID {
		return d.local(op)
	}
	var api string
	d.node.FSM().Read(func(s *meta.State) {
		if n, ok := s.Node(op.Node); ok {
			api = n.MgmtAddr
		}
	})
	fail := func(format string, args ...any) error {
		return &apiError{http.StatusBadGateway, fmt.Sprintf("volume %q: the registry is updated, but its owner node %s did not do its part (%s): "+
			"it catches up from the registry when it restarts; retry when it is reachable", op.Name, op.Node, fmt.Sprintf(format, args...))}
	}
	if api == "" {
		return fail("the registry knows no API address for it")
	}
	body, _ := json.Marshal(op)
	ctx, cancel := context.WithTimeout(ctx, ownerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+"/v1/internal/local", bytes.NewReader(body))
	if err != nil {
		return fail("%v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail("%v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil || e.Error == "" {
		e.Error = string(b)
	}
	return fail("%s at %s answered %s: %s", op.Node, api, resp.Status, e.Error)
}

// internalLocal serves POST /v1/internal/local: the leader asks this node,
// the volume's owner, to do its part of an operation.
func (d *Daemon) internalLocal(w http.ResponseWriter, r *http.Request) error {
	var op localOp
	if err := decode(r, &op); err != nil {
		return err
	}
	if op.Node != d.cfg.NodeID {
		return &apiError{http.StatusConflict, fmt.Sprintf("volume %q is owned by node %s, not %s", op.Name, op.Node, d.cfg.NodeID)}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.local(op); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// local does op on this node, the volume's owner. Each op is idempotent:
// the leader may repeat it.
func (d *Daemon) local(op localOp) error {
	switch op.Op {
	case opAllowHost:
		sub, ok := d.tgt.Subsystem(op.NQN)
		if !ok {
			return fmt.Errorf("volume %q: subsystem %s is not served on %s", op.Name, op.NQN, d.cfg.NodeID)
		}
		if err := sub.AllowHost(op.HostNQN); err != nil && !errors.Is(err, target.ErrExists) {
			return fmt.Errorf("volume %q: allow host %s: %w", op.Name, op.HostNQN, err)
		}
	case opDenyHost:
		if sub, ok := d.tgt.Subsystem(op.NQN); ok {
			if err := sub.DenyHost(op.HostNQN); err != nil && !errors.Is(err, target.ErrNotFound) {
				return fmt.Errorf("volume %q: deny host %s: %w", op.Name, op.HostNQN, err)
			}
		}
	case opResize:
		return d.resizeLocal(op.Name, op.ID, op.NQN, op.SizeBytes)
	case opDelete:
		if err := d.tgt.RemoveSubsystem(op.NQN); err != nil && !errors.Is(err, target.ErrNotFound) {
			return fmt.Errorf("delete volume %q: remove subsystem: %w", op.Name, err)
		}
		if err := d.store.Delete(volume.ID(op.ID)); err != nil && !errors.Is(err, volume.ErrNotFound) {
			return fmt.Errorf("delete volume %q: %w", op.Name, err)
		}
		d.lat.Forget(strconv.FormatUint(op.ID, 10))
	default:
		return badRequest("unknown local operation %q", op.Op)
	}
	return nil
}

// resizeLocal grows the store volume to size (never shrinks it) and makes
// the subsystem revalidate namespace 1, so connected hosts get a
// namespace-changed event and see the new capacity.
func (d *Daemon) resizeLocal(name string, id uint64, nqn string, size uint64) error {
	vol, err := d.store.Volume(volume.ID(id))
	if err != nil {
		return fmt.Errorf("resize volume %q: %w", name, err)
	}
	info, err := vol.Info()
	if err != nil {
		return fmt.Errorf("resize volume %q: %w", name, err)
	}
	if info.SizeBytes < size {
		if err := d.store.Resize(volume.ID(id), size, false); err != nil {
			return fmt.Errorf("resize volume %q: %w", name, err)
		}
	}
	if sub, ok := d.tgt.Subsystem(nqn); ok {
		if err := sub.RevalidateNamespace(1); err != nil && !errors.Is(err, target.ErrNotFound) {
			return fmt.Errorf("resize volume %q: revalidate namespace: %w", name, err)
		}
	}
	return nil
}
