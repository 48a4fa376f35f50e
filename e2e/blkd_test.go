//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/logline"
)

// daemon is a blkd process on the host, with its output kept in the share.
type daemon struct {
	s      *scenario
	name   string
	args   []string
	api    string // host:port
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
	runs   int
	// logName is the current run's log in the share.
	logName string
}

// startDaemon starts blkd with args (plus --data-dir under the share) and
// waits for it to say ready.
func (s *scenario) startDaemon(name, api string, args ...string) *daemon {
	s.t.Helper()
	d := &daemon{s: s, name: name, api: api,
		args: append([]string{"--data-dir", s.path(name + "-data"), "--api-addr", api}, args...)}
	d.start()
	s.t.Cleanup(func() { d.kill() })
	return d
}

func (d *daemon) start() {
	d.s.t.Helper()
	d.waitReady(d.launch())
}

// launch starts blkd without waiting: the channel closes when it says
// ready (waitReady). Nodes of a cluster restarted together are launched
// first, then waited for: none is ready before a majority runs.
func (d *daemon) launch() <-chan struct{} {
	t := d.s.t
	t.Helper()
	d.runs++
	d.logName = d.s.path(fmt.Sprintf("%s.log.%d", d.name, d.runs))
	logf, err := os.Create(d.logName)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(filepath.Join(env.bin, "blkd"), d.args...)
	d.cmd.Env = append(os.Environ(), "GOTRACEBACK=all")
	// blkd writes its log (and, on SIGQUIT, the goroutines' stacks) to
	// standard error, nothing to standard output: the log is read here
	// for the record whose msg is ready and copied to the log file.
	d.cmd.Stdout = logf
	logs, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.exited = make(chan struct{})
	ready := make(chan struct{})
	go func() {
		seen := false
		sc := bufio.NewScanner(logs)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			if !seen && logline.Msg(sc.Text()) == "ready" {
				seen = true
				close(ready)
			}
		}
		io.Copy(logf, logs) // past a line too long to scan: keep the pipe drained
		d.err = d.cmd.Wait()
		logf.Close()
		close(d.exited)
	}()
	return ready
}

// waitReady waits for a launched blkd to say ready (60 s).
func (d *daemon) waitReady(ready <-chan struct{}) {
	t := d.s.t
	t.Helper()
	select {
	case <-ready:
		t.Logf("%s: blkd ready (run %d, pid %d)", d.name, d.runs, d.cmd.Process.Pid)
	case <-d.exited:
		t.Fatalf("%s: blkd exited before ready: %v; log in %s", d.name, d.err, d.logName)
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: blkd not ready within 60 s; log in %s", d.name, d.logName)
	}
}

// kill ends blkd with SIGKILL, as a crash would.
func (d *daemon) kill() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	select {
	case <-d.exited:
		return
	default:
	}
	if d.s.t.Failed() {
		// SIGQUIT first: the Go runtime writes every goroutine's stack
		// to the log (GOTRACEBACK=all), which shows a stuck engine.
		d.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-d.exited:
			d.s.t.Logf("%s: goroutines at the failure in %s", d.name, d.logName)
			return
		case <-time.After(10 * time.Second):
		}
	}
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
}

// stop ends blkd with SIGTERM and checks that it exits 0 within 30 s.
func (d *daemon) stop() {
	t := d.s.t
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: blkd did not exit within 30 s of SIGTERM", d.name)
	}
	if d.err != nil {
		t.Fatalf("%s: blkd exit after SIGTERM: %v", d.name, d.err)
	}
}

// blkctl runs the static blkctl against api with -o json and decodes its
// output into out (if not nil).
func (s *scenario) blkctl(api string, out any, args ...string) {
	s.t.Helper()
	if err := s.blkctlErr(api, out, args...); err != nil {
		s.t.Fatal(err)
	}
}

func (s *scenario) blkctlErr(api string, out any, args ...string) error {
	full := append([]string{"--api", "http://" + api, "-o", "json"}, args...)
	cmd := exec.Command(filepath.Join(env.bin, "blkctl"), full...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("blkctl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("blkctl %s: decoding %q: %v", strings.Join(args, " "), b, err)
		}
	}
	return nil
}

// metric reads one sample from blkd's /metrics: the unlabelled one, else
// the first labelled one (-1 if absent).
func (s *scenario) metric(api, name string) float64 {
	s.t.Helper()
	resp, err := http.Get("http://" + api + "/metrics")
	if err != nil {
		s.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(line, name+" ")
		if !ok && strings.HasPrefix(line, name+"{") {
			if i := strings.LastIndexByte(line, '}'); i > 0 {
				v, ok = line[i+1:], true
			}
		}
		if ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// attachInfo is what blkctl attach answers.
type attachInfo struct {
	Address      string `json:"address"`
	Port         int    `json:"port"`
	SubsystemNQN string `json:"subsystem_nqn"`
	NSID         int    `json:"nsid"`
	Transport    string `json:"transport"`
}

// ports hands out fixed loopback ports below the ephemeral range, one
// block per scenario, so that a port freed by one process is not taken by
// another before blkd binds it.
func ports(base int) func() int {
	next := base
	return func() int { next++; return next }
}

func addr(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }

func mustContain(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s: %q not found in:\n%s", what, w, got)
		}
	}
}

// clusterNode is one blkd of a cluster on the host, advertising the
// guests' address of the host (10.0.2.2).
type clusterNode struct {
	name              string
	api, raft         string
	nvmePort, tcpPort int
	zone              string
	d                 *daemon
}

// newClusterNode hands node name its four ports from port.
func newClusterNode(port func() int, name, zone string) *clusterNode {
	return &clusterNode{name: name, api: addr(port()), raft: addr(port()), nvmePort: port(), tcpPort: port(), zone: zone}
}

// start starts n's blkd, joining the cluster through the API join
// unless join is empty (the first node).
func (n *clusterNode) start(s *scenario, join string) {
	args := []string{"--node-id", n.name, "--raft-addr", n.raft, "--nvme-addr", addr(n.nvmePort), "--tcp-addr", addr(n.tcpPort),
		"--advertise-addr", "10.0.2.2", "--zone", n.zone}
	if join != "" {
		args = append(args, "--join", join)
	}
	n.d = s.startDaemon(n.name, n.api, args...)
}

// startCluster starts a 3-node cluster, node1 to node3 in zones z1 to
// z3, the others joining node1, and waits for its leader. It returns the
// nodes by name, their names in order, and the leader's name.
func (s *scenario) startCluster(port func() int) (nodes map[string]*clusterNode, order []string, leader string) {
	s.t.Helper()
	order = []string{"node1", "node2", "node3"}
	nodes = map[string]*clusterNode{}
	for i, id := range order {
		nodes[id] = newClusterNode(port, id, fmt.Sprintf("z%d", i+1))
	}
	for i, id := range order {
		join := ""
		if i > 0 {
			join = nodes["node1"].api
		}
		nodes[id].start(s, join)
	}
	return nodes, order, s.waitLeader(nodes["node1"].api, 30*time.Second, order...)
}
