// Package peercred tells which local user owns the other end of a TCP
// connection on the loopback interface: the kernel's record of the peer
// socket (its owner's uid), not anything the peer says. blkd uses it to
// authenticate callers of a node that serves its API and raft only on
// loopback (the embedded default, no certificates): the user who runs
// blkd and root may manage it, other users of the machine may not — as
// PostgreSQL's "peer" authentication does for local sockets.
//
// On Linux the uid comes from /proc/self/net/tcp and /proc/self/net/tcp6
// of the caller's network namespace (a loopback peer is always in it; not
// /proc/net, a symlink systemd's ProcSubset=pid hides). Elsewhere
// UID answers ErrUnsupported.
//
// What this package must never do: guess. A peer socket that cannot be
// found, or that the kernel no longer attributes to a user (TIME_WAIT,
// printed with uid 0), is an error, never root.
package peercred
