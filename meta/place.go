package meta

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// PlaceRequest asks Place for nodes to hold a new volume.
type PlaceRequest struct {
	// Replicas is how many nodes to choose, each in a zone of its own;
	// 0 means 1. Volumes have one replica today; replica sets will ask
	// for more with the same call.
	Replicas int
	// SizeBytes is the volume's size: every chosen node must have that
	// much unpromised capacity.
	SizeBytes uint64
	// Exclude names nodes not to choose although the registry has them
	// up: the caller found they do not answer (the leader marks a silent
	// node down only after a while).
	Exclude []string
	// Full names nodes not to choose because their store's disk is full
	// (the caller asked them): the registry promises capacity by volume
	// sizes and not snapshots (docs/snapshots.md §2.2), so a node can
	// fill up under its promise. An error names them apart from Exclude.
	Full []string
	// Taken names the nodes that hold the volume already (AddReplica's
	// choice of one more): they are not chosen, nor any node in their
	// zones. Replicas counts the nodes to choose besides them.
	Taken []string
}

// PromisedOn is how many bytes of node's capacity v takes: its size if
// one of its replicas (any state) lives there and it is not being
// deleted (its space is being given back), else 0. Placement
// (State.Place) and control's capacity check count by it, so the two
// agree on what a node has promised.
func (v *Volume) PromisedOn(node string) uint64 {
	if v.State == VolumeDeleting {
		return 0
	}
	if _, ok := v.Replica(node); !ok {
		return 0
	}
	return v.SizeBytes
}

// PromisedBytes is how many bytes of node's capacity its volumes take
// (Volume.PromisedOn summed): the sizes of the volumes and clones with a
// replica there, not being deleted. Snapshots are not counted (what one
// holds grows with the writes after it, which the registry does not
// see; docs/volume.md, "Capacity"): the node's own store reports its
// real use.
func (s *State) PromisedBytes(node string) uint64 {
	var promised uint64
	for _, v := range s.vols {
		promised += v.PromisedOn(node)
	}
	return promised
}

// placeCand is one eligible node as Place ranks it.
type placeCand struct {
	id   string
	zone string // failure domain; a node without a zone is its own
	free uint64 // unpromised capacity; math.MaxUint64 for no limit
	vols int    // volumes it holds, deleting ones included
}

// free is how many more bytes of volumes node n may be promised: its
// CapacityBytes minus what its volumes take (Volume.PromisedOn), or
// math.MaxUint64 for a node that registered no capacity (no limit).
func (s *State) free(n *NodeInfo) uint64 {
	if n.CapacityBytes == 0 {
		return math.MaxUint64
	}
	promised := s.PromisedBytes(n.ID)
	if promised >= n.CapacityBytes {
		return 0
	}
	return n.CapacityBytes - promised
}

// Place chooses req.Replicas nodes for a new volume, best first (the
// first is the primary), or for more replicas of a volume on req.Taken. It is a pure function of
// the registry, so every caller with the same copy gets the same answer.
//
// A node is eligible if it is up (not draining or down), serves a
// transport (NVMe/TCP or NVMe/RDMA address) and is not in req.Exclude. Eligible nodes are ranked by
// unpromised capacity, most first, then by fewer volumes, then by node ID;
// nodes are taken in that order, skipping any whose zone already holds a
// chosen node, so no two replicas share a node or a zone (a node without
// a zone is a zone of its own). Nodes without room for req.SizeBytes are
// never chosen. For a new volume of several replicas, the chosen node
// that is primary of the fewest volumes comes first.
//
// It fails with ErrNoCapacity, naming the largest free capacity, when
// some eligible node exists but too few have room, and with
// ErrNoPlacement when too few eligible nodes (or zones) exist at all.
func (s *State) Place(req PlaceRequest) ([]string, error) {
	want := max(req.Replicas, 1)
	count := make(map[string]int, len(s.nodes))
	for _, v := range s.vols {
		for _, r := range v.ReplicaSet() {
			count[r.Node]++
		}
	}
	taken := make(map[string]bool, len(req.Taken))
	for _, id := range req.Taken {
		taken["node:"+id] = true
		if n, ok := s.nodes[id]; ok {
			taken[zoneOf(n)] = true
		}
	}
	var cands []placeCand
	for _, n := range s.nodes {
		if n.State != NodeUp || (n.TCPAddr == "" && n.TargetAddr == "") || slices.Contains(req.Exclude, n.ID) || slices.Contains(req.Full, n.ID) {
			continue
		}
		zone := zoneOf(n)
		if taken["node:"+n.ID] || taken[zone] {
			continue
		}
		cands = append(cands, placeCand{id: n.ID, zone: zone, free: s.free(n), vols: count[n.ID]})
	}
	slices.SortFunc(cands, func(a, b placeCand) int {
		return cmp.Or(cmp.Compare(b.free, a.free), cmp.Compare(a.vols, b.vols), cmp.Compare(a.id, b.id))
	})
	zones := make(map[string]bool, len(cands))
	for _, c := range cands {
		zones[c.zone] = true
	}
	if len(zones) < want {
		unanswered := ""
		if len(req.Exclude) > 0 {
			unanswered = fmt.Sprintf(" (not counting %s, which did not answer)", strings.Join(req.Exclude, ", "))
		}
		if len(req.Full) > 0 {
			unanswered += fmt.Sprintf(" (not counting %s, whose disk is full: free space or delete snapshots there)", strings.Join(req.Full, ", "))
		}
		if len(req.Taken) > 0 {
			unanswered += fmt.Sprintf(" (not counting the zones of %s, which hold the volume)", strings.Join(req.Taken, ", "))
		}
		return nil, fmt.Errorf("meta: %d replica(s) need %d nodes up and serving NVMe-oF in distinct zones; the registry has %d such zone(s) among %d nodes%s: %w", want, want, len(zones), len(s.nodes), unanswered, ErrNoPlacement)
	}
	var out []string
	used := make(map[string]bool, want)
	for _, c := range cands {
		if len(out) == want {
			break
		}
		if used[c.zone] || c.free < req.SizeBytes {
			continue
		}
		used[c.zone] = true
		out = append(out, c.id)
	}
	if len(out) < want {
		// cands is sorted by free capacity: the first is the largest.
		full := ""
		if len(req.Full) > 0 {
			full = fmt.Sprintf(" (not counting %s, whose disk is full)", strings.Join(req.Full, ", "))
		}
		return nil, fmt.Errorf("meta: a volume of %d bytes fits on %d node(s) up in distinct zones%s, %d needed: node %s may be promised the most, %d more bytes (its disk times its --overcommit, less its volumes' sizes): choose a smaller size, free space, add a node, or raise a node's --overcommit: %w", req.SizeBytes, len(out), full, want, cands[0].id, cands[0].free, ErrNoCapacity)
	}
	if len(req.Taken) == 0 && len(out) > 1 {
		// The primary serves every host I/O and every read: of the chosen
		// nodes, the one that is primary of the fewest volumes leads (the
		// earliest chosen on a tie), or a cluster whose nodes all hold
		// every volume would put every primary on the same node.
		primaries := make(map[string]int, len(out))
		for _, v := range s.vols {
			primaries[v.Node]++
		}
		best := 0
		for i, id := range out {
			if primaries[id] < primaries[out[best]] {
				best = i
			}
		}
		out[0], out[best] = out[best], out[0]
	}
	return out, nil
}
