package control

import (
	"encoding"
	"fmt"
)

// State is a volume's state on its owner node: what the reconciler last
// made of the registry's intent there.
type State uint8

const (
	// StateCreating: the store volume is being made.
	StateCreating State = iota + 1
	// StateOnline: served — subsystem, namespace 1 and allowed hosts up.
	StateOnline
	// StateOffline: present in the store, not served (the registry says
	// offline).
	StateOffline
	// StateFailed: cannot be served; Status.Reason says why. The next
	// reconcile retries.
	StateFailed
	// StateDeleting: being removed from the target and the store.
	StateDeleting
	// StateDeleted: gone from this node; the registry may forget it.
	StateDeleted
	// StateDegraded: served, but not fully: the store refuses writes (its
	// disk is under the reserve); reads go on. Status.Reason says why.
	StateDegraded
	// StateStandby: a secondary replica: the store volume exists at the
	// registry's shape, the node does not serve it to hosts (the
	// primary does).
	StateStandby
)

var stateNames = [...]string{
	StateCreating: "creating", StateOnline: "online", StateOffline: "offline",
	StateFailed: "failed", StateDeleting: "deleting", StateDeleted: "deleted",
	StateDegraded: "degraded", StateStandby: "standby",
}

func (s State) String() string {
	if int(s) < len(stateNames) && stateNames[s] != "" {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

var (
	_ encoding.TextMarshaler   = State(0)
	_ encoding.TextUnmarshaler = (*State)(nil)
)

// MarshalText encodes the state by name.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText is MarshalText's inverse.
func (s *State) UnmarshalText(b []byte) error {
	for v := StateCreating; v <= StateStandby; v++ {
		if v.String() == string(b) {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("control: volume state %q", b)
}

// next lists the states each state may move to. A volume the reconciler
// has not seen yet (state 0) may enter any state, StateDeleted included
// (a deleting volume whose data is already gone).
var next = map[State][]State{
	0:             {StateCreating, StateOnline, StateOffline, StateFailed, StateDeleting, StateDeleted, StateDegraded, StateStandby},
	StateCreating: {StateOnline, StateOffline, StateFailed, StateDeleting, StateDegraded, StateStandby},
	StateOnline:   {StateOnline, StateOffline, StateFailed, StateDeleting, StateDegraded, StateStandby},
	StateOffline:  {StateOnline, StateOffline, StateFailed, StateDeleting, StateStandby},
	StateFailed:   {StateCreating, StateOnline, StateOffline, StateFailed, StateDeleting, StateDegraded, StateStandby},
	StateDegraded: {StateOnline, StateOffline, StateFailed, StateDeleting, StateDegraded, StateStandby},
	StateStandby:  {StateOnline, StateOffline, StateFailed, StateDeleting, StateDegraded, StateStandby},
	StateDeleting: {StateDeleted, StateFailed},
	StateDeleted:  {StateCreating},
}

// validTransition says whether a volume may move from one state to
// another.
func validTransition(from, to State) bool {
	for _, s := range next[from] {
		if s == to {
			return true
		}
	}
	return false
}
