//go:build linux

package volume

import (
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkLSMDepth is how a volume's cost grows with the data in its
// LSM: a volume of each size named in BLK_BENCH_DEEP is filled whole
// (sequential 128 KiB writes of seeded random data, flushed, then the
// compactions the fill started are waited out), and then measured with
// 4 KiB random reads and then 4 KiB random writes over all of it. It is
// run by hand only — it writes gigabytes; without BLK_BENCH_DEEP it skips:
//
//	BLK_BENCH_DEEP=1GiB go test ./target/volume -run '^$' -bench LSMDepth
//	BLK_BENCH_DEEP=16GiB,64GiB BLK_BENCH_DEEP_DIR=/mnt/big go test ...
//
// The store is the package's defaults (64 MiB memtables, 256 MiB block
// cache) in BLK_BENCH_DEEP_DIR or the test's temporary directory; the
// free space there must hold 2.5 times the data. A 256 MiB volume (the
// other benchmarks' size) is measured first in the same run, as the
// baseline of x-256MiB. Reads may come from the operating system's page
// cache when the data fits in memory (1 GiB and 16 GiB on a machine of
// 24 GiB): the figures then say what the LSM's depth costs in CPU, not
// in disk reads.
//
// Reported per pattern, besides ns/op, MB/s, allocs/op:
//
//	IOPS, mean-us, p99-us  of the 4 KiB operations
//	x-256MiB               IOPS ÷ the 256 MiB volume's IOPS in this run
//	space-x                the store's disk usage (pebble's count of its
//	                       files) ÷ the data written into the volume (the
//	                       fill, and every write of this benchmark so far,
//	                       overwrites included), after the pattern
//	space-live-x           the same ÷ the volume's data (its size: every
//	                       block is written), what issue 13 aims at ≤ 1.3
//	settled-live-x         (writes) the same once the compactions the writes
//	                       started are done (settle)
//	du-x                   the same from the filesystem's allocated blocks
//	lsm-levels             pebble levels holding tables; l0-sublevels
//	copies/op, w-amp       as the other volume benchmarks (report)
//
// After each pattern the data is checked: a seeded sample of blocks read
// must hold what the fill wrote there; every block among the last writes
// must hold its last write.
func BenchmarkLSMDepth(b *testing.B) {
	env := os.Getenv(deepEnv)
	if env == "" {
		b.Skipf("run by hand: %s=1GiB (or 16GiB, 64GiB, comma-separated) writes that much into a volume", deepEnv)
	}
	var sizes []uint64
	for _, f := range strings.Split(env, ",") {
		n, err := parseBytes(strings.TrimSpace(f))
		if err != nil {
			b.Fatalf("%s=%q: %v", deepEnv, env, err)
		}
		sizes = append(sizes, n)
	}
	dir := os.Getenv(deepDirEnv)
	if dir == "" {
		dir = b.TempDir()
	}
	var total uint64
	for _, n := range sizes {
		total += n
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		b.Fatal(err)
	}
	// One volume at a time is on disk (each is removed when measured).
	need := slices.Max(sizes) * 5 / 2
	if free := st.Bavail * uint64(st.Bsize); free < need {
		b.Fatalf("%s has %d MiB free; the largest volume needs %d MiB (2.5x its data)", dir, free>>20, need>>20)
	}
	seed := uint64(1)
	if s := os.Getenv("BLK_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			b.Fatalf("BLK_SEED=%q: %v", s, err)
		}
		seed = v
	}
	b.Logf("seed %d (BLK_SEED=%d replays it); %d MiB in %s", seed, seed, total>>20, dir)
	base := map[string]float64{}
	for _, size := range append([]uint64{deepBaseline}, sizes...) {
		b.Run("depth="+formatBytes(size), func(b *testing.B) {
			d := openDeep(b, dir, size, seed)
			b.Run("randread-4k", func(b *testing.B) { d.randRead(b, base) })
			b.Run("randwrite-4k", func(b *testing.B) { d.randWrite(b, base) })
		})
	}
}

const (
	deepEnv    = "BLK_BENCH_DEEP"
	deepDirEnv = "BLK_BENCH_DEEP_DIR"
	// deepBaseline is the volume every run measures first: the size of
	// the other volume benchmarks.
	deepBaseline = benchVolumeBytes
	// deepFillIO is the fill's write size.
	deepFillIO = 128 << 10
	// deepCheck is the blocks checked after each pattern.
	deepCheck = 1024
	// deepWriteBufs is the distinct 4 KiB buffers the random writes cycle
	// through, so the check can tell which write a block holds.
	deepWriteBufs = 64
	// deepSettle bounds the wait for the fill's compactions, deepQuiet
	// is how long pebble must be idle to count as settled.
	deepSettle = 10 * time.Minute
	deepQuiet  = 2 * time.Second
)

type deepVolume struct {
	size    uint64
	seed    uint64
	dir     string
	s       *Store
	v       *Volume
	written uint64 // bytes written into the volume so far
}

// openDeep creates a store with one volume of size bytes in a directory
// of its own under dir, fills it and waits out its compactions. The
// store and its files go when b ends.
func openDeep(b *testing.B, dir string, size, seed uint64) *deepVolume {
	sub, err := os.MkdirTemp(dir, "lsm-depth-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(sub) })
	s, err := Open(Config{Dir: sub, Logger: quietLogger{}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	v, err := s.Create(1, CreateOptions{SizeBytes: size})
	if err != nil {
		b.Fatal(err)
	}
	d := &deepVolume{size: size, seed: seed, dir: sub, s: s, v: v}
	start := time.Now()
	buf := make([]byte, deepFillIO)
	for off := uint64(0); off < size; off += deepFillIO {
		for i := 0; i < deepFillIO; i += benchBlock {
			d.fillBlock(buf[i:i+benchBlock], (off+uint64(i))/benchBlock)
		}
		if err := v.Write(off/benchBlock, buf, 0); err != nil {
			b.Fatalf("fill at %d: %v", off, err)
		}
	}
	if err := v.Flush(); err != nil {
		b.Fatal(err)
	}
	d.written = size
	fill := time.Since(start)
	settled := d.settle(b)
	e := s.Engine()
	b.Logf("%s: filled in %v (%.0f MB/s), compactions settled in %v; disk %d MiB (%.2fx), L0 %d sublevels, debt %d MiB",
		formatBytes(size), fill.Round(time.Millisecond), float64(size)/fill.Seconds()/1e6, settled.Round(time.Millisecond),
		e.DiskBytes>>20, float64(e.DiskBytes)/float64(size), e.L0Sublevels, e.CompactionDebtBytes>>20)
	return d
}

// fillBlock is the fill's data of block lba: seeded random, different in
// every block, so that a misplaced block is caught.
func (d *deepVolume) fillBlock(p []byte, lba uint64) {
	fillRandom(rand.New(rand.NewPCG(d.seed, lba)), p)
}

// settle waits until pebble has been quiet for deepQuiet (no flush or
// compaction running, none completed), or deepSettle has passed, and
// returns how long it took. Pebble's compaction debt estimate is not
// waited for: it can stay above zero with nothing left to schedule.
func (d *deepVolume) settle(b *testing.B) time.Duration {
	start := time.Now()
	quietSince := start
	var lastCount int64 = -1
	for time.Since(start) < deepSettle {
		m := d.s.db.Metrics()
		busy := m.Compact.NumInProgress > 0 || m.Flush.NumInProgress > 0
		if count := m.Compact.Count + m.Flush.Count; busy || count != lastCount {
			lastCount, quietSince = count, time.Now()
		} else if time.Since(quietSince) >= deepQuiet {
			return time.Since(start) - deepQuiet
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Logf("compactions still running after %v", deepSettle)
	return time.Since(start)
}

func (d *deepVolume) randRead(b *testing.B, base map[string]float64) {
	blocks := d.size / benchBlock
	rng := rand.New(rand.NewPCG(d.seed, 1))
	lbas := make([]uint64, b.N)
	for i := range lbas {
		lbas[i] = rng.Uint64N(blocks)
	}
	lat := make([]int64, b.N)
	buf := make([]byte, benchBlock)
	before := readCounters(b, volumeTarget{d.s, d.v})
	b.SetBytes(benchBlock)
	b.ReportAllocs()
	b.ResetTimer()
	for i, lba := range lbas {
		t0 := time.Now()
		if err := d.v.Read(lba, buf); err != nil {
			b.Fatal(err)
		}
		lat[i] = int64(time.Since(t0))
	}
	b.StopTimer()
	d.report(b, base, "randread-4k", lat, before, false)
	// The check: a seeded sample of blocks holds the fill's data.
	want := make([]byte, benchBlock)
	for range deepCheck {
		lba := rng.Uint64N(blocks)
		if err := d.v.Read(lba, buf); err != nil {
			b.Fatal(err)
		}
		d.fillBlock(want, lba)
		if !slices.Equal(buf, want) {
			b.Fatalf("block %d does not hold the fill's data", lba)
		}
	}
}

func (d *deepVolume) randWrite(b *testing.B, base map[string]float64) {
	blocks := d.size / benchBlock
	rng := rand.New(rand.NewPCG(d.seed, 2))
	lbas := make([]uint64, b.N)
	for i := range lbas {
		lbas[i] = rng.Uint64N(blocks)
	}
	bufs := make([]byte, deepWriteBufs*benchBlock)
	fillRandom(rand.New(rand.NewPCG(d.seed, 3)), bufs)
	wbuf := func(i int) []byte { j := i % deepWriteBufs; return bufs[j*benchBlock : (j+1)*benchBlock] }
	lat := make([]int64, b.N)
	before := readCounters(b, volumeTarget{d.s, d.v})
	b.SetBytes(benchBlock)
	b.ReportAllocs()
	b.ResetTimer()
	for i, lba := range lbas {
		t0 := time.Now()
		if err := d.v.Write(lba, wbuf(i), 0); err != nil {
			b.Fatal(err)
		}
		lat[i] = int64(time.Since(t0))
	}
	b.StopTimer()
	d.written += uint64(b.N) * benchBlock
	d.report(b, base, "randwrite-4k", lat, before, true)
	// The check: each block among the last deepCheck writes holds the
	// last write to it.
	last := make(map[uint64]int)
	for i, lba := range lbas {
		last[lba] = i
	}
	got := make([]byte, benchBlock)
	for i := max(len(lbas)-deepCheck, 0); i < len(lbas); i++ {
		lba := lbas[i]
		if err := d.v.Read(lba, got); err != nil {
			b.Fatal(err)
		}
		if !slices.Equal(got, wbuf(last[lba])) {
			b.Fatalf("block %d does not hold its last write (write %d of %d)", lba, last[lba], len(lbas))
		}
	}
	// The space once the compactions the writes started are done: the
	// garbage the overwrites left that pebble keeps.
	d.settle(b)
	b.ReportMetric(float64(d.s.db.Metrics().DiskSpaceUsage())/float64(d.size), "settled-live-x")
}

// report reports a pattern's metrics; base collects the baseline's IOPS.
func (d *deepVolume) report(b *testing.B, base map[string]float64, pattern string, lat []int64, before volumeCounters, write bool) {
	iops := float64(b.N) / b.Elapsed().Seconds()
	var sum int64
	for _, v := range lat {
		sum += v
	}
	slices.Sort(lat)
	p99 := lat[(len(lat)*99+99)/100-1]
	b.ReportMetric(iops, "IOPS")
	b.ReportMetric(float64(sum)/float64(len(lat))/1e3, "mean-us")
	b.ReportMetric(float64(p99)/1e3, "p99-us")
	if d.size == deepBaseline {
		base[pattern] = iops
	}
	if one, ok := base[pattern]; ok {
		b.ReportMetric(iops/one, "x-256MiB")
	}
	report(b, volumeTarget{d.s, d.v}, before, uint64(b.N)*benchBlock, write)
	m := d.s.db.Metrics()
	b.ReportMetric(float64(m.DiskSpaceUsage())/float64(d.written), "space-x")
	b.ReportMetric(float64(m.DiskSpaceUsage())/float64(d.size), "space-live-x")
	b.ReportMetric(float64(dirUsage(b, d.dir))/float64(d.written), "du-x")
	levels := 0
	for _, l := range m.Levels {
		if l.TablesCount > 0 {
			levels++
		}
	}
	b.ReportMetric(float64(levels), "lsm-levels")
	b.ReportMetric(float64(m.Levels[0].Sublevels), "l0-sublevels")
}

// dirUsage is the bytes the filesystem allocated to the files under dir.
func dirUsage(b *testing.B, dir string) uint64 {
	var n uint64
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			var st unix.Stat_t
			if err := unix.Stat(path, &st); err == nil {
				n += uint64(st.Blocks) * 512
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// parseBytes reads "1GiB", "512MiB" or a number of bytes.
func parseBytes(s string) (uint64, error) {
	mul := uint64(1)
	for _, u := range []struct {
		suffix string
		mul    uint64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mul = v, u.mul
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a size such as 1GiB, 512MiB or 4096", s)
	}
	if v := n * mul; v%deepFillIO == 0 && v/mul == n {
		return v, nil
	}
	return 0, fmt.Errorf("%q is not a multiple of %d bytes", s, deepFillIO)
}

func formatBytes(n uint64) string {
	switch {
	case n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return strconv.FormatUint(n, 10)
}
