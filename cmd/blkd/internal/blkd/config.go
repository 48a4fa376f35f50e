package blkd

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/nvme/auth"
	"github.com/blk-project/blk/store"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
	"github.com/blk-project/blk/transport/providers"
)

// Config configures a Daemon. It round-trips through encoding/json (the
// --config file uses the same field names). Zero fields take the defaults
// of DefaultConfig only through WithDefaults.
type Config struct {
	// DataDir holds everything the node keeps: DataDir/meta (the raft
	// log, stable store and snapshots) and DataDir/volumes (the pebble
	// volume store). Default "./blk-data".
	DataDir string `json:"data_dir"`
	// DataDevice, if set, is a block device (an absolute path; prefer a
	// stable name such as /dev/disk/by-id/...) that holds the volumes'
	// data instead of the file DataDir/volumes.area; the metadata stays
	// in DataDir/volumes. Opened O_DIRECT|O_EXCL: a device that is
	// mounted or in use is refused. Fixed when the store is created: a
	// data dir created with a file area refuses to start with a device,
	// and the reverse. Creating the store refuses a device that holds
	// anything (a filesystem, a partition table, LVM, another store)
	// unless DataDeviceWipe names it. Default: none (the file).
	DataDevice string `json:"data_device,omitempty"`
	// DataDeviceWipe confirms that creating the store may destroy what
	// DataDevice holds: it must repeat DataDevice's path exactly, so a
	// confirmation left in a config file cannot follow a changed
	// DataDevice to another disk. Used only when the store is created
	// (the first start with a new data dir); ignored after.
	DataDeviceWipe string `json:"data_device_wipe,omitempty"`
	// NodeID is this node's raft server ID and its name in the registry;
	// stable across restarts. Default "node1".
	NodeID string `json:"node_id"`
	// RaftAddr is the raft TCP address, host:port. Default 127.0.0.1:7000.
	RaftAddr string `json:"raft_addr"`
	// TCPAddr is the NVMe/TCP port (also a discovery port), host:port,
	// or "off". Default 127.0.0.1:4420: NVMe/TCP is what every host has
	// (the Linux kernel's nvme-tcp), so it takes the IANA port.
	TCPAddr string `json:"tcp_addr"`
	// NVMeAddr is the NVMe/RDMA port (also a discovery port), host:port,
	// or "off". Default 127.0.0.1:4421: the soft provider's iWARP runs
	// over TCP, so it cannot share 4420 with NVMe/TCP on one address.
	NVMeAddr string `json:"nvme_addr"`
	// DiscoveryAddr is an NVMe/TCP port that serves discovery only,
	// host:port, or "off" (the default). nvme discover and connect-all
	// look on port 8009 when given none: set it to HOST:8009 so that
	// `nvme discover -t tcp -a HOST` finds the node's volumes. Every
	// other port serves discovery too.
	DiscoveryAddr string `json:"discovery_addr,omitempty"`
	// AdvertiseAddr is the address hosts connect to when it is not the
	// ports' own (a node behind NAT, or listening on a wildcard address):
	// an IP address with an optional port ("203.0.113.7",
	// "203.0.113.7:4421"). Its address is advertised for both ports; its
	// port, if any, for the RDMA port only (the TCP port advertises its
	// own). The discovery log reports them and they are the node's NVMe
	// addresses in the registry, which attach answers. Required when a
	// port's host is a wildcard (0.0.0.0, ::, or empty). Default: none,
	// the ports' own addresses are advertised.
	AdvertiseAddr string `json:"advertise_addr,omitempty"`
	// APIAddr is the management HTTP API and /metrics, host:port.
	// Default 127.0.0.1:7070.
	APIAddr string `json:"api_addr"`
	// Bootstrap makes this node the single voter of a new cluster when its
	// data directory holds no raft state (ignored otherwise). Default on.
	Bootstrap *bool `json:"bootstrap,omitempty"`
	// Join is the management API address (host:port) of any member of an
	// existing cluster. The node then starts without bootstrapping and
	// asks the cluster to add it (POST /v1/cluster/join). Harmless on a
	// restart of a member: it re-sends its addresses.
	Join string `json:"join,omitempty"`
	// Cores is the RDMA port's per-core engine groups; 0 means the
	// adapter's cores (the machine's CPUs).
	Cores int `json:"cores"`
	// RDMAProvider is the transport provider of the NVMe/RDMA port:
	// "soft" (iWARP over TCP, pure Go; the default) or "verbs" (an RDMA
	// device through rdma-core; blkd built with -tags verbs).
	RDMAProvider string `json:"rdma_provider,omitempty"`
	// RDMADevice is the provider's device ("rxe0", "mlx5_0"; verbs only);
	// empty: the provider's choice.
	RDMADevice string `json:"rdma_device,omitempty"`
	// LogFormat is the format of the event log written to LogOutput:
	// "text" (slog's key=value lines) or "json" (one object per line).
	// Default "text".
	LogFormat string `json:"log_format"`
	// LogLevel is the lowest level of the event log: "debug", "info",
	// "warn" or "error". Default "info" (debug adds discovery controllers
	// and every connection).
	LogLevel string `json:"log_level"`
	// LogOutput receives the event log. Nil: standard error.
	LogOutput io.Writer `json:"-"`
	// DetachAfter is how long an attachment may have no live controller
	// before the leader removes it (the host disconnected for good), a Go
	// duration in the config file ("5m"). Zero: DefaultDetachAfter;
	// negative: never.
	DetachAfter Duration `json:"detach_after,omitempty"`
	// PollSpin is how long an NVMe/TCP poll group keeps looking for work
	// after its last before it sleeps (tcp.Config.PollSpin; a Go
	// duration, "50us"): it buys latency with CPU. Zero:
	// tcp.DefaultPollSpin; negative: sleep at once — for nodes that share
	// their cores with other busy processes (several blkd on one
	// machine, or beside the workload), where a spinning group takes the
	// CPU the work it waits for needs (docs/blkd.md).
	PollSpin Duration `json:"poll_spin,omitempty"`
	// TCPMaxTransfer is the largest data transfer of one NVMe/TCP
	// command, in bytes: Identify MDTS of the NVMe/TCP port
	// (tcp.Config.MaxTransfer). A power of two from 4 KiB to 1 MiB (the
	// store's and the NVMe/RDMA port's largest). Zero:
	// DefaultTCPMaxTransfer, 128 KiB (MDTS 5, as SPDK's NVMe/TCP
	// transport): each poll group holds tcp.DefaultLargeBuffers (64)
	// buffers of this size for the large commands in flight, 8 MiB at
	// 128 KiB, 64 MiB at 1 MiB; a Linux host splits larger I/O.
	TCPMaxTransfer uint64 `json:"tcp_max_transfer,omitempty"`
	// SyncInterval bounds how long an acknowledged plain write may stay
	// volatile: the store's background syncer makes it durable within
	// this time of the first write since its last round (a Go duration,
	// "10ms"; zero: store.DefaultSyncInterval, at most
	// store.MaxSyncInterval). Negative: never; only a host's Flush or a
	// FUA write makes writes durable, which is all NVMe promises with a
	// volatile write cache (docs/volume.md, "Durability").
	SyncInterval Duration `json:"sync_interval,omitempty"`
	// RebuildRate bounds, in bytes per second, what the rebuilds of
	// replicas this node runs as primary, the snapshot exports it serves
	// and the flattens it runs copy, together (docs/replication.md §5,
	// throttle.go); 0: unlimited (the default).
	RebuildRate int64 `json:"rebuild_rate,omitempty"`
	// FailbackAfter is how long the replica placement chose as a
	// volume's primary (its first) must have been in sync, after a
	// failover moved the primary away, before the leader hands the
	// volume back to it (a planned handover: the hosts pause about a
	// second). It keeps a node that fails now and then from taking its
	// volumes back and forth. A Go duration; zero: DefaultFailbackAfter;
	// negative: never (an operator moves primaries).
	FailbackAfter Duration `json:"failback_after,omitempty"`
	// ReplaceAfter is how long a node must have been down (as the
	// leader sees it: counted from the first round this leader saw it
	// down, so a change of leader starts the count again) before the
	// leader replaces, by itself, the secondary replicas it holds with
	// new ones where placement finds room (a full copy each). Longer than
	// a reboot: a node that returns in time rebuilds only what it missed.
	// A Go duration; zero: DefaultReplaceAfter; negative: never (an
	// operator runs blkctl volume replace-replica).
	ReplaceAfter Duration `json:"replace_after,omitempty"`
	// DHCHAPDHGroups are the DH-HMAC-CHAP groups the target accepts from
	// hosts that must authenticate, in its order of preference ("ffdhe2048",
	// ..., "null"). Empty: every group, any before none. A Linux host
	// kernel without CONFIG_CRYPTO_DH_RFC7919_GROUPS needs "null" first.
	DHCHAPDHGroups []string `json:"dhchap_dhgroups,omitempty"`
	// Zone is this node's failure domain (a rack, a room, a host of VMs),
	// registered with the node; placement never puts two replicas of a
	// volume in one zone. A name (letters, digits, '.', '_', '-'); empty:
	// the node is a zone of its own.
	Zone string `json:"zone,omitempty"`
	// Overcommit is how many bytes of (thin) volumes this node may be
	// promised per byte of its store's filesystem. Default 1: never more
	// than the disk holds. Above 1, writes may one day meet a full disk
	// (they then fail with ENOSPC; reads go on).
	Overcommit float64 `json:"overcommit,omitempty"`
	// TLSDir, if set, holds the cluster CA's certificate (ca.crt) and
	// this node's certificate and key (NODEID.crt, NODEID.key; blkctl cert
	// issue NODEID --role node): raft then runs over mutual TLS and
	// accepts only peers with node certificates of that CA.
	TLSDir string `json:"tls_dir,omitempty"`
	// Insecure allows an API or raft address beyond loopback without
	// TLSDir: anyone who reaches it can then manage the cluster.
	Insecure bool `json:"insecure,omitempty"`
	// SnapshotHold is for tests, in the config file only: a replicated
	// volume's primary, inside a snapshot's barrier, at SnapshotHoldAt,
	// logs "snapshot barrier held for a test" and keeps the writes held
	// this long (at most the snapshot's timeout, 10 s), so that a test
	// can kill it there deterministically (TestSnapshotFailover).
	// Default 0: no hold.
	SnapshotHold Duration `json:"snapshot_hold,omitempty"`
	// SnapshotHoldAt is where SnapshotHold holds: HoldCopies (the
	// default, "") once every copy took the snapshot, before the
	// barrier ends; HoldLocal once the primary's own copy took it,
	// before the replicas are asked.
	SnapshotHoldAt string `json:"snapshot_hold_at,omitempty"`
}

// SnapshotHoldAt's values.
const (
	HoldCopies = "copies"
	HoldLocal  = "local"
)

// DefaultSyncInterval is Config.SyncInterval's default: the store's
// (10 ms).
const DefaultSyncInterval = store.DefaultSyncInterval

// Duration is a time.Duration that reads "5m" or "90s" from JSON.
type Duration time.Duration

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration like \"5m\": %v", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("a duration like \"5m\": %v", err)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Defaults.
const (
	DefaultDataDir  = "./blk-data"
	DefaultNodeID   = "node1"
	DefaultRaftAddr = "127.0.0.1:7000"
	DefaultTCPAddr  = "127.0.0.1:4420"
	DefaultNVMeAddr = "127.0.0.1:4421"
	// PortOff as TCPAddr, NVMeAddr or DiscoveryAddr turns that port off.
	PortOff          = "off"
	DefaultAPIAddr   = "127.0.0.1:7070"
	DefaultLogFormat = "text"
	DefaultLogLevel  = "info"
	// DefaultPollSpin is PollSpin's default, the NVMe/TCP port's.
	DefaultPollSpin = tcp.DefaultPollSpin
	// DefaultTCPMaxTransfer is TCPMaxTransfer's default, the NVMe/TCP
	// port's (128 KiB); MaxTCPMaxTransfer its largest, the NVMe/RDMA
	// port's and the store's (1 MiB).
	DefaultTCPMaxTransfer = tcp.DefaultMaxTransfer
	MaxTCPMaxTransfer     = 1 << 20
	// DefaultDetachAfter outlasts a host's reconnect attempts across a
	// blkd restart (the Linux host retries for 10 minutes by default,
	// ctrl_loss_tmo 600 s) without keeping dead attachments for long.
	DefaultDetachAfter = 15 * time.Minute
	// DefaultFailbackAfter: five minutes in sync (docs/replication.md §4).
	DefaultFailbackAfter = 5 * time.Minute
	// DefaultReplaceAfter: ten minutes down, as Ceph's
	// mon_osd_down_out_interval and Longhorn's
	// replica-replenishment-wait-interval (docs/replication.md §6).
	DefaultReplaceAfter = 10 * time.Minute
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("blkd: bad configuration")

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.DataDir, DefaultDataDir)
	def(&c.NodeID, DefaultNodeID)
	def(&c.RaftAddr, DefaultRaftAddr)
	def(&c.NVMeAddr, DefaultNVMeAddr)
	def(&c.TCPAddr, DefaultTCPAddr)
	def(&c.DiscoveryAddr, PortOff)
	def(&c.APIAddr, DefaultAPIAddr)
	def(&c.LogFormat, DefaultLogFormat)
	def(&c.LogLevel, DefaultLogLevel)
	if c.Bootstrap == nil {
		t := true
		c.Bootstrap = &t
	}
	if c.FailbackAfter == 0 {
		c.FailbackAfter = Duration(DefaultFailbackAfter)
	}
	if c.ReplaceAfter == 0 {
		c.ReplaceAfter = Duration(DefaultReplaceAfter)
	}
	if c.DetachAfter == 0 {
		c.DetachAfter = Duration(DefaultDetachAfter)
	}
	if c.Overcommit == 0 {
		c.Overcommit = 1
	}
	if c.SyncInterval == 0 {
		c.SyncInterval = Duration(store.DefaultSyncInterval)
	}
	return c
}

// Validate checks c after WithDefaults; its errors name the setting and
// say what would be accepted.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if _, err := c.dhGroups(); err != nil {
		return err
	}
	if !c.TCPOn() && !c.RDMAOn() {
		return fmt.Errorf("%w: --tcp-addr and --nvme-addr are both off: hosts could reach no volume; serve NVMe/TCP (--tcp-addr 127.0.0.1:4420) or NVMe/RDMA", ErrConfig)
	}
	for _, a := range []struct {
		name, v string
		on      bool
	}{
		{"raft-addr", c.RaftAddr, true}, {"tcp-addr", c.TCPAddr, c.TCPOn()}, {"nvme-addr", c.NVMeAddr, c.RDMAOn()}, {"api-addr", c.APIAddr, true},
		{"discovery-addr", c.DiscoveryAddr, c.DiscoveryOn()},
	} {
		if !a.on {
			continue
		}
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			return fmt.Errorf("%w: --%s %q is not host:port (for example 127.0.0.1:7000): %v", ErrConfig, a.name, a.v, err)
		}
	}
	if c.TCPOn() && c.RDMAOn() && c.TCPAddr == c.NVMeAddr {
		return fmt.Errorf("%w: --tcp-addr and --nvme-addr are both %s: the soft RDMA provider runs over TCP, so the two ports need different addresses or port numbers", ErrConfig, c.TCPAddr)
	}
	if c.DiscoveryOn() {
		for _, a := range []struct {
			name, v string
			on      bool
		}{{"tcp-addr", c.TCPAddr, c.TCPOn()}, {"nvme-addr", c.NVMeAddr, c.RDMAOn()}} {
			if a.on && a.v == c.DiscoveryAddr {
				return fmt.Errorf("%w: --discovery-addr and --%s are both %s: the discovery port needs its own address or port number (nvme discover's default is 8009)", ErrConfig, a.name, a.v)
			}
		}
	}
	if c.AdvertiseAddr != "" {
		if _, _, err := target.ParseAdvertiseAddr(c.AdvertiseAddr); err != nil {
			return fmt.Errorf("%w: --advertise-addr: %v", ErrConfig, err)
		}
	} else {
		for _, a := range []struct {
			name, v string
			on      bool
		}{{"tcp-addr", c.TCPAddr, c.TCPOn()}, {"nvme-addr", c.NVMeAddr, c.RDMAOn()}, {"discovery-addr", c.DiscoveryAddr, c.DiscoveryOn()}} {
			if a.on && target.IsWildcardHost(a.v) {
				return fmt.Errorf("%w: --%s %q listens on every local address, which is no address a host can be told to connect to: "+
					"set --advertise-addr (BLK_ADVERTISE_ADDR, \"advertise_addr\" in the config file) to the address hosts reach this node by, for example 10.0.0.5, "+
					"or listen on that address", ErrConfig, a.name, a.v)
			}
		}
	}
	if err := c.validateDevice(); err != nil {
		return err
	}
	if c.RebuildRate < 0 {
		return fmt.Errorf("%w: --rebuild-rate %d is negative (0: unlimited)", ErrConfig, c.RebuildRate)
	}
	if c.SnapshotHoldAt != "" && c.SnapshotHoldAt != HoldCopies && c.SnapshotHoldAt != HoldLocal {
		return fmt.Errorf("%w: snapshot_hold_at %q: %q (the default) or %q", ErrConfig, c.SnapshotHoldAt, HoldCopies, HoldLocal)
	}
	if c.SnapshotHold < 0 || time.Duration(c.SnapshotHold) > snapshotTimeout {
		return fmt.Errorf("%w: snapshot_hold %v: between 0 (none) and the snapshot's timeout, %v", ErrConfig, time.Duration(c.SnapshotHold), snapshotTimeout)
	}
	if time.Duration(c.SyncInterval) > store.MaxSyncInterval {
		return fmt.Errorf("%w: --sync-interval %v is above %v (a negative value turns the background sync off)", ErrConfig, time.Duration(c.SyncInterval), store.MaxSyncInterval)
	}
	if c.Join != "" {
		if _, _, err := net.SplitHostPort(c.Join); err != nil {
			return fmt.Errorf("%w: --join %q is not the host:port of a member's API (for example 127.0.0.1:7070): %v", ErrConfig, c.Join, err)
		}
	}
	if c.TLSDir == "" && !c.Insecure {
		for _, a := range []struct{ name, v string }{{"api-addr", c.APIAddr}, {"raft-addr", c.RaftAddr}} {
			if !isLoopback(a.v) {
				return fmt.Errorf("%w: --%s %s is reachable beyond this machine, and without --tls-dir anyone who reaches it could manage the cluster (or vote in it): "+
					"set --tls-dir to the node's certificates (blkctl cert; docs/security.md), or --insecure to accept that", ErrConfig, a.name, a.v)
			}
		}
	}
	if c.Zone != "" {
		if err := api.CheckName("--zone", c.Zone); err != nil {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
	}
	if c.Overcommit < 0.1 || c.Overcommit > 1000 {
		return fmt.Errorf("%w: --overcommit %v: use a ratio between 0.1 and 1000 (1: promise no more than the disk holds)", ErrConfig, c.Overcommit)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("%w: --log-format %q: use text or json", ErrConfig, c.LogFormat)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return fmt.Errorf("%w: --log-level %q: use debug, info, warn or error", ErrConfig, c.LogLevel)
	}
	switch {
	case providers.Check(c.RDMAProvider) != nil:
		return fmt.Errorf("%w: --rdma-provider: %v", ErrConfig, providers.Check(c.RDMAProvider))
	case c.TCPMaxTransfer != 0 && (c.TCPMaxTransfer < 4096 || c.TCPMaxTransfer > MaxTCPMaxTransfer || c.TCPMaxTransfer&(c.TCPMaxTransfer-1) != 0):
		return fmt.Errorf("%w: --tcp-max-transfer %d bytes: the largest transfer of one NVMe/TCP command must be a power of two from 4KiB to 1MiB (default 128KiB)", ErrConfig, c.TCPMaxTransfer)
	case time.Duration(c.PollSpin) > tcp.MaxPollSpin:
		return fmt.Errorf("%w: --poll-spin %v: at most %v", ErrConfig, time.Duration(c.PollSpin), tcp.MaxPollSpin)
	case c.Cores < 0:
		return fmt.Errorf("%w: --cores %d: must be 0 (all CPUs) or more", ErrConfig, c.Cores)
	case len(c.NodeID) > 128:
		return fmt.Errorf("%w: --node-id is %d bytes long; at most 128", ErrConfig, len(c.NodeID))
	}
	return nil
}

// validateDevice checks --data-device and --data-device-wipe.
func (c Config) validateDevice() error {
	switch {
	case c.DataDevice != "" && !filepath.IsAbs(c.DataDevice):
		return fmt.Errorf("%w: --data-device %q is not an absolute path: name the block device, for example /dev/disk/by-id/nvme-...", ErrConfig, c.DataDevice)
	case c.DataDeviceWipe != "" && c.DataDevice == "":
		return fmt.Errorf("%w: --data-device-wipe %q without --data-device: there is no device to wipe", ErrConfig, c.DataDeviceWipe)
	case c.DataDeviceWipe != "" && c.DataDeviceWipe != c.DataDevice:
		return fmt.Errorf("%w: --data-device-wipe %q does not repeat --data-device %q: the confirmation must name the device whose contents are destroyed", ErrConfig, c.DataDeviceWipe, c.DataDevice)
	}
	return nil
}

// TCPOn and RDMAOn say whether the NVMe/TCP and NVMe/RDMA ports are
// served (their address is not "off").
func (c Config) TCPOn() bool  { return c.TCPAddr != PortOff }
func (c Config) RDMAOn() bool { return c.NVMeAddr != PortOff }

// DiscoveryOn says whether the discovery-only NVMe/TCP port is served.
func (c Config) DiscoveryOn() bool { return c.DiscoveryAddr != PortOff }

// discoveryAdvertise is the tcp.Config.AdvertiseAddr of the discovery
// port, tcpAdvertise the NVMe/TCP port's: AdvertiseAddr's address with
// the port's own port number, or "".
func (c Config) discoveryAdvertise() string { return c.advertiseOn(c.DiscoveryAddr) }
func (c Config) tcpAdvertise() string       { return c.advertiseOn(c.TCPAddr) }

// advertiseOn is AdvertiseAddr's address with listen's port, or "".
func (c Config) advertiseOn(listen string) string {
	if c.AdvertiseAddr == "" {
		return ""
	}
	host, _, _ := target.ParseAdvertiseAddr(c.AdvertiseAddr)
	_, port, _ := net.SplitHostPort(listen)
	return net.JoinHostPort(host, port)
}

// advertisedTCP is advertisedNVMe for the NVMe/TCP port ("" when off).
func (c Config) advertisedTCP() string {
	if !c.TCPOn() {
		return ""
	}
	if a := c.tcpAdvertise(); a != "" {
		return a
	}
	return c.TCPAddr
}

// replicaAddr is where other nodes reach the NVMe/TCP port for replica
// connections (meta.RegisterNode.ReplicaAddr): the listen address, which
// nodes of one network reach even when hosts are told another
// (--advertise-addr behind NAT); "" when it is the advertised one, or the
// listen address is a wildcard (the advertised one is then all there
// is), or NVMe/TCP is off.
func (c Config) replicaAddr() string {
	if !c.TCPOn() {
		return ""
	}
	host, _, err := net.SplitHostPort(c.TCPAddr)
	if err != nil || host == "" {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return ""
	}
	if c.TCPAddr == c.advertisedTCP() {
		return ""
	}
	return c.TCPAddr
}

// advertisedNVMe is the NVMe/RDMA address hosts are told to connect to,
// as far as the configuration says: AdvertiseAddr (with NVMeAddr's port
// if it gives none), else NVMeAddr; "" when the port is off. Once the
// port listens, its AdvertisedAddr is the exact answer (port 0
// resolved). Requires a valid c.
func (c Config) advertisedNVMe() string {
	if !c.RDMAOn() {
		return ""
	}
	if c.AdvertiseAddr == "" {
		return c.NVMeAddr
	}
	host, port, _ := target.ParseAdvertiseAddr(c.AdvertiseAddr)
	if port == "" {
		_, port, _ = net.SplitHostPort(c.NVMeAddr)
	}
	return net.JoinHostPort(host, port)
}

// parseLevel reads a log level by name (any case).
func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return l, l.UnmarshalText([]byte(s))
	}
	return l, fmt.Errorf("log level %q", s)
}

// LoadConfigFile reads a JSON Config. Unknown fields are refused, so a
// misspelt setting is not silently ignored.
func LoadConfigFile(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: config file: %v", ErrConfig, err)
	}
	defer f.Close()
	d := json.NewDecoder(f)
	d.DisallowUnknownFields()
	var c Config
	if err := d.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("%w: config file %s: %v", ErrConfig, path, err)
	}
	return c, nil
}

// prepareDataDir creates dir/meta and dir/volumes and checks that files
// can be written there. Both are the daemon's alone (0700, also made so
// if they exist): the registry holds hosts' DH-HMAC-CHAP secrets, the
// store every volume's data.
func prepareDataDir(dir string) error {
	for _, sub := range []string{"meta", "volumes"} {
		p := filepath.Join(dir, sub)
		if err := os.MkdirAll(p, 0o700); err != nil {
			return fmt.Errorf("data dir %s is not usable (set --data-dir to a writable directory): %w", dir, err)
		}
		if err := os.Chmod(p, 0o700); err != nil {
			return fmt.Errorf("data dir %s: make %s private (mode 0700): %w", dir, sub, err)
		}
	}
	probe := filepath.Join(dir, ".blkd-write-probe")
	if err := os.WriteFile(probe, nil, 0o644); err != nil {
		return fmt.Errorf("data dir %s is not writable (set --data-dir to a writable directory): %w", dir, err)
	}
	return os.Remove(probe)
}

// dhGroups parses DHCHAPDHGroups (nil: the target's default).
func (c Config) dhGroups() ([]auth.DHGroup, error) {
	var gs []auth.DHGroup
	for _, s := range c.DHCHAPDHGroups {
		g, err := auth.ParseDHGroup(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("dhchap-dhgroups: %v", err)
		}
		gs = append(gs, g)
	}
	return gs, nil
}
