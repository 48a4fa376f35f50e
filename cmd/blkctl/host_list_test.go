package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/api"
)

// TestHostList: host list says so when no host is registered, shows the
// registered hosts sorted by NQN with a dash for what is missing and an
// RFC 3339 time, and prints the list as JSON with -o json; a
// registration again keeps the first time.
func TestHostList(t *testing.T) {
	a := startBlkd(t)
	if out := ok(t, a, "host", "list"); !strings.Contains(out, "no registered hosts") {
		t.Fatalf("empty list: %q", out)
	}
	register := func(body string, want int) {
		t.Helper()
		resp, err := http.Post("http://"+a+"/v1/hosts", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("POST /v1/hosts %s: %s, want %d", body, resp.Status, want)
		}
	}
	register(`{"host_nqn": "nqn.2014-08.org.nvmexpress:uuid:b", "name": "worker-b", "zone": "zone-b"}`, 201)
	register(`{"host_nqn": "nqn.2014-08.org.nvmexpress:uuid:a"}`, 201)
	register(`{"host_nqn": "nqn.2014-08.org.nvmexpress:uuid:b", "name": "worker-b", "zone": "zone-b"}`, 200)
	out := ok(t, a, "host", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !regexp.MustCompile(`^HOSTNQN\s+NAME\s+ZONE\s+REGISTERED$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^nqn.2014-08.org.nvmexpress:uuid:a\s+-\s+-\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^nqn.2014-08.org.nvmexpress:uuid:b\s+worker-b\s+zone-b\s+\d{4}-`).MatchString(lines[2]) {
		t.Fatalf("host list:\n%s", out)
	}
	var l api.HostList
	if err := json.Unmarshal([]byte(ok(t, a, "-o", "json", "host", "list")), &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Hosts) != 2 || l.Hosts[1].Name != "worker-b" || l.Hosts[1].Zone != "zone-b" ||
		time.Since(l.Hosts[0].RegisteredAt) > time.Minute || l.Hosts[0].RegisteredAt.Location() != time.UTC {
		t.Fatalf("host list -o json: %+v", l)
	}
	fails(t, a, 2, "", "host", "list", "extra")
}

// TestHostListOlderBlkd: a blkd without the host registry gets a clear
// message, not its "no route".
func TestHostListOlderBlkd(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":"no route GET /v1/hosts: the API is under /v1/volumes and /v1/cluster"}`)
	}))
	defer srv.Close()
	var out, errb bytes.Buffer
	if code := run([]string{"blkctl", "--api", srv.URL, "host", "list"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "has no host registry") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}
