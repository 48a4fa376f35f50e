package store

import (
	"errors"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// Tests of pebble's files failing under the store (the data area's faults
// are TestAreaFaults'), ported from target/volume's when it was retired.

var (
	walWrites = []errorfs.OpKind{errorfs.OpFileWrite, errorfs.OpFileWriteAt}
	walSyncs  = []errorfs.OpKind{errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo, errorfs.OpFileFlush}
)

// walFaultFS is a crashable in-memory filesystem whose WAL files fail the
// given operations once on is set.
func walFaultFS(kinds ...errorfs.OpKind) (*vfs.MemFS, vfs.FS, *atomic.Bool) {
	mem := vfs.NewCrashableMem()
	on := new(atomic.Bool)
	fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !on.Load() || !strings.HasSuffix(op.Path, ".log") {
			return nil
		}
		for _, k := range kinds {
			if op.Kind == k {
				return errorfs.ErrInjected
			}
		}
		return nil
	}))
	return mem, fs, on
}

// TestWALFault: once writes or syncs of pebble's WAL fail, a FUA write and
// a flush fail with ErrIO, the store reports itself failed and fails every
// later request, and after a crash (pebble's files and the area keeping
// only what was synced) and a reopen everything acknowledged as durable
// before the fault is there, whole, and Check passes.
func TestWALFault(t *testing.T) {
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
			mem, fs, on := walFaultFS(tc.kinds...)
			area := NewMemArea(64*(16<<10), 512, 512)
			cfg := memConfig(fs, area)
			s, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			v := mustCreate(t, s, 1, 64, BlockSize4K)
			blk := func(lba uint64) []byte {
				b := alignedBuf(4096, 4096)
				fillTagged(b, 1, lba, lba)
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
			on.Store(true)
			// Block 3 shares blocks 1 and 2's cluster: an overwrite, whose
			// durability needs the WAL synced after the area.
			if tc.fua {
				err = v.Write(3, blk(3), FUA)
			} else {
				// The plain write may be acknowledged (it only has to be
				// durable after a flush), the flush may not.
				_ = v.Write(3, blk(3), 0)
				err = v.Flush()
			}
			if !errors.Is(err, ErrIO) {
				t.Fatalf("under WAL fault: %v, want ErrIO", err)
			}
			if err := s.Health(); !errors.Is(err, ErrIO) {
				t.Fatalf("Health after a WAL fault = %v, want ErrIO", err)
			}
			buf := alignedBuf(4096, 4096)
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
			crashedFS := mem.CrashClone(vfs.CrashCloneCfg{})
			crashedArea := area.CrashClone(rand.New(rand.NewPCG(1, 2)), 0)
			_ = s.Close()

			cfg.FS, cfg.Area = crashedFS, crashedArea
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
			if err := s2.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestOpenUnreadableWAL: a store whose WAL cannot be read at Open fails to
// open with ErrIO; it does not panic and does not open without the WAL's
// data.
func TestOpenUnreadableWAL(t *testing.T) {
	mem := vfs.NewCrashableMem()
	area := NewMemArea(64*(16<<10), 512, 512)
	cfg := memConfig(mem, area)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, 1, 8, BlockSize4K)
	if err := v.Write(0, alignedBuf(4096, 4096), FUA); err != nil {
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
