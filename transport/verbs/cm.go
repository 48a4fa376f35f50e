//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"github.com/blk-project/blk/transport"
	"golang.org/x/sys/unix"
)

// cmEvent is a copy of one rdma_cm event, taken before it is acknowledged.
type cmEvent struct {
	typ, status          int
	id, listenID         *C.struct_rdma_cm_id
	responder, initiator uint8
	pd                   []byte
}

// cmHandler receives the events of one rdma_cm id.
type cmHandler interface{ cmEvent(ev cmEvent) }

// cmChannel is the adapter's rdma_cm event channel and the goroutine that
// reads it and hands each event to the object of its id.
type cmChannel struct {
	a    *Adapter
	ch   *C.struct_rdma_event_channel
	wake waker
	raw  *C.struct_blk_cm_event
	done chan struct{}

	mu       sync.Mutex
	handlers map[*C.struct_rdma_cm_id]cmHandler
	closed   bool
}

func newCMChannel(a *Adapter) (*cmChannel, error) {
	c := &cmChannel{a: a, handlers: map[*C.struct_rdma_cm_id]cmHandler{}, done: make(chan struct{})}
	c.ch = C.rdma_create_event_channel()
	if c.ch == nil {
		return nil, fmt.Errorf("verbs: rdma_create_event_channel: %v (is rdma_ucm loaded?)", syscall.Errno(C.blk_errno()))
	}
	if rc := C.blk_set_nonblock(c.ch.fd); rc != 0 {
		C.rdma_destroy_event_channel(c.ch)
		return nil, fmt.Errorf("verbs: rdma_cm channel: %v", syscall.Errno(rc))
	}
	var err error
	if c.wake, err = newWaker(); err != nil {
		C.rdma_destroy_event_channel(c.ch)
		return nil, err
	}
	c.raw = (*C.struct_blk_cm_event)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_blk_cm_event{}))))
	go c.run()
	return c, nil
}

func (c *cmChannel) run() {
	defer close(c.done)
	fds := []unix.PollFd{{Fd: int32(c.ch.fd), Events: unix.POLLIN}, {Fd: int32(c.wake.fd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			return
		}
		if fds[1].Revents != 0 {
			c.wake.drain()
			c.mu.Lock()
			closed := c.closed
			c.mu.Unlock()
			if closed {
				return
			}
		}
		for C.blk_get_cm_event(c.ch, c.raw) == 0 {
			r := c.raw
			ev := cmEvent{
				typ: int(r.event), status: int(r.status),
				id: (*C.struct_rdma_cm_id)(unsafe.Pointer(r.id)), listenID: (*C.struct_rdma_cm_id)(unsafe.Pointer(r.listen_id)),
				responder: uint8(r.responder_resources), initiator: uint8(r.initiator_depth),
			}
			if r.private_data_len > 0 {
				ev.pd = C.GoBytes(unsafe.Pointer(&r.private_data[0]), C.int(r.private_data_len))
			}
			c.dispatch(ev)
		}
	}
}

func (c *cmChannel) dispatch(ev cmEvent) {
	debugf("%s: cm event %s status %d id %p", c.a.name, eventName(ev.typ), ev.status, ev.id)
	key := ev.id
	if ev.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
		key = ev.listenID
	}
	c.mu.Lock()
	h := c.handlers[key]
	c.mu.Unlock()
	if h != nil {
		h.cmEvent(ev)
		return
	}
	if ev.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
		// No listener (any more): refuse and drop the new id.
		id := ev.id
		C.rdma_reject(id, nil, 0)
		C.rdma_destroy_id(id)
	}
}

func (c *cmChannel) register(id *C.struct_rdma_cm_id, h cmHandler) {
	c.mu.Lock()
	c.handlers[id] = h
	c.mu.Unlock()
}

func (c *cmChannel) unregister(id *C.struct_rdma_cm_id) {
	c.mu.Lock()
	delete(c.handlers, id)
	c.mu.Unlock()
}

func (c *cmChannel) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wake.wake()
	<-c.done
	C.rdma_destroy_event_channel(c.ch)
	C.free(unsafe.Pointer(c.raw))
	c.wake.close()
}

func (c *cmChannel) newID() (*C.struct_rdma_cm_id, error) {
	var id *C.struct_rdma_cm_id
	if C.rdma_create_id(c.ch, &id, nil, C.RDMA_PS_TCP) != 0 {
		return nil, fmt.Errorf("verbs: rdma_create_id: %w", errnoErr(C.blk_errno()))
	}
	return id, nil
}

// Private data on InfiniBand and RoCE travels in fixed-size CM fields
// padded with zeros, so its length is lost. The provider sends the whole
// field with a trailer in its last two bytes — pdMagic and the length —
// and strips it on arrival when it is there (with zero padding between
// the data and the trailer). A peer that does not know it (the Linux NVMe
// host or target) sees its data followed by zeros and the trailer, which
// fixed-layout consumers ignore; what such a peer sends arrives whole,
// padding included. iWARP (MPA) carries the length itself.
const pdMagic = 0xb1

func (a *Adapter) framePD(data []byte, field int) []byte {
	if a.iwarp {
		return data
	}
	b := make([]byte, field)
	copy(b, data)
	b[field-2] = pdMagic
	b[field-1] = byte(len(data))
	return b
}

func (a *Adapter) unframePD(pd []byte) []byte {
	if a.iwarp {
		return pd
	}
	n := len(pd)
	if n < 2 || pd[n-2] != pdMagic || int(pd[n-1]) > n-2 {
		return pd
	}
	l := int(pd[n-1])
	for _, b := range pd[l : n-2] {
		if b != 0 {
			return pd
		}
	}
	return pd[:l:l]
}

// cBytes copies b into C memory (nil for none); the caller frees it.
func cBytes(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return C.CBytes(b)
}

func parseAddr(addr string) (net.IP, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, 0, fmt.Errorf("verbs: address %q: %v: %w", addr, err, transport.ErrInvalidParameter)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, 0, fmt.Errorf("verbs: port of %q: %w", addr, transport.ErrInvalidParameter)
	}
	var ip net.IP
	if host == "" {
		ip = net.IPv4zero
	} else if ip = net.ParseIP(host); ip == nil {
		ips, err := net.LookupIP(host)
		if err != nil || len(ips) == 0 {
			return nil, 0, fmt.Errorf("verbs: host of %q: %v: %w", addr, err, transport.ErrInvalidParameter)
		}
		ip = ips[0]
	}
	return ip, int(p), nil
}

func readLimit(v, limit uint32) (uint8, error) {
	if v == 0 {
		return uint8(limit), nil
	}
	if v > limit {
		return 0, fmt.Errorf("verbs: read limit %d > adapter limit %d: %w", v, limit, transport.ErrInvalidParameter)
	}
	return uint8(v), nil
}

// waitEvent waits for the next setup event of a connection.
func waitEvent(ctx context.Context, evc chan cmEvent) (cmEvent, error) {
	select {
	case ev := <-evc:
		return ev, nil
	case <-ctx.Done():
		return cmEvent{}, fmt.Errorf("verbs: connection setup: %w", transport.ErrIOTimeout)
	}
}

func eventName(t int) string {
	return C.GoString(C.rdma_event_str(C.enum_rdma_cm_event_type(t)))
}

// Connect resolves addr, connects qp to the listener there and returns
// the peer's accept private data. The QP is moved to RTR and RTS with the
// attributes rdma_cm computes (InfiniBand, RoCE); on iWARP the kernel's
// connection manager does it.
func (a *Adapter) Connect(ctx context.Context, tq transport.QP, addr string, p transport.ConnParams) ([]byte, error) {
	q, ok := tq.(*qp)
	if !ok || q.a != a {
		return nil, fmt.Errorf("verbs: Connect: QP %w: %w", errWrongAdapter, transport.ErrInvalidParameter)
	}
	if len(p.PrivateData) > int(a.info.MaxCallerData) {
		return nil, fmt.Errorf("verbs: %d bytes of private data > MaxCallerData %d: %w", len(p.PrivateData), a.info.MaxCallerData, transport.ErrInvalidParameter)
	}
	ird, err := readLimit(p.InboundReadLimit, a.info.MaxInboundReadLimit)
	if err != nil {
		return nil, err
	}
	ord, err := readLimit(p.OutboundReadLimit, a.info.MaxOutboundReadLimit)
	if err != nil {
		return nil, err
	}
	ip, port, err := parseAddr(addr)
	if err != nil {
		return nil, err
	}
	if err := a.check(); err != nil {
		return nil, err
	}
	if !q.state.CompareAndSwap(qpIdle, qpConnecting) {
		return nil, fmt.Errorf("verbs: Connect: QP already connecting, connected or ended: %w", transport.ErrInvalidDeviceState)
	}
	ctx, cancel := a.connectContext(ctx)
	defer cancel()
	id, err := a.cm.newID()
	if err != nil {
		q.state.Store(qpIdle)
		return nil, err
	}
	q.cmMu.Lock()
	q.evc = make(chan cmEvent, 16)
	q.cmMu.Unlock()
	a.cm.register(id, q)
	done := false
	defer func() {
		if !done {
			a.cm.unregister(id)
			C.rdma_destroy_id(id)
			q.state.CompareAndSwap(qpConnecting, qpIdle)
		}
	}()
	sa := newSockaddr(ip, port)
	defer C.free(unsafe.Pointer(sa))
	if C.rdma_resolve_addr(id, nil, (*C.struct_sockaddr)(unsafe.Pointer(sa)), 2000) != 0 {
		return nil, fmt.Errorf("verbs: resolve %s: %v: %w", addr, syscall.Errno(C.blk_errno()), transport.ErrConnectionRefused)
	}
	expect := func(want int) (cmEvent, error) {
		ev, err := waitEvent(ctx, q.evc)
		if err != nil {
			return ev, err
		}
		if ev.typ != want {
			return ev, fmt.Errorf("verbs: connect to %s: %s (status %d), want %s: %w", addr, eventName(ev.typ), ev.status, eventName(want), transport.ErrConnectionRefused)
		}
		return ev, nil
	}
	if _, err := expect(C.RDMA_CM_EVENT_ADDR_RESOLVED); err != nil {
		return nil, err
	}
	if n := C.blk_id_device_name(id); n == nil || C.GoString(n) != a.name {
		return nil, fmt.Errorf("verbs: %s is reached through another device than %s: %w", addr, a.name, transport.ErrInvalidParameter)
	}
	if C.rdma_resolve_route(id, 2000) != 0 {
		return nil, fmt.Errorf("verbs: route to %s: %v: %w", addr, syscall.Errno(C.blk_errno()), transport.ErrConnectionRefused)
	}
	if _, err := expect(C.RDMA_CM_EVENT_ROUTE_RESOLVED); err != nil {
		return nil, err
	}
	pd := a.framePD(p.PrivateData, ibReqField)
	cpd := cBytes(pd)
	defer C.free(cpd)
	srq := C.int(0)
	if q.srq != nil {
		srq = 1
	}
	if rc := C.blk_connect(id, cpd, C.uint8_t(len(pd)), C.uint8_t(ird), C.uint8_t(ord), C.uint8_t(a.cfg.RNRRetry), srq, C.uint32_t(q.num)); rc != 0 {
		return nil, fmt.Errorf("verbs: rdma_connect: %v: %w", syscall.Errno(rc), transport.ErrConnectionRefused)
	}
	ev, err := waitEvent(ctx, q.evc)
	if err != nil {
		return nil, err
	}
	switch ev.typ {
	case C.RDMA_CM_EVENT_CONNECT_RESPONSE:
		// INIT again now that the CM knows the peer's answer: before it,
		// rdma_cm grants an active QP no remote access (as librdmacm does
		// for QPs it owns, just before RTR).
		if rc := C.blk_modify_qp_cm(id, q.hw, C.IBV_QPS_INIT, -1, -1); rc != 0 {
			C.rdma_reject(id, nil, 0)
			return nil, fmt.Errorf("verbs: QP to INIT: %w", errnoErr(rc))
		}
		if rc := C.blk_modify_qp_cm(id, q.hw, C.IBV_QPS_RTR, -1, -1); rc != 0 {
			C.rdma_reject(id, nil, 0)
			return nil, fmt.Errorf("verbs: QP to RTR: %w", errnoErr(rc))
		}
		if rc := C.blk_modify_qp_cm(id, q.hw, C.IBV_QPS_RTS, -1, C.int(a.cfg.RNRRetry)); rc != 0 {
			C.rdma_reject(id, nil, 0)
			return nil, fmt.Errorf("verbs: QP to RTS: %w", errnoErr(rc))
		}
		if C.rdma_establish(id) != 0 {
			return nil, fmt.Errorf("verbs: rdma_establish: %v: %w", syscall.Errno(C.blk_errno()), transport.ErrConnectionReset)
		}
	case C.RDMA_CM_EVENT_ESTABLISHED:
	case C.RDMA_CM_EVENT_REJECTED:
		return nil, &transport.RejectError{PrivateData: a.unframePD(ev.pd)}
	default:
		return nil, fmt.Errorf("verbs: connect to %s: %s (status %d): %w", addr, eventName(ev.typ), ev.status, transport.ErrConnectionRefused)
	}
	done = true
	q.connected(id)
	return a.unframePD(ev.pd), nil
}

// Listen starts accepting connections at addr (host:port; port 0 picks
// one, Addr says which).
func (a *Adapter) Listen(addr string) (transport.Listener, error) {
	ip, port, err := parseAddr(addr)
	if err != nil {
		return nil, err
	}
	if err := a.check(); err != nil {
		return nil, err
	}
	id, err := a.cm.newID()
	if err != nil {
		return nil, err
	}
	sa := newSockaddr(ip, port)
	defer C.free(unsafe.Pointer(sa))
	if C.rdma_bind_addr(id, (*C.struct_sockaddr)(unsafe.Pointer(sa))) != 0 {
		err := syscall.Errno(C.blk_errno())
		C.rdma_destroy_id(id)
		return nil, fmt.Errorf("verbs: bind %s: %v: %w", addr, err, transport.ErrInvalidParameter)
	}
	if n := C.blk_id_device_name(id); n != nil && C.GoString(n) != a.name {
		C.rdma_destroy_id(id)
		return nil, fmt.Errorf("verbs: %s belongs to device %s, not %s: %w", addr, C.GoString(n), a.name, transport.ErrInvalidParameter)
	}
	l := &listener{a: a, id: id, reqs: make(chan *connReq, 64), closed: make(chan struct{})}
	a.cm.register(id, l)
	if C.rdma_listen(id, 128) != 0 {
		err := syscall.Errno(C.blk_errno())
		a.cm.unregister(id)
		C.rdma_destroy_id(id)
		return nil, fmt.Errorf("verbs: listen %s: %v: %w", addr, err, transport.ErrInsufficientResources)
	}
	l.addr = goAddr(C.blk_local_addr(id))
	a.objMu.Lock()
	a.lnSet[l] = struct{}{}
	a.objMu.Unlock()
	return l, nil
}

type listener struct {
	a      *Adapter
	id     *C.struct_rdma_cm_id
	addr   net.Addr
	reqs   chan *connReq
	closed chan struct{}
	once   sync.Once
}

func (l *listener) cmEvent(ev cmEvent) {
	if ev.typ != C.RDMA_CM_EVENT_CONNECT_REQUEST {
		return
	}
	id := ev.id
	r := &connReq{
		a: l.a, id: id, pd: l.a.unframePD(ev.pd),
		// The kernel reports a request's values from this side's view:
		// responder_resources is the most reads the peer will issue (its
		// ORD), initiator_depth the most it will serve (its IRD).
		peerIRD: uint32(ev.initiator), peerORD: uint32(ev.responder),
		evc: make(chan cmEvent, 16),
	}
	r.local = goAddr(C.blk_local_addr(id))
	r.remote = goAddr(C.blk_peer_addr(id))
	l.a.cm.register(id, r)
	select {
	case l.reqs <- r:
	default:
		l.a.cm.unregister(id)
		C.rdma_reject(id, nil, 0)
		C.rdma_destroy_id(id)
	}
}

func (l *listener) GetConnectionRequest(ctx context.Context) (transport.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.closed:
		return nil, transport.ErrClosed
	case <-ctx.Done():
		return nil, fmt.Errorf("verbs: waiting for a connection: %w", transport.ErrIOTimeout)
	}
}

func (l *listener) Addr() net.Addr { return l.addr }

func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.a.cm.unregister(l.id)
		C.rdma_destroy_id(l.id)
		l.a.objMu.Lock()
		delete(l.a.lnSet, l)
		l.a.objMu.Unlock()
		for {
			select {
			case r := <-l.reqs:
				r.Reject(nil)
			default:
				return
			}
		}
	})
	return nil
}

// connReq is an incoming connection request.
type connReq struct {
	a                *Adapter
	id               *C.struct_rdma_cm_id
	pd               []byte
	peerIRD, peerORD uint32
	local, remote    net.Addr
	evc              chan cmEvent

	mu    sync.Mutex
	state int // 0 pending, 1 accepting or accepted, 2 rejected
}

func (r *connReq) cmEvent(ev cmEvent) {
	select {
	case r.evc <- ev:
	default:
	}
}

func (r *connReq) PrivateData() []byte           { return r.pd }
func (r *connReq) ReadLimits() (ird, ord uint32) { return r.peerIRD, r.peerORD }
func (r *connReq) RemoteAddr() net.Addr          { return r.remote }
func (r *connReq) LocalAddr() net.Addr           { return r.local }

// Accept accepts the request onto qp (a fresh QP of this adapter).
func (r *connReq) Accept(ctx context.Context, tq transport.QP, p transport.ConnParams) error {
	a := r.a
	q, ok := tq.(*qp)
	if !ok || q.a != a {
		return fmt.Errorf("verbs: Accept: QP %w: %w", errWrongAdapter, transport.ErrInvalidParameter)
	}
	if len(p.PrivateData) > int(a.info.MaxCalleeData) {
		return fmt.Errorf("verbs: %d bytes of private data > MaxCalleeData %d: %w", len(p.PrivateData), a.info.MaxCalleeData, transport.ErrInvalidParameter)
	}
	ird, err := readLimit(p.InboundReadLimit, a.info.MaxInboundReadLimit)
	if err != nil {
		return err
	}
	ord, err := readLimit(p.OutboundReadLimit, a.info.MaxOutboundReadLimit)
	if err != nil {
		return err
	}
	if n := C.blk_id_device_name(r.id); n == nil || C.GoString(n) != a.name {
		return fmt.Errorf("verbs: the request came in on another device than %s: %w", a.name, transport.ErrInvalidParameter)
	}
	r.mu.Lock()
	if r.state != 0 {
		r.mu.Unlock()
		return fmt.Errorf("verbs: request already accepted or rejected: %w", transport.ErrInvalidDeviceState)
	}
	if !q.state.CompareAndSwap(qpIdle, qpConnecting) {
		r.mu.Unlock()
		return fmt.Errorf("verbs: Accept: QP already connecting, connected or ended: %w", transport.ErrInvalidDeviceState)
	}
	r.state = 1
	r.mu.Unlock()
	// Never more than the peer asks for or offers.
	ird = uint8(min(uint32(ird), max(r.peerORD, 1)))
	ord = uint8(min(uint32(ord), r.peerIRD))
	ctx, cancel := a.connectContext(ctx)
	defer cancel()
	q.cmMu.Lock()
	q.evc = make(chan cmEvent, 16)
	q.cmMu.Unlock()
	a.cm.register(r.id, q)
	done := false
	defer func() {
		if !done {
			a.cm.unregister(r.id)
			C.rdma_reject(r.id, nil, 0)
			C.rdma_destroy_id(r.id)
			q.state.CompareAndSwap(qpConnecting, qpIdle)
		}
	}()
	if !a.iwarp {
		if rc := C.blk_modify_qp_cm(r.id, q.hw, C.IBV_QPS_INIT, -1, -1); rc != 0 {
			return fmt.Errorf("verbs: QP to INIT: %w", errnoErr(rc))
		}
		if rc := C.blk_modify_qp_cm(r.id, q.hw, C.IBV_QPS_RTR, C.int(ird), -1); rc != 0 {
			return fmt.Errorf("verbs: QP to RTR: %w", errnoErr(rc))
		}
		if rc := C.blk_modify_qp_cm(r.id, q.hw, C.IBV_QPS_RTS, C.int(ord), C.int(a.cfg.RNRRetry)); rc != 0 {
			return fmt.Errorf("verbs: QP to RTS: %w", errnoErr(rc))
		}
	}
	pd := a.framePD(p.PrivateData, ibRepField)
	cpd := cBytes(pd)
	defer C.free(cpd)
	srq := C.int(0)
	if q.srq != nil {
		srq = 1
	}
	// The peer may send as soon as it has the accept — before rdma_accept
	// returns here, and before ESTABLISHED reaches this side — and the
	// consumer may answer from that receive's completion (a receive
	// implies the QP is in RTS, on every transport).
	q.sendOK.Store(true)
	defer func() {
		if !done {
			q.sendOK.Store(false)
		}
	}()
	if rc := C.blk_accept(r.id, cpd, C.uint8_t(len(pd)), C.uint8_t(ird), C.uint8_t(ord), C.uint8_t(a.cfg.RNRRetry), srq, C.uint32_t(q.num)); rc != 0 {
		return fmt.Errorf("verbs: rdma_accept: %v: %w", syscall.Errno(rc), transport.ErrConnectionReset)
	}
	ev, err := waitEvent(ctx, q.evc)
	if err != nil {
		return err
	}
	if ev.typ != C.RDMA_CM_EVENT_ESTABLISHED {
		return fmt.Errorf("verbs: accept: %s (status %d): %w", eventName(ev.typ), ev.status, transport.ErrConnectionReset)
	}
	done = true
	q.connected(r.id)
	return nil
}

// Reject refuses the request with private data (at most MaxCalleeData).
func (r *connReq) Reject(privateData []byte) error {
	a := r.a
	if len(privateData) > int(a.info.MaxCalleeData) {
		return fmt.Errorf("verbs: %d bytes of private data > MaxCalleeData %d: %w", len(privateData), a.info.MaxCalleeData, transport.ErrInvalidParameter)
	}
	r.mu.Lock()
	if r.state != 0 {
		r.mu.Unlock()
		return fmt.Errorf("verbs: request already accepted or rejected: %w", transport.ErrInvalidDeviceState)
	}
	r.state = 2
	r.mu.Unlock()
	pd := a.framePD(privateData, ibRejField)
	cpd := cBytes(pd)
	defer C.free(cpd)
	rc := C.rdma_reject(r.id, cpd, C.uint8_t(len(pd)))
	a.cm.unregister(r.id)
	C.rdma_destroy_id(r.id)
	if rc != 0 {
		return fmt.Errorf("verbs: rdma_reject: %v: %w", syscall.Errno(C.blk_errno()), transport.ErrConnectionReset)
	}
	return nil
}
