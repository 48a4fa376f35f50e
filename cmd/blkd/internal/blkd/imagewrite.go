package blkd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/internal/image"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
)

// Where an import's records go (docs/snapshots.md §5.3). A volume of one
// copy: its store volume, through the store's own backend (each write
// served before Submit returns, as Volume.Write). A replicated one: the
// volume's namespace backend on its primary, the path of a host's
// writes — the term's repl.Backend behind the lease check — so every
// write lands on the local store and on every in-sync replica, a
// replica that fails one leaves the in-sync set and is rebuilt later
// exactly as for a host's write, a rebuild running meanwhile gets the
// writes it must, and the dirty-region log of an out-of-sync replica
// records them. Writing the primary's store and then copying it whole
// to every replica would be simpler to start but not to make correct:
// a rebuild running at the time would not see the import's writes, and
// the volume's copies would differ until every full copy ended.

// importDepth is the writes of an import into a replicated volume in
// flight at once, each a buffer of imageChunk bytes: while one 1 MiB
// write makes its round trip to the replicas, the next ones are read
// from the request and sent. A volume of one copy needs one: its
// backend writes before Submit returns.
const importDepth = 8

// importServeWait bounds how long an import waits for the primary's term
// of a replicated volume to serve (its legs connected, its first
// lease): a volume just created is online before its primary's lease is
// granted (blkctl volume import creates, then imports).
const importServeWait = 10 * time.Second

// errTermEnded fails an import's write once the primary term it started
// in has ended (a failover, a new epoch): the next term's copies may not
// get writes of this one.
var errTermEnded = errors.New("the volume's primary term on this node ended during the import (a failover or a new epoch)")

// importTerm is the primary term of a replicated volume an import writes
// through. It counts the writes it has in flight (primaryLeg.imports)
// so that endTerm waits for them as it drains the hosts' (failover.go).
type importTerm struct {
	hv *hostVolume
	pl *primaryLeg
}

// Submit passes io to the host path's backend while pl is its term. The
// count goes up before the term is checked, and endTerm clears the term
// before it reads the count: either this sees the term gone, or endTerm
// sees the write and waits for it. Every IO, passed on or failed here,
// is completed through done, which counts it down.
func (t importTerm) Submit(io *target.IO) {
	t.pl.imports.Add(1)
	if t.hv.hb.cur.Load() != t.pl {
		io.Done(errTermEnded)
		return
	}
	t.hv.hb.Submit(io)
}

// done is told of each IO Submit took, once it completed.
func (t importTerm) done() { t.pl.imports.Add(-1) }

// importBackend is the backend an import into v writes through, and the
// function to call as each of its writes completes (nil: none).
func (d *Daemon) importBackend(ctx context.Context, v meta.Volume) (submit func(*target.IO), done func(), depth int, err error) {
	if len(v.ReplicaSet()) == 1 {
		sv, err := d.store.Volume(store.ID(v.ID))
		if err != nil {
			return nil, nil, 0, &apiError{http.StatusInternalServerError, fmt.Sprintf("volume %q: node %s's store: %v", v.Name, d.cfg.NodeID, err)}
		}
		return d.sio.Backend(sv).Submit, nil, 1, nil
	}
	ctx, cancel := context.WithTimeout(ctx, importServeWait)
	defer cancel()
	for {
		if hv, pl := d.termAt(v); pl != nil {
			select {
			case <-pl.leased:
				t := importTerm{hv, pl}
				return t.Submit, t.done, importDepth, nil
			default:
			}
		}
		select {
		case <-ctx.Done():
			return nil, nil, 0, &apiError{http.StatusServiceUnavailable, fmt.Sprintf("volume %q: node %s does not serve it as its primary at epoch %d (its replicas connected, its lease granted) after %v: try again", v.Name, d.cfg.NodeID, v.CurrentEpoch(), importServeWait)}
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// importWriter writes an image's records through a backend, up to its
// depth at once, each from a buffer of its own. Records of an image do
// not overlap (image.Reader refuses one that starts before the previous
// one ends), so writes in flight together may complete in any order.
// After the first failure nothing more is submitted; wait returns it.
type importWriter struct {
	submit func(*target.IO)
	done   func()
	free   chan *importIO
	wg     sync.WaitGroup

	mu  sync.Mutex
	err error
}

// importIO is one write slot of an importWriter.
type importIO struct {
	io  target.IO
	buf []byte
	w   *importWriter
}

func newImportWriter(submit func(*target.IO), done func(), depth int) *importWriter {
	w := &importWriter{submit: submit, done: done, free: make(chan *importIO, depth)}
	for range depth {
		s := &importIO{w: w}
		s.io.SetComplete(s.complete)
		w.free <- s
	}
	return w
}

func (s *importIO) complete(_ *target.IO, err error) {
	w := s.w
	if err != nil {
		w.mu.Lock()
		if w.err == nil {
			w.err = fmt.Errorf("%v at LBA %d: %w", opName(s.io.Op), s.io.LBA, err)
		}
		w.mu.Unlock()
	}
	if w.done != nil {
		w.done()
	}
	s.io.Data = nil
	w.free <- s
	w.wg.Done()
}

func opName(op target.IOOp) string {
	switch op {
	case target.OpWrite:
		return "write"
	case target.OpWriteZeroes:
		return "write zeroes"
	case target.OpFlush:
		return "flush"
	}
	return fmt.Sprintf("op %d", op)
}

// failed is the first write's failure, nil if none yet.
func (w *importWriter) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// slot waits for a free write slot.
func (w *importWriter) slot() *importIO { return <-w.free }

// start submits slot s's IO, filled by the caller.
func (w *importWriter) start(s *importIO) {
	w.wg.Add(1)
	w.submit(&s.io)
}

// wait waits for every write submitted, then flushes (unless one
// failed); it returns the first failure.
func (w *importWriter) wait() error {
	w.wg.Wait()
	if err := w.failed(); err != nil {
		return err
	}
	s := w.slot()
	s.io.Op, s.io.LBA, s.io.Blocks, s.io.Data, s.io.FUA = target.OpFlush, 0, 0, nil, false
	w.start(s)
	w.wg.Wait()
	return w.failed()
}

// readImage writes the records of ir through w, counting into res. An
// error of the image is returned as it is; one of the writes as a
// storeError. The writes submitted have completed when it returns.
func readImage(ir *image.Reader, w *importWriter, res *api.ImportResult) error {
	err := readRecords(ir, w, res)
	if werr := w.wait(); werr != nil {
		return &storeError{werr}
	}
	return err
}

func readRecords(ir *image.Reader, w *importWriter, res *api.ImportResult) error {
	bs := uint64(ir.Header().BlockSize)
	for {
		if w.failed() != nil {
			return nil // wait reports it
		}
		rec, err := ir.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		res.Records++
		if rec.Kind == image.KindZero {
			s := w.slot()
			s.io.Op, s.io.LBA, s.io.Blocks, s.io.Data, s.io.FUA = target.OpWriteZeroes, rec.LBA, rec.Blocks, nil, false
			w.start(s)
			continue
		}
		for lba, end := rec.LBA, rec.LBA+rec.Blocks; lba < end; {
			if w.failed() != nil {
				return nil
			}
			n := min(end-lba, imageChunk/bs)
			s := w.slot()
			if s.buf == nil {
				s.buf = make([]byte, imageChunk)
			}
			p := s.buf[:n*bs]
			if _, err := io.ReadFull(ir, p); err != nil {
				w.free <- s
				return err
			}
			s.io.Op, s.io.LBA, s.io.Blocks, s.io.Data, s.io.FUA = target.OpWrite, lba, n, p, false
			w.start(s)
			res.WrittenBytes += uint64(len(p))
			lba += n
		}
	}
}
