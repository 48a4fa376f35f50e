// Package csi is blk's Container Storage Interface driver: the controller
// service turns Kubernetes' volume calls into blkd's /v1 API, the node
// service attaches a volume to the machine it runs on through the kernel's
// NVMe/TCP host (or NBD) and mounts it. The design is docs/operations.md §1.
//
// Files:
//
//	doc.go        this map
//	driver.go     Config, Driver, New, Register: the gRPC services and the
//	              per-ID serialisation
//	interceptor.go the logging interceptor: every call, never a secret
//	host.go       Host: what the node service does to the machine (connect,
//	              disconnect, mkfs, mount, ...); the real one is fabrics.go,
//	              nbd.go and mount.go, tests use a fake
//	identity.go   Identity service: plugin info, capabilities, Probe
//	controller.go Controller service (§1.5)
//	ids.go        volume, snapshot and node IDs (§1.4)
//	params.go     StorageClass parameters (§1.6)
//	blkapi.go     HTTP client of blkd's /v1 (§1.2.1)
//	errors.go     grpcCode: blkd's HTTP statuses to gRPC codes
//	node.go       Node service (§1.10)
//	fabrics.go    the kernel NVMe/TCP host through /dev/nvme-fabrics and /sys
//	nbd.go        the NBD fallback through initiator/nbd (§1.10.1)
//	mount.go      the mount table, mkfs, mount and bind mounts
//	state.go      the node's staging records under --state-dir
//
// Layer: above api, initiator and initiator/nbd; nothing in blk imports it
// but cmd/blk-csi.
package csi
