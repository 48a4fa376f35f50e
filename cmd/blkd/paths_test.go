package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/meta"
)

// raw sends one request with exactly this request target (no client
// cleaning, escaping or redirect following) and returns the status and
// body.
func (d *daemon) raw(t *testing.T, method, target, body string) (int, http.Header, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", d.api, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Length: %d\r\n", method, target, d.api, len(body))
	if body != "" {
		req += "Content-Type: application/json\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestUncleanPathsRefused: a path the mux would clean is answered 400
// naming the problem, never redirected; in particular DELETE
// /v1/volumes/victim/hosts/.. leaves the volume and its host alone
// (issue 21 case 1: it was answered 307 to /v1/volumes/victim, and a
// client that followed it deleted the volume).
func TestUncleanPathsRefused(t *testing.T) {
	d := startBlkd(t, t.TempDir())
	d.must(t, "POST", "/v1/volumes", `{"name": "victim", "size": "1MiB"}`, 201, nil)
	d.must(t, "POST", "/v1/volumes/victim/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	for _, tc := range []struct{ method, target, want string }{
		{"DELETE", "/v1/volumes/victim/hosts/..", `dot segment`},
		{"DELETE", "/v1/volumes/victim/hosts/.", `dot segment`},
		{"DELETE", "/v1/volumes/victim/hosts/%2e%2e", `dot segment`},
		{"DELETE", "/v1/volumes/victim/hosts/%2E.", `dot segment`},
		{"DELETE", "/v1/volumes/victim/hosts/../../victim", `dot segment`},
		{"DELETE", "/v1/volumes/victim/./hosts/" + hostNQN, `dot segment`},
		{"DELETE", "/v1/volumes//victim", `empty segment`},
		{"DELETE", "//v1/volumes/victim", `empty segment`},
		{"DELETE", "/v1/volumes/victim/", `empty segment`},
		{"DELETE", "/v1/volumes/vic%2Ftim", `slash`},
		{"DELETE", "/v1/volumes/vic%5ctim", `backslash`},
		{"DELETE", "/v1/volumes/victim/hosts/nqn.2014-08.org%2eexample:x", `escaped '\.'`},
		{"DELETE", "/v1/volumes/victim%252e", `escaped '%'`},
		{"DELETE", "/v1/volumes/vic%00tim", `control character`},
		{"POST", "/v1/volumes/victim/../victim/resize", `dot segment`},
		{"GET", "/v1/volumes/..", `dot segment`},
		{"GET", "/v1/../v1/volumes", `dot segment`},
	} {
		status, hdr, body := d.raw(t, tc.method, tc.target, "")
		var e struct{ Error string }
		json.Unmarshal([]byte(body), &e)
		if status != http.StatusBadRequest || hdr.Get("Location") != "" || !regexp.MustCompile(tc.want).MatchString(e.Error) || !strings.Contains(e.Error, "never redirects") {
			t.Errorf("%s %s: %d (Location %q) %q, want 400 naming %q", tc.method, tc.target, status, hdr.Get("Location"), body, tc.want)
		}
	}
	var v volumeJSON
	d.must(t, "GET", "/v1/volumes/victim", "", 200, &v)
	if len(v.Hosts) != 1 || v.Hosts[0] != hostNQN || v.State != "online" {
		t.Fatalf("victim after the refusals: %+v", v)
	}

	// Names and NQNs are checked by the server too.
	for _, name := range []string{".", "..", "../x", "a/b", "%2e%2e", ".hidden", "a b"} {
		b, _ := json.Marshal(name)
		d.refuse(t, "POST", "/v1/volumes", `{"name": `+string(b)+`, "size": "1MiB"}`, 400, `volume name .*use 1 to 128 ASCII letters`)
	}
	d.refuse(t, "DELETE", "/v1/volumes/victim/hosts/notanqn", "", 400, `host NQN "notanqn" in the path: nvme: `)
	d.refuse(t, "DELETE", "/v1/volumes/victim/hosts?host_nqn=..", "", 400, `host_nqn ".."`)
	d.refuse(t, "GET", "/v1/volumes/-v", "", 400, `volume name "-v" starts with '-'`)
	d.refuse(t, "DELETE", "/v1/volumes", "", 400, `needs the volume's name once`)
	d.refuse(t, "DELETE", "/v1/volumes?name=a&name=b", "", 400, `needs the volume's name once`)
	if vs := d.volumes(t); len(vs) != 1 || vs[0].Name != "victim" || len(vs[0].Hosts) != 1 {
		t.Fatalf("volumes after the refusals: %+v", vs)
	}

	// An NQN with a '/' (valid: anything may follow the ':') is denied
	// through the query form.
	odd := "nqn.2014-08.com.example:a/b%c"
	b, _ := json.Marshal(odd)
	d.must(t, "POST", "/v1/volumes/victim/hosts", `{"host_nqn": `+string(b)+`}`, 200, nil)
	d.must(t, "DELETE", "/v1/volumes/victim/hosts?host_nqn=nqn.2014-08.com.example%3Aa%2Fb%25c", "", 200, &v)
	if len(v.Hosts) != 1 || v.Hosts[0] != hostNQN {
		t.Fatalf("hosts after denying %q: %v", odd, v.Hosts)
	}
}

// TestLegacyNamesLoadAndDelete: a registry that holds volumes named "."
// and "a/b" (an older blkd accepted them; committed here straight to
// raft while blkd is stopped) loads, reports them (a warning and
// legacy_name), and DELETE /v1/volumes?name= deletes them.
func TestLegacyNamesLoadAndDelete(t *testing.T) {
	dir, raftAddr := t.TempDir(), freeAddr(t)
	d := startBlkdOn(t, dir, raftAddr, freeAddr(t), freeAddr(t))
	d.must(t, "POST", "/v1/volumes", `{"name": "keep", "size": "1MiB"}`, 201, nil)
	d.stop(t)

	legacy := []string{".", "a/b", "%2e%2e"}
	n, err := meta.NewNode(meta.Config{ID: "node1", DataDir: filepath.Join(dir, "meta"), BindAddr: raftAddr})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "registry leader", func() error {
		if !n.IsLeader() {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	for _, name := range legacy {
		b, err := meta.EncodeCommand(meta.CreateVolume{Name: name, SizeBytes: 1 << 20, BlockSize: 4096, Node: "node1", At: time.Now().UnixNano()})
		if err != nil {
			t.Fatal(err)
		}
		f := n.Raft().Apply(b, 10*time.Second)
		if err := f.Error(); err != nil {
			t.Fatal(err)
		}
		if r := f.Response().(meta.Result); r.Err != nil {
			t.Fatalf("legacy %q: %v", name, r.Err)
		}
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	d = startBlkdOn(t, dir, raftAddr, freeAddr(t), freeAddr(t))
	var l struct {
		Volumes []struct {
			Name       string `json:"name"`
			LegacyName bool   `json:"legacy_name"`
		} `json:"volumes"`
	}
	d.must(t, "GET", "/v1/volumes", "", 200, &l)
	if got := fmt.Sprint(l.Volumes); got != "[{%2e%2e true} {. true} {a/b true} {keep false}]" {
		t.Fatalf("volumes after restart: %s", got)
	}
	d.waitOutput(t, `legacy name.*kind=volume.*name=a/b`)
	// A clean path holds none of them; the query holds each.
	d.refuse(t, "DELETE", "/v1/volumes/%252e%252e", "", 400, `escaped '%'`)
	d.refuse(t, "DELETE", "/v1/volumes/a%2Fb", "", 400, `slash`)
	for _, q := range []string{".", "a%2Fb", "%252e%252e"} {
		// Retried while the volume is still being created by its owner.
		eventually(t, 60*time.Second, "delete "+q, func() error {
			if status, _, body := d.raw(t, "DELETE", "/v1/volumes?force=true&name="+q, ""); status != http.StatusNoContent {
				return fmt.Errorf("%d %s", status, body)
			}
			return nil
		})
	}
	if vs := d.volumes(t); len(vs) != 1 || vs[0].Name != "keep" {
		t.Fatalf("volumes after deleting the legacy ones: %+v", vs)
	}
}

// TestNewNodeIDRefused: a node starting on an empty data dir must have a
// node ID in the name grammar; it exits 1 naming it before writing
// registry state.
func TestNewNodeIDRefused(t *testing.T) {
	for _, id := range []string{"../n1", "a/b", ".", "%2e%2e"} {
		out, code := runBlkd(t, "--data-dir", t.TempDir(), "--node-id", id, "--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t),
			"--tcp-addr", freeAddr(t), "--api-addr", freeAddr(t))
		if code != 1 || !strings.Contains(out, fmt.Sprintf("node ID %q", id)) || strings.Contains(out, "\nready\n") {
			t.Errorf("--node-id %q: exit %d:\n%s", id, code, out)
		}
	}
}
