package target

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"github.com/blk-project/blk/nvme"
)

// Geometry describes a namespace's storage.
type Geometry struct {
	// BlockSize is the logical block size in bytes: a power of two from
	// 512 to 4096 (what a Linux host can use as LBADS). It must never
	// change for the life of the backend.
	BlockSize uint32
	// Blocks is the capacity in blocks (NSZE). It may grow or shrink
	// (Subsystem.RevalidateNamespace picks the change up).
	Blocks uint64
	// ReadOnly namespaces refuse writes (Identify NSATTR bit 0).
	ReadOnly bool
}

// Backend is a namespace's storage: what the core calls for each NVM
// command once the command is checked (LBA range, length, alignment).
// Methods are called concurrently from any goroutine. Read and plain
// Write run on the binding's goroutine and should not block for long;
// Flush, FUA writes and FUA write-zeroes run on the target's sync workers.
// The core times every call into the namespace's latency histograms
// (NamespaceStats.Latency): a backend, or a wrapper around one, never
// needs to measure itself.
//
// A backend translates its own errors into NVMe status, in one function
// (the store adapter's storeStatus, as nvmet's blk_to_nvme_status): an
// error carrying a StatusError in its chain (WithStatus) gets that
// status; anything else is an Internal Error.
type Backend interface {
	// Geometry returns the block size, capacity and write protection.
	Geometry() (Geometry, error)
	// Read fills buf (a whole number of blocks) from lba.
	Read(lba uint64, buf []byte) error
	// Write writes data (a whole number of blocks) at lba; with fua it is
	// durable on return.
	Write(lba uint64, data []byte, fua bool) error
	// WriteZeroes makes n blocks at lba read as zeros; with fua durably.
	WriteZeroes(lba, n uint64, fua bool) error
	// Deallocate releases n blocks at lba; they read as zeros afterwards
	// (the target reports DLFEAT accordingly).
	Deallocate(lba, n uint64) error
	// Flush makes every acknowledged write durable.
	Flush() error
	// NewWriteGroup returns an empty group in which plain (not FUA)
	// writes are committed together, which costs the backend less than
	// committing each (a backend on a log-structured store: one batch and
	// one log record instead of one per write); or nil if the backend
	// commits each write alone as cheaply (the core then calls Write for
	// each; the store adapter's case: an overwrite is one pwrite). The core
	// calls it for each binding goroutine that executes writes with
	// Request.Group set, and reuses the group.
	//
	// It is part of Backend, not an extra found by type assertion, so
	// that a wrapper embedding a Backend keeps it and a wrapper spelling
	// out every method must decide about it: none can drop the batching
	// by accident (issue 22: blkd's latency wrapper did, and every plain
	// write was a pebble commit of its own).
	NewWriteGroup() WriteGroup
}

// Viewer is an optional Backend extra, found by type assertion: it lets
// Compare look at the stored blocks without copying them.
type Viewer interface {
	// View calls fn for each of the n blocks at lba with its data (nil for
	// a block that reads as zeros), valid only during the call.
	View(lba, n uint64, fn func(lba uint64, data []byte)) error
}

// WriteGroup gathers writes until Commit (Backend.NewWriteGroup). A write
// added is neither visible nor acknowledged until Commit returns nil.
// Only one goroutine uses a group at a time.
type WriteGroup interface {
	// Add checks a write as Write would and adds it; ErrGroupFull (wrapped
	// or not) asks for a Commit first, any other error fails the write.
	// data stays valid and unchanged until the next Commit.
	Add(lba uint64, data []byte) error
	// Commit applies every pending write, or none: on error each must be
	// failed with it. The group is empty afterwards.
	Commit() error
	Len() int
}

// ErrGroupFull is returned by WriteGroup.Add when the group must be
// committed before the write can join it.
var ErrGroupFull = errors.New("target: write group full")

// MemBackend is a Backend in memory, for tests and for bindings' test
// suites: a byte slice of the whole capacity behind a lock, with no
// durability (Flush and FUA do nothing). Its errors carry their NVMe
// status. With SetWriteGroups it also groups plain writes, so that the
// core's batching (Group) and its counters are tested on it.
type MemBackend struct {
	mu       sync.RWMutex
	shift    uint8
	blocks   uint64
	data     []byte
	readOnly bool
	group    int // the most writes of a WriteGroup; 0: none
}

// NewMemBackend returns a zeroed in-memory backend of blocks blocks of
// blockSize bytes (a power of two from 512 to 4096).
func NewMemBackend(blockSize uint32, blocks uint64) (*MemBackend, error) {
	if blockSize < 512 || blockSize > 4096 || bits.OnesCount32(blockSize) != 1 {
		return nil, fmt.Errorf("target: memory backend block size %d: %w", blockSize, ErrInvalid)
	}
	if blocks == 0 || blocks > (1<<34)/uint64(blockSize) {
		return nil, fmt.Errorf("target: memory backend of %d blocks: %w", blocks, ErrInvalid)
	}
	return &MemBackend{shift: uint8(bits.TrailingZeros32(blockSize)), blocks: blocks,
		data: make([]byte, blocks*uint64(blockSize))}, nil
}

// SetReadOnly sets the backend's write protection.
func (m *MemBackend) SetReadOnly(ro bool) {
	m.mu.Lock()
	m.readOnly = ro
	m.mu.Unlock()
}

// Resize changes the capacity (new blocks read as zeros).
func (m *MemBackend) Resize(blocks uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := blocks << m.shift
	if n <= uint64(len(m.data)) {
		m.data = m.data[:n]
	} else {
		m.data = append(m.data, make([]byte, n-uint64(len(m.data)))...)
	}
	m.blocks = blocks
}

// Geometry implements Backend.
func (m *MemBackend) Geometry() (Geometry, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return Geometry{BlockSize: 1 << m.shift, Blocks: m.blocks, ReadOnly: m.readOnly}, nil
}

var (
	errMemRange = WithStatus(errors.New("target: memory backend: LBA range past the capacity"),
		nvme.StatusLBAOutOfRange.WithDNR())
	errMemAlign = WithStatus(errors.New("target: memory backend: length not a whole number of blocks"),
		nvme.StatusSGLInvalidDataLength.WithDNR())
	errMemReadOnly = WithStatus(errors.New("target: memory backend: write protected"),
		nvme.StatusNamespaceWriteProtect.WithDNR())
	errMemTooLarge = WithStatus(errors.New("target: memory backend: request too large"),
		nvme.StatusInvalidField.WithDNR())
)

// span checks a request and returns its byte range. Requires m.mu.
func (m *MemBackend) span(lba, n uint64) (uint64, uint64, error) {
	if lba > m.blocks || n > m.blocks-lba {
		return 0, 0, errMemRange
	}
	return lba << m.shift, (lba + n) << m.shift, nil
}

func (m *MemBackend) blocksOf(length int) (uint64, error) {
	if length&(1<<m.shift-1) != 0 {
		return 0, errMemAlign
	}
	return uint64(length) >> m.shift, nil
}

// Read implements Backend.
func (m *MemBackend) Read(lba uint64, buf []byte) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n, err := m.blocksOf(len(buf))
	if err != nil {
		return err
	}
	lo, hi, err := m.span(lba, n)
	if err != nil {
		return err
	}
	copy(buf, m.data[lo:hi])
	return nil
}

// Write implements Backend.
func (m *MemBackend) Write(lba uint64, data []byte, fua bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkWrite(lba, data); err != nil {
		return err
	}
	copy(m.data[lba<<m.shift:], data)
	return nil
}

// WriteZeroes implements Backend.
func (m *MemBackend) WriteZeroes(lba, n uint64, fua bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.readOnly {
		return errMemReadOnly
	}
	lo, hi, err := m.span(lba, n)
	if err != nil {
		return err
	}
	clear(m.data[lo:hi])
	return nil
}

// Deallocate implements Backend.
func (m *MemBackend) Deallocate(lba, n uint64) error { return m.WriteZeroes(lba, n, false) }

// Flush implements Backend.
func (m *MemBackend) Flush() error { return nil }

// SetWriteGroups makes NewWriteGroup return groups of up to max writes
// each (0, the default: none, a copy into memory costs the same alone or
// in a group). A group holds its writes, unseen, until Commit applies them
// all under one lock, or none. Call it before the backend serves a
// namespace: groups made before keep their size.
func (m *MemBackend) SetWriteGroups(max int) {
	m.mu.Lock()
	m.group = max
	m.mu.Unlock()
}

// NewWriteGroup implements Backend: nil unless SetWriteGroups asked for
// groups.
func (m *MemBackend) NewWriteGroup() WriteGroup {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.group <= 0 {
		return nil
	}
	return &memGroup{m: m, writes: make([]memWrite, 0, m.group)}
}

// memGroup is a MemBackend's WriteGroup: the writes added, applied by
// Commit. Its slice is made once: Add and Commit allocate nothing.
type memGroup struct {
	m      *MemBackend
	writes []memWrite
}

type memWrite struct {
	lba  uint64
	data []byte
}

// checkWrite refuses a write as Write would. Requires m.mu.
func (m *MemBackend) checkWrite(lba uint64, data []byte) error {
	if m.readOnly {
		return errMemReadOnly
	}
	n, err := m.blocksOf(len(data))
	if err != nil {
		return err
	}
	_, _, err = m.span(lba, n)
	return err
}

// Add implements WriteGroup.
func (g *memGroup) Add(lba uint64, data []byte) error {
	if len(g.writes) == cap(g.writes) {
		return ErrGroupFull
	}
	g.m.mu.RLock()
	err := g.m.checkWrite(lba, data)
	g.m.mu.RUnlock()
	if err != nil {
		return err
	}
	g.writes = append(g.writes, memWrite{lba: lba, data: data})
	return nil
}

// Commit implements WriteGroup: every write is checked again (the backend
// may have shrunk or become read-only since Add), then all are applied,
// or none.
func (g *memGroup) Commit() error {
	m := g.m
	m.mu.Lock()
	defer func() {
		m.mu.Unlock()
		clear(g.writes) // drop the callers' buffers
		g.writes = g.writes[:0]
	}()
	for _, w := range g.writes {
		if err := m.checkWrite(w.lba, w.data); err != nil {
			return err
		}
	}
	for _, w := range g.writes {
		copy(m.data[w.lba<<m.shift:], w.data)
	}
	return nil
}

// Len implements WriteGroup.
func (g *memGroup) Len() int { return len(g.writes) }

// View implements Viewer.
func (m *MemBackend) View(lba, n uint64, fn func(lba uint64, data []byte)) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if n > 1<<24 {
		return errMemTooLarge
	}
	lo, _, err := m.span(lba, n)
	if err != nil {
		return err
	}
	bs := uint64(1) << m.shift
	for i := range n {
		fn(lba+i, m.data[lo+i*bs:lo+(i+1)*bs])
	}
	return nil
}
