// Package targettest holds the checks the target's bindings (target/tcp,
// target/rdma) share in their tests: what the core promises must hold
// the same whatever carries the commands.
package targettest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/target"
)

// EvictHeldWrite checks Subsystem.EvictAndDrain through a binding. host's
// controller c (one controller on tgt) has a write held at the backend d
// (DelayedBackend, paused), whose outcome arrives on wrote; the caller
// has already moved the subsystem's Admit away from host. Then: the
// controller is torn down at once, EvictAndDrain does not return while
// the write is held and returns once d resumes, the host never sees that
// write acknowledged, its reconnect is refused for good (the controller
// is lost), and no write's data changed while at the backend.
func EvictHeldWrite(t testing.TB, tgt *target.Target, sub *target.Subsystem, d *target.DelayedBackend, c *initiator.Controller, wrote <-chan error, host string) {
	t.Helper()
	drained := make(chan error, 1)
	go func() {
		n, err := sub.EvictAndDrain(context.Background(), func(h string) bool { return h == host })
		if err == nil && n != 1 {
			err = errors.New("not one controller evicted")
		}
		drained <- err
	}()
	WaitUntil(t, "the controller torn down", func() bool { return tgt.Stats().Controllers == 0 })
	select {
	case err := <-drained:
		t.Fatalf("EvictAndDrain returned (%v) with a write held at the backend", err)
	default:
	}
	d.Resume()
	select {
	case err := <-drained:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("EvictAndDrain did not return once the backend completed the write")
	}
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("the evicted host saw its write acknowledged on a torn-down connection")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the evicted host's write never completed")
	}
	WaitUntil(t, "the evicted host to give up (reconnect refused with DNR)", func() bool { return c.State() == initiator.StateLost })
	if n := d.Corrupt(); n != 0 {
		t.Fatalf("%d writes changed while at the backend", n)
	}
}

// WaitUntil polls cond until it holds, for at most 10 s.
func WaitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
