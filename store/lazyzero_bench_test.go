//go:build linux

package store

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The cost of a data device (docs/store.md, "Zeroed watermark"), on a
// 4 GiB loop device over a sparse file in the benchmark's temporary
// directory:
//
//	go test ./store -run '^$' -bench 'DeviceCreate|DeviceFirstWrite' -benchtime 1x -count 3        # create
//	go test ./store -run '^$' -bench DeviceFirstWrite -benchtime 4096x -count 3                   # fill, 512 MiB
//
// Each pattern runs with the device's zeroing as the kernel does it for a
// loop device (fallocate ZERO_RANGE on its backing file: metadata only)
// and, "/writes", with the zeros written (a device without Write Zeroes:
// most SATA SSDs, many virtual disks), as the kernel writes them there.

const benchDeviceBytes = 4 << 30

// BenchmarkDeviceCreate: the time to create a store on the device. The
// baseline, "whole", is what create did before the zeroed watermark:
// the same create, then every cluster past the header zeroed (1 GiB per
// call) and synced.
func BenchmarkDeviceCreate(b *testing.B) {
	for _, writes := range []bool{false, true} {
		for _, whole := range []bool{true, false} {
			name := map[bool]string{true: "whole", false: "lazy"}[whole]
			if writes {
				name += "/writes"
			}
			b.Run(name, func(b *testing.B) {
				dev := loopDevice(b, benchDeviceBytes)
				var sum time.Duration
				for range b.N {
					b.StopTimer()
					writeDevice(b, dev, make([]byte, 4096), 0) // blank again: no wipe needed
					cfg := benchDeviceConfig(b, dev, writes, false)
					b.StartTimer()
					start := time.Now()
					s, err := Open(cfg)
					if err != nil {
						b.Fatal(err)
					}
					if whole {
						zeroRest(b, s, 1<<30)
					}
					sum += time.Since(start)
					b.StopTimer()
					if err := s.Close(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				b.ReportMetric(sum.Seconds()/float64(b.N), "s/create")
			})
		}
	}
}

// BenchmarkDeviceFirstWrite: sequential 128 KiB first writes (two
// clusters each) into a fresh volume on the device. The baseline,
// "prezeroed", is a store whose device was zeroed whole at creation (as
// before the watermark): refills only reserve; "lazy" refills also zero
// the clusters they pick (ReadyClusters, 64 MiB, per refill) and sync.
// zeroed/op is the clusters zeroed ahead per write. "lazy-inline" is
// "lazy" without the background refill (Config.ReadyLowClusters -1):
// each refill, its zeroing included, on the path of the write that found
// the pool empty, as before the background refill.
//
// "/dio" runs on the loop device in direct-I/O mode (LOOP_SET_DIRECT_IO:
// its reads and writes bypass the page cache over its backing file, as
// a disk's do); without it a sync of the device writes back everything
// the page cache held, which a disk does not have to.
func BenchmarkDeviceFirstWrite(b *testing.B) {
	const wbytes = 128 << 10
	for _, dio := range []bool{false, true} {
		for _, writes := range []bool{false, true} {
			for _, mode := range []string{"prezeroed", "lazy-inline", "lazy"} {
				pre, inline := mode == "prezeroed", mode == "lazy-inline"
				name := mode
				if writes {
					name += "/writes"
				}
				if dio {
					name += "/dio"
				}
				b.Run(name, func(b *testing.B) {
					if uint64(b.N)*wbytes > benchDeviceBytes-(256<<20) {
						b.Fatalf("%d writes of %d bytes do not fit the %d-byte device as first writes", b.N, wbytes, benchDeviceBytes)
					}
					dev := loopDevice(b, benchDeviceBytes)
					cfg := benchDeviceConfig(b, dev, writes, dio)
					if inline {
						cfg.ReadyLowClusters = -1
					}
					s, err := Open(cfg)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { _ = s.Close() })
					if pre {
						zeroRest(b, s, 1<<30)
					}
					v, err := s.Create(1, CreateOptions{SizeBytes: benchDeviceBytes - (256 << 20)})
					if err != nil {
						b.Fatal(err)
					}
					buf := alignedBuf(wbytes, 4096)
					for i := range buf {
						buf[i] = byte(i*13 + 1)
					}
					before := s.Stats()
					lat := make([]time.Duration, b.N)
					b.SetBytes(wbytes)
					b.ReportAllocs()
					b.ResetTimer()
					for i := range uint64(b.N) {
						start := time.Now()
						if err := v.Write(i*wbytes/BlockSize4K, buf, 0); err != nil {
							b.Fatal(err)
						}
						lat[i] = time.Since(start)
					}
					b.StopTimer()
					reportLatency(b, lat)
					st := s.Stats()
					b.ReportMetric(float64(st.ZeroedAhead-before.ZeroedAhead)/float64(b.N), "zeroed/op")
					b.ReportMetric(float64(st.Refills-before.Refills)/float64(b.N), "refills/op")
				})
			}
		}
	}
}

// benchDeviceConfig is a store on the loop device dev: its zeroing the
// kernel's, or (writes) zeros written; with dio the loop device is put
// in direct-I/O mode first.
func benchDeviceConfig(b *testing.B, dev string, writes, dio bool) Config {
	if dio {
		fd, err := unix.Open(dev, unix.O_RDWR, 0)
		if err != nil {
			b.Fatal(err)
		}
		err = unix.IoctlSetInt(fd, unix.LOOP_SET_DIRECT_IO, 1)
		_ = unix.Close(fd)
		if err != nil {
			b.Skipf("loop device %s: direct I/O: %v", dev, err)
		}
	}
	cfg := Config{Dir: filepath.Join(b.TempDir(), "volumes"), AreaDevice: dev, Logger: quietLogger{}}
	if writes {
		a, err := OpenDeviceArea(dev)
		if err != nil {
			b.Fatal(err)
		}
		cfg.Area = &writtenZeros{Area: a, zero: alignedBuf(1<<20, a.Align())}
	}
	return cfg
}

// writtenZeros is a device whose Zero writes zeros, as the kernel does
// for a device without Write Zeroes.
type writtenZeros struct {
	Area
	zero []byte
}

func (w *writtenZeros) Zero(off, n int64) error {
	for n > 0 {
		c := min(n, int64(len(w.zero)))
		if err := w.WriteAt(w.zero[:c], off); err != nil {
			return err
		}
		off, n = off+c, n-c
	}
	return nil
}

func (w *writtenZeros) Unzeroed() bool { return true }

// zeroRest does what creating a store on a device did before the zeroed
// watermark: it zeroes every cluster past the watermark, chunk bytes per
// call, syncs, and moves the watermark to the end.
func zeroRest(tb testing.TB, s *Store, chunk int64) {
	tb.Helper()
	s.al.mu.Lock()
	defer s.al.mu.Unlock()
	from, end := int64(s.al.zeroed)<<s.cshift, int64(s.al.clusters)<<s.cshift
	for off := from; off < end; off += chunk {
		if err := s.area.Zero(off, min(chunk, end-off)); err != nil {
			tb.Fatal(err)
		}
	}
	if err := s.area.Sync(); err != nil {
		tb.Fatal(err)
	}
	if err := s.db.Set(zeroedKey, zeroedValue(s.al.clusters), nil); err != nil {
		tb.Fatal(err)
	}
	s.al.zeroed = s.al.clusters
}

// reportLatency reports the 99th percentile and the largest of the
// writes' latencies, in ms (a refill on a first write's path shows there).
func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1])/1e6, "max-ms")
}
