//go:build linux

package store

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The benchmarks run each pattern on a store whose data area is a file in
// b.TempDir(), then the same pattern with pread/pwrite on a plain
// preallocated file in the same directory, opened with O_DIRECT (the
// store's own I/O mode: the ratio is the store's overhead over the disk)
// and buffered (the page cache: what target/volume's benchmarks compared
// against). Reported: ns/op and MB/s of the store, allocs/op, and
// x-direct and x-buffered, the baseline's time per op divided by the
// store's (1.0: as fast as the file; higher is better).
//
//	go test ./store -run '^$' -bench . -benchtime 20000x -count 3
//
// CI runs each once (-benchtime 1x): the volume is small (64 MiB) so the
// fill is quick.

const (
	benchBytes = 64 << 20
	benchBlock = 4096
)

type benchEnv struct {
	s              *Store
	v              *Volume
	direct, cached int // plain files
	buf            []byte
}

func openBench(b *testing.B) *benchEnv {
	b.Helper()
	dir := b.TempDir()
	s, err := Open(Config{Dir: filepath.Join(dir, "meta"), AreaPath: filepath.Join(dir, "area"),
		AreaBytes: benchBytes + 16<<20, Logger: quietLogger{}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	v, err := s.Create(1, CreateOptions{SizeBytes: benchBytes})
	if err != nil {
		b.Fatal(err)
	}
	e := &benchEnv{s: s, v: v, buf: alignedBuf(1<<20, 4096)}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range len(e.buf) / 8 {
		e.buf[i*8] = byte(rng.Uint32())
	}
	for off := uint64(0); off < benchBytes; off += 1 << 20 {
		if err := v.Write(off/benchBlock, e.buf, 0); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Flush(); err != nil {
		b.Fatal(err)
	}
	for i, flags := range []int{unix.O_DIRECT, 0} {
		fd, err := unix.Open(filepath.Join(dir, []string{"direct", "cached"}[i]), unix.O_RDWR|unix.O_CREAT|flags, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = unix.Close(fd) })
		if err := unix.Fallocate(fd, 0, 0, benchBytes); err != nil {
			b.Fatal(err)
		}
		for off := int64(0); off < benchBytes; off += 1 << 20 {
			if _, err := unix.Pwrite(fd, e.buf, off); err != nil {
				b.Fatal(err)
			}
		}
		if err := unix.Fdatasync(fd); err != nil {
			b.Fatal(err)
		}
		if i == 0 {
			e.direct = fd
		} else {
			e.cached = fd
		}
	}
	return e
}

// pattern is one benchmark: offs gives the i-th op's byte offset.
type pattern struct {
	size  int
	write bool
	offs  func(i int) uint64
}

func randOffs(size int) func(int) uint64 {
	return func(i int) uint64 {
		r := rand.New(rand.NewPCG(uint64(i), 3)) // seeded per op: same offsets for store and files
		return r.Uint64N(benchBytes/uint64(size)) * uint64(size)
	}
}

func seqOffs(size int) func(int) uint64 {
	return func(i int) uint64 { return uint64(i*size) % benchBytes }
}

func BenchmarkStore(b *testing.B) {
	for _, c := range []struct {
		name string
		p    pattern
	}{
		{"rand-read-4K", pattern{4096, false, randOffs(4096)}},
		{"rand-write-4K", pattern{4096, true, randOffs(4096)}},
		{"seq-write-128K", pattern{128 << 10, true, seqOffs(128 << 10)}},
	} {
		b.Run(c.name, func(b *testing.B) { runPattern(b, c.p) })
	}
}

func runPattern(b *testing.B, p pattern) {
	e := openBench(b)
	buf := e.buf[:p.size]
	offs := make([]uint64, b.N)
	for i := range offs {
		offs[i] = p.offs(i)
	}
	b.SetBytes(int64(p.size))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		var err error
		if p.write {
			err = e.v.Write(offs[i]/benchBlock, buf, 0)
		} else {
			err = e.v.Read(offs[i]/benchBlock, buf)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	store := time.Since(start)
	b.StopTimer()
	for _, f := range []struct {
		fd   int
		unit string
	}{{e.direct, "x-direct"}, {e.cached, "x-buffered"}} {
		start := time.Now()
		for i := range b.N {
			var err error
			if p.write {
				_, err = unix.Pwrite(f.fd, buf, int64(offs[i]))
			} else {
				_, err = unix.Pread(f.fd, buf, int64(offs[i]))
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(time.Since(start))/float64(store), f.unit)
	}
	if st := e.s.Stats(); st.BounceCopies != 0 {
		b.Fatalf("%d bounce copies: the benchmark's buffers are aligned", st.BounceCopies)
	}
}

// BenchmarkFirstWrite128K: sequential 128 KiB writes into clusters never
// written (allocation, map commit, a refill per 64 MiB); each time the
// volume is full it is deallocated and flushed, outside the timer.
func BenchmarkFirstWrite128K(b *testing.B) {
	dir := b.TempDir()
	s, err := Open(Config{Dir: filepath.Join(dir, "meta"), AreaPath: filepath.Join(dir, "area"),
		AreaBytes: benchBytes + 16<<20, Logger: quietLogger{}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	v, err := s.Create(1, CreateOptions{SizeBytes: benchBytes})
	if err != nil {
		b.Fatal(err)
	}
	buf := alignedBuf(128<<10, 4096)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		off := uint64(i*len(buf)) % benchBytes
		if off == 0 && i > 0 {
			b.StopTimer()
			if err := v.Deallocate(0, benchBytes/benchBlock); err != nil {
				b.Fatal(err)
			}
			if err := s.Flush(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if err := v.Write(off/benchBlock, buf, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(s.Stats().MapCommits)/float64(b.N), "map-commits/op")
	_ = os.Remove(filepath.Join(dir, "area"))
}
