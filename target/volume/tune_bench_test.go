//go:build linux

package volume

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/sstable"
)

// BenchmarkOptions measures the store's pebble options ("blk") against
// the same with block data in blob files and no compression ("blob":
// pebble's value separation, values of 1 KiB and more, blob files with 20%
// garbage rewritten once 5 s old) in the same run, under sustained writes
// (long enough that flushes, compactions and blob rewrites run) and
// cached reads. Reproduce the figures in docs/volume.md:
//
//	go test ./target/volume -run '^$' -bench Options -benchtime 20s
//
// Beyond the usual metrics: space/vol, the disk pebble uses (WAL,
// sstables, blob files, obsolete ones not yet deleted) per byte of
// volume, and L0-files, the tables waiting in level 0 at the end.
func BenchmarkOptions(b *testing.B) {
	blob := func(o *pebble.Options) {
		o.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
			return pebble.ValueSeparationPolicy{Enabled: true, MinimumSize: 1024, MaxBlobReferenceDepth: 10,
				RewriteMinimumAge: 5 * time.Second, TargetGarbageRatio: 0.2}
		}
		for i := range o.Levels {
			o.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.NoCompression }
		}
	}
	for _, v := range []struct {
		name string
		tune func(*pebble.Options)
	}{{"blk", nil}, {"blob", blob}} {
		for _, p := range []struct {
			name  string
			io    int
			write bool
		}{{"randwrite4k", 4096, true}, {"seqwrite128k", 128 << 10, true}, {"randread4k", 4096, false}, {"seqread128k", 128 << 10, false}} {
			b.Run(v.name+"/"+p.name, func(b *testing.B) {
				tuneOptions = v.tune
				t := openBench(b, "volume", !p.write).(volumeTarget)
				tuneOptions = nil
				buf := make([]byte, p.io)
				fillRandom(rand.New(rand.NewPCG(5, 6)), buf)
				offs := offsets(1<<16, p.io)
				before := readCounters(b, t)
				b.SetBytes(int64(p.io))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					off := offs[i&(len(offs)-1)]
					if p.io > 4096 {
						off = int64(i) * int64(p.io) % benchVolumeBytes
					}
					var err error
					if p.write {
						err = t.write(off, buf)
					} else {
						err = t.read(off, buf)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				report(b, t, before, uint64(b.N)*uint64(p.io), p.write)
				m := t.s.db.Metrics()
				b.ReportMetric(float64(m.DiskSpaceUsage())/float64(benchVolumeBytes), "space/vol")
				b.ReportMetric(float64(m.Levels[0].TablesCount), "L0-files")
			})
		}
	}
}
