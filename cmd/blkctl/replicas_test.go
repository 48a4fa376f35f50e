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
	"time"

	"github.com/blk-project/blk/api"
)

// replicated is a volume as blkd shows one with three copies, the third
// out of sync and the primary moved once.
var replicated = api.Volume{
	Name: "r", ID: 7, SizeBytes: 1 << 30, BlockSize: 4096, Node: "n2", State: api.StateOnline,
	Reason: "degraded: 2/3 in sync", NQN: "nqn.2024-01.io.blk:volume:r", Epoch: 2, WantReplicas: 3,
	Replicas: []api.Replica{
		{Node: "n1", State: api.ReplicaOutOfSync, Reason: "primary lost at epoch 1", Since: time.Date(2026, 11, 26, 20, 0, 0, 0, time.UTC).UnixNano()},
		{Node: "n2", State: api.ReplicaInSync, Since: 1, Primary: true},
		{Node: "n3", State: api.ReplicaInSync, Since: 1},
	},
}

// TestVolumeShowReplicas: volume show prints the epoch, the count in sync
// and one line per replica with "*" at the primary; -o json carries the
// replica fields; volume create --replicas N sends "replicas": N, and a
// count outside 1..5 is refused before any request.
func TestVolumeShowReplicas(t *testing.T) {
	var mu sync.Mutex
	var bodies []map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			b, _ := io.ReadAll(r.Body)
			var m map[string]any
			_ = json.Unmarshal(b, &m)
			mu.Lock()
			bodies = append(bodies, m)
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
		}
		_ = json.NewEncoder(w).Encode(replicated)
	}))
	defer srv.Close()

	code, out, errs := runIn("--api", srv.URL, "volume", "show", "r")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{
		`(?m)^State:\s+online$`,
		`(?m)^Reason:\s+degraded: 2/3 in sync$`,
		`(?m)^Epoch:\s+2$`,
		`(?m)^Replicas:\s+2 in sync of 3, 3 wanted$`,
		`(?m)^  replica:\s+  n1 out-of-sync since 2026-11-26T20:00:00Z: primary lost at epoch 1$`,
		`(?m)^  replica:\s+\* n2 in-sync since `,
		`(?m)^  replica:\s+  n3 in-sync since `,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	if strings.Index(out, "n1 out-of-sync") > strings.Index(out, "n2 in-sync") {
		t.Errorf("replicas out of placement order:\n%s", out)
	}

	code, out, errs = runIn("--api", srv.URL, "-o", "json", "volume", "show", "r")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	reps, _ := raw["replicas"].([]any)
	if raw["epoch"] != 2.0 || raw["want_replicas"] != 3.0 || len(reps) != 3 {
		t.Fatalf("json %s", out)
	}
	if p, _ := reps[1].(map[string]any); p["primary"] != true || p["node"] != "n2" || p["state"] != "in-sync" {
		t.Fatalf("replica json %v", reps[1])
	}

	if code, _, errs := runIn("--api", srv.URL, "volume", "create", "r", "--size", "1GiB", "--replicas", "3"); code != 0 {
		t.Fatalf("create: exit %d: %s", code, errs)
	}
	for _, n := range []string{"0", "6", "-1"} {
		if code, _, errs := runIn("--api", srv.URL, "volume", "create", "r", "--size", "1GiB", "--replicas", n); code != 2 || !strings.Contains(errs, "give 1 to 5") {
			t.Errorf("--replicas %s: exit %d: %s", n, code, errs)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 || bodies[0]["replicas"] != 3.0 {
		t.Fatalf("requests %v", bodies)
	}
}
