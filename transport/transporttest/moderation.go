package transporttest

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/blk-project/blk/transport"
)

// Interrupt moderation (M1–M13) is tested by what a consumer sees: when
// the notification of an armed CQ comes, relative to the completions that
// land on it. The CQ under test is the client's initiator CQ; each
// "completion" is a 1-byte send, known to have landed once the server has
// received it. Latency bounds carry a generous slack (notifySlack): they
// catch a provider that ignores a setting, not one that is a little late
// under -race.

const (
	// notifySlack is added to every "must notify within" bound.
	notifySlack = 1500 * time.Millisecond
	// longInterval is an interval (µs) no test waits out: 10 s.
	longInterval = 10_000_000
)

type modRig struct {
	t    *T
	p    *pair
	cut  *cq
	src  transport.MemoryRegion
	sent int // sends posted
	got  int // send completions polled from cut
}

func (t *T) newModRig() *modRig {
	t.Helper()
	p := t.newPair(pairOpts{
		cli: epOpts{cqDepth: 64, qp: func(c *transport.QPConfig) { c.InitiatorQueueDepth = min(64, c.InitiatorQueueDepth) }},
		srv: epOpts{cqDepth: 1024, qp: func(c *transport.QPConfig) { c.ReceiveQueueDepth = min(512, c.ReceiveQueueDepth) }},
	})
	n := int(p.srv.cfg.ReceiveQueueDepth)
	rmr := t.register(p.srv.pd, n, allAccess)
	t.postRecvs(p.srv.qp, rmr, n, 1, 0)
	return &modRig{t: t, p: p, cut: p.cli.icq, src: t.register(p.cli.pd, 1, allAccess)}
}

func (t *T) moderationSupported() bool {
	return t.info().Flags&transport.FlagCQInterruptModerationSupported != 0
}

// needModeration skips a behaviour test on an adapter without moderation:
// a consumer must not call it there (M9), so there is nothing to observe.
func (r *modRig) needModeration() {
	r.t.Helper()
	r.t.skipUnless(r.p.cli.info.Flags&transport.FlagCQInterruptModerationSupported != 0,
		"adapter lacks FlagCQInterruptModerationSupported: consumers must not call ControlInterruptModeration (M9); see M9 for NOT_SUPPORTED")
}

// control sets moderation and requires success.
func (r *modRig) control(interval, count uint32) {
	r.t.Helper()
	if err := r.cut.ControlInterruptModeration(interval, count); err != nil {
		r.t.Fatalf("ControlInterruptModeration(%d µs, %d): %v", interval, count, err)
	}
}

func (r *modRig) arm() {
	r.t.Helper()
	if err := r.cut.Arm(transport.NotifyAny); err != nil {
		r.t.Fatalf("Arm: %v", err)
	}
}

// complete puts k more completions on the CQ under test and returns when
// the server has received them all (so the send completions have landed).
func (r *modRig) complete(k int) {
	r.t.Helper()
	if r.sent-r.got+k > int(r.cut.Depth()) {
		r.t.Fatalf("rig: %d completions would overrun the CQ under test; drain first", r.sent-r.got+k)
	}
	for range k {
		if err := r.p.cli.qp.Send(r.sent, []transport.SGE{r.src.SGE(0, 1)}, 0); err != nil {
			r.t.Fatalf("Send %d: %v", r.sent, err)
		}
		r.sent++
	}
	r.t.waitN(r.p.srv.rcq, k, "server receives")
}

// drain polls every completion put on the CQ under test so far.
func (r *modRig) drain() {
	r.t.Helper()
	r.t.checkOK(r.t.pollUntil(r.cut, r.sent-r.got, "send completions"), transport.OpSend, r.p.cli.tag, "sends")
	r.got = r.sent
}

// noNotify watches for quiet and fails if the CQ under test notified more
// than want times.
func (r *modRig) noNotify(want int64, what string) {
	r.t.Helper()
	time.Sleep(quiet)
	if n := r.cut.normal.Load(); n != want {
		r.t.Fatalf("%s: %d notifications, want %d", what, n, want)
	}
}

// waitNotify waits until the CQ under test has notified want times, within
// d, and returns the time of the last notification.
func (r *modRig) waitNotify(want int64, d time.Duration, what string) time.Time {
	r.t.Helper()
	deadline := time.After(d)
	for r.cut.normal.Load() < want {
		select {
		case <-r.cut.notes:
		case <-deadline:
			r.t.Fatalf("%s: notification %d did not come within %v", what, want, d)
		}
	}
	return time.Unix(0, r.cut.lastAt.Load())
}

// M1. ModerationInterval bounds how long a notification may be deferred
// after a completion satisfies the arm: with count MAX and 2000 µs, one
// completion is notified within the interval (plus slack), never before it
// lands.
func testM1(t *T) {
	r := t.newModRig()
	r.needModeration()
	r.control(2000, transport.MaxUint32)
	r.arm()
	r.noNotify(0, "armed, 2000 µs interval, no completion yet")
	t0 := time.Now()
	r.complete(1)
	at := r.waitNotify(1, waitTimeout, "one completion, interval 2000 µs")
	if at.Before(t0) {
		t.Fatalf("notified %v before the completion was posted", t0.Sub(at))
	}
	if lat := at.Sub(t0); lat > 2*time.Millisecond+notifySlack {
		t.Fatalf("notified %v after the completion; the interval allows 2 ms (+%v slack)", lat, notifySlack)
	}
	r.noNotify(1, "one arm, one notification")
}

// M2. Interval 0: no moderation whatever the count says: one completion
// notifies at once although count is 8.
func testM2(t *T) {
	r := t.newModRig()
	r.needModeration()
	r.control(0, 8)
	r.arm()
	r.complete(1)
	r.waitNotify(1, notifySlack, "interval 0, count 8, one completion")
}

// M3. Interval MAX: the count alone controls: 3 of 4 completions do not
// notify, the 4th does.
func testM3(t *T) {
	r := t.newModRig()
	r.needModeration()
	r.control(transport.MaxUint32, 4)
	r.arm()
	r.complete(3)
	r.noNotify(0, "interval MAX, count 4, 3 completions")
	r.complete(1)
	r.waitNotify(1, notifySlack, "interval MAX, count 4, 4th completion")
	r.noNotify(1, "one arm, one notification")
}

// M4. An interval finer than the timer (1 µs) or above the adapter's
// maximum (MAX-1) is accepted, rounded or truncated, and moderation still
// works.
func testM4(t *T) {
	r := t.newModRig()
	r.needModeration()
	r.control(1, transport.MaxUint32)
	r.arm()
	r.complete(1)
	r.waitNotify(1, notifySlack, "interval 1 µs, one completion")
	r.drain()
	r.control(transport.MaxUint32-1, 2)
	r.arm()
	r.complete(2)
	r.waitNotify(2, notifySlack, "interval MAX-1 µs (truncated), count 2, 2 completions")
}

// M5. ModerationCount N with a long interval: no notification until N
// completions accumulate (N-1 stay quiet), the Nth notifies promptly.
func testM5(t *T) {
	r := t.newModRig()
	r.needModeration()
	const n = 4
	r.control(longInterval, n)
	r.arm()
	r.complete(n - 1)
	r.noNotify(0, fmt.Sprintf("count %d, %d completions", n, n-1))
	r.complete(1)
	r.waitNotify(1, notifySlack, fmt.Sprintf("count %d, completion %d (interval 10 s must not be waited out)", n, n))
	r.noNotify(1, "one arm, one notification")
}

// M6. Count 0 or 1: no moderation whatever the interval says.
func testM6(t *T) {
	r := t.newModRig()
	r.needModeration()
	want := int64(0)
	for _, count := range []uint32{0, 1} {
		r.control(longInterval, count)
		r.arm()
		r.complete(1)
		want++
		r.waitNotify(want, notifySlack, fmt.Sprintf("count %d, interval 10 s, one completion", count))
		r.drain()
	}
}

// M7. Count MAX: the interval alone controls: 8 completions give one
// notification, within the interval of the first.
func testM7(t *T) {
	r := t.newModRig()
	r.needModeration()
	const interval = 200 * time.Millisecond
	r.control(uint32(interval/time.Microsecond), transport.MaxUint32)
	r.arm()
	t0 := time.Now()
	r.complete(8)
	at := r.waitNotify(1, waitTimeout, "count MAX, interval 200 ms")
	if lat := at.Sub(t0); lat > interval+notifySlack {
		t.Fatalf("notified %v after the first completion; the interval allows %v (+%v slack)", lat, interval, notifySlack)
	}
	r.noNotify(1, "one arm, 8 completions")
}

// M8. Both MAX fails with ErrInvalidParameterMix, and so does a finite
// count above the CQ's depth; count = depth is accepted.
func testM8(t *T) {
	a := t.adapter()
	t.skipUnless(a.Info().Flags&transport.FlagCQInterruptModerationSupported != 0, "adapter lacks moderation: every call returns ErrNotSupported (M9)")
	c := t.newCQ(a, "m8", min(16, a.Info().MaxCqDepth), -1)
	d := c.Depth()
	for _, tc := range []struct {
		interval, count uint32
		want            error
	}{
		{transport.MaxUint32, transport.MaxUint32, transport.ErrInvalidParameterMix},
		{0, d + 1, transport.ErrInvalidParameterMix},
		{100, d + 1, transport.ErrInvalidParameterMix},
		{transport.MaxUint32, d + 1, transport.ErrInvalidParameterMix},
		{transport.MaxUint32, d, nil},
		{100, d, nil},
		{100, transport.MaxUint32, nil},
	} {
		err := c.ControlInterruptModeration(tc.interval, tc.count)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("ControlInterruptModeration(%d, %d) on a CQ of depth %d: %v, want %v", tc.interval, tc.count, d, err, tc.want)
		}
	}
}

// M9. With the flag, ControlInterruptModeration never returns
// ErrNotSupported; without it, it exists and returns ErrNotSupported.
func testM9(t *T) {
	a := t.adapter()
	supported := a.Info().Flags&transport.FlagCQInterruptModerationSupported != 0
	c := t.newCQ(a, "m9", min(16, a.Info().MaxCqDepth), -1)
	for _, s := range [][2]uint32{{0, 0}, {100, 4}, {transport.MaxUint32, 4}, {100, transport.MaxUint32}, {0, 1}} {
		err := c.ControlInterruptModeration(s[0], s[1])
		switch {
		case supported && errors.Is(err, transport.ErrNotSupported):
			t.Errorf("ControlInterruptModeration(%d, %d) = ErrNotSupported on an adapter with FlagCQInterruptModerationSupported", s[0], s[1])
		case supported && err != nil:
			t.Errorf("ControlInterruptModeration(%d, %d): %v (M12: only ErrInsufficientResources may fail a supported call)", s[0], s[1], err)
		case !supported && !errors.Is(err, transport.ErrNotSupported):
			t.Errorf("ControlInterruptModeration(%d, %d) = %v on an adapter without FlagCQInterruptModerationSupported, want ErrNotSupported", s[0], s[1], err)
		}
	}
}

// M10. The default, before any call, is no moderation; the call may be
// made at any time and any number of times.
func testM10(t *T) {
	r := t.newModRig()
	r.arm()
	r.complete(1)
	r.waitNotify(1, notifySlack, "fresh CQ (no moderation by default), one completion")
	if r.p.cli.info.Flags&transport.FlagCQInterruptModerationSupported == 0 {
		return
	}
	r.drain()
	// Any time: with completions on the CQ, while armed, many times over.
	r.control(longInterval, 4)
	r.arm()
	r.control(0, 0)
	for i := range 20 {
		r.control(uint32(i*100), uint32(i%4))
	}
	r.control(0, 0)
	r.complete(1)
	r.waitNotify(2, notifySlack, "after 23 calls ending with no moderation")
}

// M11. The newest setting wins, never indefinitely late.
func testM11(t *T) {
	r := t.newModRig()
	r.needModeration()
	// A restrictive setting immediately replaced by "none": one completion
	// notifies.
	r.control(transport.MaxUint32, 8)
	r.control(0, 0)
	r.arm()
	r.complete(1)
	r.waitNotify(1, notifySlack, "count 8 then no moderation: one completion")
	r.drain()
	// "None" replaced by count 4: after a moment the newest applies.
	r.control(0, 0)
	r.control(transport.MaxUint32, 4)
	time.Sleep(2 * quiet) // "as soon as possible": give it time to apply
	r.arm()
	r.complete(3)
	r.noNotify(1, "no moderation then count 4: 3 completions")
	r.complete(1)
	r.waitNotify(2, notifySlack, "no moderation then count 4: 4th completion")
}

// M12. The call never pends: it returns at once, nil on an adapter with
// moderation (only lack of resources may fail it), ErrNotSupported
// without.
func testM12(t *T) {
	a := t.adapter()
	supported := a.Info().Flags&transport.FlagCQInterruptModerationSupported != 0
	c := t.newCQ(a, "m12", min(16, a.Info().MaxCqDepth), -1)
	for i := range 100 {
		interval, count := uint32(i*37), uint32(i%8)
		var err error
		t.within(time.Second, "ControlInterruptModeration", func() { err = c.ControlInterruptModeration(interval, count) })
		if supported && err != nil && !errors.Is(err, transport.ErrInsufficientResources) {
			t.Fatalf("ControlInterruptModeration(%d, %d): %v, want nil", interval, count, err)
		}
		if !supported && !errors.Is(err, transport.ErrNotSupported) {
			t.Fatalf("ControlInterruptModeration(%d, %d): %v, want ErrNotSupported", interval, count, err)
		}
	}
}

// M13. Consumers must not call it concurrently on one CQ; a provider may
// defend itself. The test calls it from 8 goroutines while completions
// flow: under -race this must neither crash nor race, and the CQ still
// works afterwards.
func testM13(t *T) {
	r := t.newModRig()
	supported := r.p.cli.info.Flags&transport.FlagCQInterruptModerationSupported != 0
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Stop the callers before the subtest ends, also when it fails early:
	// a goroutine must not report into a finished test.
	halt := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer halt()
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				interval := []uint32{0, 50, 2000, transport.MaxUint32}[(g+i)%4]
				count := []uint32{0, 1, 4, transport.MaxUint32}[(g+2*i)%4]
				if interval == transport.MaxUint32 && count == transport.MaxUint32 {
					count = 2
				}
				err := r.cut.ControlInterruptModeration(interval, count)
				if supported && err != nil && !errors.Is(err, transport.ErrInsufficientResources) {
					t.Errorf("concurrent ControlInterruptModeration(%d, %d): %v", interval, count, err)
					return
				}
				if !supported && !errors.Is(err, transport.ErrNotSupported) {
					t.Errorf("concurrent ControlInterruptModeration(%d, %d): %v, want ErrNotSupported", interval, count, err)
					return
				}
				if i%16 == 15 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	for range 5 {
		r.arm()
		r.complete(4)
		r.drain()
	}
	halt()
	if supported {
		r.control(0, 0)
	}
	before := r.cut.normal.Load()
	r.arm()
	r.complete(1)
	r.waitNotify(before+1, waitTimeout, "after the concurrent calls, no moderation, one completion")
}
