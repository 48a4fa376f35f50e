package store

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// The upgrade fixture, testdata/volume-v1, is a pebble directory written
// by target/volume (the layout "blk-volume/1", issue 21's release) from
// fixtureOps, committed (testdata/README.md says how it was made); the
// tests replay the same operations on a model to know what every block
// must read after the upgrade.
const fixtureDir = "testdata/volume-v1"

type fixtureOp struct {
	Kind  string // create, write, zero, delete, resize, readonly
	ID    ID
	A, B  uint64 // create: blocks, block size; write/zero: lba, n; resize: blocks
	Force bool
}

var fixtureOps = []fixtureOp{
	{Kind: "create", ID: 1, A: 64, B: 4096},
	{Kind: "write", ID: 1, A: 0, B: 16}, // a whole 64 KiB cluster
	{Kind: "write", ID: 1, A: 17, B: 1},
	{Kind: "write", ID: 1, A: 40, B: 3},
	{Kind: "write", ID: 1, A: 63, B: 1}, // the last block
	{Kind: "zero", ID: 1, A: 41, B: 1},
	{Kind: "create", ID: 2, A: 2048, B: 512},
	{Kind: "write", ID: 2, A: 0, B: 8},
	{Kind: "write", ID: 2, A: 1000, B: 40},
	{Kind: "write", ID: 2, A: 2047, B: 1},
	{Kind: "create", ID: 3, A: 16, B: 4096}, // deleted: must not come back
	{Kind: "write", ID: 3, A: 0, B: 4},
	{Kind: "delete", ID: 3},
	{Kind: "create", ID: 4, A: 8, B: 4096},
	{Kind: "write", ID: 4, A: 5, B: 1},
	{Kind: "readonly", ID: 4},
	{Kind: "create", ID: 5, A: 32, B: 4096},
	{Kind: "write", ID: 5, A: 0, B: 32},
	{Kind: "resize", ID: 5, A: 10, Force: true}, // blocks 10-31 dropped...
	{Kind: "resize", ID: 5, A: 40},              // ...and read zeros after growing back
}

// fixtureModel replays fixtureOps: each volume's info and block tags (a
// block's tag is the index of the op that wrote it, plus one).
func fixtureModel() (map[ID]Info, map[ID][]uint64) {
	infos, tags := map[ID]Info{}, map[ID][]uint64{}
	for k, o := range fixtureOps {
		switch o.Kind {
		case "create":
			infos[o.ID] = Info{ID: o.ID, SizeBytes: o.A * o.B, BlockSize: uint32(o.B), State: StateOnline}
			tags[o.ID] = make([]uint64, o.A)
		case "write":
			for i := o.A; i < o.A+o.B; i++ {
				tags[o.ID][i] = uint64(k + 1)
			}
		case "zero":
			clear(tags[o.ID][o.A : o.A+o.B])
		case "delete":
			delete(infos, o.ID)
			delete(tags, o.ID)
		case "resize":
			in := infos[o.ID]
			old := uint64(len(tags[o.ID]))
			in.SizeBytes = o.A * uint64(in.BlockSize)
			infos[o.ID] = in
			if o.A < old {
				tags[o.ID] = tags[o.ID][:o.A]
			} else {
				tags[o.ID] = append(tags[o.ID], make([]uint64, o.A-old)...)
			}
		case "readonly":
			in := infos[o.ID]
			in.State = StateReadOnly
			infos[o.ID] = in
		}
	}
	return infos, tags
}

// copyFixture copies the fixture into fs at dir (a fresh copy per test:
// pebble replays and rewrites its directory).
func copyFixture(t *testing.T, fs vfs.FS, dir string) {
	t.Helper()
	entries, err := os.ReadDir(fixtureDir)
	if err != nil {
		t.Fatalf("the upgrade fixture: %v", err)
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		src, err := os.Open(filepath.Join(fixtureDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		dst, err := fs.Create(fs.PathJoin(dir, e.Name()), vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(dst, src); err != nil {
			t.Fatal(err)
		}
		_ = src.Close()
		if err := dst.Sync(); err != nil {
			t.Fatal(err)
		}
		_ = dst.Close()
	}
	d, err := fs.OpenDir(dir)
	if err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}

// verifyUpgraded checks that s holds exactly the fixture's volumes and
// blocks, that no key of the old layout is left, and Check.
func verifyUpgraded(s *Store) error {
	infos, tags := fixtureModel()
	got, err := s.List()
	if err != nil {
		return err
	}
	want := make([]Info, 0, len(infos))
	for _, in := range infos {
		want = append(want, in)
	}
	slices.SortFunc(want, func(a, b Info) int { return int(a.ID) - int(b.ID) })
	if !slices.Equal(got, want) {
		return fmt.Errorf("volumes after the upgrade: %+v, want %+v", got, want)
	}
	for id, tg := range tags {
		v, err := s.Volume(id)
		if err != nil {
			return err
		}
		bs := uint64(infos[id].BlockSize)
		buf := alignedBuf(int(bs), 4096)
		for lba := range uint64(len(tg)) {
			if err := v.Read(lba, buf); err != nil {
				return err
			}
			if g, err := readTag(buf, id, lba); err != nil || g != tg[lba] {
				return fmt.Errorf("volume %d block %d after the upgrade: tag %d (%v), want %d", id, lba, g, err, tg[lba])
			}
		}
	}
	left := 0
	if err := s.scan('a', func([]byte, []byte) error { left++; return nil }); err != nil {
		return err
	}
	for c := byte('b'); c <= 'z'; c++ {
		if err := s.scan(c, func([]byte, []byte) error { left++; return nil }); err != nil {
			return err
		}
	}
	if left != 0 {
		return fmt.Errorf("%d keys of target/volume's layout left after the upgrade", left)
	}
	return s.Check()
}

// TestUpgradeFixture: a data dir written by target/volume opens with the
// store, on a real directory with an O_DIRECT area file: every volume
// (sizes, block sizes, read-only state; not the deleted one) and every
// block comes back, nothing of the old layout is left, and it opens again
// without migrating.
func TestUpgradeFixture(t *testing.T) {
	dir := t.TempDir()
	meta := filepath.Join(dir, "volumes")
	copyFixture(t, vfs.Default, meta)
	var log recordLogger
	cfg := Config{Dir: meta, AreaBytes: 16 << 20, Logger: &log}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyUpgraded(s); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(log.lines, func(l string) bool { return len(l) > 0 && contains(l, "upgrade of") }) {
		t.Errorf("no progress in the log: %q", log.lines)
	}
	_ = s.Close()
	log.lines = nil
	s = openStore(t, cfg)
	if err := verifyUpgraded(s); err != nil {
		t.Fatalf("second open: %v", err)
	}
	if slices.ContainsFunc(log.lines, func(l string) bool { return contains(l, "upgrad") }) {
		t.Errorf("the second open upgraded again: %q", log.lines)
	}
}

// TestUpgradeReadOnlyAndFull: an old directory opened read-only is
// refused (nothing can be migrated); one whose data cannot fit under
// AreaMaxBytes is refused with ErrNoSpace before anything is written; an
// area file smaller than the data is created large enough.
func TestUpgradeReadOnlyAndFull(t *testing.T) {
	dir := t.TempDir()
	meta := filepath.Join(dir, "volumes")
	copyFixture(t, vfs.Default, meta)
	if _, err := Open(Config{Dir: meta, ReadOnly: true, Logger: quietLogger{}}); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("read-only open of an old directory: %v, want ErrReadOnly", err)
	}
	_, err := Open(Config{Dir: meta, AreaBytes: 4 << 16, AreaMaxBytes: 4 << 16, Logger: quietLogger{}})
	if !errors.Is(err, ErrNoSpace) || !contains(err.Error(), "AreaMaxBytes") {
		t.Fatalf("upgrade into at most 4 clusters: %v, want ErrNoSpace naming AreaMaxBytes", err)
	}
	if _, serr := os.Stat(meta + ".area"); !errors.Is(serr, os.ErrNotExist) {
		t.Fatalf("the refused upgrade created its area: %v", serr)
	}
	s := openStore(t, Config{Dir: meta, AreaBytes: 4 << 16, Logger: quietLogger{}})
	if err := verifyUpgraded(s); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Clusters <= 4 {
		t.Fatalf("the area was not sized for the old data: %+v", st)
	}
}

// TestUpgradeCrash: the upgrade crashes at the k-th time it reaches a
// step (a refill's reservations, a batch committed), keeping a random part
// of what was not synced; the next Open finishes it and every block of the
// old layout is there.
func TestUpgradeCrash(t *testing.T) {
	seed := testSeed(t)
	defer func(b int) { migrateClusters = b }(migrateClusters)
	migrateClusters = 2
	crashed := 0
	for it := range iterations(t, 30, 3, 3) {
		s0 := seed + uint64(it)
		rng := rand.New(rand.NewPCG(s0, 9))
		fs := vfs.NewCrashableMem()
		copyFixture(t, fs, "/store")
		area := NewMemArea(256*(16<<10), 512, 512)
		cfg := memConfig(fs, area)
		point := []hookPoint{hookReserved, hookMigrated}[rng.IntN(2)]
		k, seen := 1+rng.IntN(8), 0
		keep := rng.IntN(101)
		var fsClone vfs.FS
		var areaClone *MemArea
		openHook = func(s *Store) {
			s.testHook = func(p hookPoint) {
				if p == point && fsClone == nil {
					if seen++; seen == k {
						fsClone = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: keep, RNG: rand.New(rand.NewPCG(s0, 1))})
						areaClone = area.CrashClone(rand.New(rand.NewPCG(s0, 2)), keep)
					}
				}
			}
		}
		s, err := Open(cfg)
		openHook = nil
		if err != nil {
			t.Fatalf("iteration %d: first open: %v", it, err)
		}
		if fsClone == nil { // the upgrade finished before the k-th step
			fsClone, areaClone = fs.CrashClone(vfs.CrashCloneCfg{}), area.CrashClone(rng, 0)
		} else {
			crashed++
		}
		_ = s.Close()
		cfg.FS, cfg.Area = fsClone, areaClone
		s2, err := Open(cfg)
		if err != nil {
			t.Fatalf("iteration %d (crash at %v #%d, kept %d%%): reopen: %v\nreplay with BLK_SEED=%d BLK_ITERS=1", it, point, k, keep, err, s0)
		}
		err = verifyUpgraded(s2)
		if err == nil {
			err = drain(s2)
		}
		_ = s2.Close()
		if err != nil {
			t.Fatalf("iteration %d (crash at %v #%d, kept %d%%): %v\nreplay with BLK_SEED=%d BLK_ITERS=1", it, point, k, keep, err, s0)
		}
	}
	if crashed == 0 {
		t.Fatal("no iteration crashed during the upgrade")
	}
	t.Logf("%d iterations crashed during the upgrade", crashed)
}

type recordLogger struct{ lines []string }

func (l *recordLogger) Infof(format string, args ...any) {
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}
func (l *recordLogger) Errorf(format string, args ...any) {
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
