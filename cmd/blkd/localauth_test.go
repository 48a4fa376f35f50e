package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// asNobody runs a bash script as uid/gid 65534 and returns its output.
func asNobody(t *testing.T, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil && len(out) == 0 {
		t.Fatalf("bash as uid 65534: %v", err)
	}
	return string(out)
}

// TestLocalUsers: without --tls-dir (the embedded default, loopback only)
// the API and raft let in root and the user running blkd, and nobody
// else on the machine: another user's API calls get 403 naming them,
// its raft connections are closed unread; each is counted, the call is
// logged, and blkd's own calls (and a local cluster's) go on.
func TestLocalUsers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to call blkd as another local user")
	}
	raft := freeAddr(t)
	d := startBlkdOn(t, t.TempDir(), raft, freeAddr(t), freeAddr(t))
	d.must(t, "POST", "/v1/volumes", `{"name":"v","size":"16MiB"}`, http.StatusCreated, nil)

	host, port, _ := net.SplitHostPort(d.api)
	req := `exec 3<>/dev/tcp/` + host + `/` + port + `; printf '%s\r\nHost: x\r\nConnection: close\r\n\r\n' >&3; cat <&3`
	for _, call := range []string{"GET /v1/volumes HTTP/1.1", "DELETE /v1/volumes/v?force=true HTTP/1.1", "POST /metrics HTTP/1.1"} {
		out := asNobody(t, strings.Replace(req, "%s", call, 1))
		if !strings.Contains(out, "403 Forbidden") || !strings.Contains(out, "uid 65534") || !strings.Contains(out, "neither root nor the user running blkd") {
			t.Errorf("%s as uid 65534:\n%s", call, out)
		}
	}
	// What holds no secret is open to every local user: a Prometheus
	// agent or a probe running as its own user reads it.
	for call, want := range map[string]string{"GET /metrics HTTP/1.1": "blk_volume_size_bytes", "GET /livez HTTP/1.1": "ok", "GET /readyz HTTP/1.1": `"ready":true`} {
		out := asNobody(t, strings.Replace(req, "%s", call, 1))
		if !strings.Contains(out, "200 OK") || !strings.Contains(out, want) {
			t.Errorf("%s as uid 65534: want 200 with %q:\n%s", call, want, out)
		}
	}
	if vs := d.volumes(t); len(vs) != 1 || vs[0].Name != "v" {
		t.Fatalf("volumes after another user's delete: %+v", vs)
	}

	// Raft: the connection is closed before raft reads what was sent.
	rh, rp, _ := net.SplitHostPort(raft)
	asNobody(t, `exec 3<>/dev/tcp/`+rh+`/`+rp+`; printf 'x' >&3; timeout 5 cat <&3; echo closed`)

	m := d.metricsText(t)
	if got := sampleOf(m, `blk_api_refused_total{reason="local-user"}`); got != 3 {
		t.Errorf("blk_api_refused_total{reason=\"local-user\"} = %v, want 3", got)
	}
	if got := sampleOf(m, "blk_raft_refused_total"); got != 1 {
		t.Errorf("blk_raft_refused_total = %v, want 1", got)
	}
	// Logged after the answer is written: wait for the lines.
	d.waitOutput(t, `msg="api call refused" .*who="local uid 65534`)
	// blkd's own user: changes logged with who made it.
	d.must(t, "DELETE", "/v1/volumes/v", "", http.StatusNoContent, nil)
	d.waitOutput(t, `msg="api call" .*who="local uid 0 \(root\)" method=DELETE path=/v1/volumes/v status=204`)
}
