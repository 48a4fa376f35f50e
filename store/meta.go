package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/bits"
)

// ID is a volume's stable identifier, chosen by the caller and unique in
// one store.
type ID uint64

// State is a volume's persisted administrative state.
type State uint8

const (
	// StateOnline: the volume serves reads and writes.
	StateOnline State = 1
	// StateReadOnly: the volume serves reads; writes fail with ErrReadOnly.
	StateReadOnly State = 2
	// stateDeleting is persisted (synced) before Delete releases a
	// volume's clusters, so that Open finishes a delete a crash
	// interrupted. Never visible through Info.
	stateDeleting State = 3
	// stateMerging is persisted (synced) before Delete merges a snapshot
	// into its one child (docs/snapshots.md §1.6), so that Open finishes
	// the merge. Never visible through Info.
	stateMerging State = 4
)

// Kind says what an object of the store is (docs/snapshots.md §1.1): a
// volume (writable: a plain volume or a clone) or a snapshot (read-only,
// a parent of other objects).
type Kind uint8

const (
	// KindVolume: a writable volume, with or without a parent.
	KindVolume Kind = 0
	// KindSnapshot: a read-only point-in-time copy; its writes and
	// SetState fail.
	KindSnapshot Kind = 1
)

func (k Kind) String() string {
	switch k {
	case KindVolume:
		return "volume"
	case KindSnapshot:
		return "snapshot"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MarshalText makes a Kind read as its name in JSON ("volume",
// "snapshot").
func (k Kind) MarshalText() ([]byte, error) {
	if k > KindSnapshot {
		return nil, fmt.Errorf("kind %d: %w", uint8(k), ErrInvalid)
	}
	return []byte(k.String()), nil
}

// UnmarshalText reads what MarshalText writes.
func (k *Kind) UnmarshalText(b []byte) error {
	switch string(b) {
	case "volume":
		*k = KindVolume
	case "snapshot":
		*k = KindSnapshot
	default:
		return fmt.Errorf("kind %q, want volume or snapshot: %w", b, ErrInvalid)
	}
	return nil
}

func (s State) String() string {
	switch s {
	case StateOnline:
		return "online"
	case StateReadOnly:
		return "read-only"
	case stateDeleting:
		return "deleting"
	case stateMerging:
		return "merging"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

func (s State) valid() bool { return s == StateOnline || s == StateReadOnly }

// Block sizes a volume may have.
const (
	BlockSize4K      = 4096
	BlockSize512     = 512
	DefaultBlockSize = BlockSize4K
)

// MaxSizeBytes bounds a volume's size: 4 PiB keeps the top level of a
// volume's in-memory map (one pointer per 2^18 clusters) at 2 MiB for the
// largest thin volume at 64 KiB clusters.
const MaxSizeBytes = 1 << 52

// Info describes a volume or a snapshot.
type Info struct {
	ID        ID     `json:"id"`
	SizeBytes uint64 `json:"size_bytes"`
	BlockSize uint32 `json:"block_size"`
	State     State  `json:"state"`
	// Kind: a volume or a snapshot.
	Kind Kind `json:"kind"`
	// Parent is the snapshot this object reads through where it has no
	// cluster of its own; 0: none.
	Parent ID `json:"parent,omitempty"`
}

// Blocks returns the capacity in blocks.
func (i Info) Blocks() uint64 { return i.SizeBytes / uint64(i.BlockSize) }

// volumeRecord is what 'V'|id holds, in one of two encodings. Version 1
// (24 bytes) is a volume with no parent: a store that never used
// snapshots writes only these, so it still opens with releases before
// them. Version 2 (40 bytes) is written for snapshots and for objects
// with a parent or a revert token (docs/snapshots.md §1.2); older
// releases refuse it as corrupt, the safe side.
//
//	[0]      encoding version (1 or 2)
//	[1]      log2(block size)
//	[2]      State (stateDeleting included)
//	[3]      (v2) Kind; zero in v1
//	[4:8]    zero
//	[8:16]   size in bytes, big-endian
//	[16:24]  map ID, big-endian: the object's ID for a volume Create made;
//	         from the 'N' counter for the maps snapshots, clones and
//	         reverts make
//	[24:32]  (v2) parent object ID, 0: none
//	[32:40]  (v2) revert token: the registry index of the last revert
//	         applied (Store.Revert)
type volumeRecord struct {
	info  Info
	mapID uint64
	token uint64
}

const (
	volumeRecordLen   = 24
	volumeRecordLenV2 = 40
)

func (r volumeRecord) encode() []byte {
	n, ver := volumeRecordLen, byte(1)
	if r.info.Kind != KindVolume || r.info.Parent != 0 || r.token != 0 {
		n, ver = volumeRecordLenV2, 2
	}
	v := make([]byte, n)
	v[0] = ver
	v[1] = byte(bits.TrailingZeros32(r.info.BlockSize))
	v[2] = byte(r.info.State)
	binary.BigEndian.PutUint64(v[8:16], r.info.SizeBytes)
	binary.BigEndian.PutUint64(v[16:24], r.mapID)
	if ver == 2 {
		v[3] = byte(r.info.Kind)
		binary.BigEndian.PutUint64(v[24:32], uint64(r.info.Parent))
		binary.BigEndian.PutUint64(v[32:40], r.token)
	}
	return v
}

func decodeVolumeRecord(id ID, v []byte) (volumeRecord, error) {
	ok := len(v) == volumeRecordLen && v[0] == 1 || len(v) == volumeRecordLenV2 && v[0] == 2
	if !ok {
		return volumeRecord{}, fmt.Errorf("volume %d: record of %d bytes: %w", id, len(v), ErrCorrupt)
	}
	r := volumeRecord{
		info: Info{ID: id, BlockSize: 1 << (v[1] & 31), State: State(v[2]),
			SizeBytes: binary.BigEndian.Uint64(v[8:16])},
		mapID: binary.BigEndian.Uint64(v[16:24]),
	}
	if v[0] == 2 {
		r.info.Kind = Kind(v[3])
		r.info.Parent = ID(binary.BigEndian.Uint64(v[24:32]))
		r.token = binary.BigEndian.Uint64(v[32:40])
	}
	if err := checkShape(r.info.SizeBytes, r.info.BlockSize); err != nil ||
		(!r.info.State.valid() && r.info.State != stateDeleting && r.info.State != stateMerging) ||
		r.info.Kind > KindSnapshot || (r.info.Parent != 0 && r.info.Parent == id) ||
		(r.info.Kind == KindSnapshot && r.info.State == StateOnline) {
		return volumeRecord{}, fmt.Errorf("volume %d: record %+v: %w", id, r.info, ErrCorrupt)
	}
	return r, nil
}

// CheckShape says whether Create would accept size and blockSize.
func CheckShape(size uint64, blockSize uint32) error { return checkShape(size, blockSize) }

func checkShape(size uint64, blockSize uint32) error {
	if blockSize != BlockSize4K && blockSize != BlockSize512 {
		return fmt.Errorf("block size %d, want %d or %d: %w", blockSize, BlockSize4K, BlockSize512, ErrInvalid)
	}
	if size == 0 || size > MaxSizeBytes || size%uint64(blockSize) != 0 {
		return fmt.Errorf("size %d bytes, want a positive multiple of %d up to %d: %w",
			size, blockSize, uint64(MaxSizeBytes), ErrInvalid)
	}
	return nil
}

// formatRecord is what 'F' holds and, with a checksum, what the area's
// header (the first bytes of cluster 0) holds: both must name the same
// store, so a store never runs on another store's area.
//
//	[0:16]   magic "blk-store/1" (data area in a file), "blk-store/2"
//	         (on a block device zeroed whole at creation) or "blk-store/3"
//	         (an area zeroed lazily: its free clusters read zeros only
//	         below the 'Z' key's watermark), padded with zeros
//	[16]     state: 1 creating (the area is not initialised yet), 2 ready
//	[17]     log2(cluster size)
//	[18]     area kind: 0 file (always, in /1), 1 block device (always,
//	         in /2); either in /3
//	[19:24]  zero
//	[24:32]  clusters in the area, big-endian (cluster 0 is the header)
//	[32:48]  store UUID (random)
//	[48:52]  CRC-32C of [0:48] (in the area header only)
//	[48:]    the device's path at creation (in 'F' of a device store only; for
//	         messages: paths change across reboots, the UUID decides)
//
// A file store keeps "blk-store/1", byte for byte what releases before
// block devices wrote, so it still opens with them; a device store is
// "/2", which they refuse as not a store of theirs rather than look for
// an area file. A store created on a device by this release is "/3"
// (lazy): the releases that wrote "/2" refuse it rather than hand out
// clusters above its watermark as if they read zeros (a previous
// owner's data would show through a partial first write).
type formatRecord struct {
	state    uint8
	clusterL uint8
	device   bool
	lazy     bool // the area's clusters are zeroed as they are first handed out (docs/store.md, "Zeroed watermark")
	clusters uint64
	uuid     [16]byte
	path     string // device stores: the device at creation
}

const (
	formatLen      = 48
	headerLen      = 52
	formatCreating = 1
	formatReady    = 2
	areaKindFile   = 0
	areaKindDevice = 1
	maxDevicePath  = 4096
)

var (
	formatMagic       = [16]byte{'b', 'l', 'k', '-', 's', 't', 'o', 'r', 'e', '/', '1'}
	formatMagicDevice = [16]byte{'b', 'l', 'k', '-', 's', 't', 'o', 'r', 'e', '/', '2'}
	formatMagicLazy   = [16]byte{'b', 'l', 'k', '-', 's', 't', 'o', 'r', 'e', '/', '3'}
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (f formatRecord) encode(dst []byte) {
	clear(dst[:formatLen])
	copy(dst[0:16], formatMagic[:])
	if f.device {
		copy(dst[0:16], formatMagicDevice[:])
		dst[18] = areaKindDevice
	}
	if f.lazy {
		copy(dst[0:16], formatMagicLazy[:])
	}
	dst[16] = f.state
	dst[17] = f.clusterL
	binary.BigEndian.PutUint64(dst[24:32], f.clusters)
	copy(dst[32:48], f.uuid[:])
}

// record is the value of the 'F' key.
func (f formatRecord) record() []byte {
	v := make([]byte, formatLen, formatLen+len(f.path))
	f.encode(v)
	if f.device {
		v = append(v, f.path...)
	}
	return v
}

func decodeFormat(v []byte) (formatRecord, error) {
	if len(v) < formatLen {
		return formatRecord{}, fmt.Errorf("format record %q: not a blk store: %w", v, ErrCorrupt)
	}
	magic := [16]byte(v[0:16])
	if magic != formatMagic && magic != formatMagicDevice && magic != formatMagicLazy {
		return formatRecord{}, fmt.Errorf("format record %q: not a blk store: %w", bytes.TrimRight(v[:16], "\x00"), ErrCorrupt)
	}
	f := formatRecord{state: v[16], clusterL: v[17], device: magic == formatMagicDevice, lazy: magic == formatMagicLazy,
		clusters: binary.BigEndian.Uint64(v[24:32]), uuid: [16]byte(v[32:48])}
	if f.lazy {
		f.device = v[18] == areaKindDevice
	}
	kind := byte(areaKindFile)
	if f.device {
		kind = areaKindDevice
		f.path = string(v[formatLen:min(len(v), formatLen+maxDevicePath)])
	}
	if (f.state != formatCreating && f.state != formatReady) || f.clusterL < minClusterShift || f.clusterL > maxClusterShift ||
		f.clusters < 2 || v[18] != kind {
		return formatRecord{}, fmt.Errorf("format record %+v: %w", f, ErrCorrupt)
	}
	return f, nil
}

// encodeHeader writes the area header (the format record and its CRC).
func (f formatRecord) encodeHeader(dst []byte) {
	f.encode(dst)
	binary.BigEndian.PutUint32(dst[formatLen:headerLen], crc32.Checksum(dst[:formatLen], castagnoli))
}

func decodeHeader(b []byte) (formatRecord, error) {
	if crc32.Checksum(b[:formatLen], castagnoli) != binary.BigEndian.Uint32(b[formatLen:headerLen]) {
		return formatRecord{}, fmt.Errorf("data area header: bad checksum (not this store's area, or never initialised): %w", ErrCorrupt)
	}
	return decodeFormat(b[:formatLen])
}
