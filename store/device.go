package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A block device as the data area (Config.AreaDevice, blkd --data-device).
//
// The device is the area: its size is the device's (BLKGETSIZE64), it
// never grows, and its alignment is its logical block size (BLKSSZGET, or
// statx's DIO alignment where the kernel reports one for a device). It is
// opened O_DIRECT|O_EXCL and held so for the store's life: Linux refuses
// O_EXCL on a block device that is mounted, part of an md, dm or LVM
// device, or open O_EXCL by anyone else (another blkd), so blkd can never
// write under a filesystem or another store. Zero is
// fallocate(FALLOC_FL_ZERO_RANGE) on the device, which the kernel turns
// into Write Zeroes (or writes of zeros) without unmapping: the same call
// as a file area's, and no slower than BLKZEROOUT on a loop device
// (docs/store.md, "Data area on a block device").

// deviceScanBytes is how much of each end of a device is read before a
// store is created on it: partition tables, filesystem, LVM, md and LUKS
// signatures all live in the first MiB, GPT's backup header and md 0.90's
// superblock in the last.
const deviceScanBytes = 1 << 20

// OpenDeviceArea opens the block device at path as a data area:
// O_RDWR|O_DIRECT|O_EXCL. ErrInUse if the kernel says it is busy (mounted,
// held by a device mapper, md or another blkd); ErrInvalid if path is not
// a block device.
func OpenDeviceArea(path string) (Area, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_DIRECT|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return nil, fmt.Errorf("data device %s is in use%s: blk never writes to a device someone else holds: %w", path, deviceUsers(path), ErrInUse)
	}
	if err != nil {
		return nil, fmt.Errorf("data device %s: open: %w: %w", path, ErrIO, err)
	}
	fail := func(err error) (Area, error) {
		_ = unix.Close(fd)
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(fmt.Errorf("data device %s: %w: %w", path, ErrIO, err))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return fail(fmt.Errorf("data device %s is not a block device (a data area in a file is the default: drop the device setting): %w", path, ErrInvalid))
	}
	var size uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
		return fail(fmt.Errorf("data device %s: BLKGETSIZE64: %w: %w", path, ErrIO, e))
	}
	lbs, err := unix.IoctlGetInt(fd, unix.BLKSSZGET)
	if err != nil {
		return fail(fmt.Errorf("data device %s: BLKSSZGET: %w: %w", path, ErrIO, err))
	}
	align := max(lbs, 512)
	var sx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &sx); err == nil &&
		sx.Mask&unix.STATX_DIOALIGN != 0 && sx.Dio_offset_align != 0 {
		align = max(align, int(sx.Dio_offset_align), int(sx.Dio_mem_align))
	}
	if align&(align-1) != 0 || align > 64<<10 {
		return fail(fmt.Errorf("data device %s: logical block size %d: %w", path, align, ErrInvalid))
	}
	a := &fileArea{fd: fd, path: path, direct: true, device: true, align: align}
	a.size.Store(int64(size) &^ int64(align-1))
	a.zero = alignedBuf(64<<10, align)
	return a, nil
}

// deviceUsers says, for an error message, who holds the device at path:
// its mount points (from /proc/self/mountinfo) and its holders (dm, md).
// Best effort: "" when it cannot tell.
func deviceUsers(path string) string {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return ""
	}
	devno := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	var users []string
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// id parent major:minor root mount-point ...
			if fs := strings.Fields(sc.Text()); len(fs) > 4 && fs[2] == devno {
				users = append(users, "mounted on "+fs[4])
			}
		}
		_ = f.Close()
	}
	if hs, err := os.ReadDir("/sys/dev/block/" + devno + "/holders"); err == nil {
		for _, h := range hs {
			users = append(users, "held by "+h.Name())
		}
	}
	if len(users) == 0 {
		return " (mounted, held by a device mapper or md array, or open by another blkd)"
	}
	return " (" + strings.Join(users, ", ") + ")"
}

// deviceContents describes what the first and last deviceScanBytes of
// the area hold: "" if they are all zeros, else what was recognised
// ("an ext2/3/4 filesystem", "a blk store's data area (uuid ...)") or
// where the first non-zero byte is.
func deviceContents(a Area) (string, error) {
	n := min(int64(deviceScanBytes), a.Size()) &^ int64(a.Align()-1)
	buf := alignedBuf(int(n), a.Align())
	for _, off := range []int64{0, a.Size() - n} {
		if err := a.ReadAt(buf, off); err != nil {
			return "", fmt.Errorf("read %d bytes at %d: %w: %w", n, off, ErrIO, err)
		}
		if what := recognise(buf, off == 0, a.Size()); what != "" {
			return what, nil
		}
		if i := bytes.IndexFunc(buf, func(r rune) bool { return r != 0 }); i >= 0 {
			return fmt.Sprintf("data (non-zero bytes at offset %d)", off+int64(i)), nil
		}
	}
	return "", nil
}

// recognise names a signature in b, read at the start of the device
// (start) or at its end: the ones an operator is likely to point blkd at
// by mistake. Offsets as blkid (util-linux libblkid) finds them.
func recognise(b []byte, start bool, size int64) string {
	at := func(off int, magic string) bool {
		return off >= 0 && off+len(magic) <= len(b) && string(b[off:off+len(magic)]) == magic
	}
	if !start {
		if at(len(b)-512, "EFI PART") || at(len(b)-4096, "EFI PART") { // the last LBA, 512 or 4096 bytes
			return "a GPT partition table (backup header at the end)"
		}
		// md 0.90's superblock is in the last 64 KiB-aligned 64 KiB, 1.0's
		// 8 KiB from the end, 4 KiB-aligned.
		base := size - int64(len(b))
		for _, abs := range []int64{size&^(64<<10-1) - 64<<10, (size - 8<<10) &^ (4<<10 - 1)} {
			if i := abs - base; i >= 0 && i+4 <= int64(len(b)) && binary.LittleEndian.Uint32(b[i:]) == 0xa92b4efc {
				return "an md RAID member (superblock 0.90 or 1.0)"
			}
		}
		return ""
	}
	if len(b) >= headerLen {
		if f, err := decodeHeader(b); err == nil {
			return fmt.Sprintf("a blk store's data area (uuid %x)", f.uuid)
		}
	}
	switch {
	case at(0, "LUKS\xba\xbe"):
		return "a LUKS encrypted volume"
	case at(512, "LABELONE") || at(24+512, "LVM2 001"):
		return "an LVM physical volume"
	case at(512, "EFI PART") || at(4096, "EFI PART"): // LBA 1
		return "a GPT partition table"
	case at(1080, "\x53\xef"):
		return "an ext2/3/4 filesystem"
	case at(0, "XFSB"):
		return "an XFS filesystem"
	case at(64<<10+64, "_BHRfS_M"):
		return "a btrfs filesystem"
	case at(4096-10, "SWAPSPACE2") || at(4096-10, "SWAP-SPACE"):
		return "a swap area"
	case at(4096, "\xfc\x4e\x2b\xa9"):
		return "an md RAID member (superblock 1.2)"
	case at(3, "NTFS    "):
		return "an NTFS filesystem"
	case at(54, "FAT") || at(82, "FAT32"):
		return "a FAT filesystem"
	case at(32769, "CD001"):
		return "an ISO 9660 image"
	case len(b) >= 512 && b[510] == 0x55 && b[511] == 0xaa:
		return "an MBR partition table or boot sector"
	}
	return ""
}
