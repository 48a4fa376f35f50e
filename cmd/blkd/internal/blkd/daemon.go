package blkd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/control"
	"github.com/blk-project/blk/internal/peercred"
	"github.com/blk-project/blk/internal/ratelog"
	"github.com/blk-project/blk/internal/sdnotify"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/metrics"
	"github.com/blk-project/blk/repl"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/store/aio"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/target/tcp"
	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/providers"
	"github.com/prometheus/client_golang/prometheus"
)

// leaderWait bounds how long Start waits for the bootstrapped registry to
// elect this node (raft's election takes about one heartbeat timeout, 1 s).
const leaderWait = 30 * time.Second

// Daemon is a running storage node.
type Daemon struct {
	cfg Config
	log *slog.Logger     // the event log (target and port events)
	rl  *ratelog.Handler // its rate limiter, flushed at shutdown
	// notice is the log of the node's life (ready, shutting down,
	// stopped): never filtered by level nor rate-limited (logging.go).
	notice *slog.Logger
	// audit is the audit log (audit.go): every change, never rate-limited.
	audit *auditLog
	// level is the event log's level, changed by Reload (reload.go).
	level *slog.LevelVar

	node  *meta.Node
	store *store.Store
	// sio serves the store's volumes asynchronously: an io_uring per
	// NVMe/TCP poll group (target.StoreIO).
	sio  *target.StoreIO
	nic  transport.Adapter
	tgt  *target.Target
	port *rdma.Port // nil with --nvme-addr off
	tcp  *tcp.Port  // nil with --tcp-addr off
	disc *tcp.Port  // the discovery-only port; nil with --discovery-addr off
	reg  *metrics.Registry
	ln   net.Listener
	srv  *http.Server

	served chan error // the HTTP server's exit
	// Mutual TLS (auth.go), nil without --tls-dir: the API's server
	// configuration, raft's server and the node-to-node client one.
	apiTLS, raftTLS, peerTLS *tls.Config
	// refusedTLS and refusedRole count the API's refusals (auth.go).
	refusedTLS, refusedRole atomic.Uint64
	// refusedLocal counts API calls of local users refused (localAuth).
	refusedLocal atomic.Uint64
	// refusedRaft counts raft connections refused in their handshake.
	refusedRaft atomic.Uint64
	// peers is the client of the leader's calls to owners (its
	// connections are reused; each call's context bounds it).
	peers *http.Client
	lock  *os.File // the data directory's lock (lock.go)

	// The control plane (owner.go): the reconciler of this node's
	// volumes, the manager of operations (used while leader), the
	// target's adapter, and the settle loop's state.
	rec         *control.Reconciler
	mgr         *control.Manager
	tparts      *targetParts
	settleMu    sync.Mutex
	unreachable map[string]error
	// settleNow asks the settle loop for a round at once (a flatten
	// ended here: the registry records it without waiting a period).
	settleNow chan struct{}
	stop      chan struct{}

	// repl is the node's replication (replica.go): the fences of its
	// secondary replicas, the legs of the volumes it is primary of.
	repl replicas
	// boot names this process among the node's runs (boot.go).
	boot string
	// Failover (failover.go): the lease loop's kick, the leader's record
	// of the nodes it heard from, the volumes being failed over.
	leaseKick  chan struct{}
	live       liveness
	failMu     sync.Mutex
	failing    map[string]bool
	failWarned map[string]bool
	replacer   replacer // the leader's automatic replacements (replace.go)
	// resv is the node's reservation keepers (reservation.go).
	resv *resvKeepers

	// mu serializes attach and detach, and shutdown waits on it.
	mu sync.Mutex

	// ready is set once the node serves its volumes (startGate);
	// phaseNow says what it is doing until then.
	ready    atomic.Bool
	phaseNow atomic.Pointer[string]
	// beats is each main loop's last tick, for /livez (health.go).
	beats heartbeats
	// regMu guards regLast, the last reason this node's registration
	// was not recorded yet (registerAddrs).
	regMu   sync.Mutex
	regLast error

	closeOnce sync.Once
	closeErr  error
}

// Start brings a node up: registry, store, target, HTTP API, NVMe
// ports. It logs a "listening" event per listener, then "ready" once the
// node serves its volumes (at every --log-level: logging.go); blkd
// writes nothing to standard output. The API serves early (see
// startGate); a member of a cluster waits for a leader for as long as
// ctx lasts. On error, whatever was started is closed again; stopped
// by ctx while it waits, it logs "stopped before ready".
func Start(ctx context.Context, cfg Config) (_ *Daemon, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	d := &Daemon{cfg: cfg, served: make(chan error, 1), stop: make(chan struct{}), boot: newBootID(), settleNow: make(chan struct{}, 1)}
	d.repl = replicas{fences: map[uint64]fence{}, primary: map[uint64]*primaryLeg{}, host: map[uint64]*hostVolume{}}
	d.leaseKick = make(chan struct{}, 1)
	d.failing, d.failWarned = map[string]bool{}, map[string]bool{}
	d.resv = newResvKeepers()
	if cfg.RebuildRate > 0 {
		d.repl.limit = repl.NewLimiter(cfg.RebuildRate)
	}
	d.level = new(slog.LevelVar)
	l := newLogs(cfg, d.level)
	d.log, d.rl, d.audit, d.notice = l.event, l.rl, l.audit, l.notice
	defer func() {
		if err != nil {
			d.shutdown(context.Background())
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				d.notice.Info("stopped before ready", slog.String("err", err.Error()))
			}
		}
	}()
	if err := prepareDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	if d.lock, err = lockDataDir(cfg.DataDir); err != nil {
		return nil, err
	}

	if err := d.tlsSetup(); err != nil {
		return nil, err
	}
	d.peers = d.peerClient(0)
	d.node, err = meta.NewNode(meta.Config{
		ID: cfg.NodeID, DataDir: filepath.Join(cfg.DataDir, "meta"), BindAddr: cfg.RaftAddr,
		Bootstrap: *cfg.Bootstrap && cfg.Join == "", Logger: raftLogger(d.log),
		TLSServer: d.raftTLS, TLSClient: d.peerTLS, TLSRefused: d.raftRefused,
		AcceptPeer: d.raftAcceptPeer(),
	})
	if err != nil {
		return nil, fmt.Errorf("meta registry on raft address %s (--raft-addr): %w", cfg.RaftAddr, err)
	}
	if cfg.TLSDir != "" {
		d.log.Info("listening", slog.String("port", "raft"), slog.String("addr", d.node.Addr()), slog.String("tls", "mutual"), slog.String("tls_dir", cfg.TLSDir))
	} else {
		d.log.Info("listening", slog.String("port", "raft"), slog.String("addr", d.node.Addr()))
		if !cfg.Insecure && !peercred.Supported() {
			d.log.Warn("this system cannot tell which local user calls the API or raft: any local user may manage this node; use --tls-dir to require certificates")
		}
	}

	if d.store, err = openStore(cfg, d.log); err != nil {
		return nil, err
	}
	if d.sio, err = target.NewStoreIO(d.store, target.StoreIOConfig{}); err != nil {
		d.store.Close()
		return nil, err
	}
	// Which disk engine the NVMe/TCP poll groups will use: io_uring, or
	// (refused by a seccomp profile, kernel.io_uring_disabled, a memlock
	// limit) a pool of blocking workers, which serves the same I/O at
	// about half the rate at 4 KiB (docs/store.md).
	if why := aio.URingUnavailable(); why != nil {
		d.log.Warn("volume I/O engine: worker pool, io_uring is unavailable", "reason", why.Error())
	} else {
		d.log.Info("volume I/O engine: io_uring")
	}

	// Each port passes its limits with every queue, so the target has
	// none of its own and the two transports bring different ones; they
	// are computed here only to fail before anything else starts. Port
	// IDs: 1 NVMe/TCP, 2 NVMe/RDMA (discovery lists both), made the
	// cluster's own once the node's ordinal is known (portID).
	rcfg := rdma.Config{Addr: cfg.NVMeAddr, AdvertiseAddr: cfg.AdvertiseAddr, Cores: cfg.Cores, Logger: d.log, PortID: rdmaPortID}
	tcfg := tcp.Config{Addr: cfg.TCPAddr, AdvertiseAddr: cfg.tcpAdvertise(), Cores: cfg.Cores, Logger: d.log, PortID: tcpPortID, PollSpin: time.Duration(cfg.PollSpin)}
	if cfg.TCPMaxTransfer != 0 {
		// Validated: a power of two of 4 KiB to 1 MiB. In-capsule data
		// (8 KiB) may not exceed it.
		tcfg.MaxTransfer = uint32(cfg.TCPMaxTransfer)
		tcfg.InCapsule = min(tcp.DefaultInCapsule, tcfg.MaxTransfer)
	}
	if cfg.RDMAOn() {
		d.nic, err = providers.Open(cfg.RDMAProvider, providers.Options{Device: cfg.RDMADevice})
		if err != nil {
			return nil, fmt.Errorf("RDMA adapter (--rdma-provider %q, --rdma-device %q): %w", cfg.RDMAProvider, cfg.RDMADevice, err)
		}
		if _, err := rdma.Limits(d.nic.Info(), rcfg); err != nil {
			return nil, fmt.Errorf("nvme/rdma port limits: %w", err)
		}
	}
	if cfg.TCPOn() {
		if _, err := tcp.Limits(tcfg); err != nil {
			return nil, fmt.Errorf("nvme/tcp port limits: %w", err)
		}
	}
	if cfg.DiscoveryOn() {
		if _, err := tcp.Limits(discoveryPortConfig(cfg, nil)); err != nil {
			return nil, fmt.Errorf("discovery port: %w", err)
		}
	}
	groups, err := cfg.dhGroups()
	if err != nil {
		return nil, err
	}
	d.tgt, err = target.New(target.Config{Logger: d.log, AuthDHGroups: groups})
	if err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}

	d.reg = metrics.NewRegistry(prometheus.NewRegistry())
	if err := d.reg.RegisterTarget(d.tgt, d.namespaceLabels); err != nil {
		return nil, err
	}
	if err := d.reg.RegisterStoreIO(d.sio); err != nil {
		return nil, err
	}
	if err := d.reg.RegisterStore(d.store, d.volumeLabels); err != nil {
		return nil, err
	}
	if err := d.reg.RegisterProcess(); err != nil {
		return nil, err
	}
	if err := d.reg.Prometheus().Register(newAuthCollector(d)); err != nil {
		return nil, fmt.Errorf("metrics: register the API's refusals: %w", err)
	}
	if err := d.reg.Prometheus().Register(newHealthCollector(d)); err != nil {
		return nil, fmt.Errorf("metrics: register the health collector: %w", err)
	}
	if err := d.reg.Prometheus().Register(metrics.NewReplicationCollector(d.replicationStats)); err != nil {
		return nil, fmt.Errorf("metrics: register the replication collector: %w", err)
	}
	if err := d.reg.Prometheus().Register(NewRaftCollector(d.node)); err != nil {
		return nil, fmt.Errorf("metrics: register raft collector: %w", err)
	}
	if err := d.reg.Prometheus().Register(d.resv.seconds); err != nil {
		return nil, fmt.Errorf("metrics: register the reservation keepers' histogram: %w", err)
	}

	// The API serves from here on, before this node joins, waits for a
	// leader or registers: in a cluster whose nodes start together (a
	// power cut, deploy/local-cluster.sh run again), whichever node wins
	// the first election must take the others' registration and catch-up
	// calls while it is still starting itself. Until this node serves its
	// volumes, the routes that need them answer 503 (startGate).
	d.ln, err = net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		return nil, fmt.Errorf("management API on %s (--api-addr): %w", cfg.APIAddr, err)
	}
	d.setPhase("checking its membership")
	d.srv = d.apiServer(d.guard(d.startGate(d.routes())))
	go func() { d.served <- d.serveAPI(d.ln) }()
	d.log.Info("listening", slog.String("port", "api"), slog.String("addr", d.ln.Addr().String()), slog.String("url", d.peerURL(d.ln.Addr().String(), "")))

	// A node whose own registry holds it in the raft configuration is a
	// member: it needs nobody's leave to start, so --join is a no-op on
	// its restarts (its join target may well be down, or starting too);
	// it only asks the target whether it is of another cluster, or has
	// removed it (checkJoinTarget).
	member, _ := d.node.Member()
	if cfg.Join != "" && member {
		rejoin, err := d.checkJoinTarget(ctx)
		if err != nil {
			return nil, err
		}
		if rejoin {
			d.log.Warn("not a member in the view of --join (removed from the cluster?): joining again", slog.String("join", cfg.Join))
			member = false
		} else {
			d.log.Info("already a member of the cluster: --join not needed, waiting for a registry leader", slog.String("raft_state", filepath.Join(cfg.DataDir, "meta")), slog.String("join", cfg.Join))
		}
	}
	if cfg.Join != "" && !member {
		d.setPhase("joining the cluster through " + cfg.Join)
		jctx, cancel := context.WithTimeout(ctx, joinWait)
		err := d.register(jctx, cfg.Join, d.joinRequest(d.ln.Addr().String(), cfg.advertisedNVMe(), cfg.advertisedTCP()))
		cancel()
		if err != nil {
			return nil, err
		}
		d.log.Info("joined the cluster", slog.String("join", cfg.Join))
		member = true
	}

	// The registry must have a leader before anything is applied.
	d.setPhase("waiting for a registry leader")
	if err := d.waitLeader(ctx, member); err != nil {
		return nil, err
	}
	// Serve the volumes this node owns before the port accepts hosts,
	// from a copy of the registry that has caught up with the leader's.
	d.setPhase("catching up with the registry leader")
	d.catchUp(ctx)
	if err := d.settleClusterID(ctx); err != nil {
		return nil, err
	}
	// Its ordinal gives the target its controller IDs and the ports
	// their PORTIDs, before a host can connect (ordinal.go).
	d.setPhase("taking its node ordinal")
	ord := d.takeOrdinal(ctx)
	tcfg.PortID, rcfg.PortID = portID(ord, tcpPortID), portID(ord, rdmaPortID)
	d.setPhase("serving its volumes")
	d.startControl(ctx)

	if cfg.TCPOn() {
		d.tcp, err = tcp.Listen(d.tgt, tcfg)
		if err != nil {
			return nil, fmt.Errorf("nvme/tcp port on %s (--tcp-addr): %w", cfg.TCPAddr, err)
		}
		if err := d.reg.RegisterTCPPort(d.tcp); err != nil {
			return nil, err
		}
		d.logPort("nvme-tcp", d.tcp.Addr(), "I/O and discovery", d.tcp.AdvertisedAddr())
	}
	if cfg.DiscoveryOn() {
		dcfg := discoveryPortConfig(cfg, d.log)
		dcfg.PortID = portID(ord, discPortID)
		d.disc, err = tcp.Listen(d.tgt, dcfg)
		if err != nil {
			return nil, fmt.Errorf("discovery port on %s (--discovery-addr): %w", cfg.DiscoveryAddr, err)
		}
		if err := d.reg.RegisterTCPPort(d.disc); err != nil {
			return nil, err
		}
		d.logPort("nvme-tcp-discovery", d.disc.Addr(), "discovery only", "")
	}
	if cfg.RDMAOn() {
		d.port, err = rdma.Listen(d.tgt, d.nic, rcfg)
		if err != nil {
			return nil, fmt.Errorf("nvme/rdma port on %s (--nvme-addr): %w", cfg.NVMeAddr, err)
		}
		if err := d.reg.RegisterPort(d.port); err != nil {
			return nil, err
		}
		d.logPort("nvme-rdma", d.port.Addr(), "I/O and discovery", d.port.AdvertisedAddr())
	}

	// Record (or update) this node's addresses: applied here on the
	// leader, asked of the leader elsewhere. The NVMe addresses are the
	// ones hosts connect to. Start waits for it a while, then goes on
	// and keeps trying in the background (registerAddrs).
	d.setPhase("registering its addresses")
	d.registerAddrs(ctx)
	d.adoptOrdinal(ord)
	// The replicated volumes this node is primary of connect to their
	// replicas, whose nodes may be starting too: they are served (reads
	// until then) once connected; ready waits for that, bounded.
	d.setPhase("connecting its volumes' replicas")
	go d.leaseLoop(d.stop)
	go d.resvLoop(d.stop)
	d.waitPrimaryLegs(ctx, replicaReadyWait)
	d.waitBroughtUp(ctx, replicaReadyWait)
	d.ready.Store(true)
	go d.settleLoop(d.stop)
	go d.livenessLoop(d.stop)
	go d.remoteLoop(d.stop)
	d.notice.Info("ready")
	return d, nil
}

// logPort logs that an NVMe port listens on addr, serving what, and the
// address it advertises when --advertise-addr makes it another.
func (d *Daemon) logPort(port string, addr net.Addr, serves, advertised string) {
	attrs := []any{slog.String("port", port), slog.String("addr", addr.String()), slog.String("serves", serves)}
	if d.cfg.AdvertiseAddr != "" && advertised != "" {
		attrs = append(attrs, slog.String("advertised", advertised))
	}
	d.log.Info("listening", attrs...)
}

// apiServer is the management API's HTTP server for h: net/http's own
// lines go to the event log, rate-limited (httplog.go).
func (d *Daemon) apiServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ConnContext: d.connContext, ErrorLog: httpErrorLog(d.log)}
}

// startGate lets through, while the node starts, only the routes other
// nodes need from it then (join and remove, the cluster view its peers
// catch up from) and /metrics; every other route answers 503 naming what
// the node is doing, until it serves its volumes. The health route is
// one of them, so the leader counts a starting node as not up yet.
func (d *Daemon) startGate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.ready.Load() || earlyRoute(r.Method, r.URL.Path) {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": fmt.Sprintf("node %s is starting (%s): retry in a moment", d.cfg.NodeID, d.phase())})
	})
}

// earlyRoute says whether a route is served while the node starts.
func earlyRoute(method, path string) bool {
	switch method + " " + path {
	case "GET /metrics", "GET /v1/cluster", "POST /v1/cluster/join", "POST /v1/cluster/remove":
		return true
	}
	return publicRoute(method, path) // the probes (health.go)
}

func (d *Daemon) setPhase(p string) {
	d.phaseNow.Store(&p)
	_ = sdnotify.Notify(sdnotify.Status(p)) // systemctl status shows it; outside systemd a no-op
}

// phase says what a starting node is doing, for its 503 answers.
func (d *Daemon) phase() string {
	if p := d.phaseNow.Load(); p != nil {
		return *p
	}
	return "starting"
}

// leaderReport is how often a member waiting for a leader says so.
const leaderReport = 10 * time.Second

// waitLeader waits until the registry has a leader and, on a follower,
// this node's copy has caught up at least to the leader's registration.
// A member waits as long as it takes (until ctx ends), saying so every
// leaderReport: its cluster elects a leader once a majority of its voters
// run, and a member that gave up would only have to be started again. A
// node that is no member (no --bootstrap, no --join, no raft state) can
// never get a leader: it gives up after leaderWait.
func (d *Daemon) waitLeader(ctx context.Context, member bool) error {
	began := time.Now()
	var bound <-chan time.Time
	if !member {
		t := time.NewTimer(leaderWait)
		defer t.Stop()
		bound = t.C
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	next := began.Add(leaderReport)
	for {
		if d.node.IsLeader() {
			return nil
		}
		if id, api := d.leaderAPI(); id != "" && api != "" {
			return nil
		}
		if now := time.Now(); member && now.After(next) {
			d.log.Warn("registry: no leader yet; waiting for a majority of the voters to run and reach each other (a node removed from the cluster while down: restart it with --join <api address of a member>)",
				slog.Duration("waited", now.Sub(began).Round(time.Second)), slog.String("voters", d.voters()))
			next = next.Add(leaderReport)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("meta registry: stopped while waiting for a registry leader: %w", ctx.Err())
		case <-bound:
			addr, id := d.node.Leader()
			return fmt.Errorf("meta registry: node %s found no registry leader within %v (leader %q at %q): a new cluster's first node needs --bootstrap, a new member --join <api address of a member>", d.cfg.NodeID, leaderWait, id, addr)
		case <-tick.C:
		}
	}
}

// voters lists the voters of the raft configuration this node knows.
func (d *Daemon) voters() string {
	var ids []string
	for _, m := range d.members() {
		if m.Suffrage == "voter" {
			ids = append(ids, m.ID+" at "+m.RaftAddr)
		}
	}
	return strings.Join(ids, ", ")
}

// Port IDs of the discovery log: the kinds of port, which portID
// makes unique across the cluster.
const (
	tcpPortID  = 1
	rdmaPortID = 2
	discPortID = 3
)

// NVMeAddr is the NVMe/RDMA port's address (nil when off).
func (d *Daemon) NVMeAddr() net.Addr {
	if d.port == nil {
		return nil
	}
	return d.port.Addr()
}

// discoveryPortConfig is the discovery-only port's: one poll group and
// few buffers (a discovery is a handful of small admin commands; the
// log is read in 4 KiB windows).
func discoveryPortConfig(cfg Config, log *slog.Logger) tcp.Config {
	return tcp.Config{Addr: cfg.DiscoveryAddr, AdvertiseAddr: cfg.discoveryAdvertise(), Cores: 1, Logger: log,
		PortID: discPortID, DiscoveryOnly: true, SmallBuffers: 64, LargeBuffers: 2, CapsuleBuffers: 16}
}

// TCPAddr is the NVMe/TCP port's address (nil when off).
func (d *Daemon) TCPAddr() net.Addr {
	if d.tcp == nil {
		return nil
	}
	return d.tcp.Addr()
}

// AdvertisedNVMeAddr is the NVMe/RDMA address hosts connect to, host:port
// (Config.AdvertiseAddr, else the port's address); "" when off.
func (d *Daemon) AdvertisedNVMeAddr() string {
	if d.port == nil {
		return ""
	}
	return d.port.AdvertisedAddr()
}

// AdvertisedTCPAddr is the NVMe/TCP address hosts connect to; "" when
// off.
func (d *Daemon) AdvertisedTCPAddr() string {
	if d.tcp == nil {
		return ""
	}
	return d.tcp.AdvertisedAddr()
}

// APIAddr is the HTTP API's address.
func (d *Daemon) APIAddr() net.Addr { return d.ln.Addr() }

// Served is sent the HTTP server's error if it stops on its own.
func (d *Daemon) Served() <-chan error { return d.served }

// Close shuts the node down: HTTP server, RDMA port (its connections are
// disconnected and drained), target, registry, store. A node that was
// ready logs "shutting down" first and "stopped" last, at every
// --log-level.
func (d *Daemon) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return d.shutdown(ctx)
}

func (d *Daemon) shutdown(ctx context.Context) error {
	d.closeOnce.Do(func() {
		started := d.ready.Load()
		if started {
			d.notice.Info("shutting down")
		}
		close(d.stop)
		// No primary term serves past this point: another node may be
		// made primary as soon as this one stops answering.
		d.repl.mu.Lock()
		for _, hv := range d.repl.host {
			hv.hb.cur.Store(nil)
		}
		d.repl.mu.Unlock()
		var errs []error
		if d.srv != nil {
			errs = append(errs, d.srv.Shutdown(ctx))
		} else if d.ln != nil {
			errs = append(errs, d.ln.Close())
		}
		d.mu.Lock() // wait for a management operation in progress
		defer d.mu.Unlock()
		if d.disc != nil {
			errs = append(errs, d.disc.Close())
		}
		if d.tcp != nil {
			errs = append(errs, d.tcp.Close())
		}
		if d.port != nil {
			errs = append(errs, d.port.Close())
		}
		if d.tgt != nil {
			errs = append(errs, d.tgt.Close())
		}
		if d.nic != nil {
			errs = append(errs, d.nic.Close())
		}
		if d.node != nil {
			errs = append(errs, d.node.Close())
		}
		if d.sio != nil {
			d.sio.Close() // after the ports and the target: nothing submits now
		}
		if d.store != nil {
			errs = append(errs, d.store.Close())
		}
		if d.lock != nil {
			errs = append(errs, d.lock.Close())
		}
		// Counts of events held back are written now, not lost.
		d.rl.Flush()
		d.closeErr = errors.Join(errs...)
		if started && d.closeErr != nil {
			d.notice.Error("stopped", slog.String("err", d.closeErr.Error()))
		} else if started {
			d.notice.Info("stopped")
		}
	})
	return d.closeErr
}

// serve adds the subsystem of v, with v's store volume as namespace 1.
// A subsystem left by a replication that stopped (deadPrimaryLeg) is
// removed first: its hosts reconnect to the new one.
func (d *Daemon) serve(v meta.Volume) error {
	if len(v.ReplicaSet()) > 1 {
		// Every replica's node exports it; this one as primary now.
		return d.servePrimary(v)
	}
	if d.deadPrimaryLeg(v.NQN) {
		d.log.Warn("replicated volume: serving again after its replication stopped", slog.String("volume", v.Name))
		if err := d.tparts.Unserve(v.NQN); err != nil {
			return err
		}
	}
	vol, err := d.store.Volume(store.ID(v.ID))
	if err != nil {
		return err
	}
	keys, err := hostKeys(v)
	if err != nil {
		return err
	}
	// The target times the backend itself (blk_target_namespace_io_latency_seconds):
	// no wrapper sits between it and a volume of one replica; one of
	// several is served through its replication (replica.go).
	var backend target.AsyncBackend = d.sio.Backend(vol)
	if d.hostVolumeOf(v.ID) != nil {
		// An ANA path of the volume when it had replicas: served anew.
		if err := d.tparts.Unserve(v.NQN); err != nil {
			return err
		}
	}
	sub, err := d.tgt.AddSubsystem(target.SubsystemConfig{
		NQN: v.NQN, Serial: fmt.Sprintf("blk-%d", v.ID), Model: "blk",
		AllowAnyHost: v.AllowAny, Hosts: v.Hosts, HostKeys: keys,
	})
	if err != nil {
		return err
	}
	// With a reservation keeper once every node serves reservations, its
	// view unknown until bringUp publishes a current copy (reservation.go).
	if err := d.addNamespace(v, sub, nil, target.NamespaceConfig{NSID: 1, Async: backend}); err != nil {
		_ = d.tgt.RemoveSubsystem(v.NQN)
		return err
	}
	return nil
}

// Where a node keeps its volumes (docs/store.md): the extent store's
// metadata in pebble at <data dir>/volumes, the bytes in the data area
// <data dir>/volumes.area beside it (store.Config's default AreaPath).
// A data dir written by a release before issue 22 holds target/volume's
// layout in <data dir>/volumes: store.Open migrates it in place before
// it returns, logging its progress (volume by volume, every 256 MiB),
// so the first start of this release takes the time of copying the data
// once.
const (
	storeDirName = "volumes"
	// areaInitialBytes is the data area's size when the store creates
	// it: small, so that a node (or a test) that holds little does not
	// take a GiB of its filesystem at once; the area grows by an eighth
	// (at least 64 MiB) whenever it is full, never into the space
	// guard's reserve.
	areaInitialBytes = 64 << 20
)

// openStore opens (creating, or upgrading from target/volume's layout)
// the node's extent store in cfg.DataDir, its data area the file beside
// it or cfg.DataDevice, and says in the log which and how large.
func openStore(cfg Config, log *slog.Logger) (*store.Store, error) {
	dir := filepath.Join(cfg.DataDir, storeDirName)
	sc := store.Config{Dir: dir, AreaBytes: areaInitialBytes, SyncInterval: time.Duration(cfg.SyncInterval), Logger: storeLogger{log}}
	area := "data area " + dir + ".area"
	if cfg.DataDevice != "" {
		sc.AreaDevice, sc.WipeDevice = cfg.DataDevice, cfg.DataDeviceWipe == cfg.DataDevice
		area = "data device " + cfg.DataDevice
	}
	s, err := store.Open(sc)
	if err != nil {
		return nil, fmt.Errorf("volume store in %s (%s): %w", dir, area, err)
	}
	ai := s.AreaInfo()
	kind := "file"
	if ai.Device {
		kind = "block device"
	}
	log.Info("volume store opened", "dir", dir, "area", ai.Path, "area_kind", kind, "area_bytes", ai.Bytes,
		"grows", !ai.Device, "direct_io", ai.Direct, "align", ai.Align)
	return s, nil
}

// storeLogger sends the store's own messages (upgrade progress, space
// guard, area growth, recovery at open: all start with "store: ") to
// the event log, drops pebble's informational chatter, and keeps every
// error.
type storeLogger struct{ log *slog.Logger }

func (l storeLogger) Infof(format string, args ...any) {
	if strings.HasPrefix(format, "store: ") {
		l.log.Info(fmt.Sprintf(format, args...))
	}
}

func (l storeLogger) Errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if !strings.HasPrefix(format, "store: ") {
		msg = "store: pebble: " + msg
	}
	l.log.Error(msg)
}
