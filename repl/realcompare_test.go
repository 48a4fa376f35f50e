package repl

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
)

// TestRealRebuildCompare: the compare rebuild of blkd's returning
// primary (e2e TestClusterFailover step 1) on real stores and a real
// replica connection, under a host's random writes. Each round, seeded:
// two stores that agree on most of a volume and differ in seeded places
// (data on one side only, other data on each, a hole on one side: what
// writes in flight at a SIGKILL and maps lost with it leave); the
// primary's store behind a Backend served over NVMe/TCP to a host, the
// replica's store served over NVMe/TCP to the Backend's leg; a compare
// rebuild (the replica's digests read from its store, as its node's
// checksum route does) throttled so that it lasts while the host runs
// seeded reads, writes (some FUA), write zeroes and flushes at QD 32 on
// the primary, then more once the replica is in sync. Then the two
// stores hold the same bytes everywhere, and what the host read last.
func TestRealRebuildCompare(t *testing.T) {
	seed := testSeed(t)
	rounds := 4
	if testing.Short() {
		rounds = 1
	}
	for round := range rounds {
		realRebuildCompare(t, seed+uint64(round))
	}
}

func realRebuildCompare(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 31))
	open := func() (*store.Volume, *target.StoreIO) {
		s, err := store.Open(store.Config{Dir: filepath.Join(t.TempDir(), "meta"), ClusterBytes: 16 << 10, AreaBytes: 64 << 20, Logger: quietLogger{}})
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.Create(1, store.CreateOptions{SizeBytes: realBlocks * testBlock, BlockSize: testBlock})
		if err != nil {
			t.Fatal(err)
		}
		sio, err := target.NewStoreIO(s, target.StoreIOConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			sio.Close()
			_ = s.Close()
		})
		return v, sio
	}
	pv, psio := open()
	rv, rsio := open()

	// Agreement with seeded differences.
	for range 300 {
		lba, n := rng.Uint64N(realBlocks-16), 1+rng.Uint64N(16)
		data := make([]byte, n*testBlock)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		switch k := rng.IntN(20); {
		case k < 15: // on both
			mustWrite(t, pv, lba, data)
			mustWrite(t, rv, lba, data)
		case k < 17: // on the primary only (the replica lost it)
			mustWrite(t, pv, lba, data)
		case k < 18: // on the replica only (the old primary's write in flight)
			mustWrite(t, rv, lba, data)
		case k < 19: // other data on each
			mustWrite(t, pv, lba, data)
			data[0] ^= 0xff
			mustWrite(t, rv, lba, data)
		default: // a hole on the primary
			if err := pv.Deallocate(lba, n); err != nil {
				t.Fatal(err)
			}
		}
	}

	raddr, _ := serve(t, rsio.Backend(rv))
	leg := connect(t, raddr, initiator.Config{Queues: 2, QueueDepth: 64})
	b, err := New(Config{Local: psio.Backend(pv), Reporter: &okReporter{}, Epoch: 2, Depth: 128})
	if err != nil {
		t.Fatal(err)
	}
	haddr, _ := serve(t, b)
	host := connect(t, haddr, initiator.Config{Queues: 2, QueueDepth: 32})

	remote := DigestSource{Mapped: rv.Mapped, Read: rv.Read, BlockShift: 12, Blocks: realBlocks}
	rb, err := b.StartRebuild(2, RebuildConfig{Node: "replica", NS: leg, MaxTransfer: leg.Controller().Info().MaxTransfer,
		Mapped: pv.Mapped, Read: pv.Read, RegionBytes: 256 << 10,
		Rate: 24 << 20, // about a second for the volume's digests and the copy: the host writes meanwhile
		RemoteDigests: func(ctx context.Context, lba uint64, out []Digest) error {
			_, err := remote.Digests(lba, DigestRegionBytes/testBlock, nil, out)
			return err
		},
		Promote: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if rb.Mode() != "compare" {
		t.Fatalf("mode %q", rb.Mode())
	}
	ops := 1500
	if testing.Short() {
		ops = 500
	}
	initiatortest.RandomWorkload(t, host, seed, 32, ops)
	select {
	case <-rb.Done():
		t.Logf("seed %d: the rebuild ended before the host's writes did: not raced", seed)
	default:
	}
	if err := waitRebuild(t, rb); err != nil {
		t.Fatalf("seed %d: rebuild: %v", seed, err)
	}
	all := initiatortest.RandomWorkload(t, host, seed+1000, 32, ops/3) // in sync now
	if err := host.Flush(); err != nil {
		t.Fatal(err)
	}
	st := b.Stats()
	if len(st.Peers) != 1 || st.Peers[0].State != "in-sync" || st.Peers[0].Failures != 0 {
		t.Fatalf("seed %d: stats %+v", seed, st)
	}
	local, repl := make([]byte, len(all)), make([]byte, len(all))
	for lba := uint64(0); lba < realBlocks; lba += 256 {
		if err := pv.Read(lba, local[lba*testBlock:(lba+256)*testBlock]); err != nil {
			t.Fatal(err)
		}
		if err := rv.Read(lba, repl[lba*testBlock:(lba+256)*testBlock]); err != nil {
			t.Fatal(err)
		}
	}
	if i := firstDiff(local, all); i >= 0 {
		t.Fatalf("seed %d: the primary's store differs from what the host read at block %d", seed, i/testBlock)
	}
	if i := firstDiff(repl, local); i >= 0 {
		t.Fatalf("seed %d: after the compare rebuild the replica differs from the primary at block %d", seed, i/testBlock)
	}
	t.Logf("seed %d: %d of %d bytes differed, %d copied; %d writes on the leg", seed, rb.Differ(), realBlocks*testBlock, rb.Copied(), st.Peers[0].Writes)
}

func mustWrite(t *testing.T, v *store.Volume, lba uint64, data []byte) {
	t.Helper()
	if err := v.Write(lba, data, 0); err != nil {
		t.Fatal(err)
	}
}
