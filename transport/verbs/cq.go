//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/blk-project/blk/transport"
	"golang.org/x/sys/unix"
)

const (
	// stageCap is how many completions the notification goroutine (or
	// Arm) may take off the device CQ to look at them — to tell whether an
	// arm is already satisfied, or whether an error is among them for
	// NotifyErrors — before the consumer polls them. They stay in order:
	// Poll returns the staged ones first.
	stageCap = 64
	// pollChunk is the most completions one ibv_poll_cq takes.
	pollChunk = 32
)

// wr_id layout: kind (2 bits) | generation or SRQ id (30 bits) | slot.
const (
	kindSend = 1
	kindRecv = 2
	kindSRQ  = 3
	genMask  = 1<<30 - 1
)

func wrID(kind uint64, gen, slot uint32) C.uint64_t {
	return C.uint64_t(kind<<62 | uint64(gen&genMask)<<32 | uint64(slot))
}

// cq is a completion queue: an ibv_cq with its own completion channel and
// one notification goroutine.
//
// The notification goroutine blocks in poll(2) on the channel's fd and on
// an eventfd, rather than in a blocking ibv_get_cq_event, because the
// provider must be able to wake it for things the device does not signal:
// Close (the ErrClosed notification), an arm that completions already on
// the CQ satisfy (C4: verbs only signals completions added after
// ibv_req_notify_cq), completions the provider makes itself (flushed
// requests that never reached the device), and an overrun. It is pinned
// (LockOSThread + sched_setaffinity) to the CQ's affinity when one is
// given (C6).
//
// C3: a post reserves one completion of its CQ (credits) and the reserve
// is released when its completion is polled; a post that would take more
// than Depth is refused with ErrInsufficientResources, so the device CQ
// (created with Depth entries, often rounded up) never holds more than
// Depth. Receives taken from an SRQ cannot be charged to a CQ at post
// time; a device overrun they cause arrives as IBV_EVENT_CQ_ERR and is
// reported as ErrCQOverflow to the callback, from Arm, and as the error of
// every QP using the CQ.
type cq struct {
	a        *Adapter
	hw       *C.struct_ibv_cq
	ch       *C.struct_ibv_comp_channel
	depth    uint32
	notify   transport.NotifyFunc
	nctx     any
	affinity int

	credits atomic.Int64

	mu      sync.Mutex
	wcs     []C.struct_ibv_wc // pollChunk, C memory
	stage   []C.struct_ibv_wc // stageCap ring, C memory
	sHead   int
	sLen    int
	sw      []transport.Completion // provider-made completions
	swHead  int
	armed   bool
	armType transport.ArmType
	fireNow bool
	// The device's arm: hwArmed until its event is taken; hwAny when it
	// was for any completion. noWatch: the error watch is off (a solicited
	// arm was seen); watchFull: it waits for room in the staging ring.
	hwArmed bool
	// deadline: when a moderated notification is due (zero: none).
	deadline  time.Time
	hwAny     bool
	noWatch   bool
	watchFull bool
	closed    bool
	overflow  bool
	noted     bool // overflow reported to the callback
	refs      int
	freed     bool
	qps       map[*qp]struct{}

	modMu sync.Mutex
	// mod is the software moderation setting, interval<<32 | count, the
	// newest one (M11), read by the notification goroutine.
	mod atomic.Uint64

	wake waker
	done chan struct{}

	// Counters for CQCounters: completions handed out by Poll,
	// notification callbacks run, completion-channel events taken.
	completions, notifications, deviceEvents atomic.Uint64
	pinned                                   atomic.Bool
}

// CQCounters implements transport.CQCounter.
func (c *cq) CQCounters() transport.CQCounters {
	return transport.CQCounters{
		Provider:           "verbs",
		Completions:        c.completions.Load(),
		Notifications:      c.notifications.Load(),
		DeviceEvents:       c.deviceEvents.Load(),
		Pinned:             c.pinned.Load(),
		HardwareModeration: c.a.HardwareModeration(),
	}
}

// CreateCQ creates a completion queue (C1–C7).
func (a *Adapter) CreateCQ(cfg transport.CQConfig) (transport.CQ, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	if cfg.Depth == 0 || cfg.Depth > a.info.MaxCqDepth {
		return nil, fmt.Errorf("verbs: CQ depth %d not in [1, MaxCqDepth %d]: %w", cfg.Depth, a.info.MaxCqDepth, transport.ErrInvalidParameter)
	}
	c := &cq{a: a, depth: cfg.Depth, notify: cfg.Notify, nctx: cfg.Context, affinity: cfg.Affinity, qps: map[*qp]struct{}{}}
	var err error
	if c.wake, err = newWaker(); err != nil {
		return nil, fmt.Errorf("%w: %v", transport.ErrInsufficientResources, err)
	}
	c.ch = C.ibv_create_comp_channel(a.ctx)
	if c.ch == nil {
		err := errnoErr(C.blk_errno())
		c.wake.close()
		return nil, fmt.Errorf("verbs: ibv_create_comp_channel: %w", err)
	}
	if rc := C.blk_set_nonblock(c.ch.fd); rc != 0 {
		C.ibv_destroy_comp_channel(c.ch)
		c.wake.close()
		return nil, fmt.Errorf("verbs: completion channel: %w", errnoErr(rc))
	}
	vec := C.int(0)
	if n := int(a.ctx.num_comp_vectors); n > 1 && cfg.Affinity >= 0 {
		vec = C.int(cfg.Affinity % n)
	}
	c.hw = C.ibv_create_cq(a.ctx, C.int(cfg.Depth), nil, c.ch, vec)
	if c.hw == nil {
		err := errnoErr(C.blk_errno())
		C.ibv_destroy_comp_channel(c.ch)
		c.wake.close()
		return nil, fmt.Errorf("verbs: ibv_create_cq(%d): %w", cfg.Depth, err)
	}
	wcSize := C.size_t(unsafe.Sizeof(C.struct_ibv_wc{}))
	mem := (*C.struct_ibv_wc)(C.calloc(pollChunk+stageCap, wcSize))
	all := unsafe.Slice(mem, pollChunk+stageCap)
	c.wcs, c.stage = all[:pollChunk:pollChunk], all[pollChunk:]
	c.done = make(chan struct{})
	a.objMu.Lock()
	a.cqByHW[uintptr(unsafe.Pointer(c.hw))] = c
	a.cqSet[c] = struct{}{}
	a.objMu.Unlock()
	go c.run()
	return c, nil
}

func (c *cq) Depth() uint32 { return c.depth }

// reserve takes one completion of the CQ's depth for a post (C3, Q4).
func (c *cq) reserve() bool {
	if c.credits.Add(1) > int64(c.depth) {
		c.credits.Add(-1)
		return false
	}
	return true
}

func (c *cq) unreserve(n int64) { c.credits.Add(-n) }

// Poll moves up to len(out) completions into out: staged ones first, then
// the device's, then the provider's own. It allocates nothing.
func (c *cq) Poll(out []transport.Completion) int {
	if len(out) == 0 {
		return 0
	}
	c.mu.Lock()
	if c.freed || c.closed {
		c.mu.Unlock()
		return 0
	}
	n := 0
	for n < len(out) && c.sLen > 0 {
		wc := &c.stage[c.sHead]
		c.sHead = (c.sHead + 1) % stageCap
		c.sLen--
		if c.convert(wc, &out[n]) {
			n++
		}
	}
	for n < len(out) {
		k := min(len(out)-n, pollChunk)
		got := int(C.blk_poll_cq(c.hw, C.int(k), &c.wcs[0]))
		if got <= 0 {
			break
		}
		for i := 0; i < got; i++ {
			if c.convert(&c.wcs[i], &out[n]) {
				n++
			}
		}
		if got < k {
			break
		}
	}
	for n < len(out) && c.swHead < len(c.sw) {
		out[n] = c.sw[c.swHead]
		c.sw[c.swHead] = transport.Completion{}
		c.swHead++
		c.credits.Add(-1)
		n++
	}
	if c.swHead == len(c.sw) && c.swHead > 0 {
		c.sw, c.swHead = c.sw[:0], 0
	}
	wake := c.watchFull && c.sLen < stageCap
	if wake {
		c.watchFull = false
	}
	c.mu.Unlock()
	if wake {
		c.wake.wake()
	}
	if n > 0 {
		c.completions.Add(uint64(n))
	}
	return n
}

// convert turns a work completion into out and releases the request's
// slot and CQ reserve. It returns false for completions not to be shown: a
// silent success, or one of a QP already destroyed. c.mu is held.
func (c *cq) convert(wc *C.struct_ibv_wc, out *transport.Completion) bool {
	id := uint64(wc.wr_id)
	kind, gen, slot := id>>62, uint32(id>>32)&genMask, uint32(id)
	q := (*c.a.qps.Load())[uint32(wc.qp_num)]
	status := wcStatus(wc.status)
	if status != nil && debugOn {
		debugf("%s: wc qp %d kind %d status %s (vendor %d)", c.a.name, uint32(wc.qp_num), kind, C.GoString(C.ibv_wc_status_str(wc.status)), uint32(wc.vendor_err))
	}
	switch kind {
	case kindSend:
		if q == nil || q.gen != gen {
			return false
		}
		s, ok := q.releaseSend(slot)
		if !ok {
			return false
		}
		c.credits.Add(-1)
		if status != nil && status != transport.ErrCancelled {
			q.failAsync(status)
		}
		if status == nil && s.silent {
			return false
		}
		*out = transport.Completion{Status: status, QPContext: q.ctx, RequestContext: s.ctx, Bytes: s.n, Type: s.op}
		return true
	case kindRecv:
		if q == nil || q.gen != gen {
			return false
		}
		ctx, ok := q.releaseRecv(slot)
		if !ok {
			return false
		}
		c.credits.Add(-1)
		if status != nil && status != transport.ErrCancelled && status != transport.ErrBufferTooSmall {
			q.failAsync(status)
		}
		*out = transport.Completion{Status: status, QPContext: q.ctx, RequestContext: ctx, Bytes: uint32(wc.byte_len), Type: transport.OpReceive}
		if wc.wc_flags&C.IBV_WC_WITH_INV != 0 {
			out.Invalidated = true
			out.InvalidatedKey = uint32(C.blk_wc_invalidated_rkey(wc))
		}
		return true
	case kindSRQ:
		s := (*c.a.srqs.Load())[gen]
		if s == nil {
			return false
		}
		ctx, ok := s.consume(slot)
		if !ok {
			return false
		}
		var qctx any
		if q != nil {
			qctx = q.ctx
			if status != nil && status != transport.ErrCancelled && status != transport.ErrBufferTooSmall {
				q.failAsync(status)
			}
		}
		*out = transport.Completion{Status: status, QPContext: qctx, RequestContext: ctx, Bytes: uint32(wc.byte_len), Type: transport.OpReceive}
		if wc.wc_flags&C.IBV_WC_WITH_INV != 0 {
			out.Invalidated = true
			out.InvalidatedKey = uint32(C.blk_wc_invalidated_rkey(wc))
		}
		return true
	}
	return false
}

// wcStatus maps a work completion status onto the API's sentinels.
func wcStatus(s uint32) error {
	switch s {
	case C.IBV_WC_SUCCESS:
		return nil
	case C.IBV_WC_WR_FLUSH_ERR:
		return transport.ErrCancelled
	case C.IBV_WC_LOC_PROT_ERR, C.IBV_WC_LOC_ACCESS_ERR, C.IBV_WC_REM_ACCESS_ERR, C.IBV_WC_MW_BIND_ERR:
		return transport.ErrAccessViolation
	case C.IBV_WC_LOC_LEN_ERR:
		return transport.ErrBufferTooSmall
	}
	return transport.ErrConnectionReset
}

// addSW queues a completion the provider made (a request that never
// reached the device, flushed); its post's reserve is released when it is
// polled. It wakes the notification goroutine if an arm is pending (these
// are all errors, so they satisfy any arm type but solicited).
func (c *cq) addSW(comp transport.Completion) {
	c.mu.Lock()
	if c.closed || c.freed {
		c.mu.Unlock()
		c.credits.Add(-1)
		return
	}
	c.sw = append(c.sw, comp)
	wake := c.armed && c.armType != transport.NotifySolicited
	if wake {
		c.fireNow = true
	}
	c.mu.Unlock()
	if wake {
		c.wake.wake()
	}
}

// stageLocked takes up to max completions off the device into the staging
// ring and returns how many it took. c.mu is held.
func (c *cq) stageLocked(max int) int {
	took := 0
	for took < max && c.sLen < stageCap {
		tail := (c.sHead + c.sLen) % stageCap
		k := min(max-took, stageCap-c.sLen, stageCap-tail)
		got := int(C.blk_poll_cq(c.hw, C.int(k), &c.stage[tail]))
		if got <= 0 {
			break
		}
		for i := tail; i < tail+got; i++ {
			if st := c.stage[i].status; st != C.IBV_WC_SUCCESS && st != C.IBV_WC_WR_FLUSH_ERR {
				if q := (*c.a.qps.Load())[uint32(c.stage[i].qp_num)]; q != nil {
					q.failAsync(wcStatus(st))
				}
			}
		}
		c.sLen += got
		took += got
		if got < k {
			break
		}
	}
	return took
}

// presentLocked says whether completions are on the CQ (staged, on the
// device, or the provider's own).
func (c *cq) presentLocked() bool {
	return c.sLen > 0 || c.swHead < len(c.sw) || c.stageLocked(1) > 0
}

// errorPresentLocked says whether an error completion is on the CQ, as far
// as the staging ring lets it look.
func (c *cq) errorPresentLocked() bool {
	if c.swHead < len(c.sw) {
		return true
	}
	c.stageLocked(stageCap)
	for i := 0; i < c.sLen; i++ {
		if c.stage[(c.sHead+i)%stageCap].status != C.IBV_WC_SUCCESS {
			return true
		}
	}
	return false
}

// Arm requests one notification (C4). Completions already on the CQ
// satisfy NotifyAny (and an error already there NotifyErrors) at once;
// NotifySolicited is satisfied only by a solicited completion that arrives
// after the arm (a work completion does not say whether it was solicited).
func (c *cq) Arm(t transport.ArmType) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed || c.freed:
		return transport.ErrClosed
	case c.overflow:
		return transport.ErrCQOverflow
	}
	if t == transport.NotifySolicited {
		if c.a.info.Flags&transport.FlagSolicitedNotifySupported == 0 {
			return fmt.Errorf("verbs: %s does not signal solicited-only arms for receives (FlagSolicitedNotifySupported clear): %w", c.a.name, transport.ErrNotSupported)
		}
		c.noWatch = true
		if rc := C.blk_req_notify_cq(c.hw, 1); rc != 0 {
			return fmt.Errorf("verbs: ibv_req_notify_cq: %w", errnoErr(rc))
		}
		c.hwArmed = true
	} else if !c.hwArmed || !c.hwAny {
		if rc := C.blk_req_notify_cq(c.hw, 0); rc != 0 {
			return fmt.Errorf("verbs: ibv_req_notify_cq: %w", errnoErr(rc))
		}
		c.hwArmed, c.hwAny = true, true
	}
	c.armed, c.armType = true, t
	c.deadline = time.Time{}
	var now bool
	switch t {
	case transport.NotifyAny:
		now = c.presentLocked()
	case transport.NotifyErrors:
		now = c.errorPresentLocked()
	}
	if now {
		c.fireNow = true
		c.wake.wake()
	}
	return nil
}

// run is the notification goroutine.
//
// Besides the consumer's arms it keeps the device CQ armed itself and
// stages what arrives (as far as the staging ring holds), because a verbs
// QP that fails a request (RNR retries exhausted, a remote access error)
// moves to the error state without any event but the failed completion,
// and Done must close when the connection ends, polled or not. The watch
// stops for good on a CQ once its consumer arms it for solicited
// completions: the device cannot arm for "any" and "solicited" at once,
// and a notification for a solicited arm must not come from an
// unsolicited completion. The first device event after that first
// solicited arm may still be the watch's own; it is taken as such.
func (c *cq) run() {
	defer close(c.done)
	if c.affinity >= 0 {
		c.pinned.Store(pinThread(c.affinity))
	}
	fds := []unix.PollFd{{Fd: int32(c.ch.fd), Events: unix.POLLIN}, {Fd: int32(c.wake.fd), Events: unix.POLLIN}}
	var ts unix.Timespec
	c.mu.Lock()
	c.rearmLocked()
	var due time.Time
	c.mu.Unlock()
	for {
		var err error
		if due.IsZero() {
			_, err = unix.Ppoll(fds, nil, nil)
		} else {
			ts = unix.NsecToTimespec(int64(max(time.Until(due), 0)))
			_, err = unix.Ppoll(fds, &ts, nil)
		}
		if err != nil && err != unix.EINTR {
			return
		}
		hw := false
		if fds[0].Revents != 0 && C.blk_get_cq_events(c.ch) > 0 {
			hw = true
			c.deviceEvents.Add(1)
		}
		if fds[1].Revents != 0 {
			c.wake.drain()
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			if c.notify != nil {
				c.notifications.Add(1)
				c.notify(c.nctx, transport.ErrClosed)
			}
			return
		}
		stale := false
		if hw {
			stale = c.hwAny && c.armed && c.armType == transport.NotifySolicited
			c.hwAny = false
			c.hwArmed = false
			c.stageLocked(stageCap)
		}
		var status error
		fire := false
		if c.overflow && !c.noted {
			c.noted = true
			status, fire = transport.ErrCQOverflow, true
		} else {
			fire = c.decideLocked(hw, stale)
		}
		c.fireNow = false
		c.rearmLocked()
		if !fire && c.armed && c.armType != transport.NotifySolicited {
			fire = c.decideLocked(false, false)
		}
		if fire {
			c.armed = false
			c.deadline = time.Time{}
		}
		due = c.deadline
		c.mu.Unlock()
		if fire && c.notify != nil {
			c.notifications.Add(1)
			c.notify(c.nctx, status)
		}
	}
}

// decideLocked says whether the pending arm is satisfied now, within the
// moderation setting. c.mu is held.
func (c *cq) decideLocked(hw, stale bool) bool {
	if !c.armed {
		return false
	}
	switch c.armType {
	case transport.NotifySolicited:
		return hw && !stale && c.presentLocked()
	case transport.NotifyErrors:
		return c.fireNow || c.errorPresentLocked()
	}
	if c.deadline.IsZero() && !c.fireNow && !c.presentLocked() {
		return false
	}
	c.stageLocked(stageCap)
	return c.moderateLocked(time.Now())
}

// moderateLocked applies software moderation to a satisfied NotifyAny arm
// (M1–M7): notify when count completions are on the CQ (or the staging
// ring, which is all the provider can count without polling for the
// consumer, is full), or interval µs after the arm was first satisfied.
// c.mu is held.
func (c *cq) moderateLocked(now time.Time) bool {
	m := c.mod.Load()
	interval, count := uint32(m>>32), uint32(m)
	if interval == 0 || count <= 1 {
		return true // M2, M6: no moderation
	}
	if count != transport.MaxUint32 { // M7: count MAX leaves the interval alone
		if n := c.sLen + len(c.sw) - c.swHead; n >= int(count) || c.sLen == stageCap {
			return true
		}
	}
	if interval == transport.MaxUint32 {
		return false // M3: the count alone
	}
	if c.deadline.IsZero() {
		c.deadline = now.Add(time.Duration(interval) * time.Microsecond)
		return false
	}
	return !now.Before(c.deadline)
}

// rearmLocked arms the device for the next completion: solicited only for
// a pending solicited arm, any otherwise (the error watch), unless the
// staging ring is full (Poll wakes the goroutine when it has room again).
// Completions that landed before the arm raise no event, so it stages
// once more after arming. c.mu is held.
func (c *cq) rearmLocked() {
	if c.closed || c.freed || c.overflow || c.hwArmed {
		return
	}
	if c.armed && c.armType == transport.NotifySolicited {
		if C.blk_req_notify_cq(c.hw, 1) == 0 {
			c.hwArmed = true
		}
		return
	}
	if c.noWatch && !c.armed {
		return
	}
	if c.sLen == stageCap {
		c.watchFull = true
		return
	}
	if C.blk_req_notify_cq(c.hw, 0) == 0 {
		c.hwArmed, c.hwAny = true, true
	}
	c.stageLocked(stageCap)
}

func (c *cq) satisfiedLocked() bool {
	if c.armType == transport.NotifyErrors {
		return c.errorPresentLocked()
	}
	return c.presentLocked()
}

// overrun handles IBV_EVENT_CQ_ERR: the CQ is in error, its QPs fail.
func (c *cq) overrun() {
	c.mu.Lock()
	if c.overflow {
		c.mu.Unlock()
		return
	}
	c.overflow = true
	qs := make([]*qp, 0, len(c.qps))
	for q := range c.qps {
		qs = append(qs, q)
	}
	c.mu.Unlock()
	c.wake.wake()
	for _, q := range qs {
		go q.fail(transport.ErrCQOverflow)
	}
}

// ControlInterruptModeration sets moderation (M1–M13). On a device that
// reports CQ moderation capabilities it is ibv_modify_cq (the device
// defers its completion events). rxe and siw report none (caps 0/0,
// ibv_modify_cq answers EOPNOTSUPP), so the provider moderates in software
// on the notification path: the notification goroutine defers the
// callback of a satisfied NotifyAny arm until count completions are on
// the CQ or interval µs passed (see moderateLocked); device events still
// wake that goroutine per completion, the consumer is woken once per
// batch. Either way FlagCQInterruptModerationSupported is set and the call
// never answers ErrNotSupported (M9); HardwareModeration says which.
// The setting is published atomically (M11: the newest wins, applied at
// the goroutine's next decision, which the call triggers), never pends
// (M12) and needs no lock (M13).
func (c *cq) ControlInterruptModeration(interval, count uint32) error {
	a := c.a
	if interval == transport.MaxUint32 && count == transport.MaxUint32 {
		return fmt.Errorf("verbs: interval and count both MAX: %w", transport.ErrInvalidParameterMix)
	}
	if count != transport.MaxUint32 && count > c.depth {
		return fmt.Errorf("verbs: moderation count %d > CQ depth %d: %w", count, c.depth, transport.ErrInvalidParameterMix)
	}
	if !a.HardwareModeration() {
		c.mod.Store(uint64(interval)<<32 | uint64(count))
		c.wake.wake()
		return nil
	}
	c.modMu.Lock()
	defer c.modMu.Unlock()
	var n, p uint16 // 0, 0: off (M2, M6)
	if interval != 0 && count > 1 {
		n, p = a.modCount, a.modPeriod
		if count != transport.MaxUint32 {
			n = uint16(min(count, uint32(a.modCount)))
		}
		if interval != transport.MaxUint32 {
			p = uint16(min(interval, uint32(a.modPeriod))) // M4
		}
	}
	if rc := C.blk_modify_cq(c.hw, C.uint16_t(n), C.uint16_t(p)); rc != 0 {
		return fmt.Errorf("verbs: ibv_modify_cq: %w: %v", transport.ErrInsufficientResources, errnoErr(rc))
	}
	return nil
}

func (c *cq) ref(q *qp) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.freed {
		return transport.ErrClosed
	}
	c.refs++
	c.qps[q] = struct{}{}
	return nil
}

func (c *cq) unref(q *qp) {
	c.mu.Lock()
	c.refs--
	delete(c.qps, q)
	free := c.closed && c.refs == 0 && !c.freed
	c.mu.Unlock()
	if free {
		c.free()
	}
}

// Close stops the notification goroutine (which tells the callback
// ErrClosed) and destroys the CQ once no QP uses it.
func (c *cq) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.wake.wake()
	<-c.done
	c.a.objMu.Lock()
	delete(c.a.cqSet, c)
	c.a.objMu.Unlock()
	c.mu.Lock()
	free := c.refs == 0 && !c.freed
	c.mu.Unlock()
	if free {
		c.free()
	}
	return nil
}

func (c *cq) free() {
	c.mu.Lock()
	if c.freed {
		c.mu.Unlock()
		return
	}
	c.freed = true
	c.mu.Unlock()
	c.a.objMu.Lock()
	delete(c.a.cqByHW, uintptr(unsafe.Pointer(c.hw)))
	c.a.objMu.Unlock()
	C.ibv_destroy_cq(c.hw)
	C.ibv_destroy_comp_channel(c.ch)
	C.free(unsafe.Pointer(&c.wcs[0]))
	c.wake.close()
}
