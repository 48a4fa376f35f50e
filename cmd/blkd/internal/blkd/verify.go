package blkd

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/bits"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/repl"
	"github.com/blk-project/blk/store"
)

// volume verify (docs/replication.md §5): the leader asks every replica's
// node for the SHA-256 of each region of its copy and compares them with
// the primary's. A region a host writes meanwhile may differ for a
// moment: a differing region is asked again (verifyRetries) and reported
// only if it still differs. Unwritten clusters read as zeros in the store
// and hash as such.

const (
	// verifyRegion is the region hashed as one: 1 MiB, the store's
	// largest read.
	verifyRegion = 1 << 20
	// verifyBatch is how many regions one checksum request covers.
	verifyBatch = 256
	// verifyRetries is how many more times a differing region is asked.
	verifyRetries = 3
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
}

// checksumResponse: one hex SHA-256 per region.
type checksumResponse struct {
	Sums []string `json:"sums"`
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
				if d.stillDiffers(ctx, v, n, at) {
					res.Mismatches = append(res.Mismatches, api.VerifyMismatch{Offset: at, Node: n, InSync: inSync[n]})
				}
			}
		}
	}
	for _, n := range nodes {
		if live[n] {
			res.Compared = append(res.Compared, n)
		}
	}
	return res, nil
}

// stillDiffers asks the primary and node again for the region at off,
// up to verifyRetries times: a host write between the two reads makes a
// region differ for a moment.
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
