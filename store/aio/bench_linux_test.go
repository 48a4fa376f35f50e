//go:build linux

package aio

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The benchmarks: the goals' patterns (4 KiB random reads and writes at
// QD1 and QD32, 128 KiB sequential writes and reads at QD8) on one data
// file in BLK_AIO_BENCH_DIR (default os.TempDir), written once before
// any is measured so that reads hit the disk, not unwritten extents.
// Each pattern runs, in this order: synchronous pread/pwrite with
// O_DIRECT on the same file (the baseline: what a poll group calling the
// disk inline gets), buffered pread/pwrite (a reference only: the page
// cache, no durability), the worker pool, io_uring, and io_uring with
// its pool registered (io_uring-fixed: no page pinning per request), and
// with the owner polling the CQ instead of sleeping (io_uring-busy, the
// engine without the cost of a wake-up). Engines report IOPS,
// MB/s, x-pread (÷ the baseline's IOPS of the same run) and, for
// io_uring, x-workers; doorbells/op and sleeps/op show how the engine
// talked to the disk and how often the owner slept.
//
// The file is 1 GiB, or 64 MiB while b.N is 1 (-benchtime 1x, as CI runs
// every benchmark once), grown on first need; it is removed at exit.
//
//	go test -run '^$' -bench . -benchtime 3s ./store/aio/

// benchFile is the shared data file, grown on demand.
var benchFile struct {
	dir  string
	path string
	size int64
	base map[string]float64 // the baseline's IOPS per pattern, this run
	work map[string]float64 // the worker pool's
}

func TestMain(m *testing.M) {
	if os.Getenv(seccompChild) != "" {
		if err := denyURing(); err != nil {
			println("seccomp unavailable:", err.Error())
			os.Exit(0)
		}
	}
	code := m.Run()
	if benchFile.dir != "" {
		os.RemoveAll(benchFile.dir)
	}
	os.Exit(code)
}

// benchData returns the data file's path, holding at least size written
// bytes.
func benchData(b *testing.B, size int64) string {
	b.Helper()
	bf := &benchFile
	if bf.dir == "" {
		root := os.Getenv("BLK_AIO_BENCH_DIR")
		if root == "" {
			root = os.TempDir()
		}
		dir, err := os.MkdirTemp(root, "blk-aio-bench-")
		if err != nil {
			b.Fatal(err)
		}
		bf.dir, bf.path = dir, filepath.Join(dir, "data")
		bf.base, bf.work = map[string]float64{}, map[string]float64{}
	}
	if bf.size >= size {
		return bf.path
	}
	f, err := OpenFile(bf.path, size)
	if err != nil {
		b.Skipf("no data file for direct I/O in %s: %v", bf.dir, err)
	}
	defer f.Close()
	p, err := NewPool(MaxIO, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	buf := p.Buf(0)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for off := bf.size; off < size; off += MaxIO {
		if _, err := unix.Pwrite(f.fd, buf, off); err != nil {
			b.Fatalf("fill %s at %d: %v", bf.path, off, err)
		}
	}
	if err := unix.Fdatasync(f.fd); err != nil {
		b.Fatal(err)
	}
	bf.size = size
	return bf.path
}

// pattern is one row of the goals' table.
type pattern struct {
	name  string
	bs    int  // bytes per request
	qd    int  // requests in flight
	write bool // writes, else reads
	seq   bool // sequential, else uniformly random
}

var patterns = []pattern{
	{"4k-randread-qd1", 4 << 10, 1, false, false},
	{"4k-randread-qd32", 4 << 10, 32, false, false},
	{"4k-randwrite-qd1", 4 << 10, 1, true, false},
	{"4k-randwrite-qd32", 4 << 10, 32, true, false},
	{"128k-seqwrite-qd8", 128 << 10, 8, true, true},
	{"128k-seqread-qd8", 128 << 10, 8, false, true},
}

// offsets yields the pattern's offsets inside size bytes.
type offsets struct {
	p    pattern
	size int64
	next int64
	rng  *rand.Rand
}

func (o *offsets) get() int64 {
	if o.p.seq {
		off := o.next
		o.next += int64(o.p.bs)
		if o.next > o.size {
			o.next = 0
			off = 0
			o.next = int64(o.p.bs)
		}
		return off
	}
	return o.rng.Int64N(o.size/int64(o.p.bs)) * int64(o.p.bs)
}

func BenchmarkAIO(b *testing.B) {
	for _, p := range patterns {
		b.Run(p.name, func(b *testing.B) {
			b.Run("pread-direct", func(b *testing.B) { benchSync(b, p, true) })
			b.Run("pread-buffered", func(b *testing.B) { benchSync(b, p, false) })
			b.Run("workers", func(b *testing.B) { benchEngine(b, p, KindWorkers, false, false) })
			b.Run("io_uring", func(b *testing.B) {
				if err := URingUnavailable(); err != nil {
					b.Skipf("io_uring: %v", err)
				}
				benchEngine(b, p, KindURing, false, false)
			})
			b.Run("io_uring-fixed", func(b *testing.B) {
				if err := URingUnavailable(); err != nil {
					b.Skipf("io_uring: %v", err)
				}
				benchEngine(b, p, KindURing, false, true)
			})
			b.Run("io_uring-busy", func(b *testing.B) {
				if err := URingUnavailable(); err != nil {
					b.Skipf("io_uring: %v", err)
				}
				benchEngine(b, p, KindURing, true, false)
			})
		})
	}
}

func benchSize(b *testing.B) int64 {
	if b.N <= 1 {
		return 64 << 20
	}
	return 1 << 30
}

// report sets the common metrics and returns the IOPS.
func report(b *testing.B, elapsed time.Duration) float64 {
	iops := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(iops, "IOPS")
	return iops
}

// benchSync is the synchronous baseline: one pread or pwrite at a time on
// the calling goroutine, with O_DIRECT (direct) or through the page
// cache.
func benchSync(b *testing.B, p pattern, direct bool) {
	size := benchSize(b)
	path := benchData(b, size)
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if direct {
		flags |= unix.O_DIRECT
	}
	fd, err := unix.Open(path, flags, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	pool, err := NewPool(p.bs, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	buf := pool.Buf(0)
	offs := offsets{p: p, size: size, rng: rand.New(rand.NewPCG(7, uint64(p.bs)))}
	b.SetBytes(int64(p.bs))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		off := offs.get()
		var n int
		if p.write {
			n, err = unix.Pwrite(fd, buf, off)
		} else {
			n, err = unix.Pread(fd, buf, off)
		}
		if err != nil || n != len(buf) {
			b.Fatalf("%d bytes at %d: %d, %v", len(buf), off, n, err)
		}
	}
	b.StopTimer()
	iops := report(b, b.Elapsed())
	if direct {
		benchFile.base[p.name] = iops
		return
	}
	// Leave no page of the file cached or dirty: a direct write over a
	// dirty page must write it back first, and with io_uring's NOWAIT
	// would go to a kernel worker thread, slowing what is measured next.
	if err := unix.Fdatasync(fd); err != nil {
		b.Fatal(err)
	}
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatal(err)
	}
}

// ioWorkers counts the process's io_uring worker threads (iou-wrk-*):
// the kernel starts them for requests it cannot issue without blocking,
// which then cost a context switch each.
func ioWorkers() int {
	tasks, _ := os.ReadDir("/proc/self/task")
	n := 0
	for _, t := range tasks {
		comm, _ := os.ReadFile("/proc/self/task/" + t.Name() + "/comm")
		if strings.HasPrefix(string(comm), "iou-wrk") {
			n++
		}
	}
	return n
}

// benchEngine keeps p.qd requests in flight on an engine of kind k, as
// a poll group would: queue, Submit, Reap; Arm and sleep on the eventfd
// when nothing has completed. With busy it never sleeps, as a poll group
// busy with other queues: the engine's cost without the wake-up's.
// With fixed the pool is registered (io_uring's fixed buffers).
func benchEngine(b *testing.B, p pattern, k Kind, busy, fixed bool) {
	size := benchSize(b)
	path := benchData(b, size)
	f, err := OpenFile(path, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	e, err := New(f, Config{Kind: k, Depth: p.qd})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	pool, err := NewPool(p.bs, p.qd)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if fixed {
		if err := e.Register(pool); err != nil {
			b.Skip(err)
		}
	}
	for i := range p.qd {
		buf := pool.Buf(int32(i))
		for j := range buf {
			buf[j] = byte(i + j)
		}
	}
	free := make([]int32, 0, p.qd)
	for i := range p.qd {
		free = append(free, int32(i))
	}
	offs := offsets{p: p, size: size, rng: rand.New(rand.NewPCG(7, uint64(p.bs)))}
	cs := make([]Completion, p.qd)
	pfd := []unix.PollFd{{Fd: int32(e.EventFD()), Events: unix.POLLIN}}
	sleeps := 0
	b.SetBytes(int64(p.bs))
	b.ReportAllocs()
	b.ResetTimer()
	issued, done := 0, 0
	for done < b.N {
		for issued < b.N && len(free) > 0 {
			idx := free[len(free)-1]
			free = free[:len(free)-1]
			buf := pool.Buf(idx)
			if p.write {
				err = e.Write(uint64(idx), buf, offs.get(), false)
			} else {
				err = e.Read(uint64(idx), buf, offs.get())
			}
			if err != nil {
				b.Fatal(err)
			}
			issued++
		}
		if err := e.Submit(); err != nil {
			b.Fatal(err)
		}
		n := e.Reap(cs)
		if n == 0 {
			if !busy && !e.Arm() {
				sleeps++
				unix.Poll(pfd, -1)
			}
			continue
		}
		for _, c := range cs[:n] {
			if err := c.Err(); err != nil {
				b.Fatalf("%v: %v", c.Op, err)
			}
			free = append(free, int32(c.Tag))
		}
		done += n
	}
	b.StopTimer()
	iops := report(b, b.Elapsed())
	st := e.Stats()
	b.ReportMetric(float64(st.Doorbells)/float64(b.N), "doorbells/op")
	b.ReportMetric(float64(sleeps)/float64(b.N), "sleeps/op")
	if k == KindURing {
		b.ReportMetric(float64(ioWorkers()), "iou-wrk-threads")
	}
	if base := benchFile.base[p.name]; base > 0 {
		b.ReportMetric(iops/base, "x-pread")
	}
	if k == KindWorkers {
		benchFile.work[p.name] = iops
	} else if busy || fixed {
		return
	} else if w := benchFile.work[p.name]; w > 0 {
		b.ReportMetric(iops/w, "x-workers")
	}
}
