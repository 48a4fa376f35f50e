//go:build linux

package nbd

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ioctls of the classic NBD interface (linux/nbd.h): _IO(0xab, nr).
const (
	ioctlSetSock       = 0xab00
	ioctlSetBlksize    = 0xab01
	ioctlDoIt          = 0xab03
	ioctlClearSock     = 0xab04
	ioctlClearQue      = 0xab05
	ioctlSetSizeBlocks = 0xab07
	ioctlDisconnect    = 0xab08
	ioctlSetTimeout    = 0xab09
	ioctlSetFlags      = 0xab0a
)

// moduleProbe is the node the nbd module creates first (nbds_max ≥ 1).
const moduleProbe = "/dev/nbd0"

// attachTimeout is the kernel's per-request timeout (NBD_SET_TIMEOUT, in
// seconds): a request unanswered that long fails with EIO. The
// initiator's own I/O timeout (30 s) and its reconnect wait come first;
// this only catches a server that stopped answering altogether.
const attachTimeout = 120

// detachTimeout bounds the wait for NBD_DO_IT to return after
// NBD_DISCONNECT.
const detachTimeout = 30 * time.Second

// Attachment is a Device attached to a kernel /dev/nbdN.
type Attachment struct {
	dev    string
	f      *os.File // the nbd device node
	srv    *Server
	done   chan error // NBD_DO_IT's result
	once   sync.Once
	detErr error
}

// Attach serves d to the kernel as dev (e.g. "/dev/nbd0") through the
// classic ioctl interface: a socketpair whose one end the kernel gets
// (NBD_SET_SOCK) and whose other end this process serves (transmission
// phase only: the ioctls stand for the handshake). It returns once the
// device is set up; the kernel may still be reading the partition table.
func Attach(dev string, d Device) (*Attachment, error) {
	if _, err := os.Stat(moduleProbe); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("attach %s: %w", dev, ErrNoModule)
	}
	srv, err := NewServer(d, Config{})
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", dev, err)
	}
	bs := d.BlockSize()
	if bs > os.Getpagesize() {
		return nil, fmt.Errorf("attach %s: %w: block size %d above the page size", dev, ErrInvalidConfig, bs)
	}
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", dev, err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("attach %s: socketpair: %w", dev, err)
	}
	kernelFD, ours := fds[0], os.NewFile(uintptr(fds[1]), "nbd-server")
	nc, err := net.FileConn(ours) // dups the descriptor
	ours.Close()
	if err != nil {
		unix.Close(kernelFD)
		f.Close()
		return nil, fmt.Errorf("attach %s: %w", dev, err)
	}
	fd := f.Fd()
	steps := []struct {
		name string
		req  uintptr
		arg  uintptr
	}{
		{"NBD_CLEAR_SOCK", ioctlClearSock, 0}, // a stale setup from a crashed attach
		{"NBD_SET_BLKSIZE", ioctlSetBlksize, uintptr(bs)},
		{"NBD_SET_SIZE_BLOCKS", ioctlSetSizeBlocks, uintptr(d.Size() / int64(bs))},
		{"NBD_SET_TIMEOUT", ioctlSetTimeout, attachTimeout},
		{"NBD_SET_FLAGS", ioctlSetFlags, uintptr(srv.flags)},
		{"NBD_SET_SOCK", ioctlSetSock, uintptr(kernelFD)},
	}
	for _, st := range steps {
		if err := ioctl(fd, st.req, st.arg); err != nil {
			nc.Close()
			unix.Close(kernelFD)
			ioctl(fd, ioctlClearSock, 0)
			f.Close()
			return nil, fmt.Errorf("attach %s: %s: %w", dev, st.name, err)
		}
	}
	a := &Attachment{dev: dev, f: f, srv: srv, done: make(chan error, 1)}
	go srv.ServeTransmission(nc)
	go func() {
		// NBD_DO_IT blocks (on this goroutine's thread) until the
		// device is disconnected — or until a signal reaches the thread:
		// the kernel then shuts the device's sockets down and fails its
		// requests. Any signal sent to the process may land on any of
		// its threads (SIGTERM for blkctl's own detach, SIGWINCH from a
		// terminal, SIGCHLD...), so this thread blocks them all. It is
		// never unlocked: the runtime ends it with this goroutine,
		// mask and all. (Seen in e2e: a SIGTERM that landed here shut
		// the device down before the disconnect.)
		runtime.LockOSThread()
		blockAllSignals()
		err := ioctl(fd, ioctlDoIt, 0)
		ioctl(fd, ioctlClearQue, 0)
		ioctl(fd, ioctlClearSock, 0)
		unix.Close(kernelFD)
		a.done <- err
	}()
	return a, nil
}

// Device is the device node, e.g. "/dev/nbd0".
func (a *Attachment) Device() string { return a.dev }

// Server is the server behind the node (for its Stats).
func (a *Attachment) Server() *Server { return a.srv }

// Detach disconnects the node (NBD_DISCONNECT: the kernel sends
// NBD_CMD_DISC after its requests in flight), waits for NBD_DO_IT to
// return, and stops the server. It is idempotent.
func (a *Attachment) Detach() error {
	a.once.Do(func() {
		fd := a.f.Fd()
		err := ioctl(fd, ioctlDisconnect, 0)
		select {
		case <-a.done:
		case <-time.After(detachTimeout):
			if err == nil {
				err = fmt.Errorf("detach %s: NBD_DO_IT did not return within %v", a.dev, detachTimeout)
			}
		}
		a.srv.Close()
		if cerr := a.f.Close(); err == nil {
			err = cerr
		}
		a.detErr = err
	})
	return a.detErr
}

// blockAllSignals blocks every signal that can be blocked on the calling
// thread (SIGKILL and SIGSTOP cannot).
func blockAllSignals() {
	var all unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^all.Val[i] // all ones, whatever the word size
	}
	unix.PthreadSigmask(unix.SIG_BLOCK, &all, nil)
}

func ioctl(fd, req, arg uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, req, arg); e != 0 {
		return e
	}
	return nil
}
