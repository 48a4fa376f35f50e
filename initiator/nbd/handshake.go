package nbd

import (
	"encoding/binary"
	"fmt"
	"io"
	"time"
)

// handshake runs the fixed newstyle negotiation. It returns true to go on
// to transmission (after NBD_OPT_GO or NBD_OPT_EXPORT_NAME), false with a
// nil error after NBD_OPT_ABORT, or an error (the connection is then
// closed: a hard disconnect).
func (c *conn) handshake() (bool, error) {
	if t := c.s.cfg.HandshakeTimeout; t > 0 {
		c.nc.SetDeadline(time.Now().Add(t))
	}
	var b [18]byte
	binary.BigEndian.PutUint64(b[0:], nbdMagic)
	binary.BigEndian.PutUint64(b[8:], optMagic)
	binary.BigEndian.PutUint16(b[16:], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.nc.Write(b[:18]); err != nil {
		return false, err
	}
	if _, err := io.ReadFull(c.br, b[:4]); err != nil {
		return false, fmt.Errorf("%w: client flags: %w", ErrProtocol, err)
	}
	cflags := binary.BigEndian.Uint32(b[:4])
	if cflags&^(clientFixedNewstyle|clientNoZeroes) != 0 {
		// The spec: the server MUST close on client flags it does not know.
		return false, fmt.Errorf("%w: unknown client flags %#x", ErrProtocol, cflags)
	}
	fixed := cflags&clientFixedNewstyle != 0
	c.noZeroes = cflags&clientNoZeroes != 0
	for {
		if _, err := io.ReadFull(c.br, b[:16]); err != nil {
			return false, fmt.Errorf("%w: option header: %w", ErrProtocol, err)
		}
		if m := binary.BigEndian.Uint64(b[0:]); m != optMagic {
			return false, fmt.Errorf("%w: option magic %#x", ErrProtocol, m)
		}
		opt, n := binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:])
		if !fixed && opt != optExportName {
			// Plain newstyle knows no option replies: all we can do is close.
			return false, fmt.Errorf("%w: option %d without fixed newstyle", ErrProtocol, opt)
		}
		known := opt == optExportName || opt == optAbort || opt == optList || opt == optInfo || opt == optGo
		if !known || n > maxOptionData {
			// Skip the data (the length is there so that we can), then say no.
			if _, err := io.CopyN(io.Discard, c.br, int64(n)); err != nil {
				return false, fmt.Errorf("%w: option %d data: %w", ErrProtocol, opt, err)
			}
			if opt == optExportName {
				return false, fmt.Errorf("%w: export name of %d bytes", ErrProtocol, n)
			}
			rep := uint32(repErrUnsup)
			if known {
				rep = repErrTooBig
			}
			if err := c.optReply(opt, rep, nil); err != nil {
				return false, err
			}
			continue
		}
		data := c.opt[:n]
		if _, err := io.ReadFull(c.br, data); err != nil {
			return false, fmt.Errorf("%w: option %d data: %w", ErrProtocol, opt, err)
		}
		switch opt {
		case optExportName:
			if !c.s.exportOK(string(data)) {
				// No way to say no to EXPORT_NAME but to close.
				return false, fmt.Errorf("%w: unknown export %q", ErrProtocol, data)
			}
			return true, c.exportNameReply()
		case optAbort:
			// Reply (the client may not read it) and close: soft disconnect.
			c.optReply(opt, repAck, nil)
			return false, nil
		case optList:
			if n != 0 {
				if err := c.optReply(opt, repErrInvalid, nil); err != nil {
					return false, err
				}
				continue
			}
			name := c.s.cfg.ExportName
			rb := binary.BigEndian.AppendUint32(c.rep[:0], uint32(len(name)))
			if err := c.optReply(opt, repServer, append(rb, name...)); err != nil {
				return false, err
			}
			if err := c.optReply(opt, repAck, nil); err != nil {
				return false, err
			}
		case optInfo, optGo:
			goOn, err := c.infoGo(opt, data)
			if err != nil || goOn {
				return goOn, err
			}
		}
	}
}

// infoGo answers NBD_OPT_INFO or NBD_OPT_GO: NBD_INFO_EXPORT and
// NBD_INFO_BLOCK_SIZE always (we have block size constraints, so we say
// so whether asked or not, as the spec allows), NBD_INFO_NAME and
// NBD_INFO_DESCRIPTION when asked, then NBD_REP_ACK. It returns true when
// transmission starts (GO).
func (c *conn) infoGo(opt uint32, data []byte) (bool, error) {
	// Data: name length (32), name, number of info requests (16), requests (16 each).
	if len(data) < 6 {
		return false, c.optReply(opt, repErrInvalid, nil)
	}
	nl := binary.BigEndian.Uint32(data)
	if uint64(nl) > uint64(len(data)-6) {
		return false, c.optReply(opt, repErrInvalid, nil)
	}
	name := data[4 : 4+nl]
	rest := data[4+nl:]
	nreq := int(binary.BigEndian.Uint16(rest))
	if len(rest) != 2+2*nreq {
		return false, c.optReply(opt, repErrInvalid, nil)
	}
	if !c.s.exportOK(string(name)) {
		return false, c.optReply(opt, repErrUnknown, nil)
	}
	var wantName, wantDesc bool
	for i := 0; i < nreq; i++ {
		switch binary.BigEndian.Uint16(rest[2+2*i:]) {
		case infoName:
			wantName = true
		case infoDescription:
			wantDesc = true
		}
	}
	rb := binary.BigEndian.AppendUint16(c.rep[:0], infoExport)
	rb = binary.BigEndian.AppendUint64(rb, c.s.size)
	rb = binary.BigEndian.AppendUint16(rb, c.s.flags)
	if err := c.optReply(opt, repInfo, rb); err != nil {
		return false, err
	}
	rb = binary.BigEndian.AppendUint16(c.rep[:0], infoBlockSize)
	rb = binary.BigEndian.AppendUint32(rb, c.s.bs)                     // minimum: the logical block
	rb = binary.BigEndian.AppendUint32(rb, max(c.s.bs, 4096))          // preferred: no read-modify-write below a page
	rb = binary.BigEndian.AppendUint32(rb, uint32(c.s.cfg.MaxRequest)) // maximum payload
	if err := c.optReply(opt, repInfo, rb); err != nil {
		return false, err
	}
	if wantName {
		rb = binary.BigEndian.AppendUint16(c.rep[:0], infoName)
		if err := c.optReply(opt, repInfo, append(rb, c.s.cfg.ExportName...)); err != nil {
			return false, err
		}
	}
	if wantDesc && c.s.cfg.Description != "" {
		rb = binary.BigEndian.AppendUint16(c.rep[:0], infoDescription)
		if err := c.optReply(opt, repInfo, append(rb, c.s.cfg.Description...)); err != nil {
			return false, err
		}
	}
	if err := c.optReply(opt, repAck, nil); err != nil {
		return false, err
	}
	return opt == optGo, nil
}

// optReply sends one option reply: magic, option, type, length, data.
func (c *conn) optReply(opt, typ uint32, data []byte) error {
	var h [20]byte
	binary.BigEndian.PutUint64(h[0:], optReplyMagic)
	binary.BigEndian.PutUint32(h[8:], opt)
	binary.BigEndian.PutUint32(h[12:], typ)
	binary.BigEndian.PutUint32(h[16:], uint32(len(data)))
	if _, err := c.nc.Write(append(h[:], data...)); err != nil {
		return err
	}
	return nil
}

// exportNameReply answers NBD_OPT_EXPORT_NAME: size, transmission flags
// and 124 zero bytes unless the client negotiated NBD_FLAG_C_NO_ZEROES.
func (c *conn) exportNameReply() error {
	var b [8 + 2 + 124]byte
	binary.BigEndian.PutUint64(b[0:], c.s.size)
	binary.BigEndian.PutUint16(b[8:], c.s.flags)
	n := len(b)
	if c.noZeroes {
		n = 10
	}
	_, err := c.nc.Write(b[:n])
	return err
}

// exportOK reports whether name is our export ("" is the default one).
func (s *Server) exportOK(name string) bool {
	return name == "" || name == s.cfg.ExportName
}
