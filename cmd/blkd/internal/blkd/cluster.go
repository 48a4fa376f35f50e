package blkd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/blk-project/blk/meta"
	"github.com/hashicorp/raft"
)

// joinWait bounds how long a node keeps asking the cluster to add it
// (--join) or to record its new addresses after a restart.
const joinWait = 60 * time.Second

// JoinRequest is the body of POST /v1/cluster/join.
type JoinRequest struct {
	NodeID   string `json:"node_id"`
	RaftAddr string `json:"raft_addr"`
	// APIAddr and NVMeAddr are registered in the registry with the node;
	// optional (a node re-sends them once its listeners are up).
	APIAddr  string `json:"api_addr,omitempty"`
	NVMeAddr string `json:"nvme_addr,omitempty"`
}

// Member is one entry of GET /v1/cluster.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	APIAddr  string `json:"api_addr,omitempty"`
	NVMeAddr string `json:"nvme_addr,omitempty"`
	Leader   bool   `json:"leader"`
	// Suffrage is the raft role in the configuration: voter, nonvoter.
	Suffrage string `json:"suffrage"`
	// State is the registry's node state (up, draining, down), or
	// "unregistered" for a raft member the registry does not know yet.
	State string `json:"state"`
}

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

func (d *Daemon) clusterJoin(w http.ResponseWriter, r *http.Request) error {
	var req JoinRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.NodeID == "" || req.RaftAddr == "" {
		return badRequest(`"node_id" and "raft_addr" are required, e.g. {"node_id": "node2", "raft_addr": "10.0.0.2:7000"}`)
	}
	ctx := r.Context()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.node.AddVoter(ctx, req.NodeID, req.RaftAddr); err != nil {
		return metaError(err, "")
	}
	if req.APIAddr != "" || req.NVMeAddr != "" {
		if _, err := d.node.Apply(ctx, meta.RegisterNode{ID: req.NodeID, TargetAddr: req.NVMeAddr, MgmtAddr: req.APIAddr}); err != nil {
			return metaError(err, "")
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"members": d.members()})
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

func (d *Daemon) members() []Member {
	f := d.node.Raft().GetConfiguration()
	if err := f.Error(); err != nil {
		return []Member{}
	}
	_, leader := d.node.Leader()
	out := []Member{}
	d.node.FSM().Read(func(s *meta.State) {
		for _, srv := range f.Configuration().Servers {
			m := Member{ID: string(srv.ID), RaftAddr: string(srv.Address), Leader: string(srv.ID) == leader,
				Suffrage: "voter", State: "unregistered"}
			if srv.Suffrage != raft.Voter {
				m.Suffrage = "nonvoter"
			}
			if n, ok := s.Node(m.ID); ok {
				m.APIAddr, m.NVMeAddr, m.State = n.MgmtAddr, n.TargetAddr, n.State.String()
			}
			out = append(out, m)
		}
	})
	return out
}

func (d *Daemon) getCluster(w http.ResponseWriter, r *http.Request) error {
	id, api := d.leaderAPI()
	writeJSON(w, http.StatusOK, map[string]any{
		"node_id": d.cfg.NodeID, "leader_id": id, "leader_api": api, "members": d.members(),
	})
	return nil
}

// register makes the cluster know this node: on the leader it applies
// RegisterNode; elsewhere it POSTs /v1/cluster/join to first (if set) or
// to the leader, following 421 answers to the leader, with backoff, for
// up to joinWait.
func (d *Daemon) register(ctx context.Context, first, apiAddr, nvmeAddr string) error {
	ctx, cancel := context.WithTimeout(ctx, joinWait)
	defer cancel()
	req := JoinRequest{NodeID: d.cfg.NodeID, RaftAddr: d.node.Addr(), APIAddr: apiAddr, NVMeAddr: nvmeAddr}
	body, _ := json.Marshal(req)
	client := &http.Client{Timeout: 15 * time.Second}
	backoff := 100 * time.Millisecond
	target := first
	var last error
	for {
		if d.node.IsLeader() {
			_, err := d.node.Apply(ctx, meta.RegisterNode{ID: req.NodeID, TargetAddr: nvmeAddr, MgmtAddr: apiAddr})
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
				next, err := postJoin(ctx, client, target, body)
				switch {
				case err == nil:
					return nil
				case next != "" && next != target:
					target = next // redirected to the leader: go at once
					last = err
					continue
				}
				last = fmt.Errorf("%s: %w", target, err)
				target = first
			}
		}
		select {
		case <-ctx.Done():
			if first != "" {
				return fmt.Errorf("join the cluster through --join %s: not joined within %v: %v", first, joinWait, last)
			}
			return fmt.Errorf("register node %s with the registry leader: not done within %v: %v", d.cfg.NodeID, joinWait, last)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// postJoin sends one join request; on 421 it returns the leader's API
// address the answer names.
func postJoin(ctx context.Context, client *http.Client, api string, body []byte) (leader string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+"/v1/cluster/join", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if resp.StatusCode == http.StatusOK {
		return "", nil
	}
	var e struct {
		Error     string `json:"error"`
		LeaderAPI string `json:"leader_api"`
	}
	_ = json.Unmarshal(b, &e)
	if e.Error == "" {
		e.Error = string(b)
	}
	return e.LeaderAPI, fmt.Errorf("join answered %s: %s", resp.Status, e.Error)
}
