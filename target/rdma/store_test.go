package rdma_test

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/initiatortest"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/store/storetest"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport/soft"
)

// storeTestBlocks is the test volume's size in 4 KiB blocks: 64 MiB.
const storeTestBlocks = 16384

// storeTarget is a target serving one volume of an extent store through a
// StoreIO on an RDMA port.
type storeTarget struct {
	*testTarget
	close func() // port, target, StoreIO, store; once
}

// newStoreTarget serves testSubNQN with one 64 MiB volume of an extent
// store in dir (16 KiB clusters, so requests cross clusters often)
// through a StoreIO (an io_uring per engine core), on a soft adapter on
// loopback with 2 cores.
func newStoreTarget(t *testing.T, dir string, cfg rdma.Config) *storeTarget {
	t.Helper()
	s, err := store.Open(store.Config{Dir: dir, ClusterBytes: 16 << 10, AreaBytes: 128 << 20, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Volume(1)
	if err != nil {
		if v, err = s.Create(1, store.CreateOptions{SizeBytes: storeTestBlocks * 4096, BlockSize: 4096}); err != nil {
			t.Fatal(err)
		}
	}
	sio, err := target.NewStoreIO(s, target.StoreIOConfig{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st := &storeTarget{testTarget: &testTarget{store: s, vol: v, sio: sio}}
	tt := st.testTarget
	if tt.t, err = target.New(target.Config{}); err != nil {
		t.Fatal(err)
	}
	if tt.sub, err = tt.t.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, Serial: "blk-test-1", Model: "blk test", Hosts: []string{testHostNQN}}); err != nil {
		t.Fatal(err)
	}
	if err = tt.sub.AddNamespace(target.NamespaceConfig{NSID: 1, Async: sio.Backend(v)}); err != nil {
		t.Fatal(err)
	}
	cfg.Addr = "127.0.0.1:0"
	if cfg.Cores == 0 {
		cfg.Cores = 2
	}
	if tt.port, err = rdma.Listen(tt.t, a, cfg); err != nil {
		t.Fatal(err)
	}
	tt.addr = tt.port.Addr().String()
	closed := false
	st.close = func() {
		if closed {
			return
		}
		closed = true
		tt.port.Close()
		tt.t.Close()
		sio.Close()
		a.Close()
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(st.close)
	return st
}

// TestStoreAsync: blk's initiator over the soft RDMA provider against a
// real extent store served asynchronously: seeded random reads, writes
// (some FUA), write zeroes (freeing whole clusters while other I/Os are
// in flight) and flushes at QD 64 over two queues, first into a fresh
// volume (first writes take the StoreIO's workers, FUA and flushes the
// core's sync workers: their completions come back to the core from
// those goroutines), then again over what is written (overwrites and
// reads go straight to the disk through each core's io_uring). Every
// read returns what was written; after a Flush, a clean close and a
// reopen, the volume holds exactly the last image.
func TestStoreAsync(t *testing.T) {
	seed := uint64(testSeed(t))
	dir := t.TempDir()
	st := newStoreTarget(t, dir, rdma.Config{})
	c := connectHost(t, st.addr, initiator.Config{Queues: 2, QueueDepth: 64})
	ns := c.Namespace(1)
	ops := 3000
	if testing.Short() {
		ops = 800
	}
	initiatortest.RandomWorkload(t, ns, seed, 64, ops)
	afterFirst := st.sio.Stats()
	all := initiatortest.RandomWorkload(t, ns, seed+1, 64, ops)
	ss := st.sio.Stats()
	ps := st.port.Stats()
	t.Logf("store I/O: first round %+v; both %+v; most I/Os at the disk on one core %d; poll-set wakes %d",
		afterFirst, ss, ps.DiskInFlightPeak, ps.Engine.PollWakes)
	if ss.Deferred == 0 || ss.Direct-afterFirst.Direct < uint64(ops)/4 {
		t.Fatalf("store I/O %+v (first round %+v): want first writes deferred and the second round's reads and overwrites direct", ss, afterFirst)
	}
	if ss.EngineErrs != 0 {
		t.Fatalf("engine errors: %+v", ss)
	}
	if ps.InCapsuleWrites == 0 || ps.CapsuleCopies != 0 {
		t.Fatalf("%d in-capsule writes, %d copied into a data buffer: want some, none copied (split receive buffers)", ps.InCapsuleWrites, ps.CapsuleCopies)
	}
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	st.close()

	storetest.Reopened(t, store.Config{Dir: dir, Logger: quietLogger{}}, 1, all)
}

// storePattern is the byte at offset off of the region the concurrency
// and disconnect tests write.
func storePattern(off int) byte { return byte(off*13 + off>>12) }

// writeRegion writes blocks [0, n) with storePattern, 128 KiB at a time,
// and flushes: every cluster of it is then allocated, so reads of it go
// to the disk.
func writeRegion(t *testing.T, ns *initiator.Namespace, n int) {
	t.Helper()
	buf := make([]byte, 128<<10)
	for off := 0; off < n*4096; off += len(buf) {
		for i := range buf {
			buf[i] = storePattern(off + i)
		}
		if _, err := ns.WriteAt(buf[:min(len(buf), n*4096-off)], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
}

// checkRegion reports the first byte of p, read at block lba, that does
// not hold storePattern; -1 if none.
func checkRegion(p []byte, lba uint64) int {
	base := int(lba) * 4096
	for i := range p {
		if p[i] != storePattern(base+i) {
			return i
		}
	}
	return -1
}

// TestStoreAsyncConcurrent: at queue depth 32 on one queue (so one
// engine core) the core has more than one read at the disk at once,
// which the synchronous path (every I/O served inline on the core's
// notification goroutine) can never have; and with the poller hook off
// (rdma.WithSyncDisk, the baseline) none goes through a core's engine.
// Rounds of 32 reads of 64 KiB run until the core's high-water mark of
// I/Os at the disk passes 1 (a round whose reads all completed before
// the next arrived shows 1; 200 rounds never doing so would mean the
// reads are not concurrent); every read is checked.
func TestStoreAsyncConcurrent(t *testing.T) {
	for _, sync := range []bool{false, true} {
		name := "async"
		cfg := rdma.Config{Cores: 1}
		if sync {
			name = "sync"
			cfg = rdma.WithSyncDisk(cfg)
		}
		t.Run(name, func(t *testing.T) {
			st := newStoreTarget(t, t.TempDir(), cfg)
			c := connectHost(t, st.addr, initiator.Config{Queues: 1, QueueDepth: 32})
			ns := c.Namespace(1)
			const region = 4096 // blocks: 16 MiB
			writeRegion(t, ns, region)
			rng := rand.New(rand.NewPCG(uint64(testSeed(t)), 5))
			bufs := make([][]byte, 32)
			for i := range bufs {
				bufs[i] = make([]byte, 64<<10)
			}
			before := st.sio.Stats()
			rounds := 0
			for ; rounds < 200 && (sync || st.port.Stats().DiskInFlightPeak < 2); rounds++ {
				if sync && rounds == 20 {
					break
				}
				lbas := make([]uint64, len(bufs))
				var cd countDone
				for i, b := range bufs {
					lbas[i] = uint64(rng.IntN(region - len(b)/4096))
					if err := ns.ReadAsync(lbas[i], b, &cd); err != nil {
						t.Fatal(err)
					}
				}
				deadline := time.Now().Add(30 * time.Second)
				for cd.done.Load() < int64(len(bufs)) {
					if time.Now().After(deadline) {
						t.Fatalf("round %d: %d of %d reads completed in 30 s", rounds, cd.done.Load(), len(bufs))
					}
					time.Sleep(100 * time.Microsecond)
				}
				if n := cd.failed.Load(); n != 0 {
					t.Fatalf("round %d: %d reads failed", rounds, n)
				}
				for i, b := range bufs {
					if j := checkRegion(b, lbas[i]); j >= 0 {
						t.Fatalf("round %d: read at block %d: byte %d is %#x, want %#x", rounds, lbas[i], j, b[j], storePattern(int(lbas[i])*4096+j))
					}
				}
			}
			after := st.sio.Stats()
			peak := st.port.Stats().DiskInFlightPeak
			t.Logf("%d rounds of 32 reads; most at the disk at once %d; store I/O %+v", rounds, peak, after)
			if sync {
				if peak != 0 || after.Requests != before.Requests || st.port.Stats().CapsuleCopies != 0 {
					t.Fatalf("poller hook off: %d I/Os at the disk at once, %d requests through an engine; want none", peak, after.Requests-before.Requests)
				}
				return
			}
			if peak < 2 {
				t.Fatalf("at QD 32 the core never had more than %d read at the disk in %d rounds", peak, rounds)
			}
			if after.Requests-before.Requests < uint64(rounds*len(bufs)) {
				t.Fatalf("%d of %d reads went through the core's engine", after.Requests-before.Requests, rounds*len(bufs))
			}
		})
	}
}

// otherHostNQN is a second host, whose queues share the target's core
// (and its data buffers) with testHostNQN's.
const otherHostNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002"

// readSlot is one read of TestStoreAsyncDisconnect's rounds: where it
// read, and whether it completed well.
type readSlot struct {
	lba  uint64
	ok   atomic.Bool
	done *countDone
}

func (s *readSlot) IODone(err error) {
	s.ok.Store(err == nil)
	s.done.IODone(err)
}

// TestStoreAsyncDisconnect: on a port of one core, one host's controller
// is torn down (the host is denied) while its 32 reads of 128 KiB of
// namespace 1 are at the disk, round after round, while a second host runs
// a seeded mixed workload on namespace 2 through the same core and its
// data buffers. A read's data buffer handed to the next command before
// the disk finished writing into it would corrupt that command's data
// (the second host's model check, namespace 1's region, which the first
// host reads back at the end, or a read that completed); a receive buffer
// given back twice panics in the engine. Every command the target took
// completes, and the first host is served again afterwards.
func TestStoreAsyncDisconnect(t *testing.T) {
	seed := uint64(testSeed(t))
	st := newStoreTarget(t, t.TempDir(), rdma.Config{Cores: 1})
	if err := st.sub.AllowHost(otherHostNQN); err != nil {
		t.Fatal(err)
	}
	v2, err := st.store.Create(2, store.CreateOptions{SizeBytes: 32 << 20, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.sub.AddNamespace(target.NamespaceConfig{NSID: 2, Async: st.sio.Backend(v2)}); err != nil {
		t.Fatal(err)
	}
	// The first host reads blocks [0, region) of namespace 1; the second
	// host's workload is namespace 2, which it models itself.
	const region = 4096
	a := connectHost(t, st.addr, initiator.Config{Queues: 1, QueueDepth: 32})
	writeRegion(t, a.Namespace(1), region)
	a.Close()
	b := connectHost(t, st.addr, initiator.Config{HostNQN: otherHostNQN, Queues: 1, QueueDepth: 16})

	stop := make(chan struct{})
	errc := make(chan error, 1)
	var atDisk, rounds int
	go func() {
		errc <- func() error {
			rng := rand.New(rand.NewPCG(seed, 29))
			bufs := make([][]byte, 32)
			slots := make([]readSlot, len(bufs))
			for i := range bufs {
				bufs[i] = make([]byte, 128<<10)
			}
			for ; ; rounds++ {
				select {
				case <-stop:
					return nil
				default:
				}
				c, err := connectHostErr(st.addr, initiator.Config{Adapter: hostAdapter(t), Queues: 1, QueueDepth: 32})
				if err != nil {
					return err
				}
				ns := c.Namespace(1)
				var cd countDone
				for i, buf := range bufs {
					s := &slots[i]
					s.lba, s.done = uint64(rng.IntN(region-len(buf)/4096)), &cd
					s.ok.Store(false)
					if err := ns.ReadAsync(s.lba, buf, s); err != nil {
						c.Close()
						return err
					}
				}
				// Deny once the core has reads at the disk (or all 32
				// have completed: the disk was too quick this round).
				deadline := time.Now().Add(10 * time.Second)
				for st.port.Stats().DiskInFlight == 0 && cd.done.Load() < int64(len(bufs)) {
					if time.Now().After(deadline) {
						c.Close()
						return fmt.Errorf("round %d: no read at the disk and %d of %d done after 10 s", rounds, cd.done.Load(), len(bufs))
					}
					time.Sleep(20 * time.Microsecond)
				}
				if cd.done.Load() < int64(len(bufs)) {
					atDisk++
				}
				if err := st.sub.DenyHost(testHostNQN); err != nil {
					c.Close()
					return err
				}
				c.Close()
				for i := range slots {
					if s := &slots[i]; s.ok.Load() {
						if j := checkRegion(bufs[i], s.lba); j >= 0 {
							return fmt.Errorf("round %d: a read at block %d that completed: byte %d is %#x, want %#x",
								rounds, s.lba, j, bufs[i][j], storePattern(int(s.lba)*4096+j))
						}
					}
				}
				if err := st.sub.AllowHost(testHostNQN); err != nil {
					return err
				}
			}
		}()
	}()
	ops := 3000
	if testing.Short() {
		ops = 1000
	}
	initiatortest.RandomWorkload(t, b.Namespace(2), seed, 16, ops)
	close(stop)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rounds, %d denied with reads at the disk", rounds, atDisk)
	if atDisk == 0 {
		t.Fatalf("no round was denied with reads at the disk (%d rounds)", rounds)
	}
	deadline := time.Now().Add(30 * time.Second)
	for s := st.t.Stats(); s.Executed != s.Completed+uint64(s.Controllers); s = st.t.Stats() {
		// Each live controller holds one Asynchronous Event Request.
		if time.Now().After(deadline) {
			t.Fatalf("executed %d, completed %d, %d controllers", s.Executed, s.Completed, s.Controllers)
		}
		time.Sleep(time.Millisecond)
	}
	a = connectHost(t, st.addr, initiator.Config{Queues: 1, QueueDepth: 32})
	got := make([]byte, region*4096)
	if _, err := a.Namespace(1).ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := checkRegion(got, 0); i >= 0 {
		t.Fatalf("after the rounds: byte %d of the region is %#x, want %#x", i, got[i], storePattern(i))
	}
}

// TestStoreInCapsuleZeroCopy: 4 KiB overwrites arriving in the command
// capsule go from the receive buffer they landed in straight to the disk
// through the core's engine: no copy into a data buffer (the receive
// buffers are split, the data on a page of its own), none handed to the
// StoreIO's workers. With in-capsule data that is not a whole number of
// pages (8208 bytes: the receive buffer is one piece, the data 64 bytes
// into it) a write whose data is not on a page is copied once into an
// aligned data buffer, and still goes to the disk from the core. Every block reads back what
// was last written to it.
func TestStoreInCapsuleZeroCopy(t *testing.T) {
	for _, tc := range []struct {
		name      string
		inCapsule uint32
		copies    bool
	}{{"split", 0, false}, {"unsplit", 8192 + 16, true}} {
		t.Run(tc.name, func(t *testing.T) {
			seed := uint64(testSeed(t))
			rng := rand.New(rand.NewPCG(seed, 0))
			st := newStoreTarget(t, t.TempDir(), rdma.Config{InCapsule: tc.inCapsule, Cores: 1})
			c := connectHost(t, st.addr, initiator.Config{Queues: 1, QueueDepth: 16})
			ns := c.Namespace(1)
			const region = 256 // blocks: 16 clusters, written once
			writeRegion(t, ns, region)
			want := make([]byte, region*4096)
			for i := range want {
				want[i] = storePattern(i)
			}
			ps0, ss0 := st.port.Stats(), st.sio.Stats()
			const writes = 200
			for range writes {
				lba := rng.IntN(region)
				blk := want[lba*4096 : (lba+1)*4096]
				for i := range blk {
					blk[i] = byte(rng.Uint32())
				}
				if _, err := ns.WriteAt(blk, int64(lba)*4096); err != nil {
					t.Fatal(err)
				}
			}
			ps, ss := st.port.Stats(), st.sio.Stats()
			inCap, copies := ps.InCapsuleWrites-ps0.InCapsuleWrites, ps.CapsuleCopies-ps0.CapsuleCopies
			t.Logf("%d writes: %d in the capsule, %d copied; store I/O before %+v after %+v", writes, inCap, copies, ss0, ss)
			if inCap != writes {
				t.Fatalf("%d of %d 4 KiB writes came in the capsule", inCap, writes)
			}
			// Unsplit, a receive buffer of 8272 bytes whose data happens
			// to start on a page (one in 256) needs no copy: most are
			// copied, never more than one per write.
			if tc.copies && (copies <= writes/2 || copies > writes) || !tc.copies && copies != 0 {
				t.Fatalf("%d of %d in-capsule writes copied into a data buffer, want %s", copies, writes, map[bool]string{true: "most", false: "none"}[tc.copies])
			}
			if d := ss.Deferred - ss0.Deferred; d != 0 {
				t.Fatalf("%d overwrites went to the StoreIO's workers, want every one direct", d)
			}
			if r := ss.Requests - ss0.Requests; r != writes {
				t.Fatalf("%d of %d overwrites went to the disk through the core's engine", r, writes)
			}
			got := make([]byte, len(want))
			if _, err := ns.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("block %d byte %d: read %#x, wrote %#x", i/4096, i%4096, got[i], want[i])
				}
			}
		})
	}
}
