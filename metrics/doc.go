// Package metrics turns blk's plain counters into Prometheus metrics, at
// the edge, for the daemon (cmd/blkd) that owns the registry.
//
// Library packages (transport, target, target/rdma, target/volume,
// initiator) keep atomic counters and return them from a Stats method;
// they never import Prometheus. This package reads those Stats on each
// scrape with collectors built from const metrics:
//
//	transport.go  EngineCollector: per engine core, labelled {port, core}
//	port.go       PortCollector: the RDMA binding's counters, {port}
//	target.go     TargetCollector: commands by status, request states,
//	              controllers, and per namespace {subsystem, nsid}
//	volume.go     StoreCollector: per volume {volume} counters and space
//	initiator.go  ControllerCollector: a host controller, {subsystem, addr}
//	latency.go    Latency and LatencyBackend: per volume, per operation
//	              latency histograms, the one thing measured on the I/O path
//	registry.go   Registry (register and forget collectors) and Handler
//
// # Cost
//
// A scrape costs what the Stats methods cost: atomic loads, a walk of the
// target's 2048 status counters and, for each volume, a walk of its keys
// (volume.Volume.Stats counts allocated blocks). Nothing here adds work to
// the data path except LatencyBackend, which a daemon opts into per
// namespace: two clock reads and one lock-free, allocation-free histogram
// Observe per backend call, with the histogram resolved when the backend
// is wrapped, not per call.
//
// # Must never
//
// Be imported by a library package (only cmd/ wires it); lock or allocate
// per I/O; keep a registry of its own (the caller passes one in); register
// anything in init().
package metrics
