package failover

import (
	"context"
	"fmt"
	"time"

	"github.com/blk-project/blk/initiator"
)

// follow is the follower: one goroutine per Device, asleep until an I/O
// meets a path error (kick) or the path's controller fails (Down); then
// it finds the volume (recover). It alone replaces the path.
func (d *Device) follow() {
	defer d.wg.Done()
	f := follower{pace: d.cfg.RetryDelay}
	var last time.Time
	for {
		p := d.cur.Load()
		select {
		case <-d.closing: // first: Down may be ready too, for good
			return
		default:
		}
		select {
		case <-d.closing:
			return
		case <-d.kick:
		case <-p.ctrl.Down():
			if p.failedAt.CompareAndSwap(0, time.Now().UnixNano()) {
				d.cfg.Logf("failover: the controller of %v failed (%v); asking where the volume is served", p.Endpoint, p.ctrl.State())
			}
		}
		if time.Since(last) > 4*d.cfg.MaxRetryDelay {
			f.pace = d.cfg.RetryDelay // a new episode
		}
		d.recover(p, &f)
		last = time.Now()
	}
}

// follower is the follower goroutine's own state.
type follower struct {
	// pace is the pause after a resolve that found the volume still on
	// a live current path: doubled per such resolve up to MaxRetryDelay,
	// reset by a failover or a quiet spell.
	pace time.Duration
	// said is the last failure logged: a failure repeated by every
	// attempt is logged once.
	said string
}

// recover runs until I/O can go on: the volume is found elsewhere (or
// anew) and connected to, or it is still served by p, whose controller
// is live (its path status is then the target's to change: held I/O
// retries on p). While p's controller is down and the volume is named
// at p, the controller reconnects by itself; after HoldTimeout down it
// is closed (its held I/O fails) and connecting anew goes on.
func (d *Device) recover(p *path, f *follower) {
	delay := d.cfg.RetryDelay
	for {
		live := p.ctrl.State() == initiator.StateLive
		if !live && p.failedAt.CompareAndSwap(0, time.Now().UnixNano()) {
			// Kicked before Down was seen: the hold counts from now.
			d.cfg.Logf("failover: the controller of %v failed (%v); asking where the volume is served", p.Endpoint, p.ctrl.State())
		}
		ep, err := d.resolve()
		if err == nil && (ep != p.Endpoint || p.dead()) {
			if err = d.connect(p, ep); err == nil {
				f.pace, f.said = d.cfg.RetryDelay, ""
				return
			}
		}
		if err != nil && err.Error() != f.said {
			f.said = err.Error()
			d.cfg.Logf("failover: %s (retrying, backing off up to %v)", f.said, d.cfg.MaxRetryDelay)
		}
		if live {
			// Connected, and named here or nowhere better: held I/O
			// retries here, and kicks the follower again if the path
			// still answers a path status; pace those resolves.
			p.failedAt.Store(0)
			d.sleep(f.pace)
			f.pace = min(2*f.pace, d.cfg.MaxRetryDelay)
			return
		}
		if at := p.failedAt.Load(); at != 0 && !p.closed.Load() && time.Since(time.Unix(0, at)) >= d.cfg.HoldTimeout {
			d.cfg.Logf("failover: %v is not back within %v and no other path is known: closing it (held I/O fails); still trying to connect", p.Endpoint, d.cfg.HoldTimeout)
			d.st.abandoned.Add(1)
			p.close()
		}
		if !d.sleep(delay) {
			return
		}
		delay = min(2*delay, d.cfg.MaxRetryDelay)
	}
}

// resolve asks Config.Resolve, bounded by AttemptTimeout.
func (d *Device) resolve() (Endpoint, error) {
	d.st.resolves.Add(1)
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.AttemptTimeout)
	defer cancel()
	ep, err := d.cfg.Resolve(ctx)
	if err != nil {
		d.st.resolveFailures.Add(1)
		return ep, fmt.Errorf("where is the volume served? %w", err)
	}
	return ep, nil
}

// connect connects to ep and makes it the path in place of old.
func (d *Device) connect(old *path, ep Endpoint) error {
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.AttemptTimeout)
	np, err := d.cfg.Connect(ctx, ep)
	cancel()
	if err == nil {
		var p *path
		if p, err = newPath(np); err == nil {
			if bs, obs := p.dev.BlockSize(), old.dev.BlockSize(); bs != obs {
				err = fmt.Errorf("its block size is %d, the volume's was %d", bs, obs)
			} else {
				d.swap(old, p)
				return nil
			}
		}
		closePath(np)
	}
	d.st.connectFailures.Add(1)
	return fmt.Errorf("connect to %v: %w", ep, err)
}

// closePath releases a Path that never became the Device's.
func closePath(p Path) {
	switch {
	case p.Close != nil:
		p.Close()
	case p.Namespace != nil:
		p.Namespace.Controller().Close()
	}
}

// swap makes p the path in place of old, wakes the I/O held on old, and
// closes old in the background (a graceful shutdown of a live one takes
// up to its ShutdownTimeout; its I/O still in flight fails with
// ErrClosed and is retried on p).
func (d *Device) swap(old, p *path) {
	d.cur.Store(p)
	close(old.retired)
	d.st.failovers.Add(1)
	d.cfg.Logf("failover: the volume is served by %v now (was %v)", p.Endpoint, old.Endpoint)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		old.close()
	}()
}

// sleep waits t or until Close; it reports false on Close.
func (d *Device) sleep(t time.Duration) bool {
	tm := time.NewTimer(t)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-d.closing:
		return false
	}
}
