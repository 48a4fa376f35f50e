package rdma

import "time"

// WithDiskSpin is cfg with the cores' disk spin (diskSpin) set to d; 0
// or less: none, the core sleeps on its engines' eventfds as soon as it
// has nothing to do.
func WithDiskSpin(cfg Config, d time.Duration) Config {
	cfg.diskSpin = d
	if d <= 0 {
		cfg.diskSpin = -1
	}
	return cfg
}

// WithSyncDisk is cfg with the cores' poller hook off: a StoreIO then
// serves this port's I/Os inline on the cores, as before issue 22's
// asynchronous path (the benchmarks' baseline).
func WithSyncDisk(cfg Config) Config {
	cfg.syncDisk = true
	return cfg
}
