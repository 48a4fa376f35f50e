// Package repl is the primary's side of synchronous replication (issue
// 23, docs/replication.md §2): Backend, a target.AsyncBackend that a
// replicated volume's namespace uses on its primary node. It reads from
// the local replica only, and sends every write, write zeroes,
// deallocate and flush to the local replica and to every in-sync remote
// one (blk's own initiator, one Leg per replica, remote legs first); the
// host's I/O completes once all of them did.
//
// A remote leg that fails does not fail the host's write and is not
// silently dropped either: the write is held, the replica leaves the leg
// set, and the Reporter asks the registry to mark it out of sync; the
// held writes are acknowledged once it did, or fail with the ANA
// Inaccessible path status (the backend stops serving) when it refuses or
// does not answer within HoldTimeout. So a host never sees a write
// acknowledged that an in-sync replica, as the registry knows it, lacks.
// A failed local leg fails the write and stops the backend (LocalFailed).
//
// A replica connection with every slot busy (initiator.ErrQueueFull) is
// not a failure: the leg waits in its peer's backlog, first in first
// out, and is sent again as that peer's commands complete (or its timer
// ticks); its host write stays pending meanwhile. Waiting legs of a peer
// that fails are resolved like writes that skipped it (held on its
// verdict); a leg that waited longer than HoldTimeout fails
// (ErrBacklogTimeout).
//
// Per I/O it allocates nothing and takes no lock: records (a child
// target.IO for the local leg, an initiator.Callback per peer, counters)
// are preallocated on a lock-free free list; the leg set is one atomic
// pointer. The backlog links the legs themselves; its mutex is taken
// only when a leg finds the connection full or while legs wait. The initiator copies a write's data into its own slot before
// WriteAsync returns, so legs never keep the host's buffer; the local
// leg uses it until its Done, before the host's.
//
// StartRebuild copies the local replica to an out-of-sync one while the
// host writes (rebuild.go: a rebuilding peer takes every write but holds
// none; the copier's windows and why they are safe), then has the lead
// commit it in sync before it counts. From a replica's first missed
// write the backend keeps a dirty-region log of it (drl.go: an atomic OR
// per write, no lock), so that its rebuild copies only the regions it
// missed, when this backend saw it leave at its epoch; a full copy
// otherwise.
//
// Barrier (barrier.go) stops the write stream at one point for a
// snapshot of every copy (docs/snapshots.md §4.1): new writes and
// flushes are held (one atomic load per write when no barrier runs),
// those in flight drain on every leg, the caller's function runs with
// the in-sync replicas, and the held writes go in arrival order; a
// replica that did not take the snapshot leaves as if it missed a
// write. HoldRange (holdrange.go) is the same over a range of blocks:
// only the writes overlapping it are held, so that volume verify and the
// term check hash a region on every copy at one instant.
//
// What it must never do: acknowledge a write a replica the registry
// counts in sync missed; block a poll group (a submit never waits); read
// from a remote replica; know how the registry is reached (the Reporter
// is the lead's) or which replicas exist (SetPeers is).
package repl
