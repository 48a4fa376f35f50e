package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/internal/image"
	"github.com/urfave/cli/v2"
)

// Export and import (docs/snapshots.md §5, docs/volume.md "Export and
// import"): a snapshot streamed to a file or stdout as a blk-image/1
// (whole, or the blocks changed since an earlier snapshot) or a raw
// sparse file, and an image streamed into a volume.

func imageCommands() []*cli.Command {
	return []*cli.Command{
		{
			Name: "export", Usage: "write a snapshot (of VOLUME: one taken for the export and deleted after it) to a file or stdout: a blk-image (whole, or the blocks changed since an earlier snapshot) or a raw sparse file",
			UsageText: "blkctl volume export VOLUME@SNAPSHOT|VOLUME FILE|- [--since VOLUME@SNAPSHOT0] [--format blk|raw] [--progress]",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "since", Usage: "export only the blocks changed since this earlier snapshot (`VOLUME@SNAPSHOT0` or SNAPSHOT0), for an incremental backup"},
				&cli.StringFlag{Name: "format", Value: "blk", Usage: "blk (a blk-image, for blkctl volume import) or raw (the volume's bytes, holes left sparse; whole snapshots only)"},
				&cli.BoolFlag{Name: "progress", Usage: "show progress on stderr once a second (the default when stderr is a terminal)"},
			},
			Action: volumeExport,
		},
		{
			Name: "import", Usage: "write a blk-image into a new volume (or, with --base, a diff onto an existing volume's snapshot), then snapshot it as the image's snapshot",
			UsageText: "blkctl volume import FILE|- NAME [--base SNAPSHOT] [--size S] [--replicas N] [--node NODEID] [--progress]",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "base", Usage: "apply a diff image to the existing volume NAME, reverted to its snapshot `SNAPSHOT` (the import of the image's base)"},
				&cli.StringFlag{Name: "size", Usage: "the new volume's size if larger than the image's: " + api.SizeHelp},
				&cli.IntFlag{Name: "replicas", Usage: "the new volume's copies (`N`, 1 to 5), as volume create: default 3 when the cluster has three zones, else 1; the import writes every copy"},
				&cli.StringFlag{Name: "node", Usage: "put the new volume on this node (`NODEID`)"},
				&cli.BoolFlag{Name: "progress", Usage: "show progress on stderr once a second (the default when stderr is a terminal)"},
			},
			Action: volumeImport,
		},
	}
}

// streamClient is e's HTTP client without its timeout: a stream of
// gigabytes takes as long as it takes.
func streamClient(e *env) *http.Client {
	return &http.Client{Transport: e.api.hc.Transport, CheckRedirect: checkRedirect}
}

// streamError reads a non-2xx answer as blkd's error; a 421 names the
// volume's primary in primary.
func streamError(resp *http.Response, what string) (err error, primary string) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error      string `json:"error"`
		PrimaryAPI string `json:"primary_api"`
	}
	if json.Unmarshal(b, &e) != nil || e.Error == "" {
		e.Error = fmt.Sprintf("%s: blkd answered %s: %q", what, resp.Status, strings.TrimSpace(string(b)))
	}
	return &apiError{Status: resp.StatusCode, Msg: e.Error}, e.PrimaryAPI
}

// baseURL is an API address as a URL, with c's scheme.
func baseURL(c *client, addr string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimRight(addr, "/")
	}
	scheme, _, _ := strings.Cut(c.base, "://")
	return scheme + "://" + addr
}

// counter counts the bytes through a reader or writer, for progress.
type counter struct{ n atomic.Uint64 }

type countingReader struct {
	r io.Reader
	c *counter
}

func (r countingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.c.n.Add(uint64(n))
	return n, err
}

// showProgress prints what once a second on w until stop is closed.
func showProgress(w io.Writer, what string, c *counter, total uint64, stop <-chan struct{}) {
	start := time.Now()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			done := c.n.Load()
			s := fmt.Sprintf("%s: %s", what, api.HumanSize(done))
			if total > 0 {
				s += fmt.Sprintf(" of %s (%d%%)", api.HumanSize(total), done*100/max(total, 1))
			}
			if secs := time.Since(start).Seconds(); secs > 0 {
				s += fmt.Sprintf(", %.0f MB/s", float64(done)/secs/1e6)
			}
			fmt.Fprintln(w, s)
		}
	}
}

func volumeExport(c *cli.Context) error {
	a, err := args(c, "volume@snapshot", "file")
	if err != nil {
		return err
	}
	vol, snap, ok, err := splitSnap(a[0])
	switch {
	case err != nil:
		return usageErrorf("%s: %v", c.Command.FullName(), err)
	case !ok:
		if err := api.CheckName("VOLUME", vol); err != nil {
			return usageErrorf("%s: %v", c.Command.FullName(), err)
		}
	}
	format := c.String("format")
	if format != "blk" && format != "raw" {
		return usageErrorf("--format %q: use blk or raw", format)
	}
	since := c.String("since")
	if since != "" {
		if v0, s0, ok, err := splitSnap(since); ok {
			if err != nil {
				return usageErrorf("--since: %v", err)
			}
			if v0 != vol {
				return usageErrorf("--since %s is a snapshot of %s, not of %s: a diff is between two snapshots of one volume", since, v0, vol)
			}
			since = s0
		}
		if err := api.CheckName("--since", since); err != nil {
			return usageErrorf("%v", err)
		}
		if format == "raw" {
			return usageErrorf("--format raw --since: a raw file is a whole volume; export a diff as --format blk")
		}
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !ok {
		// VOL: a snapshot taken for the export, deleted after it (also
		// on failure or Ctrl-C).
		snap = fmt.Sprintf("export-%d", time.Now().Unix())
		if err := e.api.do("POST", volPath(vol)+"/snapshots", api.SnapshotRequest{Name: snap}, nil); err != nil {
			return hint(noSnapshots(e, err), vol, "")
		}
		fmt.Fprintf(e.stderr, "took snapshot %s@%s to export; it is deleted when the export ends\n", vol, snap)
		defer func() {
			if err := e.api.do("DELETE", snapPath(vol, snap), nil, nil); err != nil {
				fmt.Fprintf(e.stderr, "blkctl: delete the export's snapshot %s@%s: %v (delete it with blkctl volume delete %s@%s)\n", vol, snap, err, vol, snap)
			}
		}()
		a[0] = vol + "@" + snap
	}
	path := snapPath(vol, snap) + "/export"
	if since != "" {
		path += "?since=" + url.QueryEscape(since)
	}
	hc := streamClient(e)
	resp, err := getStream(ctx, hc, e.api.base+path)
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusMisdirectedRequest {
		err, primary := streamError(resp, "export")
		resp.Body.Close()
		if primary == "" {
			return err
		}
		fmt.Fprintf(e.stderr, "blkctl: exporting from %s's primary at %s\n", vol, primary)
		if resp, err = getStream(ctx, hc, baseURL(e.api, primary)+path); err != nil {
			return err
		}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err, _ := streamError(resp, "export")
		return hint(noSnapshots(e, err), vol, "")
	}
	var cnt counter
	body := countingReader{resp.Body, &cnt}
	if c.Bool("progress") || isTerminal(os.Stderr) {
		stop := make(chan struct{})
		defer close(stop)
		total := uint64(max(resp.ContentLength, 0))
		go showProgress(e.stderr, "export "+a[0], &cnt, total, stop)
	}
	out, done, err := openOut(e, a[1])
	if err != nil {
		return err
	}
	var h image.Header
	if format == "raw" {
		h, err = writeRaw(body, out)
	} else {
		h, err = copyImage(body, out)
	}
	if err = done(err); err != nil {
		return fmt.Errorf("export %s: %w", a[0], err)
	}
	if e.json {
		return e.printJSON(map[string]any{"snapshot": a[0], "file": a[1], "format": format, "size_bytes": h.SizeBytes, "data_bytes": h.DataBytes, "bytes": cnt.n.Load(), "since": since})
	}
	what := "whole"
	if h.Base != nil {
		what = "changes since " + vol + "@" + h.Base.Name
	}
	fmt.Fprintf(e.stderr, "exported %s (%s, %s): %s of data, %s streamed, checksum verified\n", a[0], api.HumanSize(h.SizeBytes), what, api.HumanSize(h.DataBytes), api.HumanSize(cnt.n.Load()))
	return nil
}

func getStream(ctx context.Context, hc *http.Client, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach blkd: %v", err)
	}
	return resp, nil
}

// openOut opens the export's destination: stdout for "-", else the
// file, created (or truncated). done closes it; on an error it removes
// the file, which would hold a partial image.
func openOut(e *env, name string) (io.Writer, func(error) error, error) {
	if name == "-" {
		return e.stdout, func(err error) error { return err }, nil
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, nil, err
	}
	return f, func(err error) error {
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(name)
			return fmt.Errorf("%w (%s removed)", err, name)
		}
		return nil
	}, nil
}

// copyImage copies an image from r to w, reading it as it goes: a
// damaged or truncated stream is an error, not a file that looks whole.
func copyImage(r io.Reader, w io.Writer) (image.Header, error) {
	ir, err := image.NewReader(io.TeeReader(r, w))
	if err != nil {
		return image.Header{}, err
	}
	for {
		if _, err := ir.Next(); err != nil {
			if errors.Is(err, io.EOF) {
				return ir.Header(), nil
			}
			return ir.Header(), err
		}
	}
}

// writeRaw writes a whole image from r as the raw bytes of its volume
// into f: a file of the image's size whose holes are sparse (stdout,
// which cannot seek, gets zeros written).
func writeRaw(r io.Reader, w io.Writer) (image.Header, error) {
	ir, err := image.NewReader(r)
	if err != nil {
		return image.Header{}, err
	}
	h := ir.Header()
	if h.Base != nil {
		return h, fmt.Errorf("the image is a diff (since %s): a raw file is a whole volume", h.Base.Name)
	}
	f, seekable := w.(*os.File)
	if seekable {
		_, err := f.Seek(0, io.SeekCurrent)
		seekable = err == nil
	}
	bs := uint64(h.BlockSize)
	buf := make([]byte, 1<<20)
	var pos uint64 // bytes written (or skipped) so far
	zeros := func(to uint64) error {
		if seekable {
			pos = to
			return nil
		}
		clear(buf)
		for pos < to {
			n, err := w.Write(buf[:min(uint64(len(buf)), to-pos)])
			pos += uint64(n)
			if err != nil {
				return err
			}
		}
		return nil
	}
	for {
		rec, err := ir.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return h, err
		}
		if err := zeros(rec.LBA * bs); err != nil {
			return h, err
		}
		if rec.Kind == image.KindZero {
			continue // a whole image's zero run: a hole
		}
		for end := (rec.LBA + rec.Blocks) * bs; pos < end; {
			p := buf[:min(uint64(len(buf)), end-pos)]
			if _, err := io.ReadFull(ir, p); err != nil {
				return h, err
			}
			var err error
			if seekable {
				_, err = f.WriteAt(p, int64(pos))
			} else {
				_, err = w.Write(p)
			}
			if err != nil {
				return h, err
			}
			pos += uint64(len(p))
		}
	}
	if seekable {
		return h, f.Truncate(int64(h.SizeBytes))
	}
	return h, zeros(h.SizeBytes)
}

func volumeImport(c *cli.Context) error {
	a, err := args(c, "file", "name")
	if err != nil {
		return err
	}
	name := a[1]
	if err := api.CheckName("NAME", name); err != nil {
		return usageErrorf("%s: %v", c.Command.FullName(), err)
	}
	base := c.String("base")
	if base != "" {
		if v0, s0, ok, err := splitSnap(base); ok {
			if err != nil || v0 != name {
				return usageErrorf("--base %s: name a snapshot of %s", base, name)
			}
			base = s0
		}
		if err := api.CheckName("--base", base); err != nil {
			return usageErrorf("%v", err)
		}
	}
	var minSize uint64
	if c.IsSet("size") {
		if minSize, err = sizeFlag(c); err != nil {
			return err
		}
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	in, total, err := openIn(c, a[0])
	if err != nil {
		return err
	}
	defer in.Close()
	// The header first: it says what volume to make.
	hdr := make([]byte, image.HeaderSize)
	if _, err := io.ReadFull(in, hdr); err != nil {
		return fmt.Errorf("%s: the image's header: %v", a[0], err)
	}
	ir, err := image.NewReader(bytes.NewReader(hdr))
	if err != nil {
		return fmt.Errorf("%s: %w", a[0], err)
	}
	h := ir.Header()
	var v volume
	switch {
	case h.Base == nil && base != "":
		return usageErrorf("%s is a whole image of %s@%s: it goes into a new volume, without --base", a[0], h.Volume, h.Snapshot)
	case h.Base != nil && base == "":
		return usageErrorf("%s holds the changes of %s@%s since %s@%s: import it onto the volume that holds that snapshot's import, with --base SNAPSHOT (blkctl volume snapshots VOLUME lists their origins)", a[0], h.Volume, h.Snapshot, h.Volume, h.Base.Name)
	case base != "":
		var s api.Snapshot
		err := e.api.do("GET", snapPath(name, h.Snapshot), nil, &s)
		var ae *apiError
		switch {
		case err == nil:
			return fmt.Errorf("%s@%s exists: %s (the changes up to %s@%s) was imported already", name, h.Snapshot, a[0], h.Volume, h.Snapshot)
		case !errors.As(err, &ae) || ae.Status != http.StatusNotFound:
			return hint(noSnapshots(e, err), name, "")
		}
		if v, err = prepareBase(e, name, base, max(h.SizeBytes, minSize)); err != nil {
			return err
		}
	default:
		if v, err = createForImport(c, e, name, h, minSize); err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "created volume %s (%s, block size %d) on node %s\n", v.Name, api.HumanSize(v.SizeBytes), v.BlockSize, v.Node)
	}
	primary := e.api.base
	var cl clusterInfo
	if err := e.api.do("GET", "/v1/cluster", nil, &cl); err == nil {
		for _, m := range cl.Members {
			if m.ID == v.Node && m.APIAddr != "" {
				primary = baseURL(e.api, m.APIAddr)
			}
		}
	}
	var cnt counter
	body := io.MultiReader(bytes.NewReader(hdr), countingReader{in, &cnt})
	if c.Bool("progress") || isTerminal(os.Stderr) {
		stop := make(chan struct{})
		defer close(stop)
		go showProgress(e.stderr, "import "+name, &cnt, total, stop)
	}
	u := primary + volPath(name) + "/import"
	if base != "" {
		u += "?base=" + url.QueryEscape(base)
	}
	req, err := http.NewRequestWithContext(c.Context, http.MethodPut, u, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", api.ImageContentType)
	resp, err := streamClient(e).Do(req)
	if err != nil {
		return fmt.Errorf("import into %s: cannot reach blkd at %s: %v; the volume is left as written", name, primary, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err, _ := streamError(resp, "import")
		if base == "" {
			return fmt.Errorf("%w (volume %s was created for the import: delete it with blkctl volume delete %s)", err, name, name)
		}
		return err
	}
	var res api.ImportResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&res); err != nil {
		return fmt.Errorf("import into %s: the answer: %v", name, err)
	}
	var s api.Snapshot
	if err := e.api.do("POST", volPath(name)+"/snapshots", api.SnapshotRequest{Name: res.Snapshot, Origin: res.Origin}, &s); err != nil {
		return fmt.Errorf("imported %s@%s into %s, but its snapshot %s@%s (the base of the next diff) was not taken: %w; take it with the API (POST %s/snapshots {\"name\": %q, \"origin\": %q})", h.Volume, h.Snapshot, name, name, res.Snapshot, err, volPath(name), res.Snapshot, res.Origin)
	}
	if e.json {
		return e.printJSON(map[string]any{"import": res, "snapshot": s})
	}
	fmt.Fprintf(e.stdout, "imported %s@%s (%s of data, %d records) into volume %s; snapshot %s@%s (origin %s)\n", h.Volume, h.Snapshot, api.HumanSize(res.WrittenBytes), res.Records, name, name, s.Name, res.Origin)
	return nil
}

// openIn opens the import's source; total is its size when known.
func openIn(c *cli.Context, name string) (io.ReadCloser, uint64, error) {
	if name == "-" {
		return io.NopCloser(c.App.Reader), 0, nil
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, 0, err
	}
	var total uint64
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
		total = uint64(fi.Size())
	}
	return f, total, nil
}

// createForImport creates volume name for the whole image h, and waits
// until it is online.
func createForImport(c *cli.Context, e *env, name string, h image.Header, minSize uint64) (volume, error) {
	size := max(h.SizeBytes, minSize)
	if size%uint64(h.BlockSize) != 0 {
		return volume{}, usageErrorf("--size %d is not a multiple of the image's block size %d", size, h.BlockSize)
	}
	body := map[string]any{"name": name, "size": size, "block_size": h.BlockSize}
	if c.IsSet("replicas") {
		n := c.Int("replicas")
		if n < 1 || n > 5 {
			return volume{}, usageErrorf("--replicas %d: give 1 to 5", n)
		}
		body["replicas"] = n
	}
	if c.IsSet("node") {
		node := c.String("node")
		if err := api.CheckName("--node", node); err != nil {
			return volume{}, usageErrorf("%v", err)
		}
		body["node"] = node
	}
	var v volume
	if err := e.api.do("POST", "/v1/volumes", body, &v); err != nil {
		return v, err
	}
	return waitOnline(e, name)
}

// prepareBase makes volume name ready for a diff onto its snapshot
// base: reverted to it (nothing written since may mix with the diff),
// grown to size if smaller.
func prepareBase(e *env, name, base string, size uint64) (volume, error) {
	var v volume
	if err := e.api.do("POST", volPath(name)+"/revert", api.RevertRequest{Snapshot: base}, &v); err != nil {
		return v, fmt.Errorf("import onto %s@%s: revert %s to it first: %w", name, base, name, hint(noSnapshots(e, err), name, ""))
	}
	if v.SizeBytes < size {
		sz := api.Size(size)
		if err := e.api.do("POST", volPath(name)+"/resize", api.ResizeRequest{Size: &sz}, &v); err != nil {
			return v, fmt.Errorf("import onto %s@%s: grow %s to the image's %s: %w", name, base, name, api.HumanSize(size), err)
		}
	}
	return waitOnline(e, name)
}

// waitOnline waits (up to 30 s) until volume name is online.
func waitOnline(e *env, name string) (volume, error) {
	var v volume
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := e.api.do("GET", volPath(name), nil, &v); err != nil {
			return v, err
		}
		if v.State == api.StateOnline {
			return v, nil
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("volume %s is %s, not online, after 30 s: the import waits for it to be online", name, v.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
