//go:build linux

package peercred

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A table as Linux prints it (one socket per state of interest).
const sample = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1B9E 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 101 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:1B9E 01 00000000:00000000 00:00000000 00000000  1000        0 102 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:D432 0100007F:1B9E 06 00000000:00000000 03:00000F9E 00000000     0        0 0 3 0000000000000000
`

func TestParse(t *testing.T) {
	for _, c := range []struct {
		local, remote string
		uid           uint32
		err           error
	}{
		{"0100007F:D431", "0100007F:1B9E", 1000, nil},
		{"0100007F:D432", "0100007F:1B9E", 0, ErrNotFound}, // TIME_WAIT: never read as root
		{"0100007F:D433", "0100007F:1B9E", 0, ErrNotFound},
		{"0100007F:1B9E", "0100007F:D431", 0, ErrNotFound}, // the server's side is not listed here
	} {
		uid, err := parse(strings.NewReader(sample), c.local, c.remote)
		if uid != c.uid || !errors.Is(err, c.err) {
			t.Errorf("%s -> %s: uid %d, %v; want %d, %v", c.local, c.remote, uid, err, c.uid, c.err)
		}
	}
}

func TestAddrFormat(t *testing.T) {
	if got := addr4(net.IPv4(127, 0, 0, 1).To4(), 7070); got != "0100007F:1B9E" {
		t.Errorf("addr4 = %s", got)
	}
	if got := addr6(net.IPv6loopback, 80); got != "00000000000000000000000001000000:0050" {
		t.Errorf("addr6 = %s", got)
	}
}

// serve accepts one connection on a loopback listener and reports the
// peer's uid.
func serve(t *testing.T, network, addr string) (string, <-chan string) {
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("%s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	out := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			out <- err.Error()
			return
		}
		defer c.Close()
		uid, err := UID(c)
		if err != nil {
			out <- err.Error()
			return
		}
		out <- strconv.FormatUint(uint64(uid), 10)
	}()
	return ln.Addr().String(), out
}

func TestUIDOfSelf(t *testing.T) {
	for _, c := range []struct{ network, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}} {
		addr, out := serve(t, c.network, c.addr)
		conn, err := net.Dial(c.network, addr)
		if err != nil {
			t.Fatal(err)
		}
		got := <-out
		conn.Close()
		if want := strconv.Itoa(os.Getuid()); got != want {
			t.Errorf("%s: peer uid %s, want %s", c.network, got, want)
		}
	}
}

// TestUIDOfAnotherUser connects as uid 65534 (root only): the server
// must see that uid, not its own.
func TestUIDOfAnotherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to connect as another user")
	}
	addr, out := serve(t, "tcp4", "127.0.0.1:0")
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("bash", "-c", "exec 3<>/dev/tcp/"+host+"/"+port+"; read -t 5 <&3 || true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Skipf("bash as uid 65534: %v", err)
	}
	got := <-out
	_ = cmd.Wait()
	if got != "65534" {
		t.Errorf("peer uid %s, want 65534", got)
	}
}
