package volume

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// faultFS wraps a crashable in-memory filesystem with an error injector
// that, while on, fails the chosen operations on files whose names end
// with suffix (".log": the WAL; ".sst": sstables).
type faultFS struct {
	mem    *vfs.MemFS
	fs     *errorfs.FS
	on     atomic.Bool
	hits   atomic.Int64
	suffix string
	kinds  []errorfs.OpKind
}

func newFaultFS(suffix string, kinds ...errorfs.OpKind) *faultFS {
	f := &faultFS{mem: vfs.NewCrashableMem(), suffix: suffix, kinds: kinds}
	f.fs = errorfs.Wrap(f.mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !f.on.Load() || !matchSuffix(op.Path, f.suffix) {
			return nil
		}
		for _, k := range f.kinds {
			if op.Kind == k {
				f.hits.Add(1)
				return errorfs.ErrInjected
			}
		}
		return nil
	}))
	return f
}

// matchSuffix reports whether path ends with one of the |-separated
// suffixes.
func matchSuffix(path, suffixes string) bool {
	for _, s := range strings.Split(suffixes, "|") {
		if strings.HasSuffix(path, s) {
			return true
		}
	}
	return false
}

var walWrites = []errorfs.OpKind{errorfs.OpFileWrite, errorfs.OpFileWriteAt}
var walSyncs = []errorfs.OpKind{errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo, errorfs.OpFileFlush}

// within fails the test if fn does not return in time: a failing disk
// must make the store fail, not hang.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not return within 20s", what)
	}
}

// TestFaultWAL: once writes or syncs of the WAL fail, a FUA write and a
// flush fail with ErrIO, the store reports itself failed and fails every
// later request, and after a crash and reopen everything acknowledged as
// durable before the fault is there, whole.
func TestFaultWAL(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kinds []errorfs.OpKind
		fua   bool // the first request under fault: a FUA write, else plain write + flush
	}{
		{"write/fua", walWrites, true},
		{"write/flush", walWrites, false},
		{"sync/fua", walSyncs, true},
		{"sync/flush", walSyncs, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFaultFS(".log", tc.kinds...)
			cfg := memConfig(f.fs)
			s, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			v := mustCreate(t, s, 1, 64, BlockSize4K)
			blk := func(tag uint64) []byte {
				b := make([]byte, 4096)
				fillTagged(b, 1, tag, tag)
				return b
			}
			if err := v.Write(1, blk(1), FUA); err != nil {
				t.Fatal(err)
			}
			if err := v.Write(2, blk(2), 0); err != nil {
				t.Fatal(err)
			}
			if err := v.Flush(); err != nil {
				t.Fatal(err)
			}
			f.on.Store(true)
			within(t, "the first request under fault", func() {
				if tc.fua {
					err = v.Write(3, blk(3), FUA)
				} else {
					// The plain write may be acknowledged (it only has to
					// be durable after a flush), the flush may not.
					_ = v.Write(3, blk(3), 0)
					err = v.Flush()
				}
			})
			if !errors.Is(err, ErrIO) {
				t.Fatalf("under WAL fault: %v, want ErrIO (%d faults injected)", err, f.hits.Load())
			}
			if err := s.Health(); !errors.Is(err, ErrIO) {
				t.Fatalf("Health after a WAL fault = %v, want ErrIO", err)
			}
			buf := make([]byte, 4096)
			for name, fn := range map[string]func() error{
				"write":  func() error { return v.Write(4, blk(4), 0) },
				"read":   func() error { return v.Read(1, buf) },
				"flush":  func() error { return v.Flush() },
				"zeroes": func() error { return v.WriteZeroes(1, 1, FUA) },
				"create": func() error { _, err := s.Create(2, CreateOptions{SizeBytes: 4096}); return err },
			} {
				if err := fn(); !errors.Is(err, ErrIO) {
					t.Errorf("%s on a failed store = %v, want ErrIO", name, err)
				}
			}
			crashed := f.mem.CrashClone(vfs.CrashCloneCfg{})
			within(t, "Close of a failed store", func() { _ = s.Close() })

			cfg.FS = crashed
			s2 := openStore(t, cfg)
			v2, err := s2.Volume(1)
			if err != nil {
				t.Fatal(err)
			}
			for lba := uint64(0); lba < 64; lba++ {
				if err := v2.Read(lba, buf); err != nil {
					t.Fatal(err)
				}
				tag, err := readTag(buf, 1, lba)
				if err != nil {
					t.Fatalf("block %d after the fault: %v", lba, err)
				}
				switch {
				case lba == 1 || lba == 2:
					if tag != lba {
						t.Fatalf("block %d, durable before the fault, lost (tag %d)", lba, tag)
					}
				case lba == 3:
					// Not acknowledged as durable: either way, but whole.
				case tag != 0:
					t.Fatalf("block %d: unexpected tag %d", lba, tag)
				}
			}
		})
	}
}

// TestFaultSSTableWrite: when memtable flushes and compactions cannot
// write sstables, pebble retries them in the background; writes and WAL
// syncs still succeed, because the data is in the WAL. The store counts
// the background errors, loses nothing across a crash, and carries on
// once the disk recovers.
func TestFaultSSTableWrite(t *testing.T) {
	f := newFaultFS(".sst", errorfs.OpCreate, errorfs.OpFileWrite, errorfs.OpFileSync, errorfs.OpFileSyncData)
	cfg := memConfig(f.fs)
	cfg.MemTableBytes = 256 << 10
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	const blocks = 48
	v := mustCreate(t, s, 1, blocks, BlockSize4K)
	f.on.Store(true)
	buf := make([]byte, 16*4096)
	// A pass writes 48 blocks of 4 KiB, 3/4 of a memtable. Pebble stalls
	// writes once 4 memtables wait for a flush, so under the fault write
	// two passes: a full memtable that cannot be flushed, and more.
	write := func(pass uint64) {
		for lba := uint64(0); lba < blocks; lba += 16 {
			for i := range uint64(16) {
				fillTagged(buf[i*4096:(i+1)*4096], 1, lba+i, pass)
			}
			if err := v.Write(lba, buf, 0); err != nil {
				t.Fatalf("write under sstable faults: %v", err)
			}
		}
	}
	write(1)
	write(2)
	if err := v.Flush(); err != nil {
		t.Fatalf("flush under sstable faults: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.BackgroundErrors() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.BackgroundErrors() == 0 {
		t.Fatalf("no background error reported (%d faults injected)", f.hits.Load())
	}
	if err := s.Health(); err != nil {
		t.Fatalf("Health under sstable write faults = %v, want nil (nothing lost)", err)
	}
	// Crash now: everything flushed is in the WAL.
	crashed := f.mem.CrashClone(vfs.CrashCloneCfg{})
	f.on.Store(false)
	write(3)
	check := func(v *Volume, want uint64) {
		t.Helper()
		for lba := uint64(0); lba < blocks; lba += 16 {
			if err := v.Read(lba, buf); err != nil {
				t.Fatal(err)
			}
			for i := range uint64(16) {
				tag, err := readTag(buf[i*4096:(i+1)*4096], 1, lba+i)
				if err != nil || tag != want {
					t.Fatalf("block %d: tag %d, %v; want %d", lba+i, tag, err, want)
				}
			}
		}
	}
	check(v, 3)
	cfg2 := cfg
	cfg2.FS = crashed
	s2 := openStore(t, cfg2)
	v2, err := s2.Volume(1)
	if err != nil {
		t.Fatal(err)
	}
	check(v2, 2)
}

// TestFaultSSTableRead: a read that pebble cannot serve because a table
// read fails (an sstable, or the blob file holding the block data) returns
// ErrIO: never zeros, never stale data.
func TestFaultSSTableRead(t *testing.T) {
	f := newFaultFS(".sst|.blob", errorfs.OpFileReadAt, errorfs.OpFileRead)
	cfg := memConfig(f.fs)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 64, BlockSize4K)
	data := pattern(64*4096/4, 3)
	for lba := uint64(0); lba < 64; lba += 16 {
		if err := v.Write(lba, data, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Flush(); err != nil { // into an sstable
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopen (an empty block cache) and wait for pebble's background
	// table-stats reads, then fail every sstable read.
	s = openStore(t, cfg)
	v, _ = s.Volume(1)
	time.Sleep(50 * time.Millisecond)
	f.on.Store(true)
	one := make([]byte, 4096)
	if err := v.Read(5, one); !errors.Is(err, ErrIO) {
		t.Fatalf("single-block read under sstable read faults = %v, want ErrIO", err)
	}
	many := make([]byte, 16*4096)
	if err := v.Read(16, many); !errors.Is(err, ErrIO) {
		t.Fatalf("multi-block read under sstable read faults = %v, want ErrIO", err)
	}
	f.on.Store(false)
	if err := v.Read(16, many); err != nil || !bytes.Equal(many, data) {
		t.Fatalf("read after the fault cleared: %v", err)
	}
}

// TestFaultOpen: a store whose WAL cannot be read on open fails to open
// with ErrIO; it does not panic and does not open without the WAL's data.
func TestFaultOpen(t *testing.T) {
	mem := vfs.NewCrashableMem()
	cfg := memConfig(mem)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 8, BlockSize4K)
	if err := v.Write(0, pattern(4096, 1), FUA); err != nil {
		t.Fatal(err)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = s.Close()
	cfg.FS = errorfs.Wrap(crashed, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".log") && (op.Kind == errorfs.OpFileRead || op.Kind == errorfs.OpFileReadAt) {
			return errorfs.ErrInjected
		}
		return nil
	}))
	if s, err := Open(cfg); !errors.Is(err, ErrIO) {
		if s != nil {
			_ = s.Close()
		}
		t.Fatalf("Open with an unreadable WAL = %v, want ErrIO", err)
	}
}
