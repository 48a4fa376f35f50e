package api

import (
	"encoding/json"
	"time"
)

// RFC 3339 times in JSON (docs/operations.md §5.4). Each object that
// carries a Unix-nanosecond time keeps it (created_at, since: deprecated,
// kept for clients of a release without the new fields, to be removed
// a release later) and gains the same instant beside it as an RFC 3339
// string with nanoseconds, in UTC: created, since_time. Both are written
// from the one integer here, so they cannot disagree; a zero integer (not
// known) writes no RFC 3339 field. Decoding ignores the new fields (the
// integer is the source).
//
// A struct that embeds one of these types takes its MarshalJSON and so
// writes only the embedded object: add fields beside it through a map
// (blkctl host allow does) or name the field.

// rfc3339 is ns as an RFC 3339 UTC time, or nil for 0.
func rfc3339(ns int64) *time.Time {
	if ns == 0 {
		return nil
	}
	t := time.Unix(0, ns).UTC()
	return &t
}

// MarshalJSON writes v with created beside created_at.
func (v Volume) MarshalJSON() ([]byte, error) {
	type plain Volume
	return json.Marshal(struct {
		plain
		Created *time.Time `json:"created,omitempty"`
	}{plain(v), rfc3339(v.CreatedAt)})
}

// MarshalJSON writes s with created beside created_at.
func (s Snapshot) MarshalJSON() ([]byte, error) {
	type plain Snapshot
	return json.Marshal(struct {
		plain
		Created *time.Time `json:"created,omitempty"`
	}{plain(s), rfc3339(s.CreatedAt)})
}

// MarshalJSON writes r with since_time beside since.
func (r Replica) MarshalJSON() ([]byte, error) {
	type plain Replica
	return json.Marshal(struct {
		plain
		SinceTime *time.Time `json:"since_time,omitempty"`
	}{plain(r), rfc3339(r.Since)})
}

// MarshalJSON writes a with since_time beside since.
func (a Attachment) MarshalJSON() ([]byte, error) {
	type plain Attachment
	return json.Marshal(struct {
		plain
		SinceTime *time.Time `json:"since_time,omitempty"`
	}{plain(a), rfc3339(a.Since)})
}

// MarshalJSON writes f with since_time beside since.
func (f FlattenProgress) MarshalJSON() ([]byte, error) {
	type plain FlattenProgress
	return json.Marshal(struct {
		plain
		SinceTime *time.Time `json:"since_time,omitempty"`
	}{plain(f), rfc3339(f.Since)})
}
