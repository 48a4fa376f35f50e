package meta

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Registered hosts (docs/operations.md §1.9): the hosts that exist, by
// host NQN, each with the name an operator (or the CSI node plugin, with
// its Kubernetes node name) gave it and its zone. A registration grants
// nothing: which host may connect to which volume is the volume's allow
// list (AllowHost). The CSI controller asks the registry whether a node
// exists (the spec's NotFound for an unknown node), and blkctl host list
// shows them.

// FeatureHosts: the node applies RegisterHost (Op 31) and UnregisterHost
// (Op 32) and keeps the registered hosts in its registry and snapshots.
// An older binary fails to decode those commands: Node.Apply proposes
// them only when every registered node has it.
const FeatureHosts = "hosts"

// MaxHosts bounds the registered hosts, as MaxVolumes bounds volumes: at
// the bound, with the longest NQN, name and zone, they are about 35 MiB
// of a snapshot (MaxSnapshotBytes is 256 MiB).
const MaxHosts = 1 << 16

// ErrUnknownHost: no registered host has that NQN.
var ErrUnknownHost = errors.New("meta: unknown host")

// Host is a registered host.
type Host struct {
	HostNQN string `json:"host_nqn"`
	// Name is the host's name for people (a Kubernetes node name), in
	// the name grammar; "": none given.
	Name string `json:"name,omitempty"`
	// Zone is the host's failure domain, in the name grammar; "": none.
	Zone string `json:"zone,omitempty"`
	// RegisteredAt is when the host first registered (Unix nanoseconds,
	// from the RegisterHost command); registering again keeps it.
	RegisteredAt int64 `json:"registered_at"`
}

// RegisterHost registers host HostNQN, or updates the name and zone of a
// registered one (an idempotent upsert: the CSI node plugin registers at
// every start and in every NodeGetInfo). Refused with ErrInvalid for an
// NQN, name or zone outside their grammar, with ErrLimit when MaxHosts
// hosts are registered and HostNQN is not one of them.
type RegisterHost struct {
	HostNQN string `json:"host_nqn"`
	Name    string `json:"name,omitempty"`
	Zone    string `json:"zone,omitempty"`
	At      int64  `json:"at"` // Unix nanoseconds, set by the proposer
}

// UnregisterHost forgets a registered host; refused with ErrUnknownHost
// for one that is not. The volumes' allow lists are not touched: they
// name hosts whether registered or not.
type UnregisterHost struct {
	HostNQN string `json:"host_nqn"`
}

func (RegisterHost) Op() Op   { return OpRegisterHost }
func (UnregisterHost) Op() Op { return OpUnregisterHost }

// Check validates the command's fields: the NQN's shape (checkNQN; the
// API checks the NVMe grammar before it proposes), the name and zone
// against the name grammar (the commands are new, so Apply holds every
// entry to it).
func (c RegisterHost) Check() error {
	if err := checkNQN(c.HostNQN); err != nil {
		return err
	}
	if c.Name != "" {
		if err := checkNewName("host name", c.Name); err != nil {
			return err
		}
	}
	if c.Zone != "" {
		return CheckZone(c.Zone)
	}
	return nil
}

// registerHost applies Op 31.
func (s *State) registerHost(c RegisterHost) Result {
	if err := c.Check(); err != nil {
		return Result{Err: err}
	}
	h, ok := s.hosts[c.HostNQN]
	if !ok {
		if len(s.hosts) >= MaxHosts {
			return Result{Err: fmt.Errorf("meta: host %s: %d hosts are registered (the most): unregister one first: %w", c.HostNQN, MaxHosts, ErrLimit)}
		}
		h = &Host{HostNQN: c.HostNQN, RegisteredAt: c.At}
		s.hosts[c.HostNQN] = h
	}
	h.Name, h.Zone = c.Name, c.Zone
	cp := *h
	return Result{Host: &cp}
}

// unregisterHost applies Op 32.
func (s *State) unregisterHost(c UnregisterHost) Result {
	h, ok := s.hosts[c.HostNQN]
	if !ok {
		return Result{Err: fmt.Errorf("meta: host %q: %w", c.HostNQN, ErrUnknownHost)}
	}
	delete(s.hosts, c.HostNQN)
	return Result{Host: h}
}

// Host returns the registered host with that NQN.
func (s *State) Host(nqn string) (Host, bool) {
	h, ok := s.hosts[nqn]
	if !ok {
		return Host{}, false
	}
	return *h, true
}

// Hosts returns the registered hosts, sorted by NQN.
func (s *State) Hosts() []Host {
	out := make([]Host, 0, len(s.hosts))
	for _, h := range s.hosts {
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b Host) int { return cmp.Compare(a.HostNQN, b.HostNQN) })
	return out
}

// restoreHosts loads a snapshot's hosts into s, checking what Apply
// guarantees: no NQN twice, every field in its grammar.
func (s *State) restoreHosts(hosts []Host) error {
	if len(hosts) > MaxHosts {
		return fmt.Errorf("%d hosts (at most %d)", len(hosts), MaxHosts)
	}
	for i := range hosts {
		h := hosts[i]
		if _, dup := s.hosts[h.HostNQN]; dup {
			return fmt.Errorf("host %q twice", h.HostNQN)
		}
		if err := (RegisterHost{HostNQN: h.HostNQN, Name: h.Name, Zone: h.Zone}).Check(); err != nil {
			return fmt.Errorf("host %q: %v", h.HostNQN, err)
		}
		s.hosts[h.HostNQN] = &h
	}
	return nil
}
