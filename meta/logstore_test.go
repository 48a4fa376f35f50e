package meta

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

func openMem(t *testing.T, fs vfs.FS) *PebbleStore {
	t.Helper()
	s, err := OpenStore(StoreOptions{Dir: "raft", FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mkLog(i uint64) *raft.Log {
	l := &raft.Log{Index: i, Term: i/10 + 1, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("entry-%d", i))}
	if i%3 == 0 {
		l.Extensions = []byte{byte(i)}
		l.AppendedAt = time.Unix(1700000000, int64(i))
	}
	if i%5 == 0 {
		l.Data = nil
		l.Type = raft.LogNoop
	}
	return l
}

func checkEdges(t *testing.T, s *PebbleStore, first, last uint64) {
	t.Helper()
	f, err := s.FirstIndex()
	if err != nil || f != first {
		t.Errorf("FirstIndex = %d, %v; want %d", f, err, first)
	}
	l, err := s.LastIndex()
	if err != nil || l != last {
		t.Errorf("LastIndex = %d, %v; want %d", l, err, last)
	}
}

func checkLog(t *testing.T, s *PebbleStore, i uint64) {
	t.Helper()
	var got raft.Log
	if err := s.GetLog(i, &got); err != nil {
		t.Fatalf("GetLog(%d): %v", i, err)
	}
	want := mkLog(i)
	if !got.AppendedAt.Equal(want.AppendedAt) {
		t.Errorf("log %d AppendedAt %v, want %v", i, got.AppendedAt, want.AppendedAt)
	}
	got.AppendedAt, want.AppendedAt = time.Time{}, time.Time{}
	if !reflect.DeepEqual(&got, want) {
		t.Errorf("log %d = %+v, want %+v", i, got, *want)
	}
}

// TestLogStoreConformance is the LogStore contract raft relies on.
func TestLogStoreConformance(t *testing.T) {
	s := openMem(t, vfs.NewMem())
	checkEdges(t, s, 0, 0)
	var l raft.Log
	if err := s.GetLog(1, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog on empty: %v", err)
	}
	if err := s.StoreLog(mkLog(1)); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 1, 1)
	var batch []*raft.Log
	for i := uint64(2); i <= 300; i++ {
		batch = append(batch, mkLog(i))
	}
	if err := s.StoreLogs(batch); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 1, 300)
	for i := uint64(1); i <= 300; i++ {
		checkLog(t, s, i)
	}
	// Compaction from the front, as raft does after a snapshot.
	if err := s.DeleteRange(1, 100); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 101, 300)
	if err := s.GetLog(100, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Errorf("GetLog(100) after delete: %v", err)
	}
	checkLog(t, s, 101)
	// Conflict truncation from the back, as a follower does.
	if err := s.DeleteRange(250, 300); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 101, 249)
	// Overwrite in place (a follower replacing a conflicting suffix).
	over := mkLog(249)
	over.Term = 99
	if err := s.StoreLog(over); err != nil {
		t.Fatal(err)
	}
	if err := s.GetLog(249, &l); err != nil || l.Term != 99 {
		t.Errorf("overwritten log: %+v, %v", l, err)
	}
	// Empty and inverted ranges are no-ops; a range to MaxUint64 empties.
	if err := s.DeleteRange(200, 199); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 101, 249)
	if err := s.DeleteRange(0, ^uint64(0)); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 0, 0)
	// Indexes sort numerically across byte boundaries.
	if err := s.StoreLogs([]*raft.Log{mkLog(255), mkLog(256), mkLog(1 << 40)}); err != nil {
		t.Fatal(err)
	}
	checkEdges(t, s, 255, 1<<40)
}

func TestStableStore(t *testing.T) {
	s := openMem(t, vfs.NewMem())
	if _, err := s.Get([]byte("k")); err == nil || err.Error() != "not found" {
		t.Errorf("Get missing: %v (raft needs exactly \"not found\")", err)
	}
	if _, err := s.GetUint64([]byte("term")); err == nil || err.Error() != "not found" {
		t.Errorf("GetUint64 missing: %v", err)
	}
	if err := s.Set([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get([]byte("k")); err != nil || string(v) != "v" {
		t.Errorf("Get = %q, %v", v, err)
	}
	if err := s.SetUint64([]byte("term"), 1<<63+5); err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetUint64([]byte("term")); err != nil || v != 1<<63+5 {
		t.Errorf("GetUint64 = %d, %v", v, err)
	}
	// Stable keys never show up as logs.
	checkEdges(t, s, 0, 0)
	if _, err := s.GetUint64([]byte("k")); err == nil {
		t.Error("GetUint64 of a 1-byte value succeeded")
	}
}

// TestStoreCrash: everything acknowledged survives a crash that loses all
// unsynced data (and any random part of it), seeded.
func TestStoreCrash(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	fs := vfs.NewCrashableMem()
	s, err := OpenStore(StoreOptions{Dir: "raft", FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	next, first := uint64(1), uint64(1)
	for round := 0; round < 20; round++ {
		var batch []*raft.Log
		for k := rng.IntN(20) + 1; k > 0; k-- {
			batch = append(batch, mkLog(next))
			next++
		}
		if err := s.StoreLogs(batch); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(4) == 0 && next-first > 5 {
			cut := first + uint64(rng.IntN(int(next-first)/2))
			if err := s.DeleteRange(first, cut); err != nil {
				t.Fatal(err)
			}
			first = cut + 1
		}
		if err := s.SetUint64([]byte("round"), uint64(round)); err != nil {
			t.Fatal(err)
		}
		crashed := fs.CrashClone(vfs.CrashCloneCfg{
			UnsyncedDataPercent: rng.IntN(2) * 50,
			RNG:                 rand.New(rand.NewPCG(rng.Uint64(), 2)),
		})
		c, err := OpenStore(StoreOptions{Dir: "raft", FS: crashed})
		if err != nil {
			t.Fatalf("round %d: reopen after crash: %v", round, err)
		}
		checkEdges(t, c, first, next-1)
		for i := first; i < next; i++ {
			checkLog(t, c, i)
		}
		if v, err := c.GetUint64([]byte("round")); err != nil || v != uint64(round) {
			t.Errorf("round %d: stable %d, %v", round, v, err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestStoreReopenAndFormat(t *testing.T) {
	fs := vfs.NewMem()
	s, err := OpenStore(StoreOptions{Dir: "raft", FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs([]*raft.Log{mkLog(7), mkLog(8)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openMem(t, fs)
	checkEdges(t, s, 7, 8)
	checkLog(t, s, 8)
	if _, err := OpenStore(StoreOptions{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty Dir: %v", err)
	}
}

func TestDecodeLogCorrupt(t *testing.T) {
	good := encodeLog(mkLog(3))
	var l raft.Log
	if err := decodeLog(3, good, &l); err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{nil, good[:16], good[:len(good)-1], append(bytes.Clone(good), 0)} {
		if err := decodeLog(3, b, &l); err == nil {
			t.Errorf("%x decoded", b)
		}
	}
}

// TestStoreLogsRefusedWhenFull: with the filesystem under MinFreeBytes,
// StoreLogs returns ErrNoSpace (raft survives it) instead of letting
// pebble meet a full disk (fatal: the process would end); with space back
// it stores again.
func TestStoreLogsRefusedWhenFull(t *testing.T) {
	fs := vfs.NewMem()
	s, err := OpenStore(StoreOptions{Dir: "/meta", FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fs.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: MinFreeBytes - 1, TotalBytes: 1 << 30})
	if err := s.StoreLog(&raft.Log{Index: 1, Term: 1, Data: []byte("x")}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("StoreLog on a full disk: %v, want ErrNoSpace", err)
	}
	fs.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1 << 30, TotalBytes: 1 << 30})
	if err := s.StoreLog(&raft.Log{Index: 1, Term: 1, Data: []byte("x")}); err != nil {
		t.Fatalf("StoreLog with space back: %v", err)
	}
}
