package image

import (
	"crypto/sha256"
	"fmt"
	"io"
)

// Writer writes one image. Records go in increasing LBA order, without
// overlap, and the data they carry must add up to the header's
// DataBytes; Close writes the end record and the checksum. A Writer
// refuses (ErrFormat) what a Reader would refuse, so a stream it
// finishes always reads back.
type Writer struct {
	hw   hashWriter
	h    Header
	next uint64 // the first LBA a record may start at
	data uint64 // data bytes written
	rec  [RecordSize]byte
	err  error // sticky: the stream is unusable after a failed write
	done bool
}

// NewWriter checks h, fills in its Magic and writes its header to w.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	h.Magic = Magic
	if err := h.Check(); err != nil {
		return nil, err
	}
	b, err := encodeHeader(&h)
	if err != nil {
		return nil, err
	}
	iw := &Writer{hw: hashWriter{w: w, sum: sha256.New()}, h: h}
	if _, err := iw.hw.Write(b); err != nil {
		return nil, fmt.Errorf("image: write header: %w", err)
	}
	return iw, nil
}

// Header is the header written.
func (w *Writer) Header() Header { return w.h }

// Written is the bytes written so far.
func (w *Writer) Written() uint64 { return w.hw.n }

// DataWritten is the data bytes written so far.
func (w *Writer) DataWritten() uint64 { return w.data }

func (w *Writer) check(kind Kind, lba, blocks uint64) error {
	switch {
	case w.err != nil:
		return w.err
	case w.done:
		return fmt.Errorf("%w: %s record after the end", ErrFormat, kind)
	case blocks == 0:
		return fmt.Errorf("%w: %s record of 0 blocks at LBA %d", ErrFormat, kind, lba)
	case lba < w.next:
		return fmt.Errorf("%w: %s record at LBA %d before the end of the previous one (%d): records go in increasing LBA order", ErrFormat, kind, lba, w.next)
	case lba > w.h.Blocks() || blocks > w.h.Blocks()-lba:
		return fmt.Errorf("%w: %s record of %d blocks at LBA %d past the image's %d blocks", ErrFormat, kind, blocks, lba, w.h.Blocks())
	}
	return nil
}

func (w *Writer) head(r record) error {
	r.put(w.rec[:])
	if _, err := w.hw.Write(w.rec[:]); err != nil {
		w.err = fmt.Errorf("image: write %s record: %w", r.kind, err)
		return w.err
	}
	return nil
}

// Data writes a data record: p's blocks, from lba. len(p) must be a
// positive multiple of the block size.
func (w *Writer) Data(lba uint64, p []byte) error {
	bs := uint64(w.h.BlockSize)
	if uint64(len(p))%bs != 0 {
		return fmt.Errorf("%w: data record of %d bytes, not a multiple of the block size %d", ErrFormat, len(p), bs)
	}
	blocks := uint64(len(p)) / bs
	if err := w.check(KindData, lba, blocks); err != nil {
		return err
	}
	if uint64(len(p)) > w.h.DataBytes-w.data {
		return fmt.Errorf("%w: data record of %d bytes at LBA %d: more data than the header's %d bytes", ErrFormat, len(p), lba, w.h.DataBytes)
	}
	if err := w.head(record{KindData, lba, blocks}); err != nil {
		return err
	}
	if _, err := w.hw.Write(p); err != nil {
		w.err = fmt.Errorf("image: write data at LBA %d: %w", lba, err)
		return w.err
	}
	w.next = lba + blocks
	w.data += uint64(len(p))
	return nil
}

// Zero writes a zero record: blocks from lba read zeros.
func (w *Writer) Zero(lba, blocks uint64) error {
	if err := w.check(KindZero, lba, blocks); err != nil {
		return err
	}
	if err := w.head(record{KindZero, lba, blocks}); err != nil {
		return err
	}
	w.next = lba + blocks
	return nil
}

// Close writes the end record and the checksum. It does not close the
// underlying writer. ErrFormat if less data was written than the header
// says (the image would not read back).
func (w *Writer) Close() error {
	switch {
	case w.err != nil:
		return w.err
	case w.done:
		return nil
	case w.data != w.h.DataBytes:
		return fmt.Errorf("%w: %d data bytes written, the header says %d", ErrFormat, w.data, w.h.DataBytes)
	}
	if err := w.head(record{kind: KindEnd}); err != nil {
		return err
	}
	sum := w.hw.sum.Sum(nil)
	if _, err := w.hw.w.Write(sum); err != nil {
		w.err = fmt.Errorf("image: write checksum: %w", err)
		return w.err
	}
	w.hw.n += uint64(len(sum))
	w.done = true
	return nil
}
