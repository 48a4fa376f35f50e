package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/blk-project/blk/internal/logline"
	"github.com/blk-project/blk/internal/logrec"
	"github.com/blk-project/blk/internal/testport"
	"github.com/blk-project/blk/nvme/auth"
	"github.com/blk-project/blk/pki"
	"github.com/blk-project/blk/transport/providers"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// blkdBin and blkctlBin are built once for the package's tests.
var blkdBin, blkctlBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "blkctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	blkdBin, blkctlBin = filepath.Join(dir, "blkd"), filepath.Join(dir, "blkctl")
	for _, b := range [][2]string{{blkdBin, "../blkd"}, {blkctlBin, "."}} {
		cmd := exec.Command("go", "build", "-o", b[0], b[1])
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", b[1], ":", err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return testport.Addr(t)
}

// startBlkd runs blkd on free ports and a temp dir with the extra
// arguments, waits for its "ready" record, and returns its API address.
func startBlkd(t *testing.T, extra ...string) string {
	t.Helper()
	return startBlkdProc(t, extra...).api
}

// blkdProc is one blkd startBlkdProc started.
type blkdProc struct {
	api    string
	cmd    *exec.Cmd
	exited chan struct{}
	out    *logrec.Buffer
}

// startBlkdProc is startBlkd, returning the process too.
func startBlkdProc(t *testing.T, extra ...string) *blkdProc {
	t.Helper()
	api := freeAddr(t)
	args := append([]string{"--data-dir", t.TempDir(), "--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t), "--api-addr", api}, extra...)
	cmd := exec.Command(blkdBin, args...)
	out := &logrec.Buffer{}
	cmd.Stdout = out
	logs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready, exited := make(chan struct{}), make(chan struct{})
	go func() {
		// blkd logs on standard error; "ready" is the line whose msg is
		// ready.
		seen := false
		sc := bufio.NewScanner(logs)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			out.Write([]byte(sc.Text() + "\n"))
			if !seen && logline.Msg(sc.Text()) == "ready" {
				seen = true
				close(ready)
			}
		}
		io.Copy(out, logs) // past a line too long to scan: keep the pipe drained
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("blkd output:\n%s", out.String())
		}
	})
	select {
	case <-ready:
	case <-exited:
		t.Fatalf("blkd exited before ready:\n%s", out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("blkd not ready within 60 s:\n%s", out.String())
	}
	return &blkdProc{api: api, cmd: cmd, exited: exited, out: out}
}

// blkctl runs the blkctl binary and returns stdout, stderr and the exit code.
func blkctl(t *testing.T, api string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, blkctlBin, append([]string{"--api", "http://" + api}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	}
	t.Fatalf("run blkctl %v: %v", args, err)
	return "", "", 0
}

// ok runs blkctl and requires exit 0.
func ok(t *testing.T, api string, args ...string) string {
	t.Helper()
	out, errs, code := blkctl(t, api, args...)
	if code != 0 {
		t.Fatalf("blkctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// fails runs blkctl and requires exit code want with stderr matching re.
func fails(t *testing.T, api string, want int, re string, args ...string) {
	t.Helper()
	out, errs, code := blkctl(t, api, args...)
	if code != want || !regexp.MustCompile(re).MatchString(errs) {
		t.Fatalf("blkctl %s: exit %d, stderr %q (stdout %q); want exit %d and %q", strings.Join(args, " "), code, errs, out, want, re)
	}
}

func metric(t *testing.T, api, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

const host = "nqn.2026-11.io.blk:host-blkctl"

// TestVolumeWorkflow drives one blkd through blkctl: create, list, show,
// refusals, host allow, attach, bench write then read, detach, delete.
func TestVolumeWorkflow(t *testing.T) {
	api := startBlkd(t)

	out := ok(t, api, "volume", "create", "vol1", "--size", "64MiB")
	if !strings.Contains(out, "created volume vol1 (64 MiB") {
		t.Fatalf("create output:\n%s", out)
	}
	out = ok(t, api, "volume", "list")
	if !regexp.MustCompile(`(?m)^NAME\s+SIZE\s+BLOCK.*\n^vol1\s+64 MiB\s+4096\s+online`).MatchString(out) {
		t.Fatalf("list table:\n%s", out)
	}
	listJSON := ok(t, api, "--output", "json", "volume", "list")
	var l struct {
		Volumes []volume `json:"volumes"`
	}
	if err := json.Unmarshal([]byte(listJSON), &l); err != nil || len(l.Volumes) != 1 || l.Volumes[0].SizeBytes != 64<<20 {
		t.Fatalf("list json %q: %v", listJSON, err)
	}
	// The short form after the verb too (it was once parsed and ignored).
	if out := ok(t, api, "volume", "list", "-o", "json"); out != listJSON {
		t.Fatalf("-o json after the verb:\n%s", out)
	}
	if out := ok(t, api, "volume", "list", "--output", "json"); out != listJSON {
		t.Fatalf("--output after the verb: %q", out)
	}
	out = ok(t, api, "volume", "show", "vol1")
	if !regexp.MustCompile(`Size:\s+64 MiB \(67108864 bytes\)`).MatchString(out) {
		t.Fatalf("show:\n%s", out)
	}

	// Refusals: a clear message, exit != 0, nothing changed.
	fails(t, api, 1, `"nope".*unknown volume.*blkctl volume list`, "volume", "show", "nope")
	fails(t, api, 1, `vol1.*already in use`, "volume", "create", "vol1", "--size", "1GiB")
	fails(t, api, 2, `not a multiple of the block size 4096`, "volume", "create", "odd", "--size", "4097")
	fails(t, api, 2, `missing --size`, "volume", "create", "nosize")
	fails(t, api, 2, `unknown unit "XB"`, "volume", "create", "badunit", "--size", "10XB")
	fails(t, api, 2, `missing NAME`, "volume", "create", "--size", "1GiB")
	fails(t, api, 2, `unknown verb "frob"`, "volume", "frob")
	fails(t, api, 2, `flag provided but not defined`, "volume", "list", "--nope")
	fails(t, api, 1, `not allowed.*blkctl host allow vol1`, "attach", "vol1", "--host-nqn", host)
	if again := ok(t, api, "--output", "json", "volume", "list"); again != listJSON {
		t.Fatalf("refusals changed the volumes:\n%s\nwas\n%s", again, listJSON)
	}

	// Resize: blkd may or may not have the route yet.
	if out, errs, code := blkctl(t, api, "volume", "resize", "vol1", "--size", "128MiB"); code == 0 {
		if show := ok(t, api, "volume", "show", "vol1"); !strings.Contains(show, "128 MiB") || !strings.Contains(out, "resized volume vol1 to 128 MiB") {
			t.Fatalf("resize said %q, then show:\n%s", out, show)
		}
	} else if code != 1 || !strings.Contains(errs, "does not support resize") {
		t.Fatalf("resize: exit %d, stderr %q", code, errs)
	}

	out = ok(t, api, "host", "allow", "vol1", host)
	if !strings.Contains(out, host) {
		t.Fatalf("allow: %s", out)
	}
	var at attachOut
	out = ok(t, api, "-o", "json", "attach", "vol1", "--host-nqn", host)
	if err := json.Unmarshal([]byte(out), &at); err != nil || at.Transport != "tcp" || at.NSID != 1 || at.Port == 0 || at.SubsystemNQN == "" || at.HostNQN != host {
		t.Fatalf("attach json %q: %v", out, err)
	}
	fails(t, api, 1, `live connections.*blkctl detach vol1`, "volume", "delete", "vol1")

	// bench with the attachment in place (it must not detach it), then
	// after a detach (it attaches and detaches itself).
	// caw first: the fresh volume reads as zeros, so every pair writes.
	for _, rw := range []string{"caw", "randwrite", "randread"} {
		start := time.Now()
		out = ok(t, api, "-o", "json", "bench", "vol1", "--host-nqn", host, "--ios", "2000", "--qd", "8", "--rw", rw)
		var r benchResult
		if err := json.Unmarshal([]byte(out), &r); err != nil || r.IOPS <= 0 || r.IOs != 2000 || r.LatP99US <= 0 || r.LatMaxUS < r.LatP50US || r.Miscompares != 0 {
			t.Fatalf("bench %s json %q: %v", rw, out, err)
		}
		t.Logf("bench %s: %.0f IOPS, %.1f MB/s, p50 %.0f µs, p99 %.0f µs (%v)", rw, r.IOPS, r.MBps, r.LatP50US, r.LatP99US, time.Since(start))
	}
	// caw on blocks randwrite filled with random bytes miscompares; once
	// the volume is written with --zero-data (the whole 128 MiB it was
	// resized to, 1024 × 128 KiB) every pair compares equal again.
	benchJSON := func(args ...string) benchResult {
		out := ok(t, api, append([]string{"-o", "json", "bench", "vol1", "--host-nqn", host}, args...)...)
		var r benchResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("bench %v json %q: %v", args, out, err)
		}
		return r
	}
	if r := benchJSON("--ios", "2000", "--qd", "8", "--rw", "caw"); r.Miscompares == 0 {
		t.Fatalf("caw after randwrite: no miscompare in %d pairs", r.IOs)
	}
	benchJSON("--ios", "1024", "--qd", "4", "--rw", "write", "--bs", "128KiB", "--zero-data")
	if r := benchJSON("--ios", "2000", "--qd", "8", "--rw", "caw"); r.Miscompares != 0 || r.IOs != 2000 {
		t.Fatalf("caw after write --zero-data: %d miscompares in %d pairs", r.Miscompares, r.IOs)
	}
	if n := metric(t, api, "blk_volume_writes_total"); n < 2000 {
		t.Fatalf("blk_volume_writes_total = %v after the write bench", n)
	}
	if n := metric(t, api, "blk_volume_reads_total"); n < 2000 {
		t.Fatalf("blk_volume_reads_total = %v after the read bench", n)
	}
	ok(t, api, "detach", "vol1", "--host-nqn", host)
	fails(t, api, 1, `not attached`, "detach", "vol1", "--host-nqn", host)
	out = ok(t, api, "bench", "vol1", "--host-nqn", host, "--ios", "500", "--qd", "4", "--rw", "write", "--bs", "8KiB")
	if !regexp.MustCompile(`IOPS:\s+\d+`).MatchString(out) || !strings.Contains(out, "Latency p99") {
		t.Fatalf("bench table:\n%s", out)
	}
	// bench detached what it attached: a plain delete now succeeds.
	ok(t, api, "host", "deny", "vol1", host)
	ok(t, api, "volume", "delete", "vol1")
	fails(t, api, 1, `unknown volume`, "volume", "show", "vol1")
	if out := ok(t, api, "volume", "list"); !strings.Contains(out, "no volumes") {
		t.Fatalf("list after delete:\n%s", out)
	}
}

// TestAttachAdvertised: attach prints the node's advertised address
// (blkd --advertise-addr) and the nvme connect line of a Linux host, in
// the table and in JSON.
func TestAttachAdvertised(t *testing.T) {
	api := startBlkd(t, "--advertise-addr", "192.0.2.10:14420")
	ok(t, api, "volume", "create", "v", "--size", "16MiB")
	ok(t, api, "host", "allow", "v", host)
	// The default is NVMe/TCP (its advertised address, its own port),
	// with the RDMA line after it.
	out := ok(t, api, "attach", "v", "--host-nqn", host)
	if !regexp.MustCompile(`(?m)^Transport:\s+tcp$`).MatchString(out) || !regexp.MustCompile(`(?m)^  nvme connect -t tcp -a 192\.0\.2\.10 -s \d+ -n `).MatchString(out) ||
		!strings.Contains(out, "nvme connect -t rdma -a 192.0.2.10 -s 14420") {
		t.Fatalf("default attach table:\n%s", out)
	}
	ok(t, api, "detach", "v", "--host-nqn", host)
	out = ok(t, api, "attach", "v", "--host-nqn", host, "--transport", "rdma")
	const nqn = "nqn.2024-01.io.blk:volume:v"
	wantLine := "nvme connect -t rdma -a 192.0.2.10 -s 14420 -n " + nqn + " --hostnqn " + host
	for _, re := range []string{`(?m)^Address:\s+192\.0\.2\.10$`, `(?m)^Port:\s+14420$`, `(?m)^Subsystem NQN:\s+` + regexp.QuoteMeta(nqn) + `$`,
		`(?m)^  ` + regexp.QuoteMeta(wantLine) + `$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("attach table lacks %s:\n%s", re, out)
		}
	}
	ok(t, api, "detach", "v", "--host-nqn", host)
	var at attachOut
	out = ok(t, api, "-o", "json", "attach", "v", "--host-nqn", host, "--transport", "rdma")
	if err := json.Unmarshal([]byte(out), &at); err != nil || at.Address != "192.0.2.10" || at.Port != 14420 || at.NVMeConnect != wantLine {
		t.Fatalf("attach json %q: %v; want address 192.0.2.10, port 14420, nvme_connect %q", out, err, wantLine)
	}
	if !strings.Contains(out, `"nvme_connect": "`+wantLine+`"`) {
		t.Fatalf("attach json has no nvme_connect field:\n%s", out)
	}
}

// TestAttachNBDFailsCleanly: without the nbd module, attach --nbd fails
// with the module message and leaves no attachment behind.
func TestAttachNBDFailsCleanly(t *testing.T) {
	if _, err := os.Stat("/dev/nbd0"); err == nil {
		t.Skip("/dev/nbd0 exists: the nbd module is loaded here")
	}
	api := startBlkd(t)
	ok(t, api, "volume", "create", "v", "--size", "16MiB")
	ok(t, api, "host", "allow", "v", host)
	fails(t, api, 1, `nbd kernel module is not loaded.*modprobe nbd.*attachment was undone`, "attach", "v", "--host-nqn", host, "--nbd", "/dev/nbd0")
	// No attachment left: detach refuses and a plain delete succeeds.
	fails(t, api, 1, `not attached`, "detach", "v", "--host-nqn", host)
	ok(t, api, "volume", "delete", "v")
}

// TestProviderChoice: bench and attach --nbd open the provider their
// flags name; one this binary lacks, or no provider at all, is refused
// with what to do, and the attachment is undone.
func TestProviderChoice(t *testing.T) {
	api := startBlkd(t)
	ok(t, api, "volume", "create", "v", "--size", "16MiB")
	ok(t, api, "host", "allow", "v", host)
	fails(t, api, 1, `--rdma-provider udp: providers: no such provider: "udp"`, "bench", "v", "--host-nqn", host, "--ios", "10", "--rdma-provider", "udp")
	fails(t, api, 1, `not attached`, "detach", "v", "--host-nqn", host)
	if providers.Check("verbs") != nil {
		fails(t, api, 1, `--rdma-provider verbs: .*-tags verbs.*attachment was undone`, "attach", "v", "--host-nqn", host, "--nbd", "/dev/nbd0", "--rdma-provider", "verbs")
	}
	out := ok(t, api, "bench", "v", "--host-nqn", host, "--ios", "100", "--rdma-provider", "soft", "--rw", "randwrite")
	if !strings.Contains(out, "IOPS") {
		t.Fatalf("bench on soft:\n%s", out)
	}
}

// TestClusterStatus prints the single member as the leader, with its
// zone; volume create --node pins to it and refuses an unknown node.
func TestClusterStatus(t *testing.T) {
	api := startBlkd(t, "--zone", "rack-1")
	out := ok(t, api, "cluster", "status")
	if !regexp.MustCompile(`(?m)^NODE\s+LEADER\s+STATE\s+READY\s+ZONE\s+SUFFRAGE.*\n^node1\s+\*\s+up\s+yes\s+rack-1\s+voter`).MatchString(out) {
		t.Fatalf("cluster status:\n%s", out)
	}
	// --node pins (on one node, what placement would choose anyway; the
	// cmd/blkd cluster tests pin elsewhere), and refuses a node the
	// cluster does not have with the API's 404, exit 1.
	if out := ok(t, api, "volume", "create", "pinned", "--size", "8MiB", "--node", "node1"); !strings.Contains(out, "on node node1") {
		t.Fatalf("create --node:\n%s", out)
	}
	// The node's promised capacity (the volume's size) and its disk as
	// it measures it.
	if out := ok(t, api, "cluster", "status"); !regexp.MustCompile(`(?m)PROMISED\s+DISK\n^node1\s.*\s8 MiB of [0-9.]+ [KMGTP]iB\s+[0-9.]+ [KMGTP]?i?B held, [0-9.]+ [KMGTP]?i?B free of [0-9.]+ [KMGTP]iB\s*$`).MatchString(out) {
		t.Fatalf("cluster status after a create:\n%s", out)
	}
	fails(t, api, 1, `node "ghost".*unknown node`, "volume", "create", "lost", "--size", "8MiB", "--node", "ghost")
	if out := ok(t, api, "cluster", "join"); !strings.Contains(out, "--join") {
		t.Fatalf("cluster join:\n%s", out)
	}
	fails(t, api, 2, `missing NODEID`, "cluster", "remove")
	// Removing a node the cluster does not have exited 0.
	fails(t, api, 1, `no node "nobody" in the cluster`, "cluster", "remove", "nobody")
	// So did denying a host the volume never allowed.
	ok(t, api, "volume", "create", "v", "--size", "8MiB")
	fails(t, api, 1, `does not allow host`, "host", "deny", "v", "nqn.2014-08.org.nvmexpress:uuid:nobody")
}

// TestUnreachable: a network error names the URL and the --api flag.
func TestUnreachable(t *testing.T) {
	addr := freeAddr(t)
	fails(t, addr, 1, `cannot reach blkd at http://`+regexp.QuoteMeta(addr)+`.*is blkd running\? .*--api`, "volume", "list")
	fails(t, addr, 2, `--output "yaml"`, "--output", "yaml", "volume", "list")
	fails(t, addr, 2, `--output "yaml"`, "volume", "list", "-o", "yaml")
	fails(t, addr, 2, `unknown command "frob"`, "frob")
	fails(t, addr, 2, `no command given`)
	fails(t, addr, 2, `host needs a verb`, "host")
	fails(t, addr, 2, `missing --host-nqn`, "attach", "v")
	fails(t, addr, 2, `--qd 0`, "bench", "v", "--host-nqn", host, "--qd", "0")
}

// TestFollowerRedirect: a write answered 421 is sent once to leader_api,
// and the user is told which node answered.
func TestFollowerRedirect(t *testing.T) {
	var leaderHits int
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaderHits++
		w.WriteHeader(201)
		fmt.Fprint(w, `{"name":"v","size_bytes":4096,"block_size":4096,"node":"node1","state":"online"}`)
	}))
	defer leader.Close()
	follower := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(421)
		fmt.Fprintf(w, `{"error":"this node is not the registry leader","leader_id":"node1","leader_api":%q}`, strings.TrimPrefix(leader.URL, "http://"))
	}))
	defer follower.Close()
	var out, errb bytes.Buffer
	code := run([]string{"blkctl", "--api", follower.URL, "volume", "create", "v", "--size", "4KiB"}, &out, &errb)
	if code != 0 || leaderHits != 1 || !strings.Contains(errb.String(), "answered by leader node1 at "+leader.URL) {
		t.Fatalf("exit %d, leader hits %d, stderr %q", code, leaderHits, errb.String())
	}
}

// TestResizeUnsupported: a blkd without the resize route (404 "no route"
// or 405) gets a clear message; an unknown volume is still reported.
func TestResizeUnsupported(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   string
	}{
		{404, `{"error":"no route POST /v1/volumes/v/resize: the API is under /v1/volumes and /v1/cluster"}`, "this blkd .* does not support resize"},
		{405, `Method Not Allowed`, "this blkd .* does not support resize"},
		{404, `{"error":"meta: volume \"v\": unknown volume"}`, `unknown volume.*blkctl volume list`},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			fmt.Fprint(w, tc.body)
		}))
		var out, errb bytes.Buffer
		code := run([]string{"blkctl", "--api", srv.URL, "volume", "resize", "v", "--size", "1GiB"}, &out, &errb)
		srv.Close()
		if code != 1 || !regexp.MustCompile(tc.want).MatchString(errb.String()) {
			t.Errorf("%d %s: exit %d, stderr %q, want %q", tc.status, tc.body, code, errb.String(), tc.want)
		}
	}
}

// TestCert: blkctl creates a CA and issues node and operator certificates
// with the right roles and file modes, shows them, refuses to overwrite,
// and refuses an unknown role with a usage error.
func TestCert(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	api := freeAddr(t) // no blkd is needed
	if out := ok(t, api, "cert", "ca", "--dir", dir, "--name", "blk cluster test"); !strings.Contains(out, "written to") {
		t.Fatalf("cert ca: %s", out)
	}
	fails(t, api, 1, `file exists`, "cert", "ca", "--dir", dir)
	ok(t, api, "cert", "issue", "node1", "--role", "node", "--ca-dir", dir, "--host", "127.0.0.1", "--host", "node1.example")
	ok(t, api, "cert", "issue", "alice", "--role", "reader", "--ca-dir", dir, "--out", filepath.Join(dir, "ops"))
	fails(t, api, 2, `bad role`, "cert", "issue", "bob", "--role", "root", "--ca-dir", dir)
	fails(t, api, 1, `file exists`, "cert", "issue", "node1", "--role", "node", "--ca-dir", dir)
	out := ok(t, api, "cert", "show", filepath.Join(dir, "node1.crt"))
	for _, want := range []string{`certificate "node1" issued by "blk cluster test"`, "role: node", "127.0.0.1", "node1.example", "server", "client", "(valid)"} {
		if !strings.Contains(out, want) {
			t.Errorf("cert show node1 lacks %q:\n%s", want, out)
		}
	}
	if out := ok(t, api, "cert", "show", filepath.Join(dir, "ops", "alice.crt")); !strings.Contains(out, "role: reader") || strings.Contains(out, "server") {
		t.Errorf("cert show alice:\n%s", out)
	}
	if fi, err := os.Stat(filepath.Join(dir, "ops", "alice.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("alice.key: %v %v", err, fi.Mode().Perm())
	}
}

// TestTLS: against a blkd with --tls-dir, blkctl talks HTTPS with an
// operator certificate given by flags, or found in ~/.config/blk without
// flags; a reader's change is refused; without credentials it says what it
// needs.
func TestTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	ca, err := pki.NewCA("blk test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	for _, r := range []pki.Request{{Name: "node1", Role: pki.RoleNode, Hosts: []string{"127.0.0.1"}}, {Name: "alice", Role: pki.RoleAdmin}, {Name: "bob", Role: pki.RoleReader}} {
		c, k, err := ca.Issue(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := pki.WritePair(dir, r.Name, c, k); err != nil {
			t.Fatal(err)
		}
	}
	api := startBlkd(t, "--tls-dir", dir)
	https := "https://" + api
	as := func(name string) []string {
		return []string{"--api", https, "--ca", filepath.Join(dir, "ca.crt"), "--cert", filepath.Join(dir, name+".crt"), "--key", filepath.Join(dir, name+".key")}
	}
	ok(t, api, append([]string{"volume", "create", "v", "--size", "8MiB"}, as("alice")...)...)
	if out := ok(t, api, append([]string{"volume", "list"}, as("bob")...)...); !strings.Contains(out, "v ") {
		t.Fatalf("reader's list:\n%s", out)
	}
	fails(t, api, 1, `reader:bob may not DELETE`, append([]string{"volume", "delete", "v"}, as("bob")...)...)

	home := t.TempDir()
	run := func(args ...string) (string, int) {
		cmd := exec.Command(blkctlBin, args...)
		cmd.Env = append(os.Environ(), "HOME="+home)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		return string(out), 0
	}
	if out, code := run("--api", https, "volume", "list"); code != 2 || !strings.Contains(out, "--ca, --cert, --key") {
		t.Fatalf("no credentials: exit %d:\n%s", code, out)
	}
	cfg := filepath.Join(home, ".config", "blk")
	os.MkdirAll(cfg, 0o700)
	for from, to := range map[string]string{"ca.crt": "ca.crt", "alice.crt": "operator.crt", "alice.key": "operator.key"} {
		b, _ := os.ReadFile(filepath.Join(dir, from))
		os.WriteFile(filepath.Join(cfg, to), b, 0o600)
	}
	if out, code := run("--api", https, "volume", "list"); code != 0 || !strings.Contains(out, "v ") {
		t.Fatalf("credentials in ~/.config/blk: exit %d:\n%s", code, out)
	}
}

// TestDHCHAP: a volume whose host must authenticate, across real
// processes (blkd, blkctl bench over the soft provider): the right
// secrets work (bidirectional too); no secret, a wrong one, or a wrong
// controller secret are refused and counted; no secret is ever shown.
func TestDHCHAP(t *testing.T) {
	api := startBlkd(t)
	ok(t, api, "volume", "create", "v", "--size", "16MiB")
	out := ok(t, api, "host", "allow", "v", host, "--dhchap-secret", "generate", "--dhchap-ctrl-secret", "generate")
	secrets := regexp.MustCompile(`generated (host|controller) secret of host \S+ \(give it to the host; it is not shown again\): (DHHC-1:01:\S+)`).FindAllStringSubmatch(out, -1)
	if len(secrets) != 2 || !strings.Contains(out, "must authenticate (dhchap-bidirectional)") {
		t.Fatalf("host allow:\n%s", out)
	}
	hostSecret, ctrlSecret := secrets[0][2], secrets[1][2]
	var js struct {
		Name            string `json:"name"`
		GeneratedSecret string `json:"generated_dhchap_secret"`
	}
	if o := ok(t, api, "-o", "json", "host", "allow", "v", "nqn.2026-11.io.blk:other", "--dhchap-secret", "generate"); json.Unmarshal([]byte(o), &js) != nil || js.Name != "v" || !strings.HasPrefix(js.GeneratedSecret, "DHHC-1:01:") {
		t.Fatalf("host allow -o json with a generated secret:\n%s", o)
	}
	// Never shown again: not in the volume, not in the listing, not in metrics.
	for _, args := range [][]string{{"-o", "json", "volume", "show", "v"}, {"-o", "json", "volume", "list"}, {"volume", "show", "v"}} {
		if o := ok(t, api, args...); strings.Contains(o, "DHHC-1") {
			t.Fatalf("%v shows a secret:\n%s", args, o)
		}
	}
	if o := ok(t, api, "-o", "json", "volume", "show", "v"); !strings.Contains(o, `"authentication": {`) || !strings.Contains(o, `"dhchap-bidirectional"`) {
		t.Fatalf("volume show does not say the host authenticates:\n%s", o)
	}
	if o := ok(t, api, "attach", "v", "--host-nqn", host); !strings.Contains(o, `--dhchap-secret "$BLK_DHCHAP_SECRET" --dhchap-ctrl-secret "$BLK_DHCHAP_CTRL_SECRET"`) {
		t.Fatalf("attach's nvme connect line lacks the secrets' variables:\n%s", o)
	}
	bench := []string{"bench", "v", "--host-nqn", host, "--ios", "200", "--qd", "4", "--rw", "write"}
	ok(t, api, append(bench, "--dhchap-secret", hostSecret)...)
	ok(t, api, append(bench, "--dhchap-secret", hostSecret, "--dhchap-ctrl-secret", ctrlSecret)...)
	if n := metric(t, api, "blk_target_auth_succeeded_total"); n < 4 {
		t.Fatalf("blk_target_auth_succeeded_total %v after two authenticated associations", n)
	}
	fails(t, api, 1, `requires DH-HMAC-CHAP authentication`, bench...)
	other, _ := auth.GenerateKey(auth.SHA256, 32)
	fails(t, api, 1, `refused the host: authentication failed`, append(bench, "--dhchap-secret", other.Encode())...)
	fails(t, api, 1, `controller failed to authenticate`, append(bench, "--dhchap-secret", hostSecret, "--dhchap-ctrl-secret", other.Encode())...)
	fails(t, api, 1, `DHCHAPSecret`, append(bench, "--dhchap-secret", "DHHC-1:00:garbage:")...)
	// Each refused association ended on the target (the one without a
	// secret by the deadline, later): refused and counted.
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, api, "blk_target_auth_failed_total") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("blk_target_auth_failed_total %v", metric(t, api, "blk_target_auth_failed_total"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if o := ok(t, api, "-o", "json", "volume", "show", "v"); strings.Contains(o, "DHHC-1") {
		t.Fatal("a secret appeared")
	}
	// Bad input to host allow.
	fails(t, api, 2, `--dhchap-secret`, "host", "allow", "v", host, "--dhchap-secret", "DHHC-1:00:short:")
	fails(t, api, 2, `needs --dhchap-secret`, "host", "allow", "v", host, "--dhchap-ctrl-secret", "generate")
	fails(t, api, 1, `must differ`, "host", "allow", "v", host, "--dhchap-secret", hostSecret, "--dhchap-ctrl-secret", hostSecret)
}
