package blkd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/control"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/store"
)

// maxBody bounds a request body: every request is a small JSON object.
const maxBody = 64 << 10

// apiError is an error with its HTTP status; its message says what was
// wrong and how to fix it.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &apiError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// metaError translates a registry error into an HTTP status once, with a
// hint on what to do about it.
func metaError(err error, hint string) error {
	var ae *apiError
	if errors.As(err, &ae) {
		return err
	}
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, meta.ErrUnknownVolume):
		status, hint = http.StatusNotFound, "list volumes with GET /v1/volumes"
	case errors.Is(err, meta.ErrUnknownNode):
		status, hint = http.StatusNotFound, "list nodes with GET /v1/cluster (blkctl cluster status)"
	case errors.Is(err, meta.ErrNoCapacity):
		// 507, as control.ErrCapacity: the request is fine, the cluster
		// has no room for it now; freeing space or adding a node helps.
		status = http.StatusInsufficientStorage
	case errors.Is(err, meta.ErrNoPlacement):
		status, hint = http.StatusConflict, "start a node, or wait for one to be up again (blkctl cluster status), or ask for fewer replicas (blkctl volume create --replicas N, \"replicas\": N)"
	case errors.Is(err, meta.ErrVolumeExists), errors.Is(err, meta.ErrNQNInUse):
		status, hint = http.StatusConflict, "choose another name, or delete the existing volume first"
	case errors.Is(err, meta.ErrHasConnections):
		status, hint = http.StatusConflict, "detach the hosts first, or repeat with ?force=true to drop their connections"
	case errors.Is(err, meta.ErrAlreadyConnected):
		status, hint = http.StatusConflict, "the host is already attached; detach it first to attach again"
	case errors.Is(err, meta.ErrNotConnected):
		status, hint = http.StatusConflict, "the host is not attached to this volume"
	case errors.Is(err, meta.ErrUnknownSnapshot):
		status, hint = http.StatusNotFound, "list the volume's snapshots with GET /v1/volumes/{name}/snapshots (blkctl volume snapshots VOLUME)"
	case errors.Is(err, meta.ErrHasSnapshots):
		status, hint = http.StatusConflict, "DELETE with ?snapshots=true (blkctl volume delete VOLUME --snapshots) deletes them with it"
	case errors.Is(err, meta.ErrSnapshotExists), errors.Is(err, meta.ErrHasClones), errors.Is(err, meta.ErrHasChildren),
		errors.Is(err, meta.ErrSnapshotNotReady), errors.Is(err, meta.ErrNotClone):
		// The registry's message names the objects and what to do.
		status = http.StatusConflict
	case errors.Is(err, meta.ErrBusy):
		status, hint = http.StatusConflict, "retry once it is done"
	case errors.Is(err, meta.ErrStaleEpoch):
		status, hint = http.StatusConflict, "the volume's primary changed meanwhile: read the volume again"
	case errors.Is(err, control.ErrFeatureMissing), errors.Is(err, meta.ErrFeatureMissing):
		status = http.StatusConflict
	case errors.Is(err, meta.ErrVolumeDeleting), errors.Is(err, meta.ErrVolumeNotOnline),
		errors.Is(err, meta.ErrBadTransition), errors.Is(err, meta.ErrLimit), errors.Is(err, meta.ErrNodeNotUp):
		status = http.StatusConflict
	case errors.Is(err, meta.ErrHostNotAllowed):
		status, hint = http.StatusForbidden, "allow the host first with POST /v1/volumes/{name}/hosts"
	case errors.Is(err, meta.ErrBadBlockSize):
		status, hint = http.StatusBadRequest, "use block_size 512 or 4096"
	case errors.Is(err, meta.ErrSizeNotMultiple):
		status, hint = http.StatusBadRequest, "make size a positive multiple of block_size"
	case errors.Is(err, meta.ErrShrink):
		status, hint = http.StatusBadRequest, "shrinking a volume is not supported; give a size at least the current one"
	case errors.Is(err, meta.ErrInvalid), errors.Is(err, meta.ErrBadCommand):
		status = http.StatusBadRequest
	case errors.Is(err, meta.ErrNotLeader):
		status, hint = http.StatusServiceUnavailable, "send the request to the registry leader"
	case errors.Is(err, control.ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, control.ErrOwnerUnreachable):
		status = http.StatusBadGateway
	case errors.Is(err, control.ErrOwnerFailed):
		status = http.StatusInternalServerError
	case errors.Is(err, control.ErrCapacity):
		status = http.StatusInsufficientStorage
	}
	// The registry's errors repeat its prefix ("meta: volume "x": meta:
	// unknown volume"); once is enough for an operator.
	msg := strings.ReplaceAll(err.Error(), ": meta: ", ": ")
	if hint != "" {
		msg += ": " + hint
	}
	return &apiError{status, msg}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type handler func(w http.ResponseWriter, r *http.Request) error

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h(w, r); err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			ae = &apiError{http.StatusInternalServerError, err.Error()}
		}
		writeJSON(w, ae.status, map[string]string{"error": ae.msg})
	}
}

// routes is the API: its mux behind cleanPaths, so that only a path in
// the one form the mux matches reaches it.
func (d *Daemon) routes() http.Handler {
	m := http.NewServeMux()
	m.Handle("GET /metrics", d.reg.Handler())
	m.HandleFunc("GET /livez", d.livez)
	m.HandleFunc("GET /readyz", d.readyz)
	// Writes go through the registry leader: a follower answers 421 with
	// the leader's API address (see leaderOnly). Reads are served by any
	// node: linearizable on the leader, from the local copy elsewhere.
	w := func(h handler) http.Handler { return d.leaderOnly(h) }
	m.Handle("POST /v1/volumes", w(d.createVolume))
	m.Handle("GET /v1/volumes", handler(d.listVolumes))
	m.Handle("DELETE /v1/volumes", w(d.deleteVolumeByQuery))
	m.Handle("GET /v1/volumes/{name}", handler(d.getVolume))
	m.Handle("DELETE /v1/volumes/{name}", w(d.deleteVolume))
	m.Handle("POST /v1/volumes/{name}/hosts", w(d.allowHost))
	m.Handle("DELETE /v1/volumes/{name}/hosts/{nqn}", w(d.disallowHost))
	m.Handle("DELETE /v1/volumes/{name}/hosts", w(d.disallowHostByQuery))
	m.Handle("POST /v1/volumes/{name}/attach", w(d.attach))
	m.Handle("POST /v1/volumes/{name}/detach", w(d.detach))
	m.Handle("POST /v1/volumes/{name}/resize", w(d.resizeVolume))
	m.Handle("POST /v1/volumes/{name}/verify", w(d.verifyVolume))
	m.Handle("POST /v1/volumes/{name}/replicas/replace", w(d.replaceReplica))
	m.Handle("POST /v1/volumes/{name}/snapshots", w(d.createSnapshot))
	m.Handle("GET /v1/volumes/{name}/snapshots", handler(d.listSnapshots))
	m.Handle("GET /v1/volumes/{name}/snapshots/{snap}", handler(d.getSnapshot))
	m.Handle("DELETE /v1/volumes/{name}/snapshots/{snap}", w(d.deleteSnapshot))
	m.Handle("POST /v1/volumes/{name}/snapshots/{snap}/clone", w(d.cloneSnapshot))
	m.Handle("POST /v1/volumes/{name}/flatten", w(d.flattenVolume))
	m.Handle("POST /v1/volumes/{name}/revert", w(d.revertVolume))
	m.Handle("GET /v1/volumes/{name}/snapshots/{snap}/export", handler(d.exportSnapshot))
	m.Handle("PUT /v1/volumes/{name}/import", handler(d.importVolume))
	// The leader asks a volume's owner to reconcile it (owner.go).
	m.Handle("POST /v1/internal/reconcile", handler(d.internalReconcile))
	m.Handle("GET /v1/internal/health", handler(d.health))
	// A volume's primary reports a replica that missed a write (replica.go).
	m.Handle("POST /v1/internal/replica", w(d.internalReplica))
	// A primary asks the leader for its lease (failover.go).
	m.Handle("POST /v1/internal/lease", w(d.internalLease))
	// The leader's volume verify asks each replica's node (verify.go).
	m.Handle("POST /v1/internal/checksum", handler(d.internalChecksum))
	// A primary asks a replica's node which run of it answers (boot.go).
	m.Handle("GET /v1/internal/boot", handler(d.internalBoot))
	// The leader has a replaced replica's node delete its copy (replace.go).
	m.Handle("POST /v1/internal/drop", handler(d.internalDrop))
	// The leader has a volume's primary take a snapshot, which has each
	// in-sync replica's node snapshot its copy inside its barrier
	// (snapshot.go); listings ask the primary for the space figures.
	m.Handle("POST /v1/internal/snapshot", handler(d.internalSnapshot))
	m.Handle("POST /v1/internal/snapshot-copy", handler(d.internalSnapshotCopy))
	m.Handle("GET /v1/internal/space", handler(d.internalSpace))
	// A primary rebuilding a replica gives it the snapshots it lacks
	// (rebuildsnap.go): it asks the replica's node which it holds, has it
	// revert its live copy to the newest and snapshot it as each one
	// carried, and the leader record the replica among their copies.
	m.Handle("GET /v1/internal/snapshots", handler(d.internalSnapshots))
	m.Handle("POST /v1/internal/rebuild-revert", handler(d.internalRebuildRevert))
	m.Handle("POST /v1/internal/rebuild-snapshot", handler(d.internalRebuildSnapshot))
	m.Handle("POST /v1/internal/snapshot-nodes", w(d.internalSnapshotNodes))
	// Reservations (reservation.go): the operator's clear (Op 30), a
	// keeper's command on the leader, and the leader's push of a clear
	// to the volume's serving node.
	m.Handle("POST /v1/volumes/{name}/reservation/clear", w(d.clearReservation))
	m.Handle("POST /v1/internal/reservation", w(d.internalReservation))
	m.Handle("POST /v1/internal/reservation-notify", handler(d.internalReservationNotify))
	// Registered hosts (hosts.go, docs/operations.md §1.9).
	m.Handle("POST /v1/hosts", w(d.registerHost))
	m.Handle("GET /v1/hosts", handler(d.listHosts))
	m.Handle("GET /v1/hosts/{nqn}", handler(d.getHost))
	m.Handle("DELETE /v1/hosts/{nqn}", w(d.unregisterHost))
	m.Handle("GET /v1/cluster", handler(d.getCluster))
	m.Handle("POST /v1/cluster/join", w(d.clusterJoin))
	m.Handle("POST /v1/cluster/remove", w(d.clusterRemove))
	// A known path with a method it does not take: 405 naming the ones it
	// does (a pattern without a method loses to the ones with).
	for path, allow := range map[string]string{
		"/metrics": "GET", "/v1/volumes": "GET, POST, DELETE", "/v1/volumes/{name}": "GET, DELETE",
		"/v1/volumes/{name}/hosts": "POST, DELETE", "/v1/volumes/{name}/hosts/{nqn}": "DELETE",
		"/v1/volumes/{name}/attach": "POST", "/v1/volumes/{name}/detach": "POST",
		"/v1/volumes/{name}/resize": "POST", "/v1/internal/reconcile": "POST", "/v1/internal/health": "GET", "/v1/internal/replica": "POST", "/v1/internal/lease": "POST", "/v1/internal/checksum": "POST", "/v1/volumes/{name}/verify": "POST",
		"/v1/volumes/{name}/replicas/replace": "POST", "/v1/internal/drop": "POST", "/v1/internal/boot": "GET",
		"/v1/volumes/{name}/snapshots": "GET, POST", "/v1/volumes/{name}/snapshots/{snap}": "GET, DELETE",
		"/v1/volumes/{name}/snapshots/{snap}/clone": "POST", "/v1/volumes/{name}/flatten": "POST", "/v1/volumes/{name}/revert": "POST",
		"/v1/volumes/{name}/snapshots/{snap}/export": "GET", "/v1/volumes/{name}/import": "PUT",
		"/v1/internal/snapshot": "POST", "/v1/internal/snapshot-copy": "POST", "/v1/internal/space": "GET",
		"/v1/internal/snapshots": "GET", "/v1/internal/rebuild-revert": "POST", "/v1/internal/rebuild-snapshot": "POST", "/v1/internal/snapshot-nodes": "POST",
		"/v1/cluster": "GET", "/v1/cluster/join": "POST", "/v1/cluster/remove": "POST",
		"/livez": "GET", "/readyz": "GET",
		"/v1/hosts": "GET, POST", "/v1/hosts/{nqn}": "GET, DELETE",
		"/v1/volumes/{name}/reservation/clear": "POST", "/v1/internal/reservation": "POST", "/v1/internal/reservation-notify": "POST",
	} {
		m.Handle(path, handler(func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Allow", allow)
			return &apiError{http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: method not allowed; use %s", r.Method, r.URL.Path, allow)}
		}))
	}
	m.Handle("/", handler(func(w http.ResponseWriter, r *http.Request) error {
		return &apiError{http.StatusNotFound, fmt.Sprintf("no route %s %s: the API is under /v1/volumes and /v1/cluster", r.Method, r.URL.Path)}
	}))
	return cleanPaths(m)
}

// cleanPaths refuses, 400 naming the problem, a request whose path is
// not in its one clean form. http.ServeMux would answer such a path with
// a redirect (307) to the path cleaned, and a client that follows it
// with the same method acts on another resource: DELETE
// /v1/volumes/v/hosts/.. became DELETE /v1/volumes/v and deleted the
// volume. So nothing is ever redirected: the client must send what it
// means.
func cleanPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := checkPath(r.URL.EscapedPath()); err != nil {
			writeJSON(w, http.StatusBadRequest, api.Error{Error: err.Error()})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// checkPath checks an escaped request path: absolute, no empty segment
// ("//", a trailing '/'), no dot segment, and no escaped '/', '\\', '.'
// or '%' (what one stack decodes and another does not), no control
// character.
func checkPath(p string) error {
	bad := func(problem string) error {
		return fmt.Errorf("path %q: %s: the API takes paths only in their clean form (no '.' or '..' segment, no '//', no trailing '/', no escaped '/', '.' or '%%') and never redirects", p, problem)
	}
	if p == "/" {
		return nil
	}
	if !strings.HasPrefix(p, "/") {
		return bad("not an absolute path")
	}
	for i, seg := range strings.Split(p[1:], "/") {
		dec, err := url.PathUnescape(seg)
		switch {
		case err != nil:
			return bad(fmt.Sprintf("segment %d %q: %v", i+1, seg, err))
		case seg == "":
			return bad("an empty segment ('//' or a trailing '/')")
		case dec == "." || dec == "..":
			return bad(fmt.Sprintf("a dot segment %q", seg))
		case strings.ContainsAny(dec, "/\\"):
			return bad(fmt.Sprintf("segment %q holds a slash or backslash", seg))
		case strings.Contains(strings.ToLower(seg), "%2e"):
			return bad(fmt.Sprintf("segment %q holds an escaped '.'", seg))
		case strings.Contains(dec, "%"):
			return bad(fmt.Sprintf("segment %q holds an escaped '%%' (an escape escaped twice)", seg))
		case strings.IndexFunc(dec, func(c rune) bool { return c < 0x20 || c == 0x7f }) >= 0:
			return bad(fmt.Sprintf("segment %q holds a control character", seg))
		}
	}
	if path.Clean(p) != p { // what the mux would redirect; cannot happen after the checks above
		return bad("not clean")
	}
	return nil
}

// volumeName is the {name} of r's path. A name outside the name grammar
// is refused (400 naming it) unless the registry holds it: a legacy
// volume ("Vol:1", from before the grammar) stays reachable by a path
// that is clean.
func (d *Daemon) volumeName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	err := api.CheckName("volume name", name)
	if err == nil {
		return name, nil
	}
	known := false
	d.node.FSM().Read(func(s *meta.State) { _, known = s.Volume(name) })
	if !known {
		return "", badRequest("%v", err)
	}
	return name, nil
}

// decode reads a JSON object into v, refusing unknown fields.
func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return badRequest("read body: %v", err)
	}
	if len(b) > maxBody {
		return badRequest("request body larger than %d bytes", maxBody)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("request body is not the expected JSON object: %v", err)
	}
	return nil
}

// replicaView fills a's replica fields from v: epoch, replication factor,
// the replicas with the primary marked; an online volume with fewer in
// sync than wanted gets the reason "degraded: K/N in sync" (the
// registry's state stays online: hosts are served).
func replicaView(v meta.Volume, a *api.Volume) {
	a.Epoch, a.WantReplicas = v.CurrentEpoch(), v.WantReplicas()
	replaces := map[string]string{}
	for _, r := range v.ReplicaSet() {
		if r.ReplacedBy != "" {
			replaces[r.ReplacedBy] = r.Node
		}
	}
	for _, r := range v.ReplicaSet() {
		a.Replicas = append(a.Replicas, api.Replica{Node: r.Node, State: string(r.State), Reason: r.Reason, Since: r.Since, Primary: r.Node == v.Node,
			ReplacedBy: r.ReplacedBy, Replaces: replaces[r.Node]})
	}
	if k, n := len(v.InSync()), v.WantReplicas(); k < n && a.State == api.StateOnline && a.Reason == "" {
		a.Reason = fmt.Sprintf("degraded: %d/%d in sync", k, n)
	}
}

func (d *Daemon) createVolume(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateVolumeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	switch {
	case req.Name == "":
		return badRequest(`missing "name": give the volume a name, e.g. {"name": "vol1", "size": "10GiB"}`)
	case api.CheckName("volume name", req.Name) != nil:
		return badRequest("%v", api.CheckName("volume name", req.Name))
	case req.Size == nil || *req.Size == 0:
		return badRequest(`missing "size": give a size in bytes or with a unit, e.g. "size": "10GiB"`)
	case req.Node != "" && api.CheckName("node", req.Node) != nil:
		return badRequest("%v", api.CheckName("node", req.Node))
	case req.Replicas < 0 || req.Replicas > meta.MaxReplicas:
		return badRequest(`"replicas": %d: give 1 to %d, or 0 (or none) for the cluster's default`, req.Replicas, meta.MaxReplicas)
	}
	if req.BlockSize == 0 {
		req.BlockSize = store.DefaultBlockSize
	}
	v, err := d.mgr.Create(r.Context(), control.CreateRequest{
		Name: req.Name, SizeBytes: uint64(*req.Size), BlockSize: req.BlockSize, Node: req.Node,
		Replicas: req.Replicas,
	})
	if err != nil {
		return metaError(err, "")
	}
	writeJSON(w, http.StatusCreated, d.view(v))
	return nil
}

// listVolumes is linearizable on the leader; a follower answers from its
// own copy of the registry, which may lag the leader's.
func (d *Daemon) listVolumes(w http.ResponseWriter, r *http.Request) error {
	if err := d.linearizeOnLeader(r.Context()); err != nil {
		return err
	}
	var vols []api.Volume
	d.node.FSM().Read(func(s *meta.State) { vols = views(s, s.Export().Volumes...) })
	for i := range vols {
		vols[i] = d.redact(r, vols[i])
	}
	writeJSON(w, http.StatusOK, api.VolumeList{Volumes: vols})
	return nil
}

func (d *Daemon) getVolume(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	if !d.node.IsLeader() {
		var v meta.Volume
		var ok bool
		d.node.FSM().Read(func(s *meta.State) { v, ok = s.Volume(name) })
		if !ok {
			return metaError(fmt.Errorf("meta: volume %q: %w", name, meta.ErrUnknownVolume), "")
		}
		writeJSON(w, http.StatusOK, d.redact(r, d.view(v)))
		return nil
	}
	v, err := d.node.ReadVolume(r.Context(), name)
	if err != nil {
		return metaError(err, "")
	}
	writeJSON(w, http.StatusOK, d.redact(r, d.view(v)))
	return nil
}

// readVolume reads a volume linearizably (the caller is the leader).
func (d *Daemon) readVolume(ctx context.Context, name string) (meta.Volume, error) {
	v, err := d.node.ReadVolume(ctx, name)
	if err != nil {
		return v, metaError(err, "")
	}
	return v, nil
}

func (d *Daemon) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	return d.deleteNamed(w, r, name)
}

// deleteVolumeByQuery is DELETE /v1/volumes?name=NAME: the name
// percent-encoded in the query, where any name is one value. It is how a
// volume whose name an older blkd accepted but no clean path can hold
// (".", "..", "a/b", "%2e%2e") is deleted; it takes any volume.
func (d *Daemon) deleteVolumeByQuery(w http.ResponseWriter, r *http.Request) error {
	names, ok := r.URL.Query()["name"]
	if !ok || len(names) != 1 || names[0] == "" {
		return badRequest("DELETE /v1/volumes needs the volume's name once: DELETE /v1/volumes?name=NAME (percent-encoded)")
	}
	return d.deleteNamed(w, r, names[0])
}

func (d *Daemon) deleteNamed(w http.ResponseWriter, r *http.Request, name string) error {
	force, withSnapshots := false, false
	if f := r.URL.Query().Get("force"); f != "" {
		var err error
		if force, err = strconv.ParseBool(f); err != nil {
			return badRequest("force=%q: use force=true or force=false", f)
		}
	}
	if f := r.URL.Query().Get("snapshots"); f != "" {
		var err error
		if withSnapshots, err = strconv.ParseBool(f); err != nil {
			return badRequest("snapshots=%q: use snapshots=true or snapshots=false", f)
		}
	}
	// A volume already deleting (an earlier delete whose owner did not
	// answer) is finished.
	if err := d.mgr.DeleteWith(r.Context(), name, force, withSnapshots); err != nil {
		return metaError(err, "")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resizeVolume grows a volume: registry ResizeVolume, then the owner
// grows its store volume and revalidates the namespace.
func (d *Daemon) resizeVolume(w http.ResponseWriter, r *http.Request) error {
	var req api.ResizeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Size == nil || *req.Size == 0 {
		return badRequest(`missing "size": give the new size in bytes or with a unit, e.g. {"size": "20GiB"}`)
	}
	size := uint64(*req.Size)
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	v, err := d.mgr.Resize(r.Context(), name, size)
	if err != nil {
		return metaError(err, "")
	}
	writeJSON(w, http.StatusOK, d.view(v))
	return nil
}

func (d *Daemon) hostNQN(r *http.Request) (string, error) {
	req, err := d.hostRequest(r)
	if err == nil && (req.DHCHAPSecret != "" || req.DHCHAPCtrlSecret != "") {
		err = badRequest("DH-HMAC-CHAP secrets are set with POST /v1/volumes/{name}/hosts, not here")
	}
	return req.HostNQN, err
}

func (d *Daemon) hostRequest(r *http.Request) (api.HostRequest, error) {
	var req api.HostRequest
	if err := decode(r, &req); err != nil {
		return req, err
	}
	if req.HostNQN == "" {
		return req, badRequest(`missing "host_nqn": give the host's NQN, e.g. {"host_nqn": "nqn.2014-08.org.nvmexpress:uuid:…"}`)
	}
	if err := checkNQN(req.HostNQN); err != nil {
		return req, badRequest("host_nqn %q is not a valid NQN (%v): use the host's /etc/nvme/hostnqn", req.HostNQN, err)
	}
	return req, nil
}

// checkNQN checks a host NQN: the NVMe grammar (nvme.ValidateNQN:
// nqn.yyyy-mm.reverse.domain[:...], at most 223 bytes) in valid UTF-8, as
// the NVMe Base specification has NQNs.
func checkNQN(s string) error {
	if err := nvme.ValidateNQN(s); err != nil {
		return err
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: not UTF-8", nvme.ErrNQN)
	}
	return nil
}

func (d *Daemon) allowHost(w http.ResponseWriter, r *http.Request) error {
	req, err := d.hostRequest(r)
	if err != nil {
		return err
	}
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	v, err := d.mgr.AllowHost(r.Context(), name, req.HostNQN, meta.HostSecret{Host: req.DHCHAPSecret, Ctrl: req.DHCHAPCtrlSecret})
	if err != nil {
		return metaError(err, "")
	}
	writeJSON(w, http.StatusOK, d.view(v))
	return nil
}

func (d *Daemon) disallowHost(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	host := r.PathValue("nqn")
	if err := checkNQN(host); err != nil {
		return badRequest("host NQN %q in the path: %v: give the host's NQN, e.g. DELETE /v1/volumes/%s/hosts/nqn.2014-08.org.nvmexpress:uuid:…", host, err, name)
	}
	return d.disallowNamed(w, r, name, host)
}

// disallowHostByQuery is DELETE /v1/volumes/{name}/hosts?host_nqn=NQN:
// an NQN may hold '/' or '%' after its ':', which no clean path segment
// holds (cleanPaths); any NQN is one query value.
func (d *Daemon) disallowHostByQuery(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	hosts, ok := r.URL.Query()["host_nqn"]
	if !ok || len(hosts) != 1 {
		return badRequest("DELETE /v1/volumes/%s/hosts needs the host's NQN once: ?host_nqn=NQN (percent-encoded), or DELETE /v1/volumes/%s/hosts/NQN", name, name)
	}
	if err := checkNQN(hosts[0]); err != nil {
		return badRequest("host_nqn %q: %v: give the host's NQN", hosts[0], err)
	}
	return d.disallowNamed(w, r, name, hosts[0])
}

func (d *Daemon) disallowNamed(w http.ResponseWriter, r *http.Request, name, host string) error {
	force := false
	if f := r.URL.Query().Get("force"); f != "" {
		var err error
		if force, err = strconv.ParseBool(f); err != nil {
			return badRequest("force=%q: use force=true or force=false", f)
		}
	}
	v, err := d.mgr.DisallowHost(r.Context(), name, host, force)
	if errors.Is(err, meta.ErrHostNotAllowed) {
		return &apiError{http.StatusNotFound, fmt.Sprintf("volume %q does not allow host %q: nothing to remove (GET /v1/volumes/%s lists its hosts)", name, host, name)}
	}
	if err != nil {
		return metaError(err, "")
	}
	writeJSON(w, http.StatusOK, d.view(v))
	return nil
}

func (d *Daemon) attach(w http.ResponseWriter, r *http.Request) error {
	host, err := d.hostNQN(r)
	if err != nil {
		return err
	}
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	d.mu.Lock()
	defer d.mu.Unlock()
	v, err := d.readVolume(ctx, name)
	if err != nil {
		return err
	}
	rdmaAddr, tcpAddr := d.AdvertisedNVMeAddr(), d.AdvertisedTCPAddr()
	if v.Node != d.cfg.NodeID {
		// The host connects to the owner's NVMe ports.
		rdmaAddr, tcpAddr = "", ""
		d.node.FSM().Read(func(s *meta.State) {
			if n, ok := s.Node(v.Node); ok {
				rdmaAddr, tcpAddr = n.TargetAddr, n.TCPAddr
			}
		})
		if rdmaAddr == "" && tcpAddr == "" {
			return &apiError{http.StatusConflict, fmt.Sprintf("volume %q: the registry knows no NVMe address of its owner node %s: wait for the node to register (restart it)", name, v.Node)}
		}
	}
	if _, err := d.node.Apply(ctx, meta.Connect{HostNQN: host, Volume: name, Node: v.Node, At: time.Now().UnixNano()}); err != nil {
		return metaError(err, "")
	}
	c := api.Connection{SubsystemNQN: v.NQN, NSID: 1, Authentication: authMode(v.Secrets[host]), Endpoints: endpoints(tcpAddr, rdmaAddr)}
	c.Transport, c.Address, c.Port = c.Endpoints[0].Transport, c.Endpoints[0].Address, c.Endpoints[0].Port
	writeJSON(w, http.StatusOK, c)
	return nil
}

// endpoints lists a node's NVMe ports, NVMe/TCP first (every host has
// it); an empty address is a port the node does not serve.
func endpoints(tcpAddr, rdmaAddr string) []api.Endpoint {
	var out []api.Endpoint
	for _, e := range []struct{ transport, addr string }{{api.TransportTCP, tcpAddr}, {api.TransportRDMA, rdmaAddr}} {
		if e.addr == "" {
			continue
		}
		h, p, _ := net.SplitHostPort(e.addr)
		port, _ := strconv.Atoi(p)
		out = append(out, api.Endpoint{Transport: e.transport, Address: h, Port: port})
	}
	return out
}

func (d *Daemon) detach(w http.ResponseWriter, r *http.Request) error {
	host, err := d.hostNQN(r)
	if err != nil {
		return err
	}
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	d.mu.Lock()
	defer d.mu.Unlock()
	v, err := d.readVolume(ctx, name)
	if err != nil {
		return err
	}
	if _, err := d.node.Apply(ctx, meta.Disconnect{HostNQN: host, Volume: name, Node: v.Node}); err != nil {
		return metaError(err, "")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// legacyNames remembers which names outside the grammar (volumes, nodes)
// a node has warned about, and at which registry index it last looked.
type legacyNames struct {
	index  uint64
	warned map[string]bool
}

// warn logs "legacy name" once per volume or node of the local registry
// copy whose name is outside the grammar (meta.LegacyName): at start-up,
// then as the registry changes. Such a name works, but no clean API path
// holds it; the operator should delete the volume (DELETE
// /v1/volumes?name=, blkctl volume delete --legacy-name) or remove the
// node.
func (l *legacyNames) warn(d *Daemon) {
	var snap meta.Snapshot
	d.node.FSM().Read(func(s *meta.State) {
		if s.Index() != l.index {
			snap = s.Export()
		}
	})
	if snap.Version == 0 {
		return
	}
	l.index = snap.Index
	if l.warned == nil {
		l.warned = map[string]bool{}
	}
	say := func(kind, name, fix string) {
		if key := kind + "\x00" + name; meta.LegacyName(name) && !l.warned[key] {
			l.warned[key] = true
			d.log.Warn("legacy name", slog.String("kind", kind), slog.String("name", name), slog.String("fix", fix))
		}
	}
	for _, n := range snap.Nodes {
		say("node", n.ID, "the ID is outside the name grammar ("+api.NameGrammar+"); the node works, but give a replacement node a valid ID and remove this one (blkctl cluster remove --legacy-name)")
	}
	for _, v := range snap.Volumes {
		say("volume", v.Name, "the name is outside the name grammar ("+api.NameGrammar+"); the volume works, but copy its data to a volume with a valid name and delete it: blkctl volume delete --legacy-name NAME (DELETE /v1/volumes?name=NAME)")
	}
}
