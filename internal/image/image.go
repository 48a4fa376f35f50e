// Package image reads and writes blk-image/1, the stream a snapshot is
// exported as and imported from (docs/snapshots.md §5.2): a 4 KiB JSON
// header padded with zeros, records of data or zeros in increasing LBA
// order, an end record, and the SHA-256 of everything before it.
//
// The stream is read and written front to back, so it works on a pipe
// (stdout, an HTTP body). The reader checks every field against the
// header before it uses it: a corrupted or truncated stream is an error
// wrapping ErrFormat, ErrChecksum or io.ErrUnexpectedEOF, never a panic,
// and no length read from the stream sizes an allocation.
//
// It must never know about volumes, stores or the network: it is the
// format only.
package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"unicode/utf8"
)

// Magic names the format and its version, the header's "magic".
const Magic = "blk-image/1"

// HeaderSize is the bytes of the header, JSON then zeros.
const HeaderSize = 4096

// RecordSize is the bytes of a record's head: kind, 7 zero bytes, lba,
// blocks (little-endian).
const RecordSize = 24

// ChecksumSize is the bytes of the trailer, a SHA-256.
const ChecksumSize = sha256.Size

// MaxSizeBytes bounds an image's volume size (1 PiB, above any volume
// the store makes), so that no count read from a stream overflows.
const MaxSizeBytes = 1 << 50

// maxNameLen bounds every name in the header.
const maxNameLen = 255

// Kind is a record's kind.
type Kind uint8

// Record kinds.
const (
	KindData Kind = 1 // blocks of data follow
	KindZero Kind = 2 // the blocks read zeros
	KindEnd  Kind = 3 // the last record: the checksum follows
)

func (k Kind) String() string {
	switch k {
	case KindData:
		return "data"
	case KindZero:
		return "zero"
	case KindEnd:
		return "end"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Errors. Every error of a Reader or Writer wraps one of these or
// io.ErrUnexpectedEOF (a truncated stream) or the underlying I/O error.
var (
	// ErrFormat: the stream is not a valid blk-image/1 (a bad header or
	// record), or a Writer was asked to write one that would not be.
	ErrFormat = errors.New("image: invalid blk-image/1 stream")
	// ErrChecksum: the stream parsed but its SHA-256 trailer does not
	// match what was read: bytes were changed on the way.
	ErrChecksum = errors.New("image: checksum mismatch")
)

// Base names the snapshot a diff image is relative to.
type Base struct {
	Name string `json:"name"`
	ID   uint64 `json:"id"`
}

// Header is an image's header. Cluster and the IDs say where the image
// came from: an import records "Cluster/SnapshotID" as its snapshot's
// origin, which is what the next diff's Base is matched against.
type Header struct {
	Magic      string `json:"magic"`             // Magic; NewWriter fills it in
	Cluster    string `json:"cluster,omitempty"` // the exporting cluster's ID
	Volume     string `json:"volume"`
	Snapshot   string `json:"snapshot"`
	SnapshotID uint64 `json:"snapshot_id"`
	SizeBytes  uint64 `json:"size_bytes"` // a positive multiple of BlockSize, at most MaxSizeBytes
	BlockSize  uint32 `json:"block_size"` // 512 or 4096
	// Base is the snapshot a diff is taken since; nil: a full image
	// (every block the snapshot reads data at; the rest reads zeros).
	Base *Base `json:"base,omitempty"`
	// DataBytes is the bytes of data the records carry, known before
	// the first is written (progress needs it).
	DataBytes uint64 `json:"data_bytes"`
}

// Blocks is the image's size in blocks.
func (h *Header) Blocks() uint64 { return h.SizeBytes / uint64(h.BlockSize) }

// Origin is the string an imported snapshot records as its origin, and
// a diff's base is matched against: "cluster/snapshot ID".
func (h *Header) Origin() string { return fmt.Sprintf("%s/%d", h.Cluster, h.SnapshotID) }

// BaseOrigin is Origin for the image's base ("" for a full image).
func (h *Header) BaseOrigin() string {
	if h.Base == nil {
		return ""
	}
	return fmt.Sprintf("%s/%d", h.Cluster, h.Base.ID)
}

// Check says what is wrong with h, wrapping ErrFormat.
func (h *Header) Check() error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: header: %s", ErrFormat, fmt.Sprintf(f, a...))
	}
	switch {
	case h.Magic != Magic:
		return bad("magic %q, want %q", clip(h.Magic), Magic)
	case h.BlockSize != 512 && h.BlockSize != 4096:
		return bad("block size %d, want 512 or 4096", h.BlockSize)
	case h.SizeBytes == 0 || h.SizeBytes%uint64(h.BlockSize) != 0 || h.SizeBytes > MaxSizeBytes:
		return bad("size %d bytes: want a positive multiple of the block size %d, at most %d", h.SizeBytes, h.BlockSize, uint64(MaxSizeBytes))
	case h.DataBytes > h.SizeBytes || h.DataBytes%uint64(h.BlockSize) != 0:
		return bad("data bytes %d: want a multiple of the block size %d, at most the size %d", h.DataBytes, h.BlockSize, h.SizeBytes)
	case h.SnapshotID == 0:
		return bad("snapshot ID 0")
	case h.Base != nil && h.Base.ID == 0:
		return bad("base snapshot ID 0")
	case h.Base != nil && h.Base.ID == h.SnapshotID:
		return bad("base snapshot ID %d is the snapshot's own", h.Base.ID)
	}
	names := []struct{ what, s string }{{"cluster", h.Cluster}, {"volume", h.Volume}, {"snapshot", h.Snapshot}}
	if h.Base != nil {
		names = append(names, struct{ what, s string }{"base name", h.Base.Name})
	}
	for _, n := range names {
		if err := checkName(n.s); err != nil {
			return bad("%s %q: %v", n.what, clip(n.s), err)
		}
	}
	if h.Volume == "" || h.Snapshot == "" {
		return bad("volume and snapshot names are required")
	}
	return nil
}

func checkName(s string) error {
	if len(s) > maxNameLen {
		return fmt.Errorf("longer than %d bytes", maxNameLen)
	}
	if !utf8.ValidString(s) {
		return errors.New("not UTF-8")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return errors.New("a control character")
		}
	}
	return nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// encodeHeader is h as its HeaderSize bytes.
func encodeHeader(h *Header) ([]byte, error) {
	j, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrFormat, err)
	}
	if len(j) > HeaderSize {
		return nil, fmt.Errorf("%w: header: %d bytes of JSON, more than %d", ErrFormat, len(j), HeaderSize)
	}
	b := make([]byte, HeaderSize)
	copy(b, j)
	return b, nil
}

// decodeHeader parses and checks a header block.
func decodeHeader(b []byte) (Header, error) {
	var h Header
	n := bytes.IndexByte(b, 0)
	if n < 0 {
		n = len(b)
	}
	for _, c := range b[n:] {
		if c != 0 {
			return h, fmt.Errorf("%w: header: bytes after its JSON are not zeros", ErrFormat)
		}
	}
	if n == 0 || b[0] != '{' {
		return h, fmt.Errorf("%w: header: not a blk-image/1 stream (no JSON header; want magic %q)", ErrFormat, Magic)
	}
	dec := json.NewDecoder(bytes.NewReader(b[:n]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return h, fmt.Errorf("%w: header: %v", ErrFormat, err)
	}
	if dec.More() {
		return h, fmt.Errorf("%w: header: more than one JSON value", ErrFormat)
	}
	if err := h.Check(); err != nil {
		return h, err
	}
	return h, nil
}

// record is a record's head.
type record struct {
	kind   Kind
	lba    uint64
	blocks uint64
}

func (r record) put(b []byte) {
	b[0] = byte(r.kind)
	clear(b[1:8])
	binary.LittleEndian.PutUint64(b[8:], r.lba)
	binary.LittleEndian.PutUint64(b[16:], r.blocks)
}

// hashWriter writes to w and to the running hash.
type hashWriter struct {
	w   io.Writer
	sum hash.Hash
	n   uint64
}

func (h *hashWriter) Write(p []byte) (int, error) {
	n, err := h.w.Write(p)
	h.sum.Write(p[:n])
	h.n += uint64(n)
	return n, err
}
