//go:build !linux

package rdma

// yieldCPU does nothing where there are no disk engines to poll (the
// asynchronous path is Linux's: io_uring).
func yieldCPU() {}
