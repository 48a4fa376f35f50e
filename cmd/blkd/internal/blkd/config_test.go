package blkd

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestConfig(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.DataDir != DefaultDataDir || c.NodeID != "node1" || c.RaftAddr != "127.0.0.1:7000" ||
		c.NVMeAddr != "127.0.0.1:4421" || c.TCPAddr != "127.0.0.1:4420" || c.APIAddr != "127.0.0.1:7070" || !*c.Bootstrap {
		t.Fatalf("defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// The dump loads back unchanged.
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := LoadConfigFile(path)
	if err != nil || !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip: %+v, %v; want %+v", back, err, c)
	}
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Cores: -2}, "--cores -2"},
		{Config{RebuildRate: -1}, "--rebuild-rate -1 is negative"},
		{Config{SnapshotHold: Duration(-time.Second)}, "snapshot_hold -1s: between 0 (none) and the snapshot's timeout, 10s"},
		{Config{SnapshotHold: Duration(time.Minute)}, "snapshot_hold 1m0s: between 0"},
		{Config{SnapshotHoldAt: "later"}, `snapshot_hold_at "later": "copies" (the default) or "local"`},
		{Config{PollSpin: Duration(20 * time.Millisecond)}, "--poll-spin 20ms: at most 10ms"},
		{Config{TCPMaxTransfer: 2 << 20}, "--tcp-max-transfer 2097152 bytes: the largest transfer of one NVMe/TCP command must be a power of two from 4KiB to 1MiB"},
		{Config{TCPMaxTransfer: 96 << 10}, "--tcp-max-transfer 98304 bytes"},
		{Config{TCPMaxTransfer: 2048}, "--tcp-max-transfer 2048 bytes"},
		{Config{APIAddr: "nohost"}, `--api-addr "nohost"`},
		{Config{Join: "nohost"}, `--join "nohost"`},
		{Config{NVMeAddr: "0.0.0.0:4420"}, `--nvme-addr "0.0.0.0:4420" listens on every local address`},
		{Config{NVMeAddr: "[::]:4420"}, `set --advertise-addr (BLK_ADVERTISE_ADDR, "advertise_addr" in the config file)`},
		{Config{NVMeAddr: ":4420"}, `--advertise-addr`},
		{Config{AdvertiseAddr: "storage1.example"}, `--advertise-addr: advertised address "storage1.example" is not an IP address`},
		{Config{NVMeAddr: "0.0.0.0:4420", AdvertiseAddr: "0.0.0.0"}, `"any" address`},
		{Config{TCPAddr: "0.0.0.0:4420"}, `--tcp-addr "0.0.0.0:4420" listens on every local address`},
		{Config{TCPAddr: "off", NVMeAddr: "off"}, `--tcp-addr and --nvme-addr are both off`},
		{Config{TCPAddr: "127.0.0.1:4421"}, `--tcp-addr and --nvme-addr are both 127.0.0.1:4421`},
		{Config{TCPAddr: "4420"}, `--tcp-addr "4420" is not host:port`},
		{Config{DiscoveryAddr: "8009"}, `--discovery-addr "8009" is not host:port`},
		{Config{DiscoveryAddr: "127.0.0.1:4420"}, `--discovery-addr and --tcp-addr are both 127.0.0.1:4420`},
		{Config{DiscoveryAddr: "0.0.0.0:8009"}, `--discovery-addr "0.0.0.0:8009" listens on every local address`},
		{Config{LogFormat: "xml"}, `--log-format "xml": use text or json`},
		{Config{LogLevel: "loud"}, `--log-level "loud": use debug, info, warn or error`},
		{Config{DataDevice: "sdb"}, `--data-device "sdb" is not an absolute path`},
		{Config{DataDeviceWipe: "/dev/sdb"}, `--data-device-wipe "/dev/sdb" without --data-device`},
		{Config{DataDevice: "/dev/sdb", DataDeviceWipe: "/dev/sdc"}, `--data-device-wipe "/dev/sdc" does not repeat --data-device "/dev/sdb"`},
	} {
		err := tc.c.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.c, err, tc.want)
		}
	}
}

// TestAdvertisedNVMe: the address registered before the port is up.
func TestAdvertisedNVMe(t *testing.T) {
	for _, tc := range []struct{ nvme, tcp, adv, want, wantTCP string }{
		{"127.0.0.1:4421", "", "", "127.0.0.1:4421", "127.0.0.1:4420"},
		{"0.0.0.0:4421", "0.0.0.0:4420", "10.0.0.5", "10.0.0.5:4421", "10.0.0.5:4420"},
		{"0.0.0.0:4421", "0.0.0.0:4420", "203.0.113.7:14421", "203.0.113.7:14421", "203.0.113.7:4420"},
		{"[::]:4421", "[::]:4420", "fd00::5", "[fd00::5]:4421", "[fd00::5]:4420"},
		{"off", "", "", "", "127.0.0.1:4420"},
		{"127.0.0.1:4421", "off", "", "127.0.0.1:4421", ""},
	} {
		c := Config{NVMeAddr: tc.nvme, TCPAddr: tc.tcp, AdvertiseAddr: tc.adv}
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
			continue
		}
		if got := c.WithDefaults().advertisedNVMe(); got != tc.want {
			t.Errorf("%+v: advertised %q, want %q", c, got, tc.want)
		}
		if got := c.WithDefaults().advertisedTCP(); got != tc.wantTCP {
			t.Errorf("%+v: advertised TCP %q, want %q", c, got, tc.wantTCP)
		}
	}
	// The config file field.
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, []byte(`{"nvme_addr": "0.0.0.0:4421", "tcp_addr": "0.0.0.0:4420", "advertise_addr": "10.0.0.5"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfigFile(path)
	if err != nil || c.AdvertiseAddr != "10.0.0.5" || c.Validate() != nil {
		t.Fatalf("advertise_addr from a file: %+v, %v", c, err)
	}
}

// The registry (host secrets) and the store (volume data) are the
// daemon's alone, even in a data dir made before with looser modes.
func TestDataDirPrivate(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "meta"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := prepareDataDir(dir); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"meta", "volumes"} {
		fi, err := os.Stat(filepath.Join(dir, sub))
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v, %v", sub, fi.Mode(), err)
		}
	}
}
