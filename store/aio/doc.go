// Package aio is the store's asynchronous disk I/O engine (issue 22): a
// poll group submits reads, writes and fdatasyncs against the data area
// (a preallocated file or a block device, opened with O_DIRECT) and
// harvests their completions later on its own goroutine, so it never
// blocks on the disk and a queue depth of 32 means 32 I/Os at the disk.
// Data moves by direct I/O between the disk and the caller's buffers: the
// package never copies a byte.
//
// API. OpenFile opens the data area (File, shared by every poll group).
// New makes an Engine for one poll group: Read, Write (fua: RWF_DSYNC)
// and Sync queue requests, each with a caller tag and a caller-owned
// buffer aligned to Align (4096) in address, offset and length; Submit
// hands them to the disk at once; Reap copies finished ones into the
// caller's []Completion without blocking. Before it sleeps the owner
// calls Arm; EventFD then becomes readable when a completion arrives, and
// sits in the poll group's internal/epoll.Loop next to its sockets. Pool
// is a set of page-aligned buffers mapped once outside the Go heap.
//
// Two implementations stand behind Engine: io_uring, spoken through raw
// syscalls (io_uring_setup, the SQ/CQ rings and SQEs mapped, one
// io_uring_enter per Submit, the CQ read from user space; the eventfd is
// registered with the ring), and a bounded worker pool (Config.Workers
// goroutines doing pread/pwrite, completions through internal/lfstack).
// KindAuto takes io_uring when URingUnavailable is nil — it probes once
// with a two-entry ring and a NOP, and otherwise says why: no io_uring in
// the kernel or a kernel before 5.6, sysctl kernel.io_uring_disabled, a
// seccomp filter, RLIMIT_MEMLOCK — and falls back to the workers.
//
// Measured (1 GiB file on ext4 on a virtio disk, 2 vCPUs shared; see
// bench_test.go; the command:
//
//	go test -run '^$' -bench . -benchtime 3s ./store/aio/
//
// with BLK_AIO_BENCH_DIR naming another filesystem if TMPDIR is not on
// the disk to measure):
//
//	FIGURES
//
// What it must never do: allocate, lock or copy data per request in
// steady state (a test guards the allocations); hand the kernel a
// misaligned request (checked before anything is queued, ErrAlign); let
// the disk write into a buffer the caller got back (a buffer belongs to
// the disk from Submit until its completion is reaped, and Close waits
// for everything in flight); block in Reap or Arm; be used by two
// goroutines at once (an Engine is its poll group's); or import a blk
// package above internal/.
package aio
