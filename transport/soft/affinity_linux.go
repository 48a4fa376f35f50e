//go:build linux

package soft

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// pinThread locks the calling goroutine to its OS thread and restricts that
// thread to cpu. It reports whether pinning took effect (C6: a preference,
// honoured where the system allows).
func pinThread(cpu int) bool {
	if cpu < 0 || cpu >= runtime.NumCPU() {
		return false
	}
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(0, &set) == nil
}

// currentCPU is the processor the calling thread runs on, or -1.
func currentCPU() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil || set.Count() != 1 {
		return -1
	}
	for i := 0; i < runtime.NumCPU(); i++ {
		if set.IsSet(i) {
			return i
		}
	}
	return -1
}
