package repl

import (
	"math/bits"
	"sync/atomic"

	"github.com/blk-project/blk/target"
)

// The dirty-region log (DRL, docs/replication.md §5): from the moment a
// replica stops being in sync (its first missed write: peer.missed), the
// Backend keeps a bitmap for its node, a bit per region, set for every
// write, write zeroes and deallocate the replica may lack, so that a
// rebuild (StartRebuild with UseDirtyLog) copies only those regions.
//
// What is marked. A record marks its regions in every log of the
// backend when it finishes (all legs done, before the host's completion
// and before its use ends, so a copier's quiesce sees the mark), unless
// its leg to that log's node completed without error and the log already
// existed when the write started. So it marks:
//   - the write whose failure dropped the replica, and any other failed
//     leg (peer.missed creates the log before the peer leaves its state,
//     so every failed or skipped leg finds it at finish);
//   - every write in flight to the replica when the log was created,
//     whatever its leg's outcome (it may or may not have landed);
//   - every write that skipped the replica (failing, out of sync,
//     dropped, or not in the leg set at all once the registry took it
//     out), and the rebuilding legs a failed rebuild never sent.
//
// A leg that completed without error landed on the replica: its write is
// there (a write later lost from the replica's volatile cache by a power
// cut is the intent log's, §5, not built).
//
// When a log is valid: only for a replica this Backend saw leave, at its
// current epoch. A new epoch drops every log (another primary may have
// written meanwhile); a backend that never had the replica in sync (a
// restarted primary, a new one after a failover) has none; the lead does
// not use one for a replica whose registry record says Full (its node
// lost its data). A write beyond the log's end (the volume grew after
// the log was made) makes it useless: the next rebuild is a full copy.
//
// Per write, with no log: two atomic loads (the log set at start and at
// finish). With logs: a loop over them (at most a few) and, for a region
// not yet dirty, an atomic OR into its word; an already dirty region
// costs one atomic load. No lock, no allocation: the bitmap is allocated
// when the replica leaves (a failure path), under Backend.drlMu.

// DefaultDirtyRegion is the DRL's region, Config.DirtyRegion: 64 KiB,
// the store's cluster (its allocation unit, store/doc.go), so a dirty bit
// never costs more than one cluster beyond the write itself, and a bit
// per region is 32 KiB of memory for a 16 GiB volume, 2 MiB per TiB, per
// out-of-sync replica.
const DefaultDirtyRegion = 64 << 10

// maxDirtyBits bounds a log's bitmap at 2 MiB: a volume larger than 1 TiB
// at 64 KiB gets regions of the next power of two that fits (1 MiB
// regions for 16 TiB).
const maxDirtyBits = 1 << 24

// dirtyLog is one replica's DRL.
type dirtyLog struct {
	node    string
	shift   uint   // log2 of the blocks per region
	regions uint64 // bits in use: regions of the volume when made
	words   []atomic.Uint64
	// lost: a write reached past the log's last region (the volume
	// grew): the log no longer says what the replica lacks.
	lost atomic.Bool
}

// dirtySet is the backend's logs, never changed once stored
// (Backend.drls).
type dirtySet struct {
	logs []*dirtyLog
}

func (s *dirtySet) find(node string) *dirtyLog {
	if s == nil {
		return nil
	}
	for _, d := range s.logs {
		if d.node == node {
			return d
		}
	}
	return nil
}

func (s *dirtySet) has(d *dirtyLog) bool {
	if s == nil {
		return false
	}
	for _, e := range s.logs {
		if e == d {
			return true
		}
	}
	return false
}

// newDirtyLog makes an empty log of a volume of blocks blocks of 1<<
// blockShift bytes, at regions of region bytes (a power of two) or the
// larger ones maxDirtyBits needs.
func newDirtyLog(node string, blocks uint64, blockShift uint, region int) *dirtyLog {
	shift := uint(bits.TrailingZeros(uint(region)))
	if shift < blockShift {
		shift = blockShift
	}
	shift -= blockShift
	for blocks>>shift > maxDirtyBits {
		shift++
	}
	regions := (blocks + 1<<shift - 1) >> shift
	return &dirtyLog{node: node, shift: shift, regions: regions, words: make([]atomic.Uint64, (regions+63)/64)}
}

// mark sets the regions of [lba, lba+blocks). Any goroutine, no lock.
func (d *dirtyLog) mark(lba, blocks uint64) {
	if blocks == 0 {
		return
	}
	first, last := lba>>d.shift, (lba+blocks-1)>>d.shift
	if last >= d.regions {
		d.lost.Store(true)
		if first >= d.regions {
			return
		}
		last = d.regions - 1
	}
	for w := first >> 6; w <= last>>6; w++ {
		m := wordMask(w, first, last)
		if word := &d.words[w]; word.Load()&m != m {
			word.Or(m)
		}
	}
}

// clear clears regions [first, last]: the copier, once they are on the
// replica.
func (d *dirtyLog) clear(first, last uint64) {
	last = min(last, d.regions-1)
	for w := first >> 6; first <= last && w <= last>>6; w++ {
		d.words[w].And(^wordMask(w, first, last))
	}
}

// wordMask is the bits of word w that regions [first, last] cover.
func wordMask(w, first, last uint64) uint64 {
	lo := max(first, w<<6) - w<<6
	hi := min(last, w<<6+63) - w<<6
	return ^uint64(0) >> (63 - (hi - lo)) << lo
}

// dirty reports whether region i is set.
func (d *dirtyLog) dirty(i uint64) bool {
	return i < d.regions && d.words[i>>6].Load()&(1<<(i&63)) != 0
}

// next is the first dirty region in [i, end), or end.
func (d *dirtyLog) next(i, end uint64) uint64 {
	end = min(end, d.regions)
	for i < end {
		w := d.words[i>>6].Load() >> (i & 63)
		if w != 0 {
			return min(i+uint64(bits.TrailingZeros64(w)), end)
		}
		i = (i | 63) + 1
	}
	return end
}

// bytes is the size of the dirty regions of a volume of blocks blocks
// (the last region clipped at the volume's end).
func (d *dirtyLog) bytes(blocks uint64, blockShift uint) uint64 {
	var n uint64
	for i := range d.words {
		n += uint64(bits.OnesCount64(d.words[i].Load()))
	}
	n <<= d.shift + blockShift
	if last := d.regions - 1; blocks < d.regions<<d.shift && d.dirty(last) {
		n -= (d.regions<<d.shift - blocks) << blockShift
	}
	return n
}

// keepDirty makes sure p's node has a log (peer.missed, before the peer
// leaves its in-sync or promoting state: every write that fails or
// skips it from then on finds the log when it finishes). Only for a
// peer of the current epoch: an older epoch's peer failing after
// SetPeers moved on must not start a log that lacks the writes of the
// new epoch its node may have missed already (SetPeers drops the logs
// after storing the new set, under drlMu, so one of the two sees the
// other).
func (b *Backend) keepDirty(p *peer) {
	if b.drls.Load().find(p.node) != nil {
		return
	}
	b.drlMu.Lock()
	defer b.drlMu.Unlock()
	old := b.drls.Load()
	if old.find(p.node) != nil || b.set.Load().epoch != p.epoch {
		return
	}
	s := &dirtySet{}
	if old != nil {
		s.logs = append(s.logs, old.logs...)
	}
	s.logs = append(s.logs, newDirtyLog(p.node, b.blocks.Load(), b.shift, b.dirtyRegion))
	b.drls.Store(s)
}

// dropDirtyLocked forgets node's log. Under drlMu.
func (b *Backend) dropDirtyLocked(node string) {
	old := b.drls.Load()
	if old.find(node) == nil {
		return
	}
	s := &dirtySet{}
	for _, d := range old.logs {
		if d.node != node {
			s.logs = append(s.logs, d)
		}
	}
	if len(s.logs) == 0 {
		s = nil
	}
	b.drls.Store(s)
}

// DropDirtyLog forgets node's dirty-region log: for a replica removed
// from the volume (its next rebuild, if any, is then a full copy).
func (b *Backend) DropDirtyLog(node string) {
	b.drlMu.Lock()
	b.dropDirtyLocked(node)
	b.drlMu.Unlock()
}

// DirtyBytes returns the bytes of the volume that node's dirty-region
// log marks, and whether the backend keeps a usable one: it saw the
// replica leave at its current epoch, and no write fell outside the
// log. Without one (false), a rebuild of node is a full copy.
func (b *Backend) DirtyBytes(node string) (uint64, bool) {
	d := b.drls.Load().find(node)
	if d == nil || d.lost.Load() {
		return 0, false
	}
	return d.bytes(b.blocks.Load(), b.shift), true
}

// markDirty marks the record's write in every log of s it may not have
// reached (see the top of the file). From finish, every leg done.
func (r *record) markDirty(s *dirtySet) {
	io := r.host
	var n uint64
	switch io.Op {
	case target.OpWrite:
		n = uint64(len(io.Data)) >> r.b.shift
	case target.OpWriteZeroes, target.OpDeallocate:
		n = io.Blocks
	default:
		return
	}
	reached := r.reached.Load()
	for _, d := range s.logs {
		if !r.landed(d, reached) {
			d.mark(io.LBA, n)
		}
	}
}

// landed reports whether the record's write is on d's replica: its leg
// there completed without error, and d existed when it started.
func (r *record) landed(d *dirtyLog, reached uint32) bool {
	if reached == 0 || !r.drls.has(d) {
		return false
	}
	for i, p := range r.set.peers {
		if p.node == d.node {
			return reached&(1<<i) != 0
		}
	}
	return false
}
