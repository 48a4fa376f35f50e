// Package hclogslog is an hclog.Logger that writes through a log/slog
// Logger, so that a library logging through hashicorp's hclog (raft, its
// network transport and snapshot store) joins a program's one slog
// stream: the program's format, level and handlers (a rate limiter, say)
// apply to it as to everything else. hclog v1.6.3 has no such bridge.
//
// Levels map one to one (Trace is slog.LevelDebug-4, below Debug); a
// logger's name (Named, ResetNamed) is the record's "logger" attribute;
// With's pairs are attributes of every record. The level is the slog
// handler's: IsX asks it, SetLevel does nothing (as hclog allows for a
// logger that cannot change its level), GetLevel reports the lowest level
// the handler takes now.
//
// What this package must never do: filter or rewrite records itself
// beyond the mapping above (that is the handler's business), or keep state
// that grows with the records it passes.
package hclogslog
