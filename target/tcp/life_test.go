package tcp_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target/tcp"
)

// TestDisconnectByCore: closing the admin queue's socket tears the
// controller down; the core disconnects its I/O queue, whose connection
// the target then closes.
func TestDisconnectByCore(t *testing.T) {
	tt := newTestTarget(t, tcp.Config{})
	admin, cntlid := tt.adminUp(t, nvme.TCPDigests{})
	io := tt.ioUp(t, cntlid, 1, 15, 0, nvme.TCPDigests{})
	if res := io.mustExchange(rw(nvme.IOWrite, 1, 0, 1), pattern(4096, 1), nil, nil); res.rsp.Status != 0 {
		t.Fatal(res.rsp.Status)
	}
	admin.nc.Close()
	io.expectClose()
	waitConns(t, tt, 0)
}

func waitConns(t *testing.T, tt *testTarget, n uint64) {
	t.Helper()
	waitStat(t, tt, "connections", func(s tcp.Stats) uint64 { return s.Connections }, n)
}

// waitStat waits up to 5 s for the counter get reads from the port's
// Stats to be n.
func waitStat(t *testing.T, tt *testTarget, what string, get func(tcp.Stats) uint64, n uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for get(tt.port.Stats()) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d %s, want %d", get(tt.port.Stats()), what, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPortClose: Close with connections that have commands in flight
// (writes waiting for their data) returns once every connection is gone,
// and the hosts see their connections end.
func TestPortClose(t *testing.T) {
	tt := newTestTarget(t, tcp.Config{})
	_, cntlid := tt.adminUp(t, nvme.TCPDigests{})
	io := tt.ioUp(t, cntlid, 1, 7, 0, nvme.TCPDigests{})
	r2tFor(t, io, 8192)
	done := make(chan error, 1)
	go func() { done <- tt.port.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Port.Close did not return")
	}
	io.expectClose()
	if st := tt.port.Stats(); st.Connections != 0 {
		t.Fatalf("%d connections after Close", st.Connections)
	}
}

// TestBufferWaits: with one data buffer of each size per poll group,
// commands wait for buffers in order (in-capsule data holds its
// connection's input back meanwhile) and all complete with the right data.
func TestBufferWaits(t *testing.T) {
	tt := newTestTarget(t, tcp.Config{Cores: 1, SmallBuffers: 1, LargeBuffers: 1, CapsuleBuffers: 1})
	for _, tc := range []struct {
		name string
		size int
	}{{"4KiB", 4096}, {"8KiB-in-capsule", 8192}, {"128KiB-r2t", 128 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			const depth = 8
			blocks := uint64(tc.size / testBlock)
			w := dialBench(t, tt.addr, true, tc.size, depth)
			r := dialBench(t, tt.addr, false, tc.size, depth)
			r.keep = true
			for _, h := range []*benchHost{w, r} {
				done := make(chan error, depth)
				h.done = func(slot int, err error) { done <- err }
				for slot := 0; slot < depth; slot++ {
					if err := h.submit(slot, uint64(slot)*blocks); err != nil {
						t.Fatal(err)
					}
				}
				for range depth {
					if err := <-done; err != nil {
						t.Fatal(err)
					}
				}
			}
			for slot := 0; slot < depth; slot++ {
				if !bytes.Equal(r.slots[slot].buf, w.slots[slot].buf) {
					t.Fatalf("slot %d reads back other data", slot)
				}
			}
		})
	}
	if st := tt.port.Stats(); st.DataWaits == 0 {
		t.Fatalf("no command waited for a buffer: %+v", st)
	}
}

// TestNoBufferDeadlock: a write awaiting its H2CData holds the only large
// buffer while an 8 KiB in-capsule write arrives before that data on the
// same connection. In-capsule data has buffers of its own, so the input
// moves on, the H2CData is read and both writes complete.
func TestNoBufferDeadlock(t *testing.T) {
	tt := newTestTarget(t, tcp.Config{Cores: 1, LargeBuffers: 1, CapsuleBuffers: 1})
	_, cntlid := tt.adminUp(t, nvme.TCPDigests{})
	h := tt.ioUp(t, cntlid, 1, 7, 0, nvme.TCPDigests{})
	d := r2tFor(t, h, 128<<10)
	if err := h.write(capsuleWith(h, rw(nvme.IOWrite, 1, 64, 2), nvme.InCapsuleSGL(0, 8192), pattern(8192, 3))); err != nil {
		t.Fatal(err)
	}
	if err := h.write(h.h2cPDU(d.CCCID, d.TTag, 0, pattern(128<<10, 4), true)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		hdr, b, err := h.readPDU()
		if err != nil || hdr.Type != nvme.TCPCapsuleResp {
			t.Fatalf("response %d: type %#x, %v", i, hdr.Type, err)
		}
		var rsp nvme.Completion
		_ = rsp.Unmarshal(b[nvme.TCPCommonHeaderSize:])
		if rsp.Status != 0 {
			t.Fatalf("write %d: %v", rsp.CID, rsp.Status)
		}
	}
}
