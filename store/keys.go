package store

import "encoding/binary"

// Key families (docs/store.md, "Pebble keys"). Upper case, so they never
// meet target/volume's lower-case 'd', 'f' and 'm' in the same pebble
// directory (the upgrade path keeps both readable).
const (
	familyFormat   = 'F' // 'F' -> formatRecord
	familyVolume   = 'V' // 'V' | volume ID -> volume record
	familyMap      = 'X' // 'X' | map ID | cluster index -> physical cluster
	familyReserved = 'R' // 'R' | physical cluster -> (empty): may hold bytes no map names
	familyZeroed   = 'Z' // 'Z' -> zeroed watermark (lazily zeroed areas only): clusters below it read zeros when free
	familyNextMap  = 'N' // 'N' -> the next map ID a snapshot, clone or revert takes (docs/snapshots.md §1.2)
)

// firstMapID is the first map ID the 'N' counter hands out: volumes made
// by Create keep map ID = their ID, and registry IDs are far below 2^62,
// so the two ranges never meet (a page's owner is never mistaken for
// another map).
const firstMapID = 1 << 62

const (
	volumeKeyLen   = 1 + 8
	mapKeyLen      = 1 + 8 + 8
	reservedKeyLen = 1 + 8
)

var (
	formatKey  = []byte{familyFormat}
	zeroedKey  = []byte{familyZeroed}
	nextMapKey = []byte{familyNextMap}
)

const zeroedValueLen = 8

// zeroedValue encodes the zeroed watermark: a cluster number, 8 bytes
// big-endian.
func zeroedValue(w uint64) []byte { return binary.BigEndian.AppendUint64(nil, w) }

func parseZeroed(v []byte) (uint64, bool) {
	if len(v) != zeroedValueLen {
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}

func volumeKey(id ID) []byte {
	k := make([]byte, volumeKeyLen)
	k[0] = familyVolume
	binary.BigEndian.PutUint64(k[1:], uint64(id))
	return k
}

func volumeKeyID(k []byte) (ID, bool) {
	if len(k) != volumeKeyLen || k[0] != familyVolume {
		return 0, false
	}
	return ID(binary.BigEndian.Uint64(k[1:])), true
}

// putMapKey writes the map key of cluster index idx of map m into dst
// (mapKeyLen bytes). Big-endian: one map is one contiguous key range in
// cluster order.
func putMapKey(dst []byte, m uint64, idx uint64) {
	_ = dst[mapKeyLen-1]
	dst[0] = familyMap
	binary.BigEndian.PutUint64(dst[1:9], m)
	binary.BigEndian.PutUint64(dst[9:17], idx)
}

// putMapEnd writes the exclusive upper bound of map m's keys.
func putMapEnd(dst []byte, m uint64) {
	_ = dst[mapKeyLen-1]
	if m == ^uint64(0) {
		dst[0] = familyMap + 1
		clear(dst[1:])
		return
	}
	putMapKey(dst, m+1, 0)
}

func parseMapKey(k []byte) (m, idx uint64, ok bool) {
	if len(k) != mapKeyLen || k[0] != familyMap {
		return 0, 0, false
	}
	return binary.BigEndian.Uint64(k[1:9]), binary.BigEndian.Uint64(k[9:17]), true
}

func putReservedKey(dst []byte, phys uint64) {
	_ = dst[reservedKeyLen-1]
	dst[0] = familyReserved
	binary.BigEndian.PutUint64(dst[1:], phys)
}

func parseReservedKey(k []byte) (uint64, bool) {
	if len(k) != reservedKeyLen || k[0] != familyReserved {
		return 0, false
	}
	return binary.BigEndian.Uint64(k[1:]), true
}

// putPhys encodes a map value, 8 bytes big-endian: the physical cluster,
// and for a partial entry its flag and sub-block mask (clustermap.go);
// 0 is a tombstone. parsePhys decodes one, refusing any other bit.
func putPhys(dst []byte, phys uint64) { binary.BigEndian.PutUint64(dst[:8], phys) }

func parsePhys(v []byte) (uint64, bool) {
	if len(v) != 8 {
		return 0, false
	}
	e := binary.BigEndian.Uint64(v)
	switch {
	case e&^(physMask|partial|maskBits) != 0:
		return 0, false // a flag a map value never holds
	case e&partial == 0 && e&maskBits != 0:
		return 0, false
	case e&partial != 0 && (maskOf(e) == 0 || physOf(e) == 0):
		return 0, false
	}
	return e, true
}
