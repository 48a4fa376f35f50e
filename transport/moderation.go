package transport

import (
	"fmt"
	"time"
)

// Adaptive interrupt moderation, in the spirit of Linux's dynamic interrupt
// moderation (lib/dim, rdma_dim.c): a per-CQ controller that is fed one
// sample per notification and walks a small profile of (interval, count)
// settings. It is pure: no provider, no clock, no goroutine; time comes in
// as the gap between notifications. The Engine owns one per core and calls
// CQ.ControlInterruptModeration only when its choice changes.
//
// The policy, per window of Window non-empty notifications, where cpn is
// the mean number of completions per notification over the window and k the
// current level's count:
//
//  1. Down (timer-driven): at a level above 0, cpn < 3k/4 means the count is
//     rarely reached, so notifications are fired by the interval timer and
//     every completion in them waited for it: added latency. Jump to the
//     highest level whose count the observed cpn already reaches (level 0
//     if none). At queue depth 1 cpn is ≈1, below every count: level 0, no
//     moderation, no added latency.
//  2. Up (count-driven): cpn ≥ max(k, Profile[1].Count) means the count is
//     reached on average (at level 0: the natural batch already fills level
//     1's count), so the load could batch more: step up one level. The step
//     is a probe.
//  3. Probe check: the window after a step up is compared with the window
//     before it. If the completion rate fell by more than RateDropPercent
//     (a closed loop slowed down because we made it wait), or rule 1 fires,
//     the step is undone and further probes of that level are parked for
//     a back-off that doubles on each failed probe of it (2, 4, …,
//     MaxParkWindows windows) and resets when a probe of it succeeds.
//     Parking counts windows, so it does not expire while idle, and an
//     idle reset (rule 4) keeps it. The back-off is per level, so that a load
//     that keeps level 1 but cannot keep level 2 settles instead of
//     probing level 2 every few windows. This is lib/dim's "stats worse →
//     turn back" plus its "tired" parking, with the same 10% significance.
//  4. Idle: a notification that arrives IdleGap or more after the previous
//     one, carrying less than level 1's count, means the load stopped; the
//     controller drops to level 0 at once (so the next lone request pays no
//     timer) and discards the window. A late notification with a full
//     batch is a busy CPU under a deep queue, and counts as a sample.
//
// Empty notifications (n = 0: the engine's arm-then-poll consumed the
// completion that fired it) are not samples; they would halve cpn for no
// reason.

// ModerationLevel is one step of a moderation profile: the arguments of
// CQ.ControlInterruptModeration.
type ModerationLevel struct {
	// Interval is the longest time, in microseconds, that a notification
	// may be deferred (M1); 0 means no moderation (M2).
	Interval uint32
	// Count is the most completions that may accumulate before the
	// notification (M5); 0 or 1 means no moderation (M6).
	Count uint32
}

// Off reports whether the level means no moderation (M2, M6).
func (l ModerationLevel) Off() bool { return l.Interval == 0 || l.Count <= 1 }

func (l ModerationLevel) String() string {
	if l.Off() {
		return "off"
	}
	return fmt.Sprintf("%dus/%d", l.Interval, l.Count)
}

// DefaultModerationProfile returns the default profile. Level 0 is no
// moderation. Counts double from 4 to 32, the span of rdma_dim's profile
// (1 to 32 completions); each interval is 2 µs per awaited completion. A
// level is only kept while its count is reached (rule 1), so the interval
// is a bound on the tail — the latency a burst that stops short of the
// count pays — not the usual delay; 2 µs per completion keeps that bound
// under the inter-completion time of a loaded software or hardware
// provider. The top count, 32, stays below DefaultPollBatch so one Poll
// drains one moderated batch.
func DefaultModerationProfile() []ModerationLevel {
	return []ModerationLevel{
		{Interval: 0, Count: 0},
		{Interval: 8, Count: 4},
		{Interval: 16, Count: 8},
		{Interval: 32, Count: 16},
		{Interval: 64, Count: 32},
	}
}

// Moderation defaults.
const (
	// DefaultModerationWindow is the number of non-empty notifications per
	// decision: a quarter of lib/dim's DIM_NEVENTS (64), because each of
	// our samples is already a batch of completions, and a probe that
	// hurts latency must be undone within tens of round trips.
	DefaultModerationWindow = 16
	// DefaultIdleGap: a silence of 1 ms is over 15 times the longest
	// default interval, so it can only mean that the load stopped.
	DefaultIdleGap = time.Millisecond
	// DefaultRateDropPercent is lib/dim's IS_SIGNIFICANT_DIFF threshold.
	DefaultRateDropPercent = 10
	// DefaultMaxParkWindows caps the probe back-off (64 windows of 16
	// notifications: about a thousand notifications between probes).
	DefaultMaxParkWindows = 64
	// firstParkWindows is the back-off after the first failed probe.
	firstParkWindows = 2
)

// ModerationConfig configures the adaptive moderation controller.
type ModerationConfig struct {
	// Off disables adaptive moderation: the engine never calls
	// ControlInterruptModeration and the CQs keep the provider default,
	// no moderation (M10).
	Off bool
	// Profile is the list of settings the controller walks. Profile[0]
	// must be "off" (Interval 0), counts must strictly increase, and the
	// largest count must not exceed the CQ depth (M8). Default:
	// DefaultModerationProfile().
	Profile []ModerationLevel
	// Window is the number of non-empty notifications per decision.
	// Default DefaultModerationWindow.
	Window uint32
	// IdleGap is the silence after which the controller returns to level
	// 0 at once. It must exceed the largest interval. Default
	// DefaultIdleGap.
	IdleGap time.Duration
	// RateDropPercent: a probe is undone when the completion rate of the
	// window after it is more than this many percent below the window
	// before it. 0 takes the default, DefaultRateDropPercent; at most 99.
	RateDropPercent uint32
	// MaxParkWindows caps the back-off after failed probes, in windows.
	// Default DefaultMaxParkWindows.
	MaxParkWindows uint32
}

// WithDefaults returns c with zero fields set to their defaults (Off is
// kept). The profile is copied.
func (c ModerationConfig) WithDefaults() ModerationConfig {
	if len(c.Profile) == 0 {
		c.Profile = DefaultModerationProfile()
	} else {
		c.Profile = append([]ModerationLevel(nil), c.Profile...)
	}
	if c.Window == 0 {
		c.Window = DefaultModerationWindow
	}
	if c.IdleGap == 0 {
		c.IdleGap = DefaultIdleGap
	}
	if c.RateDropPercent == 0 {
		c.RateDropPercent = DefaultRateDropPercent
	}
	if c.MaxParkWindows == 0 {
		c.MaxParkWindows = DefaultMaxParkWindows
	}
	return c
}

// Validate checks a configuration (after WithDefaults) against a CQ of
// cqDepth completions. Errors wrap ErrInvalidParameter.
func (c ModerationConfig) Validate(cqDepth uint32) error {
	if c.Off {
		return nil
	}
	p := c.Profile
	if len(p) == 0 {
		return fmt.Errorf("%w: moderation profile is empty", ErrInvalidParameter)
	}
	if !p[0].Off() {
		return fmt.Errorf("%w: moderation profile level 0 must be off, is %v", ErrInvalidParameter, p[0])
	}
	var maxInterval uint32
	for i := 1; i < len(p); i++ {
		l := p[i]
		if l.Off() || l.Interval == MaxUint32 || l.Count == MaxUint32 {
			// Off levels above 0 would make "up" meaningless; MAX values
			// hand moderation to one knob (M3, M7), which the policy's
			// reasoning about count-driven vs timer-driven batches does
			// not cover.
			return fmt.Errorf("%w: moderation level %d (%v) must have a finite interval > 0 and count > 1", ErrInvalidParameter, i, l)
		}
		if i > 1 && l.Count <= p[i-1].Count {
			return fmt.Errorf("%w: moderation counts must increase (level %d: %d after %d)", ErrInvalidParameter, i, l.Count, p[i-1].Count)
		}
		if l.Count > cqDepth {
			// M8: a finite count above the CQ depth is refused.
			return fmt.Errorf("%w: moderation count %d exceeds the CQ depth %d (M8)", ErrInvalidParameter, l.Count, cqDepth)
		}
		maxInterval = max(maxInterval, l.Interval)
	}
	if c.Window == 0 {
		return fmt.Errorf("%w: moderation window must be at least 1 notification", ErrInvalidParameter)
	}
	if c.IdleGap <= time.Duration(maxInterval)*time.Microsecond {
		return fmt.Errorf("%w: moderation idle gap %v must exceed the largest interval %dus", ErrInvalidParameter, c.IdleGap, maxInterval)
	}
	if c.RateDropPercent == 0 || c.RateDropPercent > 99 {
		return fmt.Errorf("%w: moderation rate drop must be 1..99 percent, is %d", ErrInvalidParameter, c.RateDropPercent)
	}
	if c.MaxParkWindows == 0 {
		return fmt.Errorf("%w: moderation max park must be at least 1 window", ErrInvalidParameter)
	}
	return nil
}

// moderatorState is the controller's state; Observe owns the transitions.
type moderatorState uint8

const (
	// moderatorSettled: collecting a window at a level the load has kept.
	moderatorSettled moderatorState = iota
	// moderatorProbing: just stepped up; the current window decides
	// whether the step stays.
	moderatorProbing
)

// ModeratorStats counts the controller's decisions.
type ModeratorStats struct {
	Samples      uint64 // non-empty notifications observed
	Windows      uint64 // decisions taken
	Ups          uint64 // probes started
	Downs        uint64 // timer-driven step downs (rule 1)
	FailedProbes uint64 // probes undone (rule 3)
	IdleResets   uint64 // returns to level 0 after a silence (rule 4)
}

// Moderator is the adaptive moderation controller of one CQ. The zero
// value is not usable; create it with NewModerator. It is not safe for
// concurrent use: the engine calls it from the CQ's notification goroutine
// only.
type Moderator struct {
	cfg   ModerationConfig
	level int
	state moderatorState

	// The window being collected.
	notifs, comps uint64
	dur           time.Duration

	// The probe under way: the level it left and that window's rate.
	probeFrom int
	baseComps uint64
	baseDur   time.Duration

	// Per level: the last window of its current parking (a probe of it
	// may start only in a later window), and the park length after its
	// next failed probe.
	parkedUntil []uint64
	backoff     []uint32

	stats ModeratorStats
}

// NewModerator returns a controller at level 0 (no moderation, the CQ's
// default, M10). cfg is completed with WithDefaults and must validate.
func NewModerator(cfg ModerationConfig) *Moderator {
	m := &Moderator{}
	m.init(cfg)
	return m
}

func (m *Moderator) init(cfg ModerationConfig) {
	cfg = cfg.WithDefaults()
	*m = Moderator{
		cfg:         cfg,
		parkedUntil: make([]uint64, len(cfg.Profile)),
		backoff:     make([]uint32, len(cfg.Profile)),
	}
	for i := range m.backoff {
		m.backoff[i] = firstParkWindows
	}
}

// Level is the index of the current setting in the profile.
func (m *Moderator) Level() int { return m.level }

// Setting is the current setting.
func (m *Moderator) Setting() ModerationLevel { return m.cfg.Profile[m.level] }

// Stats returns the decision counters.
func (m *Moderator) Stats() ModeratorStats { return m.stats }

// SetLevel forces a level (the engine uses it to undo a choice the
// provider refused) and restarts measuring.
func (m *Moderator) SetLevel(level int) {
	m.level = min(max(level, 0), len(m.cfg.Profile)-1)
	m.state = moderatorSettled
	m.resetWindow()
}

func (m *Moderator) resetWindow() { m.notifs, m.comps, m.dur = 0, 0, 0 }

// count is level l's count, 1 for "off".
func (m *Moderator) count(l int) uint64 {
	if m.cfg.Profile[l].Off() {
		return 1
	}
	return uint64(m.cfg.Profile[l].Count)
}

// Observe feeds one notification: n completions were handled, gap after
// the previous non-empty notification (0 for the first). It returns the
// setting to use and whether it differs from the previous one.
func (m *Moderator) Observe(n uint32, gap time.Duration) (ModerationLevel, bool) {
	if n == 0 {
		return m.Setting(), false
	}
	m.stats.Samples++
	if gap >= m.cfg.IdleGap && (len(m.cfg.Profile) < 2 || uint64(n) < m.count(1)) {
		// Rule 4. The silence is not part of any window. A long gap that
		// ends with a full batch (at least the first level's count) is
		// load, not idleness: under a busy CPU, notifications of a deep
		// queue arrive more than IdleGap apart, and resetting on them
		// would keep the controller from ever stepping up.
		changed := m.level != 0
		if changed {
			m.stats.IdleResets++
		}
		m.level, m.state = 0, moderatorSettled
		m.notifs, m.comps, m.dur = 1, uint64(n), 0
		return m.Setting(), changed
	}
	m.notifs++
	m.comps += uint64(n)
	m.dur += gap
	if m.notifs < uint64(m.cfg.Window) {
		return m.Setting(), false
	}
	prev := m.level
	m.decide()
	return m.Setting(), m.level != prev
}

// decide closes the window and applies rules 1–3.
func (m *Moderator) decide() {
	c, n, d := m.comps, m.notifs, m.dur
	m.resetWindow()
	m.stats.Windows++
	top := len(m.cfg.Profile) - 1
	timerDriven := func() bool { return m.level > 0 && 4*c < 3*m.count(m.level)*n }

	if m.state == moderatorProbing {
		m.state = moderatorSettled
		if timerDriven() || m.slower(c, d) {
			// Rule 3: undo the step and park.
			m.stats.FailedProbes++
			l := m.level
			m.parkedUntil[l] = m.stats.Windows + uint64(m.backoff[l])
			m.backoff[l] = min(2*m.backoff[l], m.cfg.MaxParkWindows)
			m.level = m.probeFrom
			return
		}
		m.backoff[m.level] = firstParkWindows
	}
	if timerDriven() {
		// Rule 1: jump to the highest level whose count cpn reaches.
		m.stats.Downs++
		l := m.level - 1
		for l > 0 && c < m.count(l)*n {
			l--
		}
		m.level = l
		return
	}
	if m.level < top && m.stats.Windows > m.parkedUntil[m.level+1] {
		up := m.count(m.level)
		if top >= 1 {
			up = max(up, m.count(1))
		}
		if c >= up*n {
			// Rule 2: probe one level up.
			m.stats.Ups++
			m.probeFrom = m.level
			m.baseComps, m.baseDur = c, d
			m.level++
			m.state = moderatorProbing
		}
	}
}

// slower reports whether a window of c completions over d ran more than
// RateDropPercent slower than the window before the probe. Windows of
// unknown duration (all gaps 0) compare as equal.
func (m *Moderator) slower(c uint64, d time.Duration) bool {
	if d <= 0 || m.baseDur <= 0 || m.baseComps == 0 {
		return false
	}
	base := float64(m.baseComps) / float64(m.baseDur)
	now := float64(c) / float64(d)
	return now < base*float64(100-m.cfg.RateDropPercent)/100
}
