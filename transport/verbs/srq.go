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
	"unsafe"

	"github.com/blk-project/blk/transport"
)

// srq is a shared receive queue.
//
// Queued (S3) is counted by the provider: receives posted minus receives
// whose completions were polled. The threshold notification (S4) is the
// device's SRQ limit event (IBV_EVENT_SRQ_LIMIT_REACHED, armed with
// ibv_modify_srq at the threshold: one event when the device's queue falls
// below it, polled or not), read by the adapter's asynchronous event
// goroutine. Modify fires at once when Queued is already below (the
// device only signals a fall). A device that refuses the limit gets the
// check in Poll instead (a receive polled that leaves Queued below the
// threshold). The callback runs on the SRQ's own goroutine, pinned to its
// affinity. One source only: a device event that arrives after a
// notification from the other source could fire a later arm.
//
// The device queue is created with room for twice the depth (at least 64,
// at most the device's limit), so that Modify can raise the depth without
// resizing (siw cannot resize an SRQ).
type srq struct {
	a      *Adapter
	pd     *pd
	hw     *C.struct_ibv_srq
	id     uint32
	hwCap  uint32
	maxSge uint32

	depth     atomic.Uint32
	queued    atomic.Int64
	threshold atomic.Uint32
	armed     atomic.Bool
	// swLimit: the device refused the limit event; Poll checks instead.
	swLimit atomic.Bool

	mu     sync.Mutex
	wrs    []C.struct_ibv_recv_wr
	sges   []C.struct_ibv_sge
	ctx    []any
	free   []uint32
	cmem   unsafe.Pointer
	closed bool
	freed  bool
	refs   int

	notify   transport.NotifyFunc
	nctx     any
	affinity int
	wakeCh   chan struct{}
	closeCh  chan struct{}
	done     chan struct{}
}

// CreateSRQ creates a shared receive queue (S1–S5).
func (p *pd) CreateSRQ(cfg transport.SRQConfig) (transport.SRQ, error) {
	a := p.a
	if a.info.MaxSrqDepth == 0 {
		return nil, fmt.Errorf("verbs: %s has no SRQs: %w", a.name, transport.ErrNotSupported)
	}
	if cfg.Depth == 0 || cfg.Depth > a.info.MaxSrqDepth {
		return nil, fmt.Errorf("verbs: SRQ depth %d not in [1, MaxSrqDepth %d]: %w", cfg.Depth, a.info.MaxSrqDepth, transport.ErrInvalidParameter)
	}
	if cfg.MaxSge > a.info.MaxReceiveRequestSge {
		return nil, fmt.Errorf("verbs: SRQ MaxSge %d > MaxReceiveRequestSge %d: %w", cfg.MaxSge, a.info.MaxReceiveRequestSge, transport.ErrInvalidParameter)
	}
	if cfg.NotifyThreshold > cfg.Depth {
		return nil, fmt.Errorf("verbs: SRQ threshold %d > depth %d: %w", cfg.NotifyThreshold, cfg.Depth, transport.ErrInvalidParameter)
	}
	if err := p.ref(); err != nil {
		return nil, err
	}
	s := &srq{
		a: a, pd: p, maxSge: max(cfg.MaxSge, 1),
		notify: cfg.Notify, nctx: cfg.Context, affinity: cfg.Affinity,
		wakeCh: make(chan struct{}, 1), closeCh: make(chan struct{}), done: make(chan struct{}),
	}
	s.hwCap = min(max(2*cfg.Depth, 64), a.info.MaxSrqDepth*2)
	s.depth.Store(cfg.Depth)
	rwr := C.size_t(unsafe.Sizeof(C.struct_ibv_recv_wr{}))
	sge := C.size_t(unsafe.Sizeof(C.struct_ibv_sge{}))
	s.cmem = C.calloc(1, C.size_t(s.hwCap)*(rwr+C.size_t(s.maxSge)*sge))
	if s.cmem == nil {
		p.unref()
		return nil, fmt.Errorf("verbs: %w: SRQ slot table", transport.ErrInsufficientResources)
	}
	s.wrs = unsafe.Slice((*C.struct_ibv_recv_wr)(s.cmem), s.hwCap)
	s.sges = unsafe.Slice((*C.struct_ibv_sge)(unsafe.Add(s.cmem, uintptr(s.hwCap)*uintptr(rwr))), s.hwCap*s.maxSge)
	s.ctx = make([]any, s.hwCap)
	s.free = make([]uint32, s.hwCap)
	for i := range s.free {
		s.free[i] = s.hwCap - 1 - uint32(i)
	}
	var attr C.struct_ibv_srq_init_attr
	attr.attr.max_wr = C.uint32_t(s.hwCap)
	attr.attr.max_sge = C.uint32_t(s.maxSge)
	s.hw = C.ibv_create_srq(p.hw, &attr)
	if s.hw == nil {
		// A device that refuses the headroom gets exactly the depth.
		s.hwCap = cfg.Depth
		s.wrs, s.ctx, s.free = s.wrs[:s.hwCap], s.ctx[:s.hwCap], s.free[:0]
		for i := uint32(0); i < s.hwCap; i++ {
			s.free = append(s.free, s.hwCap-1-i)
		}
		attr.attr.max_wr = C.uint32_t(s.hwCap)
		s.hw = C.ibv_create_srq(p.hw, &attr)
	}
	if s.hw == nil {
		err := errnoErr(C.blk_errno())
		C.free(s.cmem)
		p.unref()
		return nil, fmt.Errorf("verbs: ibv_create_srq(%d): %w", s.hwCap, err)
	}
	a.addSRQ(s)
	go s.run()
	if cfg.NotifyThreshold > 0 {
		s.Modify(0, cfg.NotifyThreshold)
	}
	return s, nil
}

// PostReceive queues a receive (S3: at most the depth).
func (s *srq) PostReceive(requestContext any, sges []transport.SGE) error {
	if uint32(len(sges)) > s.maxSge {
		return fmt.Errorf("verbs: %d SGEs > the SRQ's MaxSge %d: %w", len(sges), s.maxSge, transport.ErrInvalidParameter)
	}
	if err := s.pd.checkSGEs(sges); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return transport.ErrClosed
	}
	if s.queued.Load() >= int64(s.depth.Load()) || len(s.free) == 0 {
		s.mu.Unlock()
		return transport.ErrInsufficientResources
	}
	slot := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	wr := &s.wrs[slot]
	setRecvWR(wr, s.sges[slot*s.maxSge:(slot+1)*s.maxSge], sges, wrID(kindSRQ, s.id, slot))
	s.ctx[slot] = requestContext
	s.queued.Add(1)
	if rc := C.blk_post_srq_recv(s.hw, wr); rc != 0 {
		s.queued.Add(-1)
		s.ctx[slot] = nil
		s.free = append(s.free, slot)
		s.mu.Unlock()
		return postErr(rc)
	}
	s.mu.Unlock()
	return nil
}

// consume frees the slot of a polled receive and checks the threshold.
func (s *srq) consume(slot uint32) (any, bool) {
	s.mu.Lock()
	if s.freed || slot >= uint32(len(s.ctx)) {
		s.mu.Unlock()
		return nil, false
	}
	ctx := s.ctx[slot]
	s.ctx[slot] = nil
	s.free = append(s.free, slot)
	s.mu.Unlock()
	if n := s.queued.Add(-1); s.swLimit.Load() && s.armed.Load() && n < int64(s.threshold.Load()) {
		s.fire()
	}
	return ctx, true
}

// fire delivers the one notification of the current arm.
func (s *srq) fire() {
	if s.armed.CompareAndSwap(true, false) {
		select {
		case s.wakeCh <- struct{}{}:
		default:
		}
	}
}

func (s *srq) run() {
	defer close(s.done)
	if s.affinity >= 0 {
		pinThread(s.affinity)
	}
	for {
		select {
		case <-s.wakeCh:
			if s.notify != nil {
				s.notify(s.nctx, nil)
			}
		case <-s.closeCh:
			if s.notify != nil {
				s.notify(s.nctx, transport.ErrClosed)
			}
			return
		}
	}
}

// Modify changes the depth (0 keeps it) and re-arms the threshold
// notification (0 disarms it); it fires at once if Queued is already
// below the threshold (S4).
func (s *srq) Modify(depth, notifyThreshold uint32) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return transport.ErrClosed
	}
	if depth > 0 {
		if depth > s.a.info.MaxSrqDepth {
			return fmt.Errorf("verbs: SRQ depth %d > MaxSrqDepth %d: %w", depth, s.a.info.MaxSrqDepth, transport.ErrInvalidParameter)
		}
		if depth > s.hwCap {
			return fmt.Errorf("verbs: SRQ depth %d above the %d the device queue was created with: %w", depth, s.hwCap, transport.ErrInsufficientResources)
		}
		if int64(depth) < s.queued.Load() {
			return fmt.Errorf("verbs: SRQ depth %d below the %d receives queued: %w", depth, s.queued.Load(), transport.ErrInvalidParameter)
		}
		s.depth.Store(depth)
	}
	s.threshold.Store(notifyThreshold)
	if notifyThreshold == 0 {
		s.armed.Store(false)
		C.blk_modify_srq(s.hw, 0, 0, C.IBV_SRQ_LIMIT)
		return nil
	}
	s.armed.Store(true)
	if s.queued.Load() < int64(notifyThreshold) {
		s.fire()
		return nil
	}
	// The device's limit event; a device that refuses it leaves the check
	// at poll time alone.
	if C.blk_modify_srq(s.hw, 0, C.uint32_t(notifyThreshold), C.IBV_SRQ_LIMIT) != 0 {
		s.swLimit.Store(true)
		debugf("%s: SRQ limit refused by the device; checking at poll time", s.a.name)
	}
	return nil
}

// Queued is the number of receives queued: posted and not yet polled.
func (s *srq) Queued() int { return int(s.queued.Load()) }

func (s *srq) ref() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return transport.ErrClosed
	}
	s.refs++
	return nil
}

func (s *srq) unref() {
	s.mu.Lock()
	s.refs--
	free := s.closed && s.refs == 0 && !s.freed
	s.mu.Unlock()
	if free {
		s.release()
	}
}

// Close stops the notification goroutine and destroys the SRQ once no QP
// uses it.
func (s *srq) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	free := s.refs == 0
	s.mu.Unlock()
	s.armed.Store(false)
	close(s.closeCh)
	<-s.done
	if free {
		s.release()
	}
	return nil
}

func (s *srq) release() {
	s.mu.Lock()
	if s.freed {
		s.mu.Unlock()
		return
	}
	s.freed = true
	s.mu.Unlock()
	s.a.removeSRQ(s)
	C.ibv_destroy_srq(s.hw)
	C.free(s.cmem)
	s.pd.unref()
}
