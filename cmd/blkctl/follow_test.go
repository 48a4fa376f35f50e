package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/initiator/failover"
	"github.com/blk-project/blk/internal/logrec"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/tcp"
)

// fakeRegistry answers GET /v1/volumes/v and GET /v1/cluster as every
// node of a cluster would, from one state the test changes.
type fakeRegistry struct {
	mu      sync.Mutex
	primary string // "" : the volume does not exist
	members []api.Member
	asked   map[string]int // requests per server
}

func (f *fakeRegistry) serve(t *testing.T, name string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.asked[name]++
		var out any
		switch r.Method + " " + r.URL.Path {
		case "GET /v1/volumes/v":
			if f.primary == "" {
				w.WriteHeader(http.StatusNotFound)
				json.NewEncoder(w).Encode(map[string]string{"error": `meta: volume "v": unknown volume`})
				return
			}
			out = api.Volume{Name: "v", Node: f.primary, NQN: "nqn.2024-01.io.blk:vol:v", State: "online"}
		case "GET /v1/cluster":
			out = api.Cluster{Members: f.members}
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
			w.WriteHeader(http.StatusNotFound)
			return
		}
		json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(s.Close)
	return s
}

// TestVolumeResolver: the attach follower's resolver names the
// primary's port of the attachment's transport; follows a change of
// primary; says clearly when the primary has no such port or the volume
// is gone; and, when the --api node stops answering, asks the other
// members it learned from a cluster answer.
func TestVolumeResolver(t *testing.T) {
	f := &fakeRegistry{primary: "n1", asked: map[string]int{}}
	s1, s2 := f.serve(t, "s1"), f.serve(t, "s2")
	f.members = []api.Member{
		{ID: "n1", APIAddr: strings.TrimPrefix(s1.URL, "http://"), TCPAddr: "192.0.2.1:4420", NVMeAddr: "192.0.2.1:4421"},
		{ID: "n2", APIAddr: strings.TrimPrefix(s2.URL, "http://"), TCPAddr: "192.0.2.2:4420"},
	}
	c, err := newClient(s1.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	want := func(r *volumeResolver, addr, transport string) {
		t.Helper()
		ep, err := r.resolve(ctx)
		if w := (failover.Endpoint{Transport: transport, Addr: addr, SubNQN: "nqn.2024-01.io.blk:vol:v", NSID: 1}); err != nil || ep != w {
			t.Fatalf("resolve: %+v, %v; want %+v", ep, err, w)
		}
	}
	tcp, rdma := newVolumeResolver(c, "v", api.TransportTCP), newVolumeResolver(c, "v", api.TransportRDMA)
	want(tcp, "192.0.2.1:4420", api.TransportTCP)
	want(rdma, "192.0.2.1:4421", api.TransportRDMA)

	f.mu.Lock()
	f.primary = "n2"
	f.mu.Unlock()
	want(tcp, "192.0.2.2:4420", api.TransportTCP)
	if _, err := rdma.resolve(ctx); err == nil || !strings.Contains(err.Error(), "node n2, primary of v, does not serve it over rdma") {
		t.Fatalf("resolve over rdma with n2 serving tcp only: %v", err)
	}

	// The --api node dies: the member learned from the cluster answers.
	s1.Close()
	want(tcp, "192.0.2.2:4420", api.TransportTCP)
	f.mu.Lock()
	before := f.asked["s2"]
	f.mu.Unlock()
	want(tcp, "192.0.2.2:4420", api.TransportTCP)
	f.mu.Lock()
	after := f.asked["s2"]
	f.primary = ""
	f.mu.Unlock()
	if after-before != 2 {
		t.Fatalf("s2 asked %d times for one resolve; want 2 (volume, cluster): the one that answered goes first", after-before)
	}
	if _, err := tcp.resolve(ctx); err == nil || !strings.Contains(err.Error(), "unknown volume") {
		t.Fatalf("resolve of a deleted volume: %v", err)
	}
}

// serveReplica serves the volume's subsystem, as a replica's node would,
// from an in-process target over NVMe/TCP on loopback, with ANA in state
// st, over the shared backend mem; it returns the target's subsystem
// and its address.
func serveReplica(t *testing.T, mem target.Backend, st nvme.ANAState) (*target.Subsystem, string) {
	t.Helper()
	cfg := tcp.Config{Addr: "127.0.0.1:0", Cores: 1}
	lim, err := tcp.Limits(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tg, err := target.New(target.Config{Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: "nqn.2024-01.io.blk:vol:v", Serial: "blk-1", Model: "blk",
		Hosts: []string{host}, ANA: true, ANAState: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: mem}); err != nil {
		t.Fatal(err)
	}
	port, err := tcp.Listen(tg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		port.Close()
		tg.Close()
	})
	return sub, port.Addr().String()
}

// TestFollowDevice: the device attach --nbd serves, wired as attach
// wires it (connOpts over NVMe/TCP, the API resolver), moves to the new
// primary when the registry names it and the old path turns
// inaccessible: the write held meanwhile completes there and reads back.
func TestFollowDevice(t *testing.T) {
	mem, err := target.NewMemBackend(4096, 256)
	if err != nil {
		t.Fatal(err)
	}
	subA, addrA := serveReplica(t, mem, nvme.ANAOptimized)
	subB, addrB := serveReplica(t, mem, nvme.ANAInaccessible)
	f := &fakeRegistry{primary: "n1", asked: map[string]int{}}
	s1 := f.serve(t, "s1")
	f.members = []api.Member{{ID: "n1", TCPAddr: addrA}, {ID: "n2", TCPAddr: addrB}}
	c, err := newClient(s1.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	var log logrec.Buffer
	e := &env{api: c, stderr: &log}
	at, ok := servedBy(api.Volume{Node: "n1", NQN: "nqn.2024-01.io.blk:vol:v"}, f.members)
	if !ok {
		t.Fatal("no endpoint of n1")
	}
	d, err := e.followDevice(connOpts{}, "v", host, at)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	one := bytes.Repeat([]byte{0x11}, 8192)
	if _, err := d.WriteAt(one, 0); err != nil {
		t.Fatal(err)
	}

	if err := subA.SetANAState(nvme.ANAInaccessible); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.primary = "n2"
	f.mu.Unlock()
	res := make(chan error, 1)
	two := bytes.Repeat([]byte{0x22}, 8192)
	go func() {
		_, err := d.WriteAt(two, 8192)
		res <- err
	}()
	until := func(what string, cond func() bool) {
		t.Helper()
		for i := 0; !cond(); i++ {
			if i > 20000 {
				t.Fatalf("timed out waiting for %s; log:\n%s", what, log.String())
			}
			time.Sleep(time.Millisecond)
		}
	}
	until("the device on n2", func() bool { return d.Endpoint().Addr == addrB })
	if err := subB.SetANAState(nvme.ANAOptimized); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("write across the failover: %v; log:\n%s", err, log.String())
	}
	got := make([]byte, 16384)
	if _, err := d.ReadAt(got, 0); err != nil || !bytes.Equal(got, append(one, two...)) {
		t.Fatalf("read back on n2: %v (equal %v)", err, bytes.Equal(got, append(one, two...)))
	}
	if !strings.Contains(log.String(), "blkctl: volume v: failover: the volume is served by") {
		t.Errorf("no failover line on stderr:\n%s", log.String())
	}
}
