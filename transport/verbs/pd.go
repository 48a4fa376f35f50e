//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/blk-project/blk/transport"
	"golang.org/x/sys/unix"
)

// pd is a protection domain. Its regions are kept by local key, read
// lock-free by the inline path (which must check the keys of what it
// copies; FlagInline contract).
type pd struct {
	a  *Adapter
	hw *C.struct_ibv_pd

	mu     sync.Mutex
	mrs    atomic.Pointer[map[uint32]*mr]
	closed bool
	freed  bool
	refs   int // QPs, SRQs and regions of this PD
}

// RegisterMemory registers buf in place. The memory is the caller's
// []byte, pinned with runtime.Pinner until the region is closed: the
// device (and libibverbs) keep its address, which cgo allows only for
// pinned Go memory, and the Go garbage collector never moves heap objects,
// so the pinned pages stay where the device was told they are. Bytes()
// returns buf itself, so data the peer writes is seen in the caller's
// slice and data the caller writes there is what the peer reads. Local
// write is always granted: receives, read sinks and remote writes need it.
// The caller must not let buf be reused for anything else until Close.
func (p *pd) RegisterMemory(buf []byte, access transport.Access) (transport.MemoryRegion, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("verbs: RegisterMemory of 0 bytes: %w", transport.ErrInvalidParameter)
	}
	if uint64(len(buf)) > p.a.info.MaxRegistrationSize {
		return nil, fmt.Errorf("verbs: RegisterMemory of %d bytes > MaxRegistrationSize %d: %w", len(buf), p.a.info.MaxRegistrationSize, transport.ErrInvalidParameter)
	}
	m := &mr{pd: p, buf: buf, addr: uint64(uintptr(unsafe.Pointer(&buf[0])))}
	m.pin.Pin(&buf[0])
	if err := p.register(m, access); err != nil {
		m.pin.Unpin()
		return nil, err
	}
	return m, nil
}

// AllocateMemory maps zeroed anonymous memory (outside the Go heap, whole
// pages) and registers it; Close deregisters and unmaps it.
func (p *pd) AllocateMemory(length int, access transport.Access) (transport.MemoryRegion, error) {
	if length <= 0 || uint64(length) > p.a.info.MaxRegistrationSize {
		return nil, fmt.Errorf("verbs: allocate %d bytes (max %d): %w", length, p.a.info.MaxRegistrationSize, transport.ErrInvalidParameter)
	}
	page := unix.Getpagesize()
	mapping, err := unix.Mmap(-1, 0, (length+page-1)/page*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("verbs: mmap %d bytes: %w: %v", length, transport.ErrInsufficientResources, err)
	}
	buf := mapping[:length:length]
	m := &mr{pd: p, buf: buf, addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), mapping: mapping}
	if err := p.register(m, access); err != nil {
		unix.Munmap(mapping)
		return nil, err
	}
	return m, nil
}

// register registers m.buf with access and publishes it by local key.
func (p *pd) register(m *mr, access transport.Access) error {
	buf := m.buf
	flags := C.int(C.IBV_ACCESS_LOCAL_WRITE)
	if access&transport.AccessRemoteRead != 0 {
		flags |= C.IBV_ACCESS_REMOTE_READ
	}
	if access&transport.AccessRemoteWrite != 0 {
		flags |= C.IBV_ACCESS_REMOTE_WRITE
	}
	if access&transport.AccessMWBind != 0 {
		flags |= C.IBV_ACCESS_MW_BIND
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return transport.ErrClosed
	}
	m.hw = C.blk_reg_mr(p.hw, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), flags)
	if m.hw == nil {
		en := C.blk_errno()
		if syscall.Errno(en) == unix.ENOMEM {
			// Pinned pages count against RLIMIT_MEMLOCK (siw checks it even
			// for root); say so, since the fix is outside the program.
			var lim unix.Rlimit
			unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
			return fmt.Errorf("verbs: ibv_reg_mr(%d bytes): %w (RLIMIT_MEMLOCK is %d bytes: raise it, e.g. ulimit -l unlimited)", len(buf), errnoErr(en), lim.Cur)
		}
		return fmt.Errorf("verbs: ibv_reg_mr(%d bytes): %w", len(buf), errnoErr(en))
	}
	m.lkey, m.rkey = uint32(m.hw.lkey), uint32(m.hw.rkey)
	old := *p.mrs.Load()
	nm := make(map[uint32]*mr, len(old)+1)
	for k, v := range old {
		nm[k] = v
	}
	nm[m.lkey] = m
	p.mrs.Store(&nm)
	p.refs++
	return nil
}

// lookup finds the region of a local key (nil: none in this PD).
func (p *pd) lookup(lkey uint32) *mr { return (*p.mrs.Load())[lkey] }

// checkSGEs refuses, at post time, SGEs that name no registered memory of
// the PD (unknown key, or out of the region's bounds) with
// ErrAccessViolation: the request never reaches the device, and the QP is
// unharmed (a device would fail the request and the connection with it).
// The inline path relies on it: it copies from the memory the SGEs name.
func (p *pd) checkSGEs(sges []transport.SGE) error {
	if len(sges) == 0 {
		return nil
	}
	mrs := *p.mrs.Load()
	for _, s := range sges {
		m := mrs[s.LKey]
		if m == nil || s.Addr < m.addr || s.Addr-m.addr+uint64(s.Length) > uint64(len(m.buf)) {
			return fmt.Errorf("verbs: SGE (key %#x, %#x+%d) names no registered memory of the PD: %w", s.LKey, s.Addr, s.Length, transport.ErrAccessViolation)
		}
	}
	return nil
}

func (p *pd) ref() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return transport.ErrClosed
	}
	p.refs++
	return nil
}

func (p *pd) unref() {
	p.mu.Lock()
	p.refs--
	free := p.closed && p.refs == 0 && !p.freed
	if free {
		p.freed = true
	}
	p.mu.Unlock()
	if free {
		C.ibv_dealloc_pd(p.hw)
	}
}

// Close deallocates the PD once its regions, QPs and SRQs are closed
// (immediately if they are).
func (p *pd) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	free := p.refs == 0
	if free {
		p.freed = true
	}
	p.mu.Unlock()
	p.a.objMu.Lock()
	delete(p.a.pdSet, p)
	p.a.objMu.Unlock()
	if free {
		if rc := C.ibv_dealloc_pd(p.hw); rc != 0 {
			return fmt.Errorf("verbs: ibv_dealloc_pd: %w", errnoErr(rc))
		}
	}
	return nil
}

// closeAll closes the regions left open (adapter close), then the PD.
func (p *pd) closeAll() {
	for _, m := range *p.mrs.Load() {
		m.Close()
	}
	p.Close()
}

// mr is a registered region of pinned Go memory.
type mr struct {
	pd         *pd
	hw         *C.struct_ibv_mr
	buf        []byte
	addr       uint64
	lkey, rkey uint32
	pin        runtime.Pinner
	mapping    []byte // AllocateMemory's mapping, unmapped at Close
	once       sync.Once
}

func (m *mr) LKey() uint32  { return m.lkey }
func (m *mr) RKey() uint32  { return m.rkey }
func (m *mr) Addr() uint64  { return m.addr }
func (m *mr) Bytes() []byte { return m.buf }

func (m *mr) SGE(off, n uint32) transport.SGE {
	return transport.SGE{Addr: m.addr + uint64(off), Length: n, LKey: m.lkey}
}

// Close deregisters the region and unpins its memory.
func (m *mr) Close() error {
	var err error
	m.once.Do(func() {
		p := m.pd
		p.mu.Lock()
		old := *p.mrs.Load()
		nm := make(map[uint32]*mr, len(old))
		for k, v := range old {
			if v != m {
				nm[k] = v
			}
		}
		p.mrs.Store(&nm)
		p.mu.Unlock()
		if rc := C.ibv_dereg_mr(m.hw); rc != 0 {
			err = fmt.Errorf("verbs: ibv_dereg_mr: %w", errnoErr(rc))
		}
		m.pin.Unpin()
		if m.mapping != nil {
			unix.Munmap(m.mapping)
		}
		p.unref()
	})
	return err
}
