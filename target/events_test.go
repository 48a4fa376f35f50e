package target_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/logrec"
	"github.com/blk-project/blk/internal/ratelog"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestEvents: controller created and destroyed (each reason), refused
// Connects, keep-alive expiry and reconnects are logged once each, with
// their attributes, and I/O logs nothing.
func TestEvents(t *testing.T) {
	lr := &logrec.Recorder{}
	h := newHarness(t, func(c *target.Config) { c.Logger = slog.New(lr) })
	const hostIDs = "0a000000-0000-0000-0000-000000000000"
	h.mustSubsystem(subA, 16)
	admin := h.queue("admin", target.QueueParams{QID: 0, SQSize: 31, RemoteAddr: "192.0.2.1:50000"})
	c := h.exec(admin, connectCmd(0, 31, 2500), connectData(hostA, subA, 0xFFFF, hostIDA))
	mustOK(t, c, "connect")
	cntlid := fmt.Sprint(c.dw0())
	mustOK(t, h.exec(admin, propSet(nvme.PropCC, ccEnable), nil), "enable")
	io := h.ioConnect("io1", 1, hostA, subA, uint16(c.dw0()))
	logrec.Expect(t, "connect", lr.Take(),
		logrec.Rec(slog.LevelInfo, target.EventControllerCreated, "kind", "nvm", "cntlid", cntlid, "subsystem", subA,
			"host_nqn", hostA, "host_id", hostIDs, "remote_addr", "192.0.2.1:50000", "kato", "3s",
			"sqsize", "32", "max_io_queues", "4"))

	// Commands log nothing.
	for range 100 {
		mustOK(t, h.exec(io, ioCmd(nvme.IORead, 1, 0, 1, 0), make([]byte, 4096)), "read")
		mustOK(t, h.exec(admin, adminCmd(nvme.AdminKeepAlive), nil), "keep alive")
	}
	logrec.Expect(t, "I/O", lr.Take())

	// Refused Connects: unknown subsystem, host not allowed, bad CNTLID
	// on an I/O queue.
	if _, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subB, Hosts: []string{hostA}}); err != nil {
		t.Fatal(err)
	}
	q := h.queue("bad1", target.QueueParams{QID: 0, SQSize: 31, RemoteAddr: "192.0.2.2:1"})
	h.exec(q, connectCmd(0, 31, 0), connectData(hostB, "nqn.2026-01.io.blk:nope", 0xFFFF, hostIDA))
	q = h.queue("bad2", target.QueueParams{QID: 0, SQSize: 31, RemoteAddr: "192.0.2.2:2"})
	h.exec(q, connectCmd(0, 31, 0), connectData(hostB, subB, 0xFFFF, hostIDA))
	q = h.queue("bad3", target.QueueParams{QID: 2, SQSize: 127, RemoteAddr: "192.0.2.2:3"})
	h.exec(q, connectCmd(2, 127, 0), connectData(hostB, subA, 77, hostIDA))
	other := testLimits()
	other.MaxTransfer *= 2
	q = h.queue("bad4", target.QueueParams{QID: 2, SQSize: 127, RemoteAddr: "192.0.2.2:4", Limits: &other})
	h.exec(q, connectCmd(2, 127, 0), connectData(hostA, subA, uint16(c.dw0()), hostIDA))
	logrec.Expect(t, "refusals", lr.Take(),
		logrec.Rec(slog.LevelWarn, target.EventConnectRefused, "qid", "0", "subsystem", "nqn.2026-01.io.blk:nope", "host_nqn", hostB,
			"remote_addr", "192.0.2.2:1", "reason", "unknown subsystem"),
		logrec.Rec(slog.LevelWarn, target.EventConnectRefused, "subsystem", subB, "host_nqn", hostB,
			"reason", "host not allowed on the subsystem", "status", nvme.StatusConnectInvalidHost.WithDNR().String()),
		logrec.Rec(slog.LevelWarn, target.EventConnectRefused, "qid", "2", "cntlid", "77", "reason", "no such live controller of this host"),
		logrec.Rec(slog.LevelWarn, target.EventConnectRefused, "qid", "2", "cntlid", cntlid,
			"reason", "the controller's admin queue came through a port with other limits (another transport?)"))

	// Keep-alive expiry, then the host comes back: a reconnect.
	h.clock.Advance(3 * time.Second)
	logrec.Expect(t, "keep-alive", lr.Take(),
		logrec.Rec(slog.LevelWarn, target.EventKeepAliveExpired, "cntlid", cntlid, "subsystem", subA, "host_nqn", hostA,
			"remote_addr", "192.0.2.1:50000", "kato", "3s"),
		logrec.Rec(slog.LevelInfo, target.EventControllerDestroyed, "kind", "nvm", "cntlid", cntlid, "host_nqn", hostA,
			"host_id", hostIDs, "reason", "keep-alive", "error", target.ErrKeepAliveExpired.Error(), "io_queues", "1"))
	h.clock.Advance(2 * time.Second)
	_, again := h.adminConnect("admin2", hostA, subA, 0)
	logrec.Expect(t, "reconnect", lr.Take(),
		logrec.Rec(slog.LevelInfo, target.EventControllerCreated, "cntlid", fmt.Sprint(again), "reconnect", "true",
			"previous_cntlid", cntlid, "previous_state", "keep-alive", "down_for", "2s"))
	// A second association while the first is live is a reconnect too.
	admin3, third := h.adminConnect("admin3", hostA, subA, 0)
	logrec.Expect(t, "second", lr.Take(),
		logrec.Rec(slog.LevelInfo, target.EventControllerCreated, "cntlid", fmt.Sprint(third), "reconnect", "true",
			"previous_cntlid", fmt.Sprint(again), "previous_state", "live"))

	// The other ways to end: the admin queue closes, the host is denied,
	// the subsystem goes, the target closes.
	admin3.q.Close()
	logrec.Expect(t, "disconnect", lr.Take(),
		logrec.Rec(slog.LevelInfo, target.EventControllerDestroyed, "cntlid", fmt.Sprint(third), "reason", "disconnect", "io_queues", "0"))
	_, onB := h.adminConnect("onB", hostA, subB, 0)
	lr.Take()
	s, _ := h.tgt.Subsystem(subB)
	if err := s.DenyHost(hostA); err != nil {
		t.Fatal(err)
	}
	logrec.Expect(t, "deny", lr.Take(),
		logrec.Rec(slog.LevelInfo, target.EventControllerDestroyed, "cntlid", fmt.Sprint(onB), "subsystem", subB, "reason", "host-denied"))
	if err := h.tgt.RemoveSubsystem(subA); err != nil {
		t.Fatal(err)
	}
	logrec.Expect(t, "remove", lr.Take(),
		logrec.Rec(slog.LevelInfo, target.EventControllerDestroyed, "cntlid", fmt.Sprint(again), "reason", "subsystem-removed"))

	// Discovery controllers log at Debug.
	h.mustSubsystem(subA, 0)
	h.adminConnect("disc", hostB, nvme.DiscoveryNQN, 0)
	if err := h.tgt.Close(); err != nil {
		t.Fatal(err)
	}
	recs := lr.Take()
	logrec.Expect(t, "discovery and close", recs,
		logrec.Rec(slog.LevelDebug, target.EventControllerCreated, "kind", "discovery", "subsystem", nvme.DiscoveryNQN, "kato", "2m0s"),
		logrec.Rec(slog.LevelDebug, target.EventControllerDestroyed, "kind", "discovery", "reason", "shutdown"))
}

// TestConnectFloodRateLimited: a host hammering Connect with a bad NQN
// through a rate-limiting handler gets the first Burst refusals logged
// and the rest counted in one summary.
func TestConnectFloodRateLimited(t *testing.T) {
	lr := &logrec.Recorder{}
	rl := ratelog.New(lr, ratelog.Options{Burst: 5, Interval: time.Hour})
	h := newHarness(t, func(c *target.Config) { c.Logger = slog.New(rl) })
	h.mustSubsystem(subA, 0)
	for i := range 200 {
		q := h.queue(fmt.Sprintf("q%d", i), target.QueueParams{QID: 0, SQSize: 31})
		h.exec(q, connectCmd(0, 31, 0), connectData(hostB, "nqn.2026-01.io.blk:wrong", 0xFFFF, hostIDA))
	}
	h.adminConnect("good", hostA, subA, 0)
	recs := lr.Take()
	if len(recs) != 6 || recs[5].Msg != target.EventControllerCreated {
		t.Fatalf("%d records %v, want 5 refusals and the good controller", len(recs), recs)
	}
	rl.Flush()
	logrec.Expect(t, "summary", lr.Take(), logrec.Rec(slog.LevelWarn, ratelog.SuppressedMsg, "event", target.EventConnectRefused, "suppressed", "195"))
}

// TestLogfWithoutLogger: Config.Logf alone still gets the lines it did.
func TestLogfWithoutLogger(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	h := newHarness(t, func(c *target.Config) {
		c.Logf = func(f string, a ...any) { mu.Lock(); lines = append(lines, fmt.Sprintf(f, a...)); mu.Unlock() }
	})
	h.mustSubsystem(subA, 0)
	admin, _ := h.adminConnect("admin", hostA, subA, 0)
	admin.q.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 2 || !strings.Contains(lines[0], "nvm controller 1 for "+subA) || !strings.Contains(lines[1], "torn down: "+target.ErrAdminQueueClosed.Error()) {
		t.Fatalf("Logf lines %q", lines)
	}
}
