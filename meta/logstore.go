package meta

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// Key layout of the pebble DB behind PebbleStore. Every key starts with a
// one-byte family so each family is one contiguous range:
//
//	'f'                          → storeFormat (written once at creation)
//	'l' | index (8 bytes, BE)    → encoded raft.Log (see encodeLog)
//	's' | key (raw bytes)        → StableStore value
//
// Big-endian indexes sort numerically, so FirstIndex/LastIndex are the first
// and last keys of the 'l' range and DeleteRange is one range tombstone.
const (
	familyFormat = 'f'
	familyLog    = 'l'
	familyStable = 's'

	logKeyLen = 1 + 8
)

var storeFormat = []byte("blk-meta-raft-v1")

// ErrKeyNotFound is what StableStore.Get and GetUint64 return for a missing
// key. hashicorp/raft compares the message: it must be exactly "not found".
var ErrKeyNotFound = errors.New("not found")

// StoreOptions configures a PebbleStore.
type StoreOptions struct {
	// Dir is the pebble directory. Required.
	Dir string
	// FS is the filesystem. Default: vfs.Default (the OS).
	FS vfs.FS
	// CacheBytes is pebble's block cache size. Default: 8 MiB (the log is
	// read mostly right after it is written, by replication).
	CacheBytes int64
}

// PebbleStore is a raft.LogStore and raft.StableStore on one pebble DB.
// Every mutation is synced before it returns.
type PebbleStore struct {
	db  *pebble.DB
	fs  vfs.FS
	dir string

	mu     sync.Mutex // guards closed
	closed bool
}

var (
	_ raft.LogStore    = (*PebbleStore)(nil)
	_ raft.StableStore = (*PebbleStore)(nil)
)

// OpenStore opens (creating if needed) a PebbleStore.
func OpenStore(o StoreOptions) (*PebbleStore, error) {
	if o.Dir == "" {
		return nil, fmt.Errorf("meta: store: empty Dir: %w", ErrInvalid)
	}
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = 8 << 20
	}
	cache := pebble.NewCache(o.CacheBytes)
	defer cache.Unref()
	db, err := pebble.Open(o.Dir, &pebble.Options{
		FS:                 o.FS,
		Cache:              cache,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             quietLogger{},
	})
	if err != nil {
		return nil, fmt.Errorf("meta: open store %q: %w", o.Dir, err)
	}
	s := &PebbleStore{db: db, fs: o.FS, dir: o.Dir}
	if err := s.checkFormat(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("meta: store %q: %w", o.Dir, err)
	}
	return s, nil
}

func (s *PebbleStore) checkFormat() error {
	v, closer, err := s.db.Get([]byte{familyFormat})
	if errors.Is(err, pebble.ErrNotFound) {
		return s.db.Set([]byte{familyFormat}, storeFormat, pebble.Sync)
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	if string(v) != string(storeFormat) {
		return fmt.Errorf("format %q, want %q", v, storeFormat)
	}
	return nil
}

// Close closes the DB. It is idempotent.
func (s *PebbleStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.db.Close()
}

func logKey(i uint64) []byte {
	k := make([]byte, logKeyLen)
	k[0] = familyLog
	binary.BigEndian.PutUint64(k[1:], i)
	return k
}

// encodeLog: term u64 | type u8 | appendedAt unix-nanos i64 (0 = zero time)
// | uvarint len + data | uvarint len + extensions. All fixed fields
// big-endian.
func encodeLog(l *raft.Log) []byte {
	b := make([]byte, 0, 17+2*binary.MaxVarintLen64+len(l.Data)+len(l.Extensions))
	b = binary.BigEndian.AppendUint64(b, l.Term)
	b = append(b, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = binary.AppendUvarint(b, uint64(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.AppendUvarint(b, uint64(len(l.Extensions)))
	b = append(b, l.Extensions...)
	return b
}

func decodeLog(index uint64, b []byte, l *raft.Log) error {
	bad := fmt.Errorf("meta: store: log %d: %d bytes: corrupt", index, len(b))
	if len(b) < 17 {
		return bad
	}
	l.Index = index
	l.Term = binary.BigEndian.Uint64(b)
	l.Type = raft.LogType(b[8])
	at := int64(binary.BigEndian.Uint64(b[9:]))
	l.AppendedAt = time.Time{}
	if at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	b = b[17:]
	field := func() ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, false
		}
		var out []byte
		if n > 0 {
			out = append([]byte(nil), b[k:k+int(n)]...)
		}
		b = b[k+int(n):]
		return out, true
	}
	var ok bool
	if l.Data, ok = field(); !ok {
		return bad
	}
	if l.Extensions, ok = field(); !ok || len(b) != 0 {
		return bad
	}
	return nil
}

// edge returns the first (last=false) or last log index, 0 if none.
func (s *PebbleStore) edge(last bool) (uint64, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: []byte{familyLog},
		UpperBound: []byte{familyLog + 1},
	})
	if err != nil {
		return 0, err
	}
	var ok bool
	if last {
		ok = it.Last()
	} else {
		ok = it.First()
	}
	var idx uint64
	if ok {
		k := it.Key()
		if len(k) != logKeyLen {
			_ = it.Close()
			return 0, fmt.Errorf("meta: store: log key %x: corrupt", k)
		}
		idx = binary.BigEndian.Uint64(k[1:])
	}
	return idx, it.Close()
}

// FirstIndex implements raft.LogStore: the first index written, 0 if none.
func (s *PebbleStore) FirstIndex() (uint64, error) { return s.edge(false) }

// LastIndex implements raft.LogStore: the last index written, 0 if none.
func (s *PebbleStore) LastIndex() (uint64, error) { return s.edge(true) }

// GetLog implements raft.LogStore. A missing index is raft.ErrLogNotFound.
func (s *PebbleStore) GetLog(index uint64, l *raft.Log) error {
	v, closer, err := s.db.Get(logKey(index))
	if errors.Is(err, pebble.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("meta: store: get log %d: %w", index, err)
	}
	defer closer.Close()
	return decodeLog(index, v, l)
}

// StoreLog implements raft.LogStore.
func (s *PebbleStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// MinFreeBytes is the free space under which StoreLogs refuses new log
// entries (ErrNoSpace): pebble treats a failed WAL write as fatal and
// would end the process, while raft survives a refused StoreLogs (the
// leader steps down and the entry is retried). 16 MiB is many thousand
// registry commands and a memtable flush.
const MinFreeBytes = 16 << 20

// ErrNoSpace: the registry's filesystem is nearly full.
var ErrNoSpace = errors.New("meta: no space left for the registry")

// StoreLogs implements raft.LogStore: one batch, synced before returning.
// It refuses (ErrNoSpace) when the filesystem has under MinFreeBytes free.
func (s *PebbleStore) StoreLogs(logs []*raft.Log) error {
	if du, err := s.fs.GetDiskUsage(s.dir); err == nil && du.AvailBytes < MinFreeBytes {
		return fmt.Errorf("meta: store: %d logs: %d bytes free on %s: %w", len(logs), du.AvailBytes, s.dir, ErrNoSpace)
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, l := range logs {
		if err := b.Set(logKey(l.Index), encodeLog(l), nil); err != nil {
			return fmt.Errorf("meta: store: log %d: %w", l.Index, err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("meta: store: commit %d logs: %w", len(logs), err)
	}
	return nil
}

// DeleteRange implements raft.LogStore: deletes [min, max], synced.
func (s *PebbleStore) DeleteRange(min, max uint64) error {
	if min > max {
		return nil
	}
	hi := []byte{familyLog + 1}
	if max < math.MaxUint64 {
		hi = logKey(max + 1)
	}
	if err := s.db.DeleteRange(logKey(min), hi, pebble.Sync); err != nil {
		return fmt.Errorf("meta: store: delete logs [%d, %d]: %w", min, max, err)
	}
	return nil
}

func stableKey(k []byte) []byte { return append([]byte{familyStable}, k...) }

// Set implements raft.StableStore, synced.
func (s *PebbleStore) Set(k, v []byte) error {
	if err := s.db.Set(stableKey(k), v, pebble.Sync); err != nil {
		return fmt.Errorf("meta: store: set %q: %w", k, err)
	}
	return nil
}

// Get implements raft.StableStore. A missing key is ErrKeyNotFound.
func (s *PebbleStore) Get(k []byte) ([]byte, error) {
	v, closer, err := s.db.Get(stableKey(k))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("meta: store: get %q: %w", k, err)
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}

// SetUint64 implements raft.StableStore (8 bytes, big-endian).
func (s *PebbleStore) SetUint64(k []byte, v uint64) error {
	return s.Set(k, binary.BigEndian.AppendUint64(nil, v))
}

// GetUint64 implements raft.StableStore. A missing key is ErrKeyNotFound.
func (s *PebbleStore) GetUint64(k []byte) (uint64, error) {
	v, err := s.Get(k)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("meta: store: %q holds %d bytes, want 8", k, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// quietLogger drops pebble's informational chatter and keeps errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any) {}
func (quietLogger) Errorf(format string, args ...any) {
	pebble.DefaultLogger.Errorf(format, args...)
}
func (quietLogger) Fatalf(format string, args ...any) {
	// Pebble cannot go on after this (a failed WAL write or sync): say
	// plainly what failed before it ends the process.
	fmt.Fprintf(os.Stderr, "blkd: registry store: fatal pebble error (is the data dir's disk full or failing?): "+format+"\n", args...)
	pebble.DefaultLogger.Fatalf(format, args...)
}
