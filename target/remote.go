package target

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/blk-project/blk/nvme"
)

// RemoteSubsystem is an NVM subsystem that other targets serve: the
// discovery log lists it, after this target's own subsystems, to the
// hosts it admits, once per path, so that a host discovering through any
// target of a cluster learns every volume of the cluster (nvme
// connect-all) in one round trip (docs/reservations.md §3). It is only
// listed: no controller of this target serves it.
type RemoteSubsystem struct {
	// NQN is the subsystem's NQN: a well-formed NQN, not the discovery
	// NQN. A subsystem this target serves itself is not listed from
	// here: its own entries and SubsystemConfig.Paths already cover it.
	NQN string
	// AllowAny lists it to every host; otherwise to the host NQNs in
	// Hosts only, as the serving targets admit them.
	AllowAny bool
	Hosts    []string
	// Paths are the serving targets' ports, as SubsystemConfig.Paths:
	// ID the PORTID the serving target gives the port, TrAddr a specific
	// address. Listed in the order given.
	Paths []Port
}

// checkRemote checks one remote subsystem as AddSubsystem and SetPaths
// check theirs, and returns it with its hosts sorted and its paths
// checked, each a copy.
func checkRemote(r RemoteSubsystem) (RemoteSubsystem, error) {
	if err := nvme.ValidateNQN(r.NQN); err != nil || r.NQN == nvme.DiscoveryNQN {
		return r, fmt.Errorf("target: remote subsystem NQN %q: %w", r.NQN, ErrInvalid)
	}
	for _, h := range r.Hosts {
		if err := nvme.ValidateNQN(h); err != nil {
			return r, fmt.Errorf("target: remote subsystem %s: host NQN %q: %w", r.NQN, h, ErrInvalid)
		}
	}
	paths, err := checkPaths(r.Paths)
	if err != nil {
		return r, fmt.Errorf("target: remote subsystem %s: %w", r.NQN, err)
	}
	r.Paths = paths
	r.Hosts = slices.Clone(r.Hosts)
	slices.Sort(r.Hosts)
	r.Hosts = slices.Compact(r.Hosts)
	return r, nil
}

// SetRemoteSubsystems replaces the list of remote subsystems. Every entry
// is checked (a bad NQN, host NQN or path, or two entries of one NQN,
// fail the call and change nothing) and kept sorted by NQN. A change
// bumps GENCTR and sends the discovery log change notice to every
// discovery controller that enabled it; the same list again does
// nothing, so a caller may set it on every refresh.
func (t *Target) SetRemoteSubsystems(l []RemoteSubsystem) error {
	out := make([]RemoteSubsystem, 0, len(l))
	for _, r := range l {
		c, err := checkRemote(r)
		if err != nil {
			return err
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b RemoteSubsystem) int { return cmp.Compare(a.NQN, b.NQN) })
	for i := 1; i < len(out); i++ {
		if out[i].NQN == out[i-1].NQN {
			return fmt.Errorf("target: remote subsystem %s listed twice: %w", out[i].NQN, ErrInvalid)
		}
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ErrClosed
	}
	if slices.EqualFunc(t.remote, out, remoteEqual) {
		t.mu.Unlock()
		return nil
	}
	t.remote = out
	t.genctr.Add(1)
	t.mu.Unlock()
	t.discoveryChanged()
	return nil
}

// RemoteSubsystems returns the remote subsystems, by NQN.
func (t *Target) RemoteSubsystems() []RemoteSubsystem {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]RemoteSubsystem, len(t.remote))
	for i, r := range t.remote {
		r.Hosts = slices.Clone(r.Hosts)
		r.Paths = slices.Clone(r.Paths)
		out[i] = r
	}
	return out
}

// remoteEqual compares two checked remote subsystems (hosts sorted).
func remoteEqual(a, b RemoteSubsystem) bool {
	return a.NQN == b.NQN && a.AllowAny == b.AllowAny && slices.Equal(a.Hosts, b.Hosts) &&
		slices.EqualFunc(a.Paths, b.Paths, portEqual)
}

// portEqual compares two ports by value (Limits by what they point to).
func portEqual(a, b Port) bool {
	la, lb := a.Limits, b.Limits
	a.Limits, b.Limits = nil, nil
	if a != b || (la == nil) != (lb == nil) {
		return false
	}
	return la == nil || *la == *lb
}

// admits says whether the discovery log lists r to host.
func (r *RemoteSubsystem) admits(host string) bool {
	if r.AllowAny {
		return true
	}
	_, ok := slices.BinarySearch(r.Hosts, host)
	return ok
}

// remoteListed returns the remote subsystems the discovery log lists to
// host: those it admits that this target does not serve. The list is
// t.remote's entries themselves (never changed in place). Requires t.mu.
func (t *Target) remoteListed(host string) []RemoteSubsystem {
	var out []RemoteSubsystem
	for i := range t.remote {
		r := &t.remote[i]
		if _, served := t.subsystems[r.NQN]; served || !r.admits(host) || len(r.Paths) == 0 {
			continue
		}
		out = append(out, *r)
	}
	return out
}
