package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// notifySocket is a unixgram socket standing in for systemd's
// $NOTIFY_SOCKET; next returns the datagrams as they come.
type notifySocket struct {
	path string
	conn *net.UnixConn
	seen []string
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	// A short directory: a socket path must fit in sun_path (108 bytes).
	dir, err := os.MkdirTemp("", "blkd-notify-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &notifySocket{path: path, conn: conn}
}

// waitFor reads datagrams until one holds the assignment want (a line
// of it), failing the test after within.
func (n *notifySocket) waitFor(t *testing.T, d *daemon, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	buf := make([]byte, 4096)
	for {
		_ = n.conn.SetReadDeadline(deadline)
		k, err := n.conn.Read(buf)
		if err != nil {
			t.Fatalf("no %s datagram (%v); got %q\n%s", want, err, n.seen, d.output())
		}
		msg := string(buf[:k])
		n.seen = append(n.seen, msg)
		for l := range strings.SplitSeq(msg, "\n") {
			if l == want {
				return
			}
		}
	}
}

// TestSystemdNotifyAndReload: under a notify socket blkd says READY=1
// once it serves; SIGHUP reloads the log level from --config (debug
// lines appear for reads), wrapped in RELOADING=1 … READY=1, and does
// not stop it, nor does a SIGHUP with a broken config; SIGTERM says
// STOPPING=1 and exits 0.
func TestSystemdNotifyAndReload(t *testing.T) {
	sock := newNotifySocket(t)
	api := freeAddr(t)
	cfgFile := filepath.Join(t.TempDir(), "blkd.json")
	writeCfg := func(extra string) {
		cfg := fmt.Sprintf(`{"data_dir": %q, "raft_addr": %q, "nvme_addr": %q, "tcp_addr": %q, "api_addr": %q%s}`,
			filepath.Join(filepath.Dir(cfgFile), "data"), freeAddr(t), freeAddr(t), freeAddr(t), api, extra)
		if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(`, "log_level": "info"`)
	d := &daemon{api: api, exited: make(chan struct{})}
	d.cmd = exec.Command(binary, "--config", cfgFile)
	d.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock.path)
	d.cmd.Stdout, d.cmd.Stderr = lockedWriter{d}, lockedWriter{d}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.exited
		if t.Failed() {
			t.Logf("blkd output:\n%s", d.output())
		}
	})
	sock.waitFor(t, d, "READY=1", 60*time.Second)
	if !strings.Contains(strings.Join(sock.seen, "\n"), "STATUS=") {
		t.Fatalf("no STATUS before READY=1: %q", sock.seen)
	}

	d.must(t, "GET", "/v1/volumes", "", 200, nil)
	if strings.Contains(d.output(), "api request") {
		t.Fatalf("debug line at log_level info:\n%s", d.output())
	}

	// The addresses in the file changed too (freeAddr again): they need
	// a restart and are named, not applied.
	writeCfg(`, "log_level": "debug"`)
	sock.seen = nil
	d.cmd.Process.Signal(syscall.SIGHUP)
	sock.waitFor(t, d, "RELOADING=1", 10*time.Second)
	sock.waitFor(t, d, "READY=1", 10*time.Second)
	d.must(t, "GET", "/v1/volumes", "", 200, nil)
	// The debug line is written once the answer is sent: wait for it.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(d.output(), "api request") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	out := d.output()
	if !strings.Contains(out, "reload: log level changed") || !strings.Contains(out, "api request") {
		t.Fatalf("after SIGHUP with log_level debug:\n%s", out)
	}
	if !strings.Contains(out, "reload: needs a restart") || !strings.Contains(out, "field=raft_addr") {
		t.Fatalf("changed raft_addr not named:\n%s", out)
	}

	// A broken file: refused, nothing changes, blkd serves on.
	if err := os.WriteFile(cfgFile, []byte(`{"log_level": "loud"`), 0o644); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Signal(syscall.SIGHUP)
	sock.waitFor(t, d, "RELOADING=1", 10*time.Second)
	sock.waitFor(t, d, "READY=1", 10*time.Second)
	// blkd logs the refusal before READY=1, but its stderr reaches
	// d.output() through a pipe the test copies: wait for the line.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(d.output(), "reload refused, nothing changed") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(d.output(), "reload refused, nothing changed") {
		t.Fatalf("broken config not reported:\n%s", d.output())
	}
	d.must(t, "GET", "/v1/volumes", "", 200, nil)

	d.cmd.Process.Signal(syscall.SIGTERM)
	sock.waitFor(t, d, "STOPPING=1", 30*time.Second)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("blkd did not exit within 30 s of SIGTERM:\n%s", d.output())
	}
	if d.err != nil || !strings.Contains(d.output(), "stopped") {
		t.Fatalf("exit after SIGTERM: %v\n%s", d.err, d.output())
	}
}
