package volume

import "encoding/binary"

// Key families. The first byte of every key names its family, so the
// families never interleave and a range over one family can never reach
// another. See the key layout in doc.go.
const (
	familyFormat = 'f' // the store's format record: one key, "f"
	familyData   = 'd' // block data: 'd' | volume ID | LBA
	familyMeta   = 'm' // volume metadata: 'm' | volume ID
)

const (
	// dataKeyLen is the length of a block key: family byte, 8-byte
	// big-endian volume ID, 8-byte big-endian LBA.
	dataKeyLen = 1 + 8 + 8
	// metaKeyLen is the length of a metadata key: family byte and ID.
	metaKeyLen = 1 + 8
)

// formatKey holds the store format version (formatValue); Open refuses a
// pebble directory whose format key is missing but holds other keys, or
// whose value differs.
var formatKey = []byte{familyFormat}

// formatValue names the layout version written into formatKey.
var formatValue = []byte("blk-volume/1")

// putDataKey writes the key of block lba of volume id into dst, which must
// be dataKeyLen bytes. Big-endian ID then LBA: pebble's bytewise order is
// then volume order, then LBA order, so one volume's blocks are contiguous
// and a multi-block request is one contiguous key range.
func putDataKey(dst []byte, id ID, lba uint64) {
	_ = dst[dataKeyLen-1] // one bounds check
	dst[0] = familyData
	binary.BigEndian.PutUint64(dst[1:9], uint64(id))
	binary.BigEndian.PutUint64(dst[9:17], lba)
}

// putDataEnd writes into dst (dataKeyLen bytes) the exclusive upper bound
// of every block key of volume id: the first key of volume id+1, or, for
// the largest ID, the first key after the data family, padded with zeros.
// Either way no key of another volume is below it and none of id's above.
func putDataEnd(dst []byte, id ID) {
	_ = dst[dataKeyLen-1]
	if id == ^ID(0) {
		dst[0] = familyData + 1
		clear(dst[1:])
		return
	}
	putDataKey(dst, id+1, 0)
}

// dataKeyLBA returns the LBA of a block key of volume id, and false if key
// is not a block key of that volume (which a correctly bounded iterator
// never yields; the check costs two comparisons and guards the rule that a
// volume never reads another's data).
func dataKeyLBA(key []byte, id ID) (uint64, bool) {
	if len(key) != dataKeyLen || key[0] != familyData ||
		binary.BigEndian.Uint64(key[1:9]) != uint64(id) {
		return 0, false
	}
	return binary.BigEndian.Uint64(key[9:17]), true
}

// metaKey returns the metadata key of volume id.
func metaKey(id ID) []byte {
	k := make([]byte, metaKeyLen)
	k[0] = familyMeta
	binary.BigEndian.PutUint64(k[1:], uint64(id))
	return k
}

// metaKeyID returns the volume ID of a metadata key.
func metaKeyID(key []byte) (ID, bool) {
	if len(key) != metaKeyLen || key[0] != familyMeta {
		return 0, false
	}
	return ID(binary.BigEndian.Uint64(key[1:])), true
}
