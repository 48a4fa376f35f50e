package failover

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/nbd"
	"github.com/blk-project/blk/nvme"
)

// Sentinel errors; match with errors.Is.
var (
	// ErrNoPath: an I/O was held HoldTimeout and no path served it. The
	// error wraps the last path error too. The NBD client sees EIO.
	ErrNoPath = errors.New("failover: no path served the volume")
	// ErrClosed: the Device was closed.
	ErrClosed = errors.New("failover: device closed")
)

// Device is an nbd.Device (and nbd.FUAWriter) that follows the volume
// from path to path (package doc). Its methods are safe for concurrent
// use.
type Device struct {
	cfg Config
	cur atomic.Pointer[path] // the path I/O goes to

	kick    chan struct{} // an I/O met a path error: wake the follower
	ctx     context.Context
	cancel  context.CancelFunc // ends a Resolve or Connect at Close
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup // the follower and closes of replaced paths

	st counters
}

// path is a Path in use by the Device.
type path struct {
	Path
	dev  nbd.Device // the namespace, with nbd's error translation
	fua  nbd.FUAWriter
	ctrl *initiator.Controller
	// retired is closed when another path replaces this one.
	retired chan struct{}
	// failedAt is when the follower saw the controller fail (Unix ns;
	// 0 while live): the hold of an I/O that waited inside the
	// initiator counts from it.
	failedAt atomic.Int64
	closed   atomic.Bool
	once     sync.Once
}

func newPath(p Path) (*path, error) {
	if p.Namespace == nil {
		return nil, fmt.Errorf("failover: path to %v has no namespace", p.Endpoint)
	}
	dev := nbd.NamespaceDevice(p.Namespace)
	fua, ok := dev.(nbd.FUAWriter)
	if !ok {
		return nil, fmt.Errorf("failover: nbd.NamespaceDevice without FUA")
	}
	return &path{Path: p, dev: dev, fua: fua, ctrl: p.Namespace.Controller(), retired: make(chan struct{})}, nil
}

// close releases the path once.
func (p *path) close() {
	p.once.Do(func() {
		p.closed.Store(true)
		if p.Close != nil {
			p.Close()
		} else {
			p.ctrl.Close()
		}
	})
}

// dead reports whether the path can never serve again: closed, its
// controller lost, or the namespace gone from it.
func (p *path) dead() bool {
	if p.closed.Load() || p.Namespace.Removed() {
		return true
	}
	st := p.ctrl.State()
	return st == initiator.StateLost || st == initiator.StateClosed
}

// New returns a Device serving I/O through first and following the
// volume with cfg; Close releases it and the path in use then. On error
// first is left to the caller.
func New(cfg Config, first Path) (*Device, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p, err := newPath(first)
	if err != nil {
		return nil, err
	}
	d := &Device{cfg: cfg.withDefaults(), kick: make(chan struct{}, 1), closing: make(chan struct{})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.cur.Store(p)
	d.wg.Add(1)
	go d.follow()
	return d, nil
}

// Close stops following, fails held I/O with ErrClosed and closes the
// path in use.
func (d *Device) Close() error {
	d.once.Do(func() {
		close(d.closing)
		d.cancel()
		d.wg.Wait()
		d.cur.Load().close()
	})
	return nil
}

// Endpoint is where the Device's I/O goes now.
func (d *Device) Endpoint() Endpoint { return d.cur.Load().Endpoint }

// Size and BlockSize are the current path's namespace's.
func (d *Device) Size() int64    { return d.cur.Load().dev.Size() }
func (d *Device) BlockSize() int { return d.cur.Load().dev.BlockSize() }

// The I/O methods: the current path's call, and on a path error the
// hold (retry on the same or the next path) until it succeeds, fails
// with an error that is not a path's, or the hold ends.

func (d *Device) ReadAt(b []byte, off int64) (int, error) {
	p := d.cur.Load()
	n, err := p.dev.ReadAt(b, off)
	if err != nil {
		var h hold
		for ; err != nil; n, err = p.dev.ReadAt(b, off) {
			if p, err = d.hold(&h, p, err); err != nil {
				break
			}
		}
		d.release(&h)
	}
	return n, err
}

func (d *Device) WriteAt(b []byte, off int64) (int, error) {
	p := d.cur.Load()
	n, err := p.dev.WriteAt(b, off)
	if err != nil {
		var h hold
		for ; err != nil; n, err = p.dev.WriteAt(b, off) {
			if p, err = d.hold(&h, p, err); err != nil {
				break
			}
		}
		d.release(&h)
	}
	return n, err
}

func (d *Device) WriteAtFUA(b []byte, off int64) (int, error) {
	p := d.cur.Load()
	n, err := p.fua.WriteAtFUA(b, off)
	if err != nil {
		var h hold
		for ; err != nil; n, err = p.fua.WriteAtFUA(b, off) {
			if p, err = d.hold(&h, p, err); err != nil {
				break
			}
		}
		d.release(&h)
	}
	return n, err
}

func (d *Device) Flush() error {
	p := d.cur.Load()
	err := p.dev.Flush()
	if err != nil {
		var h hold
		for ; err != nil; err = p.dev.Flush() {
			if p, err = d.hold(&h, p, err); err != nil {
				break
			}
		}
		d.release(&h)
	}
	return err
}

func (d *Device) Trim(off, length int64) error {
	p := d.cur.Load()
	err := p.dev.Trim(off, length)
	if err != nil {
		var h hold
		for ; err != nil; err = p.dev.Trim(off, length) {
			if p, err = d.hold(&h, p, err); err != nil {
				break
			}
		}
		d.release(&h)
	}
	return err
}

func (d *Device) WriteZeroes(off, length int64) error {
	p := d.cur.Load()
	err := p.dev.WriteZeroes(off, length)
	if err != nil {
		var h hold
		for ; err != nil; err = p.dev.WriteZeroes(off, length) {
			if p, err = d.hold(&h, p, err); err != nil {
				break
			}
		}
		d.release(&h)
	}
	return err
}

var (
	_ nbd.Device    = (*Device)(nil)
	_ nbd.FUAWriter = (*Device)(nil)
)

// hold is one I/O's wait for a usable path (the error path only).
type hold struct {
	deadline time.Time
	delay    time.Duration // before the next retry on the same path
}

// hold decides about err, the failure of an I/O on p: an error that is
// not a path's is returned as is; else the I/O waits for another path
// (retried there at once) or for a retry on p after a backoff, and fails
// with ErrNoPath once HoldTimeout has passed since the failure.
func (d *Device) hold(h *hold, p *path, err error) (*path, error) {
	if !d.pathError(p, err) {
		return nil, err
	}
	if h.deadline.IsZero() {
		start := time.Now()
		if f := p.failedAt.Load(); f != 0 && f < start.UnixNano() {
			start = time.Unix(0, f) // it waited inside the initiator since
		}
		h.deadline, h.delay = start.Add(d.cfg.HoldTimeout), d.cfg.RetryDelay
		d.st.held.Add(1)
		d.st.holding.Add(1)
	}
	for {
		select {
		case <-d.closing:
			return nil, fmt.Errorf("%w; the I/O had failed on %v: %w", ErrClosed, p.Endpoint, err)
		default:
		}
		if cur := d.cur.Load(); cur != p {
			d.st.retries.Add(1)
			return cur, nil
		}
		left := time.Until(h.deadline)
		if left <= 0 {
			d.st.expired.Add(1)
			return nil, fmt.Errorf("%w within %v; the last attempt, on %v, failed: %w", ErrNoPath, d.cfg.HoldTimeout, p.Endpoint, err)
		}
		d.wake()
		t := time.NewTimer(min(h.delay, left))
		select {
		case <-t.C:
			h.delay = min(2*h.delay, d.cfg.MaxRetryDelay)
			d.st.retries.Add(1)
			return p, nil
		case <-p.retired:
		case <-d.closing:
		}
		t.Stop()
	}
}

// release ends an I/O's hold, if it was held.
func (d *Device) release(h *hold) {
	if !h.deadline.IsZero() {
		d.st.holding.Add(-1)
	}
}

// pathError reports whether err, an I/O's failure on p, is the path's
// rather than the I/O's: an NVMe path-related status (SCT 3h) without Do
// Not Retry, the connection or controller lost or closed, the namespace
// gone; or any error of a path that was replaced meanwhile (the new one
// gets the I/O again).
func (d *Device) pathError(p *path, err error) bool {
	if d.cur.Load() != p {
		return true
	}
	var se *initiator.StatusError
	if errors.As(err, &se) {
		return se.Status.SCT() == nvme.SCTPath && !se.Status.DNR()
	}
	return errors.Is(err, initiator.ErrConnectionLost) || errors.Is(err, initiator.ErrControllerLost) ||
		errors.Is(err, initiator.ErrClosed) || errors.Is(err, initiator.ErrNamespaceRemoved)
}

// wake tells the follower that an I/O met a path error.
func (d *Device) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Stats are a Device's counters.
type Stats struct {
	// Held: I/Os that met a path error and were held.
	Held uint64
	// Holding: I/Os held now.
	Holding int64
	// Retries: submissions of held I/Os again (same path or next).
	Retries uint64
	// Expired: held I/Os failed with ErrNoPath after HoldTimeout.
	Expired uint64
	// Resolves: calls of Resolve; ResolveFailures: those that failed.
	Resolves, ResolveFailures uint64
	// Failovers: paths replaced by a new one.
	Failovers uint64
	// ConnectFailures: calls of Connect that failed.
	ConnectFailures uint64
	// Abandoned: paths closed after HoldTimeout down with no other.
	Abandoned uint64
}

type counters struct {
	holding                                                                                  atomic.Int64
	held, retries, expired, resolves, resolveFailures, failovers, connectFailures, abandoned atomic.Uint64
}

// Stats returns the Device's counters.
func (d *Device) Stats() Stats {
	return Stats{
		Held: d.st.held.Load(), Holding: d.st.holding.Load(), Retries: d.st.retries.Load(), Expired: d.st.expired.Load(),
		Resolves: d.st.resolves.Load(), ResolveFailures: d.st.resolveFailures.Load(),
		Failovers: d.st.failovers.Load(), ConnectFailures: d.st.connectFailures.Load(),
		Abandoned: d.st.abandoned.Load(),
	}
}
