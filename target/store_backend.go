package target

import (
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/store"
)

// The store adapter: the one file of the target that knows the extent
// store (package store, docs/store.md). As the volume adapter does for
// target/volume, it calls a store volume for each backend operation and
// translates the store's errors into NVMe status (storeStatus), as
// nvmet's io-cmd-bdev.c does for a block device with blk_to_nvme_status.
//
// It has no write group: a plain write into an allocated cluster is one
// pwrite with no metadata, and a first write's map commit is made under
// the volume's allocation mutex, unsynced (the syncer, a Flush or FUA
// syncs the WAL), so there is nothing a batch would save (NewWriteGroup
// returns nil and the core calls Write for each). It has no Viewer
// either: the data is on disk, not in memory to look at, so Compare reads
// into a buffer (the core's fallback), which is what a View would do.
//
// Atomic write units: the store honours one logical block (O_DIRECT never
// tears a block; docs/store.md, "Atomic write units"), which is what
// Identify already reports (AWUN = AWUPF = NAWUPF = 0): nothing to add.

// StoreBackend adapts a store Volume. Its errors carry the NVMe status
// storeStatus gives them and still wrap the store's.
func StoreBackend(v *store.Volume) Backend { return storeBackend{v} }

type storeBackend struct{ v *store.Volume }

// storeErrors are store's sentinels, translated by storeSentinels'
// table (store_errors.go): the only place where store errors become
// status codes.
var storeErrors = storeSentinels{
	outOfRange: store.ErrOutOfRange, misaligned: store.ErrMisaligned, tooLarge: store.ErrTooLarge,
	invalid: store.ErrInvalid, wouldLoseData: store.ErrWouldLoseData, notFound: store.ErrNotFound,
	readOnly: store.ErrReadOnly, closed: store.ErrClosed, noSpace: store.ErrNoSpace, io: store.ErrIO,
}

// storeStatus is the NVMe status of err, from a store operation op.
func storeStatus(op ioOp, err error) nvme.Status { return storeErrors.status(op, err) }

// storeError is err, from a store operation op, with its status: what the
// adapter returns. nil stays nil (no allocation on success).
func storeError(op ioOp, err error) error { return storeErrors.wrap(op, err) }

// Geometry implements Backend. Its error is not a command's: returned as
// the store gave it.
func (b storeBackend) Geometry() (Geometry, error) {
	info, err := b.v.Info()
	if err != nil {
		return Geometry{}, err
	}
	return Geometry{BlockSize: info.BlockSize, Blocks: info.Blocks(), ReadOnly: info.State == store.StateReadOnly}, nil
}

func (b storeBackend) Read(lba uint64, buf []byte) error {
	return storeError(opRead, b.v.Read(lba, buf))
}

func (b storeBackend) Write(lba uint64, data []byte, fua bool) error {
	var f store.WriteFlags
	if fua {
		f = store.FUA
	}
	return storeError(opWrite, b.v.Write(lba, data, f))
}

func (b storeBackend) WriteZeroes(lba, n uint64, fua bool) error {
	var f store.WriteFlags
	if fua {
		f = store.FUA
	}
	return storeError(opWriteZeroes, b.v.WriteZeroes(lba, n, f))
}

func (b storeBackend) Deallocate(lba, n uint64) error {
	return storeError(opDeallocate, b.v.Deallocate(lba, n))
}

func (b storeBackend) Flush() error { return storeError(opFlush, b.v.Flush()) }

// NewWriteGroup implements Backend: none (see above).
func (b storeBackend) NewWriteGroup() WriteGroup { return nil }
