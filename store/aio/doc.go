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
// sits in the poll group's internal/epoll.Loop next to its sockets
// (Arm as, or inside, the Loop's hasWork). Pool is a set of page-aligned
// buffers mapped once outside the Go heap, owned by the poll group like
// its engine; Register lets io_uring map a pool once (fixed buffers)
// instead of pinning pages per request. Many engines share one File;
// an engine never outlives it.
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
// Measured, and which implementation wins: io_uring. 1 GiB file on
// ext4 on the virtio disk of a 2-vCPU VM shared with two other builds
// (load average 3-9, so ±25% between runs), medians of 6 runs (two of
//
//	go test -run '^$' -bench . -benchtime 1s -count 3 ./store/aio/
//
// BLK_AIO_BENCH_DIR names the directory of the data file if TMPDIR is
// not on the disk to measure), in IOPS or MB/s and, in brackets, the
// median of each run's ratio to synchronous O_DIRECT pread/pwrite on the
// same file in the same run (x-pread):
//
//	pattern               pread O_DIRECT   workers          io_uring         io_uring, fixed bufs
//	4 KiB rand read QD1   27.6 k           15.2 k (0.49×)   30.9 k (1.05×)   29.1 k (0.99×)
//	4 KiB rand read QD32  33.8 k           33.3 k (1.29×)   68.5 k (2.26×)   63.2 k (2.32×)
//	4 KiB rand write QD1  27.1 k           14.4 k (0.58×)   21.7 k (0.74×)   24.4 k (0.96×)
//	4 KiB rand write QD32 31.5 k           30.3 k (0.92×)   62.3 k (1.83×)   60.7 k (1.78×)
//	128 KiB seq write QD8 1278 MB/s        1919 MB/s (2.31×) 2055 MB/s (2.42×) 1921 MB/s (2.38×)
//	128 KiB seq read QD8  900 MB/s         1173 MB/s (1.41×) 1169 MB/s (1.44×) 1160 MB/s (1.52×)
//
// io_uring ÷ workers (x-workers, same runs): 1.94× and 1.71× for 4 KiB
// reads at QD1 and QD32, 1.59× and 1.97× for 4 KiB writes, 1.24× and
// 1.05× for 128 KiB writes and reads (the disk is the limit there).
// io_uring is KindAuto's choice, the workers only the fallback. One gap
// to watch: a 4 KiB write at QD1 with a sleep per request is 0.74× a
// blocking pwrite (0.96× with fixed buffers; the spread between runs is
// as large), the cost of the completion's wake-up through the eventfd
// against a thread that simply blocked.
//
// The pool pays two thread wake-ups per request (owner → worker →
// owner) where io_uring pays one syscall per Submit and an eventfd
// signal per sleep; at QD32 io_uring rang the doorbell once per 30
// reads and slept once per 30 (doorbells/op, sleeps/op). Registered
// buffers (Register) showed no gain beyond the noise here; they cost
// RLIMIT_MEMLOCK for a plain user, so they stay optional. Polling the
// CQ without sleeping (io_uring-busy) gained nothing (medians equal or
// lower) and lost up to 2× in the most loaded runs on the shared
// cores: sleep on the eventfd. No run started an io_uring
// worker thread (iou-wrk-threads 0): every request went to the disk
// from the submitting syscall, without blocking it.
//
// What it must never do: allocate or copy data per request in steady
// state (a test guards the allocations), or take a lock per request on
// the io_uring path (the worker pool, only a fallback, pays one channel
// hand-off per request: Go has no other way to wake a parked
// goroutine); issue a request past Depth (ErrFull); hand the kernel a
// misaligned request (checked before anything is queued, ErrAlign); let
// the disk write into a buffer the caller got back (a buffer belongs to
// the disk from its queueing until its completion is reaped; Close waits
// for everything in flight); block in Reap or Arm; be used by two
// goroutines at once (an Engine is its poll group's); or import a blk
// package above internal/.
package aio
