// Package testport hands out loopback addresses for tests that start
// servers in other processes, which must be told a port before they bind.
//
// Asking the kernel for a free port (listening on 127.0.0.1:0 and closing)
// returns a port of the ephemeral range, which the kernel goes on handing
// out — as the source port of any outgoing connection, or to the next
// process asking for port 0 — until the child process binds it; with test
// packages running in parallel that race was lost now and then ("address
// already in use"). This package picks ports below the ephemeral range
// (Linux's default starts at 32768), which the kernel never hands out by
// itself, starting at a point derived from the process ID so that test
// processes running at once use different ports, and checks each is free
// before handing it out. Each port handed out is also claimed with a lock
// file (flock, held until the process exits) that other test processes
// respect, so two processes whose walks overlap never hand out the same
// port while a child has yet to bind it (seen in CI once the cmd/blkd and
// cmd/blkctl suites grew).
package testport

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

const (
	lowest  = 20000
	highest = 32000 // below the default ephemeral range (32768-60999)
)

var (
	mu     sync.Mutex
	next   = lowest + (os.Getpid()*331)%(highest-lowest)
	claims []*os.File // lock files held for the process's lifetime
)

// claim takes port's lock file; false if another process holds it.
func claim(port int) bool {
	dir := filepath.Join(os.TempDir(), "blk-testport")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true // no locks possible: fall back to the free check alone
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	claims = append(claims, f)
	return true
}

// Addr returns "127.0.0.1:PORT" for a port that was free when checked and
// is not handed out again by this process.
func Addr(tb testing.TB) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	for range highest - lowest {
		p := next
		next++
		if next >= highest {
			next = lowest
		}
		addr := fmt.Sprintf("127.0.0.1:%d", p)
		if !claim(p) {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ln.Close()
		return addr
	}
	tb.Fatal("testport: no free loopback port below the ephemeral range")
	return ""
}
