package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/blk-project/blk/internal/testport"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/internal/logline"
	"github.com/blk-project/blk/transport/providers"
	"github.com/blk-project/blk/transport/soft"
)

// binary is blkd built once for the package's tests (TestMain).
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "blkd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "blkd")
	cmd := exec.Command("go", "build", "-o", binary, ".")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build blkd:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	return testport.Addr(t)
}

type daemon struct {
	cmd *exec.Cmd
	api string
	// hc and scheme reach the API: plain HTTP by default, HTTPS with a
	// client certificate for --tls-dir nodes (useTLS).
	hc     *http.Client
	scheme string
	mu     sync.Mutex
	out    bytes.Buffer // its standard error: the log
	stdout bytes.Buffer // its standard output, which must stay empty
	exited chan struct{}
	err    error
}

func (d *daemon) url(path string) string {
	if d.scheme == "" {
		return "http://" + d.api + path
	}
	return d.scheme + "://" + d.api + path
}

func (d *daemon) client() *http.Client {
	if d.hc == nil {
		return http.DefaultClient
	}
	return d.hc
}

// useTLS makes the test talk HTTPS to d with the client configuration c.
func (d *daemon) useTLS(c *tls.Config) {
	d.scheme, d.hc = "https", &http.Client{Transport: &http.Transport{TLSClientConfig: c}, Timeout: 30 * time.Second}
}

func (d *daemon) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

// stdoutText is what blkd wrote to its standard output.
func (d *daemon) stdoutText() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stdout.String()
}

type lockedWriter struct{ d *daemon }

type stdoutWriter struct{ d *daemon }

func (w stdoutWriter) Write(p []byte) (int, error) {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return w.d.stdout.Write(p)
}

// hasReady says whether out (blkd's log) holds the record that the node
// is ready: a line whose msg is ready, in either --log-format.
func hasReady(out string) bool {
	_, ok := logline.Find(out, "ready")
	return ok
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return w.d.out.Write(p)
}

// runBlkd runs blkd with args and waits for it to exit, returning its
// combined output and exit code.
func runBlkd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("run blkd: %v", err)
	return "", 0
}

// startBlkd starts blkd on dir with free ports and waits for "ready".
func startBlkd(t *testing.T, dir string, extra ...string) *daemon {
	t.Helper()
	return startBlkdOn(t, dir, freeAddr(t), freeAddr(t), freeAddr(t), extra...)
}

// startBlkdOn starts blkd on dir with the given raft, nvme and api
// addresses and waits for "ready".
func startBlkdOn(t *testing.T, dir, raft, nvme, api string, extra ...string) *daemon {
	t.Helper()
	d, ready := launchBlkdOn(t, dir, raft, nvme, api, extra...)
	d.waitReady(t, ready, 60*time.Second)
	return d
}

// launchBlkdOn starts blkd as startBlkdOn does without waiting: ready
// closes when it prints "ready".
func launchBlkdOn(t *testing.T, dir, raft, nvme, api string, extra ...string) (*daemon, <-chan struct{}) {
	t.Helper()
	args := append([]string{"--data-dir", dir, "--raft-addr", raft, "--nvme-addr", nvme, "--api-addr", api}, extra...)
	if !slices.Contains(extra, "--tcp-addr") {
		args = append(args, "--tcp-addr", freeAddr(t))
	}
	return launchBlkd(t, api, nil, args...)
}

// launchBlkd starts blkd with args (api is its --api-addr) without
// waiting: ready closes when it logs "ready" (a line whose msg is ready)
// on its standard error, which goes into its output. With stderr, the
// log goes there instead, as it is (a regular file stays one: blkd
// fsyncs its audit records there), and ready closes once the API's
// /readyz answers 200 (blkd marks itself started just before it logs
// ready). Whatever blkd writes to its standard output fails the test:
// it must write nothing there.
func launchBlkd(t *testing.T, api string, stderr *os.File, args ...string) (*daemon, <-chan struct{}) {
	t.Helper()
	d := &daemon{cmd: exec.Command(binary, args...), api: api, exited: make(chan struct{})}
	d.cmd.Stdout = stdoutWriter{d}
	var logs io.Reader
	if stderr != nil {
		d.cmd.Stderr = stderr
	} else {
		pipe, err := d.cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		logs = pipe
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		if logs != nil {
			seen := false
			sc := bufio.NewScanner(logs)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				lockedWriter{d}.Write([]byte(sc.Text() + "\n"))
				if !seen && logline.Msg(sc.Text()) == "ready" {
					seen = true
					close(ready)
				}
			}
			io.Copy(lockedWriter{d}, logs) // past a line too long to scan: keep the pipe drained
		}
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	if stderr != nil {
		go d.pollReady(ready)
	}
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.exited
		if out := d.stdoutText(); out != "" {
			t.Errorf("blkd wrote to its standard output (its log belongs on standard error):\n%s", out)
		}
		if t.Failed() {
			t.Logf("blkd output:\n%s", d.output())
		}
	})
	return d, ready
}

// pollReady closes ready once d's /readyz answers 200, and gives up
// when d exits.
func (d *daemon) pollReady(ready chan<- struct{}) {
	c := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-d.exited:
			return
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := c.Get(d.url("/readyz"))
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			close(ready)
			return
		}
	}
}

// waitReady waits for ready (from launchBlkdOn), failing the test if
// blkd exits first or takes longer than within.
func (d *daemon) waitReady(t *testing.T, ready <-chan struct{}, within time.Duration) {
	t.Helper()
	select {
	case <-ready:
	case <-d.exited:
		t.Fatalf("blkd exited before ready: %v\n%s", d.err, d.output())
	case <-time.After(within):
		t.Fatalf("blkd not ready within %v:\n%s", within, d.output())
	}
}

// stop sends SIGTERM and checks blkd exits 0.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("blkd did not exit within 30 s of SIGTERM:\n%s", d.output())
	}
	if d.err != nil {
		t.Fatalf("blkd exit after SIGTERM: %v\n%s", d.err, d.output())
	}
}

// call does an API request and decodes the JSON answer into out (if not
// nil); it returns the status and, for errors, the error message.
func (d *daemon) call(t *testing.T, method, path, body string, out any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, d.url(path), rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := d.client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		var e struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(b, &e); err != nil || e.Error == "" {
			t.Fatalf("%s %s: %d with body %q, want a JSON {error}", method, path, resp.StatusCode, b)
		}
		return resp.StatusCode, e.Error
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode, ""
}

func (d *daemon) must(t *testing.T, method, path, body string, want int, out any) {
	t.Helper()
	if got, msg := d.call(t, method, path, body, out); got != want {
		t.Fatalf("%s %s %s: status %d (%s), want %d", method, path, body, got, msg, want)
	}
}

// refuse checks a request fails with status want and a message matching re.
func (d *daemon) refuse(t *testing.T, method, path, body string, want int, re string) {
	t.Helper()
	got, msg := d.call(t, method, path, body, nil)
	if got != want || !regexp.MustCompile(re).MatchString(msg) {
		t.Fatalf("%s %s %s: %d %q, want %d matching %q", method, path, body, got, msg, want, re)
	}
}

type volumeJSON struct {
	Name      string   `json:"name"`
	ID        uint64   `json:"id"`
	SizeBytes uint64   `json:"size_bytes"`
	BlockSize uint32   `json:"block_size"`
	Node      string   `json:"node"`
	State     string   `json:"state"`
	NQN       string   `json:"nqn"`
	Hosts     []string `json:"hosts"`
	Reason    string   `json:"reason"`
	// Attachments are the registry's attachments of the volume.
	Attachments []struct {
		HostNQN string `json:"host_nqn"`
		Node    string `json:"node"`
	} `json:"attachments"`
}

type listJSON struct {
	Volumes []volumeJSON `json:"volumes"`
}

type attachJSON struct {
	Address      string `json:"address"`
	Port         int    `json:"port"`
	SubsystemNQN string `json:"subsystem_nqn"`
	NSID         uint32 `json:"nsid"`
	Transport    string `json:"transport"`
	Endpoints    []struct {
		Transport, Address string
		Port               int
	} `json:"endpoints"`
}

// endpoint returns a's endpoint of transport tr ("" if none).
func (a attachJSON) endpoint(tr string) string {
	for _, e := range a.Endpoints {
		if e.Transport == tr {
			return net.JoinHostPort(e.Address, strconv.Itoa(e.Port))
		}
	}
	return ""
}

// over returns a with its endpoint of transport tr preferred.
func (a attachJSON) over(tr string) attachJSON {
	for _, e := range a.Endpoints {
		if e.Transport == tr {
			a.Transport, a.Address, a.Port = e.Transport, e.Address, e.Port
		}
	}
	return a
}

// attachNew creates volume name of size on d, allows hostNQN on it and
// attaches it for hostNQN.
func attachNew(t *testing.T, d *daemon, name, size string) (volumeJSON, attachJSON) {
	t.Helper()
	var v volumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "`+name+`", "size": "`+size+`"}`, 201, &v)
	d.must(t, "POST", "/v1/volumes/"+name+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	var a attachJSON
	d.must(t, "POST", "/v1/volumes/"+name+"/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	return v, a
}

// hostConfig is the initiator configuration for a's preferred transport
// (soft iWARP for RDMA, closed at the end of the test).
func hostConfig(t *testing.T, a attachJSON, host string) initiator.Config {
	t.Helper()
	if a.Transport == "tcp" {
		return initiator.Config{Transport: initiator.TransportTCP, HostNQN: host}
	}
	nic, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nic.Close() })
	return initiator.Config{Adapter: nic, HostNQN: host}
}

const hostNQN = "nqn.2026-11.io.blk:host-test"

// connect attaches the initiator to a over its preferred transport
// (NVMe/TCP from a default blkd) and returns namespace a.NSID.
func connect(t *testing.T, a attachJSON) (*initiator.Controller, *initiator.Namespace) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := net.JoinHostPort(a.Address, strconv.Itoa(a.Port))
	cfg := hostConfig(t, a, hostNQN)
	cfg.Queues = 1
	ctrl, err := initiator.Connect(ctx, cfg, addr, a.SubsystemNQN)
	if err != nil {
		t.Fatalf("connect to %s at %s: %v", a.SubsystemNQN, addr, err)
	}
	return ctrl, ctrl.Namespace(a.NSID)
}

// metric returns the sum of the samples of name in d's /metrics.
func (d *daemon) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := d.client().Get(d.url("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		sum += v
		found = true
	}
	if !found {
		t.Fatalf("/metrics has no %s", name)
	}
	return sum
}

// metricsText returns d's /metrics page.
func (d *daemon) metricsText(t *testing.T) string {
	t.Helper()
	resp, err := d.client().Get(d.url("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (d *daemon) volumes(t *testing.T) []volumeJSON {
	t.Helper()
	var l listJSON
	d.must(t, "GET", "/v1/volumes", "", 200, &l)
	return l.Volumes
}

// TestVolumeLifecycle drives one node through the API: create, list,
// refusals, allow a host, attach, I/O through the initiator, metrics,
// restart (the volume is served again), detach, delete, SIGTERM.
func TestVolumeLifecycle(t *testing.T) {
	dir := t.TempDir()
	d := startBlkd(t, dir)
	for _, port := range [][]string{{"port", "raft"}, {"port", "nvme-rdma", "serves", "I/O and discovery"}, {"port", "api", "addr", d.api, "url", "http://" + d.api}} {
		if _, ok := logline.Find(d.output(), "listening", port...); !ok {
			t.Errorf("output lacks a listening record with %q:\n%s", port, d.output())
		}
	}

	var v volumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "vol1", "size": "16MiB", "block_size": 4096}`, 201, &v)
	if v.Name != "vol1" || v.SizeBytes != 16<<20 || v.BlockSize != 4096 || v.State != "online" || v.NQN == "" {
		t.Fatalf("created %+v", v)
	}
	before := d.volumes(t)
	if len(before) != 1 || before[0].Name != "vol1" {
		t.Fatalf("list: %+v", before)
	}

	// Refusals, each leaving the registry unchanged.
	d.refuse(t, "POST", "/v1/volumes", `{"name": "vol1", "size": 4096}`, 409, `vol1.*already in use.*choose another name`)
	d.refuse(t, "POST", "/v1/volumes", `{"name": "odd", "size": 4097, "block_size": 4096}`, 400, `size 4097.*not a multiple of the block size`)
	d.refuse(t, "POST", "/v1/volumes", `{"size": "1GiB"}`, 400, `missing "name"`)
	d.refuse(t, "POST", "/v1/volumes", `{"name": "nosize"}`, 400, `missing "size"`)
	d.refuse(t, "POST", "/v1/volumes", `{"name": "bs", "size": 8192, "block_size": 1000}`, 400, `block size 1000.*512 or 4096`)
	d.refuse(t, "POST", "/v1/volumes", `{"name": "x", "size": "ten"}`, 400, `size "ten"`)
	d.refuse(t, "POST", "/v1/volumes", `not json`, 400, `not the expected JSON`)
	d.refuse(t, "GET", "/v1/volumes/nope", "", 404, `"nope".*unknown volume`)
	d.refuse(t, "DELETE", "/v1/volumes/nope", "", 404, `"nope".*unknown volume`)
	d.refuse(t, "POST", "/v1/volumes/nope/hosts", `{"host_nqn": "`+hostNQN+`"}`, 404, `unknown volume`)
	d.refuse(t, "POST", "/v1/volumes/vol1/hosts", `{}`, 400, `missing "host_nqn"`)
	d.refuse(t, "POST", "/v1/volumes/vol1/attach", `{"host_nqn": "`+hostNQN+`"}`, 403, `not allowed.*POST /v1/volumes/\{name\}/hosts`)
	if after := d.volumes(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("refusals changed the volumes: %+v, was %+v", after, before)
	}

	d.must(t, "POST", "/v1/volumes/vol1/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, &v)
	if len(v.Hosts) != 1 || v.Hosts[0] != hostNQN {
		t.Fatalf("hosts after allow: %v", v.Hosts)
	}
	var a attachJSON
	d.must(t, "POST", "/v1/volumes/vol1/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	if a.Transport != "tcp" || a.endpoint("rdma") == "" || a.NSID != 1 || a.SubsystemNQN != v.NQN || a.Port == 0 {
		t.Fatalf("attach: %+v", a)
	}
	d.refuse(t, "DELETE", "/v1/volumes/vol1", "", 409, `connections.*force=true`)

	ctrl, ns := connect(t, a)
	if got := ns.Blocks() * uint64(ns.BlockSize()); got != 16<<20 {
		t.Fatalf("namespace is %d bytes, want 16 MiB", got)
	}
	data := bytes.Repeat([]byte("blkd"), 2048)
	if _, err := ns.WriteAt(data, 8192); err != nil {
		t.Fatal(err)
	}
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(data))
	if _, err := ns.ReadAt(back, 8192); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("read back: %v, equal %v", err, bytes.Equal(back, data))
	}
	if n := d.metric(t, "blk_volume_writes_total"); n < 1 {
		t.Fatalf("blk_volume_writes_total = %v after a write", n)
	}
	if n := d.metric(t, "blk_volume_reads_total"); n < 1 {
		t.Fatalf("blk_volume_reads_total = %v after a read", n)
	}
	// Raft health: the single node leads a one-server configuration.
	if body := d.metricsText(t); !strings.Contains(body, "\nblk_raft_state{state=\"leader\"} 1\n") ||
		!strings.Contains(body, "\nblk_raft_state{state=\"follower\"} 0\n") {
		t.Fatalf("/metrics lacks blk_raft_state{state=\"leader\"} 1:\n%s", body)
	}
	if n := d.metric(t, "blk_raft_peers"); n != 1 {
		t.Fatalf("blk_raft_peers = %v on a single node", n)
	}
	if n := d.metric(t, "blk_meta_commands_applied_total"); n < 3 {
		t.Fatalf("blk_meta_commands_applied_total = %v after create, allow, attach", n)
	}
	for _, name := range []string{"blk_raft_term", "blk_raft_commit_index", "blk_raft_applied_index", "blk_raft_last_log_index"} {
		if n := d.metric(t, name); n < 1 {
			t.Fatalf("%s = %v", name, n)
		}
	}

	// Grow the volume while the host is connected: the registry shows the
	// new size, the host sees it after a rescan and writes past the old end.
	d.must(t, "POST", "/v1/volumes/vol1/resize", `{"size": "32MiB"}`, 200, &v)
	if v.SizeBytes != 32<<20 {
		t.Fatalf("resize answered %+v", v)
	}
	d.refuse(t, "POST", "/v1/volumes/vol1/resize", `{"size": "8MiB"}`, 400, `shrinking.*not supported`)
	d.refuse(t, "POST", "/v1/volumes/vol1/resize", `{}`, 400, `missing "size"`)
	d.refuse(t, "POST", "/v1/volumes/vol1/resize", `{"size": 40000000}`, 400, `not a multiple`)
	d.refuse(t, "POST", "/v1/volumes/nope/resize", `{"size": "32MiB"}`, 404, `unknown volume`)
	d.must(t, "GET", "/v1/volumes/vol1", "", 200, &v)
	if v.SizeBytes != 32<<20 {
		t.Fatalf("GET after resize: %+v", v)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := ctrl.Rescan(rctx); err != nil {
		t.Fatalf("rescan after resize: %v", err)
	}
	rcancel()
	ns = ctrl.Namespace(a.NSID)
	if got := ns.Blocks() * uint64(ns.BlockSize()); got != 32<<20 {
		t.Fatalf("namespace is %d bytes after resize, want 32 MiB", got)
	}
	if _, err := ns.WriteAt(data, 24<<20); err != nil {
		t.Fatalf("write past the old end: %v", err)
	}
	clear(back)
	if _, err := ns.ReadAt(back, 24<<20); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("read back past the old end: %v, equal %v", err, bytes.Equal(back, data))
	}

	// SIGTERM with the host still connected: the port drains it and blkd
	// exits 0. Then a restart on the same directory serves the same volume.
	d.stop(t)
	ctrl.Close()
	d = startBlkd(t, dir)
	if vs := d.volumes(t); len(vs) != 1 || vs[0].Name != "vol1" || vs[0].State != "online" || vs[0].SizeBytes != 32<<20 {
		t.Fatalf("after restart: %+v", vs)
	}
	d.must(t, "POST", "/v1/volumes/vol1/detach", `{"host_nqn": "`+hostNQN+`"}`, 204, nil)
	d.refuse(t, "POST", "/v1/volumes/vol1/detach", `{"host_nqn": "`+hostNQN+`"}`, 409, `no such connection`)
	d.must(t, "POST", "/v1/volumes/vol1/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	ctrl, ns = connect(t, a)
	clear(back)
	if _, err := ns.ReadAt(back, 8192); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("read back after restart: %v, equal %v", err, bytes.Equal(back, data))
	}
	ctrl.Close()

	// Forced delete drops the connection; the volume is gone everywhere.
	d.must(t, "DELETE", "/v1/volumes/vol1?force=true", "", 204, nil)
	d.refuse(t, "GET", "/v1/volumes/vol1", "", 404, `unknown volume`)
	if vs := d.volumes(t); len(vs) != 0 {
		t.Fatalf("after delete: %+v", vs)
	}
	// The name and the store are free again.
	d.must(t, "POST", "/v1/volumes", `{"name": "vol1", "size": 8192, "block_size": 512}`, 201, &v)
	d.must(t, "POST", "/v1/volumes/vol1/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	v = volumeJSON{} // "hosts" is left out when empty
	d.must(t, "DELETE", "/v1/volumes/vol1/hosts/"+hostNQN, "", 200, &v)
	if len(v.Hosts) != 0 {
		t.Fatalf("hosts after disallow: %v", v.Hosts)
	}
	d.must(t, "DELETE", "/v1/volumes/vol1", "", 204, nil)
	d.stop(t)
	if _, ok := logline.Find(d.output(), "stopped"); !ok {
		t.Fatalf("no clean stop:\n%s", d.output())
	}
}

// TestStartRefusals: bad flags, occupied ports and unusable data
// directories end blkd with exit code 1 and a message naming the problem.
func TestStartRefusals(t *testing.T) {
	occupied, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer occupied.Close()
	busy := occupied.Addr().String()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(t.TempDir(), "blkd.json")
	if err := os.WriteFile(cfgFile, []byte(`{"data_dir": "x", "api_adr": "y"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ports := func() []string {
		return []string{"--raft-addr", freeAddr(t), "--nvme-addr", freeAddr(t), "--tcp-addr", freeAddr(t), "--api-addr", freeAddr(t)}
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--nope"}, `flag provided but not defined: -nope`},
		{"argument", []string{"serve"}, `unexpected argument "serve"`},
		{"negative cores", []string{"--cores", "-1"}, `--cores -1`},
		{"unknown provider", []string{"--rdma-provider", "udp"}, `--rdma-provider: providers: no such provider: "udp" \(blk has \[soft soft-goroutines verbs\]\)`},
		{"soft with a device", append(ports(), "--data-dir", t.TempDir(), "--rdma-device", "rxe0"), `--rdma-device "rxe0".*the soft provider drives no device`},
		{"bad address", []string{"--api-addr", "localhost"}, `--api-addr "localhost" is not host:port`},
		{"join not host:port", []string{"--join", "10.0.0.1"}, `--join "10.0.0.1" is not the host:port`},
		{"zone not a name", []string{"--zone", "rack/1"}, `--zone "rack/1" has '/'`},
		{"wildcard without advertise-addr", []string{"--nvme-addr", "0.0.0.0:4420"}, `--nvme-addr "0.0.0.0:4420" listens on every local address.*set --advertise-addr \(BLK_ADVERTISE_ADDR`},
		{"advertise-addr a name", []string{"--advertise-addr", "storage1.example"}, `--advertise-addr: advertised address "storage1.example" is not an IP address`},
		{"advertise-addr any", []string{"--nvme-addr", "0.0.0.0:4420", "--advertise-addr", "[::]:4420"}, `--advertise-addr: .*"any" address`},
		{"config unknown field", []string{"--config", cfgFile}, `config file .*api_adr`},
		{"config missing", []string{"--config", cfgFile + ".missing"}, `config file.*no such file`},
		{"data dir is a file", append(ports(), "--data-dir", file), `data dir ` + regexp.QuoteMeta(file) + ` is not usable`},
		{"api port occupied", append(ports(), "--data-dir", t.TempDir(), "--api-addr", busy), `--api-addr.*` + regexp.QuoteMeta(busy) + `.*address already in use`},
		{"nvme port occupied", append(ports(), "--data-dir", t.TempDir(), "--nvme-addr", busy), `--nvme-addr.*` + regexp.QuoteMeta(busy)},
		{"raft port occupied", append(ports(), "--data-dir", t.TempDir(), "--raft-addr", busy), `--raft-addr.*` + regexp.QuoteMeta(busy)},
	}
	if providers.Check("verbs") != nil {
		cases = append(cases, struct {
			name string
			args []string
			want string
		}{"verbs not built", []string{"--rdma-provider", "verbs"}, `--rdma-provider: .*"verbs" is in builds with -tags verbs`})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, code := runBlkd(t, tc.args...)
			if code != 1 || !regexp.MustCompile(tc.want).MatchString(out) {
				t.Fatalf("exit %d, output:\n%s\nwant exit 1 and %q", code, out, tc.want)
			}
			if hasReady(out) {
				t.Fatalf("said ready:\n%s", out)
			}
		})
	}
}

// TestConfigFileAndEnv: settings come from the config file, BLK_*
// variables override it, and flags override both.
func TestConfigFileAndEnv(t *testing.T) {
	dir := t.TempDir()
	api := freeAddr(t)
	cfg := fmt.Sprintf(`{"data_dir": %q, "node_id": "filenode", "raft_addr": %q, "nvme_addr": %q, "advertise_addr": "192.0.2.1:4420", "api_addr": "127.0.0.1:1"}`,
		dir, freeAddr(t), freeAddr(t))
	cfgFile := filepath.Join(t.TempDir(), "blkd.json")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &daemon{api: api, exited: make(chan struct{})}
	d.cmd = exec.Command(binary, "--config", cfgFile)
	d.cmd.Env = append(os.Environ(), "BLK_API_ADDR="+api)
	d.cmd.Stdout, d.cmd.Stderr = stdoutWriter{d}, lockedWriter{d}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() { d.cmd.Process.Kill(); <-d.exited })
	deadline := time.Now().Add(60 * time.Second)
	for !hasReady(d.output()) {
		select {
		case <-d.exited:
			t.Fatalf("exited: %v\n%s", d.err, d.output())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready:\n%s", d.output())
		}
	}
	if _, ok := logline.Find(d.output(), "listening", "node", "filenode", "port", "api", "url", "http://"+api); !ok {
		t.Fatalf("config not applied:\n%s", d.output())
	}
	if _, ok := logline.Find(d.output(), "listening", "port", "nvme-rdma", "advertised", "192.0.2.1:4420"); !ok {
		t.Fatalf("config not applied:\n%s", d.output())
	}
	var v volumeJSON
	d.must(t, "POST", "/v1/volumes", `{"name": "v", "size": "1MiB"}`, 201, &v)
	if _, err := os.Stat(filepath.Join(dir, "volumes")); err != nil {
		t.Fatalf("data dir from the config file unused: %v", err)
	}
	d.stop(t)
	if out := d.stdoutText(); out != "" {
		t.Errorf("blkd wrote to its standard output:\n%s", out)
	}
}
