package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Partial clusters (docs/snapshots.md §1.3, "Sub-cluster redirect"). The
// stores here have 16 KiB clusters: 4 sub-blocks of 4 KiB.

// wantTags checks that volume id's blocks read the tags of want (4 KiB
// blocks, tagged with the volume ID 1 by partialFill), one Read of all of
// them and one Read per block.
func wantTags(t *testing.T, s *Store, id ID, want []uint64) {
	t.Helper()
	v, err := s.Volume(id)
	if err != nil {
		t.Fatal(err)
	}
	all := alignedBuf(len(want)*4096, 4096)
	if err := v.Read(0, all); err != nil {
		t.Fatalf("object %d: read: %v", id, err)
	}
	one := alignedBuf(4096, 4096)
	for b, w := range want {
		if err := v.Read(uint64(b), one); err != nil {
			t.Fatalf("object %d block %d: %v", id, b, err)
		}
		for _, buf := range [][]byte{all[b*4096 : (b+1)*4096], one} {
			got, err := readTag(buf, 1, uint64(b))
			if err != nil || got != w {
				t.Fatalf("object %d block %d: tag %d (%v), want %d", id, b, got, err, w)
			}
		}
	}
}

func partialWrite(t *testing.T, s *Store, id ID, block, tag uint64) {
	t.Helper()
	v, err := s.Volume(id)
	if err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(4096, 4096)
	fillTagged(buf, 1, block, tag)
	if err := v.Write(block, buf, 0); err != nil {
		t.Fatalf("object %d: write block %d: %v", id, block, err)
	}
}

func entryOf(t *testing.T, s *Store, id ID, idx uint64) uint64 {
	t.Helper()
	v, err := s.Volume(id)
	if err != nil {
		t.Fatal(err)
	}
	return v.m.get(idx)
}

// TestPartialClusters walks partial clusters through what can happen to
// them: a 4 KiB write into a snapshot's cluster is redirected (partial,
// one sub-block); a snapshot takes the partial cluster, and a write after
// it makes a partial cluster over a partial one; a clone reads through
// it; deleting the oldest snapshot merges it into its child, whose partial
// cluster read the merged one's bytes: filled first; a flatten fills the
// clone's own partial cluster; a revert drops the volume's. Every object
// reads what it must after each step and after a reopen, and Check
// passes.
func TestPartialClusters(t *testing.T) {
	fs := vfs.NewMem()
	area := NewMemArea(64*(16<<10), 4096, 4096)
	cfg := memConfig(fs, area)
	s := openStore(t, cfg)
	mustCreate(t, s, 1, 8, BlockSize4K)
	for b := range uint64(8) {
		partialWrite(t, s, 1, b, 1)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Snapshot(1, 10))
	partialWrite(t, s, 1, 1, 2)
	if e := entryOf(t, s, 1, 0); e&partial == 0 || maskOf(e) != 0b10 {
		t.Fatalf("after a 4 KiB write into the snapshot's cluster: entry %#x, want partial 0b10", e)
	}
	if st := s.Stats(); st.Redirects != 1 {
		t.Fatalf("redirects %d, want 1", st.Redirects)
	}
	must(s.Snapshot(1, 11))
	partialWrite(t, s, 1, 2, 3)
	if e := entryOf(t, s, 1, 0); e&(partial|inherited) != partial || maskOf(e) != 0b100 {
		t.Fatalf("a write over the snapshot's partial cluster: entry %#x, want own partial 0b100", e)
	}
	must(s.Clone(11, 20))
	partialWrite(t, s, 20, 3, 9) // the clone's own partial cluster over the snapshot's
	v1 := []uint64{1, 2, 3, 1, 1, 1, 1, 1}
	s11 := []uint64{1, 2, 1, 1, 1, 1, 1, 1}
	c20 := []uint64{1, 2, 1, 9, 1, 1, 1, 1}
	s10 := []uint64{1, 1, 1, 1, 1, 1, 1, 1}
	check := func(step string) {
		t.Helper()
		wantTags(t, s, 1, v1)
		wantTags(t, s, 11, s11)
		wantTags(t, s, 20, c20)
		if s10 != nil {
			wantTags(t, s, 10, s10)
		}
		if err := s.Check(); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	check("made")
	// The flush commits the deferred keys; a reopen reads them back.
	must(s.Close())
	s = openStore(t, cfg)
	check("reopened")
	// Delete snapshot 10: it merges into 11, whose partial cluster lacks
	// sub-blocks 0, 2 and 3, which it read from 10's cluster.
	must(s.Delete(10))
	s10 = nil
	if e := entryOf(t, s, 11, 0); !inPlace(e) {
		t.Fatalf("snapshot 11's cluster after the merge of its parent: %#x, want whole (filled)", e)
	}
	check("merged")
	must(s.Close())
	s = openStore(t, cfg)
	check("merged, reopened")
	// Flatten the clone: its own partial cluster is filled, the rest copied.
	c, err := s.Volume(20)
	must(err)
	must(c.Flatten(context.Background(), nil))
	if e := entryOf(t, s, 20, 0); !inPlace(e) {
		t.Fatalf("the clone's cluster after a flatten: %#x, want whole", e)
	}
	check("flattened")
	// Revert the volume to 11: its partial cluster goes.
	must(s.Revert(1, 11, 0))
	v1 = s11
	check("reverted")
	must(s.Close())
	s = openStore(t, cfg)
	check("reverted, reopened")
	_ = s.Close()
}

// TestPartialCrash: a redirected write whose key was deferred, crashed
// before any flush (every byte the area and pebble's files were given
// kept), reads the snapshot's bytes after Open, and the cluster it took is
// free and zeroed again; once flushed, it reads the write's bytes.
func TestPartialCrash(t *testing.T) {
	for _, flushed := range []bool{false, true} {
		t.Run(fmt.Sprintf("flushed=%v", flushed), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			area := NewMemArea(64*(16<<10), 512, 512)
			cfg := memConfig(fs, area)
			cfg.SyncInterval = -1 // no background flush: the test says when
			s := openStore(t, cfg)
			mustCreate(t, s, 1, 8, BlockSize4K)
			for b := range uint64(8) {
				partialWrite(t, s, 1, b, 1)
			}
			if err := s.Snapshot(1, 10); err != nil {
				t.Fatal(err)
			}
			partialWrite(t, s, 1, 5, 2)
			if flushed {
				if err := s.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			want := []uint64{1, 1, 1, 1, 1, 1, 1, 1}
			if flushed {
				want[5] = 2
			}
			wantTags(t, s, 1, []uint64{1, 1, 1, 1, 1, 2, 1, 1})
			fsClone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(1, 1))})
			areaClone := area.CrashClone(rand.New(rand.NewPCG(1, 2)), 100)
			_ = s.Close()
			cfg.FS, cfg.Area = fsClone, areaClone
			s = openStore(t, cfg)
			wantTags(t, s, 1, want)
			wantTags(t, s, 10, []uint64{1, 1, 1, 1, 1, 1, 1, 1})
			if err := s.Check(); err != nil {
				t.Fatal(err)
			}
			if !flushed {
				// The cluster the write took went back: every other
				// cluster handed out reads zeros first.
				if st := s.Stats(); st.ZeroedAtOpen == 0 {
					t.Fatalf("Open zeroed no cluster: the redirect's cluster kept its bytes")
				}
			}
			_ = s.Close()
		})
	}
}

// TestPartialDirect: the direct path's redirect. A 4 KiB write into an
// inherited cluster, then into the partial cluster it made, each one
// segment and the entry published at EndDirect; a write whose I/O failed
// publishes nothing (the volume reads the snapshot's bytes there), gives
// a redirect's cluster back (limbo), and releases the claim (a write of
// the index afterwards does not wait).
func TestPartialDirect(t *testing.T) {
	s := openStore(t, memConfig(vfs.NewMem(), NewMemArea(64*(16<<10), 4096, 4096)))
	v := mustCreate(t, s, 1, 8, BlockSize4K)
	for b := range uint64(8) {
		partialWrite(t, s, 1, b, 1)
	}
	if err := s.Snapshot(1, 10); err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(4096, 4096)
	segs := make([]Segment, 4)
	direct := func(block, tag uint64, ioErr error) Segment {
		t.Helper()
		fillTagged(buf, 1, block, tag)
		n, k, err := v.BeginDirect(true, block, buf, segs)
		if err != nil || k != DirectIO || n != 1 {
			t.Fatalf("block %d: BeginDirect %d %v %v, want one segment", block, n, k, err)
		}
		if ioErr == nil {
			if err := s.area.WriteAt(buf, segs[0].Off); err != nil {
				t.Fatal(err)
			}
		}
		if err := v.EndDirect(true, block, 4096, ioErr); (err != nil) != (ioErr != nil) {
			t.Fatalf("block %d: EndDirect %v, I/O error %v", block, err, ioErr)
		}
		return segs[0]
	}
	sg := direct(5, 2, nil)
	if e := v.m.get(1); e&(partial|inherited) != partial || maskOf(e) != 0b10 || int64(physOf(e))<<14+4096 != sg.Off {
		t.Fatalf("after a direct 4 KiB write into an inherited cluster: entry %#x, segment at %d", v.m.get(1), sg.Off)
	}
	sg2 := direct(6, 3, nil)
	if e := v.m.get(1); maskOf(e) != 0b110 || sg2.Off != sg.Off+4096 {
		t.Fatalf("a second direct write into the partial cluster: entry %#x, segment at %d (first at %d)", e, sg2.Off, sg.Off)
	}
	limbo := s.Stats().Limbo
	direct(7, 4, fmt.Errorf("injected"))
	direct(0, 4, fmt.Errorf("injected"))
	if e := v.m.get(1); maskOf(e) != 0b110 {
		t.Fatalf("after a failed write into the partial cluster: entry %#x, want the mask unchanged", e)
	}
	if e := v.m.get(0); e&inherited == 0 {
		t.Fatalf("after a failed redirect: entry %#x, want inherited still", e)
	}
	if got := s.Stats().Limbo; got != limbo+1 {
		t.Fatalf("limbo %d after a failed redirect, want %d", got, limbo+1)
	}
	wantTags(t, s, 1, []uint64{1, 1, 1, 1, 1, 2, 3, 1})
	partialWrite(t, s, 1, 7, 5) // the claim was released: no wait
	partialWrite(t, s, 1, 0, 5)
	wantTags(t, s, 1, []uint64{5, 1, 1, 1, 1, 2, 3, 5})
	wantTags(t, s, 10, []uint64{1, 1, 1, 1, 1, 1, 1, 1})
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}
