// Package metrics turns blk's plain counters into Prometheus metrics, at
// the edge, for the daemon (cmd/blkd) that owns the registry.
//
// Library packages (transport, target, target/rdma, store,
// initiator) keep atomic counters and return them from a Stats method;
// they never import Prometheus. This package reads those Stats on each
// scrape with collectors built from const metrics:
//
//	transport.go  EngineCollector: per engine core, labelled {port, core}
//	port.go       PortCollector: the RDMA binding's counters, {port}
//	target.go     TargetCollector: commands by status, request states,
//	              controllers, and per namespace {volume, role} its
//	              counters, write batching and latency histograms
//	volume.go     StoreCollector: the extent store's data area, syncs,
//	              pebble's health, per volume {volume} counters and
//	              space, per snapshot {volume, snapshot}
//	initiator.go  ControllerCollector: a host controller, {subsystem, addr}
//	latency.go    the latency histograms' buckets and exposition
//	registry.go   Registry (register and forget collectors) and Handler
//
// # Labels
//
// Every per-volume series carries one label volume, the volume's name
// (never its numeric store ID: that is a label of blk_volume_info only);
// snapshot series add snapshot, the snapshot's name. The library packages
// know IDs and NQNs, not names: blkd passes name functions, read once per
// scrape from its registry copy, and what they do not name is left out
// of that scrape and counted (blk_volume_unnamed_objects,
// blk_target_unnamed_namespaces). The initiator's series name the remote
// subsystem a host controller connects to, not a volume of this node.
// promlint (the linter of promtool check metrics) finds nothing to say
// about any family (TestPromlint).
//
// # Cost
//
// A scrape costs what the Stats methods cost: atomic loads, a walk of the
// target's 2048 status counters and, for each volume, its atomic
// counters (the store keeps its allocated clusters counted). Nothing here is on the
// data path: the per-namespace latency histograms are the target's own
// counters (target.NamespaceStats.Latency), kept with plain atomics, and
// this package only exports them. (Until issue 22 a wrapper here timed
// each backend and, by wrapping it, hid the volume's write batching.)
//
// # Must never
//
// Be imported by a library package (only cmd/ wires it); lock or allocate
// per I/O; keep a registry of its own (the caller passes one in); register
// anything in init().
package metrics
