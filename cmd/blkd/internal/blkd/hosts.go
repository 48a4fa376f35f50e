package blkd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/meta"
)

// The host registry (docs/operations.md §1.9): POST /v1/hosts registers
// a host (idempotent upsert), GET /v1/hosts lists them, GET
// /v1/hosts/{nqn} is one or 404, DELETE /v1/hosts/{nqn} forgets one.
// Writes go through the leader (meta.RegisterHost, UnregisterHost:
// refused, 409 naming the node, while a node without meta.FeatureHosts
// is registered). Under TLS a host certificate (pki.RoleHost, the CSI
// node plugin's) may register and read one host by NQN, nothing else
// (allowed, auth.go).

// withoutHosts, set at link time (-ldflags "-X
// github.com/blk-project/blk/cmd/blkd/internal/blkd.withoutHosts=1") by
// cmd/blkd's TestHostsUpgradeGate only, makes the binary register as one
// from before the host registry: without meta.FeatureHosts.
var withoutHosts string

func init() {
	if withoutHosts != "" {
		nodeFeatures = slices.DeleteFunc(slices.Clone(nodeFeatures), func(f string) bool { return f == meta.FeatureHosts })
	}
}

// registerHost is POST /v1/hosts: 201 with the host when it is new, 200
// with it when it was registered already (its name and zone updated).
func (d *Daemon) registerHost(w http.ResponseWriter, r *http.Request) error {
	var req api.RegisterHostRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if err := checkHostRequest(req); err != nil {
		return err
	}
	at := time.Now().UnixNano()
	res, err := d.node.Apply(r.Context(), meta.RegisterHost{HostNQN: req.HostNQN, Name: req.Name, Zone: req.Zone, At: at})
	if err != nil {
		return hostError(err, req.HostNQN)
	}
	// A host registered before keeps its first time: this command's
	// time is a new host's only.
	status := http.StatusOK
	if res.Host.RegisteredAt == at {
		status = http.StatusCreated
	}
	writeJSON(w, status, hostView(*res.Host))
	return nil
}

// checkHostRequest checks a registration as the rest of the API checks
// its fields: the host NQN in the NVMe grammar (checkNQN, as the allow
// list's), name and zone in the name grammar when given.
func checkHostRequest(req api.RegisterHostRequest) error {
	if req.HostNQN == "" {
		return badRequest(`missing "host_nqn": give the host's NQN, e.g. {"host_nqn": "nqn.2014-08.org.nvmexpress:uuid:…", "name": "worker-1", "zone": "zone-a"}`)
	}
	if err := checkNQN(req.HostNQN); err != nil {
		return badRequest("host_nqn %q is not a valid NQN (%v): use the host's /etc/nvme/hostnqn", req.HostNQN, err)
	}
	if req.Name != "" {
		if err := api.CheckName("host name", req.Name); err != nil {
			return badRequest("%v", err)
		}
	}
	if req.Zone != "" {
		if err := api.CheckName("zone", req.Zone); err != nil {
			return badRequest("%v", err)
		}
	}
	return nil
}

// linearizeOnLeader makes a registry read on the leader linearizable
// (a barrier first: the read covers every command committed before the
// request); a follower reads its own copy, which may lag the leader's.
func (d *Daemon) linearizeOnLeader(ctx context.Context) error {
	if d.node.IsLeader() {
		if err := d.node.Linearize(ctx); err != nil {
			return metaError(err, "")
		}
	}
	return nil
}

// listHosts is GET /v1/hosts, sorted by NQN; linearizable on the leader,
// from the local copy elsewhere (as GET /v1/volumes).
func (d *Daemon) listHosts(w http.ResponseWriter, r *http.Request) error {
	if err := d.linearizeOnLeader(r.Context()); err != nil {
		return err
	}
	var hosts []meta.Host
	d.node.FSM().Read(func(s *meta.State) { hosts = s.Hosts() })
	l := api.HostList{Hosts: make([]api.Host, 0, len(hosts))}
	for _, h := range hosts {
		l.Hosts = append(l.Hosts, hostView(h))
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

// getHost is GET /v1/hosts/{nqn}: the host, or 404 naming it.
func (d *Daemon) getHost(w http.ResponseWriter, r *http.Request) error {
	nqn, err := hostPathNQN(r)
	if err != nil {
		return err
	}
	if err := d.linearizeOnLeader(r.Context()); err != nil {
		return err
	}
	var h meta.Host
	var ok bool
	d.node.FSM().Read(func(s *meta.State) { h, ok = s.Host(nqn) })
	if !ok {
		return hostError(fmt.Errorf("meta: host %q: %w", nqn, meta.ErrUnknownHost), nqn)
	}
	writeJSON(w, http.StatusOK, hostView(h))
	return nil
}

// unregisterHost is DELETE /v1/hosts/{nqn}: 200 with the host forgotten,
// 404 naming it when it is not registered.
func (d *Daemon) unregisterHost(w http.ResponseWriter, r *http.Request) error {
	nqn, err := hostPathNQN(r)
	if err != nil {
		return err
	}
	res, err := d.node.Apply(r.Context(), meta.UnregisterHost{HostNQN: nqn})
	if err != nil {
		return hostError(err, nqn)
	}
	writeJSON(w, http.StatusOK, hostView(*res.Host))
	return nil
}

// hostPathNQN is the {nqn} of r's path, in the NVMe grammar (400 naming
// it otherwise).
func hostPathNQN(r *http.Request) (string, error) {
	nqn := r.PathValue("nqn")
	if err := checkNQN(nqn); err != nil {
		return "", badRequest("host NQN %q in the path: %v: give the host's NQN, e.g. /v1/hosts/nqn.2014-08.org.nvmexpress:uuid:…", nqn, err)
	}
	return nqn, nil
}

// hostError is metaError with the host registry's own cases: an unknown
// host is 404 naming it (never "no route": the CSI controller tells an
// older blkd, which has no /v1/hosts, by that), the gate 409 naming the
// node to upgrade.
func hostError(err error, nqn string) error {
	if errors.Is(err, meta.ErrUnknownHost) {
		return &apiError{http.StatusNotFound, fmt.Sprintf("host %s is not registered: list the registered hosts with GET /v1/hosts (blkctl host list)", nqn)}
	}
	return metaError(err, "")
}

// hostView is the API's form of a registered host.
func hostView(h meta.Host) api.Host {
	return api.Host{HostNQN: h.HostNQN, Name: h.Name, Zone: h.Zone, RegisteredAt: time.Unix(0, h.RegisteredAt).UTC()}
}
