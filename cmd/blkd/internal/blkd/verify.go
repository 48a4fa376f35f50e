package blkd

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/repl"
	"github.com/blk-project/blk/store"
)

// volume verify (docs/replication.md §5): the leader asks every replica's
// node for the SHA-256 of each region of its copy and compares them with
// the primary's. Those first hashes are taken at different moments: a
// region a host writes meanwhile may differ for a moment (a write on one
// copy and still on its way to the other, or landing between the two
// reads) although nothing is lost. So a differing region is hashed
// again on the primary and on the replicas that differed at one instant:
// the primary holds the host writes to the region and waits until none
// is in flight on any copy (repl.Backend.HoldRange), hashes its copy and
// has each replica's node hash its own, then lets the writes go. A
// region that differs then differs for good (a replica that missed a
// write, or a bug), whatever the host writes. A primary that cannot
// hold the region (an older blkd, a term that ended meanwhile) is asked
// as before verifyAtOnce existed: the region is hashed again
// verifyRetries times, primary and replica one after the other, and
// reported if it differs every time. Unwritten clusters read as zeros in the store and hash as
// such.

const (
	// verifyRegion is the region hashed as one: 1 MiB, the store's
	// largest read.
	verifyRegion = 1 << 20
	// verifyBatch is how many regions one checksum request covers.
	verifyBatch = 256
	// verifyRetries is how many more times a differing region is asked
	// when its primary cannot hold its writes to it.
	verifyRetries = 3
	// verifyHoldTimeout bounds a hash at one instant on the primary: the
	// drain of the writes in flight and every copy's hash of one region. The host
	// writes to that region wait meanwhile (a few milliseconds; this
	// much only if a replica's node stalls), far below a host's I/O
	// timeout.
	verifyHoldTimeout = 5 * time.Second
)

// checksumRequest is the body of POST /v1/internal/checksum.
type checksumRequest struct {
	ID      uint64 `json:"id"`
	Offset  uint64 `json:"offset"`
	Regions int    `json:"regions"`
	// RegionBytes is the region hashed as one (0: verifyRegion); a
	// compare rebuild asks for repl.DigestRegionBytes (a node with
	// meta.FeatureDigests takes any power of two from 4 KiB to 1 MiB).
	RegionBytes int `json:"region_bytes,omitempty"`
	// AtOnce, sent to the volume's primary at term Epoch: hash the one
	// region (Regions 1, RegionBytes verifyRegion) on this node and on
	// each node named, at one instant: while the primary holds its
	// writes to the region (verifyAtOnce). An older blkd refuses the
	// field (400): the leader then asks as before.
	AtOnce []string `json:"at_once,omitempty"`
	Epoch  uint64   `json:"epoch,omitempty"`
}

// checksumResponse: one hex SHA-256 per region.
type checksumResponse struct {
	Sums []string `json:"sums"`
	// AtOnce: with AtOnce, each copy's hash of the region by node ID
	// (the primary's too), all taken while its writes were held.
	AtOnce map[string]string `json:"at_once,omitempty"`
	// InSync: with AtOnce, the nodes of AtOnce the primary's backend
	// counted in sync while it held the writes (one that missed a write
	// meanwhile is not, though the registry may still say so).
	InSync []string `json:"in_sync,omitempty"`
}

// maxChecksumBytes bounds the volume bytes one checksum request covers
// (verifyBatch regions of verifyRegion: 256 MiB, a few hundred ms of
// reading).
const maxChecksumBytes = verifyBatch * verifyRegion

// localChecksums hashes regions regions of regionBytes (0:
// verifyRegion) of this node's copy of volume id from offset
// (region-aligned); the last may be short (the volume's end). A region
// with nothing allocated is not read (repl.DigestSource).
func (d *Daemon) localChecksums(id, offset uint64, regions, regionBytes int) ([]string, error) {
	if regionBytes == 0 {
		regionBytes = verifyRegion
	}
	vol, err := d.store.Volume(store.ID(id))
	if err != nil {
		return nil, err
	}
	info, err := vol.Info()
	if err != nil {
		return nil, err
	}
	bs := int(info.BlockSize)
	if regionBytes < bs || regionBytes > verifyRegion || regionBytes&(regionBytes-1) != 0 || regionBytes%bs != 0 {
		return nil, badRequest("region_bytes %d: want a power of two from the block size %d to %d", regionBytes, bs, verifyRegion)
	}
	if offset%uint64(regionBytes) != 0 || regions < 1 || regions > maxChecksumBytes/regionBytes || offset >= info.SizeBytes {
		return nil, badRequest("offset %d, %d regions: want a multiple of %d below the volume's %d bytes, 1 to %d regions", offset, regions, regionBytes, info.SizeBytes, maxChecksumBytes/regionBytes)
	}
	shift := uint(bits.TrailingZeros(uint(bs)))
	blocks := info.SizeBytes >> shift
	per := uint64(regionBytes) >> shift
	lba := offset >> shift
	regions = min(regions, int((blocks-lba+per-1)/per))
	src := repl.DigestSource{Mapped: vol.Mapped, Read: vol.Read, BlockShift: shift, Blocks: blocks}
	out := make([]repl.Digest, regions)
	if _, err := src.Digests(lba, per, make([]byte, max(regionBytes, 1<<20)), out); err != nil {
		return nil, err
	}
	sums := make([]string, regions)
	for i := range out {
		sums[i] = hex.EncodeToString(out[i][:])
	}
	return sums, nil
}

// internalChecksum serves POST /v1/internal/checksum: the leader's
// verify asks this node for its copy's region hashes.
func (d *Daemon) internalChecksum(w http.ResponseWriter, r *http.Request) error {
	var req checksumRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if len(req.AtOnce) > 0 {
		if req.Regions != 1 || (req.RegionBytes != 0 && req.RegionBytes != verifyRegion) {
			return badRequest("a checksum at one instant covers one region of %d bytes, not %d of %d", verifyRegion, req.Regions, req.RegionBytes)
		}
		sums, inSync, err := d.verifyAtOnce(r.Context(), req.ID, req.Epoch, req.Offset, req.AtOnce)
		if err != nil {
			if _, ok := err.(*apiError); ok {
				return err
			}
			return &apiError{http.StatusConflict, err.Error()}
		}
		writeJSON(w, http.StatusOK, checksumResponse{Sums: []string{sums[d.cfg.NodeID]}, AtOnce: sums, InSync: inSync})
		return nil
	}
	sums, err := d.localChecksums(req.ID, req.Offset, req.Regions, req.RegionBytes)
	if err != nil {
		if _, ok := err.(*apiError); ok {
			return err
		}
		return &apiError{http.StatusConflict, err.Error()}
	}
	writeJSON(w, http.StatusOK, checksumResponse{Sums: sums})
	return nil
}

// checksums asks node (this one, or through its internal route) for
// regions region hashes of regionBytes (0: verifyRegion) of volume id
// from offset.
func (d *Daemon) checksums(ctx context.Context, node string, id, offset uint64, regions, regionBytes int) ([]string, error) {
	if node == d.cfg.NodeID {
		return d.localChecksums(id, offset, regions, regionBytes)
	}
	n, err := registryParts{d.node}.Node(ctx, node)
	if err != nil {
		return nil, err
	}
	var out checksumResponse
	if err := d.postPeer(ctx, n.MgmtAddr, "/v1/internal/checksum", checksumRequest{ID: id, Offset: offset, Regions: regions, RegionBytes: regionBytes}, &out); err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	return out.Sums, nil
}

// verifyVolume serves POST /v1/volumes/{name}/verify on the leader.
func (d *Daemon) verifyVolume(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	v, err := d.node.ReadVolume(r.Context(), name)
	if err != nil {
		return metaError(err, "")
	}
	if v.State != meta.VolumeOnline {
		return &apiError{http.StatusConflict, fmt.Sprintf("volume %q is %s: only an online volume is verified", name, v.State)}
	}
	snaps := false
	if f := r.URL.Query().Get("snapshots"); f != "" {
		if snaps, err = strconv.ParseBool(f); err != nil {
			return badRequest("snapshots=%q: use snapshots=true or snapshots=false", f)
		}
	}
	res, err := d.verify(r.Context(), v)
	if err != nil {
		return err
	}
	if snaps {
		d.verifySnapshots(r.Context(), v, &res)
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// verify compares every replica of v with its primary's, region by
// region.
func (d *Daemon) verify(ctx context.Context, v meta.Volume) (api.VerifyResult, error) {
	res := api.VerifyResult{Volume: v.Name, Epoch: v.CurrentEpoch(), RegionBytes: verifyRegion,
		Regions: (v.SizeBytes + verifyRegion - 1) / verifyRegion, Mismatches: []api.VerifyMismatch{}}
	inSync := map[string]bool{}
	nodes := []string{v.Node}
	for _, rp := range v.ReplicaSet() {
		inSync[rp.Node] = rp.State == meta.ReplicaInSync
		if rp.Node != v.Node {
			nodes = append(nodes, rp.Node)
		}
	}
	live := map[string]bool{}
	for _, n := range nodes {
		live[n] = true
	}
	atOnceN, apartN := 0, 0 // regions hashed again at one instant, or apart
	for off := uint64(0); off < v.SizeBytes; off += verifyBatch * verifyRegion {
		sums := make(map[string][]string, len(nodes))
		var ask []string
		for _, n := range nodes {
			if live[n] {
				ask = append(ask, n)
			}
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, n := range ask {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := d.checksums(ctx, n, v.ID, off, verifyBatch, 0)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					live[n] = false
					if res.Unreachable == nil {
						res.Unreachable = map[string]string{}
					}
					res.Unreachable[n] = err.Error()
					return
				}
				sums[n] = s
			}()
		}
		wg.Wait()
		primary := sums[v.Node]
		if !live[v.Node] {
			return res, &apiError{http.StatusBadGateway, fmt.Sprintf("the primary %s did not give its checksums: %s", v.Node, res.Unreachable[v.Node])}
		}
		// The regions that differ, and the replicas they differ on, hashed
		// again at one instant (confirmDiffers); reported by replica, then offset.
		differ := map[uint64][]string{}
		var offsets []uint64
		for _, n := range nodes[1:] {
			if !live[n] {
				continue
			}
			s := sums[n]
			for i := range primary {
				if i < len(s) && s[i] == primary[i] {
					continue
				}
				at := off + uint64(i)*verifyRegion
				if differ[at] == nil {
					offsets = append(offsets, at)
				}
				differ[at] = append(differ[at], n)
			}
		}
		slices.Sort(offsets)
		still := map[uint64]map[string]bool{}
		atOnce := map[uint64]bool{}
		for _, at := range offsets {
			still[at], atOnce[at] = d.confirmDiffers(ctx, v, at, differ[at], inSync)
			if atOnce[at] {
				atOnceN++
			} else {
				apartN++
			}
		}
		for _, n := range nodes[1:] {
			for _, at := range offsets {
				if st, ok := still[at][n]; ok {
					res.Mismatches = append(res.Mismatches, api.VerifyMismatch{Offset: at, Node: n, InSync: st})
					d.log.Warn("volume verify: a replica's region differs from the primary's", slog.String("volume", v.Name),
						slog.Uint64("epoch", res.Epoch), slog.String("primary", v.Node), slog.String("replica", n),
						slog.Uint64("offset", at), slog.Bool("in_sync", st), slog.Bool("at_one_instant", atOnce[at]))
				}
			}
		}
	}
	for _, n := range nodes {
		if live[n] {
			res.Compared = append(res.Compared, n)
		}
	}
	d.log.Info("volume verify", slog.String("volume", v.Name), slog.Uint64("epoch", res.Epoch), slog.Any("compared", res.Compared),
		slog.Int("regions_hashed_again_at_one_instant", atOnceN), slog.Int("regions_hashed_again_apart", apartN),
		slog.Int("mismatches", len(res.Mismatches)))
	return res, nil
}

// confirmDiffers hashes the region at off of v again on the primary and
// on nodes (replicas whose first hash differed from the primary's), at
// one instant if the primary holds its writes there (verifyAtOnce;
// atOnce), and returns
// the nodes whose copy still differs, each with whether it counts as in
// sync: the registry's inSync, and the primary's backend's meanwhile.
func (d *Daemon) confirmDiffers(ctx context.Context, v meta.Volume, off uint64, nodes []string, inSync map[string]bool) (out map[string]bool, atOnce bool) {
	out = map[string]bool{}
	sums, legs, err := d.checksumsAtOnce(ctx, v, off, nodes)
	if err == nil {
		in := map[string]bool{}
		for _, n := range legs {
			in[n] = true
		}
		for _, n := range nodes {
			if s, ok := sums[n]; !ok || s != sums[v.Node] {
				out[n] = inSync[n] && in[n]
			}
		}
		return out, true
	}
	d.log.Warn("volume verify: the primary did not hash a differing region at one instant: asking again apart",
		slog.String("volume", v.Name), slog.String("primary", v.Node), slog.Uint64("offset", off), slog.String("err", err.Error()))
	for _, n := range nodes {
		if d.stillDiffers(ctx, v, n, off) {
			out[n] = inSync[n]
		}
	}
	return out, false
}

// checksumsAtOnce has v's primary (this node, or through its checksum
// route) hash the region at off on its copy and on nodes' while it holds
// its writes there: the hashes by node (the primary's too), and the
// nodes its backend counted in sync meanwhile.
func (d *Daemon) checksumsAtOnce(ctx context.Context, v meta.Volume, off uint64, nodes []string) (map[string]string, []string, error) {
	if v.Node == d.cfg.NodeID {
		return d.verifyAtOnce(ctx, v.ID, v.CurrentEpoch(), off, nodes)
	}
	n, err := registryParts{d.node}.Node(ctx, v.Node)
	if err != nil {
		return nil, nil, err
	}
	var out checksumResponse
	req := checksumRequest{ID: v.ID, Offset: off, Regions: 1, AtOnce: nodes, Epoch: v.CurrentEpoch()}
	if err := d.postPeer(ctx, n.MgmtAddr, "/v1/internal/checksum", req, &out); err != nil {
		return nil, nil, fmt.Errorf("node %s: %w", v.Node, err)
	}
	if _, ok := out.AtOnce[v.Node]; !ok {
		return nil, nil, fmt.Errorf("node %s gave no hash at one instant of its own copy", v.Node)
	}
	return out.AtOnce, out.InSync, nil
}

// verifyAtOnce hashes the verifyRegion at off of volume id on this node,
// the primary of its term at epoch, and on each of nodes, while the term
// holds its writes to the region (repl.Backend.HoldRange): no write there
// is in flight on any copy while the copies are hashed, so their hashes
// differ only if their bytes do, whatever the host writes. It returns
// the hashes by node (this one's too) and the nodes of nodes the backend
// counted in sync meanwhile.
func (d *Daemon) verifyAtOnce(ctx context.Context, id, epoch, off uint64, nodes []string) (map[string]string, []string, error) {
	hv := d.hostVolumeOf(id)
	var pl *primaryLeg
	if hv != nil {
		d.repl.mu.Lock()
		pl = hv.pl
		d.repl.mu.Unlock()
	}
	if pl == nil || pl.epoch != epoch || pl.dead() {
		return nil, nil, &apiError{http.StatusConflict, fmt.Sprintf("volume %d: node %s does not serve it as its primary at epoch %d now", id, d.cfg.NodeID, epoch)}
	}
	vol, err := d.store.Volume(store.ID(id))
	if err != nil {
		return nil, nil, err
	}
	info, err := vol.Info()
	if err != nil {
		return nil, nil, err
	}
	shift := uint(bits.TrailingZeros(uint(info.BlockSize)))
	if off%verifyRegion != 0 || off >= info.SizeBytes {
		return nil, nil, badRequest("offset %d: want a multiple of %d below the volume's %d bytes", off, verifyRegion, info.SizeBytes)
	}
	for _, n := range nodes {
		if n == d.cfg.NodeID {
			return nil, nil, badRequest("at_once: node %s is the primary, not a replica", n)
		}
	}
	blocks := min(uint64(verifyRegion), info.SizeBytes-off) >> shift
	ctx, cancel := context.WithTimeout(ctx, verifyHoldTimeout)
	defer cancel()
	sums := make(map[string]string, len(nodes)+1)
	var inSync []string
	_, err = pl.b.HoldRange(ctx, off>>shift, blocks, func() error {
		for _, p := range pl.b.Stats().Peers {
			if p.State == "in-sync" && slices.Contains(nodes, p.Node) {
				inSync = append(inSync, p.Node)
			}
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make([]error, len(nodes)+1)
		for i, n := range append([]string{d.cfg.NodeID}, nodes...) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := d.checksums(ctx, n, id, off, 1, 0)
				if err == nil && len(s) != 1 {
					err = fmt.Errorf("node %s gave %d hashes of one region", n, len(s))
				}
				if err != nil {
					errs[i] = err
					return
				}
				mu.Lock()
				sums[n] = s[0]
				mu.Unlock()
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("hash at one instant of the region at %d: %w", off, err)
	}
	return sums, inSync, nil
}

// stillDiffers asks the primary and node again for the region at off,
// up to verifyRetries times, one after the other (a primary that cannot
// hold its writes): a host write between the two reads makes a region differ for
// a moment.
func (d *Daemon) stillDiffers(ctx context.Context, v meta.Volume, node string, off uint64) bool {
	for range verifyRetries {
		a, err1 := d.checksums(ctx, v.Node, v.ID, off, 1, 0)
		b, err2 := d.checksums(ctx, node, v.ID, off, 1, 0)
		if err1 == nil && err2 == nil && len(a) == 1 && len(b) == 1 && a[0] == b[0] {
			return false
		}
	}
	return true
}

// verifySnapshots compares, for every ready snapshot of v, its copies on
// the nodes it lists, region by region, with the primary's copy (or, if
// the primary holds none, the first listed node's). A snapshot is
// immutable: a region that differs is reported at once, never asked
// again, and counts as an in-sync copy's (the registry says it holds the
// snapshot). A node that does not answer is left out, named in
// Unreachable as NODE@SNAPSHOT.
func (d *Daemon) verifySnapshots(ctx context.Context, v meta.Volume, res *api.VerifyResult) {
	for _, s := range v.Snapshots {
		if s.State != meta.SnapshotReady || len(s.Nodes) < 2 {
			continue
		}
		nodes := slices.Clone(s.Nodes)
		if i := slices.Index(nodes, v.Node); i > 0 {
			nodes[0], nodes[i] = nodes[i], nodes[0]
		}
		res.Snapshots = append(res.Snapshots, s.Name)
		down := map[string]bool{}
		for off := uint64(0); off < s.SizeBytes; off += verifyBatch * verifyRegion {
			sums := make([][]string, len(nodes))
			var wg sync.WaitGroup
			for i, n := range nodes {
				if down[n] {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					sums[i], _ = d.checksums(ctx, n, s.ID, off, verifyBatch, 0)
				}()
			}
			wg.Wait()
			for i, n := range nodes {
				if !down[n] && sums[i] == nil {
					down[n] = true
					if res.Unreachable == nil {
						res.Unreachable = map[string]string{}
					}
					res.Unreachable[n+"@"+s.Name] = "gave no checksums of its copy of " + v.Name + "@" + s.Name
				}
			}
			ref := sums[0]
			if down[nodes[0]] {
				break // no reference: the others are not compared
			}
			for i, n := range nodes[1:] {
				if down[n] {
					continue
				}
				for j := range ref {
					if j >= len(sums[i+1]) || sums[i+1][j] != ref[j] {
						res.Mismatches = append(res.Mismatches, api.VerifyMismatch{Offset: off + uint64(j)*verifyRegion, Node: n, InSync: true, Snapshot: s.Name})
					}
				}
			}
		}
	}
}
