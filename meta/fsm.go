package meta

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// MaxSnapshotBytes bounds a snapshot Restore reads: a registry at every
// limit (MaxVolumes volumes with MaxHostsPerVolume hosts each would be far
// more, but such a registry is not a design point) stays well under 256 MiB.
const MaxSnapshotBytes = 256 << 20

// FSM adapts State to raft.FSM. Apply runs on raft's FSM goroutine; the
// read methods may be called from any goroutine.
type FSM struct {
	mu sync.RWMutex
	s  *State

	// Plain counters for the edge to export; not part of the state.
	applied  atomic.Uint64 // commands applied, refused ones included
	refused  atomic.Uint64 // commands whose Result.Err was set
	restored atomic.Uint64 // snapshots restored
}

// FSMStats are the FSM's counters since it was created.
type FSMStats struct {
	Applied, Refused, Restored uint64
}

// Stats returns the FSM's counters.
func (f *FSM) Stats() FSMStats {
	return FSMStats{Applied: f.applied.Load(), Refused: f.refused.Load(), Restored: f.restored.Load()}
}

var _ raft.FSM = (*FSM)(nil)

// NewFSM returns an FSM over an empty registry.
func NewFSM() *FSM { return &FSM{s: NewState()} }

// Apply implements raft.FSM. It returns a Result; command failures are in
// Result.Err, never a panic.
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return Result{Index: l.Index}
	}
	f.mu.Lock()
	r := f.s.ApplyBytes(l.Index, l.Data)
	f.mu.Unlock()
	f.applied.Add(1)
	if r.Err != nil {
		f.refused.Add(1)
	}
	return r
}

// Snapshot implements raft.FSM. The registry is encoded here, under the read
// lock, so Persist (which raft runs concurrently with Apply) only writes bytes.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return fsmSnapshot(f.s.MarshalState()), nil
}

// Restore implements raft.FSM: it replaces the registry with the snapshot's.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxSnapshotBytes+1))
	if err != nil {
		return fmt.Errorf("meta: read snapshot: %w", err)
	}
	if len(b) > MaxSnapshotBytes {
		return fmt.Errorf("meta: snapshot over %d bytes: %w", MaxSnapshotBytes, ErrBadSnapshot)
	}
	s, err := UnmarshalState(b)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.s = s
	f.mu.Unlock()
	f.restored.Add(1)
	return nil
}

// Read calls fn with the registry under the read lock. fn must not keep
// references into the state or mutate it.
func (f *FSM) Read(fn func(*State)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.s)
}

// Export returns a copy of the registry in canonical form.
func (f *FSM) Export() Snapshot {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.s.Export()
}

// MarshalState returns the canonical encoding of the registry (what a
// snapshot holds).
func (f *FSM) MarshalState() []byte {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.s.MarshalState()
}

type fsmSnapshot []byte

func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("meta: write snapshot: %w", err)
	}
	return sink.Close()
}

func (fsmSnapshot) Release() {}
