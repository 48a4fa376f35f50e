//go:build linux

package soft

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/transport"
)

// TestSteadyStateAllocs guards zero heap allocations per 64 B round trip
// (post, receive, notification, answer in the callback, completion) once
// the QPs are warm, in both modes.
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, mode := range []string{"goroutines", "poll-group"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "poll-group" {
				pollMode(t)
			}
			_, round := newPingPong(t)
			for i := 0; i < 200; i++ {
				if err := round(); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			allocs := testing.AllocsPerRun(1000, func() {
				if e := round(); e != nil {
					err = e
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if allocs != 0 {
				t.Errorf("%v allocations per round trip in steady state, want 0", allocs)
			}
		})
	}
}

// TestPollGroupIdleCPU reports the CPU the process uses over an idle
// second with 16 connected QPs (8 pairs, each side's CQ a poll group),
// right after traffic so that the groups' busy-poll windows were open.
// It reports and does not fail: a timed bound would flake on a shared
// machine. The goal (issue 13) is at most 2% of a core.
func TestPollGroupIdleCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("idles for two seconds")
	}
	for _, mode := range []string{"goroutines", "poll-group"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "poll-group" {
				pollMode(t)
			}
			var rounds []func() error
			for i := 0; i < 8; i++ {
				_, round := newPingPong(t)
				rounds = append(rounds, round)
			}
			for i := 0; i < 100; i++ {
				for _, round := range rounds {
					if err := round(); err != nil {
						t.Fatal(err)
					}
				}
			}
			runtime.GC()
			time.Sleep(10 * time.Millisecond) // the windows close
			cpu := func() time.Duration {
				var ru unix.Rusage
				unix.Getrusage(unix.RUSAGE_SELF, &ru)
				return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			}
			c0, w0 := cpu(), time.Now()
			time.Sleep(time.Second)
			used, wall := cpu()-c0, time.Since(w0)
			t.Logf("%s: idle with 16 connected QPs: %v CPU over %v = %.2f%% of a core",
				mode, used, wall.Round(time.Millisecond), 100*used.Seconds()/wall.Seconds())
		})
	}
}

// TestPollGroupLargeMessages moves 4 MiB RDMA writes, reads and sends
// over 1500-byte FPDUs in poll-group mode: one message makes thousands
// of iovecs, more than one writev takes, and the socket fills, so the
// group's partial writes and EPOLLOUT wake-ups carry it. The data must
// arrive intact.
func TestPollGroupLargeMessages(t *testing.T) {
	pollMode(t)
	benchFPDUSize = 1500
	t.Cleanup(func() { benchFPDUSize = 0 })
	p := newBenchPair(t, 4)
	const size = 4 << 20
	local := make([]byte, size)
	for i := range local {
		local[i] = byte(i*7 + i>>12)
	}
	lmr, _ := p.pa.RegisterMemory(local, transport.AccessLocalWrite)
	remote := make([]byte, size)
	rmr, _ := p.pb.RegisterMemory(remote, transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead)
	back := make([]byte, size)
	bmr, _ := p.pa.RegisterMemory(back, transport.AccessLocalWrite)
	wait := func(w *waiter, op transport.OpType) {
		t.Helper()
		for {
			cs := w.next()
			if cs == nil {
				t.Fatal("QP failed:", p.qa.Err(), p.qb.Err())
			}
			for _, c := range cs {
				if c.Status != nil {
					t.Fatal(c.Type, c.Status)
				}
				if c.Type == op {
					return
				}
			}
		}
	}
	if err := p.qa.Write(nil, []transport.SGE{lmr.SGE(0, size)}, rmr.Addr(), rmr.RKey(), 0); err != nil {
		t.Fatal(err)
	}
	wait(p.wa, transport.OpWrite)
	if err := p.qa.Read(nil, []transport.SGE{bmr.SGE(0, size)}, rmr.Addr(), rmr.RKey(), 0); err != nil {
		t.Fatal(err)
	}
	wait(p.wa, transport.OpRead)
	// Only what came back is compared: remote was written by b's group,
	// and the test's only synchronisation with b's side (for the race
	// detector, TCP is none) is b's CQ, which an RDMA write does not use.
	if !bytes.Equal(back, local) {
		t.Fatal("RDMA write then read back: data differs")
	}
	clear(remote)
	if err := p.qb.PostReceive(nil, []transport.SGE{rmr.SGE(0, size)}); err != nil {
		t.Fatal(err)
	}
	if err := p.qa.Send(nil, []transport.SGE{lmr.SGE(0, size)}, 0); err != nil {
		t.Fatal(err)
	}
	wait(p.wb, transport.OpReceive)
	if !bytes.Equal(remote, local) {
		t.Fatal("send: data differs")
	}
	st, _ := CQStatsOf(p.wa.cq)
	t.Logf("sender's group: %d writes found the socket full", st.PollFull)
}

// TestPollGroupWire runs the provider's wire tests with poll-group CQs:
// a peer's garbage and refused reads (Terminates and error paths on the
// group's thread), the replayed Linux host capture and our active side's
// bytes (FirstFPDUDelay, with and without CRC).
func TestPollGroupWire(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"GarbageFromPeer", TestGarbageFromPeer},
		{"ReadResponseOnlyIntoItsSink", TestReadResponseOnlyIntoItsSink},
		{"ReplayLinuxHostCapture", TestReplayLinuxHostCapture},
		{"ActiveSideWire", TestActiveSideWire},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pollMode(t)
			tc.f(t)
		})
	}
}
