package api

import "time"

// Registered hosts (docs/operations.md §1.9): POST /v1/hosts registers a
// host (an idempotent upsert by NQN), GET /v1/hosts lists them, GET
// /v1/hosts/{nqn} is one (404 when it is not registered), DELETE
// /v1/hosts/{nqn} forgets one. A registration grants nothing: which host
// may connect to a volume is the volume's allow list.

// Host is a registered host.
type Host struct {
	HostNQN string `json:"host_nqn"`
	// Name is the host's name for people (the CSI node plugin gives its
	// Kubernetes node name); "": none.
	Name string `json:"name,omitempty"`
	// Zone is the host's failure domain; "": none.
	Zone string `json:"zone,omitempty"`
	// RegisteredAt is when the host first registered, RFC 3339 in UTC
	// (§5.4); registering again keeps it. A new type: no integer
	// nanoseconds beside it, as the older objects keep.
	RegisteredAt time.Time `json:"registered_at"`
}

// HostList is GET /v1/hosts, sorted by NQN.
type HostList struct {
	Hosts []Host `json:"hosts"`
}

// RegisterHostRequest is POST /v1/hosts: the host's NQN (required, the
// NVMe grammar), its name and zone (optional, the name grammar: CheckName).
type RegisterHostRequest struct {
	HostNQN string `json:"host_nqn"`
	Name    string `json:"name,omitempty"`
	Zone    string `json:"zone,omitempty"`
}
