//go:build linux

package store

import (
	"path/filepath"
	"testing"
)

// BenchmarkOpenAfterClose times Open of a store with the default
// configuration (a 1 GiB data area file in b.TempDir(), opened O_DIRECT,
// 64 KiB clusters, a ready pool of 1024) that was last closed cleanly
// after a first write had refilled its ready pool, as blkd's restarts
// find it. Reported: ns/op (Open only) and zeroed/op, the clusters Open
// zeroed and synced (Stats.ZeroedAtOpen): the ready pool before Close
// released it, 0 since.
//
//	go test ./store -run '^$' -bench OpenAfterClose -benchtime 20x -count 3
func BenchmarkOpenAfterClose(b *testing.B) {
	dir := b.TempDir()
	cfg := Config{Dir: filepath.Join(dir, "meta"), Logger: quietLogger{}}
	buf := alignedBuf(4096, 4096)
	// cycle opens (timed when asked), writes one block into cluster i (a
	// first write: the first one refills the pool) and closes.
	cycle := func(i int, timed bool) uint64 {
		if timed {
			b.StartTimer()
		}
		s, err := Open(cfg)
		if timed {
			b.StopTimer()
		}
		if err != nil {
			b.Fatal(err)
		}
		v, err := s.Volume(1)
		if err != nil {
			if v, err = s.Create(1, CreateOptions{SizeBytes: 64 << 30}); err != nil {
				b.Fatal(err)
			}
		}
		buf[0] = byte(i)
		if err := v.Write(uint64(i)*DefaultClusterBytes/BlockSize4K, buf, 0); err != nil {
			b.Fatal(err)
		}
		zeroed := s.Stats().ZeroedAtOpen
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		return zeroed
	}
	b.StopTimer()
	cycle(0, false)
	b.ResetTimer()
	var zeroed uint64
	for i := range b.N {
		zeroed += cycle(i+1, true)
	}
	b.ReportMetric(float64(zeroed)/float64(b.N), "zeroed/op")
}
