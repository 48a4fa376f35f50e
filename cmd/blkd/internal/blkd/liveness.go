package blkd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/meta"
)

// Liveness: the registry leader probes every other registered node's API
// (GET /v1/internal/health) every probeInterval; a lease request
// (failover.go) counts as an answer too. A node not heard from for
// downAfter is set NodeDown in the registry (hosts can no longer be
// attached through it, and its volumes show as unavailable, or fail
// over: failoverRound); the first answer after that sets it NodeUp
// again. A node whose API port refused refusedDown probes in a row is
// down at once: its process is gone (a stopped or cut-off one does not
// refuse, it is silent). A new leader gives every node downAfter from
// its own start before judging a silent one. Draining nodes are left as
// they are.
const (
	probeInterval = time.Second
	probeTimeout  = time.Second
	downAfter     = 6 * time.Second
	refusedDown   = 2
)

// healthResponse is the body of GET /v1/internal/health.
type healthResponse struct {
	NodeID string `json:"node_id"`
	// Full says why the node's store refuses new clusters (its disk is
	// full), "" if it has room: placement leaves such a node out
	// (control.DiskReporter). Absent from an older node's answer.
	Full string `json:"full,omitempty"`
	// Disk is the node's store, measured (GET /v1/cluster?usage=true).
	Disk *api.NodeDisk `json:"disk,omitempty"`
}

func (d *Daemon) health(w http.ResponseWriter, r *http.Request) error {
	h := healthResponse{NodeID: d.cfg.NodeID, Disk: d.disk()}
	if h.Disk != nil {
		h.Full = h.Disk.Full
	}
	writeJSON(w, http.StatusOK, h)
	return nil
}

// disk is this node's store, measured; nil without a store.
func (d *Daemon) disk() *api.NodeDisk {
	if d.store == nil {
		return nil
	}
	st, sp := d.store.Stats(), d.store.Space()
	return &api.NodeDisk{MappedBytes: st.Mapped * st.ClusterBytes, FreeBytes: sp.FreeBytes, TotalBytes: sp.TotalBytes, Full: storeParts{s: d.store}.Full()}
}

// livenessLoop runs the leader's probes until stop closes.
func (d *Daemon) livenessLoop(stop <-chan struct{}) {
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	client := d.peerClient(probeTimeout)
	var since time.Time // when this node last became leader
	refused := map[string]int{}
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		d.beats.beat(loopLiveness)
		if !d.node.IsLeader() {
			d.live.mu.Lock()
			d.live.seen = nil
			d.live.mu.Unlock()
			clear(refused)
			continue
		}
		now := time.Now()
		d.live.mu.Lock()
		if d.live.seen == nil {
			d.live.seen, since = make(map[string]time.Time), now
		}
		d.live.mu.Unlock()
		var nodes []meta.NodeInfo
		d.node.FSM().Read(func(s *meta.State) { nodes = s.Export().Nodes })
		answers := d.probeAll(client, nodes)
		for _, n := range nodes {
			if n.ID == d.cfg.NodeID {
				continue
			}
			a := answers[n.ID]
			if a == probeAlive {
				d.live.heard(n.ID)
			}
			if a == probeRefused {
				refused[n.ID]++
			} else {
				refused[n.ID] = 0
			}
			d.live.mu.Lock()
			last, ok := d.live.seen[n.ID]
			d.live.mu.Unlock()
			if !ok {
				last = since
			}
			alive := now.Sub(last) < probeInterval
			switch {
			case a == probeAlive && n.State == meta.NodeDown:
				d.setNodeState(n.ID, meta.NodeUp, "node answers again")
			case n.State != meta.NodeUp || alive:
			case refused[n.ID] >= refusedDown:
				d.setNodeState(n.ID, meta.NodeDown, fmt.Sprintf("its API port refused %d probes in a row: the process is gone", refused[n.ID]))
			case now.Sub(last) >= downAfter:
				d.setNodeState(n.ID, meta.NodeDown, fmt.Sprintf("not heard from for %v", now.Sub(last).Round(time.Second)))
			}
		}
		d.failoverRound()
		d.replaceRound()
	}
}

// A probe's outcome.
type probeAnswer int

const (
	probeSilent  probeAnswer = iota // no answer (timeout, reset, not itself)
	probeAlive                      // answered as itself
	probeRefused                    // connection refused: nothing listens
)

// probeAll asks every other node's health route at once and says how
// each answered.
func (d *Daemon) probeAll(client *http.Client, nodes []meta.NodeInfo) map[string]probeAnswer {
	var mu sync.Mutex
	var wg sync.WaitGroup
	alive := make(map[string]probeAnswer, len(nodes))
	for _, n := range nodes {
		if n.ID == d.cfg.NodeID || n.MgmtAddr == "" {
			continue
		}
		wg.Add(1)
		go func(n meta.NodeInfo) {
			defer wg.Done()
			ok := probe(context.Background(), client, d.peerURL(n.MgmtAddr, "/v1/internal/health"), n)
			mu.Lock()
			alive[n.ID] = ok
			mu.Unlock()
		}(n)
	}
	wg.Wait()
	return alive
}

func probe(ctx context.Context, client *http.Client, url string, n meta.NodeInfo) probeAnswer {
	_, a := probeHealth(ctx, client, url, n)
	return a
}

// probeHealth is probe with the node's answer (valid if probeAlive).
func probeHealth(ctx context.Context, client *http.Client, url string, n meta.NodeInfo) (healthResponse, probeAnswer) {
	var h healthResponse
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return h, probeSilent
	}
	resp, err := client.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return h, probeRefused
	}
	if err != nil {
		return h, probeSilent
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&h) != nil || h.NodeID != n.ID {
		return h, probeSilent
	}
	return h, probeAlive
}

func (d *Daemon) setNodeState(id string, st meta.NodeState, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.node.Apply(ctx, meta.SetNodeState{ID: id, State: st}); err != nil {
		d.log.Warn("node state not recorded", slog.String("node", id), slog.String("state", st.String()), slog.String("err", err.Error()))
		return
	}
	level := slog.LevelInfo
	if st == meta.NodeDown {
		level = slog.LevelWarn
	}
	d.log.Log(ctx, level, "node state", slog.String("node", id), slog.String("state", st.String()), slog.String("reason", why))
}

// views turns registry volumes into the API's: an online volume whose
// owner node is down shows as unavailable, with the reason; each carries
// its attachments.
func views(s *meta.State, vols ...meta.Volume) []api.Volume {
	snap := s.Export()
	nodes := make(map[string]meta.NodeInfo, len(snap.Nodes))
	for _, n := range snap.Nodes {
		nodes[n.ID] = n
	}
	att := make(map[string][]api.Attachment)
	for _, c := range snap.Connections {
		att[c.Volume] = append(att[c.Volume], api.Attachment{HostNQN: c.HostNQN, Node: c.Node, Since: c.Since})
	}
	out := make([]api.Volume, 0, len(vols))
	for _, v := range vols {
		a := api.Volume{
			Name: v.Name, ID: v.ID, SizeBytes: v.SizeBytes, BlockSize: v.BlockSize, Node: v.Node,
			State: v.State.String(), Reason: v.Reason, NQN: v.NQN, AllowAny: v.AllowAny, Hosts: v.Hosts,
			CreatedAt: v.CreatedAt, Attachments: att[v.Name], Authentication: authModes(v),
			LegacyName: meta.LegacyName(v.Name),
		}
		if n, ok := nodes[v.Node]; ok && n.State == meta.NodeDown && (v.State == meta.VolumeOnline || v.State == meta.VolumeCreating || v.State == meta.VolumeDegraded) {
			a.State, a.Reason = api.StateUnavailable, fmt.Sprintf("its node %s is down (not heard from)", v.Node)
		}
		replicaView(v, &a)
		snapshotFields(v, &a)
		reservationFields(v, &a)
		out = append(out, a)
	}
	return out
}

// authModes says which hosts of v authenticate and how, without the
// secrets.
func authModes(v meta.Volume) map[string]string {
	if len(v.Secrets) == 0 {
		return nil
	}
	m := make(map[string]string, len(v.Secrets))
	for h, s := range v.Secrets {
		m[h] = authMode(s)
	}
	return m
}

func authMode(s meta.HostSecret) string {
	switch {
	case s.Host == "":
		return ""
	case s.Ctrl != "":
		return api.AuthBidirectional
	}
	return api.AuthHost
}

// view is views for one volume.
func (d *Daemon) view(v meta.Volume) api.Volume {
	var out []api.Volume
	d.node.FSM().Read(func(s *meta.State) { out = views(s, v) })
	for i, r := range out[0].Replicas {
		if done, total, ok := d.rebuildProgress(v.ID, r.Node); ok {
			out[0].Replicas[i].Rebuild = &api.RebuildProgress{DoneBytes: done, TotalBytes: total}
		}
	}
	if f := out[0].Flatten; f != nil && d.rec != nil {
		if p, ok := d.rec.FlattenProgress(v.ID); ok {
			f.DoneBytes, f.TotalBytes = p.DoneBytes, p.TotalBytes
		}
	}
	return out[0]
}
