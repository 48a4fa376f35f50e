package transport_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/transport"
)

// A plant is the load behind a CQ: given the current moderation setting,
// it returns the next notification's sample (completions, gap since the
// previous one). Like lib/dim's tests, the controller is driven window by
// window and the profile index it steps through is checked.
type plant func(l transport.ModerationLevel, i int) (n uint32, gap time.Duration)

// open is an open-loop load: the offered rate does not depend on the
// setting, so every notification carries n completions gap apart.
func open(n uint32, gap time.Duration) plant {
	return func(transport.ModerationLevel, int) (uint32, time.Duration) { return n, gap }
}

// closedLoop models q requests in flight with round trip rtt: each round
// trip completes q requests in one notification; if the count cannot be
// reached (count > q) the notification waits for the interval timer,
// which lengthens the round trip.
func closedLoop(q uint32, rtt time.Duration) plant {
	return func(l transport.ModerationLevel, _ int) (uint32, time.Duration) {
		if !l.Off() && l.Count > q {
			return q, rtt + time.Duration(l.Interval)*time.Microsecond
		}
		return q, rtt
	}
}

// then switches from plant a to plant b after `after` samples.
func then(a plant, after int, b plant) plant {
	return func(l transport.ModerationLevel, i int) (uint32, time.Duration) {
		if i < after {
			return a(l, i)
		}
		return b(l, i)
	}
}

func TestModeratorProfileSteps(t *testing.T) {
	const w = transport.DefaultModerationWindow
	cases := []struct {
		name    string
		plant   plant
		windows int
		// levels is the profile index after each window ("-" = any),
		// written as a string of digits, one per window.
		levels string
		check  func(t *testing.T, s transport.ModeratorStats)
	}{
		{
			name:    "QD1 stays off",
			plant:   open(1, 20*time.Microsecond),
			windows: 20,
			levels:  "00000000000000000000",
			check: func(t *testing.T, s transport.ModeratorStats) {
				if s.Ups != 0 || s.Downs != 0 {
					t.Errorf("QD1 moved: %+v", s)
				}
			},
		},
		{
			// Two completions per notification (a send and its reply)
			// is not a deep queue: level 1's count, 4, is not reached.
			name:    "send+receive pairs stay off",
			plant:   open(2, 30*time.Microsecond),
			windows: 10,
			levels:  "0000000000",
		},
		{
			name:    "deep open loop climbs one level per window",
			plant:   open(40, 50*time.Microsecond),
			windows: 8,
			levels:  "12344444",
		},
		{
			// Just enough batching for level 1, not for level 2.
			name:    "cpn 5 settles at level 1",
			plant:   open(5, 10*time.Microsecond),
			windows: 8,
			// Probe of level 2 at window 2, undone at 3 and parked 2
			// windows (4, 5), probed again at 6, undone at 7.
			levels: "12111211",
			check: func(t *testing.T, s transport.ModeratorStats) {
				// 5 < 3/4 of 8: each probe of level 2 is undone at once.
				if s.FailedProbes != 2 {
					t.Errorf("failed probes = %d, want 2", s.FailedProbes)
				}
			},
		},
		{
			name:    "deep then QD1 drops straight to off",
			plant:   then(open(40, 50*time.Microsecond), 5*w, open(1, 20*time.Microsecond)),
			windows: 7,
			levels:  "1234400",
			check: func(t *testing.T, s transport.ModeratorStats) {
				if s.Downs != 1 {
					t.Errorf("downs = %d, want 1 jump", s.Downs)
				}
			},
		},
		{
			// Window 5 was the probe of level 4: undone (back to 3,
			// level 4 parked); window 6 at level 3 is timer-driven and
			// jumps to level 2 (count 8 ≤ 10); 10 ≥ 8 probes level 3
			// at window 7, undone at 8 (10 < 3/4 of 16).
			name:    "deep then cpn 10 jumps to level 2",
			plant:   then(open(40, 50*time.Microsecond), 4*w, open(10, 20*time.Microsecond)),
			windows: 8,
			levels:  "12343232",
		},
		{
			// The controller may not leave a lone request waiting: one
			// notification after a 2 ms silence resets to off at once,
			// mid-window.
			name:    "idle resets",
			plant:   then(open(40, 50*time.Microsecond), 4*w, then(open(1, 2*time.Millisecond), 4*w+1, open(40, 50*time.Microsecond))),
			windows: 6,
			levels:  "123412",
			check: func(t *testing.T, s transport.ModeratorStats) {
				if s.IdleResets != 1 {
					t.Errorf("idle resets = %d, want 1", s.IdleResets)
				}
			},
		},
		{
			// A busy CPU under a deep queue: full batches arriving more
			// than IdleGap apart are load, not silence. (Seen in CI:
			// 31 completions per notification at ~1.2 ms gaps kept
			// resetting the window, and the controller never stepped up.)
			name:    "late full batches still climb",
			plant:   open(31, 1200*time.Microsecond),
			windows: 6,
			levels:  "123444",
			check: func(t *testing.T, s transport.ModeratorStats) {
				if s.IdleResets != 0 || s.Ups == 0 {
					t.Errorf("late full batches: %+v, want climbing and no idle resets", s)
				}
			},
		},
		{
			// Closed loop, QD 32: count 32 is reachable, the rate never
			// drops, so the controller reaches the top level.
			name:    "closed loop QD32 reaches the top",
			plant:   closedLoop(32, 40*time.Microsecond),
			windows: 6,
			levels:  "123444",
		},
		{
			// Closed loop, QD 12: level 3 (count 16) is never reached;
			// the timer makes every round trip 32 µs longer: the rate
			// falls by 44% and the probe is undone, then parked with a
			// back-off that doubles: 2, 4, 8 windows.
			name:    "closed loop QD12 probe undone and parked",
			plant:   closedLoop(12, 40*time.Microsecond),
			windows: 24,
			// Probe of level 3 at window 3, undone at 4, parked 2
			// (5, 6); probed at 7, undone at 8, parked 4 (9–12); probed
			// at 13, undone at 14, parked 8 (15–22); probed at 23.
			levels: "123222322222322222222232",
			check: func(t *testing.T, s transport.ModeratorStats) {
				if s.FailedProbes != 4 {
					t.Errorf("failed probes = %d, want 4", s.FailedProbes)
				}
			},
		},
		{
			// The back-off is per level: the load drops to cpn 2
			// (level 0) for a window and comes back; the successful
			// probes of levels 1 and 2 do not reset level 3's
			// back-off, so level 3 is not probed again before its
			// parking ends.
			name: "back-off survives other levels' probes",
			plant: then(closedLoop(12, 40*time.Microsecond), 8*w,
				then(open(2, 40*time.Microsecond), 9*w, closedLoop(12, 40*time.Microsecond))),
			windows: 16,
			// Windows 1–8 as in the QD12 case: level 3 failed twice,
			// parked through window 12. Window 9 (cpn 2) jumps to 0;
			// 10 and 11 probe 1 and 2 successfully; 12 is still parked
			// for level 3; 13 probes it, 14 undoes it (parked 8).
			levels: "1232223201223222",
		},
		{
			// An idle reset (a lone request after 5 ms of silence) drops
			// to level 0 but keeps level 3's parking (through window 12):
			// the climb back stops at 2 until window 13.
			name: "idle keeps the back-off",
			plant: then(closedLoop(12, 40*time.Microsecond), 8*w,
				then(open(1, 5*time.Millisecond), 8*w+1, closedLoop(12, 40*time.Microsecond))),
			windows: 14,
			levels:  "12322232122232",
			check: func(t *testing.T, s transport.ModeratorStats) {
				if s.IdleResets != 1 {
					t.Errorf("idle resets = %d, want 1", s.IdleResets)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := transport.NewModerator(transport.ModerationConfig{})
			var got strings.Builder
			i := 0
			for range tc.windows {
				for range w {
					n, gap := tc.plant(m.Setting(), i)
					m.Observe(n, gap)
					i++
				}
				fmt.Fprintf(&got, "%d", m.Level())
			}
			if got.String() != tc.levels {
				t.Errorf("levels per window = %s, want %s (stats %+v)", got.String(), tc.levels, m.Stats())
			}
			if tc.check != nil {
				tc.check(t, m.Stats())
			}
		})
	}
}

func TestModeratorObserveReportsChanges(t *testing.T) {
	m := transport.NewModerator(transport.ModerationConfig{Window: 2})
	prof := transport.DefaultModerationProfile()
	steps := []struct {
		n       uint32
		gap     time.Duration
		want    transport.ModerationLevel
		changed bool
	}{
		{8, 10 * time.Microsecond, prof[0], false},
		{8, 10 * time.Microsecond, prof[1], true},  // window closes, cpn 8 ≥ 4
		{0, 10 * time.Microsecond, prof[1], false}, // empty: not a sample
		{8, 10 * time.Microsecond, prof[1], false},
		{8, 10 * time.Microsecond, prof[2], true}, // probe accepted, up again
		{1, 5 * time.Millisecond, prof[0], true},  // idle
		{1, 10 * time.Microsecond, prof[0], false},
	}
	for i, s := range steps {
		got, changed := m.Observe(s.n, s.gap)
		if got != s.want || changed != s.changed {
			t.Fatalf("step %d: Observe(%d, %v) = %v, %v; want %v, %v", i, s.n, s.gap, got, changed, s.want, s.changed)
		}
	}
}

func TestModeratorSetLevel(t *testing.T) {
	m := transport.NewModerator(transport.ModerationConfig{})
	m.SetLevel(3)
	if m.Level() != 3 || m.Setting() != transport.DefaultModerationProfile()[3] {
		t.Fatalf("SetLevel(3): level %d setting %v", m.Level(), m.Setting())
	}
	m.SetLevel(99)
	if m.Level() != len(transport.DefaultModerationProfile())-1 {
		t.Fatalf("SetLevel(99) not clamped: %d", m.Level())
	}
	m.SetLevel(-1)
	if m.Level() != 0 {
		t.Fatalf("SetLevel(-1) not clamped: %d", m.Level())
	}
}

func TestModerationConfigValidate(t *testing.T) {
	ok := transport.ModerationConfig{}.WithDefaults()
	if err := ok.Validate(5120); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if err := (transport.ModerationConfig{Off: true, Profile: []transport.ModerationLevel{{1, 1}}}).Validate(1); err != nil {
		t.Fatalf("Off config must not be checked: %v", err)
	}
	cases := map[string]struct {
		mutate func(c *transport.ModerationConfig)
		depth  uint32
	}{
		"level 0 not off": {func(c *transport.ModerationConfig) { c.Profile[0] = transport.ModerationLevel{Interval: 4, Count: 4} }, 5120},
		"off above 0":     {func(c *transport.ModerationConfig) { c.Profile[2] = transport.ModerationLevel{} }, 5120},
		"count MAX":       {func(c *transport.ModerationConfig) { c.Profile[4].Count = transport.MaxUint32 }, 5120},
		"interval MAX":    {func(c *transport.ModerationConfig) { c.Profile[4].Interval = transport.MaxUint32 }, 5120},
		"not increasing":  {func(c *transport.ModerationConfig) { c.Profile[3].Count = 8 }, 5120},
		"count > depth":   {func(c *transport.ModerationConfig) {}, 16},
		"empty profile":   {func(c *transport.ModerationConfig) { c.Profile = nil }, 5120},
		"idle gap small":  {func(c *transport.ModerationConfig) { c.IdleGap = 64 * time.Microsecond }, 5120},
		"rate drop 100":   {func(c *transport.ModerationConfig) { c.RateDropPercent = 100 }, 5120},
		"window 0":        {func(c *transport.ModerationConfig) { c.Window = 0 }, 5120},
		"park 0":          {func(c *transport.ModerationConfig) { c.MaxParkWindows = 0 }, 5120},
	}
	for name, tc := range cases {
		c := transport.ModerationConfig{}.WithDefaults()
		tc.mutate(&c)
		if err := c.Validate(tc.depth); !errors.Is(err, transport.ErrInvalidParameter) {
			t.Errorf("%s: Validate = %v, want ErrInvalidParameter", name, err)
		}
	}
}

func TestModerationLevelOff(t *testing.T) {
	for _, tc := range []struct {
		l   transport.ModerationLevel
		off bool
	}{
		{transport.ModerationLevel{0, 0}, true},
		{transport.ModerationLevel{0, 32}, true}, // M2
		{transport.ModerationLevel{64, 1}, true}, // M6
		{transport.ModerationLevel{64, 0}, true}, // M6
		{transport.ModerationLevel{8, 4}, false},
	} {
		if tc.l.Off() != tc.off {
			t.Errorf("%+v.Off() = %v", tc.l, !tc.off)
		}
	}
}

func BenchmarkModeratorObserve(b *testing.B) {
	m := transport.NewModerator(transport.ModerationConfig{})
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m.Observe(uint32(1+i%40), 20*time.Microsecond)
	}
}
