// Package ratelog bounds how fast a log/slog handler writes records of
// one kind: a Handler passes on the first Burst records with the same
// message and level in each Interval and counts the rest, then writes
// one summary record saying how many it held back. It is for logs whose records a
// remote party can provoke at will — a host that hammers Connect with a
// bad NQN — so that they cannot flood the log or hide everything else.
//
// The target and its transport bindings log fixed messages (the event
// kinds) with the details as attributes, so one kind is one message.
// blkd wraps its event log's handler in one of these. A log whose every
// record must be kept (blkd's audit log of changes) must never go
// through one: a Handler drops records by design.
//
// What this package must never do: block a caller on another's I/O while
// holding its lock, or keep state without a bound (the kinds it tracks
// are capped; records of kinds beyond the cap share one window).
package ratelog
