package sdnotify

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listen opens a unixgram socket like systemd's notify socket.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func recv(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestNotifyPath(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	c := listen(t, sock)
	t.Setenv("NOTIFY_SOCKET", sock)
	if err := Notify(Ready, Status("serving 3 volumes")); err != nil {
		t.Fatal(err)
	}
	if got, want := recv(t, c), "READY=1\nSTATUS=serving 3 volumes"; got != want {
		t.Fatalf("datagram %q, want %q", got, want)
	}
	if err := Notify(Stopping); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, c); got != "STOPPING=1" {
		t.Fatalf("datagram %q, want STOPPING=1", got)
	}
}

func TestNotifyAbstract(t *testing.T) {
	name := fmt.Sprintf("blk-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	c := listen(t, "\x00"+name)
	if err := NotifySocket("@"+name, Reloading); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, c); got != "RELOADING=1" {
		t.Fatalf("datagram %q, want RELOADING=1", got)
	}
}

func TestNotifyUnset(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := Notify(Ready); err != nil {
		t.Fatalf("unset NOTIFY_SOCKET: %v, want nil", err)
	}
}

func TestNotifyBadSocket(t *testing.T) {
	if err := NotifySocket("relative/path", Ready); err == nil || !strings.Contains(err.Error(), "relative/path") {
		t.Fatalf("relative socket: %v, want an error naming it", err)
	}
	missing := filepath.Join(t.TempDir(), "absent")
	if err := NotifySocket(missing, Ready); err == nil {
		t.Fatal("absent socket: no error")
	}
}

func TestStatusOneLine(t *testing.T) {
	if got := Status("a\nb"); got != "STATUS=a b" {
		t.Fatalf("Status = %q", got)
	}
}
