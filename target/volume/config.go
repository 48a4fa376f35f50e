package volume

import (
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Config configures a Store. The zero value of every field but Dir means
// its default; WithDefaults fills them in and Validate checks the
// relationships between them. A Config round-trips through encoding/json
// unchanged except for FS and Logger, which are not data.
type Config struct {
	// Dir is the pebble directory: one per storage node, holding every
	// volume of the node. Required.
	Dir string `json:"dir"`

	// FS is the filesystem pebble runs on. Default: vfs.Default, the
	// operating system's. Tests pass vfs.NewMem(), vfs.NewCrashableMem()
	// or an errorfs wrapper.
	FS vfs.FS `json:"-"`

	// Logger receives pebble's informational and error messages. Default:
	// pebble's DefaultLogger (the standard library's log package). Pebble's
	// fatal messages never reach the process's exit: the store records them
	// and fails (see ErrIO), and passes them here as errors.
	Logger Logger `json:"-"`

	// MaxTransferBytes bounds the data of one Read or Write, in bytes: the
	// NVMe MDTS the target will advertise. Default 1 MiB. A multiple of
	// 4096, at least 4096, and at most MemTableBytes/4 so that a maximal
	// write batch (data plus ~21 bytes of key and framing per block) stays
	// below pebble's large-batch threshold (half a memtable), where pebble
	// would keep the batch's buffer instead of recycling it.
	MaxTransferBytes int `json:"max_transfer_bytes"`

	// PointDeleteMaxBlocks is the longest run of blocks that WriteZeroes
	// and Deallocate remove with one point delete per block; longer runs
	// get one range deletion. Default 64. See doc.go for why small runs
	// are point deletes. At least 1, at most MaxTransferBytes/512 so that
	// a point-delete batch is never larger than a maximal write batch.
	PointDeleteMaxBlocks int `json:"point_delete_max_blocks"`

	// MemTableBytes is pebble's memtable size, in bytes. Default 64 MiB:
	// large enough that a burst of writes at the maximum transfer size
	// does not stall on memtable rotation, small enough that the WAL
	// replayed on reopen stays short. Up to 4 memtables queue for flushing
	// before writes stall, so memtables use up to 4 × MemTableBytes.
	MemTableBytes int `json:"memtable_bytes"`

	// CacheBytes is pebble's block cache, in bytes, shared by every volume
	// of the store. Default 256 MiB. Zero means the default; there is no
	// way to run without a cache, because every read goes through it.
	CacheBytes int64 `json:"cache_bytes"`

	// ReadOnly opens the store read-only: every write and every
	// administrative change fails with ErrReadOnly.
	ReadOnly bool `json:"read_only"`

	// ReserveBytes is the free space the store keeps on its filesystem:
	// below it, writes fail with ErrNoSpace (reads, write-zeroes and
	// deallocates go on) until free space is back above 1.25 × it. It
	// leaves pebble room to flush the memtables and compact, so the store
	// never meets a full disk (where pebble's failure is fatal and every
	// read would fail until a reopen). Default (0): 5% of the
	// filesystem, at least 128 MiB and at most 4 GiB.
	ReserveBytes uint64 `json:"reserve_bytes"`

	// SpaceCheckInterval is how often free space is read (statfs). Default
	// 100 ms: at 2 GB/s of writes the reserve must then cover 200 MB.
	SpaceCheckInterval time.Duration `json:"space_check_interval"`

	// SyncInterval bounds how long an acknowledged plain (not FUA) write,
	// write-zeroes or deallocate stays unsynced: a background syncer syncs
	// the WAL within SyncInterval of the first plain mutation since its
	// last sync, so a write survives a crash of the process or of the
	// machine once SyncInterval plus that sync have passed (docs/volume.md,
	// "Durability contract"). Default 10 ms (DefaultSyncInterval): at most
	// 100 syncs a second (54 measured under sustained plain writes), none
	// while the store is idle or when the host flushes more often, and no
	// measurable cost to plain writes (docs/volume.md, "Background WAL
	// sync"). A negative value syncs as soon as a plain write is
	// acknowledged (back to back under load: thousands of device flushes a
	// second). At most MaxSyncInterval (1 s).
	SyncInterval time.Duration `json:"sync_interval"`
}

// Logger is the part of pebble's Logger that the store forwards to. The
// third method, Fatalf, is the store's own: see Config.Logger.
type Logger interface {
	Infof(format string, args ...any)
	Errorf(format string, args ...any)
}

// Defaults, in the units of the fields they fill.
const (
	DefaultMaxTransferBytes     = 1 << 20
	DefaultPointDeleteMaxBlocks = 64
	DefaultMemTableBytes        = 64 << 20
	DefaultCacheBytes           = 256 << 20
)

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.MaxTransferBytes == 0 {
		c.MaxTransferBytes = DefaultMaxTransferBytes
	}
	if c.PointDeleteMaxBlocks == 0 {
		c.PointDeleteMaxBlocks = DefaultPointDeleteMaxBlocks
	}
	if c.MemTableBytes == 0 {
		c.MemTableBytes = DefaultMemTableBytes
	}
	if c.CacheBytes == 0 {
		c.CacheBytes = DefaultCacheBytes
	}
	if c.SyncInterval == 0 {
		c.SyncInterval = DefaultSyncInterval
	}
	return c
}

// Validate checks c after defaults are applied: each field within its
// bounds and the fields consistent with each other. It returns every
// problem found, each wrapping ErrInvalid.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("volume: config: "+format+": %w", append(args, ErrInvalid)...))
	}
	if c.Dir == "" {
		bad("Dir is empty")
	}
	if c.MaxTransferBytes < BlockSize4K || c.MaxTransferBytes%BlockSize4K != 0 {
		bad("MaxTransferBytes %d is not a positive multiple of %d", c.MaxTransferBytes, BlockSize4K)
	}
	if c.MemTableBytes < 4*c.MaxTransferBytes {
		bad("MemTableBytes %d is below 4 × MaxTransferBytes (%d)", c.MemTableBytes, 4*c.MaxTransferBytes)
	}
	if c.PointDeleteMaxBlocks < 1 || c.PointDeleteMaxBlocks > c.MaxTransferBytes/BlockSize512 {
		bad("PointDeleteMaxBlocks %d is outside [1, MaxTransferBytes/512 = %d]",
			c.PointDeleteMaxBlocks, c.MaxTransferBytes/BlockSize512)
	}
	if c.CacheBytes < 0 {
		bad("CacheBytes %d is negative", c.CacheBytes)
	}
	if c.SyncInterval > MaxSyncInterval {
		bad("SyncInterval %v is above %v: a process crash could lose that much of acknowledged writes", c.SyncInterval, MaxSyncInterval)
	}
	return errors.Join(errs...)
}
