package soft

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/transport"
)

// cq is a completion queue: a ring of completions filled by QP goroutines
// and drained by Poll, plus a notification goroutine pinned to the CQ's
// affinity that applies moderation and runs the callback.
type cq struct {
	a      *Adapter
	depth  uint32
	notify transport.NotifyFunc
	nctx   any
	cpu    int
	pinned atomic.Bool
	kick   chan struct{}
	stop   chan struct{}
	group  *pollGroup // Config.PollGroup: the loop that replaces run

	mu       sync.Mutex
	ring     []transport.Completion
	owner    []*qp // per ring slot: the QP whose initiator slot the entry holds (Q4)
	head, n  uint32
	closed   bool
	overflow bool // C3: the CQ overran and is in error
	overRep  bool // the overflow was reported to the callback
	armed    bool
	armType  transport.ArmType
	pending  uint32    // completions that satisfy the current arm
	firstAt  time.Time // when the first of them arrived

	// Moderation (M1–M13): the setting given by the consumer is published
	// in mod and taken by the notification goroutine (M11).
	mod        atomic.Uint64 // interval<<32 | count
	modCount   uint32        // applied setting, read under mu
	modOn      bool
	modControl sync.Mutex // M13: the provider defends itself

	// Counters.
	completions   atomic.Uint64
	notifications atomic.Uint64
}

func (a *Adapter) CreateCQ(cfg transport.CQConfig) (transport.CQ, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	if cfg.Depth == 0 || cfg.Depth > a.info.MaxCqDepth {
		return nil, fmt.Errorf("soft: CQ depth %d (max %d): %w", cfg.Depth, a.info.MaxCqDepth, transport.ErrInvalidParameter)
	}
	c := &cq{
		a:      a,
		depth:  cfg.Depth,
		notify: cfg.Notify,
		nctx:   cfg.Context,
		cpu:    cfg.Affinity,
		ring:   make([]transport.Completion, cfg.Depth),
		owner:  make([]*qp, cfg.Depth),
		kick:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	started := make(chan struct{})
	if a.cfg.PollGroup {
		if err := c.startPoll(started); err != nil {
			return nil, err
		}
	} else {
		go c.run(started)
	}
	<-started
	a.track(c, true)
	return c, nil
}

func (c *cq) Depth() uint32 { return c.depth }

// push adds a completion. It returns false when the CQ overflowed (the
// completion is lost and the CQ is in error: C3).
//
// owner, when set, is the QP whose initiator queue slot this completion
// still holds: the slot is freed when the consumer polls the completion,
// so a QP never has more than its InitiatorQueueDepth requests between
// post and poll (Q4), and a CQ sized to the sum of its QPs' depths never
// overruns.
func (c *cq) push(comp *transport.Completion, solicited bool, owner *qp) bool {
	c.mu.Lock()
	if c.closed || c.overflow {
		c.mu.Unlock()
		return false
	}
	if c.n == c.depth {
		c.overflow = true
		c.mu.Unlock()
		c.wake()
		return false
	}
	i := c.head + c.n
	if i >= c.depth {
		i -= c.depth
	}
	c.ring[i] = *comp
	c.owner[i] = owner
	c.n++
	wake := false
	if c.armed && c.satisfies(comp, solicited) {
		c.pending++
		if c.pending == 1 {
			c.firstAt = time.Now()
			wake = true
		} else if c.modOn && c.pending >= c.modCount {
			wake = true
		}
	}
	c.mu.Unlock()
	c.completions.Add(1)
	if wake {
		c.wake()
	}
	return true
}

func (c *cq) satisfies(comp *transport.Completion, solicited bool) bool {
	switch c.armType {
	case transport.NotifyErrors:
		return comp.Status != nil
	case transport.NotifySolicited:
		return comp.Status != nil || solicited
	}
	return true
}

func (c *cq) wake() {
	if c.group != nil {
		c.group.kick()
		return
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Poll moves up to len(out) completions into out.
func (c *cq) Poll(out []transport.Completion) int {
	c.mu.Lock()
	k := min(c.n, uint32(len(out)))
	for j := uint32(0); j < k; j++ {
		out[j] = c.ring[c.head]
		c.ring[c.head] = transport.Completion{}
		if q := c.owner[c.head]; q != nil {
			q.outstanding.Add(-1)
			c.owner[c.head] = nil
		}
		c.head++
		if c.head == c.depth {
			c.head = 0
		}
	}
	c.n -= k
	c.mu.Unlock()
	return int(k)
}

// Arm requests one notification (C4). Completions already on the CQ that
// satisfy the arm count, so arm-then-poll never misses one.
func (c *cq) Arm(t transport.ArmType) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return transport.ErrClosed
	}
	if c.overflow {
		c.mu.Unlock()
		return transport.ErrCQOverflow
	}
	c.armed = true
	c.armType = t
	c.pending = 0
	if t != transport.NotifySolicited {
		for j := uint32(0); j < c.n; j++ {
			i := c.head + j
			if i >= c.depth {
				i -= c.depth
			}
			if c.satisfies(&c.ring[i], false) {
				c.pending++
			}
		}
	}
	wake := c.pending > 0
	if wake {
		c.firstAt = time.Now()
	}
	c.mu.Unlock()
	if wake {
		c.wake()
	}
	return nil
}

// ControlInterruptModeration sets moderation (M1–M13). It never pends
// (M12); the notification goroutine takes the newest setting before it
// next decides (M11).
func (c *cq) ControlInterruptModeration(interval, count uint32) error {
	c.modControl.Lock() // M13: defend against concurrent callers
	defer c.modControl.Unlock()
	if interval == transport.MaxUint32 && count == transport.MaxUint32 {
		return fmt.Errorf("soft: moderation interval and count both MAXULONG: %w", transport.ErrInvalidParameterMix)
	}
	if count != transport.MaxUint32 && count > c.depth {
		return fmt.Errorf("soft: moderation count %d above CQ depth %d: %w", count, c.depth, transport.ErrInvalidParameterMix)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return transport.ErrClosed
	}
	c.mod.Store(uint64(interval)<<32 | uint64(count))
	c.wake()
	return nil
}

// moderation turns a setting into (on, count, interval): on is false when
// there is no moderation (M2, M6); count 0 means "no count limit" (M7);
// interval 0 means "no time limit" (M3).
func moderation(setting uint64) (on bool, count uint32, interval time.Duration) {
	iv, cnt := uint32(setting>>32), uint32(setting)
	if iv == 0 || cnt <= 1 { // M2, M6
		return false, 0, 0
	}
	if iv != transport.MaxUint32 { // M4: microseconds, the timer's grain
		interval = time.Duration(iv) * time.Microsecond
	}
	if cnt != transport.MaxUint32 {
		count = cnt
	}
	return true, count, interval
}

// run is the notification goroutine (goroutine-per-QP mode; the poll
// group's loop, runPoll, does the same with its own timer).
func (c *cq) run(started chan<- struct{}) {
	c.pinned.Store(pinThread(c.cpu))
	close(started)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	timerOn := false
	var applied uint64
	for {
		select {
		case <-c.kick:
		case <-timer.C:
			timerOn = false
		case <-c.stop:
			timer.Stop()
			if c.notify != nil {
				c.notify(c.nctx, transport.ErrClosed)
			}
			return
		}
		fire, status, wait := c.decide(&applied)
		if fire {
			if timerOn && status == nil {
				timer.Stop()
				timerOn = false
			}
			c.fire(status)
			continue
		}
		if wait > 0 {
			// M1: never later than interval after the first completion.
			timer.Reset(wait)
			timerOn = true
		}
	}
}

// decide takes the newest moderation setting (M11; applied is the one in
// force, updated) and says what the notifier does now: fire a notification
// with status (nil, or ErrCQOverflow once), or, when an armed notification
// waits for its moderation interval, wait at most that long (0: no timer).
func (c *cq) decide(applied *uint64) (fire bool, status error, wait time.Duration) {
	setting := c.mod.Load()
	on, count, interval := moderation(setting)
	c.mu.Lock()
	if setting != *applied {
		*applied = setting
		c.modOn, c.modCount = on, count
		if !on || count == 0 {
			c.modCount = transport.MaxUint32
		}
	}
	if c.overflow && !c.overRep {
		c.overRep = true
		c.armed = false
		c.mu.Unlock()
		return true, transport.ErrCQOverflow, 0
	}
	if !c.armed || c.pending == 0 {
		c.mu.Unlock()
		return false, nil, 0
	}
	if !on || (count != 0 && c.pending >= count) {
		c.armed = false
		c.pending = 0
		c.mu.Unlock()
		return true, nil, 0
	}
	if interval != 0 {
		since := time.Since(c.firstAt)
		if since >= interval {
			c.armed = false
			c.pending = 0
			c.mu.Unlock()
			return true, nil, 0
		}
		wait = interval - since
	}
	c.mu.Unlock()
	return false, nil, wait
}

func (c *cq) fire(status error) {
	c.notifications.Add(1)
	if c.notify != nil {
		c.notify(c.nctx, status)
	}
}

func (c *cq) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	// Not waiting for the goroutine: Close may be called from the
	// notification callback itself.
	close(c.stop)
	if c.group != nil {
		c.group.kick()
	}
	c.a.track(c, false)
	return nil
}

// Stats are a CQ's counters.
type CQStats struct {
	Completions, Notifications uint64
	// Pinned says the notification goroutine runs on a thread pinned to
	// the CQ's affinity.
	Pinned bool
	// Poll-group mode (Config.PollGroup): PollWakes counts eventfd writes
	// (a post or completion from another thread found the group asleep),
	// PollSleeps the group's blocking epoll_waits, PollFull the writes
	// that found a socket full and waited for EPOLLOUT.
	PollWakes, PollSleeps, PollFull uint64
}

// CQCounters implements transport.CQCounter.
func (c *cq) CQCounters() transport.CQCounters {
	return transport.CQCounters{Provider: "soft", Completions: c.completions.Load(), Notifications: c.notifications.Load(), Pinned: c.pinned.Load()}
}

// CQStatsOf returns the counters of a CQ created by this provider.
func CQStatsOf(c transport.CQ) (CQStats, bool) {
	s, ok := c.(*cq)
	if !ok {
		return CQStats{}, false
	}
	st := CQStats{Completions: s.completions.Load(), Notifications: s.notifications.Load(), Pinned: s.pinned.Load()}
	if s.group != nil {
		st.PollWakes, st.PollSleeps, st.PollFull = s.group.counters()
	}
	return st, true
}
