package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// conn is one client connection. In the transmission phase one reader
// goroutine (transmit) parses requests and reads write payloads, and
// cfg.Workers worker goroutines execute them on the device and write the
// replies, in completion order, each tagged with the request's handle.
//
// A request lives in a slot (preallocated, with its data buffer) that
// moves through the states below; the free channel holds the free slots
// and bounds the requests in flight, so the reader stops reading from
// the socket when every worker is busy (back-pressure to the client).
type conn struct {
	s  *Server
	nc net.Conn
	br *bufio.Reader

	// Handshake.
	noZeroes bool
	opt      []byte // option data, maxOptionData bytes
	rep      []byte // option reply data being built

	// Transmission.
	slots []slot
	free  chan *slot // idle slots
	work  chan *slot // slots whose request is read, for the workers
	// large holds the shared buffer for requests above WorkerBuffer (nil
	// until first needed): taking it from the channel is owning it.
	large chan []byte

	mu      sync.Mutex // guards closing and the socket's deadlines
	closing bool       // Server.Close: stop reading, drain, close

	wmu      sync.Mutex // one reply on the wire at a time
	failOnce sync.Once
	failed   atomic.Bool
	failErr  error // set once under failOnce
}

// slotState is where a slot's request is; the reader and the worker that
// own the slot in turn are the only ones to change it.
type slotState uint8

const (
	slotFree      slotState = iota // in free
	slotReading                    // the reader fills header and payload
	slotQueued                     // in work
	slotExecuting                  // a worker runs it on the device and replies
)

type slot struct {
	state  slotState
	hdr    [requestSize]byte
	reply  [replySize]byte
	buf    []byte // preallocated, WorkerBuffer bytes
	data   []byte // this request's payload: buf, or the large buffer
	large  bool   // data is the connection's large buffer
	cmd    uint16
	flags  uint16
	handle uint64
	off    uint64
	length uint32
	errno  uint32 // non-zero: reply with it, do not execute
	vec    [2][]byte
	bufs   net.Buffers
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{s: s, nc: nc, br: bufio.NewReaderSize(nc, readBufferSize),
		opt: make([]byte, maxOptionData), rep: make([]byte, 0, 64)}
}

// shutdownGrace bounds how long a closing connection waits to write the
// replies of requests in flight (a client that stopped reading).
const shutdownGrace = 5 * time.Second

// shutdown makes the reader stop at once (a read deadline in the past)
// and bounds the writes of the replies still to come.
func (c *conn) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing = true
	c.nc.SetReadDeadline(time.Now())
	c.nc.SetWriteDeadline(time.Now().Add(shutdownGrace))
}

// startTransmission clears the handshake's deadline, unless the server
// is closing (then false: the connection ends without transmission).
func (c *conn) startTransmission() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return false
	}
	c.nc.SetDeadline(time.Time{})
	return true
}

func (c *conn) isClosing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing
}

// errDisc ends the reader on NBD_CMD_DISC: the clean way out.
var errDisc = errors.New("nbd: client disconnected")

// transmit runs the transmission phase until the client disconnects, the
// stream breaks or a reply cannot be written.
func (c *conn) transmit() error {
	c.opt = nil
	cfg := &c.s.cfg
	c.slots = make([]slot, cfg.Workers)
	c.free = make(chan *slot, cfg.Workers)
	c.work = make(chan *slot, cfg.Workers)
	c.large = make(chan []byte, 1)
	c.large <- nil
	for i := range c.slots {
		c.slots[i].buf = make([]byte, cfg.WorkerBuffer)
		c.free <- &c.slots[i]
	}
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.worker()
		}()
	}
	err := c.readLoop()
	if c.isClosing() {
		// Server.Close: drain like a DISC (the write deadline bounds it).
		err = errDisc
	}
	if !errors.Is(err, errDisc) {
		// A broken stream or a closed server: nobody will read the
		// replies in flight, so unblock their writers now.
		c.fail(err)
	}
	close(c.work)
	wg.Wait()
	if errors.Is(err, errDisc) {
		err = nil
	}
	if c.failed.Load() && err == nil {
		err = c.failErr
	}
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		// The client went away without DISC, or the server was closed.
		err = nil
	}
	return err
}

// readLoop reads requests into free slots and queues them, until DISC
// (errDisc) or an error.
func (c *conn) readLoop() error {
	for {
		s := <-c.free
		s.state = slotReading
		if _, err := io.ReadFull(c.br, s.hdr[:]); err != nil {
			if err == io.ErrUnexpectedEOF {
				err = fmt.Errorf("%w: short request header", ErrProtocol)
			}
			return err
		}
		h := s.hdr[:]
		if m := binary.BigEndian.Uint32(h[0:]); m != requestMagic {
			c.s.st.protocolErrors.Add(1)
			return fmt.Errorf("%w: request magic %#x", ErrProtocol, m)
		}
		s.flags = binary.BigEndian.Uint16(h[4:])
		s.cmd = binary.BigEndian.Uint16(h[6:])
		s.handle = binary.BigEndian.Uint64(h[8:])
		s.off = binary.BigEndian.Uint64(h[16:])
		s.length = binary.BigEndian.Uint32(h[24:])
		s.data, s.large = nil, false
		c.s.st.requests.Add(1)
		if s.cmd == cmdDisc {
			c.free <- s
			return errDisc
		}
		s.errno = c.s.check(s.cmd, s.flags, s.off, s.length)
		needBuf := s.errno == 0 && (s.cmd == cmdRead || s.cmd == cmdWrite) && s.length > 0
		if needBuf {
			c.takeBuffer(s)
		}
		if s.cmd == cmdWrite {
			var err error
			if needBuf {
				_, err = io.ReadFull(c.br, s.data)
			} else {
				// A refused write still carries its payload: skip it.
				_, err = io.CopyN(io.Discard, c.br, int64(s.length))
			}
			if err != nil {
				c.releaseBuffer(s)
				if err == io.EOF || err == io.ErrUnexpectedEOF {
					err = fmt.Errorf("%w: short write payload", ErrProtocol)
					c.s.st.protocolErrors.Add(1)
				}
				return err
			}
		}
		s.state = slotQueued
		c.work <- s
	}
}

// takeBuffer points s.data at the slot's buffer, or for a request above
// WorkerBuffer at the connection's large buffer (waiting for the request
// holding it; allocated once, on first use, and kept).
func (c *conn) takeBuffer(s *slot) {
	n := int(s.length)
	if n <= len(s.buf) {
		s.data = s.buf[:n]
		return
	}
	c.s.st.large.Add(1)
	b := <-c.large
	if b == nil {
		c.s.st.largeAllocs.Add(1)
		b = make([]byte, c.s.cfg.MaxRequest)
	}
	s.data, s.large = b[:n], true
}

func (c *conn) releaseBuffer(s *slot) {
	if s.large {
		c.large <- s.data[:cap(s.data)]
	}
	s.data, s.large = nil, false
}

func (c *conn) worker() {
	for s := range c.work {
		s.state = slotExecuting
		if s.errno == 0 {
			s.errno = c.s.exec(s)
		}
		if s.errno != 0 {
			c.s.st.errors.Add(1)
		}
		c.reply(s)
		c.releaseBuffer(s)
		s.state = slotFree
		c.free <- s
	}
}

// reply writes the simple reply (with the data of a successful READ) in
// one gathered write.
func (c *conn) reply(s *slot) {
	if c.failed.Load() {
		return
	}
	r := s.reply[:]
	binary.BigEndian.PutUint32(r[0:], simpleReplyMagic)
	binary.BigEndian.PutUint32(r[4:], s.errno)
	binary.BigEndian.PutUint64(r[8:], s.handle)
	s.vec[0] = r
	s.bufs = s.vec[:1]
	if s.cmd == cmdRead && s.errno == 0 && len(s.data) > 0 {
		s.vec[1] = s.data
		s.bufs = s.vec[:2]
	}
	c.wmu.Lock()
	_, err := s.bufs.WriteTo(c.nc)
	c.wmu.Unlock()
	s.vec = [2][]byte{}
	if err != nil {
		c.fail(err)
	}
}

// fail records the first error and closes the socket: the reader stops,
// and pending replies are dropped.
func (c *conn) fail(err error) {
	c.failOnce.Do(func() {
		c.failErr = err
		c.failed.Store(true)
		c.nc.Close()
	})
}

// check validates a request against the export before anything is done:
// it returns the error value to reply with, or 0.
func (s *Server) check(cmd, flags uint16, off uint64, length uint32) uint32 {
	allowed := uint16(cmdFlagFUA) // clients set FUA on any command; harmless
	if cmd == cmdWriteZeroes {
		allowed |= cmdFlagNoHole
	}
	if flags&^allowed != 0 {
		return errnoEINVAL
	}
	switch cmd {
	case cmdFlush:
		return 0
	case cmdRead, cmdWrite, cmdTrim, cmdWriteZeroes:
	default:
		// CACHE, BLOCK_STATUS (not negotiated) and unknown commands.
		return errnoEINVAL
	}
	if s.cfg.ReadOnly && cmd != cmdRead {
		return errnoEPERM
	}
	if (cmd == cmdRead || cmd == cmdWrite) && length > uint32(s.cfg.MaxRequest) {
		return errnoEINVAL
	}
	if cmd != cmdRead && cmd != cmdWrite && length == 0 {
		return errnoEINVAL
	}
	if off%uint64(s.bs) != 0 || length%s.bs != 0 {
		return errnoEINVAL
	}
	if off > s.size || uint64(length) > s.size-off {
		// The spec: ENOSPC for writes beyond the end, EINVAL for reads
		// and trims.
		if cmd == cmdWrite || cmd == cmdWriteZeroes {
			return errnoENOSPC
		}
		return errnoEINVAL
	}
	return 0
}

// exec runs a checked request on the device and returns its error value.
func (s *Server) exec(r *slot) uint32 {
	off, n := int64(r.off), int64(r.length)
	fua := r.flags&cmdFlagFUA != 0
	var err error
	switch r.cmd {
	case cmdRead:
		s.st.reads.Add(1)
		if n > 0 {
			var got int
			got, err = s.dev.ReadAt(r.data, off)
			if err == nil && got != len(r.data) {
				err = io.ErrUnexpectedEOF
			} else if err == io.EOF && got == len(r.data) {
				err = nil
			}
			s.st.bytesRead.Add(uint64(got))
		}
	case cmdWrite:
		s.st.writes.Add(1)
		if n > 0 {
			var got int
			if fua && s.fua != nil {
				got, err = s.fua.WriteAtFUA(r.data, off)
				fua = false // done
			} else {
				got, err = s.dev.WriteAt(r.data, off)
			}
			if err == nil && got != len(r.data) {
				err = io.ErrShortWrite
			}
			s.st.bytesWritten.Add(uint64(got))
		}
	case cmdFlush:
		s.st.flushes.Add(1)
		err = s.dev.Flush()
		fua = false
	case cmdTrim:
		s.st.trims.Add(1)
		err = s.dev.Trim(off, n)
	case cmdWriteZeroes:
		s.st.zeroes.Add(1)
		if r.flags&cmdFlagNoHole == 0 && s.zd != nil {
			s.st.holes.Add(1)
			err = s.zd.DeallocateZeroes(off, n)
		} else {
			err = s.dev.WriteZeroes(off, n)
		}
	}
	if r.flags&cmdFlagFUA != 0 && r.cmd != cmdRead && r.cmd != cmdFlush {
		s.st.fua.Add(1)
	}
	if err == nil && fua && r.cmd != cmdRead {
		// FUA without the device's own: make this command's writes durable.
		err = s.dev.Flush()
	}
	if err != nil {
		s.logf("nbd: %s %d+%d: %v", cmdName(r.cmd), off, n, err)
	}
	return errnoOf(err)
}
