package store

import (
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestSpaceGuard: with pebble's filesystem under the reserve, first writes
// fail with ErrNoSpace while overwrites, reads, write-zeroes and
// deallocates go on and the store stays healthy; above 1.25 × the reserve
// first writes resume. No reopen.
func TestSpaceGuard(t *testing.T) {
	fs := vfs.NewMem()
	const total, reserve = 10 << 30, 256 << 20
	setFree := func(free uint64) {
		fs.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: free, TotalBytes: total, UsedBytes: total - free})
	}
	setFree(total / 2)
	cfg := memConfig(fs, NewMemArea(64*(16<<10), 512, 512))
	cfg.ReserveBytes = reserve
	cfg.SpaceCheckInterval = time.Millisecond
	s := openStore(t, cfg)
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	b := alignedBuf(4096, 4096)
	if err := v.Write(0, b, 0); err != nil {
		t.Fatal(err)
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
	setFree(reserve - 1)
	waitFull(true)
	if err := v.Write(8, b, 0); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("first write under the reserve: %v, want ErrNoSpace", err)
	}
	if err := v.Write(1, b, FUA); err != nil {
		t.Fatalf("overwrite under the reserve: %v", err)
	}
	if err := v.Read(0, b); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteZeroes(0, 64, 0); err != nil {
		t.Fatal(err)
	}
	if err := v.Deallocate(0, 64); err != nil {
		t.Fatal(err)
	}
	setFree(reserve + reserve/8) // above the reserve, under the margin: still full
	time.Sleep(10 * time.Millisecond)
	if !s.Space().Full {
		t.Fatal("the guard let writes resume inside the margin")
	}
	setFree(reserve * 2)
	waitFull(false)
	if err := v.Write(8, b, 0); err != nil {
		t.Fatalf("first write after space returned: %v", err)
	}
	if err := s.Health(); err != nil {
		t.Fatal(err)
	}
	if st := s.Space(); !st.Monitored || st.ReserveBytes != reserve {
		t.Fatalf("%+v", st)
	}
}

// TestSpaceReserveDefault: the reserve is 2% of the filesystem, within
// [64 MiB, 1 GiB]; a filesystem that cannot say (a plain MemFS) is not
// monitored. (target/volume's test of its own default, ported when it was
// retired.)
func TestSpaceReserveDefault(t *testing.T) {
	for _, tc := range []struct{ total, want uint64 }{
		{1 << 30, minReserve}, {10 << 30, (10 << 30) / 50}, {1 << 40, maxReserve},
	} {
		fs := vfs.NewMem()
		fs.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: tc.total, TotalBytes: tc.total})
		s := openStore(t, memConfig(fs, NewMemArea(64*(16<<10), 512, 512)))
		if sp := s.Space(); !sp.Monitored || sp.ReserveBytes != tc.want {
			t.Errorf("disk of %d bytes: %+v, want monitored with a reserve of %d", tc.total, sp, tc.want)
		}
	}
	s := openStore(t, memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 512, 512)))
	if s.Space().Monitored {
		t.Error("a MemFS without disk usage is monitored")
	}
}
