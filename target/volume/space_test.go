package volume

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestSpaceGuard: under the reserve, writes (single and grouped) fail
// with ErrNoSpace while reads, write-zeroes and deallocates go on and the
// store stays healthy; with space back above 1.25 × the reserve, writes
// resume. No reopen.
func TestSpaceGuard(t *testing.T) {
	fs := vfs.NewMem()
	const total, reserve = 10 << 30, 256 << 20
	fs.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: total / 2, TotalBytes: total, UsedBytes: total / 2})
	cfg := memConfig(fs)
	cfg.ReserveBytes = reserve
	cfg.SpaceCheckInterval = time.Millisecond
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 1024, BlockSize4K)
	data := bytes.Repeat([]byte{0xab}, BlockSize4K)
	if err := v.Write(0, data, 0); err != nil {
		t.Fatal(err)
	}
	setFree := func(free uint64) {
		fs.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: free, TotalBytes: total, UsedBytes: total - free})
	}
	waitFull := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for s.Space().Full != want {
			if time.Now().After(deadline) {
				t.Fatalf("space guard: Full %v, want %v (%+v)", s.Space().Full, want, s.Space())
			}
			time.Sleep(time.Millisecond)
		}
	}
	g := v.NewWriteGroup()
	if err := g.Add(2, data); err != nil {
		t.Fatal(err)
	}
	setFree(reserve - 1)
	waitFull(true)
	if err := v.Write(1, data, 0); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("write under the reserve: %v, want ErrNoSpace", err)
	}
	if err := g.Add(3, data); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("group add under the reserve: %v, want ErrNoSpace", err)
	}
	if err := g.Commit(); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("group commit under the reserve: %v, want ErrNoSpace", err)
	}
	got := make([]byte, BlockSize4K)
	if err := v.Read(0, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read under the reserve: %v, equal %v", err, bytes.Equal(got, data))
	}
	if err := v.Deallocate(5, 1); err != nil {
		t.Fatalf("deallocate under the reserve: %v", err)
	}
	if err := s.Health(); err != nil {
		t.Fatalf("store failed: %v", err)
	}
	// Just above the reserve is not enough (hysteresis).
	setFree(reserve + reserve/8)
	time.Sleep(20 * time.Millisecond)
	if !s.Space().Full {
		t.Fatal("writes resumed within the hysteresis margin")
	}
	setFree(2 * reserve)
	waitFull(false)
	if err := v.Write(1, data, 0); err != nil {
		t.Fatalf("write after space returned: %v", err)
	}
	if sp := s.Space(); !sp.Monitored || sp.ReserveBytes != reserve || sp.FreeBytes != 2*reserve {
		t.Fatalf("Space: %+v", sp)
	}
}

// TestSpaceReserveDefault: 5% of the filesystem, within [128 MiB, 4 GiB];
// a filesystem that cannot say (plain MemFS) is not monitored.
func TestSpaceReserveDefault(t *testing.T) {
	for _, tc := range []struct{ total, want uint64 }{
		{1 << 30, minReserve}, {100 << 30, 5 << 30 / 1}, {1 << 40, maxReserve},
	} {
		if tc.want > maxReserve {
			tc.want = maxReserve
		}
		fs := vfs.NewMem()
		fs.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: tc.total, TotalBytes: tc.total})
		s := openStore(t, memConfig(fs))
		if got := s.Space().ReserveBytes; got != tc.want {
			t.Errorf("disk of %d bytes: reserve %d, want %d", tc.total, got, tc.want)
		}
	}
	s := openStore(t, memConfig(vfs.NewMem()))
	if s.Space().Monitored {
		t.Error("a MemFS without disk usage is monitored")
	}
}
