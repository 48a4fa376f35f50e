package nbd

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// Server exports one Device over the NBD protocol, on any number of
// connections at once (every connection sees the same device, so a
// FLUSH on one covers writes completed on all: NBD_FLAG_CAN_MULTI_CONN).
type Server struct {
	dev   Device
	fua   FUAWriter       // nil: FUA is WriteAt + Flush
	zd    ZeroDeallocator // nil: WRITE_ZEROES always writes
	cfg   Config
	size  uint64
	bs    uint32
	flags uint16 // transmission flags

	mu        sync.Mutex
	closed    bool
	conns     map[*conn]struct{}
	listeners map[net.Listener]struct{}
	wg        sync.WaitGroup

	st stats
}

// NewServer checks the device and the configuration.
func NewServer(d Device, cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	bs, size := d.BlockSize(), d.Size()
	if bs < 512 || bs > 64<<10 || bs&(bs-1) != 0 {
		return nil, fmt.Errorf("%w: device block size %d is not a power of two in [512, 64 KiB]", ErrInvalidConfig, bs)
	}
	if size < 0 || size%int64(bs) != 0 {
		return nil, fmt.Errorf("%w: device size %d is not a multiple of its block size %d", ErrInvalidConfig, size, bs)
	}
	if cfg.MaxRequest%bs != 0 || cfg.WorkerBuffer%bs != 0 {
		return nil, fmt.Errorf("%w: MaxRequest %d and WorkerBuffer %d must be multiples of the block size %d", ErrInvalidConfig, cfg.MaxRequest, cfg.WorkerBuffer, bs)
	}
	s := &Server{
		dev: d, cfg: cfg, size: uint64(size), bs: uint32(bs),
		conns: map[*conn]struct{}{}, listeners: map[net.Listener]struct{}{},
	}
	s.fua, _ = d.(FUAWriter)
	s.zd, _ = d.(ZeroDeallocator)
	s.flags = tflagHasFlags | tflagSendFlush | tflagSendFUA | tflagSendTrim | tflagSendWriteZeroes | tflagCanMultiConn
	if cfg.ReadOnly {
		s.flags |= tflagReadOnly
	}
	return s, nil
}

// Serve accepts connections on l and serves each (handshake, then
// transmission) on its own goroutine, until l fails or the server is
// closed (then it returns ErrClosed).
func (s *Server) Serve(l net.Listener) error {
	if !track(s, s.listeners, l) {
		l.Close()
		return ErrClosed
	}
	defer untrack(s, s.listeners, l)
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrClosed
			}
			return err
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.ServeConn(nc); err != nil {
				s.logf("nbd: %v: %v", nc.RemoteAddr(), err)
			}
		}()
	}
}

// ServeConn runs the fixed newstyle handshake on nc, then the
// transmission phase, and returns when the client disconnects (nil after
// NBD_OPT_ABORT or NBD_CMD_DISC), the stream breaks, or the server is
// closed. It closes nc.
func (s *Server) ServeConn(nc net.Conn) error {
	return s.serve(nc, true)
}

// ServeTransmission serves the transmission phase only, on a socket whose
// handshake happened elsewhere (the kernel's end of a socketpair after
// the NBD_SET_* ioctls). It closes nc.
func (s *Server) ServeTransmission(nc net.Conn) error {
	return s.serve(nc, false)
}

func (s *Server) serve(nc net.Conn, handshake bool) error {
	c := newConn(s, nc)
	if !track(s, s.conns, c) {
		nc.Close()
		return ErrClosed
	}
	defer untrack(s, s.conns, c)
	defer nc.Close()
	s.st.conns.Add(1)
	if handshake {
		ok, err := c.handshake()
		if err != nil || !ok {
			if err != nil {
				s.st.protocolErrors.Add(1)
			}
			return err
		}
	}
	if !c.startTransmission() {
		return nil
	}
	return c.transmit()
}

// Close stops every listener and connection and waits for them. A
// connection in transmission stops reading requests, finishes those in
// flight and sends their replies (each within shutdownGrace), then
// closes: the server-side shutdown the spec asks for.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.shutdown()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// track registers k (a connection or listener) so that Close can stop
// it; false once the server is closed.
func track[K comparable](s *Server, m map[K]struct{}, k K) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	m[k] = struct{}{}
	s.wg.Add(1)
	return true
}

func untrack[K comparable](s *Server, m map[K]struct{}, k K) {
	s.mu.Lock()
	delete(m, k)
	s.mu.Unlock()
	s.wg.Done()
}

func (s *Server) logf(format string, args ...any) {
	if s.cfg.Logf != nil {
		s.cfg.Logf(format, args...)
	}
}

// Stats are the server's counters since NewServer.
type Stats struct {
	Conns          uint64 // connections served
	ProtocolErrors uint64 // connections closed for a protocol violation
	Requests       uint64 // transmission requests, DISC included
	Errors         uint64 // replies with a non-zero error
	Reads, Writes  uint64
	Flushes        uint64
	Trims          uint64
	WriteZeroes    uint64 // of which ZeroHoles took DeallocateZeroes
	ZeroHoles      uint64
	FUA            uint64 // writes, trims and zeroes with NBD_CMD_FLAG_FUA
	BytesRead      uint64
	BytesWritten   uint64
	LargeRequests  uint64 // requests above WorkerBuffer (the shared buffer)
	LargeAllocs    uint64 // allocations of that buffer (at most one per connection)
}

type stats struct {
	conns, protocolErrors, requests, errors      atomic.Uint64
	reads, writes, flushes, trims, zeroes, holes atomic.Uint64
	fua, bytesRead, bytesWritten                 atomic.Uint64
	large, largeAllocs                           atomic.Uint64
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Conns: s.st.conns.Load(), ProtocolErrors: s.st.protocolErrors.Load(),
		Requests: s.st.requests.Load(), Errors: s.st.errors.Load(),
		Reads: s.st.reads.Load(), Writes: s.st.writes.Load(), Flushes: s.st.flushes.Load(),
		Trims: s.st.trims.Load(), WriteZeroes: s.st.zeroes.Load(), ZeroHoles: s.st.holes.Load(),
		FUA: s.st.fua.Load(), BytesRead: s.st.bytesRead.Load(), BytesWritten: s.st.bytesWritten.Load(),
		LargeRequests: s.st.large.Load(), LargeAllocs: s.st.largeAllocs.Load(),
	}
}
