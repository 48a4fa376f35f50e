package tcp_test

import (
	"testing"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/store/storetest"
	"github.com/blk-project/blk/target"
)

// newStoreTarget serves testSubNQN with one 64 MiB volume of an extent
// store in dir (16 KiB clusters, so requests cross clusters often) through
// a StoreIO: an io_uring per poll group, 2 poll groups.
func newStoreTarget(t *testing.T, dir string) (*testTarget, *target.StoreIO, func()) {
	t.Helper()
	s, err := store.Open(store.Config{Dir: dir, ClusterBytes: 16 << 10, AreaBytes: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Volume(1)
	if err != nil {
		if v, err = s.Create(1, store.CreateOptions{SizeBytes: testBlocks * testBlock, BlockSize: testBlock}); err != nil {
			t.Fatal(err)
		}
	}
	sio, err := target.NewStoreIO(s, target.StoreIOConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tt := serveAsync(t, sio.Backend(v))
	closed := false
	closeAll := func() {
		if closed {
			return
		}
		closed = true
		tt.port.Close()
		tt.t.Close()
		sio.Close()
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(closeAll)
	return tt, sio, closeAll
}

// TestStoreAsync: blk's initiator over NVMe/TCP against a real extent
// store served asynchronously: seeded random reads, writes (some FUA),
// write zeroes (freeing whole clusters while other I/Os are in flight)
// and flushes at QD 64 over two queues, first into a fresh volume (first
// writes take the workers), then again over what is written (overwrites
// and reads go straight to the disk through each poll group's engine).
// Every read returns what was written; after a Flush, a clean close and a
// reopen, the volume holds exactly the last image.
func TestStoreAsync(t *testing.T) {
	seed := testSeed(t)
	dir := t.TempDir()
	tt, sio, closeAll := newStoreTarget(t, dir)
	c := connectTCP(t, tt.addr, initiator.Config{Queues: 2, QueueDepth: 64})
	ns := c.Namespace(1)
	ops := 3000
	if testing.Short() {
		ops = 800
	}
	initiatortest.RandomWorkload(t, ns, seed, 64, ops)
	afterFirst := sio.Stats()
	all := initiatortest.RandomWorkload(t, ns, seed+1, 64, ops)
	st := sio.Stats()
	t.Logf("store I/O: first round %+v; both %+v", afterFirst, st)
	if st.Deferred == 0 || st.Direct-afterFirst.Direct < uint64(ops)/4 {
		t.Fatalf("store I/O %+v (first round %+v): want first writes deferred and the second round's reads and overwrites direct", st, afterFirst)
	}
	if st.EngineErrs != 0 {
		t.Fatalf("engine errors: %+v", st)
	}
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	closeAll()

	storetest.Reopened(t, store.Config{Dir: dir}, 1, all)
}
