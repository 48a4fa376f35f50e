package blkd

import (
	"cmp"
	"errors"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// A volume's paths (docs/replication.md §4, "Discovery"): every replica
// node of a volume exports its host-facing subsystem under the volume's
// NQN, so a host that discovers through any node must learn the ports of
// all of them (nvme connect-all), each with a PORTID that means that port
// and no other. The node's own ports are in its discovery log already;
// volumePaths gives the others', for SubsystemConfig.Paths and
// Subsystem.SetPaths.

// portID is the discovery log PORTID of one of a node's ports: 4 ×
// ordinal + the port's kind (tcpPortID 1, rdmaPortID 2, discPortID 3).
// Ordinals are unique in the cluster, so no two ports of the cluster
// share one. A node without an ordinal (0: it could not register before
// it listened) uses the kinds alone, as every node did before ordinals;
// those IDs are no other node's either (ordinal ≥ 1 gives 5 and up).
// 4 × 63 + 3 fits the 16-bit PORTID.
func portID(ordinal int, kind uint16) uint16 { return uint16(4*ordinal) + kind }

// volumePaths returns the host-facing ports of v's replica nodes other
// than this one, as this node's registry copy has them: see pathsOf.
func (d *Daemon) volumePaths(v meta.Volume) []target.Port {
	var out []target.Port
	d.node.FSM().Read(func(s *meta.State) { out = pathsOf(s, v, d.cfg.NodeID) })
	return out
}

// pathsOf returns the host-facing ports of v's replica nodes other than
// self, in replica order (v.ReplicaSet(); a volume written before
// replicas has only its primary), each node's NVMe/TCP port before its
// NVMe/RDMA one, as the attach endpoint lists them. The addresses are the
// ones each node registered (meta.NodeInfo TCPAddr and TargetAddr: what
// hosts reach it by, its --advertise-addr when it has one), the PORTIDs
// its own discovery log gives them (portID).
//
// Left out: a failed replica (its node was removed, or its store lost the
// volume: it exports nothing, and a host would retry it forever with
// ctrl_loss_tmo -1); a node the registry no longer knows; a node without
// an ordinal (registered before ordinals, until its next start: its
// controller IDs are not yet its own, so a host joining its path could
// be refused a duplicate CNTLID, and its PORTIDs are the old 1 and 2);
// an address a host cannot connect to (empty, no port, a wildcard). A
// down node's ports stay: the host keeps the path for when it returns.
func pathsOf(s *meta.State, v meta.Volume, self string) []target.Port {
	var out []target.Port
	for _, r := range v.ReplicaSet() {
		if r.Node == self || r.State == meta.ReplicaFailed {
			continue
		}
		n, ok := s.Node(r.Node)
		if !ok || n.Ordinal == 0 {
			continue
		}
		if p, ok := nodePort(n.TCPAddr, nvme.TrTypeTCP, portID(n.Ordinal, tcpPortID)); ok {
			// As the node's own NVMe/TCP port says (target/tcp): SQ
			// flow control may be disabled.
			p.TReq = nvme.TReqDisableSQFlow
			out = append(out, p)
		}
		if p, ok := nodePort(n.TargetAddr, nvme.TrTypeRDMA, portID(n.Ordinal, rdmaPortID)); ok {
			out = append(out, p)
		}
	}
	return out
}

// nodePort is the path for a registered host:port, false if a host could
// not connect to it.
func nodePort(addr string, trtype uint8, id uint16) (target.Port, bool) {
	host, svc, err := net.SplitHostPort(addr)
	if err != nil || host == "" || svc == "" {
		return target.Port{}, false
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return target.Port{}, false
	}
	return target.Port{ID: id, TrType: trtype, AdrFam: target.AdrFam(host), TrAddr: host, TrSvcID: svc}, true
}

// remoteSubsystems is what this node's discovery log lists of the
// volumes other nodes serve (docs/reservations.md §3): every volume a
// host may connect to — online or degraded; not creating, deleting,
// offline (unserved on every node) or failed — with its hosts as the
// serving nodes admit them and its replica nodes' ports other than
// self's (pathsOf), sorted by NQN. A volume with no such port is left
// out. So is nothing else: the target skips a subsystem it serves itself
// (its own entries and paths say more), which keeps a volume listed
// while this node, one of its replicas, does not serve it yet.
func remoteSubsystems(s *meta.State, self string) []target.RemoteSubsystem {
	var out []target.RemoteSubsystem
	for _, v := range s.Export().Volumes {
		if v.State != meta.VolumeOnline && v.State != meta.VolumeDegraded {
			continue
		}
		paths := pathsOf(s, v, self)
		if len(paths) == 0 {
			continue
		}
		out = append(out, target.RemoteSubsystem{NQN: v.NQN, AllowAny: v.AllowAny, Hosts: v.Hosts, Paths: paths})
	}
	slices.SortFunc(out, func(a, b target.RemoteSubsystem) int { return cmp.Compare(a.NQN, b.NQN) })
	return out
}

// remoteInterval is how often a node looks whether its registry copy
// moved, to bring the discovery log's remote subsystems up to date: a
// change anywhere in the cluster reaches every node's discovery
// controllers (the change notice) within about a second. A look that
// finds the applied index where it was costs one atomic load.
const remoteInterval = time.Second

// remoteLoop keeps the target's remote subsystems (SetRemoteSubsystems)
// to this node's registry copy until stop closes. It runs on every node,
// leader or not: each serves its own discovery log.
func (d *Daemon) remoteLoop(stop <-chan struct{}) {
	t := time.NewTicker(remoteInterval)
	defer t.Stop()
	var seen uint64
	for {
		if idx := d.node.AppliedIndex(); idx != seen {
			err := d.refreshRemote()
			if errors.Is(err, target.ErrClosed) {
				return // shutting down
			}
			if err != nil {
				// The registry's next change may mend it: said once
				// per change, not every second.
				d.log.Warn("discovery log: remote subsystems not updated", slog.Uint64("index", idx), slog.String("err", err.Error()))
			}
			seen = idx
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// refreshRemote sets the target's remote subsystems from this node's
// registry copy (the same list again changes nothing).
func (d *Daemon) refreshRemote() error {
	var l []target.RemoteSubsystem
	d.node.FSM().Read(func(s *meta.State) { l = remoteSubsystems(s, d.cfg.NodeID) })
	return d.tgt.SetRemoteSubsystems(l)
}
