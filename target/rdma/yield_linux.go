package rdma

import "syscall"

// yieldCPU gives the calling thread's processor to another runnable
// thread, if the kernel has one (sched_yield(2)); see diskSpinYield.
func yieldCPU() { syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
