package tcp_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target/tcp"
)

// The flood: one source address (127.0.0.2, which Linux lets a socket
// bind to on loopback) tries to create floodDiscovery discovery
// controllers and opens floodIdle connections that never send a byte,
// and keeps at it while the allowed host (127.0.0.1) connects,
// disconnects and reconnects floodCycles times.
const (
	floodDiscovery = 5000
	floodIdle      = 2000
	floodCycles    = 20
	// floodWorkers bounds the attacker's connections in flight at once.
	floodWorkers = 64
	attackerNQN  = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000ee"
)

var attackerIP = net.IPv4(127, 0, 0, 2)

// attacker is the flooding peer: every connection it opens comes from
// attackerIP, and it keeps every controller it gets and every idle
// connection the target leaves open.
type attacker struct {
	t    *testing.T
	addr string
	d    net.Dialer

	mu   sync.Mutex
	held []net.Conn

	controllers atomic.Int64 // discovery controllers it got
	busy        atomic.Int64 // Connects answered Controller Busy
	busyDNR     atomic.Int64 // of them with DNR
	resets      atomic.Int64 // connections the target closed on it
}

func newAttacker(t *testing.T, addr string) *attacker {
	a := &attacker{t: t, addr: addr, d: net.Dialer{LocalAddr: &net.TCPAddr{IP: attackerIP}, Timeout: rawTimeout}}
	t.Cleanup(a.closeAll)
	return a
}

func (a *attacker) hold(nc net.Conn) {
	a.mu.Lock()
	a.held = append(a.held, nc)
	a.mu.Unlock()
}

func (a *attacker) closeAll() { a.closeFrom(0) }

// closeFrom closes the connections held since it held n.
func (a *attacker) closeFrom(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, nc := range a.held[n:] {
		nc.Close()
	}
	a.held = a.held[:n]
}

func (a *attacker) holding() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.held)
}

// discovery makes n discovery Connect attempts on floodWorkers
// connections: a Connect that gets a controller keeps its connection
// (held until the end), one refused is retried on the same connection
// (its queue has no controller: the protocol allows another Connect),
// and a connection the target closes is replaced.
func (a *attacker) discovery(n int) {
	shareOut(n, func(next func() bool) {
		var h *rawHost
		for next() {
			if h == nil {
				nc, err := a.d.Dial("tcp", a.addr)
				if err != nil {
					a.resets.Add(1)
					continue
				}
				a.hold(nc)
				h = &rawHost{t: a.t, nc: nc}
				if _, err := h.icreq(nvme.TCPICReqPDU{}); err != nil {
					a.resets.Add(1)
					h = nil
					continue
				}
			}
			cmd, data := connectCapsule(0, 31, 0, nvme.CNTLIDDynamic, nvme.DiscoveryNQN, attackerNQN)
			res, err := h.exchange(cmd, data, nil, nil)
			switch {
			case err != nil:
				a.resets.Add(1)
				h = nil
			case res.rsp.Status == 0:
				a.controllers.Add(1)
				h = nil // the controller keeps this connection
			case res.rsp.Status.Code() == nvme.StatusConnectControllerBusy:
				a.busy.Add(1)
				if res.rsp.Status.DNR() {
					a.busyDNR.Add(1)
				}
			}
		}
	})
}

// idle opens n connections that send nothing, floodWorkers at a time,
// and holds those the target keeps open.
func (a *attacker) idle(n int) {
	shareOut(n, func(next func() bool) {
		for next() {
			nc, err := a.d.Dial("tcp", a.addr)
			if err != nil {
				a.resets.Add(1)
				continue
			}
			a.hold(nc)
		}
	})
}

// shareOut runs work on floodWorkers goroutines that share n attempts:
// each calls next before an attempt, which says whether one is left.
func shareOut(n int, work func(next func() bool)) {
	var left atomic.Int64
	left.Store(int64(n))
	next := func() bool { return left.Add(-1) >= 0 }
	var wg sync.WaitGroup
	for range floodWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(next)
		}()
	}
	wg.Wait()
}

// connectCapsule is a Connect command and its data, for host to sub.
func connectCapsule(qid, sqsize uint16, kato uint32, cntlid uint16, sub, host string) (nvme.Command, []byte) {
	var d nvme.ConnectData
	d.HostID = [16]byte{0xee}
	d.CNTLID = cntlid
	d.SubNQN, _ = nvme.MakeNQNField(sub)
	d.HostNQN, _ = nvme.MakeNQNField(host)
	data := make([]byte, nvme.ConnectDataSize)
	d.Marshal((*[nvme.ConnectDataSize]byte)(data))
	var cmd nvme.Command
	(&nvme.ConnectCommand{QID: qid, SQSize: sqsize, KATO: kato}).Encode(&cmd)
	return cmd, data
}

// goodCycle is the allowed host's connect: an admin queue, enabled, an
// I/O queue, a write and its read-back, then both connections closed.
// Any refusal, reset or failure is an error.
func goodCycle(t *testing.T, addr string, cycle int) error {
	step := func(what string, h *rawHost, cmd nvme.Command, inline, rbuf []byte) (nvme.Completion, error) {
		res, err := h.exchange(cmd, inline, nil, rbuf)
		if err != nil {
			return res.rsp, fmt.Errorf("%s: %w", what, err)
		}
		if res.rsp.Status != 0 {
			return res.rsp, fmt.Errorf("%s: status %v", what, res.rsp.Status)
		}
		return res.rsp, nil
	}
	dial := func() (*rawHost, error) {
		nc, err := net.DialTimeout("tcp", addr, rawTimeout)
		if err != nil {
			return nil, err
		}
		h := &rawHost{t: t, nc: nc}
		if _, err := h.icreq(nvme.TCPICReqPDU{}); err != nil {
			nc.Close()
			return nil, fmt.Errorf("ICReq (connection reset by the target?): %w", err)
		}
		return h, nil
	}
	admin, err := dial()
	if err != nil {
		return fmt.Errorf("admin queue: %w", err)
	}
	defer admin.nc.Close()
	cmd, data := connectCapsule(0, 31, 5000, nvme.CNTLIDDynamic, testSubNQN, testHostNQN)
	rsp, err := step("admin Connect", admin, cmd, data, nil)
	if err != nil {
		return err
	}
	cntlid := nvme.ConnectResponseCNTLID(rsp.DW0)
	cc := nvme.MakeCC(nvme.CCFields{EN: true, IOSQES: 6, IOCQES: 4})
	if _, err := step("Property Set CC", admin, propSet(nvme.PropCC, uint64(cc)), nil, nil); err != nil {
		return err
	}
	var sf nvme.Command
	(&nvme.FeatureCommand{FID: nvme.FeatureNumQueues, CDW11: nvme.NumQueues(1, 1)}).EncodeSet(&sf)
	if _, err := step("Set Features", admin, sf, nil, nil); err != nil {
		return err
	}
	io, err := dial()
	if err != nil {
		return fmt.Errorf("I/O queue: %w", err)
	}
	defer io.nc.Close()
	cmd, data = connectCapsule(1, 31, 0, cntlid, testSubNQN, testHostNQN)
	if _, err := step("I/O Connect", io, cmd, data, nil); err != nil {
		return err
	}
	want := pattern(testBlock, byte(cycle))
	lba := uint64(cycle)
	if _, err := step("write", io, rw(nvme.IOWrite, 1, lba, 1), want, nil); err != nil {
		return err
	}
	got := make([]byte, testBlock)
	if _, err := step("read", io, rw(nvme.IORead, 1, lba, 1), nil, got); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return errors.New("read back other data than written")
	}
	return nil
}

// TestFloodNeverRefusesAllowedHost (issue 21 case 3): a peer that
// floods the port with discovery controllers and idle connections from
// one address does not lock the allowed host out. With the target's
// and the port's defaults, the flood gets what its own budgets give it
// (MaxDiscoveryPerSource controllers, MaxPendingPerSource idle
// connections), its refusals are Controller Busy without DNR, and the
// allowed host connects, writes, reads and disconnects floodCycles times
// without a single refusal while the attacker keeps flooding.
func TestFloodNeverRefusesAllowedHost(t *testing.T) {
	tt := newTestTarget(t, tcp.Config{})
	start := time.Now()
	a := newAttacker(t, tt.addr)
	a.discovery(floodDiscovery)
	a.idle(floodIdle)
	t.Logf("flood: %d discovery Connects and %d idle connections in %v: %d controllers, %d busy (%d with DNR), %d connections closed by the target",
		floodDiscovery, floodIdle, time.Since(start).Round(time.Millisecond), a.controllers.Load(), a.busy.Load(), a.busyDNR.Load(), a.resets.Load())

	// The attacker keeps at it while the allowed host cycles: it keeps
	// what the flood got, and opens, tries and closes more (closing them
	// bounds the test's descriptors; the target sees them come again).
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		base := a.holding()
		for {
			select {
			case <-stop:
				return
			default:
			}
			a.discovery(floodWorkers)
			a.idle(floodWorkers)
			a.closeFrom(base)
		}
	}()
	for i := range floodCycles {
		if err := goodCycle(t, tt.addr, i); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("allowed host, cycle %d of %d, during the flood: %v (target %+v, port rejected %d)",
				i+1, floodCycles, err, budgetStats(tt), tt.port.Stats().Rejected)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))

	// Each budget did the refusing, without DNR.
	if n := a.busyDNR.Load(); n != 0 {
		t.Errorf("%d of the attacker's Connects were refused with DNR: a host would give up for good", n)
	}
	st := tt.t.Stats()
	if st.BusyDiscoverySource == 0 || a.controllers.Load() > int64(tt.t.Config().MaxDiscoveryPerSource)+int64(st.DiscoveryIdle) {
		t.Errorf("the attacker got %d discovery controllers (%s)", a.controllers.Load(), budgetStats(tt))
	}
	if ps := tt.port.Stats(); ps.RejectedSource == 0 {
		t.Errorf("no connection refused for MaxPendingPerSource: %+v", ps)
	}
}

func budgetStats(tt *testTarget) string {
	st := tt.t.Stats()
	return fmt.Sprintf("controllers %d, discovery %d, busy: controllers %d, discovery %d, per source %d",
		st.Controllers, st.DiscoveryControllers, st.BusyControllers, st.BusyDiscovery, st.BusyDiscoverySource)
}
