package volume

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestCountersDoNotWalkKeys: Counters (what a metrics scrape reads) reads
// counters and table metadata, never the volume's keys, so a scrape costs
// the same for 8 written blocks as for 4096. Stats, which walks them,
// counts the allocated bytes exactly.
func TestCountersDoNotWalkKeys(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem()))
	small := mustCreate(t, s, 1, 8192, BlockSize4K)
	large := mustCreate(t, s, 2, 8192, BlockSize4K)
	buf := make([]byte, BlockSize4K)
	for i := range 8 {
		if err := small.Write(uint64(i), buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4096 {
		buf[0] = byte(i)
		if err := large.Write(uint64(i), buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	before := keysWalked.Load()
	for range 3 {
		for _, v := range []*Volume{small, large} {
			if _, err := v.Counters(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := keysWalked.Load() - before; n != 0 {
		t.Fatalf("Counters walked %d keys: a scrape's cost would grow with the data", n)
	}
	st, err := large.Stats()
	if err != nil || st.AllocatedBytes != 4096*BlockSize4K || keysWalked.Load()-before != 4096 {
		t.Fatalf("Stats: %+v, %v; want AllocatedBytes %d", st, err, 4096*BlockSize4K)
	}
	c, err := large.Counters()
	if err != nil || c.Writes != 4096 || c.AllocatedBytes != 0 {
		t.Fatalf("Counters: %+v, %v; want 4096 writes and no walk", c, err)
	}
	if e := s.Engine(); e.Flushes == 0 || e.DiskBytes == 0 {
		t.Fatalf("Engine after writes and a flush: %+v", e)
	}
}
