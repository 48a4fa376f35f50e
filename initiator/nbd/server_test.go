package nbd_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator/nbd"
)

const wantFlags = 1<<0 | 1<<2 | 1<<3 | 1<<5 | 1<<6 | 1<<8 // HAS_FLAGS SEND_FLUSH SEND_FUA SEND_TRIM SEND_WRITE_ZEROES CAN_MULTI_CONN

func TestHandshakeGo(t *testing.T) {
	srv := newServer(t, newMem(1<<20, 512), nbd.Config{ExportName: "vol1", Description: "a test volume"})
	cl, done := serve(t, srv)
	if hf := cl.greet(3); hf != 3 {
		t.Fatalf("handshake flags %#x, want FIXED_NEWSTYLE|NO_ZEROES", hf)
	}
	// INFO first: the same facts, and the option phase goes on.
	ei, typ := cl.infoGo(optInfo, "vol1", infoName, infoDesc)
	if typ != repAck {
		t.Fatalf("INFO: %#x", typ)
	}
	if ei.size != 1<<20 || ei.flags != wantFlags {
		t.Fatalf("INFO: size %d flags %#x", ei.size, ei.flags)
	}
	if !ei.gotBS || ei.minBS != 512 || ei.prefBS != 4096 || ei.maxBS != 32<<20 {
		t.Fatalf("block sizes: %+v", ei)
	}
	if !ei.gotName || ei.name != "vol1" || ei.desc != "a test volume" {
		t.Fatalf("name %q desc %q", ei.name, ei.desc)
	}
	if _, typ := cl.infoGo(optGo, "other"); typ != repErrUnknown {
		t.Fatalf("GO unknown export: %#x, want ERR_UNKNOWN", typ)
	}
	ei, typ = cl.infoGo(optGo, "") // the default export
	if typ != repAck || ei.size != 1<<20 || ei.flags != wantFlags || !ei.gotBS {
		t.Fatalf("GO: %#x %+v", typ, ei)
	}
	if errno, _ := cl.do(cmdFlush, 0, 0, 0, nil); errno != 0 {
		t.Fatalf("flush: %d", errno)
	}
	cl.disc(done)
}

func TestHandshakeOptions(t *testing.T) {
	srv := newServer(t, newMem(1<<20, 4096), nbd.Config{ExportName: "e"})
	cl, done := serve(t, srv)
	cl.greet(1)
	for _, opt := range []uint32{optStartTLS, optStructured, 42, 0x7fffffff} {
		cl.option(opt, []byte("ignored data"))
		if typ, _ := cl.optReply(opt); typ != repErrUnsup {
			t.Fatalf("option %d: %#x, want ERR_UNSUP", opt, typ)
		}
	}
	cl.option(optList, nil)
	if typ, d := cl.optReply(optList); typ != repServer || binary.BigEndian.Uint32(d) != 1 || string(d[4:]) != "e" {
		t.Fatalf("LIST: %#x % x", typ, d)
	}
	if typ, _ := cl.optReply(optList); typ != repAck {
		t.Fatalf("LIST end: %#x", typ)
	}
	cl.option(optGo, []byte{0, 0, 0, 9, 1}) // name longer than the data
	if typ, _ := cl.optReply(optGo); typ != repErrInvalid {
		t.Fatalf("bad GO: %#x, want ERR_INVALID", typ)
	}
	// EXPORT_NAME without NO_ZEROES (not negotiated: client flags 1).
	cl.option(optExportName, []byte("e"))
	b := cl.read(8 + 2 + 124)
	if binary.BigEndian.Uint64(b) != 1<<20 || binary.BigEndian.Uint16(b[8:]) != wantFlags || !bytes.Equal(b[10:], make([]byte, 124)) {
		t.Fatalf("EXPORT_NAME reply % x", b[:10])
	}
	cl.disc(done)

	// NO_ZEROES: ten bytes only; then transmission.
	cl, done = serve(t, srv)
	cl.greet(3)
	cl.option(optExportName, nil)
	if b := cl.read(10); binary.BigEndian.Uint64(b) != 1<<20 {
		t.Fatalf("EXPORT_NAME reply % x", b)
	}
	if errno, _ := cl.do(cmdRead, 0, 0, 4096, nil); errno != 0 {
		t.Fatalf("read: %d", errno)
	}
	cl.disc(done)

	// ABORT: ACK and close.
	cl, done = serve(t, srv)
	cl.greet(3)
	cl.option(optAbort, nil)
	if typ, _ := cl.optReply(optAbort); typ != repAck {
		t.Fatalf("ABORT: %#x", typ)
	}
	if err := <-done; err != nil {
		t.Fatalf("ServeConn after ABORT: %v", err)
	}

	// Unknown client flags: closed.
	cl, done = serve(t, srv)
	cl.greet(1 << 7)
	if err := <-done; !errors.Is(err, nbd.ErrProtocol) {
		t.Fatalf("unknown client flags: %v", err)
	}
}

func TestRoundTrips(t *testing.T) {
	mem := newMem(1<<20, 512)
	srv := newServer(t, mem, nbd.Config{})
	cl, done := serve(t, srv)
	cl.connect()
	data := pattern(64<<10, 1)
	if errno, _ := cl.do(cmdWrite, 0, 8192, uint32(len(data)), data); errno != 0 {
		t.Fatalf("write: %d", errno)
	}
	if errno, got := cl.do(cmdRead, 0, 8192, uint32(len(data)), nil); errno != 0 || !bytes.Equal(got, data) {
		t.Fatalf("read back: errno %d, equal %v", errno, bytes.Equal(got, data))
	}
	if !bytes.Equal(mem.at(8192, len(data)), data) {
		t.Fatal("device does not hold the write")
	}
	// FUA goes to WriteAtFUA, not to a flush.
	if errno, _ := cl.do(cmdWrite, flagFUA, 0, 512, pattern(512, 9)); errno != 0 {
		t.Fatalf("FUA write: %d", errno)
	}
	if mem.count(&mem.fuas) != 1 || mem.count(&mem.flushes) != 0 {
		t.Fatal("FUA: want one WriteAtFUA and no flush")
	}
	if errno, _ := cl.do(cmdFlush, 0, 0, 0, nil); errno != 0 || mem.count(&mem.flushes) != 1 {
		t.Fatalf("flush: %d", errno)
	}
	// Write zeroes with NO_HOLE writes; without, it may deallocate.
	if errno, _ := cl.do(cmdWriteZeroes, flagNoHole, 8192, 4096, nil); errno != 0 {
		t.Fatalf("write zeroes: %d", errno)
	}
	if errno, _ := cl.do(cmdWriteZeroes, 0, 8192+4096, 4096, nil); errno != 0 {
		t.Fatalf("write zeroes: %d", errno)
	}
	if mem.count(&mem.zeroes) != 1 || mem.count(&mem.holes) != 1 {
		t.Fatal("want one WriteZeroes and one DeallocateZeroes")
	}
	want := append(make([]byte, 8192), data[8192:]...)
	if errno, got := cl.do(cmdRead, 0, 8192, uint32(len(data)), nil); errno != 0 || !bytes.Equal(got, want) {
		t.Fatalf("after write zeroes: errno %d, equal %v", errno, bytes.Equal(got, want))
	}
	// Trim with FUA: trimmed, then flushed (the device has no FUA trim).
	if errno, _ := cl.do(cmdTrim, flagFUA, 0, 4096, nil); errno != 0 {
		t.Fatalf("trim: %d", errno)
	}
	if mem.count(&mem.trims) != 1 || mem.count(&mem.flushes) != 2 || mem.at(0, 1)[0] != 0xdd {
		t.Fatal("trim: want one Trim then a Flush")
	}
	// Zero-length read and write: nothing to do, no error.
	if errno, _ := cl.do(cmdRead, 0, 0, 0, nil); errno != 0 {
		t.Fatalf("empty read: %d", errno)
	}
	cl.disc(done)
	st := srv.Stats()
	if st.Writes != 2 || st.Reads != 3 || st.Flushes != 1 || st.Trims != 1 || st.WriteZeroes != 2 || st.ZeroHoles != 1 || st.FUA != 2 || st.Errors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestErrors(t *testing.T) {
	mem := newMem(1<<20, 4096)
	mem.failAt = 4096 * 3
	srv := newServer(t, mem, nbd.Config{MaxRequest: 1 << 20, WorkerBuffer: 64 << 10})
	cl, done := serve(t, srv)
	cl.connect()
	end := uint64(1 << 20)
	for _, tc := range []struct {
		name    string
		cmd     uint16
		flags   uint16
		off     uint64
		n       uint32
		payload bool
		want    uint32
	}{
		{"read past end", cmdRead, 0, end - 4096, 8192, false, einval},
		{"read far past end", cmdRead, 0, 1 << 62, 4096, false, einval},
		{"read offset overflow", cmdRead, 0, ^uint64(0) - 4095, 4096, false, einval},
		{"write past end", cmdWrite, 0, end, 4096, true, enospc},
		{"write zeroes past end", cmdWriteZeroes, 0, end - 4096, 8192, false, enospc},
		{"trim past end", cmdTrim, 0, end, 4096, false, einval},
		{"unaligned read", cmdRead, 0, 512, 4096, false, einval},
		{"unaligned write", cmdWrite, 0, 0, 1000, true, einval},
		{"read too large", cmdRead, 0, 0, 1<<20 + 4096, false, einval},
		{"write too large", cmdWrite, 0, 0, 1<<20 + 4096, true, einval},
		{"empty trim", cmdTrim, 0, 0, 0, false, einval},
		{"unknown command", 42, 0, 0, 4096, false, einval},
		{"cache (not negotiated)", 5, 0, 0, 4096, false, einval},
		{"block status (not negotiated)", 7, 0, 0, 4096, false, einval},
		{"unknown flag", cmdRead, 1 << 4, 0, 4096, false, einval},
		{"NO_HOLE on a write", cmdWrite, flagNoHole, 0, 4096, true, einval},
		{"device error", cmdRead, 0, 4096 * 3, 4096, false, eio},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p []byte
			if tc.payload {
				p = make([]byte, tc.n)
			}
			if errno, _ := cl.do(tc.cmd, tc.flags, tc.off, tc.n, p); errno != tc.want {
				t.Fatalf("errno %d, want %d", errno, tc.want)
			}
			// The connection still works: a refused write's payload was skipped.
			if errno, _ := cl.do(cmdRead, 0, 0, 4096, nil); errno != 0 {
				t.Fatalf("read after: %d", errno)
			}
		})
	}
	cl.disc(done)

	ro := newServer(t, mem, nbd.Config{ReadOnly: true})
	cl, done = serve(t, ro)
	if ei := cl.connect(); ei.flags != wantFlags|1<<1 {
		t.Fatalf("read-only flags %#x", ei.flags)
	}
	for _, cmd := range []uint16{cmdWrite, cmdTrim, cmdWriteZeroes} {
		var p []byte
		if cmd == cmdWrite {
			p = make([]byte, 4096)
		}
		if errno, _ := cl.do(cmd, 0, 0, 4096, p); errno != eperm {
			t.Fatalf("%d on read-only: %d, want EPERM", cmd, errno)
		}
	}
	cl.disc(done)
}

// TestOutOfOrder holds a read on the device while later requests
// complete: their replies come first, each with its own handle.
func TestOutOfOrder(t *testing.T) {
	mem := newMem(1<<20, 4096)
	release := make(chan struct{})
	mem.hold = func(op string, off int64) {
		if op == "read" && off == 0 {
			<-release
		}
	}
	srv := newServer(t, mem, nbd.Config{Workers: 4})
	cl, done := serve(t, srv)
	copy(mem.data, pattern(1<<20, 3)) // before any request: no race
	cl.connect()
	cl.request(cmdRead, 0, 100, 0, 4096, nil) // held
	for i := uint64(1); i <= 3; i++ {
		cl.request(cmdRead, 0, 100+i, i*4096, 4096, nil)
	}
	for i := 0; i < 3; i++ {
		errno, h := cl.reply()
		if errno != 0 || h < 101 || h > 103 {
			t.Fatalf("reply %d: errno %d handle %d", i, errno, h)
		}
		off := (h - 100) * 4096
		if got := cl.read(4096); !bytes.Equal(got, mem.at(int(off), 4096)) {
			t.Fatalf("handle %d: wrong data", h)
		}
	}
	close(release)
	if errno, h := cl.reply(); errno != 0 || h != 100 {
		t.Fatalf("held reply: errno %d handle %d", errno, h)
	}
	if got := cl.read(4096); !bytes.Equal(got, mem.at(0, 4096)) {
		t.Fatal("held read: wrong data")
	}
	cl.disc(done)
}

// TestConcurrent sends many writes and reads of different sizes (some
// above WorkerBuffer, through the shared buffer) without waiting, and
// matches the replies by handle.
func TestConcurrent(t *testing.T) {
	mem := newMem(8<<20, 4096)
	srv := newServer(t, mem, nbd.Config{Workers: 8, WorkerBuffer: 16 << 10, MaxRequest: 1 << 20})
	cl, done := serve(t, srv)
	cl.connect()
	const n = 200
	type req struct {
		off  uint64
		size uint32
	}
	reqs := make([]req, n)
	for i := range reqs {
		// Small requests at i × 32 KiB (below 6.25 MiB); every 17th a
		// 64 KiB one (above WorkerBuffer) in its own area from 6.25 MiB.
		reqs[i] = req{uint64(i) * (32 << 10), uint32(4096 * (1 + i%8))}
		if i%17 == 0 {
			reqs[i] = req{7<<20 - uint64(i/17+1)*(64<<10), 64 << 10}
		}
	}
	// Writes, all in flight at once, from a sender goroutine.
	go func() {
		for i, r := range reqs {
			cl.request(cmdWrite, 0, uint64(i), r.off, r.size, pattern(int(r.size), byte(i)))
		}
	}()
	seen := make(map[uint64]bool)
	for range reqs {
		errno, h := cl.reply()
		if errno != 0 || h >= n || seen[h] {
			t.Fatalf("write reply: errno %d handle %d (seen %v)", errno, h, seen[h])
		}
		seen[h] = true
	}
	go func() {
		for i, r := range reqs {
			cl.request(cmdRead, 0, uint64(n+i), r.off, r.size, nil)
		}
	}()
	for range reqs {
		errno, h := cl.reply()
		if errno != 0 || h < n || h >= 2*n {
			t.Fatalf("read reply: errno %d handle %d", errno, h)
		}
		i := int(h - n)
		if got := cl.read(int(reqs[i].size)); !bytes.Equal(got, pattern(int(reqs[i].size), byte(i))) {
			t.Fatalf("read %d: wrong data", i)
		}
	}
	cl.disc(done)
	if st := srv.Stats(); st.LargeRequests == 0 || st.LargeAllocs != 1 {
		t.Fatalf("large buffer: %d requests, %d allocations", st.LargeRequests, st.LargeAllocs)
	}
}

// TestMalformed: broken streams close the connection; nothing panics
// and no goroutine stays behind.
func TestMalformed(t *testing.T) {
	base := runtime.NumGoroutine()
	mem := newMem(1<<20, 4096)
	srv, err := nbd.NewServer(mem, nbd.Config{HandshakeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	greeted := func(c net.Conn) {
		io.ReadFull(c, make([]byte, 18))
	}
	goReq := func(c net.Conn) {
		greeted(c)
		b := binary.BigEndian.AppendUint32(nil, 3)
		b = binary.BigEndian.AppendUint64(b, magicOpt)
		b = binary.BigEndian.AppendUint32(b, optGo)
		d := goData("")
		b = binary.BigEndian.AppendUint32(b, uint32(len(d)))
		c.Write(append(b, d...))
		go io.Copy(io.Discard, c) // replies
		time.Sleep(10 * time.Millisecond)
	}
	for _, tc := range []struct {
		name string
		send func(c net.Conn)
	}{
		{"close at once", func(c net.Conn) {}},
		{"short client flags", func(c net.Conn) { greeted(c); c.Write([]byte{0, 0}) }},
		{"bad option magic", func(c net.Conn) {
			greeted(c)
			c.Write(append(binary.BigEndian.AppendUint32(nil, 1), bytes.Repeat([]byte{0xAA}, 16)...))
		}},
		{"short option data", func(c net.Conn) {
			greeted(c)
			b := binary.BigEndian.AppendUint32(nil, 1)
			b = binary.BigEndian.AppendUint64(b, magicOpt)
			b = binary.BigEndian.AppendUint32(b, optGo)
			b = binary.BigEndian.AppendUint32(b, 100)
			c.Write(append(b, 1, 2, 3))
		}},
		{"bad request magic", func(c net.Conn) { goReq(c); c.Write(bytes.Repeat([]byte{0x55}, 28)) }},
		{"short request", func(c net.Conn) { goReq(c); c.Write([]byte{0x25, 0x60, 0x95, 0x13, 0, 0}) }},
		{"short write payload", func(c net.Conn) {
			goReq(c)
			b := binary.BigEndian.AppendUint32(nil, magicRequest)
			b = binary.BigEndian.AppendUint32(b, cmdWrite)
			b = binary.BigEndian.AppendUint64(b, 1)
			b = binary.BigEndian.AppendUint64(b, 0)
			b = binary.BigEndian.AppendUint32(b, 8192)
			c.Write(append(b, make([]byte, 100)...))
		}},
		{"no DISC, reads in flight", func(c net.Conn) {
			goReq(c)
			for i := 0; i < 20; i++ {
				b := binary.BigEndian.AppendUint32(nil, magicRequest)
				b = binary.BigEndian.AppendUint32(b, cmdRead)
				b = binary.BigEndian.AppendUint64(b, uint64(i))
				b = binary.BigEndian.AppendUint64(b, 0)
				b = binary.BigEndian.AppendUint32(b, 64<<10)
				c.Write(b)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// net.Pipe: synchronous and unbuffered, the harshest peer.
			a, b := net.Pipe()
			done := make(chan error, 1)
			go func() { done <- srv.ServeConn(b) }()
			tc.send(a)
			a.Close()
			select {
			case err := <-done:
				t.Logf("ServeConn: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("ServeConn did not return")
			}
		})
	}
	srv.Close()
	checkGoroutines(t, base)
}

// TestCloseDrains: Server.Close lets a request in flight finish and
// reply, then closes the connection.
func TestCloseDrains(t *testing.T) {
	base := runtime.NumGoroutine()
	mem := newMem(1<<20, 4096)
	started, release := make(chan struct{}), make(chan struct{})
	mem.hold = func(op string, off int64) {
		if op == "write" {
			close(started)
			<-release
		}
	}
	srv, err := nbd.NewServer(mem, nbd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cl, done := serve(t, srv)
	cl.connect()
	cl.request(cmdWrite, 0, 7, 0, 4096, pattern(4096, 1))
	<-started
	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	time.Sleep(20 * time.Millisecond)
	close(release)
	if errno, h := cl.reply(); errno != 0 || h != 7 {
		t.Fatalf("reply in flight: errno %d handle %d", errno, h)
	}
	<-closed
	if err := <-done; err != nil {
		t.Fatalf("ServeConn: %v", err)
	}
	if _, err := cl.c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after Close: %v, want EOF", err)
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	if err := srv.ServeConn(p2); !errors.Is(err, nbd.ErrClosed) {
		t.Fatalf("ServeConn after Close: %v", err)
	}
	cl.c.Close()
	checkGoroutines(t, base)
}

func TestConfig(t *testing.T) {
	for _, cfg := range []nbd.Config{
		{Workers: -1}, {Workers: 1000}, {MaxRequest: 100}, {WorkerBuffer: 64 << 20},
		{MaxRequest: 1 << 20, WorkerBuffer: 2 << 20}, {HandshakeTimeout: -1},
	} {
		if err := cfg.Validate(); !errors.Is(err, nbd.ErrInvalidConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	if err := (nbd.Config{}).Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := nbd.NewServer(newMem(1<<20, 1000), nbd.Config{}); !errors.Is(err, nbd.ErrInvalidConfig) {
		t.Fatalf("block size 1000: %v", err)
	}
	if _, err := nbd.NewServer(newMem(1<<20+512, 4096), nbd.Config{}); !errors.Is(err, nbd.ErrInvalidConfig) {
		t.Fatalf("size not a multiple: %v", err)
	}
}

func TestAttachWithoutModule(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("linux only")
	}
	if _, err := os.Stat("/dev/nbd0"); err == nil {
		t.Skip("/dev/nbd0 exists: the VM e2e tests attach for real")
	}
	a, err := nbd.Attach("/dev/nbd0", newMem(1<<20, 4096))
	if a != nil || !errors.Is(err, nbd.ErrNoModule) || !strings.Contains(err.Error(), "modprobe nbd") {
		t.Fatalf("Attach: %v, %v", a, err)
	}
}

var _ = sync.Mutex{}
