package volume

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// ID is a volume's stable identifier, chosen by the caller (the cluster's
// meta layer) and unique within one store. It is the second component of
// every key of the volume, so it never changes for the life of the volume.
type ID uint64

// State is a volume's persisted administrative state.
type State uint8

const (
	// StateOnline: the volume serves reads and writes.
	StateOnline State = 1
	// StateReadOnly: the volume serves reads; every write, write-zeroes and
	// deallocate fails with ErrReadOnly. Flush still succeeds.
	StateReadOnly State = 2
)

func (s State) String() string {
	switch s {
	case StateOnline:
		return "online"
	case StateReadOnly:
		return "read-only"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

func (s State) valid() bool { return s == StateOnline || s == StateReadOnly }

// Block sizes a volume may have. An NVMe LBA format with 4 KiB data and
// the legacy 512-byte one; nothing else is asked for, and each extra size
// is one more case every test would have to cover.
const (
	BlockSize4K  = 4096
	BlockSize512 = 512
	// DefaultBlockSize is the block size of a volume created with
	// CreateOptions.BlockSize zero.
	DefaultBlockSize = BlockSize4K
)

// MaxSizeBytes bounds a volume's size: 2^62 bytes keeps every byte count
// representable as an int64 and every LBA sum below 2^64.
const MaxSizeBytes = 1 << 62

// Info describes a volume. It is what the metadata key holds, plus the ID.
type Info struct {
	ID        ID     `json:"id"`
	SizeBytes uint64 `json:"size_bytes"` // a multiple of BlockSize
	BlockSize uint32 `json:"block_size"` // BlockSize4K or BlockSize512
	State     State  `json:"state"`
}

// Blocks returns the volume's capacity in blocks.
func (i Info) Blocks() uint64 { return i.SizeBytes / uint64(i.BlockSize) }

// metaValueLen is the encoded length of a volume's metadata:
//
//	[0]     encoding version, metaVersion
//	[1]     log2(block size): 9 or 12
//	[2]     State
//	[3:8]   zero, reserved
//	[8:16]  size in bytes, big-endian
const metaValueLen = 16

const metaVersion = 1

func encodeMeta(dst []byte, info Info) {
	_ = dst[metaValueLen-1]
	clear(dst[:metaValueLen])
	dst[0] = metaVersion
	dst[1] = byte(bits.TrailingZeros32(info.BlockSize))
	dst[2] = byte(info.State)
	binary.BigEndian.PutUint64(dst[8:16], info.SizeBytes)
}

func decodeMeta(id ID, v []byte) (Info, error) {
	if len(v) != metaValueLen || v[0] != metaVersion {
		return Info{}, fmt.Errorf("volume %d: metadata of %d bytes, version %v: %w",
			id, len(v), v[:min(len(v), 1)], ErrCorrupt)
	}
	info := Info{
		ID:        id,
		BlockSize: 1 << (v[1] & 31),
		State:     State(v[2]),
		SizeBytes: binary.BigEndian.Uint64(v[8:16]),
	}
	if err := checkShape(info.SizeBytes, info.BlockSize); err != nil || !info.State.valid() {
		return Info{}, fmt.Errorf("volume %d: metadata %+v: %w", id, info, ErrCorrupt)
	}
	return info, nil
}

// CheckShape says whether Create would accept size and blockSize (and
// Resize the size), so a caller can refuse a request before it records
// any intent. It wraps ErrInvalid.
func CheckShape(size uint64, blockSize uint32) error { return checkShape(size, blockSize) }

// checkShape checks a block size and a size against each other.
func checkShape(size uint64, blockSize uint32) error {
	if blockSize != BlockSize4K && blockSize != BlockSize512 {
		return fmt.Errorf("block size %d, want %d or %d: %w",
			blockSize, BlockSize4K, BlockSize512, ErrInvalid)
	}
	if size == 0 || size > MaxSizeBytes || size%uint64(blockSize) != 0 {
		return fmt.Errorf("size %d bytes, want a positive multiple of %d up to %d: %w",
			size, blockSize, uint64(MaxSizeBytes), ErrInvalid)
	}
	return nil
}
