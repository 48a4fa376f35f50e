package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/blk-project/blk/api"
)

// TestReplaceAndMove: volume replace-replica NAME NODE [--to] and volume
// move NAME --from [--to] send POST /v1/volumes/NAME/replicas/replace
// with {"node", "to"}; bad arguments are refused before any request;
// volume show marks the leaving replica.
func TestReplaceAndMove(t *testing.T) {
	var mu sync.Mutex
	var reqs []string
	replacing := replicated
	replacing.Replicas = []api.Replica{
		{Node: "n1", State: api.ReplicaOutOfSync, Since: 1, ReplacedBy: "n4"},
		{Node: "n4", State: api.ReplicaOutOfSync, Since: 1, Reason: "replacing the replica on n1", Replaces: "n1"},
		{Node: "n2", State: api.ReplicaInSync, Since: 1, Primary: true},
		{Node: "n3", State: api.ReplicaInSync, Since: 1},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			reqs = append(reqs, r.URL.Path+" "+strings.TrimSpace(string(b)))
			mu.Unlock()
			w.WriteHeader(http.StatusAccepted)
		}
		_ = json.NewEncoder(w).Encode(replacing)
	}))
	defer srv.Close()

	code, out, errs := runIn("--api", srv.URL, "volume", "replace-replica", "r", "n1")
	if code != 0 || !strings.Contains(out, "a new one on n4 is copied in full") {
		t.Fatalf("replace: exit %d: %s%s", code, out, errs)
	}
	if code, _, errs := runIn("--api", srv.URL, "volume", "move", "r", "--from", "n2", "--to", "n5"); code != 0 {
		t.Fatalf("move: exit %d: %s", code, errs)
	}
	for _, bad := range [][]string{
		{"volume", "move", "r"},
		{"volume", "move", "r", "--from", "n1", "--to", "n1"},
		{"volume", "replace-replica", "r"},
		{"volume", "replace-replica", "r", "n/1"},
		{"volume", "replace-replica", "r", "n1", "--to", "a b"},
	} {
		if code, _, errs := runIn(append([]string{"--api", srv.URL}, bad...)...); code != 2 {
			t.Errorf("%v: exit %d: %s", bad, code, errs)
		}
	}
	mu.Lock()
	got := strings.Join(reqs, "\n")
	mu.Unlock()
	want := `/v1/volumes/r/replicas/replace {"node":"n1"}` + "\n" + `/v1/volumes/r/replicas/replace {"node":"n2","to":"n5"}`
	if got != want {
		t.Fatalf("requests:\n%s\nwant:\n%s", got, want)
	}
	code, out, errs = runIn("--api", srv.URL, "volume", "show", "r")
	if code != 0 {
		t.Fatalf("show: exit %d: %s", code, errs)
	}
	for _, w := range []string{
		`(?m)^  replica:\s+  n1 out-of-sync since .*; leaving, replaced by n4$`,
		`(?m)^  replica:\s+  n4 out-of-sync since .*: replacing the replica on n1$`,
	} {
		if !regexp.MustCompile(w).MatchString(out) {
			t.Errorf("no %s in:\n%s", w, out)
		}
	}
}
