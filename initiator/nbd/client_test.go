package nbd_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator/nbd"
)

// The protocol's numbers, written out again from the spec (not taken from
// the package) so that the tests check the wire, not themselves.
const (
	magicNBD       = 0x4e42444d41474943
	magicOpt       = 0x49484156454F5054
	magicOptReply  = 0x3e889045565a9
	magicRequest   = 0x25609513
	magicReply     = 0x67446698
	optExportName  = 1
	optAbort       = 2
	optList        = 3
	optStartTLS    = 5
	optInfo        = 6
	optGo          = 7
	optStructured  = 8
	repAck         = 1
	repServer      = 2
	repInfo        = 3
	repErrUnsup    = 1<<31 + 1
	repErrInvalid  = 1<<31 + 3
	repErrUnknown  = 1<<31 + 6
	infoExport     = 0
	infoName       = 1
	infoDesc       = 2
	infoBlockSize  = 3
	cmdRead        = 0
	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdTrim        = 4
	cmdWriteZeroes = 6
	flagFUA        = 1
	flagNoHole     = 2
	eperm          = 1
	eio            = 5
	einval         = 22
	enospc         = 28
)

// memDevice is an in-memory Device with counters and a hook to hold
// requests.
type memDevice struct {
	mu      sync.Mutex
	data    []byte
	bs      int
	flushes int
	fuas    int
	trims   int
	zeroes  int
	holes   int
	hold    func(op string, off int64) // called before each operation, unlocked
	failAt  int64                      // ReadAt/WriteAt at this offset fail with EIO; -1 none
}

func newMem(size, bs int) *memDevice {
	return &memDevice{data: make([]byte, size), bs: bs, failAt: -1}
}

func (m *memDevice) before(op string, off int64) {
	if m.hold != nil {
		m.hold(op, off)
	}
}

func (m *memDevice) Size() int64    { return int64(len(m.data)) }
func (m *memDevice) BlockSize() int { return m.bs }

func (m *memDevice) ReadAt(p []byte, off int64) (int, error) {
	m.before("read", off)
	if off == m.failAt {
		return 0, io.ErrUnexpectedEOF
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(p, m.data[off:]), nil
}

func (m *memDevice) WriteAt(p []byte, off int64) (int, error) {
	m.before("write", off)
	if off == m.failAt {
		return 0, io.ErrShortWrite
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(m.data[off:], p), nil
}

func (m *memDevice) WriteAtFUA(p []byte, off int64) (int, error) {
	n, err := m.WriteAt(p, off)
	m.mu.Lock()
	m.fuas++
	m.mu.Unlock()
	return n, err
}

func (m *memDevice) Flush() error {
	m.before("flush", 0)
	m.mu.Lock()
	m.flushes++
	m.mu.Unlock()
	return nil
}

func (m *memDevice) Trim(off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.trims++
	for i := off; i < off+n; i++ {
		m.data[i] = 0xdd // trimmed: anything may read back
	}
	return nil
}

func (m *memDevice) WriteZeroes(off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.zeroes++
	clear(m.data[off : off+n])
	return nil
}

func (m *memDevice) DeallocateZeroes(off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.holes++
	clear(m.data[off : off+n])
	return nil
}

// at returns a copy of n bytes at off.
func (m *memDevice) at(off, n int) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.data[off : off+n])
}

func (m *memDevice) count(p *int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return *p
}

// client is the test's NBD client: raw bytes, per the spec.
type client struct {
	t  testing.TB
	c  net.Conn
	wm sync.Mutex
}

// serve starts srv on a unix socket and returns a connected client; the
// server's result arrives on done.
func serve(t testing.TB, srv *nbd.Server) (*client, <-chan error) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "nbd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		nc, err := l.Accept()
		l.Close()
		if err != nil {
			done <- err
			return
		}
		done <- srv.ServeConn(nc)
	}()
	c, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c}, done
}

func (cl *client) read(n int) []byte {
	cl.t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(cl.c, b); err != nil {
		cl.t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

func (cl *client) write(b []byte) {
	cl.t.Helper()
	cl.wm.Lock()
	defer cl.wm.Unlock()
	if _, err := cl.c.Write(b); err != nil {
		cl.t.Fatalf("write: %v", err)
	}
}

// greet reads the server's greeting and sends client flags.
func (cl *client) greet(cflags uint32) uint16 {
	cl.t.Helper()
	g := cl.read(18)
	if binary.BigEndian.Uint64(g) != magicNBD || binary.BigEndian.Uint64(g[8:]) != magicOpt {
		cl.t.Fatalf("greeting % x", g)
	}
	cl.write(binary.BigEndian.AppendUint32(nil, cflags))
	return binary.BigEndian.Uint16(g[16:])
}

func (cl *client) option(opt uint32, data []byte) {
	b := binary.BigEndian.AppendUint64(nil, magicOpt)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	cl.write(append(b, data...))
}

// optReply reads one option reply and checks it answers opt.
func (cl *client) optReply(opt uint32) (typ uint32, data []byte) {
	cl.t.Helper()
	h := cl.read(20)
	if m := binary.BigEndian.Uint64(h); m != magicOptReply {
		cl.t.Fatalf("option reply magic %#x", m)
	}
	if o := binary.BigEndian.Uint32(h[8:]); o != opt {
		cl.t.Fatalf("reply to option %d, want %d", o, opt)
	}
	typ = binary.BigEndian.Uint32(h[12:])
	return typ, cl.read(int(binary.BigEndian.Uint32(h[16:])))
}

func goData(name string, infos ...uint16) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = binary.BigEndian.AppendUint16(b, i)
	}
	return b
}

// exportInfo is what NBD_OPT_GO/INFO told.
type exportInfo struct {
	size                 uint64
	flags                uint16
	minBS, prefBS, maxBS uint32
	name, desc           string
	gotBS, gotName       bool
}

// infoGo sends GO or INFO and collects the replies up to the final one,
// which it returns.
func (cl *client) infoGo(opt uint32, name string, infos ...uint16) (exportInfo, uint32) {
	cl.t.Helper()
	cl.option(opt, goData(name, infos...))
	var ei exportInfo
	for {
		typ, d := cl.optReply(opt)
		if typ != repInfo {
			return ei, typ
		}
		switch binary.BigEndian.Uint16(d) {
		case infoExport:
			if len(d) != 12 {
				cl.t.Fatalf("NBD_INFO_EXPORT of %d bytes", len(d))
			}
			ei.size, ei.flags = binary.BigEndian.Uint64(d[2:]), binary.BigEndian.Uint16(d[10:])
		case infoBlockSize:
			if len(d) != 14 {
				cl.t.Fatalf("NBD_INFO_BLOCK_SIZE of %d bytes", len(d))
			}
			ei.gotBS = true
			ei.minBS, ei.prefBS, ei.maxBS = binary.BigEndian.Uint32(d[2:]), binary.BigEndian.Uint32(d[6:]), binary.BigEndian.Uint32(d[10:])
		case infoName:
			ei.name, ei.gotName = string(d[2:]), true
		case infoDesc:
			ei.desc = string(d[2:])
		}
	}
}

// connect runs the handshake with NBD_OPT_GO and returns the export info.
func (cl *client) connect() exportInfo {
	cl.t.Helper()
	cl.greet(3)
	ei, typ := cl.infoGo(optGo, "", infoBlockSize)
	if typ != repAck {
		cl.t.Fatalf("GO: reply %#x", typ)
	}
	return ei
}

func (cl *client) request(cmd, flags uint16, handle, off uint64, length uint32, payload []byte) {
	b := make([]byte, 28, 28+len(payload))
	binary.BigEndian.PutUint32(b, magicRequest)
	binary.BigEndian.PutUint16(b[4:], flags)
	binary.BigEndian.PutUint16(b[6:], cmd)
	binary.BigEndian.PutUint64(b[8:], handle)
	binary.BigEndian.PutUint64(b[16:], off)
	binary.BigEndian.PutUint32(b[24:], length)
	cl.write(append(b, payload...))
}

// reply reads a simple reply header.
func (cl *client) reply() (errno uint32, handle uint64) {
	cl.t.Helper()
	h := cl.read(16)
	if m := binary.BigEndian.Uint32(h); m != magicReply {
		cl.t.Fatalf("reply magic %#x", m)
	}
	return binary.BigEndian.Uint32(h[4:]), binary.BigEndian.Uint64(h[8:])
}

// do sends one request and waits for its reply (and the data of a
// successful read of n bytes).
func (cl *client) do(cmd, flags uint16, off uint64, n uint32, payload []byte) (uint32, []byte) {
	cl.t.Helper()
	const h uint64 = 0xfeedface12345678
	cl.request(cmd, flags, h, off, n, payload)
	errno, handle := cl.reply()
	if handle != h {
		cl.t.Fatalf("reply handle %#x, want %#x", handle, h)
	}
	if cmd == cmdRead && errno == 0 {
		return 0, cl.read(int(n))
	}
	return errno, nil
}

// disc sends NBD_CMD_DISC and waits for the server to close.
func (cl *client) disc(done <-chan error) {
	cl.t.Helper()
	cl.request(cmdDisc, 0, 0, 0, 0, nil)
	if n, err := cl.c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		cl.t.Fatalf("after DISC: read %d, %v; want EOF", n, err)
	}
	if err := <-done; err != nil {
		cl.t.Fatalf("ServeConn after DISC: %v", err)
	}
}

func newServer(t testing.TB, d nbd.Device, cfg nbd.Config) *nbd.Server {
	t.Helper()
	s, err := nbd.NewServer(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// checkGoroutines fails if goroutines started since base do not end.
func checkGoroutines(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines: %d, want ≤ %d\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}
