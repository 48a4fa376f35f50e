package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport/soft"
)

// End-to-end: our initiator against our target over the soft transport on
// loopback, in one process (and, in TestTwoProcesses, in two).

func testSeed(t testing.TB) int64 {
	seed := time.Now().UnixNano()
	if s := os.Getenv("BLK_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (rerun with BLK_SEED=%d)", seed, seed)
		}
	})
	return seed
}

func hostAdapter(t testing.TB) *soft.Adapter {
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func connectHost(t testing.TB, addr string, cfg initiator.Config) *initiator.Controller {
	t.Helper()
	if cfg.Adapter == nil {
		cfg.Adapter = hostAdapter(t)
	}
	c, err := connectHostErr(addr, cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// connectHostErr connects to testSubNQN at addr as testHostNQN unless cfg
// names a host, within 30 s; the caller closes the controller. Any
// goroutine may call it.
func connectHostErr(addr string, cfg initiator.Config) (*initiator.Controller, error) {
	if cfg.HostNQN == "" {
		cfg.HostNQN = testHostNQN
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return initiator.Connect(ctx, cfg, addr, testSubNQN)
}

// TestEndToEndData writes seeded random extents (one block to several
// MaxTransfers, so the initiator splits them) from several goroutines over
// four I/O queues, keeps a model, and reads everything back; then
// deallocates and zeroes ranges and checks they read as zeros.
func TestEndToEndData(t *testing.T) {
	seed := testSeed(t)
	tt := newTestTarget(t, rdma.Config{})
	c := connectHost(t, tt.addr, initiator.Config{Queues: 4, QueueDepth: 32})
	ns := c.Namespace(1)
	if ns == nil {
		t.Fatalf("namespace 1 not found; namespaces: %d", len(c.Namespaces()))
	}
	if ns.BlockSize() != 4096 || ns.Size() != 64<<20 {
		t.Fatalf("namespace: block %d size %d", ns.BlockSize(), ns.Size())
	}
	const bs = 4096
	blocks := int(ns.Size() / bs)
	model := make([]byte, ns.Size())
	// Each writer owns a disjoint quarter, so the model needs no order.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(w)))
			lo, span := w*blocks/4, blocks/4
			for i := 0; i < 60; i++ {
				n := 1 + rng.Intn(80) // up to 320 KiB: split at 128 KiB
				if rng.Intn(4) == 0 {
					n = 1
				}
				lba := lo + rng.Intn(span-n)
				buf := make([]byte, n*bs)
				rng.Read(buf)
				var err error
				if rng.Intn(3) == 0 {
					_, err = ns.WriteAtFlags(buf, int64(lba)*bs, initiator.FUA)
				} else {
					_, err = ns.WriteAt(buf, int64(lba)*bs)
				}
				if err != nil {
					errs <- err
					return
				}
				copy(model[lba*bs:], buf)
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(model))
	for off := 0; off < len(got); off += 1 << 20 {
		if _, err := ns.ReadAt(got[off:off+1<<20], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if i := firstDiff(got, model); i >= 0 {
		t.Fatalf("read back differs from the model at byte %d (block %d)", i, i/bs)
	}

	// Deallocate and Write Zeroes read back as zeros; neighbours keep data.
	done := make(initiator.DoneChan, 2)
	if err := ns.DeallocateAsync([]initiator.Range{{LBA: 10, Blocks: 5}, {LBA: 100, Blocks: 1}}, done); err != nil {
		t.Fatal(err)
	}
	if err := ns.WriteZeroesAsync(200, 7, done); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range [][2]int{{10, 5}, {100, 1}, {200, 7}} {
		clear(model[r[0]*bs : (r[0]+r[1])*bs])
	}
	if _, err := ns.ReadAt(got[:1<<20], 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got[:1<<20], model[:1<<20]); i >= 0 {
		t.Fatalf("after deallocate/write zeroes: differs at byte %d (block %d)", i, i/bs)
	}
	st := tt.port.Stats()
	t.Logf("port: %d commands, %d in-capsule writes, %d RDMA reads, %d RDMA writes, %d waited for a buffer",
		st.Commands, st.InCapsuleWrites, st.RDMAReads, st.RDMAWrites, st.DataWaits)
	if st.InCapsuleWrites == 0 || st.RDMAReads == 0 || st.RDMAWrites == 0 {
		t.Errorf("expected in-capsule writes, RDMA reads and RDMA writes: %+v", st)
	}
}

// cstr is a NUL- or space-padded ASCII field as a string.
func cstr(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(bytes.TrimRight(b, " "))
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// TestHostNotAllowed: a host NQN missing from the subsystem's list is
// refused at Connect with Connect Invalid Host (DNR); allowing it lets it in.
func TestHostNotAllowed(t *testing.T) {
	tt := newTestTarget(t, rdma.Config{})
	const other = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000ff"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := initiator.Connect(ctx, initiator.Config{Adapter: hostAdapter(t), HostNQN: other, CtrlLossTimeout: time.Second}, tt.addr, testSubNQN)
	var se *initiator.StatusError
	if !errors.As(err, &se) || se.Status&^nvme.StatusDNR != nvme.StatusConnectInvalidHost || !se.DNR() {
		t.Fatalf("connect of a host not allowed: %v, want Connect Invalid Host with DNR", err)
	}
	if err := tt.sub.AllowHost(other); err != nil {
		t.Fatal(err)
	}
	connectHost(t, tt.addr, initiator.Config{HostNQN: other})
}

// TestDiscovery: the discovery controller lists the subsystem on this
// port for an allowed host, and nothing for another.
func TestDiscovery(t *testing.T) {
	tt := newTestTarget(t, rdma.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	entries, err := initiator.Discover(ctx, initiator.Config{Adapter: hostAdapter(t), HostNQN: testHostNQN}, tt.addr)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	host, svc := tt.port.Addr().String(), ""
	for i := len(host) - 1; i >= 0; i-- {
		if host[i] == ':' {
			host, svc = host[:i], host[i+1:]
			break
		}
	}
	for _, e := range entries {
		if e.SubNQN.String() == testSubNQN {
			found = true
			addr, port := cstr(e.TrAddr[:]), cstr(e.TrSvcID[:])
			if e.TrType != nvme.TrTypeRDMA || addr != host || port != svc {
				t.Errorf("entry: trtype %d addr %q svc %q, want RDMA %q %q", e.TrType, addr, port, host, svc)
			}
		}
	}
	if !found {
		t.Fatalf("discovery log of %d entries lacks %s", len(entries), testSubNQN)
	}
	other, err := initiator.Discover(ctx, initiator.Config{Adapter: hostAdapter(t), HostNQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000aa"}, tt.addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range other {
		if e.SubNQN.String() == testSubNQN {
			t.Errorf("discovery shows %s to a host that may not connect", testSubNQN)
		}
	}
}

// TestManyQueuesAndDepth: eight I/O queues of depth 4 (the controller
// grants them all); 64 reads submitted as fast as possible never have more
// than 8 × 4 in flight at once — a submission finding every queue full is
// refused with ErrQueueFull — and every accepted one completes correctly.
func TestManyQueuesAndDepth(t *testing.T) {
	tt := newTestTarget(t, rdma.Config{})
	c := connectHost(t, tt.addr, initiator.Config{Queues: 8, QueueDepth: 4})
	if got := c.Info().IOQueues; got != 8 {
		t.Fatalf("I/O queues %d, want 8", got)
	}
	ns := c.Namespace(1)
	done := make(initiator.DoneChan, 64)
	bufs := make([][]byte, 64)
	submitted, full, maxInFlight := 0, 0, 0
	for i := range bufs {
		bufs[i] = make([]byte, 4096)
		err := ns.ReadAsync(uint64(i), bufs[i], done)
		switch {
		case err == nil:
			submitted++
			// Completed ones have pushed into done; the rest hold slots.
			maxInFlight = max(maxInFlight, submitted-len(done))
		case errors.Is(err, initiator.ErrQueueFull):
			full++
		default:
			t.Fatal(err)
		}
	}
	// A slot is freed just before its callback runs, so a completion
	// being delivered (at most one per host engine core at a time) may
	// still count as in flight here.
	if slack := runtime.NumCPU(); maxInFlight > 32+slack {
		t.Fatalf("%d reads in flight at once on 8 queues of depth 4", maxInFlight)
	}
	for i := 0; i < submitted; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d submitted (at most %d in flight), %d refused with ErrQueueFull", submitted, maxInFlight, full)
}

// TestPortRestart closes the port under a connected host with I/O going,
// then listens again on the same address: Close returns with every
// connection gone, the host's blocking I/O waits through the outage and
// completes once it has reconnected, and the data is intact.
func TestPortRestart(t *testing.T) {
	tt := newTestTarget(t, rdma.Config{})
	c := connectHost(t, tt.addr, initiator.Config{Queues: 2, QueueDepth: 8,
		ReconnectDelay: 50 * time.Millisecond, MaxReconnectDelay: 200 * time.Millisecond, CtrlLossTimeout: 30 * time.Second})
	ns := c.Namespace(1)
	want := bytes.Repeat([]byte{0xA5, 0x5A, 0x01, 0x02}, 1<<16) // 256 KiB
	if _, err := ns.WriteAt(want, 1<<20); err != nil {
		t.Fatal(err)
	}
	a := hostAdapter(t) // a fresh adapter for the new port
	start := time.Now()
	if err := tt.port.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Port.Close took %v with a host connected", d)
	}
	done := make(chan error, 1)
	got := make([]byte, len(want))
	go func() { _, err := ns.ReadAt(got, 1<<20); done <- err }()
	time.Sleep(100 * time.Millisecond) // the read meets the outage
	port, err := rdma.Listen(tt.t, a, rdma.Config{Addr: tt.addr, Cores: 2})
	if err != nil {
		t.Fatal(err)
	}
	tt.port = port
	t.Cleanup(func() { port.Close() }) // before its adapter is closed
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("read across the restart: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("read did not complete after the port came back")
	}
	if !bytes.Equal(got, want) {
		t.Fatal("data read after the restart differs")
	}
	if st := c.Stats(); st.Associations < 2 {
		t.Errorf("host did not reconnect: %+v", st)
	}
}

// TestDeepQueueLargeIO fills one queue of 128 entries with 128 KiB writes
// and then reads, more than the core's 64 large data buffers: commands
// wait for buffers in order (DataWaits), none is lost, the data is right.
func TestDeepQueueLargeIO(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewSource(seed))
	tt := newTestTarget(t, rdma.Config{})
	c := connectHost(t, tt.addr, initiator.Config{Queues: 1, QueueDepth: 128})
	ns := c.Namespace(1)
	const n, size = 128, 128 << 10
	bufs := make([][]byte, n)
	done := make(initiator.DoneChan, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
		rng.Read(bufs[i])
		if err := ns.WriteAsync(uint64(i*size/4096), bufs[i], 0, done); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for i := 0; i < n; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	got := make([][]byte, n)
	for i := range got {
		got[i] = make([]byte, size)
		if err := ns.ReadAsync(uint64(i*size/4096), got[i], done); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	for i := 0; i < n; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for i := range got {
		if !bytes.Equal(got[i], bufs[i]) {
			t.Fatalf("extent %d read back differs", i)
		}
	}
	if st := tt.port.Stats(); st.DataWaits == 0 {
		t.Logf("no command waited for a data buffer (stats %+v)", st)
	} else {
		t.Logf("%d commands waited for a data buffer", st.DataWaits)
	}
}

// TestSharedReceivesOversubscribed: a core with 8 receive buffers serves
// 4 queues of 32 commands (128 in flight, each holding a buffer while it
// runs): the transport holds hosts back while the SRQ is empty
// (FlagSRQReceiverWait), so every write lands, reads back equal, and no
// association fails.
func TestSharedReceivesOversubscribed(t *testing.T) {
	for _, poll := range []bool{false, true} {
		t.Run(map[bool]string{false: "goroutines", true: "poll-groups"}[poll], func(t *testing.T) {
			testSharedReceivesOversubscribed(t, soft.Config{PollGroup: poll})
		})
	}
}

func testSharedReceivesOversubscribed(t *testing.T, sc soft.Config) {
	tt := newTestTargetOn(t, rdma.Config{Cores: 1, SharedReceives: 8, QueueEntries: 64}, sc)
	if got := tt.port.Sizing().Engine.Buffers; got != 8 {
		t.Fatalf("%d receive buffers, want 8", got)
	}
	host, err := soft.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	c := connectHost(t, tt.addr, initiator.Config{Queues: 4, QueueDepth: 32, Adapter: host})
	ns := c.Namespace(1)
	rng := rand.New(rand.NewSource(testSeed(t)))
	const writers, rounds = 128, 4
	data := make([][]byte, writers)
	for i := range data {
		data[i] = make([]byte, 4096)
	}
	for r := range rounds {
		for i := range data {
			rng.Read(data[i])
		}
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for i := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := ns.WriteAt(data[i], int64(i)*4096); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: write: %v", r, err)
		}
	}
	got := make([]byte, 4096)
	for i := range writers {
		if _, err := ns.ReadAt(got, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data[i]) {
			t.Fatalf("block %d reads back other data", i)
		}
	}
	if st := c.Stats(); st.Associations != 1 || st.Failures != 0 {
		t.Fatalf("the association failed while the SRQ was short: %+v", st)
	}
}
