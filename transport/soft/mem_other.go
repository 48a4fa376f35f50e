//go:build !unix

package soft

// mapMemory on a system without mmap: Go memory, which the soft provider
// can use as it is (it never hands memory to a device).
func mapMemory(length int) ([]byte, error) { return make([]byte, length), nil }

func unmapMemory([]byte) {}
