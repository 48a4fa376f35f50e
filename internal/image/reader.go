package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
)

// Record is a record as read: Kind, and for data and zero records the
// run of blocks it covers.
type Record struct {
	Kind   Kind
	LBA    uint64
	Blocks uint64
}

// Reader reads one image: NewReader reads and checks the header, Next
// each record in turn, Read a data record's bytes. Next returns io.EOF
// once the end record and a matching checksum have been read, and
// nothing follows them; only then has the whole stream been verified.
type Reader struct {
	r    io.Reader
	sum  hash.Hash
	h    Header
	next uint64 // the first LBA the next record may start at
	data uint64 // data bytes announced by records so far
	left uint64 // bytes of the current data record not yet read
	read uint64 // bytes read from r
	rec  [RecordSize]byte
	err  error // sticky
	skip []byte
}

// NewReader reads the header from r and checks it.
func NewReader(r io.Reader) (*Reader, error) {
	ir := &Reader{r: r, sum: sha256.New()}
	b := make([]byte, HeaderSize)
	if err := ir.full(b, "header"); err != nil {
		return nil, err
	}
	h, err := decodeHeader(b)
	if err != nil {
		return nil, err
	}
	ir.h = h
	return ir, nil
}

// Header is the image's header.
func (r *Reader) Header() Header { return r.h }

// BytesRead is the bytes read from the stream so far.
func (r *Reader) BytesRead() uint64 { return r.read }

// full reads len(b) bytes into b and hashes them; a short stream is
// io.ErrUnexpectedEOF.
func (r *Reader) full(b []byte, what string) error {
	n, err := io.ReadFull(r.r, b)
	r.read += uint64(n)
	r.sum.Write(b[:n])
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("image: %s: the stream ends %d bytes in: %w", what, r.read, io.ErrUnexpectedEOF)
	case err != nil:
		return fmt.Errorf("image: %s: %w", what, err)
	}
	return nil
}

func (r *Reader) fail(err error) error {
	r.err = err
	return err
}

// Next reads the next record's head. A data record's bytes are read
// with Read before the following Next (what is left unread is skipped).
// At the end record Next reads and checks the checksum and returns
// io.EOF; a mismatch is ErrChecksum.
func (r *Reader) Next() (Record, error) {
	if r.err != nil {
		return Record{}, r.err
	}
	for r.left > 0 {
		if r.skip == nil {
			r.skip = make([]byte, 64<<10)
		}
		n := min(r.left, uint64(len(r.skip)))
		if err := r.full(r.skip[:n], "data"); err != nil {
			return Record{}, r.fail(err)
		}
		r.left -= n
	}
	at := r.read
	if err := r.full(r.rec[:], "record"); err != nil {
		return Record{}, r.fail(err)
	}
	rec := Record{
		Kind:   Kind(r.rec[0]),
		LBA:    binary.LittleEndian.Uint64(r.rec[8:]),
		Blocks: binary.LittleEndian.Uint64(r.rec[16:]),
	}
	bad := func(f string, a ...any) (Record, error) {
		return Record{}, r.fail(fmt.Errorf("%w: record at byte %d (%s, LBA %d, %d blocks): %s", ErrFormat, at, rec.Kind, rec.LBA, rec.Blocks, fmt.Sprintf(f, a...)))
	}
	if !bytes.Equal(r.rec[1:8], make([]byte, 7)) {
		return bad("reserved bytes not zero")
	}
	switch rec.Kind {
	case KindEnd:
		if rec.LBA != 0 || rec.Blocks != 0 {
			return bad("an end record has LBA 0 and 0 blocks")
		}
		if r.data != r.h.DataBytes {
			return bad("%d data bytes in the records, the header says %d", r.data, r.h.DataBytes)
		}
		return Record{}, r.end()
	case KindData, KindZero:
	default:
		return bad("unknown kind %d", uint8(rec.Kind))
	}
	nb := r.h.Blocks()
	switch {
	case rec.Blocks == 0:
		return bad("0 blocks")
	case rec.LBA < r.next:
		return bad("starts before the end of the previous record (LBA %d)", r.next)
	case rec.LBA > nb || rec.Blocks > nb-rec.LBA:
		return bad("past the image's %d blocks", nb)
	}
	if rec.Kind == KindData {
		n := rec.Blocks * uint64(r.h.BlockSize) // no overflow: Blocks ≤ size/block size
		if n > r.h.DataBytes-r.data {
			return bad("more data than the header's %d bytes", r.h.DataBytes)
		}
		r.data += n
		r.left = n
	}
	r.next = rec.LBA + rec.Blocks
	return rec, nil
}

// end reads the checksum after the end record and checks that the
// stream ends there.
func (r *Reader) end() error {
	want := r.sum.Sum(nil)
	var got [ChecksumSize]byte
	n, err := io.ReadFull(r.r, got[:])
	r.read += uint64(n)
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return r.fail(fmt.Errorf("image: checksum: the stream ends %d bytes in: %w", r.read, io.ErrUnexpectedEOF))
	case err != nil:
		return r.fail(fmt.Errorf("image: checksum: %w", err))
	case !bytes.Equal(got[:], want):
		return r.fail(fmt.Errorf("%w: the stream's SHA-256 is %x, its trailer says %x: the image was changed or damaged on the way", ErrChecksum, want, got))
	}
	var one [1]byte
	if n, _ := io.ReadFull(r.r, one[:]); n != 0 {
		return r.fail(fmt.Errorf("%w: bytes after the checksum", ErrFormat))
	}
	r.err = io.EOF
	return io.EOF
}

// Read reads the current data record's bytes; io.EOF at its end.
func (r *Reader) Read(p []byte) (int, error) {
	switch {
	case r.err != nil:
		return 0, r.err
	case r.left == 0:
		return 0, io.EOF
	}
	p = p[:min(uint64(len(p)), r.left)]
	n, err := r.r.Read(p)
	r.read += uint64(n)
	r.sum.Write(p[:n])
	r.left -= uint64(n)
	switch {
	case r.left > 0 && errors.Is(err, io.EOF):
		return n, r.fail(fmt.Errorf("image: data: the stream ends %d bytes in: %w", r.read, io.ErrUnexpectedEOF))
	case err != nil && !errors.Is(err, io.EOF):
		return n, r.fail(fmt.Errorf("image: data: %w", err))
	}
	return n, nil
}

// ReadData reads the whole of the current data record's remaining bytes
// into p, which must be at least that long; it returns how many.
func (r *Reader) ReadData(p []byte) (int, error) {
	n := int(min(uint64(len(p)), r.left))
	if uint64(n) < r.left {
		return 0, fmt.Errorf("image: a buffer of %d bytes for a record of %d", len(p), r.left)
	}
	_, err := io.ReadFull(r, p[:n])
	return n, err
}
