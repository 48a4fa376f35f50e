package meta

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxSnapshots bounds a volume's snapshots (all states): each is a map
// in its nodes' stores, and a chain's length is what a store's Check and
// Changes walk (docs/snapshots.md §9, question 5).
const MaxSnapshots = 256

// SnapshotState is a snapshot's lifecycle state (docs/snapshots.md
// §2.1). The legal moves are validSnapshotTransition's.
type SnapshotState uint8

const (
	// SnapshotCreating: registered (CreateSnapshot); its nodes are
	// being asked to take it.
	SnapshotCreating SnapshotState = 1
	// SnapshotReady: taken on its Nodes (SnapshotDone); readable,
	// clonable, a revert target.
	SnapshotReady SnapshotState = 2
	// SnapshotDeleting: its nodes are freeing it (DeleteSnapshot);
	// PurgeSnapshot forgets it.
	SnapshotDeleting SnapshotState = 3
)

func (s SnapshotState) String() string {
	switch s {
	case SnapshotCreating:
		return "creating"
	case SnapshotReady:
		return "ready"
	case SnapshotDeleting:
		return "deleting"
	}
	return fmt.Sprintf("snapshot-state(%d)", uint8(s))
}

func (s SnapshotState) valid() bool { return s >= SnapshotCreating && s <= SnapshotDeleting }

// MarshalText encodes the state by name (see NodeState.MarshalText).
func (s SnapshotState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText is MarshalText's inverse.
func (s *SnapshotState) UnmarshalText(b []byte) error {
	for v := SnapshotCreating; v <= SnapshotDeleting; v++ {
		if v.String() == string(b) {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("meta: snapshot state %q: %w", b, ErrInvalid)
}

// validSnapshotTransition says whether a snapshot may move from one state
// to another: creating → ready (SnapshotDone), creating → deleting (a
// failed barrier), ready → deleting; nothing else.
func validSnapshotTransition(from, to SnapshotState) bool {
	switch from {
	case SnapshotCreating:
		return to == SnapshotReady || to == SnapshotDeleting
	case SnapshotReady:
		return to == SnapshotDeleting
	}
	return false
}

// VolumeSnapshot is a read-only point-in-time copy of a volume. It
// belongs to its volume (Volume.Snapshots): it lives on the volume's
// nodes and has no NQN, host nor connection. (meta.Snapshot is the raft
// snapshot of the registry.)
type VolumeSnapshot struct {
	Name      string        `json:"name"`       // name grammar; unique in its volume; shown as VOL@NAME
	ID        uint64        `json:"id"`         // store object ID, from the volume ID counter (never reused)
	SizeBytes uint64        `json:"size_bytes"` // the volume's size when taken
	CreatedAt int64         `json:"created_at"` // Unix nanoseconds, from the command
	State     SnapshotState `json:"state"`
	// Parent is the snapshot's store parent: an earlier snapshot of its
	// volume, or, for a clone's first snapshot, the clone's origin (a
	// snapshot of another volume); 0: none.
	Parent uint64 `json:"parent,omitempty"`
	// Nodes hold a copy: the volume's in-sync replicas when it was taken,
	// then every replica a rebuild carried it to (SnapshotNodes). Always
	// among the volume's replicas.
	Nodes []string `json:"nodes"`
	// Origin is, for a snapshot made by an import, the exported
	// snapshot's "cluster/ID" (docs/snapshots.md §5); "": none.
	Origin string `json:"origin,omitempty"`
}

func (s *VolumeSnapshot) clone() VolumeSnapshot {
	c := *s
	c.Nodes = slices.Clone(s.Nodes)
	return c
}

// SnapshotRef names a snapshot from outside its volume (a clone's
// origin).
type SnapshotRef struct {
	Volume   string `json:"volume"`
	Snapshot string `json:"snapshot"`
	ID       uint64 `json:"id"`
}

// String is the snapshot as operators name it, VOL@SNAP.
func (r SnapshotRef) String() string { return r.Volume + "@" + r.Snapshot }

// FlattenState is a flatten in progress (FlattenVolume).
type FlattenState struct {
	Since int64 `json:"since"` // Unix nanoseconds, from the command
}

// Snapshot returns a copy of the volume's snapshot of that name.
func (v *Volume) Snapshot(name string) (VolumeSnapshot, bool) {
	if i := v.snapshotIndex(name); i >= 0 {
		return v.Snapshots[i].clone(), true
	}
	return VolumeSnapshot{}, false
}

// SnapshotByID returns a copy of the volume's snapshot with that store ID.
func (v *Volume) SnapshotByID(id uint64) (VolumeSnapshot, bool) {
	for i := range v.Snapshots {
		if v.Snapshots[i].ID == id {
			return v.Snapshots[i].clone(), true
		}
	}
	return VolumeSnapshot{}, false
}

func (v *Volume) snapshotIndex(name string) int {
	return slices.IndexFunc(v.Snapshots, func(s VolumeSnapshot) bool { return s.Name == name })
}

// ref is the volume's snapshot s as a SnapshotRef.
func (v *Volume) ref(s *VolumeSnapshot) SnapshotRef {
	return SnapshotRef{Volume: v.Name, Snapshot: s.Name, ID: s.ID}
}

// SnapshotByID finds the snapshot with store ID id in any volume: its
// volume's name and a copy of it.
func (s *State) SnapshotByID(id uint64) (volume string, snap VolumeSnapshot, ok bool) {
	if v, sn := s.findSnapshot(id); sn != nil {
		return v.Name, sn.clone(), true
	}
	return "", VolumeSnapshot{}, false
}

func (s *State) findSnapshot(id uint64) (*Volume, *VolumeSnapshot) {
	v, ok := s.vols[s.snaps[id]]
	if !ok {
		return nil, nil
	}
	for i := range v.Snapshots {
		if v.Snapshots[i].ID == id {
			return v, &v.Snapshots[i]
		}
	}
	return nil, nil
}

// Children returns the objects whose store parent is the snapshot with
// ID id: snapshots (of any volume) and volumes (by name; the snapshot's
// own volume, clones), each sorted: the store forest as the registry
// knows it. A snapshot that would be left more than one child cannot be
// deleted (its clusters would have to go to two maps; see
// liveChildren).
func (s *State) Children(id uint64) (snaps []SnapshotRef, vols []string) {
	if id == 0 {
		return nil, nil
	}
	for _, v := range s.vols {
		if v.Parent == id {
			vols = append(vols, v.Name)
		}
		for i := range v.Snapshots {
			if v.Snapshots[i].Parent == id {
				snaps = append(snaps, v.ref(&v.Snapshots[i]))
			}
		}
	}
	slices.SortFunc(snaps, func(a, b SnapshotRef) int { return strings.Compare(a.String(), b.String()) })
	slices.Sort(vols)
	return snaps, vols
}

// Clones returns the names of the volumes other than volume (sorted)
// that are children of the snapshot with ID id, directly or through a
// snapshot of theirs: its clones, as listings show them (those being
// deleted included; they no longer keep it from being deleted).
func (s *State) Clones(volume string, id uint64) []string {
	snaps, vols := s.Children(id)
	var out []string
	for _, c := range snaps {
		if c.Volume != volume {
			out = append(out, c.Volume)
		}
	}
	for _, n := range vols {
		if n != volume {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Check is what CreateSnapshot requires of its own fields, whatever the
// registry holds (as CreateVolume.Check): a snapshot name in the name
// grammar, which keeps '@' out of it, so VOL@SNAP is never ambiguous.
// Apply requires it too: snapshot names are new, so every one in the log
// is in the grammar.
// An Origin, when given, is "cluster/ID": a cluster ID of printable
// characters and a positive decimal ID, at most MaxOriginLen bytes.
func (c CreateSnapshot) Check() error {
	if err := checkNewName("snapshot name", c.Name); err != nil {
		return err
	}
	return checkOrigin(c.Origin)
}

// MaxOriginLen bounds a snapshot's Origin.
const MaxOriginLen = 300

func checkOrigin(o string) error {
	if o == "" {
		return nil
	}
	i := strings.LastIndexByte(o, '/')
	cluster, id := o[:max(i, 0)], o[i+1:]
	n, err := strconv.ParseUint(id, 10, 64)
	switch {
	case len(o) > MaxOriginLen:
		return fmt.Errorf("meta: snapshot origin of %d bytes, more than %d: %w", len(o), MaxOriginLen, ErrInvalid)
	case i < 0 || err != nil || n == 0 || strconv.FormatUint(n, 10) != id:
		return fmt.Errorf("meta: snapshot origin %q is not \"cluster/ID\": %w", o, ErrInvalid)
	case strings.IndexFunc(cluster, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return fmt.Errorf("meta: snapshot origin %q holds a control character: %w", o, ErrInvalid)
	}
	return nil
}

// Check is what CloneVolume requires of its own fields, whatever the
// registry holds (as CreateVolume.Check): the clone's name in the name
// grammar, its NQN (when given) and replica secret well formed.
func (c CloneVolume) Check() error {
	if err := CheckVolumeName(c.Name); err != nil {
		return err
	}
	if c.NQN != "" {
		if err := checkNQN(c.NQN); err != nil {
			return err
		}
	}
	return checkReplicaSecret(c.Name, c.ReplicaSecret)
}

// snapName is how messages name a snapshot: VOL@SNAP.
func snapName(volume, snap string) string { return volume + "@" + snap }

// serving says whether a volume in state st exists on its nodes and is
// served: what a snapshot, a revert or a flatten needs.
func serving(st VolumeState) bool {
	return st == VolumeOnline || st == VolumeOffline || st == VolumeDegraded
}

// liveVolume is a volume a snapshot command may change: known and not
// being deleted.
func (s *State) liveVolume(name string) (*Volume, error) {
	v, err := s.volume(name)
	if err != nil {
		return nil, err
	}
	if v.State == VolumeDeleting {
		return nil, fmt.Errorf("meta: volume %q: %w", name, ErrVolumeDeleting)
	}
	return v, nil
}

func (v *Volume) snapshot(name string) (*VolumeSnapshot, error) {
	i := v.snapshotIndex(name)
	if i < 0 {
		return nil, fmt.Errorf("meta: snapshot %s: %w", snapName(v.Name, name), ErrUnknownSnapshot)
	}
	return &v.Snapshots[i], nil
}

// creatingSnapshot is v's snapshot being taken, nil if none (there is
// at most one).
func (v *Volume) creatingSnapshot() *VolumeSnapshot {
	for i := range v.Snapshots {
		if v.Snapshots[i].State == SnapshotCreating {
			return &v.Snapshots[i]
		}
	}
	return nil
}

// checkQuiet says why the live map of v cannot change base now (a
// snapshot, a revert, a flatten): a snapshot of it being taken, or its
// parent snapshot being deleted, which its nodes do by merging that
// snapshot into v's live map.
func (s *State) checkQuiet(v *Volume) error {
	if sn := v.creatingSnapshot(); sn != nil {
		return fmt.Errorf("meta: volume %q: snapshot %s is being taken: retry once it is done: %w", v.Name, snapName(v.Name, sn.Name), ErrBusy)
	}
	if pv, p := s.findSnapshot(v.Parent); p != nil && p.State == SnapshotDeleting {
		return fmt.Errorf("meta: volume %q: its base %s is being deleted (merged into it): retry once it is gone: %w", v.Name, snapName(pv.Name, p.Name), ErrBusy)
	}
	return nil
}

func (s *State) createSnapshot(c CreateSnapshot) Result {
	v, err := s.liveVolume(c.Volume)
	if err != nil {
		return Result{Err: err}
	}
	if !serving(v.State) {
		return Result{Err: fmt.Errorf("meta: volume %q is %v: %w", v.Name, v.State, ErrVolumeNotOnline)}
	}
	if err := c.Check(); err != nil {
		return Result{Err: err}
	}
	if i := v.snapshotIndex(c.Name); i >= 0 {
		what := ""
		if v.Snapshots[i].State == SnapshotDeleting {
			what = " (being deleted)"
		}
		return Result{Err: fmt.Errorf("meta: snapshot %s exists%s: choose another name: %w", snapName(v.Name, c.Name), what, ErrSnapshotExists)}
	}
	if err := s.checkQuiet(v); err != nil {
		return Result{Err: err}
	}
	if v.Flatten != nil {
		// The flatten copies into the live map the snapshot would take.
		return Result{Err: fmt.Errorf("meta: volume %q is being flattened: snapshot it once that is done: %w", v.Name, ErrBusy)}
	}
	if len(v.Snapshots) >= MaxSnapshots {
		return Result{Err: fmt.Errorf("meta: volume %q has %d snapshots, the most it can: delete one first: %w", v.Name, MaxSnapshots, ErrLimit)}
	}
	sn := VolumeSnapshot{
		Name: c.Name, ID: s.nextVol, SizeBytes: v.SizeBytes, CreatedAt: c.At,
		State: SnapshotCreating, Parent: v.Parent, Nodes: v.InSync(), Origin: c.Origin,
	}
	s.nextVol++
	v.Snapshots = append(v.Snapshots, sn)
	s.snaps[sn.ID] = v.Name
	return snapResult(v, len(v.Snapshots)-1)
}

// snapResult is a snapshot command's result: the volume and its
// snapshot i after the command.
func snapResult(v *Volume, i int) Result {
	cp := v.clone()
	sn := cp.Snapshots[i].clone()
	return Result{Volume: &cp, Snapshot: &sn}
}

func (s *State) snapshotDone(c SnapshotDone) Result {
	v, err := s.replicaVolume(c.Volume, c.Epoch, true)
	if err != nil {
		return Result{Err: err}
	}
	sn, err := v.snapshot(c.Name)
	if err != nil {
		return Result{Err: err}
	}
	name := snapName(v.Name, c.Name)
	if !validSnapshotTransition(sn.State, SnapshotReady) {
		return Result{Err: fmt.Errorf("meta: snapshot %s is %v, not being taken: %w", name, sn.State, ErrBadTransition)}
	}
	if sn.Parent != v.Parent {
		// Unreachable: checkQuiet and DeleteSnapshot keep the volume's
		// base while a snapshot of it is taken.
		return Result{Err: fmt.Errorf("meta: snapshot %s: the volume's base changed while it was taken: %w", name, ErrInvalid)}
	}
	for i, n := range c.Nodes {
		if _, ok := v.Replica(n); !ok {
			return Result{Err: fmt.Errorf("meta: snapshot %s: node %q holds no replica of %q: %w", name, n, v.Name, ErrInvalid)}
		}
		if slices.Contains(c.Nodes[:i], n) {
			return Result{Err: fmt.Errorf("meta: snapshot %s: node %q listed twice: %w", name, n, ErrInvalid)}
		}
	}
	for _, n := range v.InSync() {
		if !slices.Contains(c.Nodes, n) {
			return Result{Err: fmt.Errorf("meta: snapshot %s: the in-sync replica on %q did not take it: %w", name, n, ErrInvalid)}
		}
	}
	sn.State, sn.Nodes = SnapshotReady, slices.Clone(c.Nodes)
	v.Parent = sn.ID
	return snapResult(v, v.snapshotIndex(c.Name))
}

// childNames names Children's answer for messages: snapshots as
// VOL@SNAP, then volumes.
func (s *State) childNames(snaps []SnapshotRef, vols []string) []string {
	out := make([]string, 0, len(snaps)+len(vols))
	for _, r := range snaps {
		out = append(out, r.String())
	}
	return append(out, vols...)
}

// liveChildren is what the children snaps and vols of a snapshot leave
// it once the nodes have freed those being deleted: a deleting volume is
// a leaf and leaves nothing; a deleting snapshot is merged into its own
// children, which take its place (recursively). The nodes merge a
// snapshot into its one child, so that is what must count, not the
// direct children: counting only those, a snapshot could be deleted
// with one child left while a deleting child of it still had one.
func (s *State) liveChildren(snaps []SnapshotRef, vols []string) ([]SnapshotRef, []string) {
	var outSnaps []SnapshotRef
	var outVols []string
	for _, n := range vols {
		if s.vols[n].State != VolumeDeleting {
			outVols = append(outVols, n)
		}
	}
	for _, r := range snaps {
		if _, c := s.findSnapshot(r.ID); c.State != SnapshotDeleting {
			outSnaps = append(outSnaps, r)
			continue
		}
		// The chain is a forest (checked at load, kept by every
		// command), so this ends.
		cs, cv := s.liveChildren(s.Children(r.ID))
		outSnaps, outVols = append(outSnaps, cs...), append(outVols, cv...)
	}
	slices.SortFunc(outSnaps, func(a, b SnapshotRef) int { return strings.Compare(a.String(), b.String()) })
	slices.Sort(outVols)
	return outSnaps, outVols
}

// checkDeletable says why snapshot sn of v cannot be deleted now. Its
// nodes free it by merging its clusters into its one child, so it may
// have at most one; that child must not be changing base itself (a
// snapshot being taken, a clone being created or flattened).
func (s *State) checkDeletable(v *Volume, sn *VolumeSnapshot) error {
	name := snapName(v.Name, sn.Name)
	snaps, vols := s.Children(sn.ID)
	// A snapshot being taken has the same parent as its volume: its
	// base then has two children, but the news an operator needs is
	// that the barrier is running.
	for _, r := range snaps {
		if _, c := s.findSnapshot(r.ID); c.State == SnapshotCreating {
			return fmt.Errorf("meta: snapshot %s: %s is being taken on it: retry once it is done: %w", name, r, ErrBusy)
		}
	}
	snaps, vols = s.liveChildren(snaps, vols)
	if len(snaps)+len(vols) > 1 {
		var clones []string
		for _, r := range snaps {
			if r.Volume != v.Name {
				clones = append(clones, r.Volume)
			}
		}
		for _, n := range vols {
			if n != v.Name {
				clones = append(clones, n)
			}
		}
		if len(clones) > 0 {
			slices.Sort(clones)
			clones = slices.Compact(clones)
			return fmt.Errorf("meta: snapshot %s has clones %s: flatten them (blkctl volume flatten %s) or delete them first: %w", name, strings.Join(clones, ", "), clones[0], ErrHasClones)
		}
		all := s.childNames(snaps, vols)
		return fmt.Errorf("meta: snapshot %s is the base of %s and of %s: delete %s first: %w", name, strings.Join(all[:len(all)-1], ", "), all[len(all)-1], all[0], ErrHasChildren)
	}
	for _, n := range vols {
		w := s.vols[n]
		switch {
		case w.Flatten != nil:
			return fmt.Errorf("meta: snapshot %s: clone %q is being flattened: delete %s once that is done: %w", name, n, name, ErrBusy)
		case w.State == VolumeCreating && n != v.Name:
			return fmt.Errorf("meta: snapshot %s: clone %q is being created: %w", name, n, ErrBusy)
		}
	}
	return nil
}

func (s *State) deleteSnapshot(c DeleteSnapshot) Result {
	v, err := s.volume(c.Volume)
	if err != nil {
		return Result{Err: err}
	}
	sn, err := v.snapshot(c.Name)
	if err != nil {
		return Result{Err: err}
	}
	if !validSnapshotTransition(sn.State, SnapshotDeleting) {
		return Result{Err: fmt.Errorf("meta: snapshot %s is being deleted already: %w", snapName(v.Name, c.Name), ErrBadTransition)}
	}
	if err := s.checkDeletable(v, sn); err != nil {
		return Result{Err: err}
	}
	sn.State = SnapshotDeleting
	return snapResult(v, v.snapshotIndex(c.Name))
}

func (s *State) purgeSnapshot(c PurgeSnapshot) Result {
	v, err := s.volume(c.Volume)
	if err != nil {
		return Result{Err: err}
	}
	sn, err := v.snapshot(c.Name)
	if err != nil {
		return Result{Err: err}
	}
	if sn.State != SnapshotDeleting {
		return Result{Err: fmt.Errorf("meta: purge snapshot %s in state %v: %w", snapName(v.Name, c.Name), sn.State, ErrBadTransition)}
	}
	id, parent := sn.ID, sn.Parent
	v.Snapshots = slices.Delete(v.Snapshots, v.snapshotIndex(c.Name), v.snapshotIndex(c.Name)+1)
	if len(v.Snapshots) == 0 {
		v.Snapshots = nil
	}
	delete(s.snaps, id)
	// Its nodes merged it into its one child, which now reads through
	// its parent: re-parent, and move a clone's origin up the chain.
	var origin *SnapshotRef
	if pv, p := s.findSnapshot(parent); p != nil {
		r := pv.ref(p)
		origin = &r
	}
	for _, w := range s.vols {
		if w.Parent == id {
			w.Parent = parent
		}
		for i := range w.Snapshots {
			if w.Snapshots[i].Parent == id {
				w.Snapshots[i].Parent = parent
			}
		}
		if w.CloneOf != nil && w.CloneOf.ID == id {
			if origin == nil {
				// The merge gave the clone every cluster it read:
				// nothing is shared any more.
				w.CloneOf, w.Flatten = nil, nil
			} else {
				o := *origin
				w.CloneOf = &o
			}
		}
	}
	cp := v.clone()
	return Result{Volume: &cp}
}

// cloneNodes are the nodes a clone of sn (a snapshot of src) is placed
// on: those of sn's Nodes that are up, src's primary first when it is
// one of them.
func (s *State) cloneNodes(src *Volume, sn *VolumeSnapshot) []string {
	var out []string
	for _, id := range sn.Nodes {
		if n, ok := s.nodes[id]; ok && n.State == NodeUp {
			out = append(out, id)
		}
	}
	if i := slices.Index(out, src.Node); i > 0 {
		out = slices.Insert(slices.Delete(out, i, i+1), 0, src.Node)
	}
	return out
}

func (s *State) cloneVolume(c CloneVolume) Result {
	src, err := s.volume(c.Volume)
	if err != nil {
		return Result{Err: err}
	}
	sn, err := src.snapshot(c.Snapshot)
	if err != nil {
		return Result{Err: err}
	}
	name := snapName(src.Name, sn.Name)
	if sn.State != SnapshotReady {
		return Result{Err: fmt.Errorf("meta: snapshot %s is %v: %w", name, sn.State, ErrSnapshotNotReady)}
	}
	if err := c.Check(); err != nil {
		return Result{Err: err}
	}
	nqn := c.NQN
	if nqn == "" {
		nqn = DefaultNQN(c.Name)
	}
	if _, ok := s.vols[c.Name]; ok {
		return Result{Err: fmt.Errorf("meta: volume %q: %w", c.Name, ErrVolumeExists)}
	}
	if other, ok := s.nqns[nqn]; ok {
		return Result{Err: fmt.Errorf("meta: NQN %q belongs to volume %q: %w", nqn, other, ErrNQNInUse)}
	}
	nodes := s.cloneNodes(src, sn)
	if len(nodes) == 0 {
		return Result{Err: fmt.Errorf("meta: clone %q of %s: no node holding a copy of it is up (%s): %w", c.Name, name, strings.Join(sn.Nodes, ", "), ErrNodeNotUp)}
	}
	for _, id := range nodes {
		if free := s.free(s.nodes[id]); free < sn.SizeBytes {
			return Result{Err: fmt.Errorf("meta: clone %q of %s, %d bytes: node %q may be promised %d more bytes: %w", c.Name, name, sn.SizeBytes, id, free, ErrNoCapacity)}
		}
	}
	if len(s.vols) >= MaxVolumes {
		return Result{Err: fmt.Errorf("meta: %d volumes: %w", MaxVolumes, ErrLimit)}
	}
	origin := src.ref(sn)
	v := &Volume{
		Name: c.Name, ID: s.nextVol, SizeBytes: sn.SizeBytes, BlockSize: src.BlockSize,
		Node: nodes[0], State: VolumeCreating, NQN: nqn, CreatedAt: c.At,
		// The copies of one snapshot are identical: every replica
		// starts in sync.
		Epoch: 1, Want: src.WantReplicas(),
		Parent: sn.ID, CloneOf: &origin,
	}
	for _, n := range nodes {
		v.Replicas = append(v.Replicas, Replica{Node: n, State: ReplicaInSync, Since: c.At})
	}
	setReplicaSecret(v, c.ReplicaSecret)
	s.nextVol++
	s.vols[v.Name] = v
	s.nqns[nqn] = v.Name
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) flattenVolume(c FlattenVolume) Result {
	v, err := s.liveVolume(c.Name)
	if err != nil {
		return Result{Err: err}
	}
	if v.CloneOf == nil {
		return Result{Err: fmt.Errorf("meta: volume %q is not a clone: %w", v.Name, ErrNotClone)}
	}
	if v.Flatten != nil {
		return Result{Err: fmt.Errorf("meta: volume %q is being flattened already: %w", v.Name, ErrBusy)}
	}
	if !serving(v.State) {
		return Result{Err: fmt.Errorf("meta: volume %q is %v: %w", v.Name, v.State, ErrVolumeNotOnline)}
	}
	if len(v.Snapshots) > 0 {
		return Result{Err: fmt.Errorf("meta: clone %q has snapshots %s, which share %s's clusters too (a flatten copies into the live volume only): delete them first: %w", v.Name, strings.Join(v.snapshotNames(false), ", "), v.CloneOf, ErrHasSnapshots)}
	}
	if err := s.checkQuiet(v); err != nil {
		return Result{Err: err}
	}
	v.Flatten = &FlattenState{Since: c.At}
	cp := v.clone()
	return Result{Volume: &cp}
}

// snapshotNames are the names of v's snapshots as VOL@SNAP, in creation
// order; without deleting, those not being deleted only.
func (v *Volume) snapshotNames(deleting bool) []string {
	var out []string
	for _, sn := range v.Snapshots {
		if deleting || sn.State != SnapshotDeleting {
			out = append(out, snapName(v.Name, sn.Name))
		}
	}
	return out
}

func (s *State) flattenDone(c FlattenDone) Result {
	v, err := s.volume(c.Name)
	if err != nil {
		return Result{Err: err}
	}
	if v.Flatten == nil {
		return Result{Err: fmt.Errorf("meta: volume %q is not being flattened: %w", v.Name, ErrBadTransition)}
	}
	v.CloneOf, v.Flatten, v.Parent = nil, nil, 0
	cp := v.clone()
	return Result{Volume: &cp}
}

// connNames names the connections to volume, "host H through node N",
// sorted.
func (s *State) connNames(volume string) []string {
	var out []string
	for k := range s.conns {
		if k.volume == volume {
			out = append(out, fmt.Sprintf("host %s is connected through node %s", k.host, k.node))
		}
	}
	slices.Sort(out)
	return out
}

func (s *State) revertVolume(index uint64, c RevertVolume) Result {
	v, err := s.replicaVolume(c.Name, c.Epoch, true)
	if err != nil {
		return Result{Err: err}
	}
	if !serving(v.State) {
		return Result{Err: fmt.Errorf("meta: volume %q is %v: %w", v.Name, v.State, ErrVolumeNotOnline)}
	}
	sn, err := v.snapshot(c.Snapshot)
	if err != nil {
		return Result{Err: err}
	}
	name := snapName(v.Name, sn.Name)
	if sn.State != SnapshotReady {
		return Result{Err: fmt.Errorf("meta: snapshot %s is %v: %w", name, sn.State, ErrSnapshotNotReady)}
	}
	if conns := s.connNames(v.Name); len(conns) > 0 {
		// Hosts cache what they read: a revert under them would
		// corrupt their file systems.
		return Result{Err: fmt.Errorf("meta: volume %q: %s: detach first: %w", v.Name, strings.Join(conns, "; "), ErrHasConnections)}
	}
	if err := s.checkQuiet(v); err != nil {
		return Result{Err: err}
	}
	for _, r := range v.ReplicaSet() {
		switch {
		case r.State == ReplicaRebuilding:
			return Result{Err: fmt.Errorf("meta: volume %q: the replica on %s is rebuilding: revert once it is done: %w", v.Name, r.Node, ErrBusy)}
		case r.State == ReplicaInSync && !slices.Contains(sn.Nodes, r.Node):
			return Result{Err: fmt.Errorf("meta: volume %q: the in-sync replica on %s holds no copy of %s yet: %w", v.Name, r.Node, name, ErrBusy)}
		}
	}
	epoch := v.CurrentEpoch()
	v.explicit(v.Node)
	v.SizeBytes, v.Parent, v.Reverted, v.Epoch = sn.SizeBytes, sn.ID, index, epoch+1
	cp := v.clone()
	return Result{Volume: &cp}
}

func (s *State) snapshotNodes(c SnapshotNodes) Result {
	v, err := s.liveVolume(c.Volume)
	if err != nil {
		return Result{Err: err}
	}
	sn, err := v.snapshot(c.Snapshot)
	if err != nil {
		return Result{Err: err}
	}
	name := snapName(v.Name, sn.Name)
	switch {
	case (c.Add == "") == (c.Remove == ""):
		return Result{Err: fmt.Errorf("meta: snapshot %s: set one of add and remove: %w", name, ErrInvalid)}
	case c.Add != "":
		if sn.State != SnapshotReady {
			return Result{Err: fmt.Errorf("meta: snapshot %s is %v: %w", name, sn.State, ErrSnapshotNotReady)}
		}
		if _, ok := v.Replica(c.Add); !ok {
			return Result{Err: fmt.Errorf("meta: snapshot %s: volume %q has no replica on node %q: %w", name, v.Name, c.Add, ErrUnknownNode)}
		}
		if !slices.Contains(sn.Nodes, c.Add) {
			sn.Nodes = append(sn.Nodes, c.Add)
		}
	default:
		sn.Nodes = slices.DeleteFunc(sn.Nodes, func(n string) bool { return n == c.Remove })
	}
	return snapResult(v, v.snapshotIndex(c.Snapshot))
}

// dropSnapshotNode forgets node's copies of v's snapshots: its replica
// is gone, and with it the store that held them.
func (v *Volume) dropSnapshotNode(node string) {
	for i := range v.Snapshots {
		v.Snapshots[i].Nodes = slices.DeleteFunc(v.Snapshots[i].Nodes, func(n string) bool { return n == node })
	}
}

// checkDeleteSnapshots is DeleteVolume's check of v's snapshots: with
// them, none may have a clone not being deleted; without, it may have
// none but those being deleted already.
func (s *State) checkDeleteSnapshots(v *Volume, with bool) error {
	if !with {
		if names := v.snapshotNames(false); len(names) > 0 {
			return fmt.Errorf("meta: volume %q has snapshots %s: delete them, or delete the volume with its snapshots: %w", v.Name, strings.Join(names, ", "), ErrHasSnapshots)
		}
		return nil
	}
	// One pass over the registry, not one per snapshot. A volume's
	// objects (it, its snapshots) form one tree whose root reads through
	// its CloneOf (kept by every command), so a volume not being deleted
	// whose CloneOf is one of v's snapshots is what keeps them: whether
	// it reads through that snapshot directly, through snapshots of its
	// own, or through some being deleted.
	own := make(map[uint64]bool, len(v.Snapshots))
	for i := range v.Snapshots {
		own[v.Snapshots[i].ID] = true
	}
	clones := map[uint64][]string{}
	for _, w := range s.vols {
		if w != v && w.State != VolumeDeleting && w.CloneOf != nil && own[w.CloneOf.ID] {
			clones[w.CloneOf.ID] = append(clones[w.CloneOf.ID], w.Name)
		}
	}
	for i := range v.Snapshots {
		sn := &v.Snapshots[i]
		if names := clones[sn.ID]; len(names) > 0 {
			slices.Sort(names)
			names = slices.Compact(names)
			return fmt.Errorf("meta: snapshot %s has clones %s: flatten them (blkctl volume flatten %s) or delete them first: %w", snapName(v.Name, sn.Name), strings.Join(names, ", "), names[0], ErrHasClones)
		}
	}
	return nil
}

// checkSnapshots checks the snapshot invariants of a registry loaded
// from a snapshot (docs/snapshots.md §2.2): snapshots in a valid state,
// named once in their volume, held only by the volume's replicas; store
// IDs unique across volumes and snapshots and below the next ID; every
// Parent an existing snapshot, with no cycle; a clone's origin existing;
// a flatten only of a clone.
func (s *State) checkSnapshots() error {
	ids := make(map[uint64]string)
	use := func(id uint64, what string) error {
		if id == 0 || id >= s.nextVol {
			return fmt.Errorf("%s: ID %d outside 1..%d", what, id, s.nextVol-1)
		}
		if o, dup := ids[id]; dup {
			return fmt.Errorf("%s and %s share ID %d", what, o, id)
		}
		ids[id] = what
		return nil
	}
	parents := make(map[uint64]uint64) // object ID → parent ID
	for _, v := range s.vols {
		if err := use(v.ID, "volume "+v.Name); err != nil {
			return err
		}
		parents[v.ID] = v.Parent
		for i := range v.Snapshots {
			sn := &v.Snapshots[i]
			name := snapName(v.Name, sn.Name)
			if err := use(sn.ID, "snapshot "+name); err != nil {
				return err
			}
			if !sn.State.valid() || checkName("snapshot name", sn.Name) != nil || v.snapshotIndex(sn.Name) != i {
				return fmt.Errorf("snapshot %s %v", name, sn.State)
			}
			for j, n := range sn.Nodes {
				if _, ok := v.Replica(n); !ok || slices.Contains(sn.Nodes[:j], n) {
					return fmt.Errorf("snapshot %s: node %q holds no replica of it or is listed twice", name, n)
				}
			}
			parents[sn.ID] = sn.Parent
		}
		if v.Flatten != nil && v.CloneOf == nil {
			return fmt.Errorf("volume %q: a flatten of no clone", v.Name)
		}
	}
	for id, p := range parents {
		if p == 0 {
			continue
		}
		if pv, ps := s.findSnapshot(p); ps == nil {
			return fmt.Errorf("%s: parent %d is no snapshot", ids[id], p)
		} else if _, isSnap := parents[p]; !isSnap || pv == nil {
			return fmt.Errorf("%s: parent %d", ids[id], p)
		}
		// A chain longer than the objects there are has a cycle.
		n := 0
		for q := p; q != 0; q = parents[q] {
			if n++; n > len(parents) {
				return fmt.Errorf("%s: its parents form a cycle", ids[id])
			}
		}
	}
	for _, v := range s.vols {
		if v.CloneOf == nil {
			continue
		}
		if ov, o := s.findSnapshot(v.CloneOf.ID); o == nil || ov.Name != v.CloneOf.Volume || o.Name != v.CloneOf.Snapshot || ov == v {
			return fmt.Errorf("volume %q: clone of %s (ID %d), which is not there", v.Name, v.CloneOf, v.CloneOf.ID)
		}
	}
	return nil
}
