package main

import "github.com/blk-project/blk/csi"

// newHost makes the machine's Host for the node service: the kernel's
// NVMe/TCP host, NBD and mount(2) (csi/fabrics.go, nbd.go, mount.go).
var newHost = func(cfg csi.Config) (csi.Host, error) {
	return csi.NewHost(cfg.Log), nil
}
