//go:build linux

package store

import (
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// The snapshot benchmarks (docs/snapshots.md §7.5), each with its baseline
// in the same run, on a store whose data area is a file in b.TempDir()
// (64 KiB clusters, O_DIRECT where the filesystem has it):
//
//	go test ./store -run '^$' -bench 'Snapshot|Clone' -benchtime 20x
//
// BenchmarkWriteAfterSnapshot wants -benchtime 16384x (one write per
// cluster of its 1 GiB volume on average) for the "first" rate the
// design speaks of.

// openSnapBench opens a store on a file area of size bytes plus slack,
// and creates volume 1 of size bytes; fill writes every cluster of it
// (1 MiB writes), sparse only the first cluster of every leaf of the
// in-memory map (512 clusters, 32 MiB: every page of a written volume's
// table exists, without 16 GiB of data).
func openSnapBench(b *testing.B, size uint64, fill, sparse bool) (*Store, *Volume) {
	b.Helper()
	dir := b.TempDir()
	area := int64(16 << 20)
	switch {
	case fill:
		area += int64(size)
	case sparse:
		area += int64(size/(leafLen<<16)) << 16
	}
	s, err := Open(Config{Dir: filepath.Join(dir, "meta"), AreaPath: filepath.Join(dir, "area"),
		AreaBytes: area, Logger: quietLogger{}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	v, err := s.Create(1, CreateOptions{SizeBytes: size})
	if err != nil {
		b.Fatal(err)
	}
	buf := alignedBuf(1<<20, 4096)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range len(buf) / 8 {
		buf[i*8] = byte(rng.Uint32())
	}
	switch {
	case fill:
		for off := uint64(0); off < size; off += 1 << 20 {
			if err := v.Write(off/benchBlock, buf, 0); err != nil {
				b.Fatal(err)
			}
		}
	case sparse:
		for off := uint64(0); off < size; off += leafLen << 16 {
			if err := v.Write(off/benchBlock, buf[:benchBlock], 0); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := s.Flush(); err != nil {
		b.Fatal(err)
	}
	return s, v
}

// BenchmarkSnapshotCreate: one Store.Snapshot of a volume that has written
// one block since the last (so its flush has work, as under a host's
// writes), against the same volume's Flush alone after one block written
// (x-flush: the snapshot's time over the flush's). Also a Clone of the
// first snapshot.
func BenchmarkSnapshotCreate(b *testing.B) {
	for _, c := range []struct {
		name         string
		size         uint64
		fill, sparse bool
	}{
		{"1GiB/empty", 1 << 30, false, false},
		{"1GiB/written", 1 << 30, true, false},
		{"16GiB/empty", 16 << 30, false, false},
		{"16GiB/every-leaf", 16 << 30, false, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, v := openSnapBench(b, c.size, c.fill, c.sparse)
			one := alignedBuf(benchBlock, 4096)
			one[0] = 1
			var snapT, flushT, cloneT time.Duration
			for i := range b.N {
				if err := v.Write(uint64(i)*16, one, 0); err != nil {
					b.Fatal(err)
				}
				t := time.Now()
				if err := s.Flush(); err != nil {
					b.Fatal(err)
				}
				flushT += time.Since(t)
				if err := v.Write(uint64(i)*16+1, one, 0); err != nil {
					b.Fatal(err)
				}
				t = time.Now()
				if err := s.Snapshot(1, ID(1000+i)); err != nil {
					b.Fatal(err)
				}
				snapT += time.Since(t)
				t = time.Now()
				if err := s.Clone(1000, ID(100000+i)); err != nil {
					b.Fatal(err)
				}
				cloneT += time.Since(t)
			}
			n := float64(b.N)
			b.ReportMetric(float64(snapT.Nanoseconds())/n, "snapshot-ns")
			b.ReportMetric(float64(flushT.Nanoseconds())/n, "flush-ns")
			b.ReportMetric(float64(cloneT.Nanoseconds())/n, "clone-ns")
			b.ReportMetric(float64(snapT)/float64(flushT), "x-flush")
		})
	}
}

// BenchmarkWriteAfterSnapshot: 4 KiB random writes by 8 goroutines to a
// written 1 GiB volume: "none" without a snapshot (the baseline), "first"
// right after one (each of the first writes to a cluster copies it:
// cows/op), "copied" after one and a rewrite of the whole volume (every
// cluster its own again: the overwrite path).
func BenchmarkWriteAfterSnapshot(b *testing.B) {
	const size = 1 << 30
	for _, mode := range []string{"none", "first", "copied"} {
		b.Run(mode, func(b *testing.B) {
			s, v := openSnapBench(b, size, true, false)
			if mode != "none" {
				if err := s.Snapshot(1, 2); err != nil {
					b.Fatal(err)
				}
			}
			if mode == "copied" {
				buf := alignedBuf(1<<20, 4096)
				for off := uint64(0); off < size; off += 1 << 20 {
					if err := v.Write(off/benchBlock, buf, 0); err != nil {
						b.Fatal(err)
					}
				}
			}
			cows := s.Stats().CopiesOnWrite
			var seq atomic.Uint64
			b.SetParallelism(4) // 8 goroutines on 2 CPUs
			b.SetBytes(benchBlock)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				buf := alignedBuf(benchBlock, 4096)
				r := rand.New(rand.NewPCG(seq.Add(1), 7))
				for pb.Next() {
					if err := v.Write(r.Uint64N(size/benchBlock), buf, 0); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(s.Stats().CopiesOnWrite-cows)/float64(b.N), "cows/op")
		})
	}
}

// BenchmarkCloneRead: 4 KiB random reads (one goroutine, O_DIRECT) of a
// written 256 MiB volume's snapshot ("parent", the baseline), of a clone
// of it ("clone", every cluster inherited), and of a clone that rewrote
// every other cluster ("clone-half-own").
func BenchmarkCloneRead(b *testing.B) {
	const size = 256 << 20
	s, _ := openSnapBench(b, size, true, false)
	if err := s.Snapshot(1, 2); err != nil {
		b.Fatal(err)
	}
	for _, id := range []ID{3, 4} {
		if err := s.Clone(2, id); err != nil {
			b.Fatal(err)
		}
	}
	half, err := s.Volume(4)
	if err != nil {
		b.Fatal(err)
	}
	buf := alignedBuf(64<<10, 4096)
	for off := uint64(0); off < size; off += 128 << 10 {
		if err := half.Write(off/benchBlock, buf, 0); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Flush(); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		id   ID
	}{{"parent", 2}, {"clone", 3}, {"clone-half-own", 4}} {
		b.Run(c.name, func(b *testing.B) {
			v, err := s.Volume(c.id)
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 9))
			buf := alignedBuf(benchBlock, 4096)
			b.SetBytes(benchBlock)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := v.Read(r.Uint64N(size/benchBlock), buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSnapshotDelete: Store.Delete of the snapshot of a written
// 1 GiB volume, merged into the volume (docs/snapshots.md §1.6): "move",
// the volume having written nothing since (every key moves to its map),
// and "free", the volume having rewritten every cluster (every cluster of
// the snapshot is freed: in limbo until the next flush, after which the
// store maps the volume's clusters only). keys/s are the snapshot's map
// keys merged.
func BenchmarkSnapshotDelete(b *testing.B) {
	const size = 1 << 30
	for _, mode := range []string{"move", "free"} {
		b.Run(mode, func(b *testing.B) {
			s, v := openSnapBench(b, size, true, false)
			buf := alignedBuf(1<<20, 4096)
			var total time.Duration
			var keys, freed uint64
			for i := range b.N {
				b.StopTimer()
				snap := ID(1000 + i)
				if err := s.Snapshot(1, snap); err != nil {
					b.Fatal(err)
				}
				if mode == "free" {
					for off := uint64(0); off < size; off += 1 << 20 {
						if err := v.Write(off/benchBlock, buf, 0); err != nil {
							b.Fatal(err)
						}
					}
				}
				sp, err := s.SpaceOf(snap)
				if err != nil {
					b.Fatal(err)
				}
				keys += sp.OwnedBytes >> 16
				freed += sp.ExclusiveBytes >> 16
				b.StartTimer()
				t := time.Now()
				if err := s.Delete(snap); err != nil {
					b.Fatal(err)
				}
				total += time.Since(t)
				b.StopTimer()
				if err := s.Flush(); err != nil {
					b.Fatal(err)
				}
				if st := s.Stats(); st.Limbo != 0 || st.Mapped != size>>16 {
					b.Fatalf("after the delete and a flush: %+v", st)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/delete")
			b.ReportMetric(float64(keys)/total.Seconds(), "keys/s")
			b.ReportMetric(float64(freed)/float64(b.N), "clusters-freed/op")
		})
	}
}
