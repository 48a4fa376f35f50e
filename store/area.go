package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Area is the data area: the bytes of every volume, addressed by absolute
// offset. The store calls it with offsets, lengths and buffer addresses
// that are multiples of Align. It is the seam where the file (O_DIRECT),
// a block device, the crashable fake of the tests (MemArea) and the
// asynchronous engine of store/aio plug in.
//
// Every method may be called concurrently. A completed WriteAt or Zero
// survives a crash of the process; only Sync makes it survive a power
// loss, and a crash may keep any subset of the writes since the last Sync,
// each atomically per Align-sized unit at least.
type Area interface {
	// ReadAt fills p from off: all of p or an error.
	ReadAt(p []byte, off int64) error
	// WriteAt writes p at off: all of p or an error.
	WriteAt(p []byte, off int64) error
	// Zero makes [off, off+n) read zeros, without needing new space.
	Zero(off, n int64) error
	// Sync makes every completed WriteAt and Zero durable (fdatasync).
	Sync() error
	// Size is the area's size in bytes.
	Size() int64
	// Align is the direct-I/O alignment of offsets, lengths and memory.
	Align() int
	Close() error
}

// Grower is an optional Area extra, found by type assertion: an area that
// can grow (a file; not a block device). Grow makes the area size bytes,
// the new bytes reading zeros, durably, before it returns.
type Grower interface {
	Grow(size int64) error
}

// Unzeroed is an optional Area extra, found by type assertion: an area
// whose bytes may hold anything when a store is created on it (a block
// device keeps what its previous owner wrote), where a new file's read
// zeros. The store then zeroes clusters as it first hands them out, past
// a durable watermark, instead of the whole area at creation
// (docs/store.md, "Zeroed watermark"). Asked only at creation.
type Unzeroed interface {
	Unzeroed() bool
}

// unzeroed says whether a store created on a must zero its clusters
// before it first hands them out.
func unzeroed(a Area) bool {
	u, ok := a.(Unzeroed)
	return ok && u.Unzeroed()
}

// fileArea is a preallocated file or a block device (device.go) opened
// with O_DIRECT: reads and writes go between the caller's buffer and the
// disk with no copy through the page cache. One type for both, so that
// the asynchronous path (DirectFD) serves either.
type fileArea struct {
	fd    int
	size  atomic.Int64
	align int
	zero  []byte // aligned zeros, for filesystems without FALLOC_FL_ZERO_RANGE
	path  string
	// direct says the file is open with O_DIRECT; without (a filesystem
	// that refuses it: tmpfs before Linux 6.6, some FUSE and network
	// filesystems) reads and writes go through the page cache.
	direct bool
	// device says the area is a block device: its size is fixed, it
	// never grows.
	device bool
}

// openDirect opens path with O_DIRECT; a test replaces it to stand for a
// filesystem that refuses O_DIRECT (EINVAL) where this one does not.
var openDirect = func(path string, flags int, mode uint32) (int, error) {
	return unix.Open(path, flags|unix.O_DIRECT, mode)
}

// openArea opens path with O_DIRECT or, on a filesystem that refuses it,
// without: the store must not keep a node from starting where its data
// directory happens to be (tmpfs in a test VM, a developer's /tmp).
// Buffered I/O keeps every promise: Flush and FUA fdatasync the file,
// which writes the page cache back; it only costs a copy and the cache.
func openArea(path string, flags int, mode uint32) (fd int, direct bool, err error) {
	fd, err = openDirect(path, flags, mode)
	if !errors.Is(err, unix.EINVAL) {
		return fd, err == nil, err
	}
	// Linux creates the file before it refuses O_DIRECT, so a refused
	// O_CREAT|O_EXCL leaves it behind: it is ours (the data directory's
	// lock keeps other blkds out), opened again without O_EXCL.
	fd, err = unix.Open(path, flags&^unix.O_EXCL, mode)
	return fd, false, err
}

// OpenFileArea opens the data area file at path with O_DIRECT, creating it
// with size bytes (fallocated: overwrites never need filesystem space, and
// unwritten ranges read zeros) if it does not exist and create is set.
// created says it was made now.
func OpenFileArea(path string, size int64, create bool) (a Area, created bool, err error) {
	flags := unix.O_RDWR | unix.O_CLOEXEC
	fd, direct, err := openArea(path, flags, 0)
	if errors.Is(err, unix.ENOENT) && create {
		fd, direct, err = openArea(path, flags|unix.O_CREAT|unix.O_EXCL, 0o600)
		created = err == nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("data area %s: open: %w: %w", path, ErrIO, err)
	}
	fa := &fileArea{fd: fd, path: path, direct: direct}
	fail := func(err error) (Area, bool, error) {
		_ = unix.Close(fd)
		if created {
			_ = os.Remove(path)
		}
		return nil, false, err
	}
	if created {
		if err := unix.Fallocate(fd, 0, 0, size); err != nil {
			return fail(fmt.Errorf("data area %s: preallocate %d bytes: %w: %w", path, size, ErrIO, err))
		}
		if err := unix.Fsync(fd); err != nil {
			return fail(fmt.Errorf("data area %s: %w: %w", path, ErrIO, err))
		}
		if err := syncDir(filepath.Dir(path)); err != nil {
			return fail(err)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(fmt.Errorf("data area %s: %w: %w", path, ErrIO, err))
	}
	fa.size.Store(st.Size)
	fa.align = 512 // buffered: any sector-sized I/O
	if direct {
		fa.align = dioAlign(fd)
	}
	fa.zero = alignedBuf(64<<10, fa.align)
	return fa, created, nil
}

// dioAlign is the file's direct-I/O alignment: statx's DIO alignment of
// offsets and of memory, whichever is larger; 4096 if the kernel does not
// say (safe on every device with sectors up to 4 KiB).
func dioAlign(fd int) int {
	var sx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &sx); err != nil ||
		sx.Mask&unix.STATX_DIOALIGN == 0 || sx.Dio_offset_align == 0 {
		return 4096
	}
	return int(max(sx.Dio_offset_align, sx.Dio_mem_align, 512))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("data area: open %s: %w: %w", dir, ErrIO, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("data area: sync %s: %w: %w", dir, ErrIO, err)
	}
	return nil
}

func (a *fileArea) ReadAt(p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pread(a.fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("data area: read %d bytes at %d: %w", len(p), off, err)
		}
		if n == 0 {
			return fmt.Errorf("data area: read at %d: past the end (%d bytes)", off, a.size.Load())
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

func (a *fileArea) WriteAt(p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pwrite(a.fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("data area: write %d bytes at %d: %w", len(p), off, err)
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// Zero uses FALLOC_FL_ZERO_RANGE: on ext4 and XFS a metadata change that
// keeps the blocks allocated (as unwritten extents), so later writes need
// no space. Elsewhere it writes zeros.
func (a *fileArea) Zero(off, n int64) error {
	err := unix.Fallocate(a.fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("data area: zero %d bytes at %d: %w", n, off, err)
	}
	for n > 0 {
		c := min(n, int64(len(a.zero)))
		if err := a.WriteAt(a.zero[:c], off); err != nil {
			return err
		}
		off, n = off+c, n-c
	}
	return nil
}

func (a *fileArea) Sync() error {
	if err := unix.Fdatasync(a.fd); err != nil {
		return fmt.Errorf("data area: fdatasync %s: %w", a.path, err)
	}
	return nil
}

func (a *fileArea) Size() int64 { return a.size.Load() }

// Grow extends the file to size bytes with fallocate (so overwrites of
// the new space never need filesystem space, and it reads zeros) and
// fsyncs the file's new size.
func (a *fileArea) Grow(size int64) error {
	if a.device {
		return fmt.Errorf("data device %s: a block device does not grow: %w", a.path, ErrNoSpace)
	}
	if err := unix.Fallocate(a.fd, 0, 0, size); err != nil {
		return fmt.Errorf("data area %s: grow to %d bytes: %w", a.path, size, err)
	}
	if err := unix.Fsync(a.fd); err != nil {
		return fmt.Errorf("data area %s: grow: %w", a.path, err)
	}
	a.size.Store(size)
	return nil
}
func (a *fileArea) Align() int { return a.align }

// Direct says whether the area is read and written with O_DIRECT (false:
// through the page cache, on a filesystem that refuses O_DIRECT).
func (a *fileArea) Direct() bool { return a.direct }

// Device says whether the area is a block device (Config.AreaDevice).
func (a *fileArea) Device() bool { return a.device }

// Unzeroed: a block device holds its previous contents; a new file (or
// its growth) reads zeros.
func (a *fileArea) Unzeroed() bool { return a.device }

func (a *fileArea) Close() error {
	if err := unix.Close(a.fd); err != nil {
		return fmt.Errorf("data area: close %s: %w", a.path, err)
	}
	return nil
}

// alignedBuf returns n bytes whose address is a multiple of align (a power
// of two), allocated once.
func alignedBuf(n, align int) []byte {
	b := make([]byte, n+align)
	off := int(uintptr(unsafe.Pointer(&b[0])) & uintptr(align-1))
	if off != 0 {
		off = align - off
	}
	return b[off : off+n : off+n]
}

// isAligned says whether p's address is a multiple of align.
func isAligned(p []byte, align int) bool {
	return len(p) == 0 || uintptr(unsafe.Pointer(&p[0]))&uintptr(align-1) == 0
}
