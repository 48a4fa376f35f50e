package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/pki"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// client talks to blkd's management API.
type client struct {
	base   string // http://host:port, no trailing slash
	hc     *http.Client
	stderr io.Writer
}

func newClient(api string, stderr io.Writer) (*client, error) {
	base := strings.TrimRight(api, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, usageErrorf("--api %q is not a URL like http://127.0.0.1:7070", api)
	}
	return &client{base: base, hc: &http.Client{Timeout: 60 * time.Second, CheckRedirect: checkRedirect}, stderr: stderr}, nil
}

// redirectError is a redirect blkctl did not follow.
type redirectError struct {
	method, from, to string
	status           int
}

func (e *redirectError) Error() string {
	return fmt.Sprintf("%s %s was answered %d with a redirect to %s; blkctl follows redirects of GET only: a %s sent to another path could act on another resource (blkd never redirects: is --api a proxy?)",
		e.method, e.from, e.status, e.to, e.method)
}

// checkRedirect follows a GET's redirects (at most 10) and refuses every
// other method's: Go's client would repeat a DELETE or POST at the
// location a 307 or 308 names, which is how "host deny VOL .." once
// became DELETE /v1/volumes/VOL.
func checkRedirect(req *http.Request, via []*http.Request) error {
	first := via[0]
	if first.Method != http.MethodGet {
		status := 0
		if req.Response != nil {
			status = req.Response.StatusCode
		}
		return &redirectError{method: first.Method, from: via[len(via)-1].URL.Redacted(), to: req.URL.Redacted(), status: status}
	}
	if len(via) >= 10 {
		return fmt.Errorf("GET %s: stopped after 10 redirects", first.URL.Redacted())
	}
	return nil
}

// useTLS makes c present an operator certificate and accept only a node
// certificate of the cluster CA (pki.MutualTLS). Empty paths default to
// ~/.config/blk/ca.crt, operator.crt and operator.key.
func (c *client) useTLS(ca, cert, key string) error {
	def := func(p *string, name string) {
		if *p == "" {
			if home, err := os.UserHomeDir(); err == nil {
				*p = filepath.Join(home, ".config", "blk", name)
			}
		}
	}
	def(&ca, "ca.crt")
	def(&cert, "operator.crt")
	def(&key, "operator.key")
	var files [3][]byte
	for i, p := range []string{ca, cert, key} {
		b, err := os.ReadFile(p)
		if err != nil {
			return usageErrorf("--api %s is https: blkctl needs the cluster CA, an operator certificate and its key (--ca, --cert, --key; blkctl cert issue NAME --role admin): %v", c.base, err)
		}
		files[i] = b
	}
	_, cfg, err := pki.MutualTLS(files[0], files[1], files[2], pki.RoleNode)
	if err != nil {
		return usageErrorf("TLS credentials: %v", err)
	}
	c.hc.Transport = &http.Transport{TLSClientConfig: cfg}
	return nil
}

// apiError is an error answered by blkd: its message says what was wrong.
type apiError struct {
	Status    int
	Msg       string
	LeaderID  string
	LeaderAPI string
}

func (e *apiError) Error() string { return e.Msg }

// notFoundRoute reports whether e is blkd saying it has no such route
// (an older blkd), as opposed to an unknown object.
func (e *apiError) notFoundRoute() bool {
	return e.Status == http.StatusMethodNotAllowed || (e.Status == http.StatusNotFound && strings.HasPrefix(e.Msg, "no route"))
}

// do sends one request and decodes a 2xx answer into out (if not nil).
// A write answered 421 by a follower is sent once more to the leader the
// answer names; later requests of this client go to the leader too.
func (c *client) do(method, path string, body, out any) error {
	err := c.once(method, path, body, out)
	var ae *apiError
	if method != http.MethodGet && errors.As(err, &ae) && ae.Status == http.StatusMisdirectedRequest {
		if ae.LeaderAPI == "" {
			return fmt.Errorf("%s answered: %s", c.base, ae.Msg)
		}
		leader := ae.LeaderAPI
		if !strings.Contains(leader, "://") {
			leader = "http://" + leader
		}
		fmt.Fprintf(c.stderr, "blkctl: %s is not the registry leader; sending the request to leader %s at %s\n", c.base, ae.LeaderID, leader)
		c.base = leader
		err = c.once(method, path, body, out)
		if err == nil {
			fmt.Fprintf(c.stderr, "blkctl: answered by leader %s at %s\n", ae.LeaderID, leader)
		}
	}
	return err
}

func (c *client) once(method, path string, body, out any) error {
	return c.onceCtx(context.Background(), method, path, body, out)
}

// get is one GET that ctx bounds (the attach follower's, which must end
// when the device is closed).
func (c *client) get(ctx context.Context, path string, out any) error {
	return c.onceCtx(ctx, http.MethodGet, path, nil, out)
}

func (c *client) onceCtx(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	var re *redirectError
	if errors.As(err, &re) {
		return re
	}
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("cannot reach blkd at %s: %v (is blkd running? set the address with --api or BLK_API)", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read the answer of blkd at %s: %v", c.base, err)
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error     string `json:"error"`
			LeaderID  string `json:"leader_id"`
			LeaderAPI string `json:"leader_api"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("blkd at %s answered %s to %s %s: %q", c.base, resp.Status, method, path, strings.TrimSpace(string(b)))
		}
		return &apiError{Status: resp.StatusCode, Msg: e.Error, LeaderID: e.LeaderID, LeaderAPI: e.LeaderAPI}
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("blkd at %s: unexpected answer to %s %s: %v", c.base, method, path, err)
		}
	}
	return nil
}

// API shapes (docs/blkd.md), shared with blkd.
type (
	volume      = api.Volume
	attachment  = api.Connection
	member      = api.Member
	clusterInfo = api.Cluster
)

func volPath(name string) string { return "/v1/volumes/" + url.PathEscape(name) }
