package target

import (
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
)

// TestCNTLIDSpace: next-fit over 1..0xFFEF, wrap-around, exhaustion, and
// rollback of IDs no host saw.
func TestCNTLIDSpace(t *testing.T) {
	s := cntlidSpace{lo: nvme.CNTLIDMin, hi: nvme.CNTLIDMax}
	for want := uint16(1); want <= 3; want++ {
		if id, ok := s.alloc(); !ok || id != want {
			t.Fatalf("alloc %d, %v; want %d", id, ok, want)
		}
	}
	s.free(2, false)
	if id, _ := s.alloc(); id != 4 {
		t.Fatalf("next-fit gave %d, want 4", id)
	}
	s.free(4, true) // refused Connect: the cursor goes back
	if id, _ := s.alloc(); id != 4 {
		t.Fatalf("after rollback %d, want 4", id)
	}
	for {
		if _, ok := s.alloc(); !ok {
			break
		}
	}
	// Full: only ID 2 was free, and the wrap found it.
	var used int
	for id := nvme.CNTLIDMin; id <= nvme.CNTLIDMax; id++ {
		if s.used[id/64]&(1<<(id%64)) != 0 {
			used++
		}
	}
	if used != int(nvme.CNTLIDMax) {
		t.Fatalf("%d IDs used at exhaustion", used)
	}
	s.free(0xFFEF, false)
	s.free(7, false)
	if id, ok := s.alloc(); !ok || (id != 0xFFEF && id != 7) {
		t.Fatalf("after freeing: %d %v", id, ok)
	}
	if s.used[0]&1 != 0 || s.used[len(s.used)-1]>>((0xFFF0)%64) != 0 {
		t.Fatal("IDs 0 or above 0xFFEF handed out")
	}
}

// TestCNTLIDSpaceRange: a space of 0x400..0x402 hands out only those,
// next-fit, wraps within them, and is full after three.
func TestCNTLIDSpaceRange(t *testing.T) {
	s := cntlidSpace{lo: 0x400, hi: 0x402}
	for want := uint16(0x400); want <= 0x402; want++ {
		if id, ok := s.alloc(); !ok || id != want {
			t.Fatalf("alloc %#x, %v; want %#x", id, ok, want)
		}
	}
	if id, ok := s.alloc(); ok {
		t.Fatalf("a full range gave %#x", id)
	}
	s.free(0x401, false)
	if id, ok := s.alloc(); !ok || id != 0x401 {
		t.Fatalf("after a free: %#x %v", id, ok)
	}
	for i, w := range s.used {
		want := uint64(0)
		if i == 0x400/64 {
			want = 7
		}
		if w != want {
			t.Fatalf("used word %d = %#x, want %#x: an ID outside the range", i, w, want)
		}
	}
}

type testStatusErr nvme.Status

func (e testStatusErr) Error() string           { return nvme.Status(e).String() }
func (e testStatusErr) NVMeStatus() nvme.Status { return nvme.Status(e) }

func TestNSTableFind(t *testing.T) {
	var tb nsTable
	if tb.find(1) != nil {
		t.Fatal("empty table")
	}
	for _, id := range []uint32{1, 3, 7, 8, 1000} {
		tb.list = append(tb.list, &namespace{nsid: id})
	}
	for _, id := range []uint32{1, 3, 7, 8, 1000} {
		if ns := tb.find(id); ns == nil || ns.nsid != id {
			t.Fatalf("find(%d)", id)
		}
	}
	for _, id := range []uint32{0, 2, 9, 999, 1001, 0xFFFFFFFF} {
		if tb.find(id) != nil {
			t.Fatalf("find(%d) found something", id)
		}
	}
}

func TestDerivedNGUID(t *testing.T) {
	seen := map[[16]byte]bool{}
	for _, nqn := range []string{"nqn.2026-01.io.blk:a", "nqn.2026-01.io.blk:b"} {
		for nsid := uint32(1); nsid <= 100; nsid++ {
			g := derivedNGUID(nqn, nsid)
			if seen[g] || g == ([16]byte{}) {
				t.Fatalf("NGUID %x repeated", g)
			}
			seen[g] = true
			if derivedNGUID(nqn, nsid) != g {
				t.Fatal("not stable")
			}
		}
	}
}

func TestCopyWindow(t *testing.T) {
	page := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	dst := []byte{9, 9, 9, 9, 9, 9}
	if !copyWindow(dst, page, 4) || string(dst) != "\x05\x06\x07\x08\x00\x00" {
		t.Fatalf("window %v", dst)
	}
	if !copyWindow(dst, page, 8) || string(dst) != "\x00\x00\x00\x00\x00\x00" {
		t.Fatalf("at the end %v", dst)
	}
	if copyWindow(dst, page, 12) {
		t.Fatal("past the end accepted")
	}
}

// TestLatencyHistogram: a call lands in the first bucket whose bound it
// does not exceed (a bound is inclusive), past 1 s in the last; n calls
// of one duration count n times; Count is the buckets' sum.
func TestLatencyHistogram(t *testing.T) {
	var h latencyHist
	h.observe(0, 1)                           // bucket 0
	h.observe(10*time.Microsecond, 1)         // bucket 0: bounds are inclusive
	h.observe(10*time.Microsecond+1, 3)       // bucket 1, three calls
	h.observe(time.Millisecond, 1)            // bucket 6
	h.observe(time.Second, 1)                 // bucket 15
	h.observe(time.Second+time.Nanosecond, 2) // the last bucket
	var s LatencyHistogram
	h.snapshot(&s)
	want := map[int]uint64{0: 2, 1: 3, 6: 1, 15: 1, NumLatencyBuckets - 1: 2}
	for i, n := range s.Buckets {
		if n != want[i] {
			t.Errorf("bucket %d (≤ %v): %d, want %d", i, LatencyBounds()[min(i, len(latencyBounds)-1)], n, want[i])
		}
	}
	if s.Count != 9 {
		t.Errorf("count %d, want 9", s.Count)
	}
	wantSum := 10*time.Microsecond + 3*(10*time.Microsecond+1) + time.Millisecond + time.Second + 2*(time.Second+1)
	if s.Sum != wantSum {
		t.Errorf("sum %v, want %v", s.Sum, wantSum)
	}
	if b := LatencyBounds(); len(b) != NumLatencyBuckets-1 || b[0] != 10*time.Microsecond || b[len(b)-1] != time.Second {
		t.Errorf("bounds %v", b)
	}
	for o := range NumLatencyOps {
		if o.String() == "" || o.String() == "unknown" {
			t.Errorf("op %d has no name", o)
		}
	}
}
