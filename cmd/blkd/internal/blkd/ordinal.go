package blkd

import (
	"context"
	"log/slog"

	"github.com/blk-project/blk/meta"
)

// The node's ordinal (meta.NodeInfo.Ordinal) gives its target its share
// of the NVMe controller IDs (meta.CNTLIDRange) and its ports their
// PORTIDs (portID): every replica node of a volume exports one
// subsystem NQN, and a Linux host refuses a controller whose CNTLID
// another controller of that subsystem has already
// (nvme_validate_cntlid, "Duplicate cntlid"). Discovery controllers are
// not checked (the host never matches the well-known discovery NQN to an
// existing subsystem), but they come from the same space, so the range
// covers them too.
//
// The registry gives the ordinal when it applies the node's RegisterNode.
// The target is made before that, so Start sets the range once the
// node's registry copy caught up, before it serves a volume or opens a
// port: takeOrdinal.

// ownOrdinal is this node's ordinal in its registry copy, 0 if none.
func (d *Daemon) ownOrdinal() int {
	var ord int
	d.node.FSM().Read(func(s *meta.State) {
		if n, ok := s.Node(d.cfg.NodeID); ok {
			ord = n.Ordinal
		}
	})
	return ord
}

// takeOrdinal gives the target this node's CNTLID range and returns the
// ordinal, for the ports' IDs. A node the registry knows with an ordinal
// (a node that joined, or restarted) has it at once. Otherwise — the
// first start of a cluster's first node, the first start after an
// upgrade from before ordinals — it registers now, bounded by
// registerWait, with the NVMe addresses the registry has for it (or, new,
// its configured ones, as a joining node does), which registerAddrs
// corrects once the ports listen. If that fails it logs why and keeps the
// whole CNTLID space and the old PORTIDs until adoptOrdinal or its next
// start.
func (d *Daemon) takeOrdinal(ctx context.Context) int {
	if ord := d.ownOrdinal(); ord != 0 {
		d.setCNTLIDs(ord)
		return ord
	}
	nvmeAddr, tcpAddr := d.cfg.advertisedNVMe(), d.cfg.advertisedTCP()
	d.node.FSM().Read(func(s *meta.State) {
		if n, ok := s.Node(d.cfg.NodeID); ok {
			nvmeAddr, tcpAddr = n.TargetAddr, n.TCPAddr
		}
	})
	rctx, cancel := context.WithTimeout(ctx, registerWait)
	err := d.register(rctx, "", d.joinRequest(d.ln.Addr().String(), nvmeAddr, tcpAddr))
	cancel()
	if err == nil {
		d.catchUp(ctx) // a follower's copy applies the leader's entry
	}
	ord := d.ownOrdinal()
	if ord == 0 {
		msg := "no node ordinal yet: this node's controllers take IDs from the whole CNTLID space and its ports the PORTIDs 1-3; a host with paths to this node and another node of a volume may be refused one as a duplicate CNTLID until this node starts again"
		if err != nil {
			d.log.Warn(msg, slog.String("err", err.Error()))
		} else {
			d.log.Warn(msg)
		}
		return 0
	}
	d.setCNTLIDs(ord)
	return ord
}

// adoptOrdinal sets the CNTLID range after registerAddrs if takeOrdinal
// could not (the PORTIDs stay as the ports opened with).
func (d *Daemon) adoptOrdinal(had int) {
	if had != 0 {
		return
	}
	if ord := d.ownOrdinal(); ord != 0 {
		d.setCNTLIDs(ord)
	}
}

// setCNTLIDs gives the target ordinal's CNTLID range.
func (d *Daemon) setCNTLIDs(ord int) {
	lo, hi, ok := meta.CNTLIDRange(ord)
	if !ok {
		d.log.Error("node ordinal out of range: controller IDs from the whole CNTLID space", slog.Int("ordinal", ord))
		return
	}
	if err := d.tgt.SetCNTLIDRange(lo, hi); err != nil {
		d.log.Error("controller ID range not set", slog.Int("ordinal", ord), slog.String("err", err.Error()))
		return
	}
	d.log.Info("node ordinal", slog.Int("ordinal", ord), slog.Int("cntlid_min", int(lo)), slog.Int("cntlid_max", int(hi)))
}
