package tcp_test

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/logrec"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

// TestConnectTimeout: a connection that sends no ICReq, or an ICReq and
// then nothing, is closed by the port at its ConnectTimeout; one whose
// only Connect was refused is closed at the core's ConnectTimeout; a
// connected queue is left alone. Each is counted and logged as closed by
// the target, and none is pending afterwards.
func TestConnectTimeout(t *testing.T) {
	const timeout = 2 * time.Second
	lr := &logrec.Recorder{}
	lg := slog.New(lr)
	tt := newTestTargetWith(t, tcp.Config{ConnectTimeout: timeout, Logger: lg},
		target.Config{ConnectTimeout: timeout, Logger: lg})
	admin, _ := tt.adminUp(t, nvme.TCPDigests{})

	start := time.Now()
	silent := dialRaw(t, tt.addr)
	icOnly := dialRaw(t, tt.addr)
	icOnly.mustIC(nvme.TCPDigests{})
	refused := dialRaw(t, tt.addr)
	refused.mustIC(nvme.TCPDigests{})
	if rsp := refused.connectTo(0, 31, 0, nvme.CNTLIDDynamic, "nqn.2026-11.io.blk:nope", testHostNQN); rsp.Status == 0 {
		t.Fatal("Connect to a subsystem that does not exist succeeded")
	}
	for _, h := range []*rawHost{silent, icOnly, refused} {
		h.expectClose()
	}
	if d := time.Since(start); d < timeout {
		t.Errorf("idle connections closed after %v, before the %v timeout", d, timeout)
	}
	if res := admin.mustExchange(propGet(nvme.PropCSTS, false), nil, nil, nil); res.rsp.Status != 0 || res.rsp.DW0&1 == 0 {
		t.Fatalf("the connected admin queue after the timeouts: status %v CSTS %#x", res.rsp.Status, res.rsp.DW0)
	}
	st := tt.port.Stats()
	if st.ConnectTimeouts != 2 || st.Pending != 0 {
		t.Errorf("port: ConnectTimeouts %d, Pending %d; want 2 and 0", st.ConnectTimeouts, st.Pending)
	}
	if n := tt.t.Stats().ConnectsTimedOut; n != 1 {
		t.Errorf("core: ConnectsTimedOut %d, want 1", n)
	}
	lr.Wait(t, target.EventConnectTimedOut, "qid", "0")
	// Each connection closed by the target, for its reason (logged once
	// its socket is closed: the refused one after the host's FIN).
	wants := []string{"no ICReq within 2s", "no command after the ICResp within 2s", "target: no Connect in time"}
	var why []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		why = why[:0]
		for _, r := range lr.Records() {
			if r.Msg == tcp.EventConnectionClosed && r.Attrs["by"] == "target" {
				why = append(why, r.Attrs["reason"])
			}
		}
		missing := ""
		for _, want := range wants {
			found := false
			for _, w := range why {
				found = found || strings.Contains(w, want)
			}
			if !found {
				missing = want
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection closed by the target for %q; closed for %q", missing, why)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMaxPending: with MaxPending connections accepted and not connected,
// the next is closed as it is accepted (counted, logged); once one of
// them connects, a new connection is served again.
func TestMaxPending(t *testing.T) {
	lr := &logrec.Recorder{}
	tt := newTestTarget(t, tcp.Config{MaxPending: 2, Logger: slog.New(lr)})
	a := dialRaw(t, tt.addr)
	_ = dialRaw(t, tt.addr)
	waitPending(t, tt, 2)
	// Closed at once (with a reset): the dial itself may see it.
	if nc, err := net.DialTimeout("tcp", tt.addr, rawTimeout); err == nil {
		over := &rawHost{t: t, nc: nc}
		over.expectClose()
	}
	deadline := time.Now().Add(5 * time.Second)
	for tt.port.Stats().Rejected == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if st := tt.port.Stats(); st.Rejected != 1 {
		t.Fatalf("Rejected %d, want 1", st.Rejected)
	}
	rej := lr.Wait(t, tcp.EventConnectionRejected, "port", tt.addr)
	if rej.Level != slog.LevelWarn || !strings.Contains(rej.Attrs["reason"], "MaxPending") {
		t.Errorf("rejected: %v %v", rej.Level, rej.Attrs)
	}

	a.mustIC(nvme.TCPDigests{})
	if rsp := a.connect(0, 31, 0, nvme.CNTLIDDynamic); rsp.Status != 0 {
		t.Fatalf("admin Connect: %v", rsp.Status)
	}
	waitPending(t, tt, 1)
	again := dialRaw(t, tt.addr)
	again.mustIC(nvme.TCPDigests{})
	if st := tt.port.Stats(); st.Rejected != 1 || st.Pending != 2 {
		t.Fatalf("Rejected %d, Pending %d; want 1 and 2", st.Rejected, st.Pending)
	}
}

func waitPending(t *testing.T, tt *testTarget, n uint64) {
	t.Helper()
	waitStat(t, tt, "connections pending", func(s tcp.Stats) uint64 { return s.Pending }, n)
}

// TestMaxPendingPerSource: one source address gets MaxPendingPerSource
// pending connections, the next of it is closed as it is accepted (a
// warning naming the source, counted apart), and another address still
// gets in although the first keeps trying (issue 21 case 3).
func TestMaxPendingPerSource(t *testing.T) {
	lr := &logrec.Recorder{}
	tt := newTestTarget(t, tcp.Config{MaxPending: 4, MaxPendingPerSource: 2, Logger: slog.New(lr)})
	from := &net.Dialer{LocalAddr: &net.TCPAddr{IP: attackerIP}, Timeout: rawTimeout}
	for range 2 {
		nc, err := from.Dial("tcp", tt.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
	}
	waitPending(t, tt, 2)
	for i := range 3 {
		if nc, err := from.Dial("tcp", tt.addr); err == nil {
			(&rawHost{t: t, nc: nc}).expectClose()
		}
		waitStat(t, tt, "rejected", func(s tcp.Stats) uint64 { return s.RejectedSource }, uint64(i+1))
	}
	rej := lr.Wait(t, tcp.EventConnectionRejected, "source", attackerIP.String())
	if rej.Level != slog.LevelWarn || !strings.Contains(rej.Attrs["reason"], "MaxPendingPerSource") {
		t.Errorf("rejected: %v %v", rej.Level, rej.Attrs)
	}
	good := dialRaw(t, tt.addr)
	good.mustIC(nvme.TCPDigests{})
	if rsp := good.connect(0, 31, 0, nvme.CNTLIDDynamic); rsp.Status != 0 {
		t.Fatalf("admin Connect from another source: %v", rsp.Status)
	}
	if st := tt.port.Stats(); st.Rejected != 3 || st.RejectedSource != 3 || st.Pending != 2 {
		t.Fatalf("Rejected %d, RejectedSource %d, Pending %d; want 3, 3, 2", st.Rejected, st.RejectedSource, st.Pending)
	}
}

// TestPendingEviction: with the port's MaxPending full, a connection of a
// source with fewer pending than the source with the most (by two or
// more) takes the place of that source's oldest, which is closed and
// logged; between sources that would only trade places it is refused.
func TestPendingEviction(t *testing.T) {
	lr := &logrec.Recorder{}
	tt := newTestTarget(t, tcp.Config{MaxPending: 4, MaxPendingPerSource: 3, Logger: slog.New(lr)})
	from := func(ip net.IP) *rawHost {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: rawTimeout}
		nc, err := d.Dial("tcp", tt.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		h := &rawHost{t: t, nc: nc}
		h.mustIC(nvme.TCPDigests{}) // answered: the group has it
		return h
	}
	ipA, ipB, ipC := net.IPv4(127, 0, 0, 2), net.IPv4(127, 0, 0, 3), net.IPv4(127, 0, 0, 4)
	a := []*rawHost{from(ipA), from(ipA), from(ipA)}
	from(ipB)
	waitPending(t, tt, 4)

	// The allowed host (127.0.0.1, none pending) takes the place of A's
	// oldest, and connects.
	good := dialRaw(t, tt.addr)
	good.mustIC(nvme.TCPDigests{})
	if rsp := good.connect(0, 31, 0, nvme.CNTLIDDynamic); rsp.Status != 0 {
		t.Fatalf("admin Connect: %v", rsp.Status)
	}
	a[0].expectClose()
	ev := lr.Wait(t, tcp.EventConnectionEvicted, "source", ipA.String())
	if ev.Level != slog.LevelWarn || ev.Attrs["for"] != "127.0.0.1" {
		t.Errorf("evicted: %v %v", ev.Level, ev.Attrs)
	}
	waitPending(t, tt, 3) // A 2, B 1

	// B fills the port again (A 2, B 2): a third of B's would only
	// trade places with one of A's, so it is refused.
	from(ipB)
	waitPending(t, tt, 4)
	if nc, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ipB}}).Dial("tcp", tt.addr); err == nil {
		(&rawHost{t: t, nc: nc}).expectClose()
	}
	waitStat(t, tt, "rejected", func(s tcp.Stats) uint64 { return s.Rejected }, 1)
	// C, with none, takes the place of A's or B's oldest.
	from(ipC)
	if st := tt.port.Stats(); st.Evicted != 2 || st.Rejected != 1 || st.RejectedSource != 0 || st.Pending != 4 {
		t.Fatalf("Evicted %d, Rejected %d, RejectedSource %d, Pending %d; want 2, 1, 0, 4", st.Evicted, st.Rejected, st.RejectedSource, st.Pending)
	}
}
