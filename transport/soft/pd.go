package soft

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/blk-project/blk/transport"
)

// The optional features the soft provider has: fast registration (its
// AdapterInfo reports FRMRPageCount > 0) and flush. It has no memory
// windows (transport.MemoryWindowPD, transport.BindQP): no consumer asks
// for them, so FlagMemoryWindowsSupported is clear and a registration with
// AccessMWBind is refused with ErrNotSupported.
var (
	_ transport.FastRegisterPD = (*pd)(nil)
	_ transport.FastRegisterQP = (*qp)(nil)
	_ transport.FlushQP        = (*qp)(nil)
)

// pd is a protection domain: the STag table of its memory regions. A
// lookup is lock-free (an atomic snapshot of the table); registration
// copies the table.
type pd struct {
	a      *Adapter
	mu     sync.Mutex // registration
	table  atomic.Pointer[[]*mr]
	free   []uint32 // recycled table indexes
	closed bool
}

func newPD(a *Adapter) *pd {
	p := &pd{a: a}
	t := make([]*mr, 1) // index 0 is never used: STag 0 means "none"
	p.table.Store(&t)
	return p
}

// mr is a memory region. Its STag is index<<8 | key.
type mr struct {
	pd    *pd
	index uint32
	frmr  bool
	max   uint32 // fast-register: most bytes

	mu      sync.Mutex
	key     uint8
	postKey uint8 // last key handed out by FastRegister
	valid   bool
	access  transport.Access
	buf     []byte
	base    uint64

	// Provider-owned memory (AllocateMemory): mapping is the whole
	// mapping (buf rounded up to pages). pins counts the provider's
	// goroutines moving data through buf right now (see pin); the
	// mapping goes back when the region is closed and pins is 0, so a
	// Close racing with a transfer never unmaps memory still in use.
	owned   bool
	mapping []byte
	pins    int32
	closed  bool
	// backing is the provider-owned region a fast-registered binding
	// lies in, pinned while the binding lasts (nil for Go memory): a
	// transfer through this region pins it instead.
	backing *mr
}

func addrOf(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

func (p *pd) add(m *mr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return transport.ErrClosed
	}
	old := *p.table.Load()
	if n := len(p.free); n > 0 {
		m.index = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		if len(old) >= 1<<24 {
			return fmt.Errorf("soft: STag table full: %w", transport.ErrInsufficientResources)
		}
		m.index = uint32(len(old))
	}
	t := make([]*mr, max(len(old), int(m.index)+1))
	copy(t, old)
	t[m.index] = m
	p.table.Store(&t)
	return nil
}

func (p *pd) remove(m *mr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := *p.table.Load()
	if int(m.index) >= len(old) || old[m.index] != m {
		return
	}
	t := make([]*mr, len(old))
	copy(t, old)
	t[m.index] = nil
	p.table.Store(&t)
	p.free = append(p.free, m.index)
}

// lookup returns the region an STag names, or nil.
func (p *pd) lookup(stag uint32) *mr {
	t := *p.table.Load()
	i := stag >> 8
	if i == 0 || int(i) >= len(t) {
		return nil
	}
	return t[i]
}

// accessFault says why an access was refused; it maps to a Terminate code.
type accessFault uint8

const (
	faultNone accessFault = iota
	faultInvalidSTag
	faultBounds
	faultAccess
)

// resolve checks that the STag is valid and grants need for the n bytes
// at addr, and returns them. The bytes may only be looked at while
// nothing can close the region: use pin to move data through them.
func (p *pd) resolve(stag uint32, addr uint64, n uint32, need transport.Access) ([]byte, accessFault) {
	b, _, f := p.access(stag, addr, n, need, false)
	return b, f
}

// pin is resolve for a transfer: when the region is provider-owned memory
// it stays mapped (even if closed meanwhile) until the caller calls
// unpin on the returned region; for other regions the returned region is
// nil and there is nothing to release.
func (p *pd) pin(stag uint32, addr uint64, n uint32, need transport.Access) ([]byte, *mr, accessFault) {
	return p.access(stag, addr, n, need, true)
}

func (p *pd) access(stag uint32, addr uint64, n uint32, need transport.Access, pin bool) ([]byte, *mr, accessFault) {
	m := p.lookup(stag)
	if m == nil {
		return nil, nil, faultInvalidSTag
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.valid || m.key != uint8(stag) {
		return nil, nil, faultInvalidSTag
	}
	if m.access&need != need {
		return nil, nil, faultAccess
	}
	if addr < m.base || addr-m.base > uint64(len(m.buf)) || uint64(len(m.buf))-(addr-m.base) < uint64(n) {
		return nil, nil, faultBounds
	}
	off := addr - m.base
	b := m.buf[off : off+uint64(n) : off+uint64(n)]
	switch {
	case !pin:
		return b, nil, faultNone
	case m.owned:
		m.pins++
		return b, m, faultNone
	case m.backing != nil:
		o := m.backing
		o.mu.Lock()
		o.pins++
		o.mu.Unlock()
		return b, o, faultNone
	}
	return b, nil, faultNone
}

// ownerOf returns the open provider-owned region of p that holds all of
// buf, pinned, or nil. For fast registration only (it scans the table).
func (p *pd) ownerOf(buf []byte) *mr {
	if len(buf) == 0 {
		return nil
	}
	lo := addrOf(buf)
	hi := lo + uint64(len(buf))
	for _, o := range *p.table.Load() {
		if o == nil || !o.owned {
			continue
		}
		o.mu.Lock()
		if !o.closed && lo >= o.base && hi <= o.base+uint64(len(o.buf)) {
			o.pins++
			o.mu.Unlock()
			return o
		}
		o.mu.Unlock()
	}
	return nil
}

// unpin releases a pin; the last one of a closed region unmaps it. m may
// be nil (nothing was pinned).
func (m *mr) unpin() { m.unpinN(1) }

// unpinN releases n pins.
func (m *mr) unpinN(n int32) {
	if m == nil || n == 0 {
		return
	}
	m.mu.Lock()
	m.pins -= n
	var unmap []byte
	if m.closed && m.pins == 0 {
		unmap, m.mapping = m.mapping, nil
	}
	m.mu.Unlock()
	if unmap != nil {
		unmapMemory(unmap)
	}
}

func (f accessFault) err() error {
	if f == faultNone {
		return nil
	}
	return transport.ErrAccessViolation
}

func (p *pd) RegisterMemory(buf []byte, access transport.Access) (transport.MemoryRegion, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("soft: register an empty buffer: %w", transport.ErrInvalidParameter)
	}
	if access&transport.AccessMWBind != 0 {
		return nil, fmt.Errorf("soft: memory windows: %w", transport.ErrNotSupported)
	}
	if access&transport.AccessRemoteWrite != 0 {
		access |= transport.AccessLocalWrite
	}
	m := &mr{pd: p, valid: true, access: access, buf: buf, base: addrOf(buf), key: 1}
	if err := p.add(m); err != nil {
		return nil, err
	}
	return m, nil
}

// AllocateMemory maps zeroed anonymous memory (outside the Go heap,
// rounded up to whole pages) and registers it; Close unmaps it.
func (p *pd) AllocateMemory(length int, access transport.Access) (transport.MemoryRegion, error) {
	if length <= 0 || uint64(length) > p.a.info.MaxRegistrationSize {
		return nil, fmt.Errorf("soft: allocate %d bytes (max %d): %w", length, p.a.info.MaxRegistrationSize, transport.ErrInvalidParameter)
	}
	if access&transport.AccessMWBind != 0 {
		return nil, fmt.Errorf("soft: memory windows: %w", transport.ErrNotSupported)
	}
	if access&transport.AccessRemoteWrite != 0 {
		access |= transport.AccessLocalWrite
	}
	mapping, err := mapMemory(length)
	if err != nil {
		return nil, err
	}
	buf := mapping[:length:length]
	m := &mr{pd: p, valid: true, access: access, buf: buf, base: addrOf(buf), key: 1, owned: true, mapping: mapping}
	if err := p.add(m); err != nil {
		unmapMemory(mapping)
		return nil, err
	}
	return m, nil
}

func (p *pd) AllocateMR(maxLen uint32) (transport.MemoryRegion, error) {
	if maxLen == 0 || maxLen > maxTransfer {
		return nil, fmt.Errorf("soft: fast-register region of %d bytes (max %d): %w", maxLen, maxTransfer, transport.ErrInvalidParameter)
	}
	m := &mr{pd: p, frmr: true, max: maxLen, key: 0, postKey: 0}
	if err := p.add(m); err != nil {
		return nil, err
	}
	return m, nil
}

func (p *pd) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	return nil
}

func (m *mr) stag() uint32 { return m.index<<8 | uint32(m.key) }

func (m *mr) LKey() uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stag()
}

func (m *mr) RKey() uint32 { return m.LKey() }

func (m *mr) Addr() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.base
}

func (m *mr) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.buf
}

func (m *mr) SGE(off, n uint32) transport.SGE {
	m.mu.Lock()
	defer m.mu.Unlock()
	return transport.SGE{Addr: m.base + uint64(off), Length: n, LKey: m.stag()}
}

// Close invalidates the region's keys; provider-owned memory is unmapped
// at once, or by the last transfer still moving data through it (unpin).
func (m *mr) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.valid = false
	backing := m.backing
	m.backing = nil
	var unmap []byte
	if m.owned {
		m.buf = nil
		if m.pins == 0 {
			unmap, m.mapping = m.mapping, nil
		}
	}
	m.mu.Unlock()
	m.pd.remove(m)
	if unmap != nil {
		unmapMemory(unmap)
	}
	backing.unpin()
	return nil
}

// nextKey reserves the key a fast-register will install.
func (m *mr) nextKey() uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.postKey++
	return m.index<<8 | uint32(m.postKey)
}

// fastRegister installs a binding (run in send-queue order).
func (m *mr) fastRegister(key uint32, buf []byte, access transport.Access) {
	if access&transport.AccessRemoteWrite != 0 {
		access |= transport.AccessLocalWrite
	}
	owner := m.pd.ownerOf(buf)
	m.mu.Lock()
	m.key = uint8(key)
	m.buf = buf
	m.base = addrOf(buf)
	m.access = access
	m.valid = true
	old := m.backing
	m.backing = owner
	m.mu.Unlock()
	old.unpin()
}

// invalidate retires key; it fails when the key is not the current one or
// the region is not fast-registered.
func (m *mr) invalidate(key uint32) bool {
	m.mu.Lock()
	if !m.frmr || m.key != uint8(key) {
		m.mu.Unlock()
		return false
	}
	m.valid = false
	old := m.backing
	m.backing = nil
	m.mu.Unlock()
	old.unpin()
	return true
}

// invalidateAny retires the current key (local invalidate).
func (m *mr) invalidateAny() {
	m.mu.Lock()
	m.valid = false
	old := m.backing
	m.backing = nil
	m.mu.Unlock()
	old.unpin()
}
