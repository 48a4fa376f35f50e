package volume

import (
	"bytes"
	"cmp"
	"math"
	"math/rand/v2"
	"testing"
)

// TestKeyOrder: bytewise order of block keys is (volume, LBA) order, so a
// volume's blocks are one contiguous range in LBA order, and the end key
// of a volume is above all its blocks and below every other volume's.
func TestKeyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 1))
	edge := []uint64{0, 1, 255, 256, math.MaxUint32, math.MaxUint64 - 1, math.MaxUint64}
	pick := func() uint64 {
		if rng.IntN(2) == 0 {
			return edge[rng.IntN(len(edge))]
		}
		return rng.Uint64()
	}
	var ka, kb, end [dataKeyLen]byte
	for range 20000 {
		ia, ib := ID(pick()), ID(pick())
		la, lb := pick(), pick()
		putDataKey(ka[:], ia, la)
		putDataKey(kb[:], ib, lb)
		want := cmp.Or(cmp.Compare(ia, ib), cmp.Compare(la, lb))
		if got := bytes.Compare(ka[:], kb[:]); got != want {
			t.Fatalf("key(%d,%d) vs key(%d,%d): bytes %d, want %d", ia, la, ib, lb, got, want)
		}
		var start [dataKeyLen]byte
		putDataKey(start[:], ia, 0)
		putDataEnd(end[:], ia)
		inside := bytes.Compare(kb[:], start[:]) >= 0 && bytes.Compare(kb[:], end[:]) < 0
		if inside != (ib == ia) {
			t.Fatalf("key(%d,%d) in volume %d's range: %v", ib, lb, ia, inside)
		}
		if l, ok := dataKeyLBA(ka[:], ia); !ok || l != la {
			t.Fatalf("dataKeyLBA(key(%d,%d)) = %d, %v", ia, la, l, ok)
		}
		if _, ok := dataKeyLBA(ka[:], ia+1); ok {
			t.Fatalf("dataKeyLBA accepted another volume's key")
		}
	}
	// The families never interleave.
	putDataKey(ka[:], math.MaxUint64, math.MaxUint64)
	putDataEnd(end[:], math.MaxUint64)
	var first [dataKeyLen]byte
	putDataKey(first[:], 0, 0)
	// data < format < meta, each family a separate range.
	if bytes.Compare(ka[:], end[:]) >= 0 || bytes.Compare(end[:], formatKey) > 0 ||
		bytes.Compare(formatKey, metaKey(0)) >= 0 || bytes.Compare(first[:], []byte{familyData}) < 0 {
		t.Fatal("key families overlap")
	}
	if id, ok := metaKeyID(metaKey(12345)); !ok || id != 12345 {
		t.Fatal("metaKeyID")
	}
}

func TestMetaRoundTrip(t *testing.T) {
	for _, info := range []Info{
		{ID: 1, SizeBytes: 4096, BlockSize: 4096, State: StateOnline},
		{ID: math.MaxUint64, SizeBytes: MaxSizeBytes, BlockSize: 512, State: StateReadOnly},
	} {
		var b [metaValueLen]byte
		encodeMeta(b[:], info)
		got, err := decodeMeta(info.ID, b[:])
		if err != nil || got != info {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", info, got, err)
		}
	}
	bad := [][]byte{nil, make([]byte, 15), make([]byte, 16), {1, 12, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 1}, // size not a multiple
		{1, 11, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0}, // 2 KiB blocks
		{1, 12, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0}} // state 3
	for _, b := range bad {
		if _, err := decodeMeta(1, b); err == nil {
			t.Fatalf("decodeMeta(%x) accepted", b)
		}
	}
}
