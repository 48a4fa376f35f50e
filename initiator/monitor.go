package initiator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/blk-project/blk/nvme"
)

// monitorTick is the period of the association's monitor: a quarter of
// KATO (so a Keep Alive goes out within KATO/2 + tick and a lost one is
// noticed within KATO + tick), between 10 ms and 1 s; 1 s without
// keep-alive. Command timeouts are checked at the same period.
func (c *Controller) monitorTick() time.Duration {
	if c.cfg.KATO <= 0 || (c.discovery && c.discNotice == nil) {
		return time.Second
	}
	return min(max(c.cfg.KATO/4, 10*time.Millisecond), time.Second)
}

// monitor runs for the life of an association: it sends Keep Alive every
// KATO/2 once enabled, fails the association when a command (Keep Alive
// included, whose timeout is KATO) outlives its deadline, and hands
// asynchronous events to a handler goroutine.
func (a *association) monitor() {
	defer a.wg.Done()
	c := a.c
	t := time.NewTicker(c.monitorTick())
	defer t.Stop()
	lastKA := time.Now()
	for {
		select {
		case <-a.done:
			return
		case dw0 := <-a.aerCh:
			a.wg.Add(1)
			go a.handleAEN(dw0)
		case now := <-t.C:
			mono := monoNow()
			a.mu.Lock()
			qs := a.queues
			a.mu.Unlock()
			for _, q := range qs {
				if what := q.expired(mono); what != "" {
					a.fail(fmt.Errorf("%w: %s", ErrTimeout, what))
					return
				}
			}
			if a.kaOn.Load() && now.Sub(lastKA) >= c.cfg.KATO/2 && !a.kaOut.Load() {
				if a.sendKeepAlive() {
					lastKA = now
				}
			}
		}
	}
}

// sendKeepAlive posts a Keep Alive whose timeout is KATO.
func (a *association) sendKeepAlive() bool {
	s := a.admin.tryAcquire()
	if s == nil {
		return false
	}
	keepAliveCmd(&s.cmd)
	s.cb = &a.ka
	a.kaOut.Store(true)
	if err := a.admin.submit(s, nvme.DirNone, 0, a.c.cfg.KATO); err != nil {
		a.kaOut.Store(false)
		return false
	}
	return true
}

type kaCallback struct{ a *association }

func (k *kaCallback) IODone(err error) {
	k.a.kaOut.Store(false)
	var se *StatusError
	if errors.As(err, &se) {
		k.a.fail(fmt.Errorf("keep alive refused: %w", err))
	}
}

// armAER posts one Asynchronous Event Request (no timeout; it completes
// when an event happens).
func (a *association) armAER() {
	s := a.admin.tryAcquire()
	if s == nil {
		return
	}
	aerCmd(&s.cmd)
	s.cb, s.res = &a.aer, &a.aer.cqe
	a.admin.submit(s, nvme.DirNone, 0, 0)
}

type aerCallback struct {
	a   *association
	cqe nvme.Completion
}

func (e *aerCallback) IODone(err error) {
	if err != nil {
		var se *StatusError
		if errors.As(err, &se) {
			// Linux stops re-arming after an error status.
			e.a.c.logf("asynchronous events stopped: %v", err)
		}
		return
	}
	select {
	case e.a.aerCh <- e.cqe.DW0:
	default:
	}
}

// AEN fields of the AER completion's DW0.
const (
	aenTypeNotice   = 2
	aenNoticeNSAttr = 0x00
	aenNoticeDisc   = 0xF0 // discovery log page changed (log 70h)
)

// handleAEN acts on an asynchronous event: a namespace attribute notice
// reads (and so clears) the Changed Namespace List and rescans. The
// request is re-armed afterwards.
func (a *association) handleAEN(dw0 uint32) {
	defer a.wg.Done()
	c := a.c
	typ, info, lid := dw0&7, (dw0>>8)&0xFF, uint8(dw0>>16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-a.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if typ == aenTypeNotice && info == aenNoticeNSAttr {
		var cmd nvme.Command
		getLogPageCmd(&cmd, nvme.LogChangedNSList, 0xFFFFFFFF, 0, 4096, false)
		if _, err := a.admin.exec(ctx, &cmd, nil, make([]byte, 4096), c.cfg.AdminTimeout); err != nil {
			c.logf("changed namespace list: %v", err)
		}
		found, err := a.scan(ctx)
		if err != nil {
			c.logf("rescan after namespace change: %v", err)
			return
		}
		c.applyScan(found)
		c.logf("namespaces changed: %d now", len(found))
	} else if typ == aenTypeNotice && info == aenNoticeDisc && c.discNotice != nil {
		// The log is read by the watcher (DiscoveryWatch.Log), which
		// clears the notice's mask.
		select {
		case c.discNotice <- struct{}{}:
		default: // one pending is enough: the next read sees every change
		}
	} else {
		c.logf("asynchronous event type %d info %#x log %#x ignored", typ, info, lid)
	}
	if !a.failed.Load() {
		a.armAER()
	}
}
