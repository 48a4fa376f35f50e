package blkd

import (
	"net"

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
