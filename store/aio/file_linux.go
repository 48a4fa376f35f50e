//go:build linux

package aio

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// File is a data file or block device opened for direct I/O: reads and
// writes go between the disk and the caller's buffers, never through the
// page cache. Engines of many poll groups share one File.
type File struct {
	path   string
	fd     int
	closed atomic.Bool
	// borrowed: the descriptor belongs to someone else (Borrow); Close
	// leaves it open.
	borrowed bool
}

// Borrow makes a File of a descriptor its owner opened (with O_DIRECT, or
// without where the filesystem refuses it: the engines work on both) and
// keeps: the store's data area. Close then only stops the File's use;
// the owner closes the descriptor, after the engines on it.
func Borrow(path string, fd int) *File { return &File{path: path, fd: fd, borrowed: true} }

// OpenFile opens path for reading and writing with O_DIRECT. A regular
// file is created if missing and, when size > 0 and it is smaller,
// preallocated to size bytes (fallocate: the blocks are reserved, so a
// write inside never fails for space); a block device is taken as it is
// and size must be 0 or at most its capacity. The error names the path
// and the step; a filesystem without direct I/O fails here, not at the
// first read.
func OpenFile(path string, size int64) (*File, error) {
	if size < 0 || size%Align != 0 {
		return nil, fmt.Errorf("%w: data file size %d", ErrAlign, size)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if err == unix.EINVAL {
			return nil, fmt.Errorf("aio: open %s: %w (the filesystem does not support O_DIRECT)", path, err)
		}
		return nil, fmt.Errorf("aio: open %s: %w", path, err)
	}
	f := &File{path: path, fd: fd}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("aio: stat %s: %w", path, err)
	}
	cur, err := f.Size()
	if err != nil {
		f.Close()
		return nil, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if size > cur {
			if err := unix.Fallocate(fd, 0, 0, size); err != nil {
				f.Close()
				return nil, fmt.Errorf("aio: preallocate %s to %d bytes: %w", path, size, err)
			}
		}
	case unix.S_IFBLK:
		if size > cur {
			f.Close()
			return nil, fmt.Errorf("aio: device %s holds %d bytes, %d asked", path, cur, size)
		}
	default:
		f.Close()
		return nil, fmt.Errorf("aio: %s is neither a regular file nor a block device", path)
	}
	return f, nil
}

// Path is the name the file was opened by.
func (f *File) Path() string { return f.path }

// Fd is the file descriptor, -1 once closed.
func (f *File) Fd() int {
	if f.closed.Load() {
		return -1
	}
	return f.fd
}

// Size is the file's or the device's size in bytes.
func (f *File) Size() (int64, error) {
	if f.closed.Load() {
		return 0, ErrClosed
	}
	n, err := unix.Seek(f.fd, 0, unix.SEEK_END)
	if err != nil {
		return 0, fmt.Errorf("aio: size of %s: %w", f.path, err)
	}
	return n, nil
}

// Close closes the file. Close its engines first: a request in flight
// on a closed descriptor fails, or lands on a file reopened under the
// same number.
func (f *File) Close() error {
	if f.closed.Swap(true) || f.borrowed {
		return nil
	}
	if err := unix.Close(f.fd); err != nil {
		return fmt.Errorf("aio: close %s: %w", f.path, err)
	}
	return nil
}
