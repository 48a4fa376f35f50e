package blkd

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"crypto/x509"
	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/internal/peercred"
	"github.com/blk-project/blk/pki"
	"github.com/prometheus/client_golang/prometheus"
)

// Authentication and authorization of the management API. With --tls-dir
// the API is HTTPS with mutual TLS: every caller presents a certificate of
// the cluster CA (package pki), and its role decides what it may do:
//
//	reader  GET routes and /metrics
//	(none)  GET /livez and /readyz only: a handshake without a
//	        certificate gets through, for the platform's probes
//	admin   everything an operator does (not the node-to-node routes)
//	node    the node-to-node routes (/v1/internal/*, join) and reads
//	host    POST /v1/hosts and GET /v1/hosts/{nqn} only: a host's agent
//	        (the CSI node plugin) registering itself (hosts.go)
//
// A reader may not read the host registry: host NQNs are an admin's
// business (as redact hides them in volumes).
//
// Without --tls-dir the API and raft are plain TCP, which Config.Validate
// allows only on loopback addresses (or with --insecure). There the kernel
// says who the caller is: the owner of the peer socket (package peercred).
// The user who runs blkd and root may do everything (they could read the
// data dir anyway; the other nodes of a local cluster run as that user);
// any other user of the machine is refused, on the API (403) and on raft
// (the connection is closed), except GET of /livez, /readyz and /metrics,
// which hold no secret (openToLocalUsers). With --insecure nobody is
// checked.
// Every state-changing call is recorded with who made it, in the audit
// log (audit.go): never rate-limited, written before it is acknowledged.

// tlsSetup loads the node's credentials and builds the API's server and
// the node-to-node client configurations. Nil without --tls-dir.
func (d *Daemon) tlsSetup() error {
	if d.cfg.TLSDir == "" {
		return nil
	}
	caPEM, certPEM, keyPEM, err := pki.NodeFiles(d.cfg.TLSDir, d.cfg.NodeID)
	if err != nil {
		return fmt.Errorf("--tls-dir %s: %w (it needs ca.crt, %s.crt and %s.key: blkctl cert issue %s --role node)", d.cfg.TLSDir, err, d.cfg.NodeID, d.cfg.NodeID, d.cfg.NodeID)
	}
	if d.apiTLS, _, err = pki.MutualTLS(caPEM, certPEM, keyPEM, pki.RoleNode, pki.RoleAdmin, pki.RoleReader, pki.RoleHost); err != nil {
		return fmt.Errorf("--tls-dir %s: %w", d.cfg.TLSDir, err)
	}
	// Every refused handshake is counted and logged (rate-limited): the
	// certificate check is pki's (chain, usage, role, and "none
	// presented"), so the API asks for a certificate without letting the
	// TLS stack refuse a missing one before that check can see it.
	// A handshake with no certificate at all gets through: guard lets
	// such a caller reach the probes only (publicRoute), as Kubernetes'
	// HTTPS probes present none; a presented but bad certificate is
	// refused here.
	verify := d.apiTLS.VerifyPeerCertificate
	d.apiTLS.ClientAuth = tls.RequestClientCert
	d.apiTLS.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return nil
		}
		err := verify(raw, chains)
		if err != nil {
			d.refusedTLS.Add(1)
			d.log.Warn("api handshake refused", slog.String("err", err.Error()))
		}
		return err
	}
	if d.raftTLS, d.peerTLS, err = pki.MutualTLS(caPEM, certPEM, keyPEM, pki.RoleNode); err != nil {
		return fmt.Errorf("--tls-dir %s: %w", d.cfg.TLSDir, err)
	}
	return nil
}

// raftRefused counts and logs (rate-limited) a raft connection refused in
// its TLS handshake: a peer without a node certificate of the cluster CA.
func (d *Daemon) raftRefused(remote net.Addr, err error) {
	d.refusedRaft.Add(1)
	d.log.Warn("raft connection refused", slog.String("remote_addr", remote.String()), slog.String("err", err.Error()))
}

// peerURL is the URL of path on another node's API.
func (d *Daemon) peerURL(api, path string) string {
	if d.peerTLS != nil {
		return "https://" + api + path
	}
	return "http://" + api + path
}

// peerClient is an HTTP client for another node's API (mutual TLS with
// this node's certificate when configured).
func (d *Daemon) peerClient(timeout time.Duration) *http.Client {
	if d.peerTLS == nil {
		return &http.Client{Timeout: timeout}
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: d.peerTLS, ForceAttemptHTTP2: true}}
}

// localAuth says whether callers are authenticated as local users: no
// certificates, and no --insecure.
// (On a system where peercred cannot tell, nobody is checked, and blkd
// says so when it starts.)
func (d *Daemon) localAuth() bool {
	return d.cfg.TLSDir == "" && !d.cfg.Insecure && peercred.Supported()
}

// localPeer is the caller of a connection to a node with localAuth: the
// local user owning the peer socket, and whether it may manage the node.
type localPeer struct {
	who string
	err error // why it may not; nil: it may
}

type localPeerKey struct{}

// checkLocalPeer finds who holds the other end of c (a loopback
// connection) and refuses any user but root and the one running blkd.
func checkLocalPeer(c net.Conn) localPeer {
	uid, err := peercred.UID(c)
	if err != nil {
		return localPeer{who: "unknown local user at " + c.RemoteAddr().String(),
			err: fmt.Errorf("cannot tell which local user connected from %s: %w", c.RemoteAddr(), err)}
	}
	p := localPeer{who: "local " + peercred.Name(uid)}
	if self := uint32(os.Getuid()); uid != 0 && uid != self {
		p.err = fmt.Errorf("%s is neither root nor the user running blkd (%s)", p.who, peercred.Name(self))
	}
	return p
}

// connContext records a connection's local peer (with localAuth).
func (d *Daemon) connContext(ctx context.Context, c net.Conn) context.Context {
	if !d.localAuth() {
		return ctx
	}
	return context.WithValue(ctx, localPeerKey{}, checkLocalPeer(c))
}

// raftAcceptPeer is the check of raft connections: with localAuth, only
// root's and blkd's own user's get in.
func (d *Daemon) raftAcceptPeer() func(net.Conn) error {
	if !d.localAuth() {
		return nil
	}
	return func(c net.Conn) error { return checkLocalPeer(c).err }
}

// caller names who made a request: the certificate's role and name with
// TLS, the local user with localAuth, else the remote address.
func caller(r *http.Request) (who string, role string) {
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		if id, err := pki.IdentityOf(r.TLS.PeerCertificates[0]); err == nil {
			return id.String(), id.Role
		}
	}
	if p, ok := r.Context().Value(localPeerKey{}).(localPeer); ok {
		return p.who, ""
	}
	return "unauthenticated " + r.RemoteAddr, ""
}

// certNode is the node a request's certificate names, and whether the
// caller may act only as that node: true for a node certificate. An
// admin certificate is an operator's, who may remove members and delete
// volumes anyway, and may act for any node (repairing a registration);
// without --tls-dir the caller is root or blkd's own user (or anyone
// with --insecure), who can rewrite the data directory anyway: by design
// it may act for any node too (docs/security.md).
func certNode(r *http.Request) (name string, bound bool) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return "", false
	}
	id, err := pki.IdentityOf(r.TLS.PeerCertificates[0])
	switch {
	case err != nil:
		return "", true // no identity: may act as no node
	case id.Role != pki.RoleNode:
		return "", false
	}
	return id.Name, true
}

// allowed says whether role may call method on path.
func allowed(role, method, path string) bool {
	internal := strings.HasPrefix(path, "/v1/internal/") || path == "/v1/cluster/join"
	read := method == http.MethodGet || method == http.MethodHead
	switch role {
	case pki.RoleNode:
		return internal || read
	case pki.RoleAdmin:
		return !strings.HasPrefix(path, "/v1/internal/")
	case pki.RoleReader:
		// An export is a read of a volume's data, not of the registry:
		// an admin's. The host registry is host NQNs: an admin's too.
		return read && !internal && !(strings.HasPrefix(path, "/v1/volumes/") && strings.HasSuffix(path, "/export")) && !hostsPath(path)
	case pki.RoleHost:
		// One host certificate is shared by every node of a Kubernetes
		// cluster: it registers hosts and reads one it names, never the
		// list (a stolen one learns no NQN it did not know).
		return (method == http.MethodPost && path == "/v1/hosts") ||
			(read && strings.HasPrefix(path, "/v1/hosts/") && !strings.Contains(path[len("/v1/hosts/"):], "/"))
	}
	return false
}

// hostsPath says whether path is the host registry's.
func hostsPath(path string) bool { return path == "/v1/hosts" || strings.HasPrefix(path, "/v1/hosts/") }

// roleNeeds says which role a refused call needs, for the refusal.
func roleNeeds(method, path string) string {
	switch {
	case strings.HasPrefix(path, "/v1/internal/") || path == "/v1/cluster/join":
		return "a node certificate"
	case hostsPath(path) && (method == http.MethodPost || method == http.MethodGet || method == http.MethodHead):
		return "an admin certificate (a host certificate may register a host and read one by NQN)"
	case strings.HasPrefix(path, "/v1/volumes/") && strings.HasSuffix(path, "/export"):
		return "an admin certificate (an export reads a volume's data)"
	case method == http.MethodGet || method == http.MethodHead:
		return "a reader or admin certificate"
	}
	return "an admin certificate"
}

// statusRecorder keeps the status a read's handler wrote, for the event
// log, and the start of an error answer's body (at most maxErrText+1
// bytes: errorText's cut), whose message the log line carries.
type statusRecorder struct {
	http.ResponseWriter
	status int
	body   []byte
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	if s.status >= 400 && len(s.body) <= maxErrText {
		s.body = append(s.body, p[:min(len(p), maxErrText+1-len(s.body))]...)
	}
	return s.ResponseWriter.Write(p)
}

// guard authorizes every request (with TLS) and records every
// state-changing one with its caller and outcome in the audit log
// (audit.go), before it is applied and before it is answered.
func (d *Daemon) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, role := caller(r)
		if d.apiTLS != nil && (r.TLS == nil || len(r.TLS.PeerCertificates) == 0) && !publicRoute(r.Method, r.URL.Path) {
			d.refusedTLS.Add(1)
			err := fmt.Errorf("%s presented no certificate: only GET /livez and /readyz are open without one", who)
			d.log.Warn("api call refused", slog.String("who", who), slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("err", err.Error()))
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": err.Error() + " (give a certificate of the cluster CA: blkctl cert issue NAME --role reader|admin; docs/security.md)"})
			return
		}
		if p, ok := r.Context().Value(localPeerKey{}).(localPeer); d.localAuth() && (!ok || p.err != nil) && !openToLocalUsers(r.Method, r.URL.Path) {
			if !ok {
				p.err = fmt.Errorf("the connection's local user is unknown")
			}
			d.refusedLocal.Add(1)
			d.log.Warn("api call refused", slog.String("who", who), slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("err", p.err.Error()))
			writeJSON(w, http.StatusForbidden, map[string]string{"error": p.err.Error() +
				": without --tls-dir only they may use this node's API (run blkctl as that user or with sudo, or give the cluster certificates: docs/security.md)"})
			return
		}
		if d.apiTLS != nil && !publicRoute(r.Method, r.URL.Path) && !allowed(role, r.Method, r.URL.Path) {
			d.refusedRole.Add(1)
			err := fmt.Errorf("%s may not %s %s: that needs %s", who, r.Method, r.URL.Path, roleNeeds(r.Method, r.URL.Path))
			d.log.Warn("api call refused", slog.String("who", who), slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("err", err.Error()))
			writeJSON(w, http.StatusForbidden, map[string]string{"error": err.Error()})
			return
		}
		if audited(r) {
			d.auditCall(w, r, who, h)
			return
		}
		if !d.log.Enabled(r.Context(), slog.LevelDebug) {
			h.ServeHTTP(w, r)
			return
		}
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		attrs := []any{slog.String("who", who), slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", rec.status)}
		if rec.status >= 400 {
			attrs = append(attrs, slog.String("err", errorText(rec.body)))
		}
		d.log.Debug("api request", attrs...)
	})
}

// serveAPI serves the API on ln: HTTPS with mutual TLS when configured.
func (d *Daemon) serveAPI(ln net.Listener) error {
	if d.apiTLS != nil {
		return d.srv.Serve(tls.NewListener(ln, d.apiTLS))
	}
	return d.srv.Serve(ln)
}

// isLoopback says whether a host:port names only this machine.
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redact hides the host NQNs of a volume (allowed hosts, attachments) from
// a reader: who may connect is an admin's business. Without TLS there are
// no roles and nothing is hidden.
func (d *Daemon) redact(r *http.Request, v api.Volume) api.Volume {
	if d.apiTLS == nil {
		return v
	}
	if _, role := caller(r); role == pki.RoleReader {
		v.Hosts, v.Attachments, v.Authentication = nil, nil, nil
		v.Reservation = redactReservation(v.Reservation) // reservation.go
	}
	return v
}

// authCollector exports the API's refusals and the audit log's write
// errors.
type authCollector struct {
	d     *Daemon
	desc  *prometheus.Desc
	raft  *prometheus.Desc
	audit *prometheus.Desc
}

func (c authCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.raft
	ch <- c.audit
}

func (c authCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.d.refusedTLS.Load()), "certificate")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.d.refusedRole.Load()), "role")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.d.refusedLocal.Load()), "local-user")
	ch <- prometheus.MustNewConstMetric(c.raft, prometheus.CounterValue, float64(c.d.refusedRaft.Load()))
	ch <- prometheus.MustNewConstMetric(c.audit, prometheus.CounterValue, float64(c.d.audit.failed.Load()))
}

func newAuthCollector(d *Daemon) authCollector {
	return authCollector{d: d, desc: prometheus.NewDesc("blk_api_refused_total",
		"Management API callers refused: reason=certificate (TLS handshake: none, another CA's, expired, wrong usage or role), role (a call the role may not make) or local-user (without --tls-dir: a local user other than root and the one running blkd).", []string{"reason"}, nil),
		raft: prometheus.NewDesc("blk_raft_refused_total",
			"Raft connections refused: in their TLS handshake (no node certificate of the cluster CA), or without --tls-dir, opened by a local user other than root and the one running blkd.", nil, nil),
		audit: prometheus.NewDesc("blk_audit_write_errors_total",
			"Audit records (api call received, api call, volume state) that could not be written to the log output: the API call was refused (503) or answered 500, a volume state change went unrecorded.", nil, nil)}
}
