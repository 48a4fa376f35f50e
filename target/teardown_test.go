package target_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// testSeed returns the test's seed: BLK_SEED if set, else the clock. It
// is logged when the test fails, with the line that replays it.
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
			t.Logf("seed %d: replay with BLK_SEED=%d go test -run '^%s$' ./target", seed, seed, t.Name())
		}
	})
	return seed
}

// slowBackend makes flushes and FUA writes take a while, so that they
// are on the sync workers when the controller goes.
type slowBackend struct {
	target.Backend
	delay time.Duration
}

func (s slowBackend) Flush() error { time.Sleep(s.delay); return s.Backend.Flush() }

func (s slowBackend) Write(lba uint64, data []byte, fua bool) error {
	if fua {
		time.Sleep(s.delay)
	}
	return s.Backend.Write(lba, data, fua)
}

// teardowns are the ways a controller ends while commands are in flight.
var teardowns = []struct {
	name string
	// all: every queue of the controller gets Disconnect (closing the
	// admin queue disconnects only the I/O queues).
	all bool
	do  func(h *harness, s *target.Subsystem, admin *tq)
}{
	{"admin queue closed", false, func(h *harness, s *target.Subsystem, admin *tq) { admin.q.Close() }},
	{"keep-alive expired", true, func(h *harness, s *target.Subsystem, admin *tq) { h.clock.Advance(time.Minute) }},
	{"subsystem removed", true, func(h *harness, s *target.Subsystem, admin *tq) { _ = h.tgt.RemoveSubsystem(subA) }},
	{"host denied", true, func(h *harness, s *target.Subsystem, admin *tq) { _ = s.DenyHost(hostA) }},
	{"target closed", true, func(h *harness, s *target.Subsystem, admin *tq) { _ = h.tgt.Close() }},
	{"namespace removed", false, func(h *harness, s *target.Subsystem, admin *tq) { _ = s.RemoveNamespace(1) }},
}

// TestTeardownRaces runs commands of every kind from several goroutines
// while the controller is torn down (or its namespace removed) in each
// of the possible ways, and checks that every command is completed
// exactly once (the harness's finish) and that Disconnect reaches every
// queue it should: on a synchronous backend (slow flushes and FUA on the
// sync workers) and on an asynchronous one (every IO completed late, out
// of order, from the backend's goroutines).
func TestTeardownRaces(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	rounds := 4
	if testing.Short() {
		rounds = 1
	}
	for round := range rounds {
		for _, td := range teardowns {
			for _, async := range []bool{false, true} {
				kind := "sync"
				if async {
					kind = "async"
				}
				t.Run(fmt.Sprintf("%s/%s/%d", kind, td.name, round), func(t *testing.T) {
					teardownRace(t, rng, td.name, td.all, td.do, async)
				})
			}
		}
	}
}

func teardownRace(t *testing.T, rng *rand.Rand, name string, all bool, do func(h *harness, s *target.Subsystem, admin *tq), async bool) {
	nc := target.NamespaceConfig{NSID: 1}
	if async {
		d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: 4096, Blocks: 256, Seed: rng.Uint64(), MaxDelay: 200 * time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Close) // after the harness's checks
		nc.Async = d
	} else {
		m, _ := target.NewMemBackend(4096, 256)
		nc.Backend = slowBackend{m, 200 * time.Microsecond}
	}
	h := newHarness(t)
	s, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subA, Hosts: []string{hostA}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddNamespace(nc); err != nil {
		t.Fatal(err)
	}
	admin, cntlid := h.adminConnect("admin", hostA, subA, 5000)
	ios := []*tq{h.ioConnect("io1", 1, hostA, subA, cntlid), h.ioConnect("io2", 2, hostA, subA, cntlid)}
	for range 2 {
		if _, done := h.execMayHold(admin, adminCmd(nvme.AdminAsyncEvent), nil); done {
			t.Fatal("AER completed at once")
		}
	}
	var wg sync.WaitGroup
	workers := 4
	seeds := make([]uint64, workers)
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	delay := time.Duration(rng.IntN(2000)) * time.Microsecond
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seeds[w], 2))
			for range 200 {
				q := ios[r.IntN(len(ios))]
				lba := uint64(r.IntN(250))
				var cmd nvme.Command
				var data []byte
				switch r.IntN(9) {
				case 0, 1:
					cmd, data = ioCmd(nvme.IORead, 1, lba, 2, 0), make([]byte, 8192)
				case 2, 3:
					cmd, data = ioCmd(nvme.IOWrite, 1, lba, 2, 0), make([]byte, 8192)
				case 4:
					cmd, data = ioCmd(nvme.IOWrite, 1, lba, 1, nvme.RWFUA), make([]byte, 4096)
				case 5:
					cmd = nvme.Command{Opcode: uint8(nvme.IOFlush), Flags: nvme.FlagSGLMetaBuf, NSID: 1}
				case 6:
					cmd = ioCmd(nvme.IOWriteZeroes, 1, lba, 4, nvme.RWFUA)
				case 7:
					q = admin
					cmd = adminCmd(nvme.AdminKeepAlive)
				case 8:
					q = admin
					cmd, data = identifyCmd(nvme.CNSNamespace, 1), make([]byte, 4096)
				}
				h.execMayHold(q, cmd, data)
			}
		}()
	}
	time.Sleep(delay)
	do(h, s, admin)
	wg.Wait()
	if name == "namespace removed" {
		return
	}
	if all && admin.disconnected() == 0 {
		t.Errorf("admin queue not disconnected")
	}
	for _, q := range ios {
		if q.disconnected() == 0 {
			t.Errorf("%s not disconnected", q.name)
		}
	}
	// The controller is gone: its ID is free, its queues abort.
	if c := h.exec(ios[0], ioCmd(nvme.IORead, 1, 0, 1, 0), make([]byte, 4096)); c.status() != nvme.StatusAbortSQDeleted {
		t.Errorf("I/O after teardown: %s", fmtStatus(c.status()))
	}
}

// TestQueueCloseRaces closes I/O queues while commands run on them: Close
// returns at once, the commands still complete, and Drained fires after
// the last.
func TestQueueCloseRaces(t *testing.T) {
	h := newHarness(t)
	s, _ := h.mustSubsystem(subA, 0)
	m, _ := target.NewMemBackend(4096, 64)
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: slowBackend{m, time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	_, cntlid := h.adminConnect("admin", hostA, subA, 5000)
	io := h.ioConnect("io1", 1, hostA, subA, cntlid)
	var calls []*call
	for i := range 16 {
		calls = append(calls, h.submit(io, ioCmd(nvme.IOWrite, 1, uint64(i), 1, nvme.RWFUA), make([]byte, 4096)))
	}
	io.q.Close()
	select {
	case <-io.q.Drained():
	case <-time.After(10 * time.Second):
		t.Fatal("never drained")
	}
	for _, c := range calls {
		select {
		case <-c.done:
		default:
			t.Fatal("Drained before a command completed")
		}
	}
	// The QID is free again.
	h.ioConnect("io1b", 1, hostA, subA, cntlid)
}
