package csi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/pki"
)

// blkAPI is the HTTP client of blkd's /v1 API (docs/operations.md §1.2.1):
// JSON in and out, blkd's {"error": ...} answers decoded into *apiError,
// redirects followed for GET only, a write answered 421 by a follower sent
// once more to the leader the answer names.
type blkAPI struct {
	hc *http.Client

	mu   sync.Mutex
	base string // scheme://host:port, no trailing slash; the leader's once learnt
}

// apiTimeout bounds one request: blkd answers every call the controller
// makes within seconds (a create or a snapshot is one registry entry and
// one message to the owner); a minute leaves room for a leader election.
const apiTimeout = 60 * time.Second

// newBlkAPI returns a client of the blkd at addr ("host:port", or a URL
// with http or https). With tlsDir, it presents the certificate NAME.crt
// and NAME.key of that directory (signed by its ca.crt) and accepts only
// a node certificate of the same CA; an https address without tlsDir is
// refused (no certificate to present).
func newBlkAPI(addr, tlsDir, name string) (*blkAPI, error) {
	base := strings.TrimRight(addr, "/")
	if base == "" {
		return nil, errors.New("csi: no blkd API address: give --api host:port")
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
		if tlsDir != "" {
			base = "https://" + strings.TrimPrefix(base, "http://")
		}
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("csi: --api %q is not an address like 127.0.0.1:7070 or https://blkd:7070", addr)
	}
	c := &blkAPI{base: base, hc: &http.Client{Timeout: apiTimeout, CheckRedirect: getOnlyRedirect}}
	switch {
	case u.Scheme == "https" && tlsDir == "":
		return nil, fmt.Errorf("csi: --api %s is https but no --tls-dir holds the certificate to present", addr)
	case u.Scheme == "http" && tlsDir != "":
		return nil, fmt.Errorf("csi: --tls-dir %s is given but --api %s is plain http", tlsDir, addr)
	case tlsDir != "":
		if name == "" {
			name = "operator"
		}
		caPEM, certPEM, keyPEM, err := pki.NodeFiles(tlsDir, name)
		if err != nil {
			return nil, fmt.Errorf("csi: TLS credentials in %s (ca.crt, %s.crt, %s.key): %w", tlsDir, name, name, err)
		}
		_, cfg, err := pki.MutualTLS(caPEM, certPEM, keyPEM, pki.RoleNode)
		if err != nil {
			return nil, fmt.Errorf("csi: TLS credentials in %s: %w", filepath.Clean(tlsDir), err)
		}
		c.hc.Transport = &http.Transport{TLSClientConfig: cfg}
	}
	return c, nil
}

// getOnlyRedirect follows a GET's redirects and refuses any other
// method's: a POST or DELETE repeated at another location could act on
// another resource (blkctl's checkRedirect rule; blkd itself never
// redirects).
func getOnlyRedirect(req *http.Request, via []*http.Request) error {
	if via[0].Method != http.MethodGet {
		return fmt.Errorf("%s %s was redirected to %s: only GET is followed (is --api a proxy?)", via[0].Method, via[0].URL.Redacted(), req.URL.Redacted())
	}
	if len(via) >= 10 {
		return fmt.Errorf("GET %s: stopped after 10 redirects", via[0].URL.Redacted())
	}
	return nil
}

// apiError is an error answer of blkd: its HTTP status and its message.
type apiError struct {
	Status    int
	Msg       string
	LeaderAPI string // a follower's 421 names the leader's API address
	Method    string
	Path      string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("blkd answered %d to %s %s: %s", e.Status, e.Method, e.Path, e.Msg)
}

// noRoute reports whether blkd answered that it has no such route (an
// older blkd), as opposed to "no such object".
func (e *apiError) noRoute() bool {
	return e.Status == http.StatusMethodNotAllowed || (e.Status == http.StatusNotFound && strings.HasPrefix(e.Msg, "no route"))
}

// statusOf is err's HTTP status when blkd answered it, else 0.
func statusOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// do sends one request and decodes a 2xx answer into out (if not nil).
func (c *blkAPI) do(ctx context.Context, method, path string, body, out any) error {
	err := c.once(ctx, method, path, body, out)
	var ae *apiError
	if method != http.MethodGet && errors.As(err, &ae) && ae.Status == http.StatusMisdirectedRequest && ae.LeaderAPI != "" {
		leader := ae.LeaderAPI
		c.mu.Lock()
		if !strings.Contains(leader, "://") {
			scheme, _, _ := strings.Cut(c.base, "://")
			leader = scheme + "://" + leader
		}
		c.base = leader
		c.mu.Unlock()
		err = c.once(ctx, method, path, body, out)
	}
	return err
}

func (c *blkAPI) once(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	c.mu.Lock()
	base := c.base
	c.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("cannot reach blkd at %s: %w", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read the answer of blkd at %s to %s %s: %w", base, method, path, err)
	}
	if resp.StatusCode >= 300 {
		var e api.Error
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("%s: %q", resp.Status, strings.TrimSpace(string(b)))
		}
		return &apiError{Status: resp.StatusCode, Msg: e.Error, LeaderAPI: e.LeaderAPI, Method: method, Path: path}
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("blkd at %s: unexpected answer to %s %s: %w", base, method, path, err)
		}
	}
	return nil
}

func volPath(name string) string { return "/v1/volumes/" + url.PathEscape(name) }

func (c *blkAPI) volume(ctx context.Context, name string) (*api.Volume, error) {
	var v api.Volume
	if err := c.do(ctx, http.MethodGet, volPath(name), nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

func (c *blkAPI) volumes(ctx context.Context) ([]api.Volume, error) {
	var l api.VolumeList
	if err := c.do(ctx, http.MethodGet, "/v1/volumes", nil, &l); err != nil {
		return nil, err
	}
	return l.Volumes, nil
}

func (c *blkAPI) snapshots(ctx context.Context, vol string) ([]api.Snapshot, error) {
	var l api.SnapshotList
	if err := c.do(ctx, http.MethodGet, volPath(vol)+"/snapshots", nil, &l); err != nil {
		return nil, err
	}
	return l.Snapshots, nil
}

func (c *blkAPI) snapshot(ctx context.Context, vol, snap string) (*api.Snapshot, error) {
	var s api.Snapshot
	if err := c.do(ctx, http.MethodGet, volPath(vol)+"/snapshots/"+url.PathEscape(snap), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

func (c *blkAPI) cluster(ctx context.Context) (*api.Cluster, error) {
	var cl api.Cluster
	if err := c.do(ctx, http.MethodGet, "/v1/cluster?usage=true", nil, &cl); err != nil {
		return nil, err
	}
	return &cl, nil
}

// hostKnown asks the host registry (GET /v1/hosts/{nqn}, §1.9) whether
// nqn is a registered host. registry is false when blkd has no host
// registry (an older blkd answers "no route"): the caller cannot tell.
func (c *blkAPI) hostKnown(ctx context.Context, nqn string) (known, registry bool, err error) {
	if strings.ContainsAny(nqn, "/%") {
		// No clean path segment holds it (blkd refuses such paths):
		// look in the list instead.
		hosts, registry, err := c.hosts(ctx)
		return hosts[nqn], registry, err
	}
	err = c.do(ctx, http.MethodGet, "/v1/hosts/"+url.PathEscape(nqn), nil, nil)
	var ae *apiError
	switch {
	case err == nil:
		return true, true, nil
	case errors.As(err, &ae) && ae.noRoute():
		return false, false, nil
	case statusOf(err) == http.StatusNotFound:
		return false, true, nil
	}
	return false, false, err
}

// hostEntry is the part of api.Host (GET /v1/hosts, §1.9) the controller
// reads, declared here so that this package builds against a blkd whose
// api package has no hosts yet.
type hostEntry struct {
	HostNQN string `json:"host_nqn"`
}

// hosts lists the registered hosts' NQNs; registry is false when blkd
// has no host registry.
func (c *blkAPI) hosts(ctx context.Context) (nqns map[string]bool, registry bool, err error) {
	var l struct {
		Hosts []hostEntry `json:"hosts"`
	}
	err = c.do(ctx, http.MethodGet, "/v1/hosts", nil, &l)
	var ae *apiError
	if errors.As(err, &ae) && ae.noRoute() {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	nqns = make(map[string]bool, len(l.Hosts))
	for _, h := range l.Hosts {
		nqns[h.HostNQN] = true
	}
	return nqns, true, nil
}

// readyz asks blkd's GET /readyz (no credentials needed, §2.2); nil
// means ready.
func (c *blkAPI) readyz(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/readyz", nil, nil)
}
