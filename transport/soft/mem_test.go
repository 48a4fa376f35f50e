package soft

import (
	"errors"
	"os"
	"testing"

	"github.com/blk-project/blk/transport"
)

// TestAllocateMemoryUnmapAfterLastPin: closing a provider-owned region
// while a transfer holds it (a pin) refuses its key at once but unmaps
// only when the transfer lets go; without a pin, Close unmaps at once.
func TestAllocateMemoryUnmapAfterLastPin(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	tp, _ := a.CreatePD()
	p := tp.(*pd)
	defer p.Close()

	tr, err := p.AllocateMemory(10000, transport.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	m := tr.(*mr)
	pg := os.Getpagesize()
	if want := (10000 + pg - 1) / pg * pg; len(m.mapping) != want || len(m.Bytes()) != 10000 {
		t.Fatalf("mapping %d bytes, region %d: want %d and 10000", len(m.mapping), len(m.Bytes()), want)
	}
	sge := m.SGE(0, 100)
	b, pinned, f := p.pin(sge.LKey, sge.Addr, sge.Length, transport.AccessLocalWrite)
	if f != faultNone || pinned != m || len(b) != 100 {
		t.Fatalf("pin: fault %v, region %p (want %p), %d bytes", f, pinned, m, len(b))
	}
	m.Close()
	if _, f := p.resolve(sge.LKey, sge.Addr, sge.Length, 0); f != faultInvalidSTag {
		t.Fatalf("resolve after Close: fault %v, want invalid STag", f)
	}
	if m.mapping == nil {
		t.Fatal("unmapped while pinned")
	}
	b[99] = 1 // still mapped: must not fault
	pinned.unpin()
	if m.mapping != nil {
		t.Fatal("still mapped after the last pin")
	}

	tr, err = p.AllocateMemory(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
	if tr.(*mr).mapping != nil || tr.Bytes() != nil {
		t.Fatal("an unpinned region is still mapped after Close")
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := p.AllocateMemory(1, transport.AccessMWBind); !errors.Is(err, transport.ErrNotSupported) {
		t.Fatalf("AllocateMemory with AccessMWBind: %v, want ErrNotSupported", err)
	}

	// A fast-registered binding in provider-owned memory keeps it mapped
	// until the binding ends, and transfers through it pin the owner.
	tr, _ = p.AllocateMemory(8192, transport.AccessLocalWrite)
	owner := tr.(*mr)
	tf, err := p.AllocateMR(4096)
	if err != nil {
		t.Fatal(err)
	}
	fr := tf.(*mr)
	fr.fastRegister(fr.nextKey(), owner.Bytes()[100:4100], transport.AccessLocalWrite)
	fsge := fr.SGE(0, 10)
	if _, pinned, _ := p.pin(fsge.LKey, fsge.Addr, fsge.Length, 0); pinned != owner {
		t.Fatalf("a transfer through a fast-registered binding in owned memory pinned %p, want the owner %p", pinned, owner)
	} else {
		pinned.unpin()
	}
	owner.Close()
	if owner.mapping == nil {
		t.Fatal("owned memory unmapped under a fast-registered binding")
	}
	fr.invalidateAny()
	if owner.mapping != nil {
		t.Fatal("owned memory still mapped after its binding was invalidated")
	}
	fr.Close()

	// Registered (caller-owned) memory is never pinned.
	tr, _ = p.RegisterMemory(make([]byte, 64), 0)
	sge = tr.SGE(0, 64)
	if _, pinned, _ := p.pin(sge.LKey, sge.Addr, sge.Length, 0); pinned != nil {
		t.Fatal("caller-owned memory pinned")
	}
	tr.Close()
}
