package transporttest

import (
	"bytes"
	"errors"
	"math"

	"github.com/blk-project/blk/transport"
)

// allocate allocates n bytes of provider-owned memory on pd and closes the
// region when the subtest ends.
func (t *T) allocate(pd transport.PD, n int, acc transport.Access) transport.MemoryRegion {
	t.Helper()
	mr, err := pd.AllocateMemory(n, acc)
	if err != nil {
		t.Fatalf("AllocateMemory(%d bytes, access %#x): %v", n, acc, err)
	}
	t.Cleanup(func() { mr.Close() })
	return mr
}

// AllocateMemory: provider-owned registered memory. Sizes of 0 and above
// MaxRegistrationSize are refused; the region has exactly the bytes asked
// for, zeroed, at Addr(); send, write and read move data between such
// regions on both sides; once closed, its key is refused to the peer.
func testAllocateMemory(t *T) {
	p := t.newPair(pairOpts{})
	info := p.srv.info
	if mr, err := p.srv.pd.AllocateMemory(0, allAccess); !errors.Is(err, transport.ErrInvalidParameter) {
		if mr != nil {
			mr.Close()
		}
		t.Fatalf("AllocateMemory(0): %v, want ErrInvalidParameter", err)
	}
	if info.MaxRegistrationSize < math.MaxInt {
		n := int(info.MaxRegistrationSize) + 1
		if mr, err := p.srv.pd.AllocateMemory(n, allAccess); !errors.Is(err, transport.ErrInvalidParameter) {
			if mr != nil {
				mr.Close()
			}
			t.Fatalf("AllocateMemory(MaxRegistrationSize+1 = %d): %v, want ErrInvalidParameter", n, err)
		}
	}
	// Not a multiple of a page: the region is what was asked for, not
	// what the provider rounded it to.
	const n = 3*4096 + 100
	srv := t.allocate(p.srv.pd, n, allAccess)
	b := srv.Bytes()
	if len(b) != n || srv.Addr() == 0 || srv.SGE(0, n).Addr != srv.Addr() {
		t.Fatalf("AllocateMemory(%d): len(Bytes()) %d, Addr() %#x, SGE(0, n).Addr %#x", n, len(b), srv.Addr(), srv.SGE(0, n).Addr)
	}
	if i := bytes.IndexFunc(b, func(r rune) bool { return r != 0 }); i >= 0 {
		t.Fatalf("AllocateMemory(%d): not zeroed (byte %d is %#x)", n, i, b[i])
	}
	t.fill(b)

	// Read: the client's allocated sink from the server's region.
	sink := t.allocate(p.cli.pd, n, allAccess)
	c := t.readVia(p, sink, srv.Addr(), srv.RKey(), n, "read")
	t.checkOK([]transport.Completion{c}, transport.OpRead, p.cli.tag, "read between allocated regions")
	if !bytes.Equal(sink.Bytes(), b) {
		t.Fatalf("read between allocated regions: %s", firstDiff(sink.Bytes(), b))
	}

	// Write, then a send as a fence that also checks send/receive.
	src := t.allocate(p.cli.pd, n, allAccess)
	t.fill(src.Bytes())
	const off, m = 1000, 5000
	if err := p.cli.qp.Write("write", []transport.SGE{src.SGE(0, m)}, srv.Addr()+off, srv.RKey(), 0); err != nil {
		t.Fatalf("Write: %v", err)
	}
	rcv := t.allocate(p.srv.pd, 64, transport.AccessLocalWrite)
	if err := p.srv.qp.PostReceive("recv", []transport.SGE{rcv.SGE(0, 64)}); err != nil {
		t.Fatalf("PostReceive: %v", err)
	}
	if err := p.cli.qp.Send("send", []transport.SGE{src.SGE(m, 64)}, 0); err != nil {
		t.Fatalf("Send: %v", err)
	}
	got := t.waitN(p.cli.icq, 2, "write and send")
	t.checkOK(got[:1], transport.OpWrite, p.cli.tag, "write between allocated regions")
	t.checkOK(got[1:], transport.OpSend, p.cli.tag, "send between allocated regions")
	r := t.waitN(p.srv.rcq, 1, "receive")[0]
	t.checkOK([]transport.Completion{r}, transport.OpReceive, p.srv.tag, "receive into an allocated region")
	if r.Bytes != 64 || !bytes.Equal(rcv.Bytes(), src.Bytes()[m:m+64]) {
		t.Fatalf("send between allocated regions: %d bytes, %s", r.Bytes, firstDiff(rcv.Bytes(), src.Bytes()[m:m+64]))
	}
	if !bytes.Equal(b[off:off+m], src.Bytes()[:m]) {
		t.Fatalf("write between allocated regions: %s", firstDiff(b[off:off+m], src.Bytes()[:m]))
	}

	// Closed: the key is gone (the memory too; the suite never touches
	// b again).
	addr, key := srv.Addr(), srv.RKey()
	if err := srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	t.expectRefused(p, sink, addr, key, "key of a closed allocated region")
}
