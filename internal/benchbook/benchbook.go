// Package benchbook holds what blk's end-to-end benchmarks share to
// report ratios within one process: a book of runs per case, whose
// median IOPS the next variant divides by (x-bare, x-rdma, x-1queue),
// the latency summary of a run, and the CPU time of a process or thread
// from /proc.
package benchbook

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Book keeps every run of this process per case name. The zero value is
// empty and ready.
type Book struct {
	mu sync.Mutex
	m  map[string][]run
}

type run struct {
	n    int
	iops float64
}

// Record notes a run of n I/Os at iops.
func (b *Book) Record(name string, n int, iops float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = make(map[string][]run)
	}
	b.m[name] = append(b.m[name], run{n, iops})
}

// Median is the median IOPS of name's runs at least half as long (in
// I/Os) as its longest: the benchmark framework's shorter runs, made to
// size b.N, are left out. ok is false when name has no run.
func (b *Book) Median(name string) (iops float64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	runs := b.m[name]
	longest := 0
	for _, r := range runs {
		longest = max(longest, r.n)
	}
	var v []float64
	for _, r := range runs {
		if 2*r.n >= longest {
			v = append(v, r.iops)
		}
	}
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	return v[len(v)/2], true
}

// Latency returns the mean and the 99th percentile (nearest rank,
// ⌈0.99 n⌉) of lat, in nanoseconds; it sorts lat.
func Latency(lat []int64) (mean, p99 time.Duration) {
	if len(lat) == 0 {
		return 0, 0
	}
	var sum int64
	for _, v := range lat {
		sum += v
	}
	slices.Sort(lat)
	rank := (len(lat)*99 + 99) / 100
	return time.Duration(sum / int64(len(lat))), time.Duration(lat[rank-1])
}

// ProcCPU is process pid's user+system CPU time so far, from
// /proc/<pid>/stat, in clock ticks (10 ms); 0 where there is no /proc.
func ProcCPU(pid int) time.Duration { return statCPU(fmt.Sprintf("/proc/%d/stat", pid)) }

// ThreadCPU is the CPU time of thread tid of this process: the
// scheduler's nanoseconds (schedstat), else user+system ticks from its
// stat as ProcCPU.
func ThreadCPU(tid int) time.Duration {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/schedstat", tid)); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return time.Duration(ns)
			}
		}
	}
	return statCPU(fmt.Sprintf("/proc/self/task/%d/stat", tid))
}

// statCPU reads utime+stime from a /proc stat file: fields 14 and 15 of
// the line, counted after the parenthesised command name, in clock
// ticks (100 Hz).
func statCPU(path string) time.Duration {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}
