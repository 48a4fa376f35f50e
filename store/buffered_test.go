package store

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFileAreaWithoutODirect: on a filesystem that refuses O_DIRECT
// (EINVAL: tmpfs before Linux 6.6, where the e2e guests keep blkd's data
// dir, which Linux creates before it refuses O_DIRECT) the store opens, says so in its log, and keeps its promises
// through the page cache: data of both block sizes reads back, also after
// a reopen, and Check agrees. Before, Open failed and blkd would not
// start.
func TestFileAreaWithoutODirect(t *testing.T) {
	real := openDirect
	t.Cleanup(func() { openDirect = real })
	// As Linux does on tmpfs before 6.6: the file is created, then
	// O_DIRECT refused.
	openDirect = func(path string, flags int, mode uint32) (int, error) {
		if flags&unix.O_CREAT != 0 {
			fd, err := unix.Open(path, flags, mode)
			if err != nil {
				return -1, err
			}
			unix.Close(fd)
		}
		return -1, unix.EINVAL
	}

	dir := t.TempDir()
	log := &recordLogger{}
	cfg := Config{Dir: filepath.Join(dir, "meta"), AreaBytes: 8 << 20, Logger: log}
	s := openStore(t, cfg)
	if d := s.area.(*fileArea); d.Direct() || d.Align() != 512 {
		t.Fatalf("area direct=%v align=%d, want buffered with 512-byte alignment", d.Direct(), d.Align())
	}
	if !strings.Contains(strings.Join(log.lines, "\n"), "does not support O_DIRECT") {
		t.Fatalf("no word of buffered I/O in the log:\n%s", strings.Join(log.lines, "\n"))
	}
	small := mustCreate(t, s, 1, 256, BlockSize512)
	big := mustCreate(t, s, 2, 64, BlockSize4K)
	a := bytes.Repeat([]byte{0xa5}, 3*512)
	b := bytes.Repeat([]byte{0x5a}, 2*4096)
	if err := small.Write(7, a, FUA); err != nil {
		t.Fatal(err)
	}
	if err := big.Write(15, b, 0); err != nil { // crosses a cluster boundary
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, cfg)
	for _, c := range []struct {
		id   ID
		lba  uint64
		want []byte
	}{{1, 7, a}, {2, 15, b}} {
		v, err := s.Volume(c.id)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(c.want))
		if err := v.Read(c.lba, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, c.want) {
			t.Fatalf("volume %d: read back differs from what was written", c.id)
		}
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}
