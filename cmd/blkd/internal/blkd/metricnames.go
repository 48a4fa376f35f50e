package blkd

import (
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/metrics"
)

// The names behind the metrics' one volume label (docs/operations.md
// §6): package metrics sees store IDs and subsystem NQNs; these read the
// registry copy once per scrape and name them.

// volumeLabels names the store objects this node may hold: every
// volume (a replica's copy lives on other nodes than Volume.Node) and
// every snapshot, with its volume's name.
func (d *Daemon) volumeLabels() map[uint64]metrics.VolumeLabel {
	out := make(map[uint64]metrics.VolumeLabel)
	d.node.FSM().Read(func(s *meta.State) {
		for _, v := range s.Export().Volumes {
			out[v.ID] = metrics.VolumeLabel{Name: v.Name, NQN: v.NQN}
			for _, sn := range v.Snapshots {
				out[sn.ID] = metrics.VolumeLabel{Name: v.Name, Snapshot: sn.Name}
			}
		}
	})
	return out
}

// namespaceLabels names the target's namespaces: namespace 1 of a
// volume's subsystem (its NQN), which hosts connect to, and of its
// replica subsystem (replicaNQN), which its primary writes to.
func (d *Daemon) namespaceLabels() map[metrics.Namespace]metrics.NamespaceLabel {
	out := make(map[metrics.Namespace]metrics.NamespaceLabel)
	d.node.FSM().Read(func(s *meta.State) {
		for _, v := range s.Export().Volumes {
			out[metrics.Namespace{Subsystem: v.NQN, NSID: 1}] = metrics.NamespaceLabel{Volume: v.Name, Role: metrics.RoleHost}
			out[metrics.Namespace{Subsystem: replicaNQN(v.ID), NSID: 1}] = metrics.NamespaceLabel{Volume: v.Name, Role: metrics.RoleReplica}
		}
	})
	return out
}
