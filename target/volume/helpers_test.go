package volume

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

// testSeed returns the test's seed: BLK_SEED if set, else the clock. It is
// logged when the test fails, with the line that replays it.
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
			t.Logf("seed %d: replay with BLK_SEED=%d go test -run '^%s$' ./target/volume", seed, seed, t.Name())
		}
	})
	return seed
}

// iterations scales a randomised test: full runs n, -race runs n/race,
// -short runs n/short (at least 1 each). BLK_ITERS overrides all three,
// to replay one failing iteration with BLK_ITERS=1.
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

// memConfig is a small store on fs: a 1 MiB memtable so that tests run
// through memtable flushes and compactions, not only the memtable, and a
// 1 ms background sync interval so that waiting for it is quick.
func memConfig(fs vfs.FS) Config {
	return Config{
		Dir:              "/store",
		FS:               fs,
		Logger:           quietLogger{},
		MaxTransferBytes: 64 << 10,
		MemTableBytes:    1 << 20,
		CacheBytes:       8 << 20,
		SyncInterval:     time.Millisecond,
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

// Tagged blocks: the crash and concurrency tests write blocks whose
// contents say who wrote them and carry their own checksum, so a block
// read back can be checked for being whole (not torn) and traced to one
// write.
//
//	[0:8]   volume ID
//	[8:16]  LBA
//	[16:24] tag (the writing operation's number; never 0)
//	[24:28] CRC-32C of the rest of the block with these 4 bytes zeroed
//	[28:]   filler derived from the three fields above
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func fillTagged(dst []byte, id ID, lba, tag uint64) {
	binary.LittleEndian.PutUint64(dst[0:], uint64(id))
	binary.LittleEndian.PutUint64(dst[8:], lba)
	binary.LittleEndian.PutUint64(dst[16:], tag)
	binary.LittleEndian.PutUint32(dst[24:], 0)
	r := rand.New(rand.NewPCG(uint64(id)^lba<<20, tag))
	for i := 28; i < len(dst); i += 8 {
		u := r.Uint64()
		for j := 0; j < 8 && i+j < len(dst); j++ {
			dst[i+j] = byte(u >> (8 * j))
		}
	}
	binary.LittleEndian.PutUint32(dst[24:], crc32.Checksum(dst, castagnoli))
}

var errTorn = errors.New("torn or foreign block")

// readTag returns the tag of a tagged block, 0 for an all-zero block, and
// errTorn for anything else: a block that is neither whole nor zero, or
// that names another volume or LBA.
func readTag(b []byte, id ID, lba uint64) (uint64, error) {
	if isZero(b) {
		return 0, nil
	}
	want := binary.LittleEndian.Uint32(b[24:])
	var c [4]byte
	h := crc32.Update(0, castagnoli, b[:24])
	h = crc32.Update(h, castagnoli, c[:])
	h = crc32.Update(h, castagnoli, b[28:])
	if h != want || binary.LittleEndian.Uint64(b[0:]) != uint64(id) ||
		binary.LittleEndian.Uint64(b[8:]) != lba {
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
