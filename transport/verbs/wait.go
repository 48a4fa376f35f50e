//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"net"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// waker is an eventfd a goroutine blocked in poll(2) also watches, so
// that the provider can wake it (close, a provider-made completion, an arm
// already satisfied) without a device event.
type waker struct{ fd int }

func newWaker() (waker, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return waker{-1}, fmt.Errorf("verbs: eventfd: %w", err)
	}
	return waker{fd}, nil
}

// one is the 8-byte counter increment an eventfd write takes; only read.
var one = [8]byte{1}

func (w waker) wake() { unix.Write(w.fd, one[:]) }

func (w waker) drain() {
	var b [8]byte
	unix.Read(w.fd, b[:])
}

func (w waker) close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
	}
}

// pinThread locks the calling goroutine to its OS thread and restricts that
// thread to cpu (C6, S5: a preference, honoured where the system allows).
func pinThread(cpu int) bool {
	if cpu < 0 || cpu >= runtime.NumCPU() {
		return false
	}
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(0, &set) == nil
}

// newSockaddr returns a C-allocated sockaddr_storage for ip:port; the
// caller frees it.
func newSockaddr(ip net.IP, port int) *C.struct_sockaddr_storage {
	ss := (*C.struct_sockaddr_storage)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_sockaddr_storage{}))))
	if v4 := ip.To4(); v4 != nil {
		C.blk_sockaddr(ss, (*C.uint8_t)(unsafe.Pointer(&v4[0])), 4, C.uint16_t(port))
	} else {
		ip16 := ip.To16()
		C.blk_sockaddr(ss, (*C.uint8_t)(unsafe.Pointer(&ip16[0])), 16, C.uint16_t(port))
	}
	return ss
}

// goAddr converts a socket address to a *net.TCPAddr (nil if not IP).
func goAddr(sa *C.struct_sockaddr) net.Addr {
	var ip [16]byte
	var port C.uint16_t
	n := C.blk_sockaddr_parse(sa, (*C.uint8_t)(unsafe.Pointer(&ip[0])), &port)
	if n == 0 {
		return nil
	}
	return &net.TCPAddr{IP: net.IP(append([]byte(nil), ip[:n]...)), Port: int(port)}
}
