package blkd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/pki"
)

// TestAllowedHosts: a host certificate may register a host and read one
// by NQN, and nothing else (not the list, not a delete, not a volume);
// a reader may not read the host registry; an admin may do all of it; a
// node reads it.
func TestAllowedHosts(t *testing.T) {
	const one = "/v1/hosts/nqn.2014-08.org.nvmexpress:uuid:a"
	for _, c := range []struct {
		role, method, path string
		want               bool
	}{
		{pki.RoleHost, "POST", "/v1/hosts", true},
		{pki.RoleHost, "GET", one, true},
		{pki.RoleHost, "HEAD", one, true},
		{pki.RoleHost, "GET", "/v1/hosts", false},
		{pki.RoleHost, "DELETE", one, false},
		{pki.RoleHost, "POST", one, false},
		{pki.RoleHost, "GET", one + "/x", false},
		{pki.RoleHost, "GET", "/v1/volumes", false},
		{pki.RoleHost, "POST", "/v1/volumes", false},
		{pki.RoleHost, "GET", "/metrics", false},
		{pki.RoleHost, "POST", "/v1/internal/lease", false},
		{pki.RoleHost, "POST", "/v1/cluster/join", false},
		{pki.RoleReader, "GET", "/v1/hosts", false},
		{pki.RoleReader, "GET", one, false},
		{pki.RoleReader, "POST", "/v1/hosts", false},
		{pki.RoleReader, "GET", "/v1/volumes", true},
		{pki.RoleAdmin, "POST", "/v1/hosts", true},
		{pki.RoleAdmin, "GET", "/v1/hosts", true},
		{pki.RoleAdmin, "DELETE", one, true},
		{pki.RoleNode, "GET", "/v1/hosts", true},
		{pki.RoleNode, "POST", "/v1/hosts", false},
		{"", "GET", one, false},
	} {
		if got := allowed(c.role, c.method, c.path); got != c.want {
			t.Errorf("allowed(%q, %s %s) = %v, want %v", c.role, c.method, c.path, got, c.want)
		}
	}
}

// TestRoleNeeds: a refusal names the role the call needs.
func TestRoleNeeds(t *testing.T) {
	for _, c := range []struct{ method, path, want string }{
		{"POST", "/v1/internal/lease", "a node certificate"},
		{"POST", "/v1/cluster/join", "a node certificate"},
		{"GET", "/v1/hosts", "an admin certificate (a host certificate may"},
		{"GET", "/v1/volumes/v/snapshots/s/export", "an admin certificate (an export"},
		{"GET", "/v1/volumes", "a reader or admin certificate"},
		{"DELETE", "/v1/volumes/v", "an admin certificate"},
	} {
		if got := roleNeeds(c.method, c.path); !strings.HasPrefix(got, c.want) {
			t.Errorf("roleNeeds(%s %s) = %q, want %q…", c.method, c.path, got, c.want)
		}
	}
}

// TestCheckHostRequest: a registration's NQN must be in the NVMe grammar
// and its name and zone in the name grammar; each refusal is a 400 that
// names the field.
func TestCheckHostRequest(t *testing.T) {
	const nqn = "nqn.2014-08.org.nvmexpress:uuid:a"
	for _, c := range []struct {
		req  api.RegisterHostRequest
		want string // "" accepted
	}{
		{api.RegisterHostRequest{HostNQN: nqn, Name: "worker-1", Zone: "zone-a"}, ""},
		{api.RegisterHostRequest{HostNQN: nqn}, ""},
		{api.RegisterHostRequest{Name: "w"}, `missing "host_nqn"`},
		{api.RegisterHostRequest{HostNQN: "nqn.14-08.x:a"}, `host_nqn "nqn.14-08.x:a" is not a valid NQN`},
		{api.RegisterHostRequest{HostNQN: "nqn.2014-13.org.x:a"}, "is not a valid NQN"},
		{api.RegisterHostRequest{HostNQN: nqn + "\xff"}, "is not a valid NQN"},
		{api.RegisterHostRequest{HostNQN: nqn, Name: "a b"}, `host name "a b"`},
		{api.RegisterHostRequest{HostNQN: nqn, Name: strings.Repeat("n", 129)}, "host name"},
		{api.RegisterHostRequest{HostNQN: nqn, Zone: "z/1"}, `zone "z/1"`},
	} {
		err := checkHostRequest(c.req)
		if c.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", c.req, err)
			}
			continue
		}
		ae, ok := err.(*apiError)
		if !ok || ae.status != http.StatusBadRequest || !strings.Contains(ae.msg, c.want) {
			t.Errorf("%+v: %v, want 400 with %q", c.req, err, c.want)
		}
	}
}

// TestReadErrorLogged (docs/operations.md §3.2): at debug level the
// "api request" line of a read answered with an error carries the
// error's text; a read answered 200 carries none.
func TestReadErrorLogged(t *testing.T) {
	var out bytes.Buffer
	d := auditDaemon(&out, "debug")
	h := handler(func(w http.ResponseWriter, r *http.Request) error {
		if r.URL.Path == "/v1/hosts/nqn.2014-08.org.x:a" {
			return hostError(errUnknownHostForTest, "nqn.2014-08.org.x:a")
		}
		writeJSON(w, http.StatusOK, map[string]string{"ok": "yes"})
		return nil
	})
	if rec := serveOne(d, h, "GET", "/v1/hosts/nqn.2014-08.org.x:a", ""); rec.Code != http.StatusNotFound {
		t.Fatalf("status %d", rec.Code)
	}
	serveOne(d, h, "GET", "/v1/hosts", "")
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		if m["msg"] == "api request" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("api request lines: %v", lines)
	}
	if e, _ := lines[0]["err"].(string); !strings.HasPrefix(e, "host nqn.2014-08.org.x:a is not registered") || lines[0]["status"] != 404.0 {
		t.Errorf("a 404 read logged %v, want its error text", lines[0])
	}
	if _, has := lines[1]["err"]; has {
		t.Errorf("a 200 read logged an err: %v", lines[1])
	}
}

var errUnknownHostForTest = fmt.Errorf("meta: host %q: %w", "nqn.2014-08.org.x:a", meta.ErrUnknownHost)
