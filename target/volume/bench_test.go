//go:build linux

package volume

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The benchmarks run each I/O pattern twice: "volume", through a Store on
// the operating system's filesystem, and "file", the same pattern with
// pread/pwrite (and fdatasync where the volume flushes) on one plain
// preallocated file in the same directory: the floor that any block store
// on this filesystem is measured against. Both run from memory: the file
// from the page cache, the volume from pebble's block cache and memtable.
//
// Reproduce (docs/volume.md records the figures):
//
//	go test ./target/volume -run '^$' -bench . -benchtime 2s -count 3
//
// Reported: ns/op, MB/s, allocs/op and B/op (which count pebble's
// background flushes and compactions too), and for the volume: copies/op,
// the bytes this package copied per byte requested (1 for Read and Write:
// the one copy between the caller's buffer and pebble), and for writes
// w-amp, the bytes pebble wrote (WAL, flushes, compactions) per byte
// requested.

const (
	benchVolumeBytes = 256 << 20
	// benchCacheBytes holds the whole volume in pebble's block cache, as
	// the page cache holds the whole file: both baselines read from memory.
	benchCacheBytes = 1 << 30
	benchBlock      = 4096
)

type benchTarget interface {
	read(off int64, buf []byte) error
	write(off int64, buf []byte) error
	flush() error
	close() error
}

type volumeTarget struct {
	s *Store
	v *Volume
}

func (t volumeTarget) read(off int64, buf []byte) error {
	return t.v.Read(uint64(off)/benchBlock, buf)
}
func (t volumeTarget) write(off int64, buf []byte) error {
	return t.v.Write(uint64(off)/benchBlock, buf, 0)
}
func (t volumeTarget) flush() error { return t.v.Flush() }
func (t volumeTarget) close() error { return t.s.Close() }

type fileTarget struct{ f *os.File }

func (t fileTarget) read(off int64, buf []byte) error {
	_, err := unix.Pread(int(t.f.Fd()), buf, off)
	return err
}
func (t fileTarget) write(off int64, buf []byte) error {
	_, err := unix.Pwrite(int(t.f.Fd()), buf, off)
	return err
}
func (t fileTarget) flush() error { return unix.Fdatasync(int(t.f.Fd())) }
func (t fileTarget) close() error { return t.f.Close() }

// openBench returns a target of benchVolumeBytes; filled, it has every
// block written once (and, for the volume, flushed into sstables) so that
// reads find data rather than holes.
func openBench(b testing.TB, kind string, filled bool) benchTarget {
	b.Helper()
	dir := b.TempDir()
	var t benchTarget
	switch kind {
	case "volume":
		s, err := Open(Config{Dir: filepath.Join(dir, "store"), Logger: quietLogger{}, CacheBytes: benchCacheBytes})
		if err != nil {
			b.Fatal(err)
		}
		v, err := s.Create(1, CreateOptions{SizeBytes: benchVolumeBytes})
		if err != nil {
			b.Fatal(err)
		}
		t = volumeTarget{s, v}
	case "file":
		f, err := os.OpenFile(filepath.Join(dir, "file"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		if err := unix.Fallocate(int(f.Fd()), 0, 0, benchVolumeBytes); err != nil {
			b.Fatal(err)
		}
		t = fileTarget{f}
	}
	b.Cleanup(func() { _ = t.close() })
	if filled {
		buf := make([]byte, 128<<10)
		rng := rand.New(rand.NewPCG(1, 2))
		for off := int64(0); off < benchVolumeBytes; off += int64(len(buf)) {
			fillRandom(rng, buf)
			if err := t.write(off, buf); err != nil {
				b.Fatal(err)
			}
		}
		if err := t.flush(); err != nil {
			b.Fatal(err)
		}
		if vt, ok := t.(volumeTarget); ok {
			// Settle the LSM (memtable flushed, one compaction to the
			// bottom) so that no background compaction replaces the
			// sstables, and so the cached blocks, during the measurement.
			if err := vt.s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
				b.Fatal(err)
			}
			warm := make([]byte, 128<<10) // load the block cache
			for off := int64(0); off < benchVolumeBytes; off += int64(len(warm)) {
				if err := t.read(off, warm); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	return t
}

func fillRandom(rng *rand.Rand, buf []byte) {
	for i := 0; i+8 <= len(buf); i += 8 {
		u := rng.Uint64()
		for j := range 8 {
			buf[i+j] = byte(u >> (8 * j))
		}
	}
}

// offsets returns n random block-aligned offsets for ioSize-byte I/Os.
func offsets(n, ioSize int) []int64 {
	rng := rand.New(rand.NewPCG(3, 4))
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(rng.IntN(benchVolumeBytes/ioSize)) * int64(ioSize)
	}
	return out
}

func benchBoth(b *testing.B, fn func(b *testing.B, kind string)) {
	for _, kind := range []string{"volume", "file"} {
		b.Run(kind, func(b *testing.B) { fn(b, kind) })
	}
}

func BenchmarkRandRead4K(b *testing.B) {
	benchBoth(b, func(b *testing.B, kind string) {
		t := openBench(b, kind, true)
		offs := offsets(1<<16, benchBlock)
		buf := make([]byte, benchBlock)
		before := readCounters(b, t)
		b.SetBytes(benchBlock)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := t.read(offs[i&(len(offs)-1)], buf); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		report(b, t, before, uint64(b.N)*benchBlock, false)
	})
}

// volumeCounters are what the volume benchmarks report per op, read
// before and after the measured loop.
type volumeCounters struct{ copied, pebbleWritten uint64 }

func readCounters(b *testing.B, t benchTarget) volumeCounters {
	vt, ok := t.(volumeTarget)
	if !ok {
		return volumeCounters{}
	}
	st, err := vt.v.Stats()
	if err != nil {
		b.Fatal(err)
	}
	m := vt.s.db.Metrics()
	w := m.WAL.BytesWritten
	for _, l := range m.Levels {
		w += l.TableBytesFlushed + l.TableBytesCompacted + l.BlobBytesFlushed + l.BlobBytesCompacted
	}
	return volumeCounters{st.CopiedBytes, w}
}

// report adds copies/op (bytes this package copied per byte requested)
// and, for writes, w-amp (bytes pebble wrote to its WAL and sstables per
// byte requested; compactions still pending when the loop ends are not
// counted, so short runs understate it).
func report(b *testing.B, t benchTarget, before volumeCounters, requested uint64, write bool) {
	if _, ok := t.(volumeTarget); !ok || requested == 0 {
		return
	}
	after := readCounters(b, t)
	b.ReportMetric(float64(after.copied-before.copied)/float64(requested), "copies/op")
	if write {
		b.ReportMetric(float64(after.pebbleWritten-before.pebbleWritten)/float64(requested), "w-amp")
	}
}

func BenchmarkRandWrite4K(b *testing.B) {
	benchBoth(b, func(b *testing.B, kind string) {
		t := openBench(b, kind, false)
		offs := offsets(1<<16, benchBlock)
		buf := make([]byte, benchBlock)
		fillRandom(rand.New(rand.NewPCG(5, 6)), buf)
		before := readCounters(b, t)
		b.SetBytes(benchBlock)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := t.write(offs[i&(len(offs)-1)], buf); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		report(b, t, before, uint64(b.N)*benchBlock, true)
	})
}

func BenchmarkSeqWrite128K(b *testing.B) {
	benchBoth(b, func(b *testing.B, kind string) {
		t := openBench(b, kind, false)
		const io = 128 << 10
		buf := make([]byte, io)
		fillRandom(rand.New(rand.NewPCG(7, 8)), buf)
		before := readCounters(b, t)
		b.SetBytes(io)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			off := int64(i) * io % benchVolumeBytes
			if err := t.write(off, buf); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		report(b, t, before, uint64(b.N)*io, true)
	})
}

func BenchmarkSeqRead128K(b *testing.B) {
	benchBoth(b, func(b *testing.B, kind string) {
		t := openBench(b, kind, true)
		const io = 128 << 10
		buf := make([]byte, io)
		before := readCounters(b, t)
		b.SetBytes(io)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			off := int64(i) * io % benchVolumeBytes
			if err := t.read(off, buf); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		report(b, t, before, uint64(b.N)*io, false)
	})
}

// BenchmarkWriteFlush32 is random 4 KiB writes with a flush (WAL sync;
// fdatasync for the file) after every 32nd: an op is one write, so the
// flush cost is spread over 32 ops.
func BenchmarkWriteFlush32(b *testing.B) {
	benchBoth(b, func(b *testing.B, kind string) {
		t := openBench(b, kind, false)
		offs := offsets(1<<16, benchBlock)
		buf := make([]byte, benchBlock)
		fillRandom(rand.New(rand.NewPCG(9, 10)), buf)
		before := readCounters(b, t)
		b.SetBytes(benchBlock)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := t.write(offs[i&(len(offs)-1)], buf); err != nil {
				b.Fatal(err)
			}
			if i%32 == 31 {
				if err := t.flush(); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.StopTimer()
		report(b, t, before, uint64(b.N)*benchBlock, true)
	})
}
