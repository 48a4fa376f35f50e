package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestFileArea: a store on a real directory with its area file opened
// O_DIRECT: data written reads back across a reopen, thin clusters read
// zeros, the area file is preallocated, and a store refuses an area that
// is another store's.
func TestFileArea(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: filepath.Join(dir, "meta"), AreaBytes: 8 << 20, Logger: quietLogger{}}
	s := openStore(t, cfg)
	v := mustCreate(t, s, 7, 1024, BlockSize4K)
	data := alignedBuf(3*4096, 4096)
	for i := range data {
		data[i] = byte(i*31 + 1)
	}
	if err := v.Write(15, data, FUA); err != nil { // crosses a 64 KiB cluster boundary
		t.Fatal(err)
	}
	if st := v.Stats(); st.AllocatedBytes != 2*DefaultClusterBytes {
		t.Fatalf("allocated %d bytes, want two clusters", st.AllocatedBytes)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, cfg)
	v, err := s.Volume(7)
	if err != nil {
		t.Fatal(err)
	}
	got := alignedBuf(5*4096, 4096)
	if err := v.Read(14, got); err != nil {
		t.Fatal(err)
	}
	if !isZero(got[:4096]) || !bytes.Equal(got[4096:4*4096], data) || !isZero(got[4*4096:]) {
		t.Fatal("read back differs from what was written (or holes are not zero)")
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	st, err := filepath.Glob(filepath.Join(dir, "meta.area"))
	if err != nil || len(st) != 1 {
		t.Fatalf("area file: %v %v", st, err)
	}
	_ = s.Close()

	// Another store's area under this store's metadata.
	other := Config{Dir: filepath.Join(dir, "other"), AreaBytes: 8 << 20, Logger: quietLogger{}}
	o := openStore(t, other)
	_ = o.Close()
	swapped := cfg
	swapped.AreaPath = other.Dir + ".area"
	if _, err := Open(swapped); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with another store's area: %v, want ErrCorrupt", err)
	}
	// The area file missing.
	missing := cfg
	missing.AreaPath = filepath.Join(dir, "nothing")
	if _, err := Open(missing); !errors.Is(err, ErrIO) {
		t.Fatalf("open with no area file: %v, want ErrIO", err)
	}
	// Another cluster size than the store's.
	cs := cfg
	cs.ClusterBytes = 128 << 10
	if _, err := Open(cs); !errors.Is(err, ErrInvalid) {
		t.Fatalf("open with another cluster size: %v, want ErrInvalid", err)
	}
}

// TestRefusesForeignDirectory: a pebble directory holding keys of no
// layout this release knows (another version of target/volume's format
// key, keys without a format key) is refused as corrupt and left as it
// was. (target/volume's own layout is upgraded: upgrade_test.go.)
func TestRefusesForeignDirectory(t *testing.T) {
	for _, c := range []struct {
		key, val string
		want     error
	}{
		{"f", "blk-volume/9", ErrCorrupt},
		{"Q", "x", ErrCorrupt},
		{"x", "y", ErrCorrupt},
	} {
		fs := vfs.NewMem()
		db, err := pebble.Open("/store", &pebble.Options{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Set([]byte(c.key), []byte(c.val), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		_ = db.Close()
		if _, err = Open(memConfig(fs, NewMemArea(1<<20, 512, 512))); !errors.Is(err, c.want) {
			t.Errorf("Open on a directory holding %q: %v, want %v", c.key, err, c.want)
		}
		db, err = pebble.Open("/store", &pebble.Options{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		v, closer, err := db.Get([]byte(c.key))
		if err != nil || string(v) != c.val {
			t.Errorf("the directory was changed: %q %v", v, err)
		} else {
			_ = closer.Close()
		}
		if _, _, err := db.Get(formatKey); !errors.Is(err, pebble.ErrNotFound) {
			t.Errorf("a format key was written: %v", err)
		}
		_ = db.Close()
	}
}

// TestBlockSizeBelowAlignment: a 512-byte volume on an area that needs
// 4096-byte direct I/O is refused at Create, not failed at every write.
func TestBlockSizeBelowAlignment(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 4096, 4096)))
	if _, err := s.Create(1, CreateOptions{SizeBytes: 1 << 20, BlockSize: BlockSize512}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("512-byte volume on a 4096-aligned area: %v, want ErrInvalid", err)
	}
	mustCreate(t, s, 1, 256, BlockSize4K)
}

// TestErrors: every bad request gets its sentinel, and nothing panics.
func TestErrors(t *testing.T) {
	fs := vfs.NewMem()
	s := openStore(t, memConfig(fs, NewMemArea(64*(16<<10), 512, 512)))
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	b := alignedBuf(128<<10, 4096)
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"read past the end", v.Read(64, b[:4096]), ErrOutOfRange},
		{"write across the end", v.Write(63, b[:8192], 0), ErrOutOfRange},
		{"overflowing LBA", v.Read(^uint64(0), b[:4096]), ErrOutOfRange},
		{"zeroes past the end", v.WriteZeroes(60, 5, 0), ErrOutOfRange},
		{"deallocate overflowing", v.Deallocate(^uint64(0)-1, 4), ErrOutOfRange},
		{"misaligned length", v.Write(0, b[:100], 0), ErrMisaligned},
		{"too large", v.Read(0, b[:128<<10]), ErrTooLarge},
		{"create existing", func() error { _, err := s.Create(1, CreateOptions{SizeBytes: 4096}); return err }(), ErrExists},
		{"bad block size", func() error { _, err := s.Create(2, CreateOptions{SizeBytes: 4096, BlockSize: 1024}); return err }(), ErrInvalid},
		{"zero size", func() error { _, err := s.Create(2, CreateOptions{SizeBytes: 0}); return err }(), ErrInvalid},
		{"too big", func() error { _, err := s.Create(2, CreateOptions{SizeBytes: MaxSizeBytes * 2}); return err }(), ErrInvalid},
		{"missing", func() error { _, err := s.Volume(9); return err }(), ErrNotFound},
		{"delete missing", s.Delete(9), ErrNotFound},
		{"bad state", s.SetState(1, 9), ErrInvalid},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if err := v.Read(0, b[:0]); err != nil {
		t.Errorf("zero-length read: %v", err)
	}
	// Shrink over data without force; then read-only.
	if err := v.Write(40, b[:4096], 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Resize(1, 20*4096, false); !errors.Is(err, ErrWouldLoseData) {
		t.Errorf("shrink over data: %v", err)
	}
	if err := s.SetState(1, StateReadOnly); err != nil {
		t.Fatal(err)
	}
	if err := v.Write(0, b[:4096], 0); !errors.Is(err, ErrReadOnly) {
		t.Errorf("write to a read-only volume: %v", err)
	}
	if err := v.Read(40, b[:4096]); err != nil {
		t.Errorf("read of a read-only volume: %v", err)
	}
	// Fill the area: ErrNoSpace for new clusters, overwrites still work.
	if err := s.SetState(1, StateOnline); err != nil {
		t.Fatal(err)
	}
	big := mustCreate(t, s, 3, 256*4, BlockSize4K) // 256 clusters of 16 KiB; the area has 63
	var noSpace error
	for c := uint64(0); c < 256 && noSpace == nil; c++ {
		noSpace = big.Write(c*4, b[:4096], 0)
	}
	if !errors.Is(noSpace, ErrNoSpace) {
		t.Fatalf("writes past the area's capacity: %v, want ErrNoSpace", noSpace)
	}
	if err := big.Write(0, b[:4096], FUA); err != nil {
		t.Errorf("overwrite of an allocated cluster on a full area: %v", err)
	}
	if err := big.Deallocate(0, 256*4); err != nil {
		t.Fatal(err)
	}
	if err := big.Write(0, b[:4096], 0); err != nil {
		t.Errorf("write after freeing space: %v", err)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if err := v.Read(0, b[:4096]); !errors.Is(err, ErrClosed) {
		t.Errorf("read after close: %v", err)
	}
	if err := s.Flush(); !errors.Is(err, ErrClosed) {
		t.Errorf("flush after close: %v", err)
	}
}

// TestAreaFaults: a failed area write fails the request with ErrIO and
// leaks nothing; a failed area sync fails the flush and the store.
func TestAreaFaults(t *testing.T) {
	area := NewMemArea(64*(16<<10), 512, 512)
	s := openStore(t, memConfig(vfs.NewMem(), area))
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	b := alignedBuf(4096, 4096)
	boom := errors.New("boom")
	area.Fault = func(op string, _ int64) error {
		if op == "write" {
			return boom
		}
		return nil
	}
	if err := v.Write(0, b, 0); !errors.Is(err, ErrIO) || !errors.Is(err, boom) {
		t.Fatalf("write with a failing area: %v", err)
	}
	area.Fault = nil
	if err := s.Check(); err != nil {
		t.Fatalf("after a failed first write: %v", err)
	}
	if err := v.Write(0, b, 0); err != nil {
		t.Fatal(err)
	}
	area.Fault = func(op string, _ int64) error {
		if op == "sync" {
			return boom
		}
		return nil
	}
	if err := v.Flush(); !errors.Is(err, ErrIO) {
		t.Fatalf("flush with a failing sync: %v", err)
	}
	area.Fault = nil
	if err := v.Read(0, b); !errors.Is(err, ErrIO) || s.Health() == nil {
		t.Fatalf("a store whose area sync failed must stay failed: read %v, health %v", err, s.Health())
	}
}

func TestConfig(t *testing.T) {
	c := Config{Dir: "/d"}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	back.FS = c.FS
	if !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip: %+v, want %+v", back, c)
	}
	for _, bad := range []Config{
		{},
		{Dir: "/d", ClusterBytes: 3 << 10},
		{Dir: "/d", ClusterBytes: 8 << 20},
		{Dir: "/d", AreaBytes: 64 << 10},
		{Dir: "/d", ReadyClusters: -1},
		{Dir: "/d", ReadyClusters: 8, ReadyLowClusters: 9},
		{Dir: "/d", MaxTransferBytes: 1000},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", bad, err)
		}
	}
}
