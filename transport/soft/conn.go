package soft

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft/wire"
)

// listenBacklog bounds connection requests waiting for
// GetConnectionRequest; more are rejected.
const listenBacklog = 128

type listener struct {
	a    *Adapter
	ln   *net.TCPListener
	reqs chan *connRequest
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// Listen starts accepting iWARP connections at addr.
func (a *Adapter) Listen(addr string) (transport.Listener, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("soft: listen on %s: %w", addr, err)
	}
	l := &listener{a: a, ln: ln.(*net.TCPListener), reqs: make(chan *connRequest, listenBacklog), stop: make(chan struct{})}
	a.track(l, true)
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func (l *listener) Addr() net.Addr { return l.ln.Addr() }

func (l *listener) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.handshake(c.(*net.TCPConn))
	}
}

// handshake reads the MPA request of an incoming connection.
func (l *listener) handshake(c *net.TCPConn) {
	defer l.wg.Done()
	c.SetDeadline(time.Now().Add(l.a.cfg.ConnectTimeout))
	req, err := wire.ReadFrame(c, false)
	if err != nil {
		c.Close()
		return
	}
	if req.Markers {
		// Markers are not supported: refuse (RFC 5044 §7.1.2).
		rep := wire.Frame{Reply: true, Reject: true, Revision: req.Revision, Enhanced: req.Enhanced}
		b, _ := rep.Append(nil)
		c.Write(b)
		c.Close()
		return
	}
	cr := &connRequest{l: l, conn: c, req: req}
	select {
	case l.reqs <- cr:
	default:
		cr.Reject(nil)
	case <-l.stop:
		cr.Reject(nil)
	}
}

func (l *listener) GetConnectionRequest(ctx context.Context) (transport.ConnRequest, error) {
	select {
	case cr := <-l.reqs:
		return cr, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.stop:
		return nil, transport.ErrClosed
	}
}

func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.stop)
		l.ln.Close()
		l.a.track(l, false)
		go func() {
			l.wg.Wait()
			for {
				select {
				case cr := <-l.reqs:
					cr.Reject(nil)
				default:
					return
				}
			}
		}()
	})
	return nil
}

// connRequest is an incoming connection waiting for Accept or Reject.
type connRequest struct {
	l    *listener
	conn *net.TCPConn
	req  wire.Frame
	mu   sync.Mutex
	used bool
}

func (r *connRequest) PrivateData() []byte { return r.req.PrivateData }

func (r *connRequest) ReadLimits() (ird, ord uint32) {
	if !r.req.Enhanced {
		return maxReadLimit, maxReadLimit
	}
	return uint32(r.req.IRD & wire.IRDORDMask), uint32(r.req.ORD & wire.IRDORDMask)
}

func (r *connRequest) RemoteAddr() net.Addr { return r.conn.RemoteAddr() }
func (r *connRequest) LocalAddr() net.Addr  { return r.conn.LocalAddr() }

func (r *connRequest) take() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.used {
		return false
	}
	r.used = true
	return true
}

// limits returns what this side offers: p's values or the adapter maximum.
func limits(a *Adapter, p transport.ConnParams) (ird, ord uint32, err error) {
	ird, ord = p.InboundReadLimit, p.OutboundReadLimit
	if ird == 0 {
		ird = a.info.MaxInboundReadLimit
	}
	if ord == 0 {
		ord = a.info.MaxOutboundReadLimit
	}
	if ird > a.info.MaxInboundReadLimit || ord > a.info.MaxOutboundReadLimit {
		return 0, 0, fmt.Errorf("soft: IRD %d / ORD %d above adapter limits %d / %d: %w", ird, ord, a.info.MaxInboundReadLimit, a.info.MaxOutboundReadLimit, transport.ErrInvalidParameter)
	}
	return ird, ord, nil
}

// Accept answers with an MPA reply and binds the connection to qp.
func (r *connRequest) Accept(ctx context.Context, tq transport.QP, p transport.ConnParams) error {
	q, ok := tq.(*qp)
	if !ok || q.a != r.l.a {
		return fmt.Errorf("soft: accept onto a QP of another adapter: %w", transport.ErrInvalidParameter)
	}
	if uint32(len(p.PrivateData)) > r.l.a.info.MaxCalleeData {
		return fmt.Errorf("soft: %d bytes of private data (max %d): %w", len(p.PrivateData), r.l.a.info.MaxCalleeData, transport.ErrInvalidParameter)
	}
	ird, ord, err := limits(r.l.a, p)
	if err != nil {
		return err
	}
	if !q.state.CompareAndSwap(stateIdle, stateConnecting) {
		return fmt.Errorf("soft: accept onto a QP that is not idle: %w", transport.ErrInvalidDeviceState)
	}
	if !r.take() {
		q.state.Store(stateIdle)
		return fmt.Errorf("soft: connection request already answered: %w", transport.ErrInvalidDeviceState)
	}
	req := r.req
	rep := wire.Frame{Reply: true, CRC: req.CRC || r.l.a.cfg.CRC, Revision: req.Revision, Enhanced: req.Enhanced, PrivateData: p.PrivateData}
	peerIRD, peerORD := r.ReadLimits()
	if req.Enhanced {
		// Our reads in flight never exceed the peer's IRD, and we serve
		// no more than the peer will issue (its ORD).
		ird = min(ird, peerORD)
		ord = min(ord, peerIRD)
		rep.IRD, rep.ORD = uint16(ird), uint16(ord)
	}
	b, err := rep.Append(nil)
	if err != nil {
		q.state.Store(stateIdle)
		r.conn.Close()
		return fmt.Errorf("soft: %v: %w", err, transport.ErrInvalidParameter)
	}
	if d, ok := ctx.Deadline(); ok {
		r.conn.SetWriteDeadline(d)
	}
	if _, err := r.conn.Write(b); err != nil {
		q.state.Store(stateIdle)
		r.conn.Close()
		return errConnection(err)
	}
	r.conn.SetDeadline(time.Time{})
	q.start(r.conn, rep.CRC, ird, ord, 0)
	if q.state.Load() != stateConnected {
		return fmt.Errorf("soft: QP closed while accepting: %w", transport.ErrInvalidDeviceState)
	}
	return nil
}

// Reject answers with an MPA reply that has the reject flag.
func (r *connRequest) Reject(privateData []byte) error {
	if uint32(len(privateData)) > maxPrivateData {
		return fmt.Errorf("soft: %d bytes of private data (max %d): %w", len(privateData), maxPrivateData, transport.ErrInvalidParameter)
	}
	if !r.take() {
		return fmt.Errorf("soft: connection request already answered: %w", transport.ErrInvalidDeviceState)
	}
	rep := wire.Frame{Reply: true, Reject: true, Revision: r.req.Revision, Enhanced: r.req.Enhanced, PrivateData: privateData}
	b, _ := rep.Append(nil)
	r.conn.SetWriteDeadline(time.Now().Add(time.Second))
	r.conn.Write(b)
	r.conn.Close()
	return nil
}

// Connect dials addr, exchanges MPA request and reply, and binds qp.
func (a *Adapter) Connect(ctx context.Context, tq transport.QP, addr string, p transport.ConnParams) ([]byte, error) {
	q, ok := tq.(*qp)
	if !ok || q.a != a {
		return nil, fmt.Errorf("soft: connect a QP of another adapter: %w", transport.ErrInvalidParameter)
	}
	if uint32(len(p.PrivateData)) > a.info.MaxCallerData {
		return nil, fmt.Errorf("soft: %d bytes of private data (max %d): %w", len(p.PrivateData), a.info.MaxCallerData, transport.ErrInvalidParameter)
	}
	ird, ord, err := limits(a, p)
	if err != nil {
		return nil, err
	}
	if err := a.check(); err != nil {
		return nil, err
	}
	if !q.state.CompareAndSwap(stateIdle, stateConnecting) {
		return nil, fmt.Errorf("soft: connect a QP that is not idle: %w", transport.ErrInvalidDeviceState)
	}
	pd, err := a.connect(ctx, q, addr, p.PrivateData, ird, ord)
	if err != nil {
		q.state.CompareAndSwap(stateConnecting, stateIdle)
		return nil, err
	}
	return pd, nil
}

func (a *Adapter) connect(ctx context.Context, q *qp, addr string, pd []byte, ird, ord uint32) ([]byte, error) {
	ctx, cancel := a.connectContext(ctx)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("soft: connect to %s: %w", addr, transport.ErrIOTimeout)
		}
		return nil, fmt.Errorf("soft: connect to %s: %v: %w", addr, err, transport.ErrConnectionRefused)
	}
	conn := c.(*net.TCPConn)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) ([]byte, error) {
		stop()
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("soft: connect to %s: %w", addr, transport.ErrIOTimeout)
		}
		return nil, err
	}
	req := wire.Frame{CRC: a.cfg.CRC, Revision: wire.Revision2, Enhanced: true, IRD: uint16(ird), ORD: uint16(ord), PrivateData: pd}
	b, err := req.Append(nil)
	if err != nil {
		return fail(fmt.Errorf("soft: %v: %w", err, transport.ErrInvalidParameter))
	}
	if _, err := conn.Write(b); err != nil {
		return fail(errConnection(err))
	}
	rep, err := wire.ReadFrame(conn, true)
	if err != nil {
		if errors.Is(err, wire.ErrBadKey) || errors.Is(err, wire.ErrBadRevision) || errors.Is(err, wire.ErrPrivateData) || errors.Is(err, wire.ErrShort) {
			return fail(fmt.Errorf("soft: bad MPA reply from %s: %v: %w", addr, err, transport.ErrConnectionReset))
		}
		return fail(errConnection(err))
	}
	if rep.Reject {
		stop()
		conn.Close()
		return nil, &transport.RejectError{PrivateData: rep.PrivateData}
	}
	if rep.Markers {
		return fail(fmt.Errorf("soft: peer %s asks for MPA markers: %w", addr, transport.ErrNotSupported))
	}
	if rep.Enhanced {
		ord = min(ord, uint32(rep.IRD&wire.IRDORDMask))
		ird = min(ird, uint32(rep.ORD&wire.IRDORDMask))
	}
	if !stop() {
		return fail(fmt.Errorf("soft: connect to %s: %w", addr, transport.ErrIOTimeout))
	}
	conn.SetDeadline(time.Time{})
	delay := a.cfg.FirstFPDUDelay
	if delay < 0 {
		delay = 0
	}
	q.start(conn, req.CRC || rep.CRC, ird, ord, delay)
	if q.state.Load() != stateConnected {
		return nil, fmt.Errorf("soft: QP closed while connecting: %w", transport.ErrInvalidDeviceState)
	}
	return rep.PrivateData, nil
}
