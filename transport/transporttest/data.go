package transporttest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/blk-project/blk/transport"
)

// maxMessage is the largest message the integrity tests move: several
// hundred KiB, within the adapter's MaxTransferLength.
func maxMessage(info transport.AdapterInfo) int {
	return int(min(512<<10, info.MaxTransferLength))
}

// sizes returns n message sizes: the edges (1 byte, around a page, around
// 64 KiB, the maximum) and random ones in between.
func (t *T) sizes(n, limit int) []int {
	var out []int
	for _, s := range []int{1, 3, 4, 63, 64, 65, 4095, 4096, 4097, 65535, 65536, 65537, limit} {
		if s <= limit {
			out = append(out, s)
		}
	}
	for len(out) < n {
		out = append(out, t.randSize(limit))
	}
	t.rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out[:n]
}

// scatter returns SGEs covering mr's bytes [off, off+n) in at most k
// pieces, listed in a random order, so that gather and scatter really
// follow the SGE list and not the memory layout.
func (t *T) scatter(mr transport.MemoryRegion, off, n uint32, k int) []transport.SGE {
	s := t.split(mr, off, n, k)
	t.rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s
}

// gather concatenates the bytes the SGEs name in mr, in list order.
func gather(mr transport.MemoryRegion, sges []transport.SGE) []byte {
	var out []byte
	for _, s := range sges {
		off := s.Addr - mr.Addr()
		out = append(out, mr.Bytes()[off:off+uint64(s.Length)]...)
	}
	return out
}

// firstDiff describes where two byte slices differ.
func firstDiff(got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Sprintf("first difference at byte %d of %d: %#02x, want %#02x", i, len(got), got[i], want[i])
		}
	}
	return "equal"
}

// SendReceiveIntegrity: sends of random sizes (1 byte … several hundred
// KiB), gathered from several SGEs and scattered into several, in both
// directions, four in flight at a time, arrive in order and byte for byte;
// a receive reports the message length and leaves the rest of its buffer
// untouched.
func testSendReceiveIntegrity(t *T) {
	t.Run("two-adapters", func(t *T) { t.sendRecvIntegrity(false) })
	t.Run("loopback", func(t *T) {
		t.skipUnless(t.info().Flags&transport.FlagLoopbackConnectionsSupported != 0, "adapter lacks FlagLoopbackConnectionsSupported")
		t.sendRecvIntegrity(true)
	})
}

func (t *T) sendRecvIntegrity(loopback bool) {
	p := t.newPair(pairOpts{loopback: loopback})
	limit := maxMessage(p.cli.info)
	const window, slack = 4, 64
	slot := limit + slack
	ends := [2]*endpoint{p.cli, p.srv}
	var mrs [2]transport.MemoryRegion
	for i, e := range ends {
		mrs[i] = t.register(e.pd, window*slot, allAccess)
	}
	sizes := t.sizes(32, limit)
	for w := 0; w < len(sizes); w += window {
		from, to := (w/window)%2, 1-(w/window)%2
		src, dst := mrs[from], mrs[to]
		type msg struct {
			data   []byte
			rsges  []transport.SGE
			before []byte // the receive buffer before the message
		}
		var msgs []msg
		for i := 0; i < window && w+i < len(sizes); i++ {
			n := sizes[w+i]
			extra := t.rng.IntN(slack + 1)
			m := msg{rsges: t.scatter(dst, uint32(i*slot), uint32(n+extra), int(ends[to].cfg.MaxReceiveRequestSge))}
			m.before = gather(dst, m.rsges)
			if err := ends[to].qp.PostReceive(w+i, m.rsges); err != nil {
				t.Fatalf("PostReceive (%d bytes in %d SGEs): %v", n+extra, len(m.rsges), err)
			}
			t.fill(src.Bytes()[i*slot : i*slot+n])
			ssges := t.scatter(src, uint32(i*slot), uint32(n), int(ends[from].cfg.MaxInitiatorRequestSge))
			m.data = gather(src, ssges)
			msgs = append(msgs, m)
			if err := ends[from].qp.Send(w+i, ssges, 0); err != nil {
				t.Fatalf("Send (%d bytes in %d SGEs): %v", n, len(ssges), err)
			}
		}
		t.checkOK(t.waitN(ends[from].icq, len(msgs), "sends"), transport.OpSend, ends[from].tag, "sends")
		got := t.waitN(ends[to].rcq, len(msgs), "receives")
		t.checkOK(got, transport.OpReceive, ends[to].tag, "receives")
		for i, c := range got {
			m := msgs[i]
			if c.RequestContext != any(w+i) {
				t.Fatalf("receive %d completed as request %v: receives must complete in order", w+i, c.RequestContext)
			}
			if int(c.Bytes) != len(m.data) {
				t.Fatalf("receive of a %d-byte message reports %d bytes", len(m.data), c.Bytes)
			}
			if c.Invalidated {
				t.Fatalf("a plain send's receive reports Invalidated (key %#x)", c.InvalidatedKey)
			}
			all := gather(dst, m.rsges)
			if !bytes.Equal(all[:len(m.data)], m.data) {
				t.Fatalf("message %d (%d bytes, %d → %d SGEs): %s", w+i, len(m.data), len(m.rsges), len(m.rsges), firstDiff(all[:len(m.data)], m.data))
			}
			if !bytes.Equal(all[len(m.data):], m.before[len(m.data):]) {
				t.Fatalf("message %d (%d bytes) changed the receive buffer past its end: %s", w+i, len(m.data), firstDiff(all[len(m.data):], m.before[len(m.data):]))
			}
		}
	}
}

// WriteIntegrity: RDMA writes of random sizes from several SGEs land at
// random offsets of the peer's region byte for byte and nowhere else (the
// whole region is compared with a shadow copy after every batch).
func testWriteIntegrity(t *T) {
	p := t.newPair(pairOpts{})
	limit := maxMessage(p.cli.info)
	const batch = 4
	smr := t.register(p.srv.pd, batch*limit, allAccess)
	shadow := slices.Clone(smr.Bytes())
	cmr := t.register(p.cli.pd, batch*limit, allAccess)
	fence := t.register(p.srv.pd, 64, allAccess)
	sizes := t.sizes(40, limit)
	for b := 0; b < len(sizes); b += batch {
		for i := 0; i < batch && b+i < len(sizes); i++ {
			n := sizes[b+i]
			// Writes of one batch go to disjoint quarters: placement order
			// of overlapping writes is not defined before completion.
			dstOff := i*limit + t.rng.IntN(limit-n+1)
			t.fill(cmr.Bytes()[i*limit : i*limit+n])
			sges := t.scatter(cmr, uint32(i*limit), uint32(n), int(p.cli.cfg.MaxInitiatorRequestSge))
			copy(shadow[dstOff:], gather(cmr, sges))
			if err := p.cli.qp.Write(b+i, sges, smr.Addr()+uint64(dstOff), smr.RKey(), 0); err != nil {
				t.Fatalf("Write (%d bytes in %d SGEs at offset %d): %v", n, len(sges), dstOff, err)
			}
		}
		// A send after the writes arrives after they are placed.
		if err := p.srv.qp.PostReceive("fence", []transport.SGE{fence.SGE(0, 64)}); err != nil {
			t.Fatalf("PostReceive: %v", err)
		}
		if err := p.cli.qp.Send("fence", []transport.SGE{cmr.SGE(0, 1)}, 0); err != nil {
			t.Fatalf("Send: %v", err)
		}
		k := min(batch, len(sizes)-b)
		got := t.waitN(p.cli.icq, k+1, "writes and fence send")
		t.checkOK(got[:k], transport.OpWrite, p.cli.tag, "writes")
		t.checkOK(got[k:], transport.OpSend, p.cli.tag, "fence send")
		t.checkOK(t.waitN(p.srv.rcq, 1, "fence receive"), transport.OpReceive, p.srv.tag, "fence")
		if !bytes.Equal(smr.Bytes(), shadow) {
			t.Fatalf("after writes %d–%d (sizes %v): target region %s", b, b+k-1, sizes[b:b+k], firstDiff(smr.Bytes(), shadow))
		}
	}
}

// ReadIntegrity: RDMA reads of random sizes from random offsets of the
// peer's region land in the sink (split over as many SGEs as the adapter
// allows for reads) byte for byte.
func testReadIntegrity(t *T) {
	p := t.newPair(pairOpts{})
	limit := maxMessage(p.cli.info)
	const batch = 4
	smr := t.register(p.srv.pd, 2*limit, allAccess)
	sink := t.register(p.cli.pd, batch*limit, allAccess)
	k := int(min(p.cli.info.MaxReadRequestSge, p.cli.cfg.MaxInitiatorRequestSge))
	sizes := t.sizes(40, limit)
	for b := 0; b < len(sizes); b += batch {
		type rd struct {
			off  int
			sges []transport.SGE
		}
		var rds []rd
		for i := 0; i < batch && b+i < len(sizes); i++ {
			n := sizes[b+i]
			r := rd{off: t.rng.IntN(2*limit - n + 1), sges: t.scatter(sink, uint32(i*limit), uint32(n), k)}
			rds = append(rds, r)
			if err := p.cli.qp.Read(b+i, r.sges, smr.Addr()+uint64(r.off), smr.RKey(), 0); err != nil {
				t.Fatalf("Read (%d bytes into %d SGEs from offset %d): %v", n, len(r.sges), r.off, err)
			}
		}
		got := t.waitN(p.cli.icq, len(rds), "reads")
		t.checkOK(got, transport.OpRead, p.cli.tag, "reads")
		for i, r := range rds {
			if got[i].RequestContext != any(b+i) {
				t.Fatalf("read %d completed as %v: initiator requests complete in order", b+i, got[i].RequestContext)
			}
			data := gather(sink, r.sges)
			if want := smr.Bytes()[r.off : r.off+len(data)]; !bytes.Equal(data, want) {
				t.Fatalf("read %d (%d bytes from offset %d): %s", b+i, len(data), r.off, firstDiff(data, want))
			}
		}
	}
}

// fastRegistered is a fast-registered region on the server of a pair.
type fastRegistered struct {
	mr  transport.MemoryRegion
	buf []byte
	key uint32
}

// fastRegister allocates an MR on the server and binds a fresh buffer to
// it through the server's initiator queue.
func (t *T) fastRegister(p *pair, mr transport.MemoryRegion, size int) fastRegistered {
	t.Helper()
	fpd, fqp := t.fastRegisterOf(p.srv)
	if mr == nil {
		var err error
		mr, err = fpd.AllocateMR(uint32(size))
		if err != nil {
			t.Fatalf("AllocateMR(%d): %v", size, err)
		}
		t.Cleanup(func() { mr.Close() })
	}
	buf := make([]byte, size)
	t.fill(buf)
	key, err := fqp.FastRegister("fastreg", mr, buf, allAccess, transport.FlagAllowRemoteRead|transport.FlagAllowRemoteWrite)
	if err != nil {
		t.Fatalf("FastRegister(%d bytes): %v", size, err)
	}
	t.checkOK(t.waitN(p.srv.icq, 1, "fast-register"), transport.OpFastRegister, p.srv.tag, "fast-register")
	if mr.Addr() == 0 || len(mr.Bytes()) != size {
		t.Fatalf("after FastRegister of %d bytes: Addr() = %#x, len(Bytes()) = %d", size, mr.Addr(), len(mr.Bytes()))
	}
	return fastRegistered{mr: mr, buf: buf, key: key}
}

// frSize is the size of fast-registered buffers: a few pages, within the
// adapter's FRMRPageCount (an unaligned buffer may touch one page more).
func frSize(info transport.AdapterInfo) int {
	return int(min(16<<10, max(512, (int64(info.FRMRPageCount)-1)*4096)))
}

// readVia reads n bytes at addr through key on the client and returns the
// completion.
func (t *T) readVia(p *pair, sink transport.MemoryRegion, addr uint64, key uint32, n int, ctx any) transport.Completion {
	t.Helper()
	if err := p.cli.qp.Read(ctx, []transport.SGE{sink.SGE(0, uint32(n))}, addr, key, 0); err != nil {
		t.Fatalf("Read %v: %v", ctx, err)
	}
	return t.waitN(p.cli.icq, 1, fmt.Sprintf("read %v", ctx))[0]
}

// expectRefused checks that a read through key completes with
// ErrAccessViolation and that the connection then fails on both sides.
func (t *T) expectRefused(p *pair, sink transport.MemoryRegion, addr uint64, key uint32, what string) {
	t.Helper()
	c := t.readVia(p, sink, addr, key, 64, "refused-read")
	t.waitDone(p.cli.qp, what+": client after the refused read")
	t.waitDone(p.srv.qp, what+": server after the refused read")
	t.checkRemoteRefusal(p, c, false, fmt.Sprintf("%s: read through key %#x", what, key))
}

// checkRemoteRefusal checks the outcome of an RDMA read or write (its
// completion c, on p's client) that p's server refused, once both QPs are
// done. With FlagRemoteErrorsReported the initiator learns why: the
// request fails with ErrAccessViolation, or (a write, which iWARP does not
// acknowledge) completes and the QP fails with it. Without the flag the
// request may also be flushed (ErrCancelled) and both QPs end with
// whatever error the device reports first (siw: an access error, a fatal
// QP error or the disconnect); what still holds is that the access is
// refused (the callers check the memory) and the connection ends on both
// sides.
func (t *T) checkRemoteRefusal(p *pair, c transport.Completion, write bool, what string) {
	t.Helper()
	cliErr, srvErr := p.cli.qp.Err(), p.srv.qp.Err()
	if cliErr == nil || srvErr == nil {
		t.Fatalf("%s: connection not in error: initiator %v, target %v", what, cliErr, srvErr)
	}
	if p.cli.info.Flags&transport.FlagRemoteErrorsReported != 0 {
		switch {
		case errors.Is(c.Status, transport.ErrAccessViolation):
		case write && c.Status == nil && errors.Is(cliErr, transport.ErrAccessViolation):
			t.Logf("%s: write completed before the peer's Terminate; QP error: %v", what, cliErr)
		default:
			t.Fatalf("%s: completed with %v (QP error %v), want ErrAccessViolation", what, c.Status, cliErr)
		}
		return
	}
	switch {
	case errors.Is(c.Status, transport.ErrAccessViolation), errors.Is(c.Status, transport.ErrCancelled),
		errors.Is(c.Status, transport.ErrDisconnected), write && c.Status == nil:
	default:
		t.Fatalf("%s on an adapter without FlagRemoteErrorsReported: completed with %v, want ErrAccessViolation or ErrCancelled (or a completed write)", what, c.Status)
	}
	t.Logf("%s: adapter without FlagRemoteErrorsReported: request %v, initiator QP %v, refusing peer %v", what, c.Status, cliErr, srvErr)
}

// SendInvalidate: a send-with-invalidate names a fast-registered key of the
// peer; the peer's receive reports Invalidated with that key and the data,
// and the key is refused afterwards.
func testSendInvalidate(t *T) {
	p := t.newPair(pairOpts{})
	fr := t.fastRegister(p, nil, frSize(p.srv.info))
	sink := t.register(p.cli.pd, 4096, allAccess)
	c := t.readVia(p, sink, fr.mr.Addr(), fr.key, 256, "read-before")
	t.checkOK([]transport.Completion{c}, transport.OpRead, p.cli.tag, "read through the fast-registered key")
	if !bytes.Equal(sink.Bytes()[:256], fr.buf[:256]) {
		t.Fatalf("read through the fast-registered key: %s", firstDiff(sink.Bytes()[:256], fr.buf[:256]))
	}
	rmr := t.register(p.srv.pd, 256, allAccess)
	if err := p.srv.qp.PostReceive("recv", []transport.SGE{rmr.SGE(0, 256)}); err != nil {
		t.Fatalf("PostReceive: %v", err)
	}
	src := t.register(p.cli.pd, 100, allAccess)
	if err := p.cli.qp.SendInvalidate("si", []transport.SGE{src.SGE(0, 100)}, fr.key, 0); err != nil {
		t.Fatalf("SendInvalidate: %v", err)
	}
	t.checkOK(t.waitN(p.cli.icq, 1, "send-with-invalidate"), transport.OpSend, p.cli.tag, "send-with-invalidate")
	got := t.waitN(p.srv.rcq, 1, "receive of a send-with-invalidate")[0]
	t.checkOK([]transport.Completion{got}, transport.OpReceive, p.srv.tag, "receive")
	if !got.Invalidated || got.InvalidatedKey != fr.key {
		t.Fatalf("receive of a send-with-invalidate: Invalidated %v key %#x, want true and %#x", got.Invalidated, got.InvalidatedKey, fr.key)
	}
	if got.Bytes != 100 || !bytes.Equal(rmr.Bytes()[:100], src.Bytes()) {
		t.Fatalf("send-with-invalidate payload: %d bytes, %s", got.Bytes, firstDiff(rmr.Bytes()[:100], src.Bytes()))
	}
	t.expectRefused(p, sink, fr.mr.Addr(), fr.key, "key invalidated by send-with-invalidate")
}

// FastRegisterAndInvalidate: the peer writes and reads through a
// fast-registered key; after a local invalidate (and re-registration,
// which yields a new key) or a send-with-invalidate, the old key is
// refused.
func testFastRegisterAndInvalidate(t *T) {
	setup := func(t *T) (*pair, fastRegistered, transport.MemoryRegion) {
		p := t.newPair(pairOpts{})
		fr := t.fastRegister(p, nil, frSize(p.srv.info))
		sink := t.register(p.cli.pd, len(fr.buf), allAccess)
		t.writeReadVia(p, fr, sink)
		return p, fr, sink
	}
	t.Run("local-invalidate", func(t *T) {
		p, fr, sink := setup(t)
		_, fqp := t.fastRegisterOf(p.srv)
		if err := fqp.Invalidate("inv", fr.mr, 0); err != nil {
			t.Fatalf("Invalidate: %v", err)
		}
		t.checkOK(t.waitN(p.srv.icq, 1, "invalidate"), transport.OpInvalidate, p.srv.tag, "invalidate")
		fr2 := t.fastRegister(p, fr.mr, len(fr.buf))
		if fr2.key == fr.key {
			t.Fatalf("re-registration after invalidate returned the old key %#x: the old key could not be refused", fr.key)
		}
		t.writeReadVia(p, fr2, sink)
		t.expectRefused(p, sink, fr.mr.Addr(), fr.key, "key invalidated locally")
	})
	t.Run("send-invalidate", func(t *T) {
		p, fr, sink := setup(t)
		rmr := t.register(p.srv.pd, 64, allAccess)
		if err := p.srv.qp.PostReceive("recv", []transport.SGE{rmr.SGE(0, 64)}); err != nil {
			t.Fatalf("PostReceive: %v", err)
		}
		if err := p.cli.qp.SendInvalidate("si", []transport.SGE{sink.SGE(0, 8)}, fr.key, 0); err != nil {
			t.Fatalf("SendInvalidate: %v", err)
		}
		t.checkOK(t.waitN(p.cli.icq, 1, "send-with-invalidate"), transport.OpSend, p.cli.tag, "send-with-invalidate")
		if c := t.waitN(p.srv.rcq, 1, "receive")[0]; c.Status != nil || !c.Invalidated || c.InvalidatedKey != fr.key {
			t.Fatalf("receive of send-with-invalidate: status %v, Invalidated %v, key %#x; want nil, true, %#x", c.Status, c.Invalidated, c.InvalidatedKey, fr.key)
		}
		t.expectRefused(p, sink, fr.mr.Addr(), fr.key, "key invalidated by the peer's send-with-invalidate")
	})
}

// writeReadVia writes random data through a fast-registered key, checks it
// landed (after a fence send), and reads it back through the key.
func (t *T) writeReadVia(p *pair, fr fastRegistered, sink transport.MemoryRegion) {
	t.Helper()
	n := len(fr.buf)
	off := t.rng.IntN(n / 2)
	m := t.rng.IntN(n-off) + 1
	src := t.register(p.cli.pd, m, allAccess)
	sges := t.scatter(src, 0, uint32(m), int(p.cli.cfg.MaxInitiatorRequestSge))
	want := gather(src, sges)
	if err := p.cli.qp.Write("w", sges, fr.mr.Addr()+uint64(off), fr.key, 0); err != nil {
		t.Fatalf("Write through fast-registered key: %v", err)
	}
	fence := t.register(p.srv.pd, 8, allAccess)
	if err := p.srv.qp.PostReceive("fence", []transport.SGE{fence.SGE(0, 8)}); err != nil {
		t.Fatalf("PostReceive: %v", err)
	}
	if err := p.cli.qp.Send("fence", []transport.SGE{src.SGE(0, 1)}, 0); err != nil {
		t.Fatalf("Send: %v", err)
	}
	got := t.waitN(p.cli.icq, 2, "write and fence")
	t.checkOK(got[:1], transport.OpWrite, p.cli.tag, "write through the fast-registered key")
	t.checkOK(got[1:], transport.OpSend, p.cli.tag, "fence")
	t.waitN(p.srv.rcq, 1, "fence")
	if !bytes.Equal(fr.buf[off:off+m], want) {
		t.Fatalf("write through the fast-registered key (%d bytes at %d): %s", m, off, firstDiff(fr.buf[off:off+m], want))
	}
	if !bytes.Equal(fr.mr.Bytes()[off:off+m], fr.buf[off:off+m]) {
		t.Fatalf("MemoryRegion.Bytes() of a fast-registered region is not the registered buffer")
	}
	c := t.readVia(p, sink, fr.mr.Addr(), fr.key, n, "read-back")
	t.checkOK([]transport.Completion{c}, transport.OpRead, p.cli.tag, "read through the fast-registered key")
	if !bytes.Equal(sink.Bytes()[:n], fr.buf) {
		t.Fatalf("read through the fast-registered key: %s", firstDiff(sink.Bytes()[:n], fr.buf))
	}
}

// ReadSinkLocal: FlagReadSinkLocal tells the truth. With it, an RDMA read
// into a sink registered without AccessRemoteWrite delivers the data.
// Without it (iWARP: the read response is a tagged write into the sink),
// the same read fails and the connection ends, the sink untouched: a
// consumer must lend each read's sink remote write, and should do it per
// read (fast registration), since the read request shows the peer its key.
func testReadSinkLocal(t *T) {
	p := t.newPair(pairOpts{})
	const n = 8192
	src := t.register(p.srv.pd, n, allAccess)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i*7 + 1)
	}
	sink := t.register(p.cli.pd, n, transport.AccessLocalWrite)
	before := slices.Clone(sink.Bytes())
	if err := p.cli.qp.Read("sink", []transport.SGE{sink.SGE(0, n)}, src.Addr(), src.RKey(), 0); err != nil {
		t.Fatalf("Read: %v", err)
	}
	c := t.waitN(p.cli.icq, 1, "read into a local-write sink")[0]
	if t.info().Flags&transport.FlagReadSinkLocal != 0 {
		if c.Status != nil {
			t.Fatalf("FlagReadSinkLocal, but the read into a sink without remote write failed: %v", c.Status)
		}
		if !bytes.Equal(sink.Bytes(), src.Bytes()) {
			t.Fatalf("read data: %s", firstDiff(sink.Bytes(), src.Bytes()))
		}
		return
	}
	if c.Status == nil {
		t.Fatal("FlagReadSinkLocal clear, but a read into a sink without remote write succeeded: set the flag")
	}
	t.waitDone(p.cli.qp, "initiator after its sink refused the read response")
	if !bytes.Equal(sink.Bytes(), before) {
		t.Fatalf("a refused read response changed the sink: %s", firstDiff(sink.Bytes(), before))
	}
	t.Logf("iWARP: the read into a local-write sink failed (%v), as it must", c.Status)
}
