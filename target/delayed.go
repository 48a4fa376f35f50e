package target

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/nvme"
)

// DelayedBackend is an AsyncBackend for tests and for bindings' test
// suites: it serves IOs from a MemBackend on goroutines of its own, each
// after a random delay drawn from a seeded generator and in a random
// order among those waiting — completions arrive late, out of order and
// from a goroutine that is not the submitter's, as a disk's do. It is
// not Blocking (Flush and FUA are submitted from the poll group) and has
// no write groups (each plain write is its own IO).
//
// It checks what it can of the contract: a write's data must not change
// between Submit and Done (a binding that reused the buffer of a request
// still at the backend would change it; counted in Corrupt and failed
// with an Internal Error), and Flush keeps the MemBackend's durable copy
// (Durable) — writes completed before the Flush was submitted.
//
// Nothing is allocated per IO: Submit sends a value on a buffered
// channel; the workers keep their waiting IOs in preallocated slices.
type DelayedBackend struct {
	mem      *MemBackend
	durable  *MemBackend
	maxDelay time.Duration
	ch       chan delayedIO
	wg       sync.WaitGroup
	closed   atomic.Bool

	// dmu orders Flush against completing writes: a write is copied to
	// the durable image at its Flush only if it completed before.
	dmu       sync.Mutex
	completed []delayedWrite // completed writes not yet flushed (in order)

	ios, corrupt atomic.Uint64

	// gate holds the workers while paused (Pause, Resume).
	gmu    sync.Mutex
	gcond  *sync.Cond
	paused bool
}

type delayedIO struct {
	io  *IO
	sum uint32 // OpWrite: the data's CRC at Submit
}

type delayedWrite struct {
	lba, n uint64
	zero   bool
	data   []byte // a copy, for the durable image (owned)
}

// DelayedConfig configures NewDelayedBackend.
type DelayedConfig struct {
	// BlockSize and Blocks are the MemBackend's.
	BlockSize uint32
	Blocks    uint64
	// Seed seeds the delays and the order.
	Seed uint64
	// MaxDelay bounds one IO's delay (0: 200 µs). A quarter of the IOs
	// are served without one, so that some complete inline-fast.
	MaxDelay time.Duration
	// Workers is the goroutines serving IOs (0: 2).
	Workers int
	// Depth is the IOs that may wait at once (0: 4096); more block Submit.
	Depth int
	// TrackDurable keeps a durable image (Durable) updated at each Flush.
	// It copies every write: not for steady-state allocation tests.
	TrackDurable bool
}

// NewDelayedBackend returns a zeroed DelayedBackend; Close stops it.
func NewDelayedBackend(c DelayedConfig) (*DelayedBackend, error) {
	mem, err := NewMemBackend(c.BlockSize, c.Blocks)
	if err != nil {
		return nil, err
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = 200 * time.Microsecond
	}
	if c.Workers <= 0 {
		c.Workers = 2
	}
	if c.Depth <= 0 {
		c.Depth = 4096
	}
	d := &DelayedBackend{mem: mem, maxDelay: c.MaxDelay, ch: make(chan delayedIO, c.Depth)}
	d.gcond = sync.NewCond(&d.gmu)
	if c.TrackDurable {
		if d.durable, err = NewMemBackend(c.BlockSize, c.Blocks); err != nil {
			return nil, err
		}
	}
	d.wg.Add(c.Workers)
	for i := range c.Workers {
		go d.work(rand.New(rand.NewPCG(c.Seed, uint64(i))), c.Depth)
	}
	return d, nil
}

// Mem returns the backend's current contents.
func (d *DelayedBackend) Mem() *MemBackend { return d.mem }

// Durable returns the image of what the completed Flushes made durable
// (nil without TrackDurable).
func (d *DelayedBackend) Durable() *MemBackend { return d.durable }

// IOs is the number of IOs completed; Corrupt those whose write data
// changed while at the backend.
func (d *DelayedBackend) IOs() uint64     { return d.ios.Load() }
func (d *DelayedBackend) Corrupt() uint64 { return d.corrupt.Load() }

// CheckFlushed fails unless, after a Flush the host saw complete, the
// durable image is want (every acknowledged write) and no write's data
// changed while it was at the backend.
func (d *DelayedBackend) CheckFlushed(want []byte) error {
	durable := make([]byte, len(want))
	if err := d.durable.Read(0, durable); err != nil {
		return err
	}
	if !bytes.Equal(durable, want) {
		return errors.New("after a Flush, the durable image lacks acknowledged writes")
	}
	if n := d.Corrupt(); n != 0 {
		return fmt.Errorf("%d writes changed while at the backend", n)
	}
	return nil
}

// Pause holds every IO at the backend (submitted, not completed) until
// Resume: a test can then act while they are there.
func (d *DelayedBackend) Pause() {
	d.gmu.Lock()
	d.paused = true
	d.gmu.Unlock()
}

// Resume lets the IOs held by Pause complete.
func (d *DelayedBackend) Resume() {
	d.gmu.Lock()
	d.paused = false
	d.gmu.Unlock()
	d.gcond.Broadcast()
}

// Close completes what is waiting and stops the workers. No Submit may
// follow.
func (d *DelayedBackend) Close() {
	if d.closed.CompareAndSwap(false, true) {
		d.Resume()
		close(d.ch)
		d.wg.Wait()
	}
}

// Geometry implements AsyncBackend.
func (d *DelayedBackend) Geometry() (Geometry, error) { return d.mem.Geometry() }

// Blocking implements AsyncBackend: no IO waits in Submit.
func (d *DelayedBackend) Blocking() bool { return false }

// NewWriteGroup implements AsyncBackend: none.
func (d *DelayedBackend) NewWriteGroup() WriteGroup { return nil }

// Submit implements AsyncBackend.
func (d *DelayedBackend) Submit(io *IO) {
	e := delayedIO{io: io}
	if io.Op == OpWrite {
		e.sum = crc32.ChecksumIEEE(io.Data)
	}
	d.ch <- e
}

var errDelayedCorrupt = WithStatus(errors.New("target: delayed backend: write data changed at the backend"),
	nvme.StatusInternalError.WithDNR())

// work serves IOs: it takes what has arrived, then completes one at a
// random index after a random delay, until none waits.
func (d *DelayedBackend) work(rng *rand.Rand, depth int) {
	defer d.wg.Done()
	wait := make([]delayedIO, 0, depth)
	open := true
	for open || len(wait) > 0 {
		if len(wait) == 0 {
			e, ok := <-d.ch
			if !ok {
				return
			}
			wait = append(wait, e)
		}
	more:
		for len(wait) < cap(wait) {
			select {
			case e, ok := <-d.ch:
				if !ok {
					open = false
					break more
				}
				wait = append(wait, e)
			default:
				break more
			}
		}
		if rng.IntN(4) != 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(d.maxDelay))))
		}
		d.gmu.Lock()
		for d.paused {
			d.gcond.Wait()
		}
		d.gmu.Unlock()
		i := rng.IntN(len(wait))
		e := wait[i]
		wait[i] = wait[len(wait)-1]
		wait[len(wait)-1] = delayedIO{}
		wait = wait[:len(wait)-1]
		d.serve(e)
	}
}

// serve runs one IO on the MemBackend and completes it.
func (d *DelayedBackend) serve(e delayedIO) {
	io := e.io
	var err error
	switch io.Op {
	case OpRead:
		err = d.mem.Read(io.LBA, io.Data)
	case OpWrite:
		if crc32.ChecksumIEEE(io.Data) != e.sum {
			d.corrupt.Add(1)
			err = errDelayedCorrupt
			break
		}
		err = d.mem.Write(io.LBA, io.Data, io.FUA)
		if err == nil {
			d.track(delayedWrite{lba: io.LBA, n: io.Blocks, data: io.Data}, io.FUA)
		}
	case OpWriteZeroes, OpDeallocate:
		if io.Op == OpWriteZeroes {
			err = d.mem.WriteZeroes(io.LBA, io.Blocks, io.FUA)
		} else {
			err = d.mem.Deallocate(io.LBA, io.Blocks)
		}
		if err == nil {
			d.track(delayedWrite{lba: io.LBA, n: io.Blocks, zero: true}, io.FUA)
		}
	case OpFlush:
		d.flush()
	default:
		err = fmt.Errorf("target: delayed backend: operation %d: %w", io.Op, ErrInvalid)
	}
	d.ios.Add(1)
	io.Done(err)
}

// track records a completed write for the durable image: at once with
// FUA, at the next Flush otherwise. Its data is copied (the buffer is the
// binding's once Done is called).
func (d *DelayedBackend) track(w delayedWrite, fua bool) {
	if d.durable == nil {
		return
	}
	if w.data != nil {
		w.data = append([]byte(nil), w.data...)
	}
	d.dmu.Lock()
	defer d.dmu.Unlock()
	if fua {
		d.apply(w) // and kept, so a Flush replays the writes in order
	}
	d.completed = append(d.completed, w)
}

// flush makes every write completed so far durable: the writes completed
// before the Flush was submitted are among them.
func (d *DelayedBackend) flush() {
	if d.durable == nil {
		return
	}
	d.dmu.Lock()
	defer d.dmu.Unlock()
	for _, w := range d.completed {
		d.apply(w)
	}
	clear(d.completed)
	d.completed = d.completed[:0]
}

// apply copies a write to the durable image. Requires dmu.
func (d *DelayedBackend) apply(w delayedWrite) {
	if w.zero {
		_ = d.durable.WriteZeroes(w.lba, w.n, false)
	} else {
		_ = d.durable.Write(w.lba, w.data, false)
	}
}
