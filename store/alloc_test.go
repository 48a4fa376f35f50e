//go:build linux

package store

import (
	"path/filepath"
	"testing"
)

// TestSteadyStateAllocs: reads, overwrites of allocated clusters (one
// cluster, across clusters, through a bounce buffer) and a flush with
// nothing to sync allocate nothing, on the O_DIRECT file area.
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	dir := t.TempDir()
	s := openStore(t, Config{Dir: filepath.Join(dir, "meta"), AreaBytes: 8 << 20, Logger: quietLogger{}})
	v := mustCreate(t, s, 1, 1024, BlockSize4K)
	buf := alignedBuf(256<<10+4096, 4096)
	if err := v.Write(0, buf[:256<<10], 0); err != nil { // allocate clusters 0-3
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	unaligned := buf[512 : 512+4096]
	for _, c := range []struct {
		name string
		fn   func() error
	}{
		{"read 4K", func() error { return v.Read(3, buf[:4096]) }},
		{"read 128K across clusters", func() error { return v.Read(8, buf[:128<<10]) }},
		{"read a hole", func() error { return v.Read(500, buf[:4096]) }},
		{"overwrite 4K", func() error { return v.Write(5, buf[:4096], 0) }},
		{"overwrite 128K across clusters", func() error { return v.Write(8, buf[:128<<10], 0) }},
		{"overwrite, unaligned buffer", func() error { return v.Write(5, unaligned, 0) }},
		{"read, unaligned buffer", func() error { return v.Read(5, unaligned) }},
		{"flush, nothing written", func() error { return s.Flush() }},
	} {
		_ = c.fn() // warm the bounce pool
		var err error
		if n := testing.AllocsPerRun(100, func() { err = c.fn() }); n != 0 {
			t.Errorf("%s: %.1f allocations per op, want 0", c.name, n)
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}
