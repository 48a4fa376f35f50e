//go:build !linux

package soft

func pinThread(cpu int) bool { return false }

func currentCPU() int { return -1 }
