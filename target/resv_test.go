package target_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
	"github.com/blk-project/blk/target"
)

var hostIDB = [16]byte{0xb}

var resvSeed = flag.Uint64("resv-seed", 0, "seed of TestDrainHostsRandom (0: from the clock)")

// resvCmd builds Register, Acquire or Release with its 16 bytes of keys.
func resvCmd(op nvme.IOOpcode, action uint8, rtype uint8, crkey, key2 uint64) (nvme.Command, []byte) {
	c := nvme.Command{Opcode: uint8(op), Flags: nvme.FlagSGLMetaBuf, NSID: 1}
	c.SetResv(action, false, rtype, 0)
	data := make([]byte, 16)
	binary.LittleEndian.PutUint64(data[0:], crkey)
	binary.LittleEndian.PutUint64(data[8:], key2)
	return c, data
}

// connectHost connects an admin queue (enabled) and I/O queue 1 for
// host with host identifier id.
func (h *harness) connectHost(prefix, host, sub string, id [16]byte) (admin, io *tq) {
	h.tb.Helper()
	admin = h.queue(prefix+"-admin", target.QueueParams{QID: 0, SQSize: 31})
	c := h.exec(admin, connectCmd(0, 31, 5000), connectData(host, sub, 0xFFFF, id))
	mustOK(h.tb, c, "admin connect")
	mustOK(h.tb, h.exec(admin, propSet(nvme.PropCC, ccEnable), nil), "enable")
	io = h.queue(prefix+"-io", target.QueueParams{QID: 1, SQSize: 127})
	mustOK(h.tb, h.exec(io, connectCmd(1, 127, 0), connectData(host, sub, uint16(c.dw0()), id)), "io connect")
	return admin, io
}

// twoHosts adds subA, open to any host, with ns as namespace 1 under a
// local reservation keeper, and connects hosts A and B (hostIDA,
// hostIDB): an admin queue and I/O queue 1 each.
func (h *harness) twoHosts(ns target.NamespaceConfig) (s *target.Subsystem, adminA, ioA, adminB, ioB *tq) {
	h.tb.Helper()
	s, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subA, AllowAnyHost: true})
	if err != nil {
		h.tb.Fatal(err)
	}
	ns.NSID, ns.Reservations = 1, target.LocalReservations()
	if err := s.AddNamespace(ns); err != nil {
		h.tb.Fatal(err)
	}
	adminA, ioA = h.connectHost("a", hostA, subA, hostIDA)
	adminB, ioB = h.connectHost("b", hostB, subA, hostIDB)
	return s, adminA, ioA, adminB, ioB
}

// registerAB registers key 0xa1 on host A's queue and 0xb2 on host B's.
func (h *harness) registerAB(ioA, ioB *tq) {
	h.tb.Helper()
	for _, c := range []struct {
		q   *tq
		key uint64
	}{{ioA, 0xa1}, {ioB, 0xb2}} {
		cmd, data := resvCmd(nvme.IOReservationRegister, nvme.RREGARegister, 0, 0, c.key)
		mustOK(h.tb, h.exec(c.q, cmd, data), "register")
	}
}

// TestPreemptAndAbortWaits: a preempt-and-abort completes only after the
// commands its victim had started were completed (§1.6). The victim's
// writes are held at a DelayedBackend; meanwhile the new state is
// already in force (the victim's next write is refused at once) and the
// preempt waits; once the backend lets them go, they complete, and then
// the preempt does.
func TestPreemptAndAbortWaits(t *testing.T) {
	h := newHarness(t)
	d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: 4096, Blocks: 64, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s, _, ioA, _, ioB := h.twoHosts(target.NamespaceConfig{Async: d})
	h.registerAB(ioA, ioB)
	cmd, data := resvCmd(nvme.IOReservationAcquire, nvme.RACQAAcquire, 1, 0xb2, 0)
	mustOK(t, h.exec(ioB, cmd, data), "B acquires WE")

	d.Pause()
	var writes []*call
	for i := range 8 {
		w := h.submit(ioB, ioCmd(nvme.IOWrite, 1, uint64(i), 1, 0), bytes.Repeat([]byte{0xb0 + byte(i)}, 4096))
		writes = append(writes, w)
	}
	cmd, data = resvCmd(nvme.IOReservationAcquire, nvme.RACQAPreemptAndAbort, 1, 0xa1, 0xb2)
	pre := h.submit(ioA, cmd, data)
	select {
	case <-pre.done:
		t.Fatalf("preempt-and-abort completed (%s) while the victim's writes were at the backend", fmtStatus(pre.status()))
	case <-time.After(50 * time.Millisecond):
	}
	// The new state is in force already: B's next write is refused at
	// once, and is not waited for.
	late := h.exec(ioB, ioCmd(nvme.IOWrite, 1, 20, 1, 0), make([]byte, 4096))
	if st := late.status(); st != nvme.StatusReservationConflict.WithDNR() {
		t.Fatalf("B's write after the preempt: %s, want Reservation Conflict", fmtStatus(st))
	}
	d.Resume()
	pre.wait(t)
	mustOK(t, pre, "preempt-and-abort")
	for i, w := range writes {
		select {
		case <-w.done:
		default:
			t.Fatalf("write %d of the victim not completed when the preempt was", i)
		}
		mustOK(t, w, "victim's write started before the preempt")
	}
	got := make([]byte, 4096)
	for i := range 8 {
		if err := d.Mem().Read(uint64(i), got); err != nil || got[0] != 0xb0+byte(i) {
			t.Fatalf("block %d: %#x (%v)", i, got[0], err)
		}
	}
	st, _ := s.Reservation(1)
	if st.Holder != resv.HostID(hostIDA) || len(st.Regs) != 1 {
		t.Fatalf("after the preempt: %+v", st)
	}
}

// TestDrainHostsRandom (seeded, run it with -race): goroutine-queues of
// two hosts write through a DelayedBackend while DrainHosts is called
// for one host again and again; every command of that host that had
// been executed when a DrainHosts began has completed when it returns.
func TestDrainHostsRandom(t *testing.T) {
	seed := *resvSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test ./target -run TestDrainHostsRandom -args -resv-seed=N)", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	h := newHarness(t)
	d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: 4096, Blocks: 256, Seed: seed, MaxDelay: 300 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s, _, ioA, _, ioB := h.twoHosts(target.NamespaceConfig{Async: d})

	// Each writer records each write's call as it submits it.
	var mu sync.Mutex
	var started []*call
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }() // before the backend closes
	for _, q := range []*tq{ioA, ioB} {
		wg.Add(1)
		go func(q *tq, lba uint64, rng *rand.Rand) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c := h.submit(q, ioCmd(nvme.IOWrite, 1, lba, 1, 0), make([]byte, 4096))
				if q == ioB {
					mu.Lock()
					started = append(started, c)
					mu.Unlock()
				}
				lba = (lba + 1) % 256
				if rng.IntN(2) == 0 {
					<-c.done // sometimes one at a time, sometimes many in flight
				}
			}
		}(q, uint64(rng.IntN(256)), rand.New(rand.NewPCG(seed, uint64(len(q.name)))))
	}
	for i := range 50 {
		mu.Lock()
		before := len(started)
		snapshot := started[:before:before]
		mu.Unlock()
		if err := s.DrainHosts(t.Context(), []resv.HostID{resv.HostID(hostIDB)}); err != nil {
			t.Fatalf("seed %d: drain %d: %v", seed, i, err)
		}
		for j, c := range snapshot {
			select {
			case <-c.done:
			default:
				t.Fatalf("seed %d: drain %d returned with write %d of the host (started before it) still pending", seed, i, j)
			}
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
	}
}

// TestReservationRace (run it with -race): I/O on two hosts' queues
// while the holder changes reservations again and again; every command
// completes once with success or Reservation Conflict, never anything
// else, and nothing is left at the keeper.
func TestReservationRace(t *testing.T) {
	h := newHarness(t)
	mem, _ := target.NewMemBackend(4096, 64)
	_, _, ioA, _, ioB := h.twoHosts(target.NamespaceConfig{Backend: mem})
	h.registerAB(ioA, ioB)
	var conflicts atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			op := nvme.IORead
			if i%2 == 0 {
				op = nvme.IOWrite
			}
			c := h.exec(ioB, ioCmd(op, 1, uint64(i%64), 1, 0), make([]byte, 4096))
			switch st := c.status(); st {
			case nvme.StatusSuccess:
			case nvme.StatusReservationConflict.WithDNR():
				conflicts.Add(1)
			default:
				t.Errorf("B's I/O: %s", fmtStatus(st))
				return
			}
		}
	}()
	for i := range 200 {
		rtype := uint8(1 + i%6)
		cmd, data := resvCmd(nvme.IOReservationAcquire, nvme.RACQAAcquire, rtype, 0xa1, 0)
		mustOK(t, h.exec(ioA, cmd, data), "acquire")
		cmd, data = resvCmd(nvme.IOReservationRelease, nvme.RRELARelease, rtype, 0xa1, 0)
		mustOK(t, h.exec(ioA, cmd, data), "release")
	}
	close(stop)
	wg.Wait()
	st := h.tgt.Stats()
	if st.ReservationConflicts != uint64(conflicts.Load()) {
		t.Fatalf("Stats.ReservationConflicts %d, B saw %d", st.ReservationConflicts, conflicts.Load())
	}
}

// TestLocalReservationsBinding: a local keeper serves one attached
// namespace; an AddNamespace that failed after taking it (a duplicate
// NSID) does not keep it.
func TestLocalReservationsBinding(t *testing.T) {
	h := newHarness(t)
	s, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subA, AllowAnyHost: true})
	if err != nil {
		t.Fatal(err)
	}
	k := target.LocalReservations()
	m1, _ := target.NewMemBackend(4096, 64)
	m2, _ := target.NewMemBackend(4096, 64)
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: m1}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: m2, Reservations: k}); !errors.Is(err, target.ErrExists) {
		t.Fatalf("duplicate NSID: %v", err)
	}
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 2, Backend: m2, Reservations: k}); err != nil {
		t.Fatalf("the keeper of a failed AddNamespace: %v", err)
	}
	if err := s.SetReservations(1, k, nil); !errors.Is(err, target.ErrInvalid) {
		t.Fatalf("a keeper on two namespaces: %v", err)
	}
	if _, ok := s.Reservation(2); !ok {
		t.Fatal("NSID 2: no state published by its local keeper")
	}
	if _, ok := s.Reservation(1); ok {
		t.Fatal("NSID 1 has a reservation state without a keeper")
	}
}

// TestResvLogOverflow: a controller's Reservation Notification log keeps
// the newest 16 entries; the ones lost to the full ring show as a jump in
// the Log Page Count, and Number of Available Log Pages counts down.
func TestResvLogOverflow(t *testing.T) {
	h := newHarness(t)
	m, _ := target.NewMemBackend(4096, 64)
	_, _, ioA, adminB, ioB := h.twoHosts(target.NamespaceConfig{Backend: m})
	cmd, data := resvCmd(nvme.IOReservationRegister, nvme.RREGARegister, 0, 0, 0xa1)
	mustOK(t, h.exec(ioA, cmd, data), "A registers")
	cmd, data = resvCmd(nvme.IOReservationAcquire, nvme.RACQAAcquire, 1, 0xa1, 0)
	mustOK(t, h.exec(ioA, cmd, data), "A acquires")
	const notices = 20
	for range notices {
		cmd, data := resvCmd(nvme.IOReservationRegister, nvme.RREGARegister, 0, 0, 0xb2)
		mustOK(t, h.exec(ioB, cmd, data), "B registers")
		cmd, data = resvCmd(nvme.IOReservationAcquire, nvme.RACQAPreempt, 1, 0xa1, 0xb2)
		mustOK(t, h.exec(ioA, cmd, data), "A preempts B")
	}
	for i := range 17 {
		c := h.exec(adminB, getLogCmd(nvme.LogResvNotification, 0, 64, 0, false), make([]byte, 64))
		mustOK(t, c, "log 80h")
		var l nvme.ResvNotifLog
		if err := l.Unmarshal(c.data); err != nil {
			t.Fatal(err)
		}
		want := nvme.ResvNotifLog{Count: uint64(notices - 16 + 1 + i), Type: nvme.ResvNotifRegistrationPreempted,
			Available: uint8(15 - i), NSID: 1}
		if i == 16 {
			want = nvme.ResvNotifLog{} // empty
		}
		if l != want {
			t.Fatalf("read %d: %+v, want %+v", i, l, want)
		}
	}
}
