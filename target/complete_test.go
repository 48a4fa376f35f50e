package target_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// relay is a backend that serves each IO by submitting an IO of its own
// (IO.SetComplete, IO.Inherit) to an inner backend and completing the
// host's from that IO's completion: the shape of a replicating backend's
// local leg.
type relay struct {
	inner target.AsyncBackend
	child target.IO // one at a time: the test's queue runs one command
	host  *target.IO
	calls int
}

func newRelay(inner target.AsyncBackend) *relay {
	r := &relay{inner: inner}
	r.child.SetComplete(func(io *target.IO, err error) {
		if io != &r.child {
			panic("SetComplete called with another IO")
		}
		r.calls++
		h := r.host
		r.host = nil
		h.Done(err)
	})
	return r
}

func (r *relay) Geometry() (target.Geometry, error) { return r.inner.Geometry() }
func (r *relay) Blocking() bool                     { return r.inner.Blocking() }
func (r *relay) NewWriteGroup() target.WriteGroup   { return nil }

func (r *relay) Submit(io *target.IO) {
	r.host = io
	c := &r.child
	c.Op, c.LBA, c.Blocks, c.Data, c.FUA = io.Op, io.LBA, io.Blocks, io.Data, io.FUA
	c.Inherit(io)
	r.inner.Submit(c)
}

// TestSetComplete: an IO of no request, given SetComplete, is completed
// into its owner's function by an inner backend that completes inline
// (Inline) or later from its own goroutines (DelayedBackend), errors
// included; the core's command through such a relay gets the inner
// backend's data and status.
func TestSetComplete(t *testing.T) {
	mem, _ := target.NewMemBackend(4096, 64)
	d, err := target.NewDelayedBackend(target.DelayedConfig{BlockSize: 4096, Blocks: 64, Seed: 3, MaxDelay: 100 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for name, inner := range map[string]target.AsyncBackend{"inline": target.Inline(mem), "delayed": d} {
		t.Run(name, func(t *testing.T) {
			done := make(chan error, 2)
			var io target.IO
			io.SetComplete(func(_ *target.IO, err error) { done <- err })
			w := bytes.Repeat([]byte{0x5a}, 4096)
			io.Op, io.LBA, io.Blocks, io.Data = target.OpWrite, 3, 1, w
			inner.Submit(&io)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4096)
			io.Op, io.Data = target.OpRead, got
			inner.Submit(&io)
			if err := <-done; err != nil || !bytes.Equal(got, w) {
				t.Fatalf("read back: %v", err)
			}
			io.LBA = 64 // past the end
			inner.Submit(&io)
			var se target.StatusError
			if err := <-done; !errors.As(err, &se) || se.NVMeStatus() != nvme.StatusLBAOutOfRange.WithDNR() {
				t.Fatalf("read past the end: %v", err)
			}
			if len(done) != 0 {
				t.Fatal("completed twice")
			}

			r := newRelay(inner)
			h, _, ioq, _ := asyncHarness(t, r)
			w2 := bytes.Repeat([]byte{0xc3}, 2*4096)
			mustOK(t, h.exec(ioq, ioCmd(nvme.IOWrite, 1, 8, 2, nvme.RWFUA), w2), "write through the relay")
			c := h.exec(ioq, ioCmd(nvme.IORead, 1, 8, 2, 0), make([]byte, 2*4096))
			mustOK(t, c, "read through the relay")
			if !bytes.Equal(c.data, w2) {
				t.Fatal("read through the relay differs")
			}
			mustOK(t, h.exec(ioq, ioCmd(nvme.IOFlush, 1, 0, 0, 0), nil), "flush through the relay")
			if s := h.exec(ioq, ioCmd(nvme.IOWriteZeroes, 1, 60, 8, 0), nil).status(); s != nvme.StatusLBAOutOfRange.WithDNR() {
				t.Fatalf("write zeroes past the end: %s", fmtStatus(s))
			}
			if r.calls != 3 {
				t.Fatalf("relay completed %d IOs, want 3", r.calls)
			}
		})
	}
}

// asyncHarness is harness.live with namespace 1 on b.
func asyncHarness(t *testing.T, b target.AsyncBackend) (*harness, *tq, *tq, any) {
	t.Helper()
	h := newHarness(t)
	_, admin, io, x := h.serve(target.NamespaceConfig{NSID: 1, Async: b})
	return h, admin, io, x
}
