// Package blkd is the storage-node daemon that cmd/blkd wraps: it wires a
// meta registry node, a volume store, an NVMe-oF target with one RDMA port
// (soft iWARP provider), the metrics registry and the management HTTP API
// into one process, and takes them down again in order.
//
// It only wires: protocol, storage and registry logic live in the packages
// it uses, and it must never be imported by them. It lives under cmd/
// because metrics sits at the edge and only cmd/ may import it (see
// metrics.TestImportGraph).
package blkd
