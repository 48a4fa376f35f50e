package initiator

import (
	"bytes"
	"errors"
	"flag"
	"math/rand"
	"sync"
	"testing"
	"time"
)

var stressSeed = flag.Int64("initiator.seed", 0, "seed of TestStressWithFaults (0: from the clock)")

// Concurrent blocking writers and readers, each on its own region, while
// the target's connections are cut a few times: every call succeeds
// (commands lost with the connection are resubmitted after the
// reconnect), and the target's disk ends up exactly as the writers left
// it. The fault schedule comes from a seed printed on failure; replay
// with -initiator.seed.
func TestStressWithFaults(t *testing.T) {
	seed := *stressSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d", seed)
	defer func() {
		if t.Failed() {
			t.Logf("replay with: go test -run TestStressWithFaults -initiator.seed %d ./initiator/", seed)
		}
	}()
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	cfg.Logf = func(string, ...any) {}
	cfg.MaxTransfer = 16 << 10
	cfg.QueueDepth = 8
	c := connectFake(t, f, cfg)
	ns := c.Namespace(1)

	const workers = 4
	region := ns.Size() / workers
	model := make([]byte, ns.Size())
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	stop := make(chan struct{})
	for w := 0; w < workers; w++ {
		rng := rand.New(rand.NewSource(seed + int64(w)))
		base := int64(w) * region
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			got := make([]byte, 64<<10)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := (1 + rng.Intn(len(buf)/512)) * 512
				off := base + int64(rng.Intn(int(region)-n+1))&^511
				rng.Read(buf[:n])
				if _, err := ns.WriteAt(buf[:n], off); err != nil {
					errs <- err
					return
				}
				copy(model[off:], buf[:n]) // regions are disjoint
				if _, err := ns.ReadAt(got[:n], off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got[:n], buf[:n]) {
					errs <- errors.New("read back differs")
					return
				}
			}
		}()
	}
	frng := rand.New(rand.NewSource(seed))
	for i := 0; i < 3; i++ {
		time.Sleep(time.Duration(50+frng.Intn(100)) * time.Millisecond)
		f.dropAll()
		if err := c.WaitLive(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if !bytes.Equal(f.disk(1), model) {
		t.Fatal("target disk differs from the writers' model")
	}
	if c.Stats().Failures < 1 {
		t.Errorf("stats %+v", c.Stats())
	}
}

// Close is bounded: with a target that answers nothing, and while
// reconnecting to a target that refuses.
func TestCloseBounded(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	cfg.ShutdownTimeout = 200 * time.Millisecond
	c := connectFake(t, f, cfg)
	done := make(DoneChan, 1)
	f.mute.Store(true)
	if err := c.Namespace(1).ReadAsync(0, make([]byte, 512), done); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.Close()
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close took %v", took)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("in-flight read after Close: %v", err)
	}
	if err := c.Namespace(1).ReadAsync(0, make([]byte, 512), done); !errors.Is(err, ErrClosed) {
		t.Errorf("read after Close: %v", err)
	}
	f.mute.Store(false)

	c2 := connectFake(t, f, cfg)
	f.refuseCM.Store(true)
	f.dropAll()
	waitFor(t, "reconnecting", 5*time.Second, func() bool { return c2.State() == StateReconnecting })
	start = time.Now()
	c2.Close()
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close while reconnecting took %v", took)
	}
	if _, err := c2.Namespace(1).ReadAt(make([]byte, 512), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("ReadAt after Close: %v", err)
	}
}
