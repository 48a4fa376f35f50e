package meta

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Config configures a Node. Zero durations and counts take the documented
// defaults (see WithDefaults).
type Config struct {
	// ID is this server's raft ID, stable across restarts. Required.
	ID string
	// DataDir holds the raft log and stable store (DataDir/raft, a pebble
	// DB on FS) and the FSM snapshots (DataDir/snapshots, on the OS
	// filesystem: raft.FileSnapshotStore has no filesystem seam). Required.
	DataDir string
	// FS is the filesystem of the pebble store. Default: vfs.Default.
	FS vfs.FS

	// BindAddr is the raft TCP listen address ("host:port"; port 0 picks
	// one). Required unless Transport is set.
	BindAddr string
	// AdvertiseAddr is the address peers dial. Default: the listener's
	// address, which must then not be unspecified (0.0.0.0).
	AdvertiseAddr string
	// Transport, if set, replaces the TCP transport (tests use
	// raft.NewInmemTransport). The Node does not close it.
	Transport raft.Transport
	// TLSServer and TLSClient, if set, run raft over mutual TLS
	// (NewTLSStreamLayer): peers without a certificate the server
	// configuration accepts cannot append, vote or send snapshots.
	TLSServer, TLSClient *tls.Config
	// TLSRefused, if set, is told of every raft connection refused in
	// its TLS handshake (for the node's metrics and log).
	TLSRefused func(remote net.Addr, err error)
	// AcceptPeer, if set (and TLSServer not), checks each raft connection
	// a peer opens before raft reads from it: an error closes it and is
	// reported to TLSRefused. blkd sets it on a node that serves raft on
	// loopback without TLS, to let in only its own user's processes.
	AcceptPeer func(net.Conn) error

	// Bootstrap makes this node the single voter of a new cluster if its
	// DataDir holds no raft state yet. Ignored otherwise, so it is safe to
	// leave on across restarts of the first node.
	Bootstrap bool

	// HeartbeatTimeout and ElectionTimeout: how long a follower goes
	// without a leader before an election, and a candidate without
	// winning one. Default 1s each (raft's own; generous for a registry
	// on loaded machines).
	HeartbeatTimeout time.Duration
	ElectionTimeout  time.Duration
	// LeaderLeaseTimeout: how long a leader stays leader without reaching
	// a quorum. Default 500ms; must not exceed HeartbeatTimeout.
	LeaderLeaseTimeout time.Duration
	// CommitTimeout bounds how long a follower waits for a heartbeat that
	// carries the commit index. Default 50ms.
	CommitTimeout time.Duration
	// SnapshotInterval: how often raft checks whether to snapshot.
	// Default 2m. SnapshotThreshold: the number of log entries since the
	// last snapshot that triggers one. Default 8192. TrailingLogs: entries
	// kept in the log after a snapshot so slow followers catch up without
	// one. Default 10240. SnapshotRetain: snapshots kept on disk. Default 2.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	TrailingLogs      uint64
	SnapshotRetain    int

	// LogCacheEntries is how many recent log entries are kept in memory in
	// front of the pebble store (raft.LogCache), so replication to
	// followers rarely reads the disk. Default 512; -1 disables.
	LogCacheEntries int

	// ApplyTimeout bounds Apply, AddVoter and RemoveServer and reads when
	// the context has no deadline. Default 10s.
	ApplyTimeout time.Duration
	// TCPMaxPool and TCPTimeout configure the TCP transport: connections
	// kept per peer (default 3) and the I/O deadline (default 10s).
	TCPMaxPool int
	TCPTimeout time.Duration

	// Logger, if set, receives the log records of raft, its network
	// transport and its snapshot store (blkd passes its event log through
	// internal/hclogslog); LogOutput and LogLevel are then unused.
	Logger hclog.Logger
	// LogOutput receives raft's log lines at LogLevel when Logger is nil.
	// Default: io.Discard.
	LogOutput io.Writer
	// LogLevel is an hclog level name. Default "warn".
	LogLevel string
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.HeartbeatTimeout, time.Second)
	def(&c.ElectionTimeout, time.Second)
	def(&c.LeaderLeaseTimeout, 500*time.Millisecond)
	def(&c.CommitTimeout, 50*time.Millisecond)
	def(&c.SnapshotInterval, 2*time.Minute)
	def(&c.ApplyTimeout, 10*time.Second)
	def(&c.TCPTimeout, 10*time.Second)
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 8192
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = 10240
	}
	if c.SnapshotRetain == 0 {
		c.SnapshotRetain = 2
	}
	if c.LogCacheEntries == 0 {
		c.LogCacheEntries = 512
	}
	if c.TCPMaxPool == 0 {
		c.TCPMaxPool = 3
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.LogOutput == nil {
		c.LogOutput = io.Discard
	}
	if c.LogLevel == "" {
		c.LogLevel = "warn"
	}
	return c
}

// Validate checks c (after WithDefaults) and the relationships between its
// fields.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.ID == "":
		return fmt.Errorf("meta: config: empty ID: %w", ErrInvalid)
	case c.DataDir == "":
		return fmt.Errorf("meta: config: empty DataDir: %w", ErrInvalid)
	case c.Transport == nil && c.BindAddr == "":
		return fmt.Errorf("meta: config: neither BindAddr nor Transport: %w", ErrInvalid)
	case c.LeaderLeaseTimeout > c.HeartbeatTimeout:
		return fmt.Errorf("meta: config: LeaderLeaseTimeout %v > HeartbeatTimeout %v: %w", c.LeaderLeaseTimeout, c.HeartbeatTimeout, ErrInvalid)
	case c.SnapshotRetain < 1:
		return fmt.Errorf("meta: config: SnapshotRetain %d < 1: %w", c.SnapshotRetain, ErrInvalid)
	case hclog.LevelFromString(c.LogLevel) == hclog.NoLevel:
		return fmt.Errorf("meta: config: LogLevel %q: %w", c.LogLevel, ErrInvalid)
	}
	return raft.ValidateConfig(c.raftConfig(nil))
}

func (c Config) raftConfig(logger hclog.Logger) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(c.ID)
	rc.HeartbeatTimeout = c.HeartbeatTimeout
	rc.ElectionTimeout = c.ElectionTimeout
	rc.LeaderLeaseTimeout = c.LeaderLeaseTimeout
	rc.CommitTimeout = c.CommitTimeout
	rc.SnapshotInterval = c.SnapshotInterval
	rc.SnapshotThreshold = c.SnapshotThreshold
	rc.TrailingLogs = c.TrailingLogs
	if logger != nil {
		rc.Logger = logger
	}
	return rc
}

// ErrNotLeader is matched (errors.Is) by a *NotLeaderError.
var ErrNotLeader = errors.New("meta: not the raft leader")

// NotLeaderError is returned by leader-only calls on a follower. LeaderAddr
// and LeaderID are empty while no leader is known.
type NotLeaderError struct {
	LeaderAddr string
	LeaderID   string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderAddr == "" {
		return "meta: not the raft leader (no leader known)"
	}
	return fmt.Sprintf("meta: not the raft leader (leader %s at %s)", e.LeaderID, e.LeaderAddr)
}

func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// Node is one member of the meta cluster: raft over the pebble stores, a
// file snapshot store and a transport, driving an FSM.
type Node struct {
	cfg   Config
	fsm   *FSM
	store *PebbleStore
	trans raft.Transport
	owned io.Closer // the transport, if the Node created it
	raft  *raft.Raft
	// hadState: the data directory held raft state at start.
	hadState bool

	closeOnce sync.Once
	closeErr  error
}

// NewNode opens the stores in cfg.DataDir and starts raft. With
// cfg.Bootstrap and no existing state it bootstraps a one-voter cluster.
func NewNode(cfg Config) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	logger := cfg.Logger
	if logger == nil {
		logger = hclog.New(&hclog.LoggerOptions{
			Name:   "raft/" + cfg.ID,
			Output: cfg.LogOutput,
			Level:  hclog.LevelFromString(cfg.LogLevel),
		})
	}
	n := &Node{cfg: cfg, fsm: NewFSM()}
	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()

	n.store, err = OpenStore(StoreOptions{Dir: filepath.Join(cfg.DataDir, "raft"), FS: cfg.FS})
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { _ = n.store.Close() })
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, cfg.SnapshotRetain, logger)
	if err != nil {
		return nil, fmt.Errorf("meta: snapshot store: %w", err)
	}
	n.trans = cfg.Transport
	if n.trans == nil {
		var adv net.Addr
		if cfg.AdvertiseAddr != "" {
			if adv, err = net.ResolveTCPAddr("tcp", cfg.AdvertiseAddr); err != nil {
				return nil, fmt.Errorf("meta: advertise address: %w", err)
			}
		}
		var nt *raft.NetworkTransport
		if cfg.TLSServer != nil {
			layer, lerr := NewTLSStreamLayer(cfg.BindAddr, adv, cfg.TLSServer, cfg.TLSClient, cfg.TLSRefused)
			if lerr != nil {
				return nil, fmt.Errorf("meta: raft transport: %w", lerr)
			}
			nt = raft.NewNetworkTransportWithLogger(layer, cfg.TCPMaxPool, cfg.TCPTimeout, logger)
		} else if cfg.AcceptPeer != nil {
			layer, lerr := newCheckedStreamLayer(cfg.BindAddr, adv, cfg.AcceptPeer, cfg.TLSRefused)
			if lerr != nil {
				return nil, fmt.Errorf("meta: raft transport: %w", lerr)
			}
			nt = raft.NewNetworkTransportWithLogger(layer, cfg.TCPMaxPool, cfg.TCPTimeout, logger)
		} else {
			nt, err = raft.NewTCPTransportWithLogger(cfg.BindAddr, adv, cfg.TCPMaxPool, cfg.TCPTimeout, logger)
			if err != nil {
				return nil, fmt.Errorf("meta: raft transport: %w", err)
			}
		}
		n.trans, n.owned = nt, nt
		cleanup = append(cleanup, func() { _ = nt.Close() })
	}
	rc := cfg.raftConfig(logger)
	has, err := raft.HasExistingState(n.store, n.store, snaps)
	if err != nil {
		return nil, fmt.Errorf("meta: raft state: %w", err)
	}
	n.hadState = has
	if !has {
		// A new member's ID is held to the name grammar; a node that
		// already has state keeps the ID it has (checkNewNodeID).
		if err := CheckNodeID(cfg.ID); err != nil {
			return nil, err
		}
	}
	if cfg.Bootstrap {
		if !has {
			boot := raft.Configuration{Servers: []raft.Server{{
				Suffrage: raft.Voter, ID: rc.LocalID, Address: n.trans.LocalAddr(),
			}}}
			if err := raft.BootstrapCluster(rc, n.store, n.store, snaps, n.trans, boot); err != nil {
				return nil, fmt.Errorf("meta: bootstrap: %w", err)
			}
		}
	}
	var logs raft.LogStore = n.store
	if cfg.LogCacheEntries > 0 {
		if logs, err = raft.NewLogCache(cfg.LogCacheEntries, n.store); err != nil {
			return nil, fmt.Errorf("meta: log cache: %w", err)
		}
	}
	n.raft, err = raft.NewRaft(rc, n.fsm, logs, n.store, snaps, n.trans)
	if err != nil {
		return nil, fmt.Errorf("meta: start raft: %w", err)
	}
	return n, nil
}

// ID returns the node's raft server ID.
func (n *Node) ID() string { return n.cfg.ID }

// Addr returns the address peers reach this node's raft at.
func (n *Node) Addr() string { return string(n.trans.LocalAddr()) }

// FSM returns the node's state machine, for local (possibly stale) reads.
func (n *Node) FSM() *FSM { return n.fsm }

// Raft returns the underlying raft instance for what Node does not wrap
// (stats, snapshots, leadership transfer).
func (n *Node) Raft() *raft.Raft { return n.raft }

// Leader returns the address and ID of the current leader, empty if unknown.
func (n *Node) Leader() (addr, id string) {
	a, i := n.raft.LeaderWithID()
	return string(a), string(i)
}

// AppliedIndex is the log index of the last registry command this
// node's FSM has applied. On the leader after Linearize it covers every
// command committed before; a follower whose AppliedIndex reaches that
// value holds all of them (a read index, as in the raft paper §6.4).
func (n *Node) AppliedIndex() uint64 {
	var i uint64
	n.fsm.Read(func(s *State) { i = s.Index() })
	return i
}

// WaitApplied waits until this node's registry copy has applied index,
// or ctx ends (its error then).
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	for n.AppliedIndex() < index {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// IsLeader says whether this node currently believes it is the leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

func (n *Node) timeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return n.cfg.ApplyTimeout
}

func (n *Node) notLeader() error {
	addr, id := n.Leader()
	return &NotLeaderError{LeaderAddr: addr, LeaderID: id}
}

// wait waits for f or ctx, translating raft's leadership errors. If ctx
// ends first the helper goroutine lingers until raft resolves f (commit,
// leadership loss or shutdown); the operation itself may still take effect.
func (n *Node) wait(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress):
		// ErrLeadershipLost: the entry may still commit. Callers retry
		// idempotent commands, or read back before retrying others.
		return fmt.Errorf("%w: %w", n.notLeader(), err)
	}
	return fmt.Errorf("meta: raft: %w", err)
}

// Apply replicates c and returns its result. The error is Result.Err for a
// command the registry refused, a *NotLeaderError on a follower (forwarding
// is the caller's job), or the raft or context error.
func (n *Node) Apply(ctx context.Context, c Command) (Result, error) {
	b, err := EncodeCommand(c)
	if err != nil {
		return Result{}, err
	}
	if err := n.checkProposal(c); err != nil {
		return Result{}, err
	}
	if !n.IsLeader() {
		return Result{}, n.notLeader()
	}
	f := n.raft.Apply(b, n.timeout(ctx))
	if err := n.wait(ctx, f); err != nil {
		return Result{}, err
	}
	r, ok := f.Response().(Result)
	if !ok {
		return Result{}, fmt.Errorf("meta: apply returned %T", f.Response())
	}
	return r, r.Err
}

// checkProposal holds new names to the name grammar before they reach
// the log: a new volume's (created or cloned), a new snapshot's, and a
// node's that the registry does not know yet. Apply itself accepts the
// names older logs hold (see CreateVolume.checkCommitted), so this is the
// only place the grammar is enforced for commands that had names before
// it (the snapshot commands, new, are held to it by Apply as well); a
// node with a legacy ID still re-registers.
func (n *Node) checkProposal(c Command) error {
	switch c := c.(type) {
	case CreateVolume:
		return CheckVolumeName(c.Name)
	case CloneVolume:
		return c.Check()
	case CreateSnapshot:
		return c.Check()
	case Reservation, ClearReservation:
		return n.requireFeature(FeatureReservations, c.Op())
	case RegisterHost:
		if err := c.Check(); err != nil {
			return err
		}
		return n.requireFeature(FeatureHosts, c.Op())
	case UnregisterHost:
		return n.requireFeature(FeatureHosts, c.Op())
	case RegisterNode:
		if c.Zone != "" {
			if err := CheckZone(c.Zone); err != nil {
				return err
			}
		}
		return n.checkNewNodeID(c.ID)
	}
	return nil
}

// checkNewNodeID checks id against the name grammar unless the registry
// or the raft configuration already holds it (a member from before the
// grammar keeps working).
func (n *Node) checkNewNodeID(id string) error {
	err := CheckNodeID(id)
	if err == nil {
		return nil
	}
	known := false
	n.fsm.Read(func(s *State) { _, known = s.Node(id) })
	if known {
		return nil
	}
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		for _, srv := range f.Configuration().Servers {
			if string(srv.ID) == id {
				return nil
			}
		}
	}
	return err
}

// Linearize returns once this node's FSM reflects every command committed
// before the call, and this node was the leader: a read after it is
// linearizable. It costs one log round trip (raft.Barrier).
func (n *Node) Linearize(ctx context.Context) error {
	if !n.IsLeader() {
		return n.notLeader()
	}
	return n.wait(ctx, n.raft.Barrier(n.timeout(ctx)))
}

// ReadVolume returns the named volume, linearizably (see Linearize): what
// attach-time placement must use.
func (n *Node) ReadVolume(ctx context.Context, name string) (Volume, error) {
	if err := n.Linearize(ctx); err != nil {
		return Volume{}, err
	}
	var v Volume
	var ok bool
	n.fsm.Read(func(s *State) { v, ok = s.Volume(name) })
	if !ok {
		return Volume{}, fmt.Errorf("meta: volume %q: %w", name, ErrUnknownVolume)
	}
	return v, nil
}

// AddVoter adds (or updates the address of) a voting member. Leader only.
func (n *Node) AddVoter(ctx context.Context, id, addr string) error {
	if !n.IsLeader() {
		return n.notLeader()
	}
	if err := n.checkNewNodeID(id); err != nil {
		return err
	}
	return n.wait(ctx, n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, n.timeout(ctx)))
}

// AddNonvoter adds a member that receives the log but does not vote, so
// it cannot cost the cluster its quorum while it catches up (or if it
// never answers). Leader only.
func (n *Node) AddNonvoter(ctx context.Context, id, addr string) error {
	if !n.IsLeader() {
		return n.notLeader()
	}
	if err := n.checkNewNodeID(id); err != nil {
		return err
	}
	return n.wait(ctx, n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, n.timeout(ctx)))
}

// HasState says whether the node started on a data directory that already
// held raft state (a log or a snapshot).
func (n *Node) HasState() bool { return n.hadState }

// Member says whether this node is in the raft configuration its own log
// holds (the latest one it knows, committed or not), and whether as a
// voter. A node that bootstrapped, or was added and then replicated to,
// is a member across restarts without asking anyone: blkd then skips
// --join and just waits for a leader. A removed node may still find
// itself in a configuration it never saw replaced; asking the leader
// (a join) settles that.
func (n *Node) Member() (member, voter bool) {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false, false
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == raft.ServerID(n.cfg.ID) {
			return true, s.Suffrage == raft.Voter
		}
	}
	return false, false
}

// RemoveServer removes a member. Leader only.
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	if !n.IsLeader() {
		return n.notLeader()
	}
	return n.wait(ctx, n.raft.RemoveServer(raft.ServerID(id), 0, n.timeout(ctx)))
}

// Close shuts raft down, then closes the transport it created and the
// stores. It is idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		errs := []error{n.raft.Shutdown().Error()}
		if n.owned != nil {
			errs = append(errs, n.owned.Close())
		}
		errs = append(errs, n.store.Close())
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}
