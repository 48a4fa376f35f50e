// Package store is the node's storage engine for volumes: pebble for the
// metadata, a data area for the bytes (issue 22; docs/store.md is the
// design). It replaces target/volume's one pebble key per 4 KiB block,
// whose LSM rewrote every block several times and read it through an
// index built for small keys.
//
// A Store is a pebble directory (volume records, each volume's map from
// cluster index to physical cluster, reservations) and a data area (a
// preallocated file opened with O_DIRECT, a block device the operator
// names (Config.AreaDevice, device.go), or an injected Area). Space is
// handed out in clusters (64 KiB by default). A read or an overwrite of an
// allocated cluster goes between the caller's buffer and the area with no
// copy and no metadata; the first write of a cluster takes one from a
// ready pool and commits one map key. Unallocated clusters read zeros.
//
// The crash rules (docs/store.md, "Write path"): a cluster handed out
// reads zeros on durable media (on a block device, which keeps its
// previous owner's bytes, a refill zeroes and syncs the clusters past a
// durable zeroed watermark before it reserves them, and advances the
// watermark in the same commit); reservations ('R' keys) are durable before
// a reserved cluster is written, so Open zeroes any a crash left written
// but unmapped (a clean Close releases the ready pool's, never written); a
// freed cluster waits in limbo until a flush has zeroed it, synced the area
// and synced the WAL, so the commit that freed it is durable before any
// other volume can get it; Flush syncs the area before the WAL. The allocator is rebuilt from pebble at Open and Check
// recomputes it.
//
// Snapshots and clones (docs/snapshots.md; snapshot.go, snapops.go) are
// objects with a parent: a snapshot takes its volume's map as it is, the
// volume and any clone start an empty map that reads through it, sharing
// its in-memory pages; a cluster still belongs to one map key. A write to
// a cluster read through the parent copies it first (its bytes synced
// before its key is committed); deleting a snapshot with one child merges
// its map into the child's.
//
// Around the core: a background syncer bounds how long a plain write stays
// volatile (Config.SyncInterval, sync.go); a space guard refuses new
// clusters when pebble's filesystem runs low (space.go); a file area grows
// when full (Grower); and Open upgrades a pebble directory written by
// target/volume in place (upgrade.go).
//
// # What this package must never do
//
//   - Let a volume read bytes another volume (or an earlier life of a
//     cluster) wrote, after any crash; hand out a cluster twice; lose a
//     cluster for good.
//   - Acknowledge a Flush, a FUA write or an administrative change before
//     the area and then the WAL are synced; acknowledge anything after a
//     failed sync (the store fails instead).
//   - Reuse a freed cluster before the commit that freed it is durable.
//   - Write a snapshot's clusters, or make a copy's map key durable before
//     the copy's bytes.
//   - Allocate, take a store-wide lock or touch pebble on the overwrite
//     and read paths (the volume's shared lock is the only one).
//   - Panic on any input, or keep a caller's buffer after a call returns.
//   - Write to a block device that is in use, that holds anything when a
//     store is created on it (unless Config.WipeDevice), or whose header
//     names another store; open a store on another kind of area than it
//     was created with.
//   - Import the target, the transports or the cluster's meta layer;
//     register itself in init(); keep a Prometheus registry.
package store
