package blkd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"crypto/tls"
	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/meta"
	"github.com/blk-project/blk/pki"
	"github.com/hashicorp/raft"
)

// joinWait bounds how long a node keeps asking the cluster to add it
// (--join) or to record its new addresses after a restart.
const joinWait = 60 * time.Second

// JoinRequest is the body of POST /v1/cluster/join.
type JoinRequest struct {
	NodeID   string `json:"node_id"`
	RaftAddr string `json:"raft_addr"`
	// APIAddr, NVMeAddr (NVMe/RDMA) and TCPAddr (NVMe/TCP) are
	// registered in the registry with the node; optional (a node re-sends
	// them once its listeners are up).
	APIAddr  string `json:"api_addr,omitempty"`
	NVMeAddr string `json:"nvme_addr,omitempty"`
	TCPAddr  string `json:"tcp_addr,omitempty"`
	// ClusterID is the cluster the node's data directory belongs to (its
	// cluster-id file), "" for a new one. The leader refuses another
	// cluster's node.
	ClusterID string `json:"cluster_id,omitempty"`
	// HasState says the node's data directory holds raft state.
	HasState bool `json:"has_state,omitempty"`
	// Promote asks for a vote: the node, a nonvoter, has caught up to the
	// CatchUpIndex the leader gave it.
	Promote bool `json:"promote,omitempty"`
	// CapacityBytes: how many bytes of volumes the node may be promised
	// (meta.RegisterNode).
	CapacityBytes uint64 `json:"capacity_bytes,omitempty"`
	// Zone: the node's failure domain (meta.RegisterNode).
	Zone string `json:"zone,omitempty"`
	// Features: what the node's binary can do (meta.RegisterNode):
	// nodeFeatures.
	Features []string `json:"features,omitempty"`
	// ReplicaAddr: where other nodes reach its NVMe/TCP port
	// (meta.RegisterNode).
	ReplicaAddr string `json:"replica_addr,omitempty"`
}

// nodeFeatures are the meta.RegisterNode features this blkd registers:
// the leader proposes replica commands only once every node lists
// meta.FeatureReplication (docs/replication.md §1).
var nodeFeatures = []string{meta.FeatureReplication, meta.FeatureReplace, meta.FeatureDigests, meta.FeatureSnapshots, meta.FeatureReservations, meta.FeatureHosts}

// JoinResponse answers POST /v1/cluster/join. A new node is added as a
// nonvoter; it asks again with Promote once its registry copy reached
// CatchUpIndex, and only then votes.
type JoinResponse struct {
	Members      []api.Member `json:"members"`
	Voter        bool         `json:"voter"`
	CatchUpIndex uint64       `json:"catch_up_index"`
	ClusterID    string       `json:"cluster_id"`
}

// raftDialTimeout bounds the leader's check that a joining node's raft
// address answers.
const raftDialTimeout = 3 * time.Second

// notLeaderError is answered by leader-only routes on a follower: 421
// Misdirected Request naming the leader's management API address.
type notLeaderError struct {
	LeaderID  string
	LeaderAPI string
}

func (e *notLeaderError) Error() string {
	if e.LeaderAPI == "" {
		return "this node is not the registry leader and no leader is known yet: retry in a moment"
	}
	return fmt.Sprintf("this node is not the registry leader: send the request to the leader %s at http://%s", e.LeaderID, e.LeaderAPI)
}

// leaderAPI returns the leader's ID and management address as this node's
// registry copy knows them; empty if unknown.
func (d *Daemon) leaderAPI() (id, api string) {
	_, id = d.node.Leader()
	if id == "" {
		return "", ""
	}
	d.node.FSM().Read(func(s *meta.State) {
		if n, ok := s.Node(id); ok {
			api = n.MgmtAddr
		}
	})
	return id, api
}

func (d *Daemon) writeNotLeader(w http.ResponseWriter) {
	id, api := d.leaderAPI()
	e := &notLeaderError{LeaderID: id, LeaderAPI: api}
	writeJSON(w, http.StatusMisdirectedRequest, map[string]string{"error": e.Error(), "leader_id": id, "leader_api": api})
}

// leaderOnly answers 421 with the leader's address on a follower, and
// runs h on the leader.
func (d *Daemon) leaderOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !d.node.IsLeader() {
			d.writeNotLeader(w)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// clusterJoin adds a node, or records a member's new addresses. A node
// certificate may only act for the node it names (403), and a raft
// address is one member's (409). A node
// of another cluster (its data directory says so) is refused; a new node
// must answer on its raft address and joins as a nonvoter, so a join
// naming a dead address cannot cost the cluster its quorum; it votes only
// once it asks again with Promote, after catching up.
func (d *Daemon) clusterJoin(w http.ResponseWriter, r *http.Request) error {
	var req JoinRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.NodeID == "" || req.RaftAddr == "" {
		return badRequest(`"node_id" and "raft_addr" are required, e.g. {"node_id": "node2", "raft_addr": "10.0.0.2:7000"}`)
	}
	if name, bound := certNode(r); bound && name != req.NodeID {
		return &apiError{http.StatusForbidden, fmt.Sprintf("the certificate of node %s may not register or change node %s: a node joins, and updates its registration, only as itself (its certificate's name is its --node-id)", name, req.NodeID)}
	}
	ctx := r.Context()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.node.Linearize(ctx); err != nil {
		return metaError(err, "")
	}
	var own string
	d.node.FSM().Read(func(s *meta.State) { own = s.ClusterID() })
	var existing *raft.Server
	if f := d.node.Raft().GetConfiguration(); f.Error() == nil {
		for _, srv := range f.Configuration().Servers {
			if string(srv.ID) == req.NodeID {
				existing = &srv
			} else if string(srv.Address) == req.RaftAddr {
				return &apiError{http.StatusConflict, fmt.Sprintf("raft address %s is member %s's: node %s needs a --raft-addr of its own (the cluster is unchanged)", req.RaftAddr, srv.ID, req.NodeID)}
			}
		}
	}
	var full bool // no room for another node: refused before raft has it
	d.node.FSM().Read(func(s *meta.State) {
		_, known := s.Node(req.NodeID)
		full = !known && s.NodeCount() >= meta.MaxNodes
	})
	switch {
	case full && existing == nil:
		return &apiError{http.StatusConflict, fmt.Sprintf("node %s: the cluster has %d nodes, the most it can hold (each needs one of %d node ordinals, which share out the NVMe controller IDs): remove a node first (blkctl cluster remove); the cluster is unchanged", req.NodeID, meta.MaxNodes, meta.MaxOrdinal)}
	case req.ClusterID != "" && own != "" && req.ClusterID != own:
		return &apiError{http.StatusConflict, fmt.Sprintf("node %s's data directory belongs to cluster %s, this is cluster %s: start it with a new, empty --data-dir to join (the volumes in the old one are not this cluster's)", req.NodeID, req.ClusterID, own)}
	case existing == nil && req.HasState && req.ClusterID == "":
		return &apiError{http.StatusConflict, fmt.Sprintf("node %s's data directory holds a registry of an unknown cluster: start it with a new, empty --data-dir to join", req.NodeID)}
	}
	if existing == nil || string(existing.Address) != req.RaftAddr {
		conn, err := net.DialTimeout("tcp", req.RaftAddr, raftDialTimeout)
		if err != nil {
			return &apiError{http.StatusBadGateway, fmt.Sprintf("node %s: nothing answers on its raft address %s from the leader (%v): the cluster is unchanged; check --raft-addr and the network", req.NodeID, req.RaftAddr, err)}
		}
		conn.Close()
	}
	voter := existing != nil && existing.Suffrage == raft.Voter
	var err error
	switch {
	case voter || (existing != nil && req.Promote):
		if existing == nil || string(existing.Address) != req.RaftAddr || !voter {
			err = d.node.AddVoter(ctx, req.NodeID, req.RaftAddr)
		}
		voter = true
	default:
		if existing == nil || string(existing.Address) != req.RaftAddr {
			err = d.node.AddNonvoter(ctx, req.NodeID, req.RaftAddr)
		}
	}
	if err != nil {
		return metaError(err, "")
	}
	if req.APIAddr != "" || req.NVMeAddr != "" || req.TCPAddr != "" {
		if _, err := d.node.Apply(ctx, meta.RegisterNode{ID: req.NodeID, TargetAddr: req.NVMeAddr, TCPAddr: req.TCPAddr, MgmtAddr: req.APIAddr, CapacityBytes: req.CapacityBytes, Zone: req.Zone, Features: req.Features, ReplicaAddr: req.ReplicaAddr}); err != nil {
			return metaError(err, "")
		}
	}
	if voter {
		d.log.Info("cluster member votes", slog.String("node", req.NodeID), slog.String("raft_addr", req.RaftAddr))
	} else {
		d.log.Info("cluster member added as nonvoter until it catches up", slog.String("node", req.NodeID), slog.String("raft_addr", req.RaftAddr))
	}
	writeJSON(w, http.StatusOK, JoinResponse{Members: d.members(), Voter: voter, CatchUpIndex: d.node.AppliedIndex(), ClusterID: own})
	return nil
}

type removeRequest struct {
	NodeID string `json:"node_id"`
}

func (d *Daemon) clusterRemove(w http.ResponseWriter, r *http.Request) error {
	var req removeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.NodeID == "" {
		return badRequest(`missing "node_id", e.g. {"node_id": "node3"}`)
	}
	ctx := r.Context()
	d.mu.Lock()
	defer d.mu.Unlock()
	// Check before changing anything: an unknown node is 404, a node that
	// still holds a replica of a volume or carries connections is refused while it is
	// still a member (removing it from raft first would leave it half
	// removed).
	known := false
	for _, m := range d.members() {
		known = known || m.ID == req.NodeID
	}
	var owned []string
	d.node.FSM().Read(func(s *meta.State) {
		if _, ok := s.Node(req.NodeID); ok {
			known = true
		}
		for _, v := range s.Export().Volumes {
			if _, ok := v.Replica(req.NodeID); ok {
				owned = append(owned, v.Name)
			}
		}
	})
	if !known {
		return &apiError{http.StatusNotFound, fmt.Sprintf("no node %q in the cluster: GET /v1/cluster lists the members", req.NodeID)}
	}
	if len(owned) > 0 {
		return &apiError{http.StatusConflict, fmt.Sprintf("node %q holds replicas of volumes %s: delete them (or remove their replicas on it) first", req.NodeID, strings.Join(owned, ", "))}
	}
	if err := d.node.RemoveServer(ctx, req.NodeID); err != nil {
		return metaError(err, "")
	}
	registry := "forgotten"
	if _, err := d.node.Apply(ctx, meta.RemoveNode{ID: req.NodeID}); err != nil {
		registry = "kept: " + err.Error()
	}
	writeJSON(w, http.StatusOK, map[string]string{"removed": req.NodeID, "registry": registry})
	return nil
}

func (d *Daemon) members() []api.Member {
	f := d.node.Raft().GetConfiguration()
	if err := f.Error(); err != nil {
		return []api.Member{}
	}
	_, leader := d.node.Leader()
	out := []api.Member{}
	d.node.FSM().Read(func(s *meta.State) {
		for _, srv := range f.Configuration().Servers {
			m := api.Member{ID: string(srv.ID), RaftAddr: string(srv.Address), Leader: string(srv.ID) == leader,
				Suffrage: "voter", State: "unregistered"}
			if srv.Suffrage != raft.Voter {
				m.Suffrage = "nonvoter"
			}
			if n, ok := s.Node(m.ID); ok {
				m.APIAddr, m.NVMeAddr, m.TCPAddr, m.State, m.Zone = n.MgmtAddr, n.TargetAddr, n.TCPAddr, n.State.String(), n.Zone
				m.Ordinal = n.Ordinal
				m.CapacityBytes, m.PromisedBytes = n.CapacityBytes, s.PromisedBytes(n.ID)
			}
			out = append(out, m)
		}
	})
	return out
}

// boolQuery reads the query parameter name: absent is false.
func boolQuery(r *http.Request, name string) (bool, error) {
	f := r.URL.Query().Get(name)
	if f == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(f)
	if err != nil {
		return false, badRequest("%s=%q: use %s=true or %s=false", name, f, name, name)
	}
	return b, nil
}

// getCluster answers GET /v1/cluster: the members and the leader; with
// usage=true each member's disk, with health=true each member's
// readiness, asked of the members themselves.
func (d *Daemon) getCluster(w http.ResponseWriter, r *http.Request) error {
	usage, err := boolQuery(r, "usage")
	if err != nil {
		return err
	}
	health, err := boolQuery(r, "health")
	if err != nil {
		return err
	}
	// On the leader, applied_index is a read index: after Linearize it
	// covers every command committed before the request. A restarting
	// follower waits for its own copy to reach it (catchUp).
	if d.node.IsLeader() {
		if err := d.node.Linearize(r.Context()); err != nil {
			return &apiError{http.StatusServiceUnavailable, fmt.Sprintf("registry: %v: retry in a moment", err)}
		}
	}
	id, leaderAPI := d.leaderAPI()
	var clusterID string
	d.node.FSM().Read(func(s *meta.State) { clusterID = s.ClusterID() })
	members := d.members()
	// Each asks the members at once, within probeTimeout: together they
	// take one timeout, not two. They fill in different fields.
	var wg sync.WaitGroup
	if usage {
		wg.Go(func() { d.memberDisks(r.Context(), members) })
	}
	if health {
		wg.Go(func() { d.memberReadiness(r.Context(), members) })
	}
	wg.Wait()
	writeJSON(w, http.StatusOK, api.Cluster{
		NodeID: d.cfg.NodeID, ClusterID: clusterID, LeaderID: id, LeaderAPI: leaderAPI, Members: members,
		AppliedIndex: d.node.AppliedIndex(),
	})
	return nil
}

// memberDisks fills in each registered member's Disk: this node's from
// its store, the others' from their health route, all at once, each
// within probeTimeout (a member that does not answer has none).
func (d *Daemon) memberDisks(ctx context.Context, members []api.Member) {
	var wg sync.WaitGroup
	for i := range members {
		m := &members[i]
		switch {
		case m.ID == d.cfg.NodeID:
			m.Disk = d.disk()
		case m.APIAddr != "" && m.State != "unregistered":
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(ctx, probeTimeout)
				defer cancel()
				n := meta.NodeInfo{ID: m.ID}
				if h, a := probeHealth(ctx, d.peers, d.peerURL(m.APIAddr, "/v1/internal/health"), n); a == probeAlive {
					m.Disk = h.Disk
				}
			})
		}
	}
	wg.Wait()
}

// catchUp waits until this follower's registry copy holds every command
// the leader had committed when asked: it reads the leader's
// applied_index from GET /v1/cluster (a read index) and waits for its own
// FSM to reach it. A restarted node serves its volumes from its copy, so
// without this it could serve a volume without a host allowed, or at a
// size grown, just before it went down. (Found by e2e/ scenario 4: a node
// restarted as a follower refused a host allowed just before.) If the
// leader cannot be asked within catchUpWait, it goes on with what it has
// and says so: the leader's later requests correct it.
func (d *Daemon) catchUp(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	client := d.peerClient(5 * time.Second)
	var last error
	for {
		if d.node.IsLeader() {
			return
		}
		id, api := d.leaderAPI()
		var idx uint64
		if api == "" {
			last = errors.New("no leader known")
		} else if idx, last = leaderIndex(ctx, client, d.peerURL(api, "/v1/cluster"), id); last == nil {
			if d.node.WaitApplied(ctx, idx) != nil {
				d.log.Warn("registry: this copy did not catch up with the leader's in time; serving from it", slog.Uint64("index", d.node.AppliedIndex()), slog.Uint64("leader_index", idx), slog.Duration("within", catchUpWait))
			}
			return
		}
		select {
		case <-ctx.Done():
			d.log.Warn("registry: could not ask the leader how far to catch up; serving from this node's copy", slog.Duration("within", catchUpWait), slog.String("err", fmt.Sprint(last)))
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// catchUpWait bounds catchUp.
const catchUpWait = 15 * time.Second

// leaderIndex asks api for its applied_index, if it is still leader id.
func leaderIndex(ctx context.Context, client *http.Client, url, id string) (uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var c struct {
		NodeID       string `json:"node_id"`
		LeaderID     string `json:"leader_id"`
		AppliedIndex uint64 `json:"applied_index"`
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&c); err != nil {
		return 0, fmt.Errorf("GET %s: %v", url, err)
	}
	if c.NodeID != id || c.LeaderID != id {
		return 0, fmt.Errorf("%s: no longer the leader", url)
	}
	return c.AppliedIndex, nil
}

// joinRequest is this node's join request with its addresses.
func (d *Daemon) joinRequest(apiAddr, nvmeAddr, tcpAddr string) JoinRequest {
	return JoinRequest{NodeID: d.cfg.NodeID, RaftAddr: d.node.Addr(), APIAddr: apiAddr, NVMeAddr: nvmeAddr, TCPAddr: tcpAddr,
		ClusterID: readClusterID(d.cfg.DataDir), HasState: d.node.HasState(), CapacityBytes: d.capacity(), Zone: d.cfg.Zone, Features: nodeFeatures,
		ReplicaAddr: d.cfg.replicaAddr()}
}

// register makes the cluster know this node: on the leader it applies
// RegisterNode; elsewhere it POSTs /v1/cluster/join to first (if set) or
// to the leader, following 421 answers to the leader, with backoff,
// until ctx ends. Added as a nonvoter, it waits for its registry copy to
// reach the leader's catch-up index and asks again to vote. While
// joining (first set) it never applies locally: a data directory with a
// one-node registry of its own would make it its own leader. It returns
// at once on a refusal retrying cannot help (409, a certificate).
func (d *Daemon) register(ctx context.Context, first string, req JoinRequest) error {
	client := d.peerClient(15 * time.Second)
	backoff := 100 * time.Millisecond
	target := first
	var last error
	for {
		if first == "" && d.node.IsLeader() {
			_, err := d.node.Apply(ctx, meta.RegisterNode{ID: req.NodeID, TargetAddr: req.NVMeAddr, TCPAddr: req.TCPAddr, MgmtAddr: req.APIAddr, CapacityBytes: req.CapacityBytes, Zone: req.Zone, Features: req.Features, ReplicaAddr: req.ReplicaAddr})
			if err == nil {
				return nil
			}
			last = err
		} else {
			if target == "" {
				_, target = d.leaderAPI()
			}
			if target == "" {
				last = errors.New("no leader known yet")
			} else {
				body, _ := json.Marshal(req)
				resp, next, err := postJoin(ctx, client, d.peerURL(target, "/v1/cluster/join"), body)
				switch {
				case err == nil && resp.Voter:
					return nil
				case err == nil:
					// A nonvoter: catch up, then ask for a vote.
					if d.node.WaitApplied(ctx, resp.CatchUpIndex) == nil {
						req.Promote = true
						continue
					}
					last = fmt.Errorf("as a nonvoter, caught up to index %d of %d", d.node.AppliedIndex(), resp.CatchUpIndex)
				case errors.Is(err, errRefused):
					return fmt.Errorf("join the cluster through %s: %w", target, err)
				case olderLeader(err, &req):
					// A rolling upgrade: the leader is an older blkd. Join
					// without features; replica commands stay refused,
					// naming this node, until it registers again (its next
					// start) through a leader that knows them.
					d.log.Warn("the registry leader is an older blkd: registering without features", slog.String("leader", target))
					continue
				case certRefused(err):
					return fmt.Errorf("join the cluster through %s: the TLS handshake failed on a certificate (%v): this node's --tls-dir must hold the cluster's ca.crt and a node certificate that CA signed (blkctl cert issue %s --role node)", target, err, d.cfg.NodeID)
				case next != "" && next != target:
					target = next // redirected to the leader: go at once
					last = err
					continue
				default:
					last = fmt.Errorf("%s: %w", target, err)
					target = first
				}
			}
		}
		d.regMu.Lock()
		d.regLast = last
		d.regMu.Unlock()
		select {
		case <-ctx.Done():
			if first != "" {
				return fmt.Errorf("join the cluster through --join %s: not joined within %v: %v", first, joinWait, last)
			}
			return fmt.Errorf("register node %s with the registry leader: %w: %v", d.cfg.NodeID, ctx.Err(), last)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// olderLeader says whether err is an older leader's refusal of
// JoinRequest.Features (its decoder refuses unknown fields) and, if so,
// drops them from req so the join can be retried.
func olderLeader(err error, req *JoinRequest) bool {
	if err == nil || (len(req.Features) == 0 && req.ReplicaAddr == "") ||
		!strings.Contains(err.Error(), `unknown field "features"`) && !strings.Contains(err.Error(), `unknown field "replica_addr"`) {
		return false
	}
	req.Features, req.ReplicaAddr = nil, ""
	return true
}

// joinCheckWait bounds checkJoinTarget's question.
const joinCheckWait = 3 * time.Second

// checkJoinTarget asks a member's --join target about it before the
// member skips the join. A target of another cluster is refused: the
// member's data directory is of a cluster of its own (a node started
// alone once, say), and skipping the join would leave it running that
// while the operator meant it to join this one. A target whose raft
// configuration lacks this node (it was removed, and never saw its
// removal) means it must join again: rejoin. A target that does not
// answer, or does not know yet (its cluster starting too), lets the
// member go on as one: that is the restart of a cluster, where --join is
// a no-op.
func (d *Daemon) checkJoinTarget(ctx context.Context) (rejoin bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, joinCheckWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.peerURL(d.cfg.Join, "/v1/cluster"), nil)
	if err != nil {
		return false, nil
	}
	resp, err := d.peerClient(joinCheckWait).Do(req)
	if err != nil {
		return false, nil
	}
	defer resp.Body.Close()
	var c api.Cluster
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&c) != nil {
		return false, nil
	}
	if own := readClusterID(d.cfg.DataDir); own != "" && c.ClusterID != "" && c.ClusterID != own {
		return false, fmt.Errorf("data dir %s belongs to cluster %s, in which node %s is a member, but --join %s is node %s of cluster %s: start it with a new, empty --data-dir to join that cluster (the volumes in the old one are not that cluster's), or without --join to run its own", d.cfg.DataDir, own, d.cfg.NodeID, d.cfg.Join, c.NodeID, c.ClusterID)
	}
	if len(c.Members) == 0 {
		return false, nil
	}
	for _, m := range c.Members {
		if m.ID == d.cfg.NodeID {
			return false, nil
		}
	}
	return true, nil
}

// registerWait bounds how long Start waits for the registry to record
// this node's addresses before it goes on (and keeps trying).
const registerWait = 10 * time.Second

// registerRetry is the pause after a registration the leader refused,
// before asking again.
const registerRetry = 30 * time.Second

// registerAddrs records this node's addresses and capacity in the
// registry, through the leader. Start waits for it up to registerWait:
// the leader's API serves from its start, so this is normally done in a
// round trip. If it is not (the leader's API unreachable, a refusal), the
// node goes on starting — it is a member, and the registry keeps its
// previous addresses meanwhile — and keeps trying in the background until
// it is done or the node stops, logging why; it never exits over it.
func (d *Daemon) registerAddrs(ctx context.Context) {
	req := d.joinRequest(d.ln.Addr().String(), d.AdvertisedNVMeAddr(), d.AdvertisedTCPAddr())
	bg, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		select {
		case <-d.stop:
		case <-done:
		}
		cancel()
	}()
	var late atomic.Bool // Start went on without it
	go func() {
		defer close(done)
		for {
			err := d.register(bg, "", req)
			if err == nil {
				if late.Load() {
					d.log.Info("node registration recorded", slog.String("node", d.cfg.NodeID))
				}
				return
			}
			if bg.Err() != nil {
				return
			}
			d.log.Error("node registration not recorded: retrying", slog.String("node", d.cfg.NodeID), slog.Duration("retry_in", registerRetry), slog.String("err", err.Error()))
			select {
			case <-bg.Done():
				return
			case <-time.After(registerRetry):
			}
		}
	}()
	t := time.NewTimer(registerWait)
	defer t.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	case <-t.C:
		late.Store(true)
		d.regMu.Lock()
		last := d.regLast
		d.regMu.Unlock()
		d.log.Warn("registry: this node's addresses are not recorded yet; going on, retrying in the background", slog.Duration("after", registerWait), slog.String("err", fmt.Sprint(last)))
	}
}

// errRefused marks a join the cluster refused for good (409: another
// cluster's data directory): retrying cannot help.
var errRefused = errors.New("refused")

// postJoin sends one join request; on 421 it returns the leader's API
// address the answer names.
func postJoin(ctx context.Context, client *http.Client, url string, body []byte) (_ JoinResponse, leader string, err error) {
	var out JoinResponse
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return out, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return out, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &out); err != nil {
			return out, "", fmt.Errorf("join answer %q: %v", b, err)
		}
		return out, "", nil
	}
	var e struct {
		Error     string `json:"error"`
		LeaderAPI string `json:"leader_api"`
	}
	_ = json.Unmarshal(b, &e)
	if e.Error == "" {
		e.Error = string(b)
	}
	if resp.StatusCode == http.StatusConflict {
		return out, "", fmt.Errorf("%w: %s", errRefused, e.Error)
	}
	return out, e.LeaderAPI, fmt.Errorf("join answered %s: %s", resp.Status, e.Error)
}

// clusterIDFile holds, in the data directory, the ID of the cluster the
// directory belongs to, written once the registry knows it.
const clusterIDFile = "cluster-id"

// readClusterID returns the data directory's cluster ID, "" if none.
func readClusterID(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, clusterIDFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// settleClusterID names a new cluster (the first leader, or a cluster
// made before cluster IDs) and records the ID in the data directory.
func (d *Daemon) settleClusterID(ctx context.Context) error {
	if d.node.IsLeader() {
		// A barrier: a restarted leader's copy has applied every entry
		// of its log (the ID is set already) before it is read here, and
		// before the restart path reconciles from it.
		if err := d.node.Linearize(ctx); err != nil && !errors.Is(err, meta.ErrNotLeader) {
			return fmt.Errorf("meta registry: %w", err)
		}
	}
	var id string
	d.node.FSM().Read(func(s *meta.State) { id = s.ClusterID() })
	if id == "" && d.node.IsLeader() {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		id = hex.EncodeToString(b[:])
		if _, err := d.node.Apply(ctx, meta.SetClusterID{ID: id}); errors.Is(err, meta.ErrNotLeader) {
			return nil // a new leader names it
		} else if err != nil {
			return fmt.Errorf("meta registry: set the cluster ID: %w", err)
		}
	}
	if id == "" {
		return nil // a follower that has not caught up: next start
	}
	if have := readClusterID(d.cfg.DataDir); have != "" && have != id {
		return fmt.Errorf("data dir %s belongs to cluster %s (its %s file), but its registry is cluster %s: the directory was mixed up; restore the right one", d.cfg.DataDir, have, clusterIDFile, id)
	}
	return os.WriteFile(filepath.Join(d.cfg.DataDir, clusterIDFile), []byte(id+"\n"), 0o644)
}

// capacity is how many bytes of volumes this node may be promised: its
// store's filesystem (where a file area grows) or its data device (all
// the area will ever be) times --overcommit; 0 (no limit) if the
// filesystem cannot say.
func (d *Daemon) capacity() uint64 {
	total := uint64(0)
	if ai := d.store.AreaInfo(); ai.Device {
		total = uint64(ai.Bytes)
	} else if sp := d.store.Space(); sp.Monitored {
		total = sp.TotalBytes
	}
	if total == 0 {
		return 0
	}
	c := float64(total) * d.cfg.Overcommit
	if c >= float64(^uint64(0)) {
		return ^uint64(0)
	}
	return uint64(c)
}

// certRefused says whether err is a TLS handshake that failed on a
// certificate, ours refused by the peer or the peer's by us: permanent.
func certRefused(err error) bool {
	var alert tls.AlertError
	return errors.Is(err, pki.ErrPeer) || errors.As(err, &alert)
}
