package repl

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
)

// A compare rebuild (docs/replication.md §5, "Returning primaries and
// interrupted rebuilds"): for a replica whose copy is mostly current but
// differs in places nobody recorded. A primary killed after a failover
// had writes in flight that reached its own store and not the others' (or
// the reverse) and the new primary has no log of what it missed before
// its term began; a rebuild interrupted by the primary's crash left the
// replica copied up to an unknown point; a restarted primary lost the
// dirty-region logs it kept in memory. A full copy is always right but
// moves the whole volume over the link and rewrites it on the replica.
// Instead the copier asks the replica for a digest of each region
// (SHA-256 of DigestRegionBytes, RebuildConfig.RemoteDigests), computes
// the same digests of the local copy, and copies only the regions that
// differ, each under the window protocol of rebuild.go. Bytes copied are
// those that differ, at region granularity; both sides read their whole
// allocated data once (a region unmapped on a side is not read: its digest
// is that of zeros).
//
// Why a digest compared without any window is safe. The copier first
// waits for every host write in use (a write that loaded a leg set
// without this replica); from then on every write goes to both copies.
// Look at one byte. Writes after that point land on both copies (or the
// rebuild fails: a rebuilding leg's failure ends it), so a byte that
// differs can only stop differing, never start: a write that covers it
// makes both copies hold the write's byte once it landed on both (two
// overlapping writes in flight at once may land in either order, on each
// copy as on a single disk: that is the host's race, and the same with
// no rebuild running). Now the local digest samples the byte at time t1,
// the remote one at t2. If no write covers it between the two, it held
// the same value on each side throughout, so equal samples mean equal
// bytes, now and until the next write, which reaches both. If a write
// covers it, both copies end with that write's byte. So equal digests
// (of every byte of a region) mean the region needs no copy; a region
// whose digests differ is copied under a window, as a full copy copies
// it. A digest collision of SHA-256 is not a case we handle.

const (
	// DigestRegionBytes is the region a digest covers: 64 KiB, the
	// store's cluster and the dirty-region log's default region, so a
	// 4 KiB write missed costs one cluster's copy.
	DigestRegionBytes = 64 << 10
	// DigestBatch is how many regions one RemoteDigests call asks for:
	// 32 MiB of the volume, 16 KiB of digests (about 34 KB as the hex
	// JSON of blkd's API, whose answers are bounded at 64 KiB).
	DigestBatch = 512
	// digestReadBytes is the largest read of Digests: 1 MiB, the
	// store's largest (MaxTransferBytes).
	digestReadBytes = 1 << 20
)

// digestBatch is DigestBatch but in tests of batch boundaries.
var digestBatch = DigestBatch

// Digest is the SHA-256 of one region's bytes.
type Digest [sha256.Size]byte

// DigestSource is one copy of a volume as Digests reads it: the
// primary's local store for the copier, a replica's store for the
// node that answers RemoteDigests, so both compute the same function.
type DigestSource struct {
	// Mapped walks the allocated runs in LBA order (store.Volume.Mapped).
	Mapped func(from, to uint64, fn func(lba, blocks uint64) error) error
	// Read reads blocks (store.Volume.Read); unwritten ones read as zeros.
	Read func(lba uint64, buf []byte) error
	// BlockShift is log2 of the block size.
	BlockShift uint
	// Blocks is the volume's size in blocks: the last region ends there.
	Blocks uint64
}

// ErrDigestRange: Digests asked for regions outside the volume or not
// aligned.
var ErrDigestRange = errors.New("repl: digest range")

// Digests fills out with the digests of len(out) consecutive regions of
// regionBlocks blocks from lba (a multiple of regionBlocks, below
// Blocks); the volume's last region is shorter, and out must not reach
// past it. buf is scratch (at least one region; nil: allocated). A
// region with no mapped block is not read. It returns the bytes read.
func (s DigestSource) Digests(lba, regionBlocks uint64, buf []byte, out []Digest) (uint64, error) {
	n := uint64(len(out))
	switch {
	case regionBlocks == 0 || lba%regionBlocks != 0 || lba >= s.Blocks || n == 0:
		return 0, fmt.Errorf("%w: %d regions of %d blocks at LBA %d of %d blocks", ErrDigestRange, n, regionBlocks, lba, s.Blocks)
	case (s.Blocks-lba+regionBlocks-1)/regionBlocks < n:
		return 0, fmt.Errorf("%w: %d regions of %d blocks at LBA %d run past the volume's %d blocks", ErrDigestRange, n, regionBlocks, lba, s.Blocks)
	}
	regionBytes := int(regionBlocks << s.BlockShift)
	if len(buf) < regionBytes {
		buf = make([]byte, max(regionBytes, min(digestReadBytes, int(n)*regionBytes)))
	}
	// Which regions hold a mapped block.
	end := min(s.Blocks, lba+n*regionBlocks)
	mapped := make([]bool, n)
	if err := s.Mapped(lba, end, func(at, blocks uint64) error {
		for i := (at - lba) / regionBlocks; i < n && lba+i*regionBlocks < at+blocks; i++ {
			mapped[i] = true
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("repl: digests: map: %w", err)
	}
	per := max(1, uint64(len(buf)/regionBytes)) // regions per read
	var read uint64
	var zero *Digest // of a whole region of zeros, made once
	for i := uint64(0); i < n; {
		lo := lba + i*regionBlocks
		if !mapped[i] {
			hi := min(end, lo+regionBlocks)
			if hi-lo == regionBlocks {
				if zero == nil {
					z := Digest(sha256.Sum256(make([]byte, regionBytes)))
					zero = &z
				}
				out[i] = *zero
			} else {
				out[i] = sha256.Sum256(make([]byte, (hi-lo)<<s.BlockShift))
			}
			i++
			continue
		}
		j := i + 1
		for j < n && j-i < per && mapped[j] {
			j++
		}
		hi := min(end, lba+j*regionBlocks)
		b := buf[:(hi-lo)<<s.BlockShift]
		if err := s.Read(lo, b); err != nil {
			return read, fmt.Errorf("repl: digests: read at LBA %d: %w", lo, err)
		}
		read += uint64(len(b))
		for k := i; k < j; k++ {
			off := (k - i) * uint64(regionBytes)
			out[k] = sha256.Sum256(b[off:min(off+uint64(regionBytes), uint64(len(b)))])
		}
		i = j
	}
	return read, nil
}

// compareAll is a compare rebuild (see the top of the file): in batches
// of DigestBatch regions, the replica's digests (RemoteDigests, running
// while the local ones are computed), then a window over each run of
// differing regions.
func (r *Rebuild) compareAll() error {
	// Every write that started without the replica in its leg set: done
	// before the first digest (see the argument above).
	if err := r.quiesce(&window{}); err != nil {
		return err
	}
	shift := r.b.shift
	src := DigestSource{Mapped: r.cfg.Mapped, Read: r.cfg.Read, BlockShift: shift, Blocks: r.blocks}
	remote := func(ctx context.Context, lba uint64, out []Digest) error {
		if err := r.cfg.RemoteDigests(ctx, lba, out); err != nil {
			if cerr := r.check(); cerr != nil {
				return cerr
			}
			err = fmt.Errorf("%w: digests of LBA %d: %w", ErrRebuildLeg, lba, err)
			r.fail(err)
			return err
		}
		return nil
	}
	span := max(1, r.region/src.regionBlocks()) // regions per window
	err := walkDigests(r.ctx, src, 0, src.Blocks, remote, r.cfg.Limiter, r.check, func(lo, hi uint64, differ bool, end uint64) error {
		if differ {
			for at := lo; at < hi; at += span * src.regionBlocks() {
				e := min(hi, at+span*src.regionBlocks())
				if err := r.push(at, e, 0); err != nil { // pipelined: windows in flight
					r.salvage()
					return err
				}
				r.differ.Add((e - at) << shift)
			}
		}
		// The batch's last run: its windows land before the next batch's
		// digests are read, so no host write waits on a window while they
		// are.
		if hi == end && (end == src.Blocks || end%(uint64(digestBatch)*src.regionBlocks()) == 0) {
			if err := r.drain(); err != nil {
				r.salvage()
				return err
			}
		}
		r.done.Store(end << shift)
		return nil
	})
	if err != nil && r.ctx.Err() != nil {
		return r.failure() // the limiter's wait, cut short
	}
	return err
}

// regionBlocks is the blocks of a DigestRegionBytes region (one block at
// least).
func (s DigestSource) regionBlocks() uint64 { return max(1, uint64(DigestRegionBytes)>>s.BlockShift) }

// walkDigests compares src with remote over [from, to) (from a multiple
// of a region, to at most src.Blocks) in batches
// of digestBatch regions of DigestRegionBytes (the remote call runs while
// the local digests are computed; the bytes read locally count against
// lim, if set) and calls fn with each run of regions [lo, hi) that differ
// (differ) or are equal, and end, the end of the batch once its last run
// is passed (else the run's end). check, if set, is asked before each
// batch.
func walkDigests(ctx context.Context, src DigestSource, from, to uint64, remote RemoteDigestsFunc, lim *Limiter, check func() error,
	fn func(lo, hi uint64, differ bool, end uint64) error) error {
	per := src.regionBlocks()
	local := make([]Digest, digestBatch)
	theirs := make([]Digest, digestBatch)
	buf := make([]byte, digestReadBytes)
	res := make(chan error, 1)
	for lo := from; lo < to; {
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		n := min(uint64(digestBatch), (to-lo+per-1)/per)
		go func(lo uint64, out []Digest) { res <- remote(ctx, lo, out) }(lo, theirs[:n])
		read, lerr := src.Digests(lo, per, buf, local[:n])
		if rerr := <-res; rerr != nil {
			return rerr
		}
		if lerr != nil {
			return fmt.Errorf("repl: local digests: %w", lerr)
		}
		// Digest reads cost the disks what copies would.
		if lim != nil {
			if err := lim.Wait(ctx, read); err != nil {
				return err
			}
		}
		batchEnd := min(to, lo+n*per)
		for i := uint64(0); i < n; {
			j := i + 1
			for j < n && (local[j] == theirs[j]) == (local[i] == theirs[i]) {
				j++
			}
			end := min(to, lo+j*per)
			if j == n {
				end = batchEnd
			}
			if err := fn(lo+i*per, min(to, lo+j*per), local[i] != theirs[i], end); err != nil {
				return err
			}
			i = j
		}
		lo = batchEnd
	}
	return nil
}

// ErrDiverged: a replica counted in sync holds other bytes than the
// primary in some region (Backend.Diverged).
var ErrDiverged = errors.New("repl: replica differs from the primary")

// DivergedRegions compares src with remote over the runs within ([lba,
// end) pairs, region-aligned; nil: the whole volume; see walkDigests)
// and returns the runs of regions whose digests differ, as [lba, end)
// pairs. Nothing is copied or held: for the check of the in-sync
// replicas when a primary's term begins (blkd), whose runs are asked
// again (DivergedRegions within them) before the replica is declared
// diverged.
func DivergedRegions(ctx context.Context, src DigestSource, remote RemoteDigestsFunc, lim *Limiter, within [][2]uint64) ([][2]uint64, error) {
	if within == nil {
		within = [][2]uint64{{0, src.Blocks}}
	}
	var runs [][2]uint64
	for _, w := range within {
		err := walkDigests(ctx, src, w[0], min(w[1], src.Blocks), remote, lim, ctx.Err, func(lo, hi uint64, differ bool, _ uint64) error {
			if differ {
				runs = append(runs, [2]uint64{lo, hi})
			}
			return nil
		})
		if err != nil {
			return runs, err
		}
	}
	return runs, nil
}

// Diverged takes node's replica out of sync because it was found to
// differ from the primary (cause wraps ErrDiverged and says where), as if
// it had missed a write: writes skip it from now on and are held until the
// Reporter recorded it out of sync. Its next rebuild is a compare, never
// incremental: the dirty-region log it gets says only what it misses
// from now on, not where it differed, so it is marked useless. It returns
// false if node is no in-sync peer of the current leg set.
func (b *Backend) Diverged(node string, cause error) bool {
	p := b.set.Load().find(node)
	if p == nil {
		return false
	}
	if st := p.state.Load(); st != peerInSync && st != peerPromoting {
		return false
	}
	b.keepDirty(p)
	if d := b.drls.Load().find(node); d != nil {
		d.lost.Store(true)
	}
	p.missed(cause)
	return true
}

// RemoteDigestsFunc is RebuildConfig.RemoteDigests: it fills out with
// the replica's digests (DigestSource.Digests on its copy) of len(out)
// regions of DigestRegionBytes from lba, or fails (the rebuild fails).
type RemoteDigestsFunc func(ctx context.Context, lba uint64, out []Digest) error
