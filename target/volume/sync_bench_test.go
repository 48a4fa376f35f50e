//go:build linux

package volume

import (
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"golang.org/x/sys/unix"
)

// BenchmarkSyncInterval measures what the background syncer costs plain
// writes: random 4 KiB plain writes to a volume on the OS filesystem, from
// one goroutine (qd1) and from 16 (qd16), and from one with a Flush after
// every 32nd write (flush32: what the syncer's syncs cost a host's
// flushes, which may have to wait for one in progress), under each sync
// policy:
//
//   - off: no syncer at all (main before issue 21: an idle store may keep
//     acknowledged writes in memory indefinitely), the baseline;
//   - every-write: each plain write committed with a WAL sync (pebble
//     groups concurrent syncs), the only way pebble offers to get a write
//     to the kernel before it is acknowledged;
//   - 0: the syncer syncs as soon as a write is acknowledged (a negative
//     SyncInterval), back to back under load;
//   - 1ms ... 100ms: Config.SyncInterval.
//
// It reports syncs/s, the background syncs per second of the run, and
// cpu-ns/op, the process's CPU time per write. The runs stay within the
// memtables, so that pebble's flushes and compactions do not drown the
// difference:
//
//	go test ./target/volume -run '^$' -bench 'SyncInterval' -benchtime 50000x -count 5
//
// every-write at qd1 waits one fdatasync per write: give it fewer, e.g.
// -bench 'SyncInterval/every-write' -benchtime 1000x.
func BenchmarkSyncInterval(b *testing.B) {
	policies := []struct {
		name     string
		interval time.Duration
		off      bool // no syncer
		sync     bool // every write synced
	}{
		{"off", 0, true, false},
		{"every-write", 0, true, true},
		{"0", -1, false, false},
		{"1ms", time.Millisecond, false, false},
		{"10ms", 10 * time.Millisecond, false, false},
		{"50ms", 50 * time.Millisecond, false, false},
		{"100ms", 100 * time.Millisecond, false, false},
	}
	patterns := []struct {
		name      string
		qd, flush int // flush: a Flush after every flush-th write of each writer
	}{{"qd1", 1, 0}, {"qd16", 16, 0}, {"flush32", 1, 32}}
	for _, pat := range patterns {
		for _, p := range policies {
			b.Run(pat.name+"/"+p.name, func(b *testing.B) {
				syncerDisabled = p.off
				if p.sync {
					noSyncWrite = pebble.Sync
				}
				defer func() { syncerDisabled, noSyncWrite = false, pebble.NoSync }()
				benchPlainWrites(b, pat.qd, pat.flush, p.interval)
			})
		}
	}
}

func benchPlainWrites(b *testing.B, qd, flush int, interval time.Duration) {
	// Memtables of 512 MiB hold the whole run (see above): no flush or
	// compaction blurs what the syncs cost.
	s, err := Open(Config{Dir: filepath.Join(b.TempDir(), "store"), Logger: quietLogger{},
		CacheBytes: benchCacheBytes, MemTableBytes: 512 << 20, SyncInterval: interval})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	v, err := s.Create(1, CreateOptions{SizeBytes: benchVolumeBytes})
	if err != nil {
		b.Fatal(err)
	}
	offs := offsets(1<<16, benchBlock)
	bufs := make([][]byte, qd)
	for i := range bufs {
		bufs[i] = make([]byte, benchBlock)
		fillRandom(rand.New(rand.NewPCG(11, uint64(i))), bufs[i])
	}
	syncs := s.bgSyncs.Load()
	cpu0 := processCPU(b)
	b.SetBytes(benchBlock)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range qd {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < b.N; i += qd {
				if err := v.Write(uint64(offs[i&(len(offs)-1)])/benchBlock, bufs[w], 0); err != nil {
					b.Error(err)
					return
				}
				if flush > 0 && (i/qd)%flush == flush-1 {
					if err := v.Flush(); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(s.bgSyncs.Load()-syncs)/time.Since(start).Seconds(), "syncs/s")
	// CPU time per op (every thread of the process: writers, the syncer,
	// pebble's WAL writer): steadier than ns/op on a shared machine.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the process's user and system CPU time, in nanoseconds.
func processCPU(b *testing.B) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
