package blkd

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockName is the file in the data directory that one blkd holds locked
// (flock) for as long as it runs; it contains that blkd's PID.
const lockName = "blkd.lock"

// lockDataDir takes the data directory's lock, or says which process
// holds it. The lock goes with the process, so a killed blkd never leaves
// a stale one.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: lock file: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		holder := "another process"
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b[:n]))); perr == nil {
			holder = fmt.Sprintf("another blkd (pid %d)", pid)
		}
		return nil, fmt.Errorf("data dir %s is in use by %s: stop it first, or give this one its own --data-dir", dir, holder)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
