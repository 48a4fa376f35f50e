package main

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// apiLog is an API stand-in that records every request it gets.
type apiLog struct {
	mu   sync.Mutex
	reqs []string // "METHOD request-URI"
}

func (l *apiLog) add(r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, r.Method+" "+r.RequestURI)
}

func (l *apiLog) got() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.reqs...)
}

const goodNQN = "nqn.2014-08.org.nvmexpress:uuid:6f1d2a3c-8f4e-4b7a-9c1d-2e3f4a5b6c7d"

// TestBadNamesRefusedBeforeRequest: an argument naming a volume, a node
// or a host NQN is checked where blkctl parses it: "host deny VOL .."
// (which once deleted VOL) and its kin exit 2 without a request.
func TestBadNamesRefusedBeforeRequest(t *testing.T) {
	var log apiLog
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		http.Error(w, `{"error": "unexpected"}`, http.StatusTeapot)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"host", "deny", "victim", ".."}, `HOSTNQN "\.\." is not an NQN`},
		{[]string{"host", "deny", "victim", "..", "--force"}, `HOSTNQN "\.\." is not an NQN`},
		{[]string{"host", "deny", "victim", "../x"}, `not an NQN`},
		{[]string{"host", "deny", "victim", "%2e%2e"}, `not an NQN`},
		{[]string{"host", "deny", "victim", "nqn.2014-08.org..x:y"}, `not an NQN`},
		{[]string{"host", "allow", "victim", "host1"}, `not an NQN`},
		{[]string{"host", "deny", "..", goodNQN}, `VOLUME "\.\." starts with '\.'`},
		{[]string{"host", "allow", "a/b", goodNQN}, `VOLUME "a/b" has '/'`},
		{[]string{"volume", "create", "..", "--size", "1MiB"}, `NAME "\.\." starts with '\.'`},
		{[]string{"volume", "create", "a/b", "--size", "1MiB"}, `NAME "a/b" has '/'`},
		{[]string{"volume", "create", "%2e%2e", "--size", "1MiB"}, `NAME "%2e%2e" starts with '%'`},
		{[]string{"volume", "create", "v", "--size", "1MiB", "--node", ".."}, `--node "\.\." starts with '\.'`},
		{[]string{"volume", "create", "v", "--node", "a/b", "--size", "1MiB"}, `--node "a/b" has '/'`},
		{[]string{"volume", "show", "."}, `NAME "\." starts`},
		{[]string{"volume", "resize", "../x", "--size", "2MiB"}, `NAME "\.\./x"`},
		{[]string{"volume", "delete", "."}, `NAME "\." starts.*repeat with --legacy-name`},
		{[]string{"attach", "..", "--host-nqn", goodNQN}, `VOLUME "\.\."`},
		{[]string{"attach", "v", "--host-nqn", ".."}, `--host-nqn "\.\." is not an NQN`},
		{[]string{"detach", "v", "--host-nqn", "host1"}, `--host-nqn "host1" is not an NQN`},
		{[]string{"bench", "v", "--host-nqn", "nqn.x"}, `not an NQN`},
		{[]string{"cluster", "remove", "../node1"}, `NODEID "\.\./node1".*--legacy-name`},
		{[]string{"cert", "issue", "../x", "--role", "node", "--ca-dir", t.TempDir()}, `NAME "\.\./x"`},
	} {
		code, _, errs := runIn(append([]string{"--api", srv.URL}, tc.args...)...)
		if code != 2 || !regexp.MustCompile(tc.want).MatchString(errs) {
			t.Errorf("%q: exit %d, %q; want 2 matching %q", tc.args, code, errs, tc.want)
		}
	}
	if reqs := log.got(); len(reqs) != 0 {
		t.Errorf("requests sent for refused arguments: %q", reqs)
	}
}

// TestRedirectsNotFollowed: blkctl follows a GET's redirect but never a
// DELETE's or POST's (a 307 or 308 keeps the method: "host deny VOL .."
// answered 307 to /v1/volumes/VOL became a DELETE of the volume).
func TestRedirectsNotFollowed(t *testing.T) {
	var log apiLog
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		switch r.URL.Path {
		case "/v1/volumes/moved":
			http.Redirect(w, r, "/v1/volumes/victim", http.StatusTemporaryRedirect)
		case "/v1/volumes/moved/hosts/" + goodNQN, "/v1/volumes/moved/resize", "/v1/volumes":
			http.Redirect(w, r, "/v1/volumes/victim", http.StatusPermanentRedirect)
		case "/v1/volumes/victim":
			w.Header().Set("Content-Type", "application/json")
			if r.Method == http.MethodGet {
				w.Write([]byte(`{"name": "victim", "size_bytes": 1048576, "block_size": 4096, "state": "online"}`))
				return
			}
			w.WriteHeader(http.StatusNoContent)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	for _, args := range [][]string{
		{"host", "deny", "moved", goodNQN},
		{"host", "deny", "moved", goodNQN, "--force"},
		{"volume", "delete", "moved"},
		{"volume", "create", "new", "--size", "1MiB"},
		{"volume", "resize", "moved", "--size", "2MiB"},
	} {
		before := len(log.got())
		code, _, errs := runIn(append([]string{"--api", srv.URL}, args...)...)
		if code != 1 || !strings.Contains(errs, "redirect to "+srv.URL+"/v1/volumes/victim; blkctl follows redirects of GET only") {
			t.Errorf("%q: exit %d, %q; want 1 and the redirect refused", args, code, errs)
		}
		if reqs := log.got()[before:]; len(reqs) != 1 {
			t.Errorf("%q: requests %q, want only the first", args, reqs)
		}
	}
	for _, r := range log.got() {
		if strings.HasSuffix(r, " /v1/volumes/victim") {
			t.Errorf("a redirected write reached the victim: %s", r)
		}
	}
	// A GET follows.
	code, out, errs := runIn("--api", srv.URL, "volume", "show", "moved")
	if code != 0 || !strings.Contains(out, "victim") {
		t.Errorf("volume show through a redirect: exit %d, %q %q", code, out, errs)
	}
}

// TestLegacyNameRequests: --legacy-name sends a name from before the
// grammar in the query, never in a path, and an NQN holding '/' or '%'
// is denied through the query too.
func TestLegacyNameRequests(t *testing.T) {
	var log apiLog
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/volumes":
			w.Write([]byte(`{"volumes": [{"name": "a/b", "legacy_name": true, "state": "online"}, {"name": "ok", "state": "online"}]}`))
		case r.Method == http.MethodDelete && r.URL.Path == "/v1/volumes" && r.URL.Query().Get("name") != "":
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodDelete && r.URL.Path == "/v1/volumes/ok/hosts" && r.URL.Query().Get("host_nqn") == "nqn.2014-08.com.example:a/b%c":
			w.Write([]byte(`{"name": "ok"}`))
		case r.Method == http.MethodPost && r.URL.Path == "/v1/cluster/remove":
			w.Write([]byte(`{"registry": "removed"}`))
		default:
			http.Error(w, `{"error": "unexpected"}`, http.StatusTeapot)
		}
	}))
	defer srv.Close()
	for _, args := range [][]string{
		{"volume", "delete", ".", "--legacy-name"},
		{"volume", "delete", "--legacy-name", "a/b", "--force"},
		{"volume", "delete", "%2e%2e", "--legacy-name"},
		{"host", "deny", "ok", "nqn.2014-08.com.example:a/b%c"},
		{"cluster", "remove", "node 1", "--legacy-name"},
	} {
		if code, _, errs := runIn(append([]string{"--api", srv.URL}, args...)...); code != 0 {
			t.Errorf("%q: exit %d: %s", args, code, errs)
		}
	}
	want := []string{
		"DELETE /v1/volumes?name=.",
		"DELETE /v1/volumes?name=a%2Fb&force=true",
		"DELETE /v1/volumes?name=%252e%252e",
		"DELETE /v1/volumes/ok/hosts?host_nqn=nqn.2014-08.com.example%3Aa%2Fb%25c",
		"POST /v1/cluster/remove",
	}
	if got := log.got(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// volume list warns about a legacy name.
	code, _, errs := runIn("--api", srv.URL, "volume", "list")
	if code != 0 || !strings.Contains(errs, `warning: volume "a/b" has a name outside the name grammar`) || strings.Contains(errs, `"ok"`) {
		t.Errorf("volume list: exit %d, stderr %q", code, errs)
	}
}
