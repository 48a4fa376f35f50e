package initiator

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
)

// waitFor polls cond until it holds or the test's patience ends.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A target that stops answering Keep Alive is noticed within about KATO:
// the commands in flight fail with ErrConnectionLost caused by the Keep
// Alive timeout, and the controller reconnects (new CNTLID) once the
// target answers again.
func TestKeepAliveLoss(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	cfg.KATO = time.Second
	c := connectFake(t, f, cfg)
	ns := c.Namespace(1)

	waitFor(t, "keep-alives", 5*time.Second, func() bool { return f.kaCount.Load() >= 2 })
	f.holdIO.Store(true)
	f.muteKA.Store(true)
	done := make(DoneChan, 4)
	start := time.Now()
	if err := ns.ReadAsync(0, make([]byte, 512), done); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("keep-alive loss not detected")
	}
	took := time.Since(start)
	if !errors.Is(err, ErrConnectionLost) || !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "Keep Alive") {
		t.Fatalf("in-flight read: %v", err)
	}
	// A Keep Alive goes out within KATO/2 + tick of the last, and times
	// out KATO later: under 2×KATO plus scheduling slack.
	if took > 2*cfg.KATO+2*time.Second {
		t.Errorf("detected after %v (KATO %v)", took, cfg.KATO)
	}
	f.holdIO.Store(false)
	f.muteKA.Store(false)
	if err := c.WaitLive(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if c.CNTLID() != 2 {
		t.Errorf("CNTLID after reconnect %d", c.CNTLID())
	}
	p := bytes.Repeat([]byte{7}, 4096)
	if _, err := ns.WriteAt(p, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if _, err := ns.ReadAt(got, 4096); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("read after reconnect: %v", err)
	}
	if s := c.Stats(); s.Failures != 1 || s.Associations != 2 {
		t.Errorf("stats %+v", s)
	}
}

// An I/O the target never answers fails the association after IOTimeout.
func TestIOTimeout(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	cfg.IOTimeout = time.Second
	c := connectFake(t, f, cfg)
	f.holdIO.Store(true)
	done := make(DoneChan, 1)
	if err := c.Namespace(1).WriteAsync(0, make([]byte, 512), 0, done); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrConnectionLost) || !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "Write") {
			t.Fatalf("held write: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("I/O timeout not detected")
	}
	f.holdIO.Store(false)
	if err := c.WaitLive(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// When the connections drop and the target refuses to reconnect for a
// while, the controller retries with a doubling delay; an asynchronous
// submission meanwhile fails fast, a blocking one waits and succeeds once
// the target is back.
func TestReconnectBackoff(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	cfg.ReconnectDelay = 20 * time.Millisecond
	cfg.MaxReconnectDelay = 80 * time.Millisecond
	c := connectFake(t, f, cfg)
	ns := c.Namespace(1)

	f.refuseCM.Store(true)
	f.dropAll()
	waitFor(t, "reconnecting", 5*time.Second, func() bool { return c.State() == StateReconnecting })
	if err := ns.ReadAsync(0, make([]byte, 512), make(DoneChan, 1)); !errors.Is(err, ErrConnectionLost) {
		t.Errorf("async submission while reconnecting: %v", err)
	}
	result := make(chan error, 1)
	go func() {
		_, err := ns.WriteAt(bytes.Repeat([]byte{9}, 512), 512)
		result <- err
	}()
	// 20 + 40 + 80 + 80 ms: at least four attempts in ~400 ms.
	waitFor(t, "reconnect attempts", 5*time.Second, func() bool { return c.Stats().ReconnectAttempts >= 4 })
	select {
	case err := <-result:
		t.Fatalf("blocking write returned while reconnecting: %v", err)
	default:
	}
	f.refuseCM.Store(false)
	select {
	case err := <-result:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("blocking write did not finish after reconnect")
	}
	if c.State() != StateLive || f.disk(1)[512] != 9 {
		t.Errorf("state %v", c.State())
	}
}

// Past CtrlLossTimeout the controller is lost for good.
func TestControllerLossTimeout(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	cfg.CtrlLossTimeout = 300 * time.Millisecond
	c := connectFake(t, f, cfg)
	ns := c.Namespace(1)
	f.refuseCM.Store(true)
	f.dropAll()
	start := time.Now()
	_, err := ns.ReadAt(make([]byte, 512), 0)
	if !errors.Is(err, ErrControllerLost) {
		t.Fatalf("read: %v", err)
	}
	if took := time.Since(start); took > cfg.CtrlLossTimeout+cfg.ConnectTimeout {
		t.Errorf("lost after %v", took)
	}
	if c.State() != StateLost || !ns.Removed() || len(c.Namespaces()) != 0 {
		t.Errorf("state %v, removed %v", c.State(), ns.Removed())
	}
	if err := ns.ReadAsync(0, make([]byte, 512), make(DoneChan, 1)); !errors.Is(err, ErrNamespaceRemoved) {
		t.Errorf("async after loss: %v", err)
	}
	if err := c.WaitLive(ctxT(t)); !errors.Is(err, ErrControllerLost) {
		t.Errorf("WaitLive: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
}

// A reconnect whose Connect is refused with Do Not Retry stops at once.
func TestReconnectStopsOnDNR(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	c := connectFake(t, f, cfg)
	f.refuseDNR.Store(true)
	f.dropAll()
	waitFor(t, "lost", 10*time.Second, func() bool { return c.State() == StateLost })
	err := c.WaitLive(ctxT(t))
	var se *StatusError
	if !errors.Is(err, ErrControllerLost) || !errors.As(err, &se) || se.Status.Code() != nvme.StatusConnectInvalidHost || !se.DNR() {
		t.Fatalf("WaitLive: %v", err)
	}
	if n := c.Stats().ReconnectAttempts; n != 1 {
		t.Errorf("%d reconnect attempts, want 1", n)
	}
}

// The first connect is not retried: its errors come back.
func TestConnectErrors(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)

	f.refuseDNR.Store(true)
	_, err := Connect(ctxT(t), cfg, f.addr, testNQN)
	var se *StatusError
	if !errors.As(err, &se) || se.Command != "Connect" || !strings.Contains(err.Error(), "Connect Invalid Host") {
		t.Fatalf("refused connect: %v", err)
	}
	f.refuseDNR.Store(false)

	_, err = Connect(ctxT(t), cfg, f.addr, "nqn.2024-01.io.blk:other")
	if !errors.As(err, &se) || se.Status.Code() != nvme.StatusConnectInvalidParameters || !strings.Contains(err.Error(), "data offset 256") {
		t.Fatalf("unknown subsystem: %v", err)
	}

	f.refuseCM.Store(true)
	_, err = Connect(ctxT(t), cfg, f.addr, testNQN)
	if err == nil || !strings.Contains(err.Error(), "no resources") {
		t.Fatalf("CM reject: %v", err)
	}
	f.refuseCM.Store(false)

	// A controller whose Identify lacks keyed SGL support is refused.
	f.mu.Lock()
	f.sgls = 0x1
	f.mu.Unlock()
	_, err = Connect(ctxT(t), cfg, f.addr, testNQN)
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "keyed SGL") {
		t.Fatalf("no keyed SGLs: %v", err)
	}
	f.mu.Lock()
	f.sgls = 0x00100005
	f.mu.Unlock()

	if _, err := Connect(ctxT(t), Config{}, f.addr, testNQN); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("no adapter: %v", err)
	}
}

// A Send with Invalidate of a static key is a protocol error: the
// association fails (the soft provider refuses to invalidate a region
// that was not fast-registered and terminates the connection), and the
// controller recovers when the target behaves again.
func TestRemoteInvalidationFailsAssociation(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	c := connectFake(t, f, cfg)
	f.invalidate.Store(true)
	done := make(DoneChan, 1)
	if err := c.Namespace(1).ReadAsync(0, make([]byte, 4096), done); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("read answered with invalidate: %v", err)
	}
	f.invalidate.Store(false)
	if err := c.WaitLive(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Namespace(1).ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
}

// A namespace attribute notice makes the host read the changed list and
// rescan; the AER is re-armed.
func TestNamespaceChangeEvent(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	c := connectFake(t, f, testConfig(t))
	waitFor(t, "AER", 5*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.aers) == 1
	})
	f.addNamespace(2, 4096)
	waitFor(t, "namespace 2", 5*time.Second, func() bool { return c.Namespace(2) != nil })
	if ns := c.Namespace(2); ns.Blocks() != 4096 {
		t.Errorf("namespace 2 blocks %d", ns.Blocks())
	}
	waitFor(t, "AER re-armed", 5*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.aers) == 1
	})
	tr := strings.Join(f.transcript(), ",")
	if !strings.Contains(tr, "Get Log Page 0x4") {
		t.Errorf("changed namespace log not read: %s", tr)
	}
}

func TestDiscover(t *testing.T) {
	f := newFakeTarget(t, nvme.DiscoveryNQN)
	for i, nqn := range []string{"nqn.2024-01.io.blk:a", "nqn.2024-01.io.blk:b", "nqn.2024-01.io.blk:c", "nqn.2024-01.io.blk:d", "nqn.2024-01.io.blk:e"} {
		e := nvme.DiscoveryLogEntry{TrType: nvme.TrTypeRDMA, AdrFam: nvme.AdrFamIPv4, SubType: nvme.SubTypeNVM, PortID: uint16(i), CNTLID: 0xFFFF, ASQSZ: 32}
		e.SubNQN, _ = nvme.MakeNQNField(nqn)
		e.SetTrAddr("127.0.0.1")
		e.SetTrSvcID("4420")
		e.SetRDMATSAS(nvme.RDMATSAS{QPType: nvme.RDMAQPTypeConnected, PrType: nvme.RDMAPrTypeIWARP, CMS: nvme.RDMACMSRDMACM})
		f.entries = append(f.entries, e)
	}
	f.bumpGen = 2 // the log changes while the first entries are read
	f.start()
	cfg := testConfig(t)
	got, err := Discover(ctxT(t), cfg, f.addr)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 || !got[4].SubNQN.Equal("nqn.2024-01.io.blk:e") || got[2].PortID != 2 || got[0].RDMATSAS().PrType != nvme.RDMAPrTypeIWARP {
		t.Fatalf("entries: %d %+v", len(got), got)
	}
	if f.shutdowns.Load() != 1 {
		t.Errorf("discovery controller not shut down")
	}
	// KATO 0, no I/O queues, no Number of Queues; the log read twice
	// (GENCTR changed), each as header, 4 KiB + 1 KiB of entries, header.
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.cmReqs) != 1 || binary16(f.sqes[0][48:]) != 0 {
		t.Errorf("%d queues, KATO %d", len(f.cmReqs), binary16(f.sqes[0][48:]))
	}
	logs := 0
	for _, s := range f.admin {
		if s == "Get Log Page 0x70" {
			logs++
		}
		if strings.HasPrefix(s, "Set Features") {
			t.Errorf("discovery sent %s", s)
		}
	}
	if logs != 8 {
		t.Errorf("%d log reads, want 8", logs)
	}
}

func binary16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }

// Without OAES bit 8 the host arms no AER; Rescan finds added and removed
// namespaces, and I/O to a removed one fails.
func TestRescanWithoutAEN(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.oaes = 0
	f.start()
	c := connectFake(t, f, testConfig(t))
	for _, s := range f.transcript() {
		if s == "Set Features 0xb" || strings.HasPrefix(s, "Asynchronous Event") {
			t.Errorf("sent %s without OAES", s)
		}
	}
	f.addNamespace(2, 64)
	if err := c.Rescan(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	ns2 := c.Namespace(2)
	if ns2 == nil || ns2.Blocks() != 64 || len(c.Namespaces()) != 2 {
		t.Fatalf("after adding: %v", c.Namespaces())
	}
	f.mu.Lock()
	delete(f.ns, 2)
	f.mu.Unlock()
	if err := c.Rescan(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if c.Namespace(2) != nil || !ns2.Removed() {
		t.Fatal("namespace 2 still present")
	}
	if _, err := ns2.ReadAt(make([]byte, 512), 0); !errors.Is(err, ErrNamespaceRemoved) {
		t.Errorf("read from a removed namespace: %v", err)
	}
}

// A Connect the target never answers (Linux siw as responder can lose a
// connection's first FPDU) makes the association anew, for the admin
// queue and for an I/O queue alike, and the connect succeeds; a target
// that never answers still fails the connect after connectAttempts.
func TestUnansweredConnectRetried(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	cfg.ConnectTimeout = 300 * time.Millisecond

	f.dropAdminConnects.Store(2)
	f.dropIOConnects.Store(1)
	c, err := Connect(ctxT(t), cfg, f.addr, testNQN)
	if err != nil {
		t.Fatalf("connect with lost Connects: %v", err)
	}
	if n := c.Stats().ConnectRetries; n != 3 {
		t.Errorf("%d connect retries, want 3", n)
	}
	buf := make([]byte, 4096)
	if _, err := c.Namespace(1).WriteAt(buf, 0); err != nil {
		t.Errorf("write after the retried connect: %v", err)
	}
	c.Close()

	f.dropAdminConnects.Store(connectAttempts)
	_, err = Connect(ctxT(t), cfg, f.addr, testNQN)
	if !errors.Is(err, errConnectUnanswered) || !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("connect to a target that never answers: %v", err)
	}
	f.dropAdminConnects.Store(0)

	// Discovery takes the same path.
	d := newFakeTarget(t, nvme.DiscoveryNQN)
	d.start()
	d.dropAdminConnects.Store(1)
	if _, err := Discover(ctxT(t), cfg, d.addr); err != nil {
		t.Fatalf("discover with a lost Connect: %v", err)
	}
}

// Down is closed when the association in use fails, not before; after
// the reconnect, Down is the new association's, open again.
func TestDown(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	cfg.ReconnectDelay = 10 * time.Millisecond
	c := connectFake(t, f, cfg)
	down := c.Down()
	select {
	case <-down:
		t.Fatal("Down closed while live")
	default:
	}
	f.dropAll()
	select {
	case <-down:
	case <-time.After(10 * time.Second):
		t.Fatal("Down not closed after the connection dropped")
	}
	if err := c.WaitLive(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Down():
		t.Fatalf("Down of the new association closed (state %v)", c.State())
	default:
	}
	c.Close()
	select {
	case <-c.Down():
	default:
		t.Fatal("Down open after Close")
	}
}

// With NoReconnect, the association's first failure loses the controller:
// Down closes, the state is Lost, I/O fails with ErrControllerLost, and
// no reconnect is tried although the target would take one.
func TestNoReconnect(t *testing.T) {
	f := newFakeTarget(t, testNQN)
	f.start()
	cfg := testConfig(t)
	cfg.IOTimeout = time.Second
	cfg.NoReconnect = true
	c := connectFake(t, f, cfg)
	down := c.Down()
	ns := c.Namespace(1)
	f.holdIO.Store(true)
	done := make(DoneChan, 1)
	if err := ns.WriteAsync(0, make([]byte, 512), 0, done); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrConnectionLost) {
			t.Fatalf("held write: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("I/O timeout not detected")
	}
	f.holdIO.Store(false)
	select {
	case <-down:
	case <-time.After(10 * time.Second):
		t.Fatal("Down not closed")
	}
	waitFor(t, "the controller lost", 5*time.Second, func() bool { return c.State() == StateLost })
	time.Sleep(2 * cfg.ReconnectDelay)
	if _, err := ns.WriteAt(make([]byte, 512), 0); !errors.Is(err, ErrControllerLost) && !errors.Is(err, ErrNamespaceRemoved) {
		t.Fatalf("write after the loss: %v, want ErrControllerLost", err)
	}
	if s := c.Stats(); s.Associations != 1 || s.ReconnectAttempts != 0 {
		t.Errorf("stats %+v: want one association, no reconnect attempt", s)
	}
}
