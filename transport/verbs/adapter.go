//go:build verbs && linux && cgo

package verbs

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/blk-project/blk/transport"
	"golang.org/x/sys/unix"
)

// Config selects the device and the provider's options. The zero value
// opens the first RDMA device.
type Config struct {
	// Device names the RDMA device ("rxe0", "siw0", "mlx5_0").
	Device string
	// Addr, when Device is empty, picks the device that owns this IP
	// address (asked of rdma_cm).
	Addr string
	// RNRRetry is the RNR retry count of every connection (0–7, 7 =
	// retry forever) on InfiniBand and RoCE. The default 0 makes a send
	// that finds no receive posted fail the connection at once, as on
	// iWARP (which has no RNR retry) and as the transport API promises
	// (transporttest SendWithoutReceive); the engine keeps receives posted.
	RNRRetry uint8
	// ConnectTimeout bounds connection setup when the caller's context has
	// no deadline. 0 means transport.DefaultConnectTimeout.
	ConnectTimeout time.Duration
}

// Limits the provider puts on top of the device's, each with its reason.
const (
	// maxSge: a request slot preallocates its SGE array in C memory;
	// NVMe/RDMA needs 1–2 SGEs, the engine asks for 16 at most.
	maxSge = 16
	// maxInline: the provider copies inline payloads into a registered
	// bounce buffer per initiator slot (so FlagInline works the same on
	// every device, whatever its own inline limit, and a deferred inline
	// post keeps its bytes): 256 bytes holds an NVMe capsule or response.
	maxInline = 256
	// maxQueueDepth bounds the per-QP slot tables (C memory and Go
	// contexts) as the soft provider does.
	maxQueueDepth = 16384
	// maxSrqDepth: one SRQ per core; the SRQ's slot table is preallocated
	// for twice its depth (see CreateSRQ), so keep it bounded.
	maxSrqDepth = 32768
	// maxTransfer caps MaxTransferLength (NVMe MDTS derives from it).
	maxTransfer = 16 << 20
	// rdma_cm carries IRD/ORD in 8 bits.
	maxReadLimit = 255
	// Private data. iWARP (MPA) carries its length; Linux's iWARP CM takes
	// at most 256 bytes with its own MPA v2 words: siw (6.1) as the active
	// side refuses 252 and takes 248 (found by connecting with each length
	// in a guest). InfiniBand and RoCE CM
	// messages have fixed private data fields — REQ 92 bytes less rdma_cm's
	// 36-byte header, REP 196, REJ 148 — padded with zeros; the provider
	// keeps the length in a 2-byte trailer (see framePD).
	iwarpPrivateData = 248
	ibReqField       = 56
	ibRepField       = 196
	ibRejField       = 148
	pdTrailer        = 2
)

// Adapter is an opened RDMA device. It implements transport.Adapter.
type Adapter struct {
	cfg   Config
	ctx   *C.struct_ibv_context
	name  string
	iwarp bool
	port  C.uint8_t
	info  transport.AdapterInfo
	// moderation capabilities (0, 0: none)
	modCount, modPeriod uint16
	maxReadSge          uint32

	// QPs by QP number and SRQs by id, read lock-free on the completion
	// path (copy on write under objMu).
	qps     atomic.Pointer[map[uint32]*qp]
	srqs    atomic.Pointer[map[uint32]*srq]
	objMu   sync.Mutex
	srqByHW map[uintptr]*srq
	cqByHW  map[uintptr]*cq
	nextSRQ uint32
	cqSet   map[*cq]struct{}
	lnSet   map[*listener]struct{}
	pdSet   map[*pd]struct{}

	cm *cmChannel

	asyncWake waker
	asyncDone chan struct{}
	// events counts asynchronous events by kind (AdapterCounters).
	events struct {
		qpFatal, qpAccess, srqLimit, cqError, deviceFatal, other atomic.Uint64
	}

	closeMu sync.Mutex
	closed  bool
}

var _ transport.Adapter = (*Adapter)(nil)

// qpGen numbers QPs so that a completion of a destroyed QP whose number
// the device reused is not taken for one of its successor.
var qpGen atomic.Uint32

// New opens the device cfg names.
func New(cfg Config) (*Adapter, error) {
	if cfg.RNRRetry > 7 {
		return nil, fmt.Errorf("verbs: RNRRetry %d > 7: %w", cfg.RNRRetry, transport.ErrInvalidParameter)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = transport.DefaultConnectTimeout
	}
	debugOn = os.Getenv("BLK_VERBS_DEBUG") != ""
	name := cfg.Device
	if name == "" && cfg.Addr != "" {
		n, err := deviceOfAddr(cfg.Addr)
		if err != nil {
			return nil, err
		}
		name = n
	}
	var num C.int
	list := C.ibv_get_device_list(&num)
	if list == nil {
		return nil, fmt.Errorf("verbs: no RDMA devices (ibv_get_device_list: %v)", syscall.Errno(C.blk_errno()))
	}
	defer C.ibv_free_device_list(list)
	devs := unsafe.Slice(list, int(num))
	var dev *C.struct_ibv_device
	var names []string
	for _, d := range devs {
		n := C.GoString(C.ibv_get_device_name(d))
		names = append(names, n)
		if dev == nil && (name == "" || n == name) {
			dev = d
		}
	}
	if dev == nil {
		return nil, fmt.Errorf("verbs: no RDMA device %q (have %v): %w", name, names, transport.ErrInvalidParameter)
	}
	a := &Adapter{
		cfg:     cfg,
		name:    C.GoString(C.ibv_get_device_name(dev)),
		iwarp:   dev.transport_type == C.IBV_TRANSPORT_IWARP,
		port:    1,
		srqByHW: map[uintptr]*srq{},
		cqByHW:  map[uintptr]*cq{},
		cqSet:   map[*cq]struct{}{},
		lnSet:   map[*listener]struct{}{},
		pdSet:   map[*pd]struct{}{},
	}
	a.qps.Store(&map[uint32]*qp{})
	a.srqs.Store(&map[uint32]*srq{})
	a.ctx = C.ibv_open_device(dev)
	if a.ctx == nil {
		return nil, fmt.Errorf("verbs: open %s: %v", a.name, syscall.Errno(C.blk_errno()))
	}
	if err := a.query(); err != nil {
		C.ibv_close_device(a.ctx)
		return nil, err
	}
	var err error
	if a.asyncWake, err = newWaker(); err != nil {
		C.ibv_close_device(a.ctx)
		return nil, err
	}
	if rc := C.blk_set_nonblock(a.ctx.async_fd); rc != 0 {
		a.asyncWake.close()
		C.ibv_close_device(a.ctx)
		return nil, fmt.Errorf("verbs: async fd: %v", syscall.Errno(rc))
	}
	if a.cm, err = newCMChannel(a); err != nil {
		a.asyncWake.close()
		C.ibv_close_device(a.ctx)
		return nil, err
	}
	a.asyncDone = make(chan struct{})
	go a.asyncLoop()
	return a, nil
}

// deviceOfAddr asks rdma_cm which device owns the IP address addr.
func deviceOfAddr(addr string) (string, error) {
	ip := net.ParseIP(addr)
	if ip == nil {
		return "", fmt.Errorf("verbs: Addr %q is not an IP address: %w", addr, transport.ErrInvalidParameter)
	}
	ch := C.rdma_create_event_channel()
	if ch == nil {
		return "", fmt.Errorf("verbs: rdma_create_event_channel: %v", syscall.Errno(C.blk_errno()))
	}
	defer C.rdma_destroy_event_channel(ch)
	var id *C.struct_rdma_cm_id
	if C.rdma_create_id(ch, &id, nil, C.RDMA_PS_TCP) != 0 {
		return "", fmt.Errorf("verbs: rdma_create_id: %v", syscall.Errno(C.blk_errno()))
	}
	defer C.rdma_destroy_id(id)
	sa := newSockaddr(ip, 0)
	defer C.free(unsafe.Pointer(sa))
	if C.rdma_bind_addr(id, (*C.struct_sockaddr)(unsafe.Pointer(sa))) != 0 {
		return "", fmt.Errorf("verbs: no RDMA device owns %s (rdma_bind_addr: %v): %w", addr, syscall.Errno(C.blk_errno()), transport.ErrInvalidParameter)
	}
	n := C.blk_id_device_name(id)
	if n == nil {
		return "", fmt.Errorf("verbs: %s is not on an RDMA device: %w", addr, transport.ErrInvalidParameter)
	}
	return C.GoString(n), nil
}

// query turns the device's attributes into AdapterInfo.
func (a *Adapter) query() error {
	var attr C.struct_ibv_device_attr_ex
	if rc := C.blk_query_device(a.ctx, &attr); rc != 0 {
		return fmt.Errorf("verbs: query %s: %v", a.name, syscall.Errno(rc))
	}
	var pa C.struct_ibv_port_attr
	if rc := C.blk_query_port(a.ctx, a.port, &pa); rc != 0 {
		return fmt.Errorf("verbs: query %s port %d: %v", a.name, a.port, syscall.Errno(rc))
	}
	d := &attr.orig_attr
	capAt := func(v C.int, limit uint32) uint32 {
		if v < 0 {
			return 0
		}
		return min(uint32(v), limit)
	}
	a.modCount, a.modPeriod = uint16(attr.cq_mod_caps.max_cq_count), uint16(attr.cq_mod_caps.max_cq_period)
	rsge := capAt(d.max_sge, maxSge)
	if d.max_srq > 0 {
		rsge = min(rsge, capAt(d.max_srq_sge, maxSge))
	}
	a.maxReadSge = capAt(d.max_sge_rd, maxSge)
	if a.maxReadSge == 0 {
		a.maxReadSge = capAt(d.max_sge, maxSge)
	}
	// Moderation: ibv_modify_cq where the device has it, in software on
	// the notification path where not (cq.ControlInterruptModeration).
	flags := transport.FlagLoopbackConnectionsSupported | transport.FlagCQInterruptModerationSupported
	if a.ctx.num_comp_vectors > 1 {
		flags |= transport.FlagMultiEngineSupported
	}
	flags |= deviceSemantics(uint32(d.vendor_id))
	if !a.iwarp || uint32(d.vendor_id) == siwVendorID {
		// IB and RoCE match a read response to its request. siw
		// places one only into the sink of the read it answers (its
		// STag checked against the ORQ's, siw_rresp_check_ntoh) and
		// asks that sink for local write alone. iWARP hardware keeps
		// RFC 5040's tagged model: the sink needs remote write.
		flags |= transport.FlagReadSinkLocal
	}
	priv := uint32(iwarpPrivateData)
	callee := uint32(iwarpPrivateData)
	if !a.iwarp {
		priv = ibReqField - pdTrailer
		callee = min(ibRepField, ibRejField) - pdTrailer
	}
	msg := uint32(maxTransfer)
	if pa.max_msg_sz > 0 && uint64(pa.max_msg_sz) < maxTransfer {
		msg = uint32(pa.max_msg_sz)
	}
	srqDepth := uint32(0)
	if d.max_srq > 0 {
		srqDepth = capAt(d.max_srq_wr, maxSrqDepth)
	}
	a.info = transport.AdapterInfo{
		VendorID:               uint32(d.vendor_id),
		DeviceID:               uint32(d.vendor_part_id),
		MaxRegistrationSize:    uint64(d.max_mr_size),
		MaxInitiatorRequestSge: capAt(d.max_sge, maxSge),
		MaxReceiveRequestSge:   rsge,
		MaxReadRequestSge:      a.maxReadSge,
		MaxTransferLength:      msg,
		MaxInlineDataSize:      maxInline,
		MaxInboundReadLimit:    capAt(d.max_qp_rd_atom, maxReadLimit),
		MaxOutboundReadLimit:   capAt(d.max_qp_init_rd_atom, maxReadLimit),
		MaxReceiveQueueDepth:   capAt(d.max_qp_wr, maxQueueDepth),
		MaxInitiatorQueueDepth: capAt(d.max_qp_wr, maxQueueDepth),
		MaxSrqDepth:            srqDepth,
		MaxCqDepth:             capAt(d.max_cqe, 1<<30),
		LargeRequestThreshold:  4096,
		MaxCallerData:          priv,
		MaxCalleeData:          callee,
		// Userspace verbs has no fast-register work request (IB_WR_REG_MR
		// is kernel-only): AllocateMR and FastRegister are not supported.
		FRMRPageCount: 0,
		Cores:         runtime.NumCPU(),
		Flags:         flags,
	}
	return nil
}

// Info reports the adapter's limits.
func (a *Adapter) Info() transport.AdapterInfo { return a.info }

// HardwareModeration says whether the device moderates CQ events itself
// (ibv_modify_cq; moderation capabilities above 0/0). Without it the
// provider moderates notifications in software.
func (a *Adapter) HardwareModeration() bool { return a.modCount > 0 && a.modPeriod > 0 }

// DeviceName is the name of the opened device.
func (a *Adapter) DeviceName() string { return a.name }

// IWARP says whether the device speaks iWARP (siw, iWARP NICs) rather
// than InfiniBand or RoCE.
func (a *Adapter) IWARP() bool { return a.iwarp }

func (a *Adapter) check() error {
	a.closeMu.Lock()
	defer a.closeMu.Unlock()
	if a.closed {
		return transport.ErrClosed
	}
	return nil
}

// CreatePD creates a protection domain.
func (a *Adapter) CreatePD() (transport.PD, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	hw := C.ibv_alloc_pd(a.ctx)
	if hw == nil {
		return nil, fmt.Errorf("verbs: ibv_alloc_pd: %w", errnoErr(C.blk_errno()))
	}
	p := &pd{a: a, hw: hw}
	p.mrs.Store(&map[uint32]*mr{})
	a.objMu.Lock()
	a.pdSet[p] = struct{}{}
	a.objMu.Unlock()
	return p, nil
}

// Close closes every listener, QP and CQ of the adapter still open, then
// the device.
func (a *Adapter) Close() error {
	a.closeMu.Lock()
	if a.closed {
		a.closeMu.Unlock()
		return nil
	}
	a.closed = true
	a.closeMu.Unlock()
	a.objMu.Lock()
	var lns []*listener
	for l := range a.lnSet {
		lns = append(lns, l)
	}
	var qs []*qp
	for _, q := range *a.qps.Load() {
		qs = append(qs, q)
	}
	var srqs []*srq
	for _, s := range *a.srqs.Load() {
		srqs = append(srqs, s)
	}
	var cqs []*cq
	for c := range a.cqSet {
		cqs = append(cqs, c)
	}
	var pds []*pd
	for p := range a.pdSet {
		pds = append(pds, p)
	}
	a.objMu.Unlock()
	for _, l := range lns {
		l.Close()
	}
	for _, q := range qs {
		q.Close()
	}
	for _, s := range srqs {
		s.Close()
	}
	for _, c := range cqs {
		c.Close()
	}
	for _, p := range pds {
		p.closeAll()
	}
	a.cm.close()
	a.asyncWake.wake()
	<-a.asyncDone
	a.asyncWake.close()
	if rc := C.ibv_close_device(a.ctx); rc != 0 {
		return fmt.Errorf("verbs: close %s: %v", a.name, syscall.Errno(C.blk_errno()))
	}
	return nil
}

// asyncLoop reads the context's asynchronous events: QP errors fail the
// QP, the SRQ limit event drives the threshold notification (S4), a CQ
// error is an overrun (C3).
func (a *Adapter) asyncLoop() {
	defer close(a.asyncDone)
	fds := []unix.PollFd{{Fd: int32(a.ctx.async_fd), Events: unix.POLLIN}, {Fd: int32(a.asyncWake.fd), Events: unix.POLLIN}}
	var typ C.int
	var qpn C.uint32_t
	var srqp, cqp C.uintptr_t
	for {
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			return
		}
		if fds[1].Revents != 0 {
			a.asyncWake.drain()
			if a.check() != nil {
				return
			}
		}
		for C.blk_get_async_event(a.ctx, &typ, &qpn, &srqp, &cqp) == 0 {
			a.asyncEvent(uint32(typ), uint32(qpn), uintptr(srqp), uintptr(cqp))
		}
	}
}

// AdapterCounters implements transport.AdapterCounter.
func (a *Adapter) AdapterCounters() transport.AdapterCounters {
	return transport.AdapterCounters{
		Provider:    "verbs",
		QPFatal:     a.events.qpFatal.Load(),
		QPAccess:    a.events.qpAccess.Load(),
		SRQLimit:    a.events.srqLimit.Load(),
		CQError:     a.events.cqError.Load(),
		DeviceFatal: a.events.deviceFatal.Load(),
		Other:       a.events.other.Load(),
	}
}

func (a *Adapter) asyncEvent(typ, qpn uint32, srqp, cqp uintptr) {
	debugf("%s: async event %s qp %d", a.name, C.GoString(C.ibv_event_type_str(C.enum_ibv_event_type(typ))), qpn)
	switch typ {
	case C.IBV_EVENT_QP_FATAL, C.IBV_EVENT_QP_REQ_ERR, C.IBV_EVENT_QP_ACCESS_ERR:
		if typ == C.IBV_EVENT_QP_ACCESS_ERR {
			a.events.qpAccess.Add(1)
		} else {
			a.events.qpFatal.Add(1)
		}
	case C.IBV_EVENT_SRQ_LIMIT_REACHED:
		a.events.srqLimit.Add(1)
	case C.IBV_EVENT_CQ_ERR:
		a.events.cqError.Add(1)
	case C.IBV_EVENT_DEVICE_FATAL:
		a.events.deviceFatal.Add(1)
	default:
		a.events.other.Add(1)
	}
	switch typ {
	case C.IBV_EVENT_QP_FATAL, C.IBV_EVENT_QP_REQ_ERR:
		if q := (*a.qps.Load())[qpn]; q != nil {
			go q.fail(fmt.Errorf("%w: the device reported a fatal QP error", transport.ErrConnectionReset))
		}
	case C.IBV_EVENT_QP_ACCESS_ERR:
		if q := (*a.qps.Load())[qpn]; q != nil {
			go q.fail(fmt.Errorf("%w: the device reported a QP access error", transport.ErrAccessViolation))
		}
	case C.IBV_EVENT_SRQ_LIMIT_REACHED:
		a.objMu.Lock()
		s := a.srqByHW[srqp]
		a.objMu.Unlock()
		if s != nil {
			s.fire()
		}
	case C.IBV_EVENT_CQ_ERR:
		a.objMu.Lock()
		c := a.cqByHW[cqp]
		a.objMu.Unlock()
		if c != nil {
			c.overrun()
		}
	case C.IBV_EVENT_DEVICE_FATAL:
		for _, q := range *a.qps.Load() {
			go q.fail(fmt.Errorf("%w: device %s failed", transport.ErrConnectionReset, a.name))
		}
	}
}

// addQP and removeQP publish the QP-number map (copy on write).
func (a *Adapter) addQP(q *qp) {
	a.objMu.Lock()
	defer a.objMu.Unlock()
	old := *a.qps.Load()
	m := make(map[uint32]*qp, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[q.num] = q
	a.qps.Store(&m)
}

func (a *Adapter) removeQP(q *qp) {
	a.objMu.Lock()
	defer a.objMu.Unlock()
	old := *a.qps.Load()
	if old[q.num] != q {
		return
	}
	m := make(map[uint32]*qp, len(old))
	for k, v := range old {
		if v != q {
			m[k] = v
		}
	}
	a.qps.Store(&m)
}

func (a *Adapter) addSRQ(s *srq) {
	a.objMu.Lock()
	defer a.objMu.Unlock()
	a.nextSRQ++
	s.id = a.nextSRQ & genMask
	old := *a.srqs.Load()
	m := make(map[uint32]*srq, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[s.id] = s
	a.srqs.Store(&m)
	a.srqByHW[uintptr(unsafe.Pointer(s.hw))] = s
}

func (a *Adapter) removeSRQ(s *srq) {
	a.objMu.Lock()
	defer a.objMu.Unlock()
	old := *a.srqs.Load()
	m := make(map[uint32]*srq, len(old))
	for k, v := range old {
		if v != s {
			m[k] = v
		}
	}
	a.srqs.Store(&m)
	delete(a.srqByHW, uintptr(unsafe.Pointer(s.hw)))
}

func (a *Adapter) connectContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, a.cfg.ConnectTimeout)
}

// errnoErr maps an errno from a creation call onto the API's sentinels.
func errnoErr(e C.int) error {
	en := syscall.Errno(e)
	switch en {
	case unix.ENOMEM, unix.ENOSPC, unix.EAGAIN, unix.EMFILE, unix.ENFILE, unix.ENOBUFS:
		return fmt.Errorf("%w: %v", transport.ErrInsufficientResources, en)
	case unix.EINVAL, unix.EOPNOTSUPP, unix.E2BIG, unix.ERANGE:
		return fmt.Errorf("%w: %v", transport.ErrInvalidParameter, en)
	}
	return fmt.Errorf("%w: %v", transport.ErrInsufficientResources, en)
}

// debugf logs provider events to stderr when BLK_VERBS_DEBUG is set.
var debugOn bool

func debugf(format string, args ...any) {
	if debugOn {
		fmt.Fprintf(os.Stderr, "verbs: "+format+"\n", args...)
	}
}

// siwVendorID is Soft-iWARP's vendor ID ("bmt").
const siwVendorID = 0x626d74

// deviceSemantics returns the capability flags whose truth the verbs
// attributes do not carry, so they are known per device, from what the
// conformance suite observed on it. siw (6.1) lacks all three:
//
//   - FlagSolicitedNotifySupported: siw completes every receive as
//     "signalled", never "solicited" (siw_rqe_complete), so a
//     solicited-only arm would never fire for a receive; Arm refuses it.
//   - FlagRemoteErrorsReported: a Terminate from the peer is logged by
//     siw and the connection dropped (siw_recv_terminate): the
//     initiator's requests flush (ErrCancelled) and the QP ends
//     ErrDisconnected; only the refusing peer sees the access error.
//   - FlagRemoteReadEnforced: siw builds a read response checking the
//     key, PD and bounds of the source but no access right
//     (siw_check_sgl_tx with perms 0), so a region registered without
//     AccessRemoteRead can still be read by a peer with its key.
//
// Every other device (rxe, which the suite runs on, and hardware, which it
// has not met) keeps them: IB and RoCE NAK a refused access to the
// requester with a remote access error, and check the rights.
func deviceSemantics(vendorID uint32) transport.AdapterFlags {
	if vendorID == siwVendorID {
		return 0
	}
	return transport.FlagSolicitedNotifySupported | transport.FlagRemoteErrorsReported | transport.FlagRemoteReadEnforced
}

var errWrongAdapter = errors.New("verbs: object of another adapter or provider")
