package store

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// testSeed returns BLK_SEED or the clock, and logs the replay line if the
// test fails.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("BLK_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("BLK_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: replay with BLK_SEED=%d go test -run '^%s$' ./store", seed, seed, t.Name())
		}
	})
	return seed
}

// iterations scales a randomised test: n normally, n/race under -race,
// n/short with -short; BLK_ITERS overrides.
func iterations(t testing.TB, n, race, short int) int {
	if s := os.Getenv("BLK_ITERS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("BLK_ITERS=%q: want a positive integer", s)
		}
		return v
	}
	if raceEnabled {
		n /= race
	}
	if testing.Short() {
		n /= short
	}
	return max(n, 1)
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}

// memConfig is a small store on fs and area: 16 KiB clusters (requests
// cross cluster boundaries often), a ready pool of 8 (refills often), no
// background syncer, no growth of the area.
func memConfig(fs vfs.FS, area Area) Config {
	return Config{
		Dir:              "/store",
		FS:               fs,
		Area:             area,
		AreaMaxBytes:     area.Size(), // no growth unless a test asks
		ClusterBytes:     16 << 10,
		ReadyClusters:    8,
		MaxTransferBytes: 64 << 10,
		MemTableBytes:    1 << 20,
		CacheBytes:       1 << 20,
		SyncInterval:     -1, // every sync point is the test's (sync_test.go runs the syncer)
		ReadyLowClusters: -1, // every refill is a first write's (refill_test.go runs the background one)
		Logger:           quietLogger{},
	}
}

func openStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustCreate(t testing.TB, s *Store, id ID, blocks uint64, bs uint32) *Volume {
	t.Helper()
	v, err := s.Create(id, CreateOptions{SizeBytes: blocks * uint64(bs), BlockSize: bs})
	if err != nil {
		t.Fatalf("Create(%d): %v", id, err)
	}
	return v
}

// Tagged blocks say who wrote them and carry a checksum, so a block read
// back is either whole and traced to one write of this volume and LBA, or
// all zeros, or detected as torn or foreign:
//
//	[0:8] volume ID  [8:16] LBA  [16:24] tag (never 0)  [24:28] CRC-32C  [28:] filler
func fillTagged(dst []byte, id ID, lba, tag uint64) {
	binary.LittleEndian.PutUint64(dst[0:], uint64(id))
	binary.LittleEndian.PutUint64(dst[8:], lba)
	binary.LittleEndian.PutUint64(dst[16:], tag)
	binary.LittleEndian.PutUint32(dst[24:], 0)
	r := rand.New(rand.NewPCG(uint64(id)^lba<<20, tag))
	for i := 28; i < len(dst); i += 4 {
		binary.LittleEndian.PutUint32(dst[i:], r.Uint32())
	}
	binary.LittleEndian.PutUint32(dst[24:], crc32.Checksum(dst, castagnoli))
}

var errTorn = errors.New("torn or foreign block")

// readTag returns a tagged block's tag, 0 for zeros, errTorn otherwise.
func readTag(b []byte, id ID, lba uint64) (uint64, error) {
	if isZero(b) {
		return 0, nil
	}
	want := binary.LittleEndian.Uint32(b[24:])
	var c [4]byte
	h := crc32.Update(0, castagnoli, b[:24])
	h = crc32.Update(h, castagnoli, c[:])
	h = crc32.Update(h, castagnoli, b[28:])
	if h != want || binary.LittleEndian.Uint64(b[0:]) != uint64(id) || binary.LittleEndian.Uint64(b[8:]) != lba {
		return 0, errTorn
	}
	return binary.LittleEndian.Uint64(b[16:]), nil
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
