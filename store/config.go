package store

import (
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Config configures a Store. The zero value of every field but Dir means
// its default; WithDefaults fills them in and Validate checks them. It
// round-trips through encoding/json unchanged except for FS, Area and
// Logger, which are not data.
type Config struct {
	// Dir is the pebble directory holding the metadata (volume records,
	// maps, reservations). Required.
	Dir string `json:"dir"`

	// FS is the filesystem pebble runs on. Default: vfs.Default. Tests
	// pass vfs.NewCrashableMem() (with a MemArea, cloned together).
	FS vfs.FS `json:"-"`

	// Area, if set, is the data area to use (already open; the store
	// closes it). Tests pass a MemArea; store/aio will pass its engine.
	// Otherwise the store opens AreaPath with O_DIRECT.
	Area Area `json:"-"`

	// AreaPath is the data area file. Default: Dir + ".area" (none when
	// AreaDevice is set). Created and preallocated with AreaBytes when the
	// store is created.
	AreaPath string `json:"area_path"`

	// AreaDevice, if set, is a block device that is the data area instead
	// of AreaPath's file (docs/store.md, "Data area on a block device"):
	// opened O_DIRECT|O_EXCL (refused while mounted or held), its whole
	// size used, never grown; AreaBytes and AreaMaxBytes do not apply.
	// Fixed when the store is created: a store created with a file area
	// refuses to open with a device, and the reverse. Default: none.
	AreaDevice string `json:"area_device,omitempty"`

	// WipeDevice allows creating the store on an AreaDevice that holds
	// data (a filesystem, a partition table, LVM, another blk store):
	// without it, Open refuses such a device with ErrNotBlank and names
	// what it found. With it, creating the store zeroes the device's first
	// and last MiB (the signatures); either way every other cluster is
	// zeroed when first handed out, never the whole device at creation.
	// Ignored once the store exists. Default false.
	WipeDevice bool `json:"wipe_device,omitempty"`

	// AreaBytes is the size of the data area file the store creates
	// (it grows from there: AreaMaxBytes). Default 1 GiB. Rounded down to
	// whole clusters; at least two clusters (the first holds the header).
	// Ignored once the area exists.
	AreaBytes int64 `json:"area_bytes"`

	// AreaMaxBytes bounds the data area's growth: a file area grows (by an
	// eighth, at least ReadyClusters clusters, fallocated) when no cluster
	// is free, up to this size and never into the space guard's reserve.
	// Default 0: no bound but the filesystem's free space.
	AreaMaxBytes int64 `json:"area_max_bytes"`

	// ClusterBytes is the unit of allocation, fixed when the store is
	// created (a reopen with another value fails). Default 64 KiB
	// (docs/store.md, "Cluster size"): a power of two from 4 KiB to 4 MiB.
	ClusterBytes int `json:"cluster_bytes"`

	// ReadyClusters is how many clusters one refill of the ready pool
	// reserves with one synced pebble commit: first writes cost one WAL
	// sync per ReadyClusters clusters, and Open after a crash zeroes at
	// most that many (plus those freed since the last Flush; none after a
	// clean Close). Default 1024 (64 MiB at the default cluster size).
	ReadyClusters int `json:"ready_clusters"`

	// ReadyLowClusters is the ready pool's low-water mark: when a first
	// write leaves fewer clusters than this in the pool, a background
	// refill tops it up to ReadyClusters (refill.go), so that first writes
	// find a ready cluster instead of one of them paying the refill (a
	// synced pebble commit; on a lazily zeroed device also zeroing up to
	// ReadyClusters clusters and an area sync, tens of ms where the
	// device writes its zeros) with every first write queued behind it.
	// Default ReadyClusters/2 (at least 1): the refill of half a pool
	// zeroes and syncs half as much as a whole one, in about the time the
	// other half takes to consume at the disk's rate (both are bound by
	// the same disk), and the pool never holds more than ReadyClusters
	// reservations, the most Open after a crash must zero. Negative: no
	// background refill (every refill on the first write that finds the
	// pool empty); at most ReadyClusters.
	ReadyLowClusters int `json:"ready_low_clusters"`

	// MaxTransferBytes bounds one Read or Write (the MDTS the target will
	// advertise). Default 1 MiB; a multiple of 4096.
	MaxTransferBytes int `json:"max_transfer_bytes"`

	// MemTableBytes and CacheBytes size pebble, which holds metadata only.
	// Defaults 16 MiB and 32 MiB.
	MemTableBytes int   `json:"memtable_bytes"`
	CacheBytes    int64 `json:"cache_bytes"`

	// SyncInterval bounds how long an acknowledged plain (not FUA) write,
	// write-zeroes or deallocate stays volatile: a background syncer
	// flushes within SyncInterval of the first mutation since its last
	// round (sync.go). Default 10 ms (DefaultSyncInterval), as the
	// store before it (target/volume); at most MaxSyncInterval. Negative: no syncer, plain
	// writes are durable only at a Flush or a FUA write (NVMe's volatile
	// write cache allows it; tests that must know every sync point use it).
	SyncInterval time.Duration `json:"sync_interval"`

	// ReserveBytes is the free space the store keeps on pebble's
	// filesystem: below it, writes that need a new cluster fail with
	// ErrNoSpace (overwrites, reads, zeroes and deallocates go on) until
	// free space is back above 1.25 × it (space.go). Default (0): 2% of
	// the filesystem, at least 64 MiB, at most 1 GiB: pebble holds
	// metadata only.
	ReserveBytes uint64 `json:"reserve_bytes"`

	// SpaceCheckInterval is how often free space is read. Default 100 ms.
	SpaceCheckInterval time.Duration `json:"space_check_interval"`

	// ReadOnly opens the store read-only: writes fail with ErrReadOnly and
	// Open repairs nothing.
	ReadOnly bool `json:"read_only"`

	// Logger receives the store's and pebble's messages. Default: pebble's.
	Logger Logger `json:"-"`
}

// Logger is where the store's messages go.
type Logger interface {
	Infof(format string, args ...any)
	Errorf(format string, args ...any)
}

// Defaults.
const (
	DefaultAreaBytes        = 1 << 30
	DefaultClusterBytes     = 64 << 10
	DefaultReadyClusters    = 1024
	DefaultMaxTransferBytes = 1 << 20
	DefaultMemTableBytes    = 16 << 20
	DefaultCacheBytes       = 32 << 20

	minClusterShift = 12
	maxClusterShift = 22
)

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.AreaPath == "" && c.Dir != "" && c.AreaDevice == "" {
		c.AreaPath = c.Dir + ".area"
	}
	if c.AreaBytes == 0 {
		c.AreaBytes = DefaultAreaBytes
	}
	if c.ClusterBytes == 0 {
		c.ClusterBytes = DefaultClusterBytes
	}
	if c.ReadyClusters == 0 {
		c.ReadyClusters = DefaultReadyClusters
	}
	if c.ReadyLowClusters == 0 {
		c.ReadyLowClusters = max(c.ReadyClusters/2, 1)
	}
	if c.MaxTransferBytes == 0 {
		c.MaxTransferBytes = DefaultMaxTransferBytes
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

// Validate checks c after defaults are applied, returning every problem,
// each wrapping ErrInvalid.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("store: config: "+format+": %w", append(args, ErrInvalid)...))
	}
	if c.Dir == "" {
		bad("Dir is empty")
	}
	cb := c.ClusterBytes
	if cb < 1<<minClusterShift || cb > 1<<maxClusterShift || bits.OnesCount(uint(cb)) != 1 {
		bad("ClusterBytes %d is not a power of two from %d to %d", cb, 1<<minClusterShift, 1<<maxClusterShift)
	}
	if c.AreaBytes < 2*int64(cb) {
		bad("AreaBytes %d is below two clusters (%d)", c.AreaBytes, 2*cb)
	}
	if c.AreaDevice != "" && c.AreaPath != "" {
		bad("AreaPath %q and AreaDevice %q are both set: the data area is one or the other", c.AreaPath, c.AreaDevice)
	}
	if c.WipeDevice && c.AreaDevice == "" {
		bad("WipeDevice is set without AreaDevice")
	}
	if c.AreaMaxBytes < 0 {
		bad("AreaMaxBytes %d is negative", c.AreaMaxBytes)
	}
	if c.ReadyClusters < 1 {
		bad("ReadyClusters %d is below 1", c.ReadyClusters)
	}
	if c.ReadyLowClusters > c.ReadyClusters {
		bad("ReadyLowClusters %d is above ReadyClusters %d", c.ReadyLowClusters, c.ReadyClusters)
	}
	if c.MaxTransferBytes < 4096 || c.MaxTransferBytes%4096 != 0 {
		bad("MaxTransferBytes %d is not a positive multiple of 4096", c.MaxTransferBytes)
	}
	if c.MemTableBytes < 1<<20 {
		bad("MemTableBytes %d is below 1 MiB", c.MemTableBytes)
	}
	if c.CacheBytes < 0 {
		bad("CacheBytes %d is negative", c.CacheBytes)
	}
	if c.SyncInterval > MaxSyncInterval {
		bad("SyncInterval %v is above %v: a crash could lose that much of acknowledged writes", c.SyncInterval, MaxSyncInterval)
	}
	return errors.Join(errs...)
}
