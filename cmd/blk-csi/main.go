// Command blk-csi is blk's CSI driver (docs/operations.md §1): the
// controller service beside the Kubernetes sidecars (--mode controller),
// the node service on every node (--mode node), or both (--mode all). It
// only wires the csi package to flags, a gRPC server and signals.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/blk-project/blk/csi"
	"github.com/blk-project/blk/internal/version"
	"github.com/urfave/cli/v2"
	"google.golang.org/grpc"
)

func main() {
	if err := newApp(os.Stdout, os.Stderr).Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "blk-csi:", err)
		os.Exit(1)
	}
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "blk-csi",
		Usage:     "blk's Container Storage Interface driver",
		Version:   version.String(),
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "endpoint", Value: "unix:///csi/csi.sock", EnvVars: []string{"CSI_ENDPOINT"}, Usage: "the gRPC endpoint to serve: unix:///PATH or tcp://HOST:PORT"},
			&cli.StringFlag{Name: "mode", Value: string(csi.ModeAll), Usage: "the services to serve: controller, node or all"},
			&cli.StringFlag{Name: "api", Value: "127.0.0.1:7070", EnvVars: []string{"BLK_API"}, Usage: "blkd's API address (HOST:PORT, or https://HOST:PORT with --tls-dir)"},
			&cli.StringFlag{Name: "tls-dir", Usage: "directory with ca.crt and the certificate NAME.crt and NAME.key to present to blkd (mutual TLS); empty: plain HTTP"},
			&cli.StringFlag{Name: "tls-name", Value: "operator", Usage: "NAME of the certificate in --tls-dir"},
			&cli.StringFlag{Name: "node-name", EnvVars: []string{"NODE_NAME"}, Usage: "the Kubernetes node's name (node mode)"},
			&cli.StringFlag{Name: "host-nqn", Usage: "the node's host NQN (its CSI node ID); empty: /etc/nvme/hostnqn, else derived from /etc/machine-id"},
			&cli.StringFlag{Name: "host-id", Usage: "the kernel's NVMe host ID (a UUID); empty: /etc/nvme/hostid, else derived"},
			&cli.StringFlag{Name: "zone", Usage: "the node's topology zone; empty: its topology.kubernetes.io/zone label"},
			&cli.StringFlag{Name: "state-dir", Value: "/var/lib/blk-csi", Usage: "where the node service keeps its staging records"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
			&cli.StringFlag{Name: "log-format", Value: "json", Usage: "json or text"},
		},
		Action: run,
	}
}

// newLogger is the process's slog logger on w at the flags' level and
// format.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	o := &slog.HandlerOptions{Level: l}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", format)
}

// listen opens the gRPC endpoint: a unix socket (a stale one from an
// earlier run is removed) or a TCP address.
func listen(endpoint string) (net.Listener, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("--endpoint %q: %v", endpoint, err)
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			path = u.Opaque
		}
		if path == "" {
			return nil, fmt.Errorf("--endpoint %q: no socket path (unix:///csi/csi.sock)", endpoint)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("--endpoint %q: remove the old socket: %v", endpoint, err)
		}
		return net.Listen("unix", path)
	case "tcp":
		return net.Listen("tcp", u.Host)
	}
	return nil, fmt.Errorf("--endpoint %q: want unix:///PATH or tcp://HOST:PORT", endpoint)
}

func run(c *cli.Context) error {
	if c.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: blk-csi takes flags only", c.Args().Slice())
	}
	log, err := newLogger(c.App.ErrWriter, c.String("log-level"), c.String("log-format"))
	if err != nil {
		return err
	}
	cfg := csi.Config{
		Mode:     csi.Mode(c.String("mode")),
		API:      c.String("api"),
		TLSDir:   c.String("tls-dir"),
		TLSName:  c.String("tls-name"),
		NodeName: c.String("node-name"),
		HostNQN:  c.String("host-nqn"),
		HostID:   c.String("host-id"),
		Zone:     c.String("zone"),
		StateDir: c.String("state-dir"),
		Version:  version.Get().Version,
		Log:      log,
	}
	switch cfg.Mode {
	case csi.ModeController, csi.ModeNode, csi.ModeAll:
	default:
		return fmt.Errorf("--mode %q: want controller, node or all", cfg.Mode)
	}
	if cfg.Mode != csi.ModeController {
		if cfg.Host, err = newHost(cfg); err != nil {
			return fmt.Errorf("--mode %s: %w", cfg.Mode, err)
		}
	}
	d, err := csi.New(cfg)
	if err != nil {
		return err
	}
	lis, err := listen(c.String("endpoint"))
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(csi.UnaryInterceptor(log)))
	d.Register(srv)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	log.Info("serving", "endpoint", c.String("endpoint"), "mode", string(cfg.Mode), "version", version.String(), "driver", csi.DriverName)
	select {
	case err = <-served:
	case s := <-sig:
		log.Info("shutting down", "signal", s.String())
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			srv.Stop()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cerr := d.Close(ctx); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if strings.HasPrefix(c.String("endpoint"), "unix:") {
		os.Remove(strings.TrimPrefix(strings.TrimPrefix(c.String("endpoint"), "unix://"), "unix:"))
	}
	return err
}
