package csi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mountEntry is one line of /proc/self/mountinfo (proc(5)).
type mountEntry struct {
	ID, Parent   int
	Major, Minor uint32
	Root         string // the mounted directory within the filesystem ("/" for a whole one)
	MountPoint   string
	Options      string // per-mount options
	FSType       string
	Source       string // "/dev/nvme1n1", "tmpfs", ...
	SuperOptions string
}

// parseMountInfo reads the mount table in mountinfo format:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// Paths are unescaped (the kernel writes space, tab, newline and
// backslash as \040, \011, \012 and \134).
func parseMountInfo(r io.Reader) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if len(f) < 10 || sep < 0 || len(f) < sep+3 {
			return nil, fmt.Errorf("mountinfo line %d: %q: not ID PARENT MAJ:MIN ROOT POINT OPTS [TAGS] - TYPE SOURCE SUPEROPTS", n, line)
		}
		var e mountEntry
		var err1, err2 error
		e.ID, err1 = strconv.Atoi(f[0])
		e.Parent, err2 = strconv.Atoi(f[1])
		maj, min, ok := strings.Cut(f[2], ":")
		ma, err3 := strconv.ParseUint(maj, 10, 32)
		mi, err4 := strconv.ParseUint(min, 10, 32)
		if err := errors.Join(err1, err2, err3, err4); err != nil || !ok {
			return nil, fmt.Errorf("mountinfo line %d: %q: bad numbers", n, line)
		}
		e.Major, e.Minor = uint32(ma), uint32(mi)
		e.Root = unescapeMount(f[3])
		e.MountPoint = unescapeMount(f[4])
		e.Options = f[5]
		e.FSType = f[sep+1]
		e.Source = unescapeMount(f[sep+2])
		if len(f) > sep+3 {
			e.SuperOptions = f[sep+3]
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// unescapeMount undoes the kernel's octal escapes in mountinfo paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountedAt finds the mount on top at path (the last one in the table:
// later mounts hide earlier ones) and the device it shows: the mount's
// source, or for a bind mount of a device node (block volumes: devtmpfs
// mounted with root "/nvme1n1") the node's path under /dev.
func mountedAt(entries []mountEntry, path string) (source string, ok bool) {
	path = filepath.Clean(path)
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if e.MountPoint != path {
			continue
		}
		if e.FSType == "devtmpfs" && e.Root != "/" {
			return filepath.Join("/dev", e.Root), true
		}
		return e.Source, true
	}
	return "", false
}

// mountFlags splits mount(8)-style options into MS_* flags and the
// filesystem's own data string.
func mountFlags(options []string) (flags uintptr, data string, bind bool) {
	known := map[string]uintptr{
		"ro": unix.MS_RDONLY, "nosuid": unix.MS_NOSUID, "nodev": unix.MS_NODEV,
		"noexec": unix.MS_NOEXEC, "sync": unix.MS_SYNCHRONOUS, "dirsync": unix.MS_DIRSYNC,
		"noatime": unix.MS_NOATIME, "nodiratime": unix.MS_NODIRATIME,
		"relatime": unix.MS_RELATIME, "strictatime": unix.MS_STRICTATIME,
		"lazytime": unix.MS_LAZYTIME, "mand": unix.MS_MANDLOCK, "silent": unix.MS_SILENT,
	}
	var rest []string
	for _, o := range options {
		switch {
		case o == "" || o == "rw" || o == "defaults":
		case o == "bind":
			bind = true
		case known[o] != 0:
			flags |= known[o]
		default:
			rest = append(rest, o)
		}
	}
	return flags, strings.Join(rest, ","), bind
}

// mountTable reads /proc/self/mountinfo.
func (h *kernelHost) mountTable() ([]mountEntry, error) {
	f, err := os.Open(h.mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountInfo(f)
}

func (h *kernelHost) Mounted(ctx context.Context, target string) (string, bool, error) {
	t, err := h.mountTable()
	if err != nil {
		return "", false, err
	}
	if real, err := filepath.EvalSymlinks(target); err == nil {
		target = real
	}
	src, ok := mountedAt(t, target)
	return src, ok, nil
}

// Mount mounts by mount(2): a bind mount with "bind" in options (then a
// remount for the flags, which a bind mount ignores on its first call),
// or a filesystem; ext4 mounted read-write is first checked with
// fsck.ext4 -p, which fixes what is safe after an unclean stop (kubelet's
// rule too) and fails on what is not.
func (h *kernelHost) Mount(ctx context.Context, source, target, fstype string, options []string) error {
	flags, data, bind := mountFlags(options)
	if bind {
		if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind mount %s on %s: %w", source, target, err)
		}
		if flags != 0 {
			if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|flags, ""); err != nil {
				unix.Unmount(target, 0)
				return fmt.Errorf("remount %s with %s: %w", target, strings.Join(options, ","), err)
			}
		}
		return nil
	}
	if fstype == "ext4" && flags&unix.MS_RDONLY == 0 {
		// fsck's exit status: 0 clean, 1 errors fixed; 4 and above
		// left uncorrected or failed (fsck(8)).
		out, err := h.run(ctx, "fsck.ext4", "-p", source)
		var ee *exec.ExitError
		if err != nil && !(errors.As(err, &ee) && ee.ExitCode() < 4) {
			return fmt.Errorf("fsck.ext4 -p %s before mounting: %v: %s", source, err, lastLine(out))
		}
	}
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount -t %s %s on %s (%s): %w", fstype, source, target, strings.Join(options, ","), err)
	}
	return nil
}

func (h *kernelHost) Unmount(ctx context.Context, target string) error {
	err := unix.Unmount(target, 0)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil // not a mount point (any more), or gone
	}
	return fmt.Errorf("unmount %s: %w", target, err)
}

// FSType asks blkid for the signature on the device, probing the device
// itself (-p), not blkid's cache; exit 2 is "nothing found".
func (h *kernelHost) FSType(ctx context.Context, device string) (string, error) {
	out, err := h.run(ctx, "blkid", "-p", "-o", "value", "-s", "TYPE", device)
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("blkid -p %s: %v: %s", device, err, lastLine(out))
	}
	return strings.TrimSpace(string(out)), nil
}

// mkfsArgs is the command line that makes fstype on device: quiet, and
// without discarding the device first (a new blk volume reads zeroes
// already, and a discard of a large thin volume is slow for nothing).
func mkfsArgs(device, fstype string, options []string) (string, []string, error) {
	switch fstype {
	case "ext4":
		return "mkfs.ext4", append(append([]string{"-q", "-F", "-E", "nodiscard"}, options...), device), nil
	case "xfs":
		return "mkfs.xfs", append(append([]string{"-q", "-K"}, options...), device), nil
	}
	return "", nil, fmt.Errorf("filesystem %q is not ext4 or xfs", fstype)
}

func (h *kernelHost) Mkfs(ctx context.Context, device, fstype string, options []string) error {
	name, args, err := mkfsArgs(device, fstype, options)
	if err != nil {
		return err
	}
	return h.runChecked(ctx, name, args...)
}

// resizeArgs is the command that grows a mounted filesystem to its
// device: resize2fs takes the device, xfs_growfs the mount point.
func resizeArgs(device, path, fstype string) (string, []string, error) {
	switch fstype {
	case "ext4":
		return "resize2fs", []string{device}, nil
	case "xfs":
		return "xfs_growfs", []string{path}, nil
	}
	return "", nil, fmt.Errorf("filesystem %q is not ext4 or xfs", fstype)
}

func (h *kernelHost) Resize(ctx context.Context, device, path, fstype string) error {
	name, args, err := resizeArgs(device, path, fstype)
	if err != nil {
		return err
	}
	return h.runChecked(ctx, name, args...)
}

func (h *kernelHost) Stats(ctx context.Context, path string) (Usage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Usage{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := int64(st.Bsize)
	return Usage{
		BytesTotal:      int64(st.Blocks) * bs,
		BytesAvailable:  int64(st.Bavail) * bs,
		BytesUsed:       int64(st.Blocks-st.Bfree) * bs,
		InodesTotal:     int64(st.Files),
		InodesAvailable: int64(st.Ffree),
		InodesUsed:      int64(st.Files - st.Ffree),
	}, nil
}

// blkGetSize64 is BLKGETSIZE64, _IOR(0x12, 114, size_t).
const blkGetSize64 = 0x80081272

// DeviceSize asks the kernel for the block device's size (BLKGETSIZE64).
func (h *kernelHost) DeviceSize(ctx context.Context, device string) (int64, error) {
	f, err := os.Open(device)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var size uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), blkGetSize64, uintptr(unsafe.Pointer(&size))); e != 0 {
		return 0, fmt.Errorf("BLKGETSIZE64 %s: %w", device, e)
	}
	return int64(size), nil
}

// run runs a tool and returns its combined output.
func (h *kernelHost) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	h.log.Debug("ran", "cmd", name, "args", strings.Join(args, " "), "err", err)
	return out.Bytes(), err
}

// runChecked runs a command for its effect: a failure names the command
// line, the error and the last line the command wrote.
func (h *kernelHost) runChecked(ctx context.Context, name string, args ...string) error {
	if out, err := h.run(ctx, name, args...); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, lastLine(out))
	}
	return nil
}

// lastLine is the last non-empty line of a tool's output, for an error.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
