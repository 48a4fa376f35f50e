package meta

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// cut isolates member i from every other member (both directions).
func (c *inmemCluster) cut(i int) {
	for j, o := range c.trans {
		if j != i && o != nil && c.trans[i] != nil {
			o.Disconnect(c.addr(i))
			c.trans[i].Disconnect(c.addr(j))
		}
	}
}

// heal reconnects every running pair.
func (c *inmemCluster) heal() {
	for i, a := range c.trans {
		for j, b := range c.trans {
			if i != j && a != nil && b != nil {
				a.Connect(c.addr(j), b)
			}
		}
	}
}

// fuzzReplicaCommand is a replica command on volume at the epoch last
// acknowledged for it (often stale after a failover another command made,
// which the registry must refuse).
func fuzzReplicaCommand(rng *rand.Rand, volume string, epochs map[string]uint64, at int64) Command {
	node := []string{"s2", "s3", "s4"}[rng.IntN(3)]
	epoch := max(epochs[volume], 1)
	switch rng.IntN(6) {
	case 4:
		return ReplaceReplica{Volume: volume, Node: node, New: []string{"s1", "s5"}[rng.IntN(2)], At: at}
	case 5:
		return RemoveReplica{Volume: volume, Node: []string{"s1", "s2", "s3", "s4", "s5"}[rng.IntN(5)], Replaced: rng.IntN(2) == 0}
	case 0:
		return SetPrimary{Volume: volume, Epoch: epoch, Node: node, Failover: rng.IntN(2) == 0, At: at}
	case 1:
		return SetReplicaState{Volume: volume, Epoch: epoch, Node: node, State: ReplicaOutOfSync, Reason: "leg failed", At: at}
	case 2:
		return SetReplicaState{Volume: volume, Epoch: epoch, Node: node, State: ReplicaRebuilding, At: at}
	default:
		return SetReplicaState{Volume: volume, Epoch: epoch, Node: node, State: ReplicaInSync, At: at}
	}
}

// fuzzSnapshotCommand is a snapshot command (or the SetVolumeState that
// lets one apply) drawn against reg, the leader's registry: on one of
// its volumes, mostly on snapshots it has, at its current epoch. The
// command may still be refused when another member leads by the time it
// is proposed, or when it is drawn to be.
func fuzzSnapshotCommand(rng *rand.Rand, reg *State, at int64) Command {
	var names, withSnaps []string
	for n, v := range reg.vols {
		names = append(names, n)
		if len(v.Snapshots) > 0 {
			withSnaps = append(withSnaps, n)
		}
	}
	slices.Sort(names)
	slices.Sort(withSnaps)
	if len(names) == 0 {
		return SetVolumeState{Name: "none", State: VolumeOnline}
	}
	if len(withSnaps) > 0 && rng.IntN(3) != 0 {
		names = withSnaps // the snapshot commands but create need one
	}
	v := reg.vols[names[rng.IntN(len(names))]]
	snap := fmt.Sprintf("s%d", rng.IntN(3))
	if len(v.Snapshots) > 0 && rng.IntN(4) != 0 {
		snap = v.Snapshots[rng.IntN(len(v.Snapshots))].Name
	}
	if v.State == VolumeCreating && rng.IntN(4) != 0 {
		return SetVolumeState{Name: v.Name, State: VolumeOnline}
	}
	for _, sn := range v.Snapshots {
		if sn.State == SnapshotCreating && rng.IntN(3) != 0 {
			return SnapshotDone{Volume: v.Name, Name: sn.Name, Epoch: v.CurrentEpoch(), Nodes: v.InSync()}
		}
	}
	switch rng.IntN(10) {
	case 0:
		return SetVolumeState{Name: v.Name, State: VolumeOffline}
	case 1, 2:
		return CreateSnapshot{Volume: v.Name, Name: snap, At: at}
	case 3:
		return SnapshotDone{Volume: v.Name, Name: snap, Epoch: v.CurrentEpoch(), Nodes: v.InSync()}
	case 4:
		if rng.IntN(2) == 0 {
			return DeleteSnapshot{Volume: v.Name, Name: snap}
		}
		return PurgeSnapshot{Volume: v.Name, Name: snap}
	case 5:
		return CloneVolume{Name: fmt.Sprintf("k%d", rng.IntN(4)), Volume: v.Name, Snapshot: snap, At: at}
	case 6:
		return FlattenVolume{Name: v.Name, At: at}
	case 7:
		return FlattenDone{Name: v.Name}
	case 8:
		return RevertVolume{Name: v.Name, Snapshot: snap, Epoch: v.CurrentEpoch()}
	default:
		return SnapshotNodes{Volume: v.Name, Snapshot: snap, Add: []string{"s2", "s3", "s4"}[rng.IntN(3)]}
	}
}

// TestClusterFuzzy: a seeded run of partitions, heals, crashes and restarts
// between batches of writes. At the end every member holds the same
// registry, and every write that was acknowledged is in it.
func TestClusterFuzzy(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 3))
	c := newInmemCluster(t, 3)
	n0 := c.start(0, true)
	c.start(1, false)
	c.start(2, false)
	c.waitLeader()
	ctx := context.Background()
	for i := 1; i < 3; i++ {
		if err := n0.AddVoter(ctx, fmt.Sprintf("m%d", i), string(c.addr(i))); err != nil {
			t.Fatal(err)
		}
	}
	c.apply(RegisterNode{ID: "s1", TargetAddr: "a:1", MgmtAddr: "a:2", Zone: "z1", Features: []string{FeatureReservations}})
	// Storage nodes for replicated volumes, one zone each.
	for _, id := range []string{"s2", "s3", "s4", "s5"} {
		c.apply(RegisterNode{ID: id, TCPAddr: id + ":1", MgmtAddr: id + ":2", Zone: "z" + id, Features: []string{FeatureReplication, FeatureReservations}})
	}
	resvGen := map[string]uint32{} // volume → highest acknowledged reservation Gen
	var resvOK int
	epochs := map[string]uint64{} // volume → highest acknowledged epoch
	replicated := []string{}
	var replicaOK int
	var created []string // every volume acknowledged, for snapshot commands
	snapOK := map[Op]int{}

	acked := map[string]bool{}
	next := 0
	var events []string
	isolated := map[int]bool{}
	for round := range 12 {
		switch a := rng.IntN(4); {
		case a == 0:
			i := rng.IntN(3)
			c.cut(i)
			isolated[i] = true
			events = append(events, fmt.Sprintf("cut m%d", i))
		case a == 1:
			c.heal()
			clear(isolated)
			events = append(events, "heal")
		case a == 2:
			// Crash one member (never leaving fewer than two up) and
			// bring back any that is down.
			down := -1
			for i, n := range c.nodes {
				if n == nil {
					down = i
				}
			}
			if down >= 0 {
				c.start(down, false)
				c.heal()
				clear(isolated)
				events = append(events, fmt.Sprintf("restart m%d", down))
			} else {
				i := rng.IntN(3)
				c.stop(i)
				events = append(events, fmt.Sprintf("crash m%d", i))
			}
		default:
			events = append(events, "steady")
		}
		connected := 0
		for i, n := range c.nodes {
			if n != nil && !isolated[i] {
				connected++
			}
		}
		if connected < 2 {
			// No quorum: one write, which must not be acknowledged.
			for _, n := range c.nodes {
				if n == nil || !n.IsLeader() {
					continue
				}
				actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				_, err := n.Apply(actx, CreateVolume{Name: fmt.Sprintf("v%04d", next), SizeBytes: 4096, BlockSize: 4096, Node: "s1"})
				cancel()
				next++
				if err == nil {
					t.Errorf("round %d: write acknowledged without a quorum (events %v)", round, events)
				}
			}
			continue
		}
		// Let an election finish: a quorum is connected, so one will.
		settle := time.Now().Add(waitFor)
		for _, err := c.leader(); err != nil && time.Now().Before(settle); _, err = c.leader() {
			time.Sleep(20 * time.Millisecond)
		}
		// A batch of writes with short deadlines: some fail while there
		// is no quorum; those are uncertain, not lost, and end the batch.
		for range 5 + rng.IntN(10) {
			name := fmt.Sprintf("v%04d", next)
			next++
			l, err := c.leader()
			if err != nil {
				continue
			}
			actx, cancel := context.WithTimeout(ctx, time.Second)
			cmd := Command(CreateVolume{Name: name, SizeBytes: 4096, BlockSize: 4096, Node: "s1", At: int64(round)})
			if len(created) > 0 && rng.IntN(2) == 0 {
				l.FSM().Read(func(s *State) { cmd = fuzzSnapshotCommand(rng, s, int64(round)) })
				next-- // not a create
			} else if rng.IntN(3) == 0 {
				cmd = CreateVolume{Name: name, SizeBytes: 4096, BlockSize: 4096, Node: "s2", At: int64(round), Replicas: []string{"s2", "s3", "s4"}}
			} else if len(replicated) > 0 && rng.IntN(3) == 0 {
				// A reservation command at the epoch last acknowledged
				// (stale after a failover: refused).
				v := replicated[rng.IntN(len(replicated))]
				cmd = Reservation{Volume: v, Epoch: max(epochs[v], 1), Cmd: resvCommand(rng)}
				next-- // not a create
			} else if len(replicated) > 0 && rng.IntN(2) == 0 {
				cmd = fuzzReplicaCommand(rng, replicated[rng.IntN(len(replicated))], epochs, int64(round))
				next-- // not a create
			}
			r, err := l.Apply(actx, cmd)
			cancel()
			if err != nil && r.Err == nil {
				break // no quorum, or an election: next round
			}
			if err == nil {
				switch cv := cmd.(type) {
				case CreateVolume:
					acked[name] = true
					created = append(created, name)
					if len(cv.Replicas) > 0 {
						replicated = append(replicated, name)
					}
				case SetReplicaState, SetPrimary, AddReplica, RemoveReplica, ReplaceReplica:
					replicaOK++
				case Reservation:
					resvOK++
					if r.Reservation == nil || r.Volume == nil {
						t.Fatalf("%#v: no outcome (seed %d)", cmd, seed)
					}
					if rv := r.Volume.Reservation; rv != nil {
						if rv.Gen < resvGen[cv.Volume] {
							t.Errorf("%#v: reservation Gen %d after acknowledged %d (seed %d)", cmd, rv.Gen, resvGen[cv.Volume], seed)
						}
						resvGen[cv.Volume] = rv.Gen
					}
				default:
					snapOK[cmd.Op()]++
				}
				if r.Volume != nil {
					if e := r.Volume.CurrentEpoch(); e < epochs[r.Volume.Name] {
						t.Errorf("%#v: epoch %d after acknowledged epoch %d (seed %d)", cmd, e, epochs[r.Volume.Name], seed)
					} else {
						epochs[r.Volume.Name] = e
					}
				}
			}
			// The invariants, on every running member's registry (any
			// prefix of the log keeps them) after every command.
			for i, n := range c.nodes {
				if n == nil {
					continue
				}
				n.FSM().Read(func(s *State) {
					for _, v := range s.vols {
						if err := replicaInvariants(s, v); err != nil {
							t.Errorf("m%d after %#v: volume %q: %v (seed %d)", i, cmd, v.Name, err, seed)
						}
					}
					if err := snapshotInvariants(s); err != nil {
						t.Errorf("m%d after %#v: %v (seed %d)", i, cmd, err, seed)
					}
				})
			}
		}
	}
	t.Logf("events: %v; %d writes, %d acknowledged", events, next, len(acked))
	for i, n := range c.nodes {
		if n == nil {
			c.start(i, false)
		}
	}
	c.heal()
	c.apply(RegisterNode{ID: "final", TargetAddr: "a:1", MgmtAddr: "a:2"})
	c.converged()
	l := c.waitLeader()
	final, err := UnmarshalState(c.converged())
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, final)
	for name, e := range epochs {
		if v, ok := final.Volume(name); ok && v.CurrentEpoch() < e {
			t.Errorf("volume %s: epoch %d, acknowledged %d", name, v.CurrentEpoch(), e)
		}
	}
	for name, g := range resvGen {
		v, ok := final.Volume(name)
		if !ok || v.State == VolumeDeleting {
			continue
		}
		var gen uint32 // an emptied state is nil: Gen 0
		if v.Reservation != nil {
			gen = v.Reservation.Gen
		}
		if gen < g {
			t.Errorf("volume %s: reservation %+v, acknowledged Gen %d", name, v.Reservation, g)
		}
	}
	t.Logf("%d replicated volumes, %d replica and %d reservation commands acknowledged; snapshot commands acknowledged: %v", len(replicated), replicaOK, resvOK, snapOK)
	for name := range acked {
		if _, err := l.ReadVolume(ctx, name); err != nil {
			if errors.Is(err, ErrUnknownVolume) {
				t.Errorf("acknowledged volume %s lost (events %v)", name, events)
				continue
			}
			t.Fatal(err)
		}
	}
}
