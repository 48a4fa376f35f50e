package store

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
)

// MemArea is an in-memory data area that can crash: it keeps what was
// synced apart from what was written since, and CrashClone returns the area
// a power loss could leave (pebble's vfs.NewCrashableMem does the same for
// pebble's files; a crash test clones both at the same instant). Writes are
// torn at Unit granularity: each Unit-sized piece of an unsynced write
// survives or not on its own, as on a device whose power-fail atomic unit
// is Unit. For tests; safe for concurrent use.
type MemArea struct {
	mu          sync.Mutex
	align, unit int
	cur         []byte  // what reads see
	durable     []byte  // what survives any crash
	pending     []memOp // writes and zeroes since the last Sync, in order
	unzeroed    bool    // made by NewUnzeroedMemArea: holds a pattern, as a used device does
	// Fault, if set, is called before every operation ("read", "write",
	// "zero", "sync") and its error returned instead of doing it.
	Fault func(op string, off int64) error
}

type memOp struct {
	off  int64
	data []byte // nil: zero n bytes
	n    int64
}

// NewMemArea returns a zeroed area of size bytes with the given alignment
// and power-fail atomic unit (both powers of two, unit a multiple of
// align).
func NewMemArea(size int64, align, unit int) *MemArea {
	return &MemArea{align: align, unit: unit, cur: make([]byte, size), durable: make([]byte, size)}
}

// NewUnzeroedMemArea returns an area of size bytes that holds, durably, a
// pseudo-random pattern from seed (as a block device holds what its
// previous owner wrote) and says so (Unzeroed): a store created on it
// zeroes each cluster before it first hands it out. Growth reads zeros.
func NewUnzeroedMemArea(size int64, align, unit int, seed uint64) *MemArea {
	m := NewMemArea(size, align, unit)
	r := rand.New(rand.NewPCG(seed, 0x0ff))
	for i := 0; i+8 <= len(m.durable); i += 8 {
		binary.LittleEndian.PutUint64(m.durable[i:], r.Uint64()|1) // never a whole zero word
	}
	copy(m.cur, m.durable)
	m.unzeroed = true
	return m
}

// Unzeroed says whether the area was made by NewUnzeroedMemArea.
func (m *MemArea) Unzeroed() bool { return m.unzeroed }

func (m *MemArea) check(op string, off int64, n int) error {
	if off < 0 || int64(n) > int64(len(m.cur))-off {
		return fmt.Errorf("mem area: %s of %d bytes at %d: past the end (%d)", op, n, off, len(m.cur))
	}
	if off%int64(m.align) != 0 || n%m.align != 0 {
		return fmt.Errorf("mem area: %s of %d bytes at %d: not aligned to %d", op, n, off, m.align)
	}
	if m.Fault != nil {
		return m.Fault(op, off)
	}
	return nil
}

func (m *MemArea) ReadAt(p []byte, off int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check("read", off, len(p)); err != nil {
		return err
	}
	copy(p, m.cur[off:])
	return nil
}

func (m *MemArea) WriteAt(p []byte, off int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check("write", off, len(p)); err != nil {
		return err
	}
	copy(m.cur[off:], p)
	m.pending = append(m.pending, memOp{off: off, data: append([]byte(nil), p...), n: int64(len(p))})
	return nil
}

func (m *MemArea) Zero(off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check("zero", off, int(n)); err != nil {
		return err
	}
	clear(m.cur[off : off+n])
	m.pending = append(m.pending, memOp{off: off, n: n})
	return nil
}

func (m *MemArea) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fault != nil {
		if err := m.Fault("sync", 0); err != nil {
			return err
		}
	}
	for _, o := range m.pending {
		o.apply(m.durable, 0, o.n)
	}
	m.pending = m.pending[:0]
	return nil
}

// apply writes bytes [from, to) of o into dst.
func (o memOp) apply(dst []byte, from, to int64) {
	if o.data == nil {
		clear(dst[o.off+from : o.off+to])
	} else {
		copy(dst[o.off+from:o.off+to], o.data[from:to])
	}
}

func (m *MemArea) Size() int64  { return int64(len(m.cur)) }
func (m *MemArea) Align() int   { return m.align }
func (m *MemArea) Close() error { return nil }

// CrashClone returns the area as a power loss now could leave it: what was
// synced, plus each Unit of each later write or zero kept with probability
// keepPercent/100 (in order, so a kept later write wins over an earlier
// one). The clone has no pending writes; m goes on unchanged.
func (m *MemArea) CrashClone(rng *rand.Rand, keepPercent int) *MemArea {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := &MemArea{align: m.align, unit: m.unit, durable: append([]byte(nil), m.durable...), unzeroed: m.unzeroed}
	u := int64(m.unit)
	for _, o := range m.pending {
		for from := int64(0); from < o.n; {
			// the unit containing absolute offset o.off+from
			to := min(o.n, (o.off+from)/u*u+u-o.off)
			if rng.IntN(100) < keepPercent {
				o.apply(c.durable, from, to)
			}
			from = to
		}
	}
	c.cur = append([]byte(nil), c.durable...)
	return c
}

// Grow extends the area with zeros, durably (as fallocate and fsync).
func (m *MemArea) Grow(size int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fault != nil {
		if err := m.Fault("grow", size); err != nil {
			return err
		}
	}
	if size > int64(len(m.cur)) {
		m.cur = append(m.cur, make([]byte, size-int64(len(m.cur)))...)
		m.durable = append(m.durable, make([]byte, size-int64(len(m.durable)))...)
	}
	return nil
}

// Pending returns how many writes and zeroes are not yet synced.
func (m *MemArea) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pending)
}
