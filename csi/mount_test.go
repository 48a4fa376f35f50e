package csi

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMountInfoRecorded(t *testing.T) {
	f, err := os.Open("testdata/mountinfo-node.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	es, err := parseMountInfo(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 12 {
		t.Fatalf("%d entries, want 12", len(es))
	}
	root := es[5]
	if root.MountPoint != "/" || root.FSType != "ext4" || root.Source != "/dev/vda" || root.Major != 254 || root.Minor != 0 || root.ID != 27 || root.Parent != 1 {
		t.Errorf("root entry %+v", root)
	}
	esc := es[9]
	if esc.MountPoint != "/tmp/csi mount/with\ttab\\slash" || esc.FSType != "xfs" || esc.Options != "ro,relatime" || esc.SuperOptions != "ro,attr2,inode64" {
		t.Errorf("escaped entry %+v", esc)
	}
	blk := es[8]
	if blk.Root != "/nvme2n1" || blk.FSType != "devtmpfs" || blk.Source != "udev" {
		t.Errorf("block bind entry (two optional fields) %+v", blk)
	}

	for _, c := range []struct {
		path, src string
		ok        bool
	}{
		{"/var/lib/kubelet/plugins/kubernetes.io/csi/csi.blk-project.github.io/3f2a/globalmount", "/dev/nvme1n1", true},
		{"/var/lib/kubelet/pods/7c1e/volumes/kubernetes.io~csi/pvc-1/mount/", "/dev/nvme1n1", true}, // cleaned
		{"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-2/7c1e", "/dev/nvme2n1", true},
		{"/tmp/csi mount/with\ttab\\slash", "/dev/nvme3n1", true},
		{"/tmp/stage", "/dev/nbd0", true}, // the later mount hides the earlier
		{"/var/lib/kubelet", "", false},
		{"/dev", "devtmpfs", true}, // devtmpfs with root "/" is a plain mount
	} {
		src, ok := mountedAt(es, c.path)
		if src != c.src || ok != c.ok {
			t.Errorf("mountedAt(%q) = %q, %v; want %q, %v", c.path, src, ok, c.src, c.ok)
		}
	}
}

func TestParseMountInfoThisMachine(t *testing.T) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	es, err := parseMountInfo(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := mountedAt(es, "/"); !ok {
		t.Errorf("no mount at / among %d entries", len(es))
	}
}

func TestParseMountInfoRefusesGarbage(t *testing.T) {
	for _, in := range []string{
		"1 2 3\n",
		"36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 ext3 /dev/root rw\n", // no separator
		"x 35 98:0 / /m rw - ext4 /dev/a rw\n",
		"36 35 98-0 / /m rw - ext4 /dev/a rw\n",
	} {
		if _, err := parseMountInfo(strings.NewReader(in)); err == nil {
			t.Errorf("parseMountInfo(%q): no error", in)
		}
	}
}

func TestMountFlags(t *testing.T) {
	flags, data, bind := mountFlags([]string{"bind", "ro", "noatime", "rw", "discard", "errors=remount-ro", ""})
	if flags != unix.MS_RDONLY|unix.MS_NOATIME || data != "discard,errors=remount-ro" || !bind {
		t.Errorf("mountFlags = %#x %q %v", flags, data, bind)
	}
	if f, d, b := mountFlags(nil); f != 0 || d != "" || b {
		t.Errorf("mountFlags(nil) = %#x %q %v", f, d, b)
	}
}

func TestToolCommandLines(t *testing.T) {
	name, args, err := mkfsArgs("/dev/nvme1n1", "ext4", []string{"-E", "lazy_itable_init=1"})
	if err != nil || name != "mkfs.ext4" || strings.Join(args, " ") != "-q -F -E nodiscard -E lazy_itable_init=1 /dev/nvme1n1" {
		t.Errorf("mkfs ext4: %s %v %v", name, args, err)
	}
	name, args, err = mkfsArgs("/dev/nvme1n1", "xfs", nil)
	if err != nil || name != "mkfs.xfs" || strings.Join(args, " ") != "-q -K /dev/nvme1n1" {
		t.Errorf("mkfs xfs: %s %v %v", name, args, err)
	}
	if _, _, err := mkfsArgs("/dev/x", "btrfs", nil); err == nil {
		t.Error("mkfs btrfs: no error")
	}
	name, args, err = resizeArgs("/dev/nvme1n1", "/stage", "ext4")
	if err != nil || name != "resize2fs" || !slices.Equal(args, []string{"/dev/nvme1n1"}) {
		t.Errorf("resize ext4: %s %v %v", name, args, err)
	}
	name, args, err = resizeArgs("/dev/nvme1n1", "/stage", "xfs")
	if err != nil || name != "xfs_growfs" || !slices.Equal(args, []string{"/stage"}) {
		t.Errorf("resize xfs: %s %v %v", name, args, err)
	}
}

func TestConnectString(t *testing.T) {
	c := Connection{SubNQN: "nqn.2024-01.io.blk:vol:v", HostNQN: "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-4d2e-883f-0016d3cca427",
		HostID: "1b4e28ba-2fa1-4d2e-883f-0016d3cca427"}
	want := "transport=tcp,traddr=10.0.2.2,trsvcid=4420,nqn=nqn.2024-01.io.blk:vol:v,hostnqn=" + c.HostNQN +
		",hostid=1b4e28ba-2fa1-4d2e-883f-0016d3cca427,ctrl_loss_tmo=-1"
	if got := connectString(c, "10.0.2.2", "4420"); got != want {
		t.Errorf("connectString = %q\nwant %q", got, want)
	}
	c.DHCHAPSecret, c.DHCHAPCtrlSecret = "DHHC-1:00:aaa:", "DHHC-1:00:bbb:"
	if got := connectString(c, "10.0.2.2", "4420"); got != want+",dhchap_secret=DHHC-1:00:aaa:,dhchap_ctrl_secret=DHHC-1:00:bbb:" {
		t.Errorf("connectString with secrets = %q", got)
	}
	a := parseAddress("traddr=10.0.2.2,trsvcid=4420,src_addr=10.0.2.15\n")
	if a["traddr"] != "10.0.2.2" || a["trsvcid"] != "4420" || a["src_addr"] != "10.0.2.15" {
		t.Errorf("parseAddress = %v", a)
	}
}

// fakeSys writes a /sys tree: controllers and their subsystem.
func fakeSys(t *testing.T, multipath bool) string {
	t.Helper()
	sys := t.TempDir()
	w := func(p, v string) {
		p = filepath.Join(sys, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const sub = "nqn.2024-01.io.blk:vol:a"
	w("class/nvme/nvme0/subsysnqn", "nqn.2024-01.io.blk:vol:other")
	w("class/nvme/nvme0/address", "traddr=10.0.2.2,trsvcid=4420")
	w("class/nvme/nvme0/state", "live")
	w("class/nvme/nvme1/subsysnqn", sub)
	w("class/nvme/nvme1/address", "traddr=10.0.2.2,trsvcid=4421,src_addr=10.0.2.15")
	w("class/nvme/nvme1/state", "live")
	w("class/nvme/nvme2/subsysnqn", sub)
	w("class/nvme/nvme2/address", "traddr=10.0.2.2,trsvcid=4422")
	w("class/nvme/nvme2/state", "connecting")
	w("class/nvme-subsystem/nvme-subsys0/subsysnqn", "nqn.2024-01.io.blk:vol:other")
	w("class/nvme-subsystem/nvme-subsys0/nvme0n1/nsid", "1")
	w("class/nvme-subsystem/nvme-subsys1/subsysnqn", sub)
	if multipath {
		w("class/nvme-subsystem/nvme-subsys1/nvme1n1/nsid", "1")
		w("class/nvme/nvme1/nvme1c1n1/nsid", "1") // hidden path disks
		w("class/nvme/nvme2/nvme1c2n1/nsid", "1")
	} else {
		w("class/nvme/nvme1/nvme1n1/nsid", "1")
	}
	return sys
}

func TestSysfsControllersAndDevice(t *testing.T) {
	const sub = "nqn.2024-01.io.blk:vol:a"
	for _, mp := range []bool{true, false} {
		h := NewHost(nil).(*kernelHost)
		h.sys = fakeSys(t, mp)
		cs, err := h.controllers(sub)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) != 2 || cs[0] != (ctrl{"nvme1", "10.0.2.2", "4421", "live"}) || cs[1] != (ctrl{"nvme2", "10.0.2.2", "4422", "connecting"}) {
			t.Errorf("multipath %v: controllers = %+v", mp, cs)
		}
		if !slicesContainsCtrl(cs, "10.0.2.2", "4422") || slicesContainsCtrl(cs, "10.0.2.2", "4420") {
			t.Errorf("multipath %v: path lookup wrong", mp)
		}
		if dev := h.namespaceDevice(sub, 1, cs); dev != "/dev/nvme1n1" {
			t.Errorf("multipath %v: device %q, want /dev/nvme1n1 (never a hidden path disk)", mp, dev)
		}
		if dev := h.namespaceDevice(sub, 2, cs); dev != "" {
			t.Errorf("multipath %v: namespace 2 found as %q", mp, dev)
		}
		if ok, _ := h.Healthy(t.Context(), sub); ok {
			t.Errorf("multipath %v: healthy with a connecting controller", mp)
		}
		if ok, _ := h.Healthy(t.Context(), "nqn.2024-01.io.blk:vol:other"); !ok {
			t.Errorf("multipath %v: one live controller is not healthy", mp)
		}
	}
}

func TestNodeIdentity(t *testing.T) {
	root := t.TempDir()
	write := func(p, v string) {
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := nodeIdentity(root, "", ""); err == nil || !strings.Contains(err.Error(), "--host-nqn") ||
		!strings.Contains(err.Error(), "/etc/nvme/hostnqn") || !strings.Contains(err.Error(), "/etc/machine-id") {
		t.Errorf("no source: %v, want an error naming the three", err)
	}
	write("etc/machine-id", "4f8d2a0b6c1e4e9b8a7d3c2b1a0f9e8d\n")
	nqn, id, err := nodeIdentity(root, "", "")
	if err != nil || !strings.HasPrefix(nqn, uuidNQNPrefix) || id != strings.TrimPrefix(nqn, uuidNQNPrefix) {
		t.Fatalf("from machine-id: %q %q %v", nqn, id, err)
	}
	if u, _ := parseHostID(id); u[6]>>4 != 5 || u[8]>>6 != 2 {
		t.Errorf("derived UUID %s is not version 5, RFC variant", id)
	}
	nqn2, _, _ := nodeIdentity(root, "", "")
	if nqn2 != nqn {
		t.Errorf("derivation not stable: %q then %q", nqn, nqn2)
	}
	write("etc/nvme/hostnqn", "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-4d2e-883f-0016d3cca427\n")
	nqn, id, err = nodeIdentity(root, "", "")
	if err != nil || nqn != "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-4d2e-883f-0016d3cca427" || id != "1b4e28ba-2fa1-4d2e-883f-0016d3cca427" {
		t.Errorf("from hostnqn: %q %q %v", nqn, id, err)
	}
	write("etc/nvme/hostid", "0e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b\n")
	if _, id, _ = nodeIdentity(root, "", ""); id != "0e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b" {
		t.Errorf("hostid file not used: %q", id)
	}
	nqn, id, err = nodeIdentity(root, "nqn.2026-01.io.example:node-a", "")
	if err != nil || nqn != "nqn.2026-01.io.example:node-a" || id != "0e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b" {
		t.Errorf("flag: %q %q %v", nqn, id, err)
	}
	os.Remove(filepath.Join(root, "etc/nvme/hostid"))
	if _, id, _ = nodeIdentity(root, "nqn.2026-01.io.example:node-a", ""); id == "" || id == strings.TrimPrefix(nqn2, uuidNQNPrefix) {
		t.Errorf("a non-uuid NQN's host ID %q: want one derived from the machine ID, not the NQN's", id)
	}
	if _, _, err := nodeIdentity(root, "not an nqn", ""); err == nil {
		t.Error("a malformed NQN was accepted")
	}
	if _, _, err := nodeIdentity(root, "", "not-a-uuid"); err == nil {
		t.Error("a malformed host ID was accepted")
	}
}

func TestParsePublishEndpoints(t *testing.T) {
	got, err := parsePublishEndpoints("tcp:10.0.2.2:4420,rdma:10.0.2.2:4421, tcp:[fd00::1]:4420,tcp:fd00::2:4420")
	if err != nil || !slices.Equal(got, []string{"10.0.2.2:4420", "[fd00::1]:4420", "[fd00::2]:4420"}) {
		t.Errorf("got %v %v", got, err)
	}
	for _, bad := range []string{"", "rdma:10.0.2.2:4420", "tcp:10.0.2.2", "10.0.2.2:4420", "tcp:10.0.2.2:http", "tcp:10.0.2.2:0"} {
		if _, err := parsePublishEndpoints(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestSysfsDisconnectAndRescan(t *testing.T) {
	const sub = "nqn.2024-01.io.blk:vol:a"
	h := NewHost(nil).(*kernelHost)
	h.sys = fakeSys(t, true)
	for _, c := range []string{"nvme0", "nvme1", "nvme2"} {
		os.WriteFile(filepath.Join(h.sys, "class/nvme", c, "delete_controller"), nil, 0o200)
		os.WriteFile(filepath.Join(h.sys, "class/nvme", c, "rescan_controller"), nil, 0o200)
	}
	if err := h.Rescan(t.Context(), sub); err != nil {
		t.Fatal(err)
	}
	if err := h.Disconnect(t.Context(), sub); err != nil {
		t.Fatal(err)
	}
	for c, want := range map[string]string{"nvme0": "", "nvme1": "1", "nvme2": "1"} {
		for _, f := range []string{"delete_controller", "rescan_controller"} {
			b, _ := os.ReadFile(filepath.Join(h.sys, "class/nvme", c, f))
			if string(b) != want {
				t.Errorf("%s/%s = %q, want %q (only the subsystem's controllers)", c, f, b, want)
			}
		}
	}
	if dev, ok, err := h.Device(t.Context(), sub); dev != "/dev/nvme1n1" || !ok || err != nil {
		t.Errorf("Device = %q %v %v", dev, ok, err)
	}
	if _, ok, _ := h.Device(t.Context(), "nqn.2024-01.io.blk:vol:none"); ok {
		t.Error("Device of an unknown subsystem")
	}
}

// TestRunChecked: a failing tool's error names its command line, the
// exit and its last line of output; one that succeeds is no error.
func TestRunChecked(t *testing.T) {
	h := &kernelHost{log: slog.New(slog.DiscardHandler)}
	ctx := context.Background()
	if err := h.runChecked(ctx, "sh", "-c", "echo fine"); err != nil {
		t.Fatalf("success: %v", err)
	}
	err := h.runChecked(ctx, "sh", "-c", "echo first; echo 'bad superblock' >&2; exit 3")
	want := "sh -c echo first; echo 'bad superblock' >&2; exit 3: exit status 3: bad superblock"
	if err == nil || err.Error() != want {
		t.Fatalf("failure: %v, want %q", err, want)
	}
}
