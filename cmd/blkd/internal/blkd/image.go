package blkd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/internal/image"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
)

// Export and import (docs/snapshots.md §5): a snapshot streamed as a
// blk-image/1 (internal/image), whole or as the blocks changed since an
// earlier snapshot, and such a stream written into a volume. Both are
// served by the volume's primary, which holds its store; another node
// answers 421 naming it (api.NotPrimary), which blkctl follows: a
// stream of gigabytes is not worth relaying through a second node.

// imageChunk is the most a read from, or a write to, the store carries:
// a run longer than this is read and sent in pieces, each its own data
// record.
const imageChunk = 1 << 20

// importing holds the volumes an import is writing (one at a time each).
var importing sync.Map // importKey → struct{}

type importKey struct {
	d  *Daemon
	id uint64
}

// notPrimary is the 421 of a volume's export or import asked of a node
// that is not its primary.
func (d *Daemon) notPrimary(w http.ResponseWriter, v meta.Volume) {
	api := d.apiOf(v.Node)
	writeJSON(w, http.StatusMisdirectedRequest, map[string]string{
		"error":       fmt.Sprintf("volume %q is served by its primary, node %s (at %s), not node %s: send the request there", v.Name, v.Node, api, d.cfg.NodeID),
		"primary_id":  v.Node,
		"primary_api": api,
	})
}

// imageRun is one run of Store.Changes.
type imageRun struct {
	lba, blocks uint64
	zero        bool
}

// exportSnapshot serves GET /v1/volumes/{name}/snapshots/{snap}/export
// [?since=SNAP0]: the snapshot's image, every block it reads data at,
// or, with since, the blocks changed between SNAP0 and it (zero records
// where it reads zeros). Nothing is sent before the runs are known, so
// an error is a status; an error of the store mid-stream aborts the
// connection, which the client sees as a truncated image.
func (d *Daemon) exportSnapshot(w http.ResponseWriter, r *http.Request) error {
	name, snap, err := d.snapshotPath(r)
	if err != nil {
		return err
	}
	since := r.URL.Query().Get("since")
	if since != "" {
		if err := api.CheckName("since", since); err != nil {
			return badRequest("%v", err)
		}
	}
	v, err := d.readVolumeAny(r.Context(), name)
	if err != nil {
		return err
	}
	s, err := readySnapshot(v, snap)
	if err != nil {
		return err
	}
	var base *image.Base
	var from uint64
	if since != "" {
		s0, err := readySnapshot(v, since)
		if err != nil {
			return err
		}
		if s0.ID == s.ID {
			return badRequest("since=%s is the snapshot exported: a diff of a snapshot with itself is empty", since)
		}
		base, from = &image.Base{Name: s0.Name, ID: s0.ID}, s0.ID
	}
	if v.Node != d.cfg.NodeID {
		d.notPrimary(w, v)
		return nil
	}
	sv, err := d.store.Volume(store.ID(s.ID))
	if err != nil {
		return &apiError{http.StatusConflict, fmt.Sprintf("snapshot %s@%s: node %s, the primary, holds no copy of it: %v", name, snap, d.cfg.NodeID, err)}
	}
	var runs []imageRun
	err = d.store.Changes(store.ID(from), store.ID(s.ID), func(lba, blocks uint64, zero bool) error {
		runs = append(runs, imageRun{lba, blocks, zero})
		return nil
	})
	switch {
	case errors.Is(err, store.ErrNotAncestor):
		return &apiError{http.StatusConflict, fmt.Sprintf("%s@%s is not an earlier snapshot of %s@%s's chain (reverts and deletes change the chain): export %s@%s whole", name, since, name, snap, name, snap)}
	case err != nil:
		return &apiError{http.StatusInternalServerError, fmt.Sprintf("export %s@%s: the store's changes: %v", name, snap, err)}
	}
	h := image.Header{Magic: image.Magic, Volume: v.Name, Snapshot: s.Name, SnapshotID: s.ID, SizeBytes: s.SizeBytes, BlockSize: v.BlockSize, Base: base}
	d.node.FSM().Read(func(st *meta.State) { h.Cluster = st.ClusterID() })
	bs := uint64(v.BlockSize)
	length := uint64(image.HeaderSize + image.RecordSize + image.ChecksumSize)
	for _, run := range runs {
		if run.zero {
			length += image.RecordSize
			continue
		}
		h.DataBytes += run.blocks * bs
		length += run.blocks*bs + image.RecordSize*((run.blocks*bs+imageChunk-1)/imageChunk)
	}
	if err := h.Check(); err != nil {
		return &apiError{http.StatusInternalServerError, fmt.Sprintf("export %s@%s: %v", name, snap, err)}
	}
	w.Header().Set("Content-Type", api.ImageContentType)
	w.Header().Set("Content-Length", strconv.FormatUint(length, 10))
	w.Header().Set(api.ImageDataBytesHeader, strconv.FormatUint(h.DataBytes, 10))
	w.WriteHeader(http.StatusOK)
	if err := writeImage(r.Context(), w, h, runs, sv, d.copyLimit()); err != nil {
		d.log.Warn("export aborted", "volume", name, "snapshot", snap, "err", err)
		panic(http.ErrAbortHandler) // the client must not take a short stream for a whole one
	}
	return nil
}

// writeImage writes runs of sv as the image h. Each read of the store
// first draws its bytes from lim (the node's rebuild limiter; nil:
// unlimited), so an export shares --rebuild-rate with the rebuilds and
// flattens; zero runs read nothing and cost nothing. A ctx that ends
// while it waits stops it with ctx's cause.
func writeImage(ctx context.Context, w io.Writer, h image.Header, runs []imageRun, sv *store.Volume, lim copyLimiter) error {
	iw, err := image.NewWriter(w, h)
	if err != nil {
		return err
	}
	bs := uint64(h.BlockSize)
	var buf []byte
	for _, run := range runs {
		if run.zero {
			if err := iw.Zero(run.lba, run.blocks); err != nil {
				return err
			}
			continue
		}
		if buf == nil {
			buf = make([]byte, imageChunk)
		}
		for lba, end := run.lba, run.lba+run.blocks; lba < end; {
			n := min(end-lba, imageChunk/bs)
			p := buf[:n*bs]
			if lim != nil {
				if err := lim.Wait(ctx, uint64(len(p))); err != nil {
					return fmt.Errorf("waiting for the rebuild rate at LBA %d: %w", lba, err)
				}
			}
			if err := sv.Read(lba, p); err != nil {
				return fmt.Errorf("read LBA %d: %w", lba, err)
			}
			if err := iw.Data(lba, p); err != nil {
				return err
			}
			lba += n
		}
	}
	return iw.Close()
}

// readySnapshot is v's ready snapshot name.
func readySnapshot(v meta.Volume, name string) (meta.VolumeSnapshot, error) {
	s, ok := v.Snapshot(name)
	switch {
	case !ok:
		return s, metaError(fmt.Errorf("meta: snapshot %s@%s: %w", v.Name, name, meta.ErrUnknownSnapshot), "")
	case s.State != meta.SnapshotReady:
		return s, &apiError{http.StatusConflict, fmt.Sprintf("snapshot %s@%s is %v, not ready", v.Name, name, s.State)}
	}
	return s, nil
}

// importVolume serves PUT /v1/volumes/{name}/import[?base=SNAP]: the
// image in the body written into the volume, on its primary, with no
// host connected, and none admitted until it ends. A full image goes
// into a volume that reads zeros everywhere (a new one); a diff onto the
// volume as its snapshot base left it (base's origin, or base itself,
// is the image's base, and nothing was written since: blkctl reverts
// first). A replicated volume is written through its namespace backend,
// as a host's writes are: every in-sync replica gets each write
// (imagewrite.go).
//
// The image is written as it is read, and its checksum is known only at
// its end: a damaged image fails (400), and the volume keeps what was
// written before the damage was found, which the answer says.
func (d *Daemon) importVolume(w http.ResponseWriter, r *http.Request) error {
	name, err := d.volumeName(r)
	if err != nil {
		return err
	}
	baseName := r.URL.Query().Get("base")
	if baseName != "" {
		if err := api.CheckName("base", baseName); err != nil {
			return badRequest("%v", err)
		}
	}
	v, err := d.readVolumeAny(r.Context(), name)
	if err != nil {
		return err
	}
	if v.Node != d.cfg.NodeID {
		d.notPrimary(w, v)
		return nil
	}
	if v.State != meta.VolumeOnline {
		return &apiError{http.StatusConflict, fmt.Sprintf("volume %q is %v, not online", name, v.State)}
	}
	key := importKey{d, v.ID}
	if _, busy := importing.LoadOrStore(key, struct{}{}); busy {
		return &apiError{http.StatusConflict, fmt.Sprintf("volume %q: an import into it is running", name)}
	}
	defer importing.Delete(key)
	submit, done, depth, err := d.importBackend(r.Context(), v)
	if err != nil {
		return err
	}
	// No host may connect from here to the end: the host path refuses
	// new controllers (without DNR: a host may connect once the import
	// ended), and gives up if one is connected already.
	sub, ok := d.tgt.Subsystem(v.NQN)
	if !ok {
		return &apiError{http.StatusServiceUnavailable, fmt.Sprintf("volume %q: node %s does not serve it now: try again", name, d.cfg.NodeID)}
	}
	why := fmt.Errorf("an import into volume %q is running on node %s (since %s): connect once it has ended: %w", name, d.cfg.NodeID, time.Now().UTC().Format(time.RFC3339), target.ErrAdmitRetry)
	hosts := sub.Refuse(why)
	defer sub.Refuse(nil)
	if len(hosts) > 0 {
		return metaError(fmt.Errorf("meta: volume %q: hosts connected to it through node %s now: %v: disconnect them first: %w", name, d.cfg.NodeID, hosts, meta.ErrHasConnections), "")
	}
	ir, err := image.NewReader(r.Body)
	if err != nil {
		return badRequest("import into %q: %v", name, err)
	}
	h := ir.Header()
	if err := d.checkImport(v, h, baseName); err != nil {
		return err
	}
	d.log.Info("import: hosts refused until it ends", "volume", name, "snapshot", h.Volume+"@"+h.Snapshot, "data_bytes", h.DataBytes, "replicas", len(v.ReplicaSet()))
	res := api.ImportResult{Volume: v.Name, Snapshot: h.Snapshot, Origin: h.Origin(), SizeBytes: h.SizeBytes, DataBytes: h.DataBytes}
	if h.Base != nil {
		res.Base = h.Base.Name
	}
	if werr := readImage(ir, newImportWriter(submit, done, depth), &res); werr != nil {
		status := http.StatusBadRequest
		var se *storeError
		if errors.As(werr, &se) {
			status = http.StatusInternalServerError
		}
		return &apiError{status, fmt.Sprintf("import into %q failed after %d of %d data bytes: %v; the volume is left as written (what the image held up to there): import again, or delete the volume", name, res.WrittenBytes, h.DataBytes, werr)}
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// storeError marks a failure of the store (500), as opposed to the
// image (400).
type storeError struct{ err error }

func (e *storeError) Error() string { return e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

// checkImport says whether the image h may go into v (docs/snapshots.md
// §5.3).
func (d *Daemon) checkImport(v meta.Volume, h image.Header, baseName string) error {
	switch {
	case h.BlockSize != v.BlockSize:
		return &apiError{http.StatusConflict, fmt.Sprintf("the image's block size is %d, volume %q's %d: import into a volume of block size %d", h.BlockSize, v.Name, v.BlockSize, h.BlockSize)}
	case h.SizeBytes > v.SizeBytes:
		return &apiError{http.StatusConflict, fmt.Sprintf("the image is of %d bytes, volume %q of %d: resize the volume first (blkctl volume resize %s %d)", h.SizeBytes, v.Name, v.SizeBytes, v.Name, h.SizeBytes)}
	}
	if h.Base == nil {
		if baseName != "" {
			return badRequest("the image is a full image of %s@%s: it has no base; import it without base=%s", h.Volume, h.Snapshot, baseName)
		}
		if d.written(0, v.ID) {
			return &apiError{http.StatusConflict, fmt.Sprintf("volume %q holds data: a full image goes into a volume that reads zeros (a new one: blkctl volume import creates it)", v.Name)}
		}
		return nil
	}
	if baseName == "" {
		return badRequest("the image holds the changes of %s@%s since %s@%s: name the volume's snapshot they apply to with base=SNAP", h.Volume, h.Snapshot, h.Volume, h.Base.Name)
	}
	s, err := readySnapshot(v, baseName)
	if err != nil {
		return err
	}
	var cluster string
	d.node.FSM().Read(func(st *meta.State) { cluster = st.ClusterID() })
	if s.Origin != h.BaseOrigin() && (cluster != h.Cluster || s.ID != h.Base.ID) {
		origin := s.Origin
		if origin == "" {
			origin = cluster + "/" + strconv.FormatUint(s.ID, 10)
		}
		return &apiError{http.StatusConflict, fmt.Sprintf("%s@%s (%s) is not the image's base, %s@%s (%s): import onto the snapshot the previous import of %s made", v.Name, baseName, origin, h.Volume, h.Base.Name, h.BaseOrigin(), h.Volume)}
	}
	if v.Parent != s.ID || d.written(s.ID, v.ID) {
		return &apiError{http.StatusConflict, fmt.Sprintf("volume %q was changed since %s@%s: revert it first (blkctl volume revert %s %s)", v.Name, v.Name, baseName, v.Name, baseName)}
	}
	return nil
}

// written says whether object to reads differently from from (0: the
// empty root), by the store's maps; an error counts as written.
func (d *Daemon) written(from, to uint64) bool {
	errAny := errors.New("written")
	err := d.store.Changes(store.ID(from), store.ID(to), func(uint64, uint64, bool) error { return errAny })
	return err != nil
}
