package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
)

// runWriters runs n writers until the returned stop, which waits for
// them and gives the first write error. Writer w calls write(r, w) over
// and over with a generator of its own, seeded from seed and base+w (a
// test's writers of distinct ranges keep the model's order per block the
// host's); count, if not nil, counts the writes that succeeded.
func runWriters(n int, seed int64, base uint64, count *atomic.Int64, write func(r *rand.Rand, w int) error) (stop func() error) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for w := range n {
		wg.Add(1)
		r := rand.New(rand.NewPCG(uint64(seed), base+uint64(w)))
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := write(r, w); err != nil {
					errc <- err
					return
				}
				if count != nil {
					count.Add(1)
				}
			}
		}()
	}
	return func() error {
		close(done)
		wg.Wait()
		close(errc)
		return <-errc
	}
}

// startZoned starts a cluster of n nodes, node1 … nodeN, each in a zone
// of its own (zoneOf), node1 bootstrapping and the others joining it,
// each with common's flags; it returns the cluster, the node IDs and the
// registry's leader once every node is up.
func startZoned(t *testing.T, n int, common ...string) (c *cluster, ids []string, leader string) {
	t.Helper()
	c = &cluster{t: t, nodes: map[string]*nodeAddrs{}, procs: map[string]*daemon{}, common: common}
	for i := range n {
		id := fmt.Sprintf("node%d", i+1)
		ids = append(ids, id)
		c.nodes[id] = &nodeAddrs{t.TempDir(), freeAddr(t), freeAddr(t), freeAddr(t)}
	}
	c.start("node1", "--zone", zoneOf("node1"))
	for _, id := range ids[1:] {
		c.start(id, "--join", c.nodes["node1"].api, "--zone", zoneOf(id))
	}
	return c, ids, c.settled(nil)
}

// zoneOf is startZoned's zone of node id: z1 for node1.
func zoneOf(id string) string { return "z" + strings.TrimPrefix(id, "node") }

// multipathConfig is a multipath host's path: one given up after 3 s
// without its node (I/O waits for a reconnect until then; the host's
// writes then go to the others).
var multipathConfig = initiator.Config{Transport: initiator.TransportTCP, HostNQN: hostNQN, Queues: 2,
	IOTimeout: 2 * time.Second, KATO: 2 * time.Second, CtrlLossTimeout: 3 * time.Second, ReconnectDelay: 500 * time.Millisecond,
	ConnectTimeout: 2 * time.Second}

// multipathHost is a host connected to a volume through several nodes'
// paths, as Linux native multipath is: a write goes to the path that
// served last, and on a path error (or a lost connection, or a path
// whose controller is gone) to the next, until one completes it; an
// error with DNR from a live path is the write's. Paths may be added while it writes (a new
// replica's node, found through discovery).
type multipathHost struct {
	mu    sync.Mutex
	paths map[string]*initiator.Namespace
	order []string
	pref  string
	ctrls []*initiator.Controller
}

// add makes ctrl id's path (in place of an older one: a node
// restarted).
func (h *multipathHost) add(id string, ctrl *initiator.Controller) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.paths == nil {
		h.paths = map[string]*initiator.Namespace{}
	}
	if _, ok := h.paths[id]; !ok {
		h.order = append(h.order, id)
	}
	h.paths[id] = ctrl.Namespace(1)
	h.ctrls = append(h.ctrls, ctrl)
	if h.pref == "" {
		h.pref = id
	}
}

// connect connects id's path at addr to subsystem nqn (multipathConfig)
// and adds it.
func (h *multipathHost) connect(id, addr, nqn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctrl, err := initiator.Connect(ctx, multipathConfig, addr, nqn)
	if err != nil {
		return fmt.Errorf("connect to %s's path %s: %w", id, addr, err)
	}
	if ctrl.Namespace(1) == nil {
		ctrl.Close()
		return fmt.Errorf("%s's path has no namespace 1", id)
	}
	h.add(id, ctrl)
	return nil
}

// ns is id's path.
func (h *multipathHost) ns(id string) *initiator.Namespace {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.paths[id]
}

func (h *multipathHost) close() {
	for _, c := range h.ctrls {
		c.Close()
	}
}

// write writes buf at byte off through the first path that completes it
// within within; it returns the path that did.
func (h *multipathHost) write(buf []byte, off int64, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		h.mu.Lock()
		order := append([]string{h.pref}, h.order...)
		paths := maps(h.paths)
		h.mu.Unlock()
		for i, id := range order {
			if i > 0 && id == order[0] {
				continue
			}
			if _, err := paths[id].WriteAt(buf, off); err != nil {
				last = fmt.Errorf("%s: %w", id, err)
				if errors.Is(err, initiator.ErrControllerLost) || errors.Is(err, initiator.ErrNamespaceRemoved) {
					// The path is gone (a node that no longer holds
					// the volume refuses the reconnect): multipath
					// drops it and goes on with the others.
					continue
				}
				var se *initiator.StatusError
				if errors.As(err, &se) && se.Status.DNR() {
					return "", last
				}
				continue
			}
			h.mu.Lock()
			h.pref = id
			h.mu.Unlock()
			return id, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "", fmt.Errorf("no path served a write at byte %d within %v (last: %w)", off, within, last)
}

func maps(m map[string]*initiator.Namespace) map[string]*initiator.Namespace {
	out := make(map[string]*initiator.Namespace, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// tcpAddrsOf returns the NVMe/TCP address each member registered, by
// node, as d's GET /v1/cluster shows them.
func tcpAddrsOf(t *testing.T, d *daemon) map[string]string {
	t.Helper()
	var cl struct {
		Members []struct {
			ID      string `json:"id"`
			TCPAddr string `json:"tcp_addr"`
		} `json:"members"`
	}
	d.must(t, "GET", "/v1/cluster", "", 200, &cl)
	out := make(map[string]string, len(cl.Members))
	for _, m := range cl.Members {
		out[m.ID] = m.TCPAddr
	}
	return out
}

// pinnedVolume creates the 3-replica volume name of size (into v) with
// its primary on a node that does not lead the registry (its failover
// or restart needs no election), allows hostNQN on it and attaches it.
func pinnedVolume(t *testing.T, c *cluster, ids []string, leader, name, size string, v any) attachJSON {
	t.Helper()
	lp := c.procs[leader]
	pin := ids[0]
	if pin == leader {
		pin = ids[1]
	}
	lp.must(t, "POST", "/v1/volumes", `{"name": "`+name+`", "size": "`+size+`", "replicas": 3, "node": "`+pin+`"}`, 201, v)
	lp.must(t, "POST", "/v1/volumes/"+name+"/hosts", `{"host_nqn": "`+hostNQN+`"}`, 200, nil)
	var a attachJSON
	lp.must(t, "POST", "/v1/volumes/"+name+"/attach", `{"host_nqn": "`+hostNQN+`"}`, 200, &a)
	return a
}

// relaunchZoned starts every node of ids again at once, each in its
// zone (as startZoned placed it), and waits until all serve: one node of
// a stopped cluster alone has no quorum to become ready with.
func (c *cluster) relaunchZoned(ids []string) {
	c.t.Helper()
	ready := map[string]<-chan struct{}{}
	for _, id := range ids {
		n := c.nodes[id]
		c.procs[id], ready[id] = launchBlkdOn(c.t, n.dir, n.raft, n.nvme, n.api, append(append([]string{"--node-id", id}, c.common...), "--zone", zoneOf(id))...)
	}
	for _, id := range ids {
		c.procs[id].waitReady(c.t, ready[id], 90*time.Second)
	}
}

// rebuiltAfter waits until primary has logged why (a term check's
// reason for taking victim out of sync) and a rebuild done, and every
// replica of volume name is in sync again; it returns the volume as
// primary last answered.
func rebuiltAfter(t *testing.T, primary *daemon, name, victim, why string) replicatedJSON {
	t.Helper()
	var v replicatedJSON
	eventually(t, 60*time.Second, victim+" taken out of sync and rebuilt", func() error {
		out := primary.output()
		if !strings.Contains(out, why) || !strings.Contains(out, `msg="rebuild done"`) {
			return fmt.Errorf("%s and a rebuild done not both logged yet", why)
		}
		v = replicatedJSON{}
		primary.must(t, "GET", "/v1/volumes/"+name, "", 200, &v)
		for _, r := range v.Replicas {
			if r.State != "in-sync" {
				return fmt.Errorf("%+v", v.Replicas)
			}
		}
		return nil
	})
	return v
}

// carriedTo is d's last log line of snapshots carried to node's replica
// by a rebuild, "" if none.
func carriedTo(d *daemon, node string) string {
	carried := ""
	for _, line := range strings.Split(d.output(), "\n") {
		if strings.Contains(line, `msg="snapshots carried to a replica"`) && strings.Contains(line, " node="+node+" ") {
			carried = line
		}
	}
	return carried
}

// randomRun draws a write for a model test from r: 1 to 16 blocks of bs
// bytes of random data at a random LBA inside the span blocks from
// first. Writers given distinct spans never overlap, so each keeps the
// model's order for its own blocks.
func randomRun(r *rand.Rand, first, span, bs int) (lba, n int, buf []byte) {
	n = 1 + r.IntN(16)
	lba = first + r.IntN(span-n+1)
	buf = make([]byte, n*bs)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	return lba, n, buf
}
