package blkd

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// Config configures a Daemon. It round-trips through encoding/json (the
// --config file uses the same field names). Zero fields take the defaults
// of DefaultConfig only through WithDefaults.
type Config struct {
	// DataDir holds everything the node keeps: DataDir/meta (the raft
	// log, stable store and snapshots) and DataDir/volumes (the pebble
	// volume store). Default "./blk-data".
	DataDir string `json:"data_dir"`
	// NodeID is this node's raft server ID and its name in the registry;
	// stable across restarts. Default "node1".
	NodeID string `json:"node_id"`
	// RaftAddr is the raft TCP address, host:port. Default 127.0.0.1:7000.
	RaftAddr string `json:"raft_addr"`
	// NVMeAddr is the NVMe-oF RDMA port (also the discovery port),
	// host:port. Default 127.0.0.1:4420.
	NVMeAddr string `json:"nvme_addr"`
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
}

// Defaults.
const (
	DefaultDataDir  = "./blk-data"
	DefaultNodeID   = "node1"
	DefaultRaftAddr = "127.0.0.1:7000"
	DefaultNVMeAddr = "127.0.0.1:4420"
	DefaultAPIAddr  = "127.0.0.1:7070"
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
	def(&c.APIAddr, DefaultAPIAddr)
	if c.Bootstrap == nil {
		t := true
		c.Bootstrap = &t
	}
	return c
}

// Validate checks c after WithDefaults; its errors name the setting and
// say what would be accepted.
func (c Config) Validate() error {
	c = c.WithDefaults()
	for _, a := range []struct{ name, v string }{
		{"raft-addr", c.RaftAddr}, {"nvme-addr", c.NVMeAddr}, {"api-addr", c.APIAddr},
	} {
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			return fmt.Errorf("%w: --%s %q is not host:port (for example 127.0.0.1:7000): %v", ErrConfig, a.name, a.v, err)
		}
	}
	if c.Join != "" {
		if _, _, err := net.SplitHostPort(c.Join); err != nil {
			return fmt.Errorf("%w: --join %q is not the host:port of a member's API (for example 127.0.0.1:7070): %v", ErrConfig, c.Join, err)
		}
	}
	switch {
	case c.Cores < 0:
		return fmt.Errorf("%w: --cores %d: must be 0 (all CPUs) or more", ErrConfig, c.Cores)
	case len(c.NodeID) > 128:
		return fmt.Errorf("%w: --node-id is %d bytes long; at most 128", ErrConfig, len(c.NodeID))
	}
	return nil
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
// can be written there.
func prepareDataDir(dir string) error {
	for _, sub := range []string{"meta", "volumes"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return fmt.Errorf("data dir %s is not usable (set --data-dir to a writable directory): %w", dir, err)
		}
	}
	probe := filepath.Join(dir, ".blkd-write-probe")
	if err := os.WriteFile(probe, nil, 0o644); err != nil {
		return fmt.Errorf("data dir %s is not writable (set --data-dir to a writable directory): %w", dir, err)
	}
	return os.Remove(probe)
}
