// Package failover keeps a volume's namespace usable by blk's own host
// side (blkctl attach --nbd) when the node serving it changes: the
// volume's primary fails over to another replica, whose path turns ANA
// optimized while the old one answers inaccessible or is gone.
//
// A Device is an nbd.Device over the namespace of the current Path (one
// initiator Controller on the node that serves the volume). An I/O that
// fails with a path error — an NVMe path-related status (SCT 3h:
// Asymmetric Access Inaccessible, Persistent Loss, Transition, the
// pathing errors) without Do Not Retry, the controller lost or closed,
// the namespace gone — is held, not failed: the Device's follower asks
// Config.Resolve where the volume is served now and, if that is another
// endpoint (or the current path is dead), Config.Connect connects there;
// the new Path replaces the old one with one atomic store and the held
// I/O is submitted again on it. While Resolve names the current path's
// endpoint the I/O is retried there with a short backoff: a new primary
// that is not optimized yet, or a primary whose lease lapsed, answers
// inaccessible briefly and then serves. An I/O held longer than
// Config.HoldTimeout fails with ErrNoPath.
//
// Files: device.go (Device, the I/O methods and the hold), follow.go
// (the follower goroutine that resolves, connects and swaps paths),
// config.go (Config, defaults, Validate).
//
// Ordering. A write is acknowledged (returns nil) only when the path it
// last went to completed it; a held write is submitted again whole
// (writes, write-zeroes, trims and flushes are idempotent), so no
// acknowledged write depends on the old path. Fencing a write that the
// old node may still execute late is the replicas' job (the epoch), not
// the host's.
//
// Cost. In the steady state an I/O is one atomic load of the current
// path and the call through: no lock, no allocation, no clock read; the
// follower is one goroutine per Device, asleep until a path fails. The
// number of held I/Os is bounded by the caller's concurrency (the NBD
// server's workers): the Device starts no goroutine per I/O.
//
// Failures the blocking initiator calls wait out (a reset connection,
// a reconnecting controller) reach the follower through
// Controller.Down; a controller down HoldTimeout with nowhere else to
// go is closed, so that I/O waiting inside it ends too, and the follower
// keeps looking.
//
// What it must never do: acknowledge a write that no path completed,
// hold an I/O past HoldTimeout (plus one retry), hold an I/O for an
// error that is not a path error (a media error or an invalid request is
// returned at once), start a goroutine per I/O, or import the target.
package failover
