package rdma

// WithSyncDisk is cfg with the cores' poller hook off: a StoreIO then
// serves this port's I/Os inline on the cores, as before issue 22's
// asynchronous path (the benchmarks' baseline).
func WithSyncDisk(cfg Config) Config {
	cfg.syncDisk = true
	return cfg
}
