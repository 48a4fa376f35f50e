package main

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/internal/logrec"
)

// TestAttachFollowsFailover: the device attach --nbd serves (followDevice,
// wired as attach wires it) over a real three-node blkd cluster, with
// --api naming the primary's own node. The primary's blkd is killed
// with SIGKILL under two writers: the device finds the new primary
// through the other members' APIs it learnt at the start and moves
// there, no write fails, and every acknowledged write reads back.
func TestAttachFollowsFailover(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	n1 := startBlkdProc(t, "--node-id", "n1", "--zone", "z1")
	n2 := startBlkdProc(t, "--node-id", "n2", "--zone", "z2", "--join", n1.api)
	startBlkdProc(t, "--node-id", "n3", "--zone", "z3", "--join", n1.api)
	// Three replicas, the primary on n2.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, errs, code := blkctl(t, n1.api, "volume", "create", "fv", "--size", "16MiB", "--replicas", "3", "--node", "n2")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("volume create: %s", errs)
		}
	}
	ok(t, n1.api, "host", "allow", "fv", host)

	var log logrec.Buffer
	c, err := newClient("http://"+n2.api, &log)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{api: c, stderr: &log}
	at, err := e.attach("fv", host)
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range at.Endpoints {
		if ep.Transport == api.TransportTCP {
			at.Transport, at.Address, at.Port = ep.Transport, ep.Address, ep.Port
		}
	}
	if at.Transport != api.TransportTCP {
		t.Fatalf("attachment %+v: no NVMe/TCP endpoint", at)
	}
	d, err := e.followDevice(connOpts{}, "fv", host, at)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	first := d.Endpoint()

	const bs, span = 4096, 512 // each writer's own 2 MiB
	model := make([]byte, 2*span*bs)
	var mu sync.Mutex
	var writes atomic.Int64
	stop := make(chan struct{})
	errc := make(chan error, 2)
	for w := range 2 {
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		go func() {
			for {
				select {
				case <-stop:
					errc <- nil
					return
				default:
				}
				n := 1 + r.IntN(8)
				off := (w*span + r.IntN(span-n+1)) * bs
				buf := make([]byte, n*bs)
				for i := range buf {
					buf[i] = byte(r.Uint32())
				}
				if _, err := d.WriteAt(buf, int64(off)); err != nil {
					errc <- err
					return
				}
				mu.Lock()
				copy(model[off:], buf)
				mu.Unlock()
				writes.Add(1)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	n2.cmd.Process.Signal(syscall.SIGKILL)
	<-n2.exited
	killed := time.Now()
	before := writes.Load()
	for d.Endpoint() == first || writes.Load() < before+100 {
		if time.Since(killed) > 60*time.Second {
			close(stop)
			t.Fatalf("after 60 s: device at %v (was %v), %d writes since the kill; log:\n%s", d.Endpoint(), first, writes.Load()-before, log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%v after the kill: device at %v, %d writes since", time.Since(killed).Round(time.Millisecond), d.Endpoint(), writes.Load()-before)
	close(stop)
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatalf("a write failed across the failover: %v; log:\n%s", err, log.String())
		}
	}
	got := make([]byte, len(model))
	if _, err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("the new primary reads other bytes than the writers were acknowledged")
	}
	if !strings.Contains(log.String(), "failover: the volume is served by") {
		t.Errorf("no failover line on stderr:\n%s", log.String())
	}
}
