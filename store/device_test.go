package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"

	"github.com/blk-project/blk/internal/loopdev"
)

// loopDevice is loopdev.Attach.
func loopDevice(t testing.TB, size int64) string {
	t.Helper()
	return loopdev.Attach(t, size)
}

// deviceConfig is a store in a temporary directory on dev.
func deviceConfig(t testing.TB, dev string) Config {
	return Config{Dir: filepath.Join(t.TempDir(), "volumes"), AreaDevice: dev, SyncInterval: -1, Logger: quietLogger{}}
}

// writeDevice writes b at off on dev, bypassing the store.
func writeDevice(t testing.TB, dev string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// readDevice reads n bytes at off of dev, bypassing the store (and the
// page cache, so it sees what the store wrote with O_DIRECT).
func readDevice(t *testing.T, dev string, n int, off int64) []byte {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	b := alignedBuf(n, 4096)
	if _, err := unix.Pread(fd, b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDeviceArea: a store created on a blank block device uses all of it
// (no file area beside pebble), does not zero it (bytes a previous user
// left in the middle, where the blank check does not look, stay until
// their clusters are first handed out: the zeroed watermark is at the
// header), writes its header as a lazily zeroed device store, and keeps
// data across a reopen; the asynchronous path gets the device's
// descriptor.
func TestDeviceArea(t *testing.T) {
	const size = 64 << 20
	dev := loopDevice(t, size)
	junk := bytes.Repeat([]byte{0xa5}, 1<<20)
	writeDevice(t, dev, junk, 32<<20)
	cfg := deviceConfig(t, dev)
	s := openStore(t, cfg)
	if ai := s.AreaInfo(); ai != (AreaInfo{Path: dev, Device: true, Bytes: size, Align: 512, Direct: true}) {
		t.Fatalf("AreaInfo %+v", ai)
	}
	if _, err := os.Stat(cfg.Dir + ".area"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an area file was made beside a device store: %v", err)
	}
	if fd, path, ok := s.DirectFD(); !ok || fd < 0 || path != dev {
		t.Fatalf("DirectFD: %d %q %v", fd, path, ok)
	}
	if !bytes.Equal(readDevice(t, dev, 1<<20, 32<<20), junk) {
		t.Fatal("creating a store wrote to the middle of the device: it zeroes clusters when they are first handed out")
	}
	if st := s.Stats(); st.Zeroed != 1 || st.ZeroedAhead != 0 {
		t.Fatalf("a new device store: watermark %d, %d zeroed ahead; want 1 (the header's cluster) and 0", st.Zeroed, st.ZeroedAhead)
	}
	if h := readDevice(t, dev, 4096, 0); !bytes.HasPrefix(h, []byte("blk-store/3\x00")) {
		t.Fatalf("device header %q", h[:16])
	}
	v := mustCreate(t, s, 3, 4096, BlockSize4K)
	data := alignedBuf(40*4096, 4096)
	for i := range data {
		data[i] = byte(i*7 + 3)
	}
	if err := v.Write(10, data, FUA); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, cfg)
	v, err := s.Volume(3)
	if err != nil {
		t.Fatal(err)
	}
	got := alignedBuf(42*4096, 4096)
	if err := v.Read(9, got); err != nil {
		t.Fatal(err)
	}
	if !isZero(got[:4096]) || !bytes.Equal(got[4096:41*4096], data) || !isZero(got[41*4096:]) {
		t.Fatal("read back after reopen differs from what was written")
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestDeviceRefusesData: creating a store on a device that holds
// something recognisable or any non-zero byte at either end is refused
// with ErrNotBlank naming it, and the device is left as it was; with
// WipeDevice the store is created and the old contents are gone.
func TestDeviceRefusesData(t *testing.T) {
	const size = 16 << 20
	ext4 := make([]byte, 4096)
	copy(ext4[1080:], "\x53\xef") // ext2/3/4 superblock magic
	gpt := make([]byte, 4096)
	copy(gpt[512:], "EFI PART")
	gpt[510], gpt[511] = 0x55, 0xaa
	for _, c := range []struct {
		name string
		b    []byte
		off  int64
		want string
	}{
		{"ext4", ext4, 0, "ext2/3/4 filesystem"},
		{"gpt", gpt, 0, "GPT partition table"},
		{"lvm", append(make([]byte, 512), "LABELONE"...), 0, "LVM physical volume"},
		{"data-at-end", []byte("x"), size - 100, "non-zero bytes at offset 16777116"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dev := loopDevice(t, size)
			writeDevice(t, dev, c.b, c.off)
			before := readDevice(t, dev, 1<<20, 0)
			cfg := deviceConfig(t, dev)
			_, err := Open(cfg)
			if !errors.Is(err, ErrNotBlank) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), dev) {
				t.Fatalf("Open on a device holding %s: %v, want ErrNotBlank naming %q and the device", c.name, err, c.want)
			}
			if !bytes.Equal(readDevice(t, dev, 1<<20, 0), before) {
				t.Fatal("a refused device was written to")
			}
			cfg.WipeDevice = true
			s := openStore(t, cfg)
			mustCreate(t, s, 1, 16, BlockSize4K)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if got := readDevice(t, dev, 4096, 0); !isZero(got[512:]) {
				t.Fatal("wiped device still holds old bytes past the header")
			}
			if c.off > 0 && !isZero(readDevice(t, dev, 4096, c.off&^4095)) {
				t.Fatal("wiped device still holds old bytes at the end")
			}
		})
	}
	t.Run("mkfs.ext4", func(t *testing.T) {
		mkfs, err := exec.LookPath("mkfs.ext4")
		if err != nil {
			t.Skipf("skipped: no mkfs.ext4 (%v)", err)
		}
		dev := loopDevice(t, size)
		if out, err := exec.Command(mkfs, "-q", "-F", dev).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4: %v: %s", err, out)
		}
		if _, err := Open(deviceConfig(t, dev)); !errors.Is(err, ErrNotBlank) || !strings.Contains(err.Error(), "ext2/3/4") {
			t.Fatalf("Open on a real ext4 filesystem: %v, want ErrNotBlank naming ext4", err)
		}
	})
	t.Run("another-store", func(t *testing.T) {
		dev := loopDevice(t, size)
		first := openStore(t, deviceConfig(t, dev))
		uuid := first.format.uuid
		if err := first.Close(); err != nil {
			t.Fatal(err)
		}
		_, err := Open(deviceConfig(t, dev)) // a new data directory, the same device
		if !errors.Is(err, ErrNotBlank) || !strings.Contains(err.Error(), "blk store") || !strings.Contains(err.Error(), hexUUID(uuid)) {
			t.Fatalf("a new store on another store's device: %v, want ErrNotBlank naming uuid %s", err, hexUUID(uuid))
		}
	})
}

func hexUUID(u [16]byte) string { return fmt.Sprintf("%x", u) }

// TestDeviceCreateInterrupted: a crash after the format record said
// "creating" and before the header was written leaves a device the next
// Open checks again and zeroes before it finishes the store; if the
// device was swapped meanwhile for one holding a filesystem, that Open
// refuses it like a first create.
func TestDeviceCreateInterrupted(t *testing.T) {
	dev := loopDevice(t, 16<<20)
	cfg := deviceConfig(t, dev)
	s := openStore(t, cfg)
	f := s.format
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The state a crash between putFormat(creating) and initArea leaves:
	// the record says creating, the device is zeroed, no header.
	f.state = formatCreating
	setFormat := func() {
		db, err := pebble.Open(cfg.Dir, &pebble.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Set(formatKey, f.record(), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	setFormat()
	writeDevice(t, dev, make([]byte, 4096), 0)
	s = openStore(t, cfg)
	if s.format.state != formatReady || s.format.uuid != f.uuid {
		t.Fatalf("format after the interrupted create: %+v", s.format)
	}
	if h := readDevice(t, dev, 4096, 0); !bytes.HasPrefix(h, []byte("blk-store/3\x00")) {
		t.Fatalf("no header after the interrupted create was finished: %q", h[:16])
	}
	v := mustCreate(t, s, 1, 16, BlockSize4K)
	if err := v.Write(0, alignedBuf(4096, 4096), FUA); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Creating again, and the device now holds a filesystem.
	setFormat()
	ext4 := make([]byte, 4096)
	copy(ext4[1080:], "\x53\xef")
	writeDevice(t, dev, ext4, 0)
	if _, err := Open(cfg); !errors.Is(err, ErrNotBlank) || !strings.Contains(err.Error(), "ext2/3/4") {
		t.Fatalf("an interrupted create on a device now holding ext4: %v, want ErrNotBlank", err)
	}
}

// TestDeviceInUse: a device someone holds open exclusively (as the
// kernel does for a mounted filesystem, dm, md, or another blkd's store)
// is refused with ErrInUse, never written; once released, the store
// opens. A second store on a device already serving one is refused too.
func TestDeviceInUse(t *testing.T) {
	dev := loopDevice(t, 16<<20)
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := deviceConfig(t, dev)
	if _, err := Open(cfg); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), dev) {
		_ = unix.Close(fd)
		t.Fatalf("Open on a device held O_EXCL: %v, want ErrInUse naming it", err)
	}
	_ = unix.Close(fd)
	s := openStore(t, cfg)
	if _, err := Open(deviceConfig(t, dev)); !errors.Is(err, ErrInUse) {
		t.Fatalf("a second store on a device in use: %v, want ErrInUse", err)
	}
	// Reopening the same directory while it is open is refused by the
	// device (pebble's lock would refuse it too).
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDeviceSwapped: a store's data directory opened with another store's
// device, or with its own device overwritten, is refused with ErrCorrupt
// naming both stores (or what the device holds now), and nothing is
// written to the device.
func TestDeviceSwapped(t *testing.T) {
	devA, devB := loopDevice(t, 16<<20), loopDevice(t, 16<<20)
	cfgA, cfgB := deviceConfig(t, devA), deviceConfig(t, devB)
	a := openStore(t, cfgA)
	b := openStore(t, cfgB)
	ua, ub := a.format.uuid, b.format.uuid
	mustCreate(t, a, 1, 16, BlockSize4K)
	if err := errors.Join(a.Close(), b.Close()); err != nil {
		t.Fatal(err)
	}
	swapped := cfgA
	swapped.AreaDevice = devB
	before := readDevice(t, devB, 1<<20, 0)
	_, err := Open(swapped)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), hexUUID(ua)) || !strings.Contains(err.Error(), hexUUID(ub)) {
		t.Fatalf("store A on B's device: %v, want ErrCorrupt naming both uuids", err)
	}
	if !bytes.Equal(readDevice(t, devB, 1<<20, 0), before) {
		t.Fatal("a refused device was written to")
	}
	// A's device overwritten by a filesystem.
	ext4 := make([]byte, 4096)
	copy(ext4[1080:], "\x53\xef")
	writeDevice(t, devA, ext4, 0)
	if _, err := Open(cfgA); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "ext2/3/4") || !strings.Contains(err.Error(), hexUUID(ua)) {
		t.Fatalf("store A on its device overwritten by ext4: %v, want ErrCorrupt naming ext4 and the store", err)
	}
}

// TestAreaKindSwitch: a store created with a file area does not start on
// a device, and a device store does not start on a file (nor creates
// one): either would find no volumes where they should be.
func TestAreaKindSwitch(t *testing.T) {
	dev := loopDevice(t, 16<<20)
	fileCfg := Config{Dir: filepath.Join(t.TempDir(), "volumes"), AreaBytes: 4 << 20, SyncInterval: -1, Logger: quietLogger{}}
	s := openStore(t, fileCfg)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	onDevice := fileCfg
	onDevice.AreaDevice = dev
	onDevice.AreaPath = ""
	before := readDevice(t, dev, 1<<20, 0)
	if _, err := Open(onDevice); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "file") || !strings.Contains(err.Error(), dev) {
		t.Fatalf("a file store opened on a device: %v, want ErrInvalid", err)
	}
	if !bytes.Equal(readDevice(t, dev, 1<<20, 0), before) {
		t.Fatal("the device was written to")
	}

	devCfg := deviceConfig(t, dev)
	s = openStore(t, devCfg)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	onFile := devCfg
	onFile.AreaDevice = ""
	if _, err := Open(onFile); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "block device "+dev) {
		t.Fatalf("a device store opened without its device: %v, want ErrInvalid naming the device", err)
	}
	if _, err := os.Stat(devCfg.Dir + ".area"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an area file was created: %v", err)
	}
	s = openStore(t, devCfg) // and it still opens with its device
	_ = s.Close()
}

// TestDeviceFull: a device never grows: when every cluster is mapped an
// allocating write fails with ErrNoSpace (no panic, nothing lost), while
// overwrites, reads and a reopen go on.
func TestDeviceFull(t *testing.T) {
	const size = 2 << 20
	dev := loopDevice(t, size)
	cfg := deviceConfig(t, dev)
	cfg.ReadyClusters = 4
	s := openStore(t, cfg)
	const cb = DefaultClusterBytes
	v := mustCreate(t, s, 1, 2*size/4096, BlockSize4K) // twice the device: thin
	buf := alignedBuf(4096, 4096)
	per := uint64(cb / 4096)
	var written uint64
	for ; ; written++ {
		buf[0] = byte(written + 1)
		err := v.Write(written*per, buf, 0)
		if errors.Is(err, ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatalf("write %d: %v", written, err)
		}
		if written > size/cb {
			t.Fatal("wrote more clusters than the device holds")
		}
	}
	if want := uint64(size/cb - 1); written != want {
		t.Fatalf("%d clusters written before ErrNoSpace, want %d (all but the header's)", written, want)
	}
	if ai := s.AreaInfo(); ai.Bytes != size {
		t.Fatalf("the device area changed size: %+v", ai)
	}
	buf[0] = 0xee
	if err := v.Write(0, buf, FUA); err != nil {
		t.Fatalf("an overwrite on a full device: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, cfg)
	v, err := s.Volume(1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range written {
		if err := v.Read(i*per, buf); err != nil {
			t.Fatal(err)
		}
		want := byte(i + 1)
		if i == 0 {
			want = 0xee
		}
		if buf[0] != want {
			t.Fatalf("cluster %d reads %#x, want %#x", i, buf[0], want)
		}
	}
	if err := v.Write(written*per, buf, 0); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("after reopen, a write to a new cluster: %v, want ErrNoSpace", err)
	}
}

// TestFormatRecordCompat: a file store's format record is byte for byte
// what releases before block devices wrote ("blk-store/1", byte 18 zero),
// so it still opens with them; a device store's is "/2" with its path,
// and a record whose kind byte disagrees with its magic is corrupt.
func TestFormatRecordCompat(t *testing.T) {
	f := formatRecord{state: formatReady, clusterL: 16, clusters: 1000, uuid: [16]byte{1, 2, 3}}
	v := f.record()
	if len(v) != formatLen || string(v[:11]) != "blk-store/1" || v[18] != 0 {
		t.Fatalf("file record %q", v)
	}
	g, err := decodeFormat(v)
	if err != nil || g != f {
		t.Fatalf("file record decodes to %+v, %v", g, err)
	}
	d := f
	d.device, d.path = true, "/dev/disk/by-id/nvme-x"
	v = d.record()
	if string(v[:11]) != "blk-store/2" || v[18] != areaKindDevice || string(v[formatLen:]) != d.path {
		t.Fatalf("device record %q", v)
	}
	if g, err := decodeFormat(v); err != nil || g != d {
		t.Fatalf("device record decodes to %+v, %v", g, err)
	}
	hdr := make([]byte, headerLen)
	d.encodeHeader(hdr)
	if g, err := decodeHeader(hdr); err != nil || !g.device || g.uuid != d.uuid {
		t.Fatalf("device header decodes to %+v, %v", g, err)
	}
	bad := f.record()
	bad[18] = areaKindDevice
	if _, err := decodeFormat(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a /1 record with the device kind: %v, want ErrCorrupt", err)
	}
	bad = d.record()
	bad[18] = areaKindFile
	if _, err := decodeFormat(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a /2 record with the file kind: %v, want ErrCorrupt", err)
	}
}

// TestDeviceConfig: the device settings' validation.
func TestDeviceConfig(t *testing.T) {
	for _, bad := range []Config{
		{Dir: "/d", AreaDevice: "/dev/x", AreaPath: "/d.area"},
		{Dir: "/d", WipeDevice: true},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", bad, err)
		}
	}
	if c := (Config{Dir: "/d", AreaDevice: "/dev/x"}).WithDefaults(); c.AreaPath != "" {
		t.Errorf("a device config got an area file %q", c.AreaPath)
	}
	if _, err := Open(Config{Dir: filepath.Join(t.TempDir(), "v"), AreaDevice: filepath.Join(t.TempDir(), "file"), Logger: quietLogger{}}); !errors.Is(err, ErrIO) {
		t.Errorf("a missing device: %v, want ErrIO", err)
	}
	notDev := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(notDev, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: filepath.Join(t.TempDir(), "v"), AreaDevice: notDev, Logger: quietLogger{}}); !errors.Is(err, ErrInvalid) ||
		!strings.Contains(err.Error(), "not a block device") {
		t.Errorf("a plain file as the device: %v, want ErrInvalid", err)
	}
}

// TestUpgradeOntoDevice: a target/volume directory upgraded with its
// data area on a device: every block is there afterwards; a device too
// small for the data is refused with ErrNoSpace naming its size before
// anything is written to it or to the directory.
func TestUpgradeOntoDevice(t *testing.T) {
	small := loopDevice(t, 4<<16)
	meta := filepath.Join(t.TempDir(), "volumes")
	copyFixture(t, vfs.Default, meta)
	before := readDevice(t, small, 4<<16, 0)
	_, err := Open(Config{Dir: meta, AreaDevice: small, Logger: quietLogger{}})
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "the data area's size") {
		t.Fatalf("upgrade onto a 4-cluster device: %v, want ErrNoSpace naming the area's size", err)
	}
	if !bytes.Equal(readDevice(t, small, 4<<16, 0), before) {
		t.Fatal("a refused upgrade wrote to the device")
	}
	db, err := pebble.Open(meta, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Get(formatKey); !errors.Is(err, pebble.ErrNotFound) {
		t.Fatalf("a refused upgrade wrote a format record: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	dev := loopDevice(t, 32<<20)
	cfg := Config{Dir: meta, AreaDevice: dev, Logger: quietLogger{}}
	s := openStore(t, cfg)
	if err := verifyUpgraded(s); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, cfg)
	if err := verifyUpgraded(s); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if ai := s.AreaInfo(); !ai.Device || ai.Path != dev {
		t.Fatalf("AreaInfo %+v", ai)
	}
}
