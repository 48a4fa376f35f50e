package store

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestAreaGrows: a store whose area is full grows it (a MemArea and a
// real file), up to AreaMaxBytes, then answers ErrNoSpace; the growth
// survives a reopen and Check passes.
func TestAreaGrows(t *testing.T) {
	t.Run("mem", func(t *testing.T) {
		area := NewMemArea(8*(16<<10), 512, 512)
		cfg := memConfig(vfs.NewMem(), area)
		cfg.AreaMaxBytes = 40 * (16 << 10)
		s := openStore(t, cfg)
		growAndFill(t, s, 64, 39)
		_ = s.Close()
		s = openStore(t, cfg)
		if st := s.Stats(); st.Clusters != 40 {
			t.Fatalf("after reopen: %d clusters, want 40", st.Clusters)
		}
		if err := s.Check(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("file", func(t *testing.T) {
		dir := t.TempDir()
		cfg := Config{Dir: filepath.Join(dir, "meta"), AreaBytes: 4 << 16, AreaMaxBytes: 64 << 16, ClusterBytes: 64 << 10, ReadyClusters: 4, Logger: quietLogger{}}
		s := openStore(t, cfg)
		growAndFill(t, s, 80, 63)
		_ = s.Close()
		s = openStore(t, cfg)
		if st := s.Stats(); st.Clusters != 64 {
			t.Fatalf("after reopen: %d clusters, want 64", st.Clusters)
		}
	})
}

// growAndFill writes the first block of each of want+ clusters of a new
// volume: the first `fit` succeed, the next fails with ErrNoSpace.
func growAndFill(t *testing.T, s *Store, clusters, fit uint64) {
	t.Helper()
	C := s.Stats().ClusterBytes
	v := mustCreate(t, s, 1, clusters*C/4096, BlockSize4K)
	b := alignedBuf(4096, 4096)
	for c := range clusters {
		fillTagged(b, 1, c*C/4096, c+1)
		err := v.Write(c*C/4096, b, 0)
		if c < fit && err != nil {
			t.Fatalf("cluster %d: %v", c, err)
		}
		if c == fit {
			if !errors.Is(err, ErrNoSpace) {
				t.Fatalf("cluster %d past AreaMaxBytes: %v, want ErrNoSpace", c, err)
			}
			break
		}
	}
	for c := range fit {
		if err := v.Read(c*C/4096, b); err != nil {
			t.Fatal(err)
		}
		if got, err := readTag(b, 1, c*C/4096); err != nil || got != c+1 {
			t.Fatalf("cluster %d: tag %d (%v)", c, got, err)
		}
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}
