//go:build linux

package store

import (
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkFirstWriteConcurrent: a fill of a fresh volume with 128 KiB
// writes (two clusters each) from 8 goroutines, each taking the next
// offset (QD8 sequential, what a host's fill does), on a file area and on
// a 4 GiB loop device (its zeroing the loop's fallocate, and "/writes":
// zeros written, a device without Write Zeroes), each also with the loop
// device in direct-I/O mode ("/dio": BenchmarkDeviceFirstWrite says why).
// "serial" is the baseline
// in the same run: each volume's first writes one at a time, data write
// and map commit included, and every refill on the first write that finds
// the pool empty (the behaviour before first writes claimed their
// clusters: Store.serialFirstWrites, ReadyLowClusters -1); "parallel" is
// the store as it is (claims, the background refill).
//
//	go test ./store -run '^$' -bench FirstWriteConcurrent -benchtime 4096x -count 3   # 512 MiB per run
func BenchmarkFirstWriteConcurrent(b *testing.B) {
	const (
		wbytes = 128 << 10
		qd     = 8
	)
	for _, area := range []string{"file", "device", "device/writes", "device/dio", "device/writes/dio"} {
		for _, serial := range []bool{true, false} {
			name := area + "/" + map[bool]string{true: "serial", false: "parallel"}[serial]
			b.Run(name, func(b *testing.B) {
				size := uint64(b.N) * wbytes
				if area != "file" && size > benchDeviceBytes-(256<<20) {
					b.Fatalf("%d writes of %d bytes do not fit the %d-byte device as first writes", b.N, wbytes, benchDeviceBytes)
				}
				var cfg Config
				if area == "file" {
					dir := b.TempDir()
					cfg = Config{Dir: filepath.Join(dir, "meta"), AreaPath: filepath.Join(dir, "area"),
						AreaBytes: int64(size) + 128<<20, Logger: quietLogger{}}
				} else {
					writes := strings.HasPrefix(area, "device/writes")
					cfg = benchDeviceConfig(b, loopDevice(b, benchDeviceBytes), writes, strings.HasSuffix(area, "/dio"))
				}
				if serial {
					cfg.ReadyLowClusters = -1
				}
				s, err := Open(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = s.Close() })
				s.serialFirstWrites = serial
				v, err := s.Create(1, CreateOptions{SizeBytes: max(size, wbytes)})
				if err != nil {
					b.Fatal(err)
				}
				bufs := make([][]byte, qd)
				for i := range bufs {
					bufs[i] = alignedBuf(wbytes, 4096)
					for j := range bufs[i] {
						bufs[i][j] = byte(j*13 + i + 1)
					}
				}
				before := s.Stats()
				lat := make([]time.Duration, b.N)
				var next atomic.Uint64
				var wg sync.WaitGroup
				errs := make(chan error, qd)
				b.SetBytes(wbytes)
				b.ReportAllocs()
				b.ResetTimer()
				for w := range qd {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							i := next.Add(1) - 1
							if i >= uint64(b.N) {
								return
							}
							start := time.Now()
							if err := v.Write(i*wbytes/BlockSize4K, bufs[w], 0); err != nil {
								errs <- err
								return
							}
							lat[i] = time.Since(start)
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
				reportLatency(b, lat)
				st := s.Stats()
				refills := st.Refills - before.Refills
				bg := st.BackgroundRefills - before.BackgroundRefills
				b.ReportMetric(float64(refills-bg)/float64(b.N), "inline-refills/op")
				b.ReportMetric(float64(bg)/float64(b.N), "bg-refills/op")
			})
		}
	}
}
