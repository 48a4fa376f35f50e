// Command blkd is the blk storage-node daemon. With no flags it runs a
// single-node cluster on loopback: the meta registry (raft on
// 127.0.0.1:7000), a volume store in ./blk-data, NVMe-oF target ports for
// NVMe/TCP (127.0.0.1:4420) and NVMe/RDMA (127.0.0.1:4421, soft iWARP),
// and the management HTTP API
// with Prometheus /metrics on 127.0.0.1:7070. It wires cmd/blkd/internal/blkd and
// does nothing else.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/cmd/blkd/internal/blkd"
	"github.com/blk-project/blk/internal/sdnotify"
	"github.com/blk-project/blk/internal/version"
	"github.com/urfave/cli/v2"
)

func main() {
	if err := newApp(os.Stdout, os.Stderr).Run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "blkd: %v\n", err)
		os.Exit(1)
	}
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "blkd",
		Usage:     "the blk storage-node daemon",
		Version:   version.String(),
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", EnvVars: []string{"BLK_CONFIG"}, Usage: "JSON config file (fields data_dir, data_device, data_device_wipe, node_id, raft_addr, tcp_addr, nvme_addr, discovery_addr, advertise_addr, api_addr, bootstrap, join, cores, rdma_provider, rdma_device, log_format, log_level, detach_after, replace_after, sync_interval, tcp_max_transfer, overcommit, zone, tls_dir, insecure); flags and BLK_* variables override it"},
			&cli.StringFlag{Name: "data-dir", EnvVars: []string{"BLK_DATA_DIR"}, Value: blkd.DefaultDataDir, Usage: "directory for the registry (meta/) and the volumes (volumes/)"},
			&cli.StringFlag{Name: "data-device", EnvVars: []string{"BLK_DATA_DEVICE"}, Usage: "a block device (absolute path, e.g. /dev/disk/by-id/...) for the volumes' data instead of the file <data-dir>/volumes.area; opened O_DIRECT and exclusively (refused while mounted or in use); fixed when the data dir's store is created"},
			&cli.StringFlag{Name: "data-device-wipe", EnvVars: []string{"BLK_DATA_DEVICE_WIPE"}, Usage: "repeat --data-device's path to let the first start destroy what the device holds (a filesystem, partitions, LVM, another store); without it a device that is not blank is refused"},
			&cli.StringFlag{Name: "node-id", EnvVars: []string{"BLK_NODE_ID"}, Value: blkd.DefaultNodeID, Usage: "this node's ID in the cluster, stable across restarts"},
			&cli.StringFlag{Name: "raft-addr", EnvVars: []string{"BLK_RAFT_ADDR"}, Value: blkd.DefaultRaftAddr, Usage: "registry raft address, host:port"},
			&cli.StringFlag{Name: "tcp-addr", EnvVars: []string{"BLK_TCP_ADDR"}, Value: blkd.DefaultTCPAddr, Usage: "NVMe/TCP port (and discovery), host:port, or off"},
			&cli.StringFlag{Name: "nvme-addr", EnvVars: []string{"BLK_NVME_ADDR"}, Value: blkd.DefaultNVMeAddr, Usage: "NVMe/RDMA port (and discovery), host:port, or off"},
			&cli.StringFlag{Name: "discovery-addr", EnvVars: []string{"BLK_DISCOVERY_ADDR"}, Value: blkd.PortOff, Usage: "an NVMe/TCP port for discovery only, host:port (8009 is where nvme discover looks by default), or off"},
			&cli.StringFlag{Name: "advertise-addr", EnvVars: []string{"BLK_ADVERTISE_ADDR"}, Usage: "address hosts connect to, IP[:port], when it is not the ports' own (NAT, or a wildcard --tcp-addr/--nvme-addr such as 0.0.0.0:4420, which requires it); the address serves both ports, the port only --nvme-addr's; reported by discovery and attach"},
			&cli.StringFlag{Name: "api-addr", EnvVars: []string{"BLK_API_ADDR"}, Value: blkd.DefaultAPIAddr, Usage: "management HTTP API and /metrics, host:port"},
			&cli.BoolFlag{Name: "bootstrap", EnvVars: []string{"BLK_BOOTSTRAP"}, Value: true, Usage: "start a new single-node cluster if the data dir has no registry state"},
			&cli.StringFlag{Name: "join", EnvVars: []string{"BLK_JOIN"}, Usage: "API address (host:port) of any cluster member: start without bootstrapping and ask the cluster to add this node"},
			&cli.IntFlag{Name: "cores", EnvVars: []string{"BLK_CORES"}, Usage: "RDMA engine cores (0: all CPUs)"},
			&cli.StringFlag{Name: "rdma-provider", EnvVars: []string{"BLK_RDMA_PROVIDER"}, Usage: "transport provider of the NVMe/RDMA port: soft (iWARP over TCP, the default; poll-group CQs on Linux), soft-goroutines (the same with goroutines per connection) or verbs (an RDMA device through rdma-core; needs a blkd built with -tags verbs)"},
			&cli.StringFlag{Name: "rdma-device", EnvVars: []string{"BLK_RDMA_DEVICE"}, Usage: "RDMA device of the verbs provider, e.g. rxe0 or mlx5_0 (default: the first)"},
			&cli.StringFlag{Name: "log-format", EnvVars: []string{"BLK_LOG_FORMAT"}, Value: blkd.DefaultLogFormat, Usage: "event log on stderr (controllers, refused connects, connections): text or json"},
			&cli.StringFlag{Name: "log-level", EnvVars: []string{"BLK_LOG_LEVEL"}, Value: blkd.DefaultLogLevel, Usage: "lowest event log level: debug, info, warn or error"},
			&cli.StringFlag{Name: "tls-dir", EnvVars: []string{"BLK_TLS_DIR"}, Usage: "directory with ca.crt and NODEID.crt/.key (blkctl cert): raft over mutual TLS with node certificates of that CA"},
			&cli.BoolFlag{Name: "insecure", EnvVars: []string{"BLK_INSECURE"}, Usage: "allow an API or raft address beyond loopback without --tls-dir (anyone who reaches it can manage the cluster)"},
			&cli.StringFlag{Name: "zone", EnvVars: []string{"BLK_ZONE"}, Usage: "this node's failure domain (a rack, a room), registered with it: placement never puts two replicas of a volume in one zone (default: none, the node is a zone of its own)"},
			&cli.Float64Flag{Name: "overcommit", EnvVars: []string{"BLK_OVERCOMMIT"}, Value: 1, Usage: "bytes of thin volumes this node may promise per byte of its disk (1: no more than the disk holds)"},
			&cli.StringSliceFlag{Name: "dhchap-dhgroups", EnvVars: []string{"BLK_DHCHAP_DHGROUPS"}, Usage: "DH-HMAC-CHAP groups accepted from authenticating hosts, preferred first (ffdhe2048,...,ffdhe8192,null; default all, any group before none)"},
			&cli.Int64Flag{Name: "rebuild-rate", EnvVars: []string{"BLK_REBUILD_RATE"}, Usage: "bytes per second the rebuilds of replicas this node is primary of, its exports and its flattens may copy, together (0: unlimited)"},
			&cli.DurationFlag{Name: "sync-interval", EnvVars: []string{"BLK_SYNC_INTERVAL"}, Value: blkd.DefaultSyncInterval, Usage: "make acknowledged writes durable within this time even without a host's Flush (at most 1s; negative: only Flush and FUA do, as NVMe allows)"},
			&cli.DurationFlag{Name: "poll-spin", EnvVars: []string{"BLK_POLL_SPIN"}, Value: blkd.DefaultPollSpin, Usage: "how long an NVMe/TCP poll group keeps polling after its last work before it sleeps: lower latency for CPU; 0: sleep at once (nodes sharing their cores with other busy processes)"},
			&cli.StringFlag{Name: "tcp-max-transfer", EnvVars: []string{"BLK_TCP_MAX_TRANSFER"}, Value: "128KiB", Usage: "largest transfer of one NVMe/TCP command (MDTS), a power of two from 4KiB to 1MiB; each NVMe/TCP poll group keeps 64 buffers of this size"},
			&cli.DurationFlag{Name: "failback-after", EnvVars: []string{"BLK_FAILBACK_AFTER"}, Value: blkd.DefaultFailbackAfter, Usage: "after a failover, hand a volume back to the primary placement chose once its replica has been in sync this long (negative: never)"},
			&cli.DurationFlag{Name: "replace-after", EnvVars: []string{"BLK_REPLACE_AFTER"}, Value: blkd.DefaultReplaceAfter, Usage: "replace by itself (a full copy elsewhere) a secondary replica whose node has been down this long, when placement finds a node (negative or 0: never)"},
			&cli.BoolFlag{Name: "man", Usage: "print this manual page (roff, generated from the flags) and exit: blkd --man > /usr/share/man/man8/blkd.8"},
			&cli.DurationFlag{Name: "detach-after", EnvVars: []string{"BLK_DETACH_AFTER"}, Value: blkd.DefaultDetachAfter, Usage: "remove an attachment whose host has had no live controller this long (negative: never)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected argument %q: blkd takes only flags (see --help)", c.Args().First())
			}
			if c.Bool("man") {
				page, err := c.App.ToMan()
				if err != nil {
					return fmt.Errorf("man page: %w", err)
				}
				_, err = fmt.Fprint(c.App.Writer, page)
				return err
			}
			cfg, err := configFrom(c)
			if err != nil {
				return err
			}
			return run(c.Context, cfg, func() (blkd.Config, error) { return configFrom(c) })
		},
	}
}

// configFrom merges the config file (if any) and the flags: a flag or
// BLK_* variable that is set wins over the file, the file over defaults.
func configFrom(c *cli.Context) (blkd.Config, error) {
	var cfg blkd.Config
	if path := c.String("config"); path != "" {
		var err error
		if cfg, err = blkd.LoadConfigFile(path); err != nil {
			return cfg, err
		}
	}
	str := func(dst *string, name string) {
		if c.IsSet(name) || *dst == "" {
			*dst = c.String(name)
		}
	}
	str(&cfg.DataDir, "data-dir")
	if c.IsSet("data-device") {
		cfg.DataDevice = c.String("data-device")
	}
	if c.IsSet("data-device-wipe") {
		cfg.DataDeviceWipe = c.String("data-device-wipe")
	}
	str(&cfg.NodeID, "node-id")
	str(&cfg.RaftAddr, "raft-addr")
	str(&cfg.NVMeAddr, "nvme-addr")
	str(&cfg.TCPAddr, "tcp-addr")
	str(&cfg.DiscoveryAddr, "discovery-addr")
	str(&cfg.AdvertiseAddr, "advertise-addr")
	str(&cfg.APIAddr, "api-addr")
	str(&cfg.Join, "join")
	str(&cfg.LogFormat, "log-format")
	str(&cfg.LogLevel, "log-level")
	if c.IsSet("bootstrap") || cfg.Bootstrap == nil {
		b := c.Bool("bootstrap")
		cfg.Bootstrap = &b
	}
	if c.IsSet("rdma-provider") {
		cfg.RDMAProvider = c.String("rdma-provider")
	}
	if c.IsSet("rdma-device") {
		cfg.RDMADevice = c.String("rdma-device")
	}
	if c.IsSet("cores") {
		cfg.Cores = c.Int("cores")
	}
	if c.IsSet("tls-dir") {
		cfg.TLSDir = c.String("tls-dir")
	}
	if c.IsSet("insecure") {
		cfg.Insecure = c.Bool("insecure")
	}
	if c.IsSet("zone") {
		cfg.Zone = c.String("zone")
	}
	if c.IsSet("overcommit") {
		cfg.Overcommit = c.Float64("overcommit")
	}
	if c.IsSet("dhchap-dhgroups") {
		cfg.DHCHAPDHGroups = c.StringSlice("dhchap-dhgroups")
	}
	if c.IsSet("rebuild-rate") {
		cfg.RebuildRate = c.Int64("rebuild-rate")
	}
	if c.IsSet("replace-after") {
		cfg.ReplaceAfter = blkd.Duration(c.Duration("replace-after"))
		if cfg.ReplaceAfter == 0 {
			cfg.ReplaceAfter = -1 // off; the config's zero is the default
		}
	}
	if c.IsSet("failback-after") {
		cfg.FailbackAfter = blkd.Duration(c.Duration("failback-after"))
		if cfg.FailbackAfter == 0 {
			cfg.FailbackAfter = -1 // off; the config's zero is the default
		}
	}
	if c.IsSet("sync-interval") {
		cfg.SyncInterval = blkd.Duration(c.Duration("sync-interval"))
	}
	if c.IsSet("poll-spin") {
		cfg.PollSpin = blkd.Duration(c.Duration("poll-spin"))
		if cfg.PollSpin == 0 {
			cfg.PollSpin = -1 // off; the config's zero is the default
		}
	}
	if c.IsSet("tcp-max-transfer") {
		n, err := api.ParseSize(c.String("tcp-max-transfer"))
		if err != nil {
			return cfg, fmt.Errorf("%w: --tcp-max-transfer: %v", blkd.ErrConfig, err)
		}
		cfg.TCPMaxTransfer = n
	}
	if c.IsSet("detach-after") {
		cfg.DetachAfter = blkd.Duration(c.Duration("detach-after"))
	}
	return cfg, cfg.Validate()
}

// run starts the node and serves until SIGTERM or SIGINT, then shuts it
// down cleanly. SIGHUP reloads what can change while it runs (the log
// level, through reload: the configuration read again) and never stops
// it. Under systemd (Type=notify) it tells the service manager READY=1
// once it serves, RELOADING=1 … READY=1 around a reload and STOPPING=1
// when it shuts down. Everything it says is an event of the node's log
// on standard error (ready, shutting down, stopped: blkd.Start and
// Close); standard output stays empty.
func run(ctx context.Context, cfg blkd.Config, reload func() (blkd.Config, error)) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	d, err := blkd.Start(ctx, cfg)
	if err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			// Stopped while it waited (for a leader, say): a clean stop,
			// logged by Start as "stopped before ready".
			return nil
		}
		return err
	}
	log := d.Log()
	notify(log, sdnotify.Ready, sdnotify.Status("serving"))
serve:
	for {
		select {
		case <-hup:
			notify(log, sdnotify.Reloading, sdnotify.Status("reloading"))
			next, err := reload()
			if err == nil {
				_, err = d.Reload(next)
			}
			if err != nil {
				// At Error: shown at every --log-level.
				log.Error("reload refused, nothing changed", slog.String("err", err.Error()))
			}
			notify(log, sdnotify.Ready, sdnotify.Status("serving"))
		case <-ctx.Done():
			notify(log, sdnotify.Stopping, sdnotify.Status("shutting down"))
			break serve
		case err := <-d.Served():
			notify(log, sdnotify.Stopping, sdnotify.Status("management API stopped"))
			_ = d.Close()
			return fmt.Errorf("management API stopped: %w", err)
		}
	}
	if err := d.Close(); err != nil { // logs "shutting down", "stopped"
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// notify tells systemd (sdnotify) the states; a failure is logged and
// otherwise ignored: the node serves whether or not its service manager
// hears of it.
func notify(log *slog.Logger, states ...string) {
	if err := sdnotify.Notify(states...); err != nil {
		log.Warn("sdnotify: not sent", slog.String("err", err.Error()))
	}
}
