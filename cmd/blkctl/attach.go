package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/blk-project/blk/api"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/nbd"
	"github.com/blk-project/blk/transport/providers"
	"github.com/urfave/cli/v2"
)

func attachCommand() *cli.Command {
	return &cli.Command{
		Name:  "attach",
		Usage: "attach a host to a volume and print how it connects; with --nbd expose it here as /dev/nbdX",
		UsageText: "blkctl attach VOLUME --host-nqn NQN [--nbd /dev/nbd0]\n\n" +
			"Records the attachment and prints the address, port, subsystem NQN, namespace and transport\n" +
			"(the node's advertised address where it has one) and the nvme connect command of a Linux host.\n" +
			"With --transport, the endpoint of that transport (tcp or rdma) is printed and used.\n" +
			"With --nbd, blkctl also connects to the volume (NVMe/TCP, or NVMe/RDMA over --rdma-provider, soft-iWARP by\n" +
			"default) and exposes the\n" +
			"namespace as a local block device through NBD; this needs the nbd kernel module (modprobe nbd)\n" +
			"and root. It stays in the foreground until SIGINT/SIGTERM, then removes the device and the\n" +
			"attachment. If the device cannot be set up, the attachment is undone.",
		Flags: append(append(providerFlags(), authFlags()...),
			&cli.StringFlag{Name: "host-nqn", Usage: "NQN of the host that attaches"},
			&cli.StringFlag{Name: "nbd", Usage: "also expose the volume as this NBD `DEVICE` (needs the nbd kernel module)"},
		),
		Action: attachAction,
	}
}

func detachCommand() *cli.Command {
	return &cli.Command{
		Name: "detach", Usage: "remove a host's attachment to a volume", UsageText: "blkctl detach VOLUME --host-nqn NQN",
		Flags:  []cli.Flag{&cli.StringFlag{Name: "host-nqn", Usage: "NQN of the attached host"}},
		Action: detachAction,
	}
}

// attachOut is what attach prints.
type attachOut struct {
	Volume  string `json:"volume"`
	HostNQN string `json:"host_nqn"`
	attachment
	// NVMeConnect is the nvme-cli command a Linux kernel host runs to
	// connect to the volume.
	NVMeConnect string `json:"nvme_connect"`
	Device      string `json:"device,omitempty"`
}

// nvmeConnectLine is the nvme-cli command line that connects a Linux
// kernel host, as host, to a.
func nvmeConnectLine(a attachment, host string) string {
	line := fmt.Sprintf("nvme connect -t %s -a %s -s %d -n %s --hostnqn %s", a.Transport, a.Address, a.Port, a.SubsystemNQN, host)
	// The host holds its secrets; the line names them by variable, so
	// that it can be run as printed without a secret in it.
	switch a.Authentication {
	case api.AuthHost:
		line += ` --dhchap-secret "$BLK_DHCHAP_SECRET"`
	case api.AuthBidirectional:
		line += ` --dhchap-secret "$BLK_DHCHAP_SECRET" --dhchap-ctrl-secret "$BLK_DHCHAP_CTRL_SECRET"`
	}
	return line
}

// authFlags are the host's DH-HMAC-CHAP secrets, for a volume that
// requires them (blkctl host allow --dhchap-secret).
func authFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "dhchap-secret", EnvVars: []string{"BLK_DHCHAP_SECRET"}, Usage: "the host's DH-HMAC-CHAP `SECRET` (DHHC-1), for a volume that requires it; the environment variable keeps it out of ps"},
		&cli.StringFlag{Name: "dhchap-ctrl-secret", EnvVars: []string{"BLK_DHCHAP_CTRL_SECRET"}, Usage: "the controller's DH-HMAC-CHAP `SECRET`: the host then accepts only a controller that proves it"},
	}
}

func (e *env) attach(vol, host string) (attachment, error) {
	var a attachment
	err := e.api.do("POST", volPath(vol)+"/attach", map[string]string{"host_nqn": host}, &a)
	return a, hint(err, vol, host)
}

func (e *env) detach(vol, host string) error {
	return hint(e.api.do("POST", volPath(vol)+"/detach", map[string]string{"host_nqn": host}, nil), vol, host)
}

func (e *env) printAttach(o attachOut) error {
	if e.json {
		return e.printJSON(o)
	}
	rows := [][2]string{
		{"Volume", o.Volume}, {"Host NQN", o.HostNQN}, {"Transport", o.Transport},
		{"Address", o.Address}, {"Port", strconv.Itoa(o.Port)},
		{"Subsystem NQN", o.SubsystemNQN}, {"Namespace", strconv.Itoa(int(o.NSID))},
	}
	if o.Device != "" {
		rows = append(rows, [2]string{"Device", o.Device})
	}
	if err := e.keyValues(rows); err != nil {
		return err
	}
	if o.Device == "" {
		need := "nvme-tcp"
		if o.Transport == api.TransportRDMA {
			need = "nvme-rdma, and rdma_rxe or siw"
		}
		fmt.Fprintf(e.stdout, "\nOn a Linux host (nvme-cli, %s):\n  %s\n", need, o.NVMeConnect)
		for _, ep := range o.Endpoints {
			if ep.Transport != o.Transport {
				fmt.Fprintf(e.stdout, "or over %s:\n  %s\n", ep.Transport, nvmeConnectLine(attachment{Transport: ep.Transport, Address: ep.Address, Port: ep.Port,
					SubsystemNQN: o.SubsystemNQN, Authentication: o.Authentication}, o.HostNQN))
			}
		}
	}
	return nil
}

// providerFlags choose the transport and, for RDMA, the initiator's
// provider.
func providerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "transport", EnvVars: []string{"BLK_TRANSPORT"},
			Usage: "NVMe-oF transport: tcp or rdma (default: rdma if --rdma-provider or --rdma-device is set, else the volume node's first, NVMe/TCP when it serves it)"},
		&cli.BoolFlag{Name: "hdr-digest", Usage: "NVMe/TCP: ask for header digests (CRC32C), as nvme connect -g"},
		&cli.BoolFlag{Name: "data-digest", Usage: "NVMe/TCP: ask for data digests (CRC32C), as nvme connect -G"},
		&cli.StringFlag{Name: "rdma-provider", EnvVars: []string{"BLK_RDMA_PROVIDER"}, Value: providers.Default,
			Usage: "transport provider of the initiator: soft (iWARP over TCP) or verbs (an RDMA device through rdma-core; blkctl built with -tags verbs)"},
		&cli.StringFlag{Name: "rdma-device", EnvVars: []string{"BLK_RDMA_DEVICE"}, Usage: "RDMA device of the verbs provider, e.g. rxe0 (default: the first)"},
	}
}

// chooseEndpoint makes a's preferred endpoint the one of the transport
// --transport names (any, if unset).
func chooseEndpoint(c *cli.Context, a attachment) (attachment, error) {
	want := c.String("transport")
	if want == "" && (c.IsSet("rdma-provider") || c.IsSet("rdma-device")) {
		want = api.TransportRDMA // naming a provider asks for RDMA
	}
	if want == "" {
		return a, nil
	}
	if want != api.TransportTCP && want != api.TransportRDMA {
		return a, usageErrorf("--transport %q: use tcp or rdma", want)
	}
	eps := a.Endpoints
	if len(eps) == 0 { // a node of a release that listed one endpoint
		eps = []api.Endpoint{{Transport: a.Transport, Address: a.Address, Port: a.Port}}
	}
	var served []string
	for _, ep := range eps {
		if ep.Transport == want {
			a.Transport, a.Address, a.Port = ep.Transport, ep.Address, ep.Port
			return a, nil
		}
		served = append(served, ep.Transport)
	}
	return a, fmt.Errorf("--transport %s: the volume's node serves it over %v only", want, served)
}

// connect connects the initiator to a as host over a's transport (for
// RDMA, over the provider the command's flags name), within 30 s; the
// caller calls closeAll when done.
func connect(c *cli.Context, a attachment, host string, cfg initiator.Config) (closeAll func(), ctrl *initiator.Controller, ns *initiator.Namespace, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return connOptsOf(c).connect(ctx, a, host, cfg)
}

// connOpts are the command's connection flags, read once, so that the
// attach follower can connect again the same way from its goroutine.
type connOpts struct {
	hdrDigest, dataDigest    bool
	provider, device         string
	dhchapSecret, ctrlSecret string
}

func connOptsOf(c *cli.Context) connOpts {
	return connOpts{hdrDigest: c.Bool("hdr-digest"), dataDigest: c.Bool("data-digest"),
		provider: c.String("rdma-provider"), device: c.String("rdma-device"),
		dhchapSecret: c.String("dhchap-secret"), ctrlSecret: c.String("dhchap-ctrl-secret")}
}

// connect is the package's connect with its flags read and ctx bounding
// it.
func (o connOpts) connect(ctx context.Context, a attachment, host string, cfg initiator.Config) (closeAll func(), ctrl *initiator.Controller, ns *initiator.Namespace, err error) {
	closeNIC := func() {}
	switch a.Transport {
	case api.TransportTCP:
		cfg.Transport = initiator.TransportTCP
		cfg.HeaderDigest, cfg.DataDigest = o.hdrDigest, o.dataDigest
	default:
		if o.hdrDigest || o.dataDigest {
			return nil, nil, nil, usageErrorf("--hdr-digest and --data-digest are NVMe/TCP's; this connection is over %s", a.Transport)
		}
		nic, err := providers.Open(o.provider, providers.Options{Device: o.device})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--rdma-provider %s: %v", o.provider, err)
		}
		cfg.Transport, cfg.Adapter = initiator.TransportRDMA, nic
		closeNIC = func() { nic.Close() }
	}
	addr := net.JoinHostPort(a.Address, strconv.Itoa(a.Port))
	cfg.HostNQN = host
	cfg.DHCHAPSecret, cfg.DHCHAPCtrlSecret = o.dhchapSecret, o.ctrlSecret
	ctrl, err = initiator.Connect(ctx, cfg, addr, a.SubsystemNQN)
	if err != nil {
		closeNIC()
		return nil, nil, nil, fmt.Errorf("connect to %s at %s (%s) as %s: %v", a.SubsystemNQN, addr, a.Transport, host, err)
	}
	ns = ctrl.Namespace(a.NSID)
	if ns == nil {
		ctrl.Close()
		closeNIC()
		return nil, nil, nil, fmt.Errorf("%s at %s has no namespace %d", a.SubsystemNQN, addr, a.NSID)
	}
	return func() { ctrl.Close(); closeNIC() }, ctrl, ns, nil
}

func attachAction(c *cli.Context) error {
	a, err := args(c, "volume")
	if err != nil {
		return err
	}
	host, err := hostNQNFlag(c)
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	vol, dev := a[0], c.String("nbd")
	at, err := e.attach(vol, host)
	if err != nil {
		return err
	}
	if at, err = chooseEndpoint(c, at); err != nil {
		if derr := e.detach(vol, host); derr != nil {
			return fmt.Errorf("%v; undoing the attachment failed too: %v", err, derr)
		}
		return err
	}
	out := attachOut{Volume: vol, HostNQN: host, attachment: at, NVMeConnect: nvmeConnectLine(at, host)}
	if dev == "" {
		return e.printAttach(out)
	}

	// --nbd: connect and serve the namespace to the kernel; any failure
	// undoes the attachment.
	undo := func(cause error) error {
		if derr := e.detach(vol, host); derr != nil {
			return fmt.Errorf("%v; undoing the attachment failed too: %v (run blkctl detach %s --host-nqn %s)", cause, derr, vol, host)
		}
		return fmt.Errorf("%v (the attachment was undone)", cause)
	}
	// The device follows the volume's primary across a failover
	// (follow.go): for every volume, as it costs nothing until a path
	// fails, and a volume of one replica then gets its node back after a
	// restart instead of a controller lost for good.
	fdev, err := e.followDevice(connOptsOf(c), vol, host, at)
	if err != nil {
		return undo(err)
	}
	closeConn := func() { fdev.Close() }
	att, err := nbd.Attach(dev, fdev)
	if err != nil {
		closeConn()
		if errors.Is(err, nbd.ErrNoModule) {
			return undo(fmt.Errorf("--nbd %s: the nbd kernel module is not loaded: run modprobe nbd (as root) and try again: %v", dev, err))
		}
		return undo(fmt.Errorf("--nbd %s: %v", dev, err))
	}
	out.Device = att.Device()
	if err := e.printAttach(out); err != nil {
		att.Detach()
		closeConn()
		return undo(err)
	}
	fmt.Fprintf(e.stderr, "blkctl: volume %s is %s; press Ctrl-C (or send SIGTERM) to detach\n", vol, att.Device())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	s := <-sig
	fmt.Fprintf(e.stderr, "blkctl: %v: detaching %s\n", s, att.Device())
	derr := att.Detach()
	closeConn()
	if err := e.detach(vol, host); err != nil {
		return fmt.Errorf("remove the attachment of %s: %v", host, err)
	}
	if derr != nil {
		return fmt.Errorf("detach %s: %v (the attachment was removed)", att.Device(), derr)
	}
	fmt.Fprintf(e.stderr, "blkctl: detached %s and removed the attachment\n", att.Device())
	return nil
}

func detachAction(c *cli.Context) error {
	a, err := args(c, "volume")
	if err != nil {
		return err
	}
	host, err := hostNQNFlag(c)
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	if err := e.detach(a[0], host); err != nil {
		return err
	}
	if e.json {
		return e.printJSON(map[string]string{"detached": a[0], "host_nqn": host})
	}
	fmt.Fprintf(e.stdout, "detached %s from volume %s\n", host, a[0])
	return nil
}

// attachOrFind attaches host to vol; if it is attached already it finds
// the connection details from the volume and the cluster and reports
// attached=false (the caller must not detach).
func (e *env) attachOrFind(vol, host string) (at attachment, attached bool, err error) {
	at, err = e.attach(vol, host)
	if err == nil {
		return at, true, nil
	}
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict {
		return at, false, err
	}
	var v volume
	if err := e.api.do("GET", volPath(vol), nil, &v); err != nil {
		return at, false, err
	}
	var ci clusterInfo
	if err := e.api.do("GET", "/v1/cluster", nil, &ci); err != nil {
		return at, false, err
	}
	if at, ok := servedBy(v, ci.Members); ok {
		return at, false, nil
	}
	return at, false, fmt.Errorf("%s already attached to %s, and the NVMe address of node %s is unknown: %v", host, vol, v.Node, err)
}

// servedBy is how a host connects to v at its primary (v.Node), from
// that member's NVMe addresses; false if the cluster knows none.
func servedBy(v volume, members []member) (attachment, bool) {
	for _, m := range members {
		if m.ID != v.Node {
			continue
		}
		at := attachment{SubsystemNQN: v.NQN, NSID: 1}
		for _, ep := range []struct{ transport, addr string }{{api.TransportTCP, m.TCPAddr}, {api.TransportRDMA, m.NVMeAddr}} {
			h, p, err := net.SplitHostPort(ep.addr)
			if err != nil {
				continue
			}
			port, _ := strconv.Atoi(p)
			at.Endpoints = append(at.Endpoints, api.Endpoint{Transport: ep.transport, Address: h, Port: port})
		}
		if len(at.Endpoints) > 0 {
			at.Transport, at.Address, at.Port = at.Endpoints[0].Transport, at.Endpoints[0].Address, at.Endpoints[0].Port
			return at, true
		}
	}
	return attachment{}, false
}
