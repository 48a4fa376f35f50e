package target_test

import (
	"errors"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestKeepAliveExpiry: with the fake clock, a controller whose host stops
// sending Keep Alive is torn down exactly at its KATO (rounded up to
// seconds): Disconnect with ErrKeepAliveExpired on every queue, held AERs
// aborted, the controller ID freed, the expiry counted.
func TestKeepAliveExpiry(t *testing.T) {
	h, admin, io1, cntlid := kaController(t)
	io2 := h.ioConnect("io2", 2, hostA, subA, cntlid)
	aer, _ := h.execMayHold(admin, adminCmd(nvme.AdminAsyncEvent), nil)

	for range 5 {
		h.clock.Advance(2900 * time.Millisecond)
		mustOK(t, h.exec(admin, adminCmd(nvme.AdminKeepAlive), nil), "keep alive")
	}
	expiresBetween(t, h, 2999*time.Millisecond, 3*time.Second, admin, io1, io2)
	aer.wait(t)
	if s := aer.status(); s != nvme.StatusAbortSQDeleted {
		t.Errorf("held AER: %s", fmtStatus(s))
	}
	st := h.tgt.Stats()
	if st.KeepAliveExpired != 1 || st.Controllers != 0 || st.ControllersTornDown != 1 {
		t.Errorf("stats %+v", st)
	}
	// A new association gets a new controller.
	_, again := h.adminConnect("admin2", hostA, subA, 5000)
	if again == cntlid {
		t.Errorf("CNTLID %d reused at once", again)
	}
}

// kaController is a harness with subA (16 blocks) and a controller of
// hostA with KATO 3 s (2500 ms, rounded up to whole seconds) and I/O
// queue 1.
func kaController(t *testing.T) (h *harness, admin, io *tq, cntlid uint16) {
	t.Helper()
	h = newHarness(t)
	h.mustSubsystem(subA, 16)
	admin, cntlid = h.adminConnect("admin", hostA, subA, 2500)
	io = h.ioConnect("io1", 1, hostA, subA, cntlid)
	return h, admin, io, cntlid
}

// expiresBetween advances the fake clock from the host's last command on,
// the host sending nothing more: the controller of qs (its admin queue
// first) must still be alive after alive and be torn down by dead, every
// queue with exactly one Disconnect for ErrKeepAliveExpired.
func expiresBetween(t *testing.T, h *harness, alive, dead time.Duration, qs ...*tq) {
	t.Helper()
	h.clock.Advance(alive)
	if qs[0].disconnected() != 0 {
		t.Fatalf("torn down %v after the last command", alive)
	}
	h.clock.Advance(dead - alive)
	ok := true
	for _, q := range qs {
		q.mu.Lock()
		n := len(q.disconnects)
		var err error
		if n > 0 {
			err = q.disconnects[0]
		}
		q.mu.Unlock()
		if n != 1 || !errors.Is(err, target.ErrKeepAliveExpired) {
			t.Logf("%s: %d disconnects (%v)", q.name, n, err)
			ok = false
		}
	}
	if !ok {
		t.Fatalf("not torn down %v after the last command", dead)
	}
}

// TestTrafficBasedKeepAlive: an I/O controller advertises TBKAS, and a
// host that sends only I/O commands, never Keep Alive, keeps it alive for
// many KATOs as long as no gap between commands reaches KATO. Once the
// commands stop, the controller expires no sooner than KATO after the
// last one and no later than 2 × KATO.
func TestTrafficBasedKeepAlive(t *testing.T) {
	h, admin, io, _ := kaController(t)

	c := h.exec(admin, identifyCmd(nvme.CNSController, 0), make([]byte, nvme.IdentifySize))
	var id nvme.IdentifyController
	_ = id.Unmarshal(c.data)
	if id.CTRATT&nvme.CtrAttTBKAS == 0 {
		t.Fatalf("CTRATT %#x lacks TBKAS", id.CTRATT)
	}

	// 30 s of reads, 10 KATOs, with gaps of 0.5 to 2.9 s; no Keep Alive.
	read := func() {
		mustOK(t, h.exec(io, ioCmd(nvme.IORead, 1, 0, 1, 0), make([]byte, 4096)), "read")
	}
	gaps := []time.Duration{2900, 500, 1700, 2900, 2900, 100, 2999, 1000}
	var elapsed time.Duration
	for i := 0; elapsed < 30*time.Second; i++ {
		d := gaps[i%len(gaps)] * time.Millisecond
		h.clock.Advance(d)
		elapsed += d
		if n := admin.disconnected(); n != 0 {
			t.Fatalf("torn down after %v of I/O", elapsed)
		}
		read()
	}
	if st := h.tgt.Stats(); st.KeepAliveTraffic < 9 || st.KeepAliveExpired != 0 {
		t.Errorf("after %v: %d traffic restarts, %d expiries", elapsed, st.KeepAliveTraffic, st.KeepAliveExpired)
	}

	// The reads stop: alive for KATO at least, gone by 2 × KATO.
	expiresBetween(t, h, 2999*time.Millisecond, 6*time.Second, admin, io)
	if st := h.tgt.Stats(); st.KeepAliveExpired != 1 || st.Controllers != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestKeepAliveNoTraffic: a controller that gets no command at all after
// its enable expires exactly KATO later: traffic-based keep-alive only
// ever extends the timer for commands it saw.
func TestKeepAliveNoTraffic(t *testing.T) {
	h, admin, io, _ := kaController(t)
	expiresBetween(t, h, 2999*time.Millisecond, 3*time.Second, admin, io)
	if st := h.tgt.Stats(); st.KeepAliveExpired != 1 || st.KeepAliveTraffic != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestKeepAliveAfterTraffic: a Keep Alive restarts the timer exactly,
// whatever commands came before it: with traffic and then a last Keep
// Alive, the controller expires KATO after that Keep Alive.
func TestKeepAliveAfterTraffic(t *testing.T) {
	h, admin, io, _ := kaController(t)
	h.clock.Advance(time.Second)
	mustOK(t, h.exec(io, ioCmd(nvme.IORead, 1, 0, 1, 0), make([]byte, 4096)), "read")
	h.clock.Advance(time.Second)
	mustOK(t, h.exec(admin, adminCmd(nvme.AdminKeepAlive), nil), "keep alive")
	expiresBetween(t, h, 2999*time.Millisecond, 3*time.Second, admin, io)
}
