package blkd

import (
	"context"
	"log/slog"
	"reflect"
	"slices"
	"strings"
)

// Reload applies to the running node what of cfg (the configuration read
// again, as at start: the file, then BLK_* variables and flags) can change
// without a restart: the event log's level. Every other field that differs
// from the running configuration is named in a "reload: needs a restart"
// event and otherwise ignored (the log format among them: the handler is
// built once). An invalid cfg changes nothing and is returned as the
// error. Reload returns the fields that need a restart.
//
// blkd calls it on SIGHUP (cmd/blkd, run); it never stops the node.
func (d *Daemon) Reload(cfg Config) ([]string, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	level, err := parseLevel(cfg.LogLevel)
	if err != nil { // Validate checked it; kept for the compiler's sake
		return nil, err
	}
	restart := configDiff(d.cfg, cfg, "log_level")
	for _, f := range restart {
		d.log.Warn("reload: needs a restart", slog.String("field", f))
	}
	// The outcome goes to the audit log, which no level filters: an
	// operator who lowers the level to error still sees the reload.
	old := d.level.Level()
	d.level.Set(level)
	msg := "reload: log level changed"
	if old == level {
		msg = "reload: log level unchanged"
	}
	if err := d.audit.write(context.Background(), slog.LevelInfo, msg, slog.String("from", levelName(old)), slog.String("to", levelName(level)), slog.Any("needs_restart", restart)); err != nil {
		d.log.Warn("reload: audit log", slog.String("err", err.Error()))
	}
	return restart, nil
}

// configDiff names, by their JSON keys, the fields of a and b that differ,
// leaving out skip and the fields that are not in the file (json:"-").
func configDiff(a, b Config, skip ...string) []string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var diff []string
	for i := range va.NumField() {
		f := va.Type().Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if key == "" || key == "-" || !f.IsExported() {
			continue
		}
		if slices.Contains(skip, key) {
			continue
		}
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			diff = append(diff, key)
		}
	}
	return diff
}

// levelName is the --log-level word of l.
func levelName(l slog.Level) string { return strings.ToLower(l.String()) }
