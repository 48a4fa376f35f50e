package initiator

import (
	"bytes"
	"errors"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
)

// An ICResp the Linux host would refuse fails Connect with ErrProtocol
// (no answer at all: ErrTimeout), and no controller is left behind.
func TestTCPICRespChecks(t *testing.T) {
	cases := []struct {
		name string
		mod  func(r *nvme.TCPICRespPDU, b *[nvme.TCPICSize]byte) []byte
		want error
		msg  string
	}{
		{"PFV", func(r *nvme.TCPICRespPDU, b *[128]byte) []byte { r.PFV = 1; r.Marshal(b); return b[:] }, ErrProtocol, "PFV 1"},
		{"DGST not echoed", func(r *nvme.TCPICRespPDU, b *[128]byte) []byte { r.DGST ^= 3; r.Marshal(b); return b[:] }, ErrProtocol, "digests"},
		{"CPDA", func(r *nvme.TCPICRespPDU, b *[128]byte) []byte { r.CPDA = 1; r.Marshal(b); return b[:] }, ErrProtocol, "CPDA"},
		{"MAXH2CDATA small", func(r *nvme.TCPICRespPDU, b *[128]byte) []byte { r.MaxH2CData = 2048; r.Marshal(b); return b[:] }, ErrProtocol, "MAXH2CDATA"},
		{"MAXH2CDATA odd", func(r *nvme.TCPICRespPDU, b *[128]byte) []byte { r.MaxH2CData = 8190; r.Marshal(b); return b[:] }, ErrProtocol, "MAXH2CDATA"},
		{"type", func(r *nvme.TCPICRespPDU, b *[128]byte) []byte { b[0] = nvme.TCPCapsuleResp; return b[:] }, ErrProtocol, "type"},
		{"PLEN", func(r *nvme.TCPICRespPDU, b *[128]byte) []byte { b[4] = 129; return b[:] }, ErrProtocol, "PLEN"},
		{"silent", func(r *nvme.TCPICRespPDU, b *[128]byte) []byte { return nil }, ErrTimeout, "no ICResp"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newTCPFake(t, testNQN)
			f.icResp = tc.mod
			f.start()
			cfg := tcpTestConfig(t)
			cfg.HeaderDigest = true
			cfg.ConnectTimeout = 300 * time.Millisecond
			_, err := Connect(ctxT(t), cfg, f.addr, f.subNQN)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("connect: %v, want %v with %q", err, tc.want, tc.msg)
			}
		})
	}
}

// tcpRig is a controller connected over TCP to a fake, for fault tests.
type tcpRig struct {
	f  *tcpFake
	c  *Controller
	ns *Namespace
}

func newTCPRig(t *testing.T, hd, dd bool, mod func(*tcpFake)) *tcpRig {
	f := newTCPFake(t, testNQN)
	if mod != nil {
		mod(f)
	}
	f.start()
	cfg := tcpTestConfig(t)
	cfg.HeaderDigest, cfg.DataDigest = hd, dd
	cfg.Queues = 1
	c := connectTCPFake(t, f, cfg)
	return &tcpRig{f: f, c: c, ns: c.Namespace(1)}
}

// checkRecovers waits for the reconnect after a failure and checks I/O
// works on the new association.
func (r *tcpRig) checkRecovers(t *testing.T) {
	t.Helper()
	waitFor(t, "reconnect", 10*time.Second, func() bool {
		return r.c.Stats().Associations >= 2 && r.c.State() == StateLive
	})
	b := bytes.Repeat([]byte{0xA5}, 16<<10)
	if _, err := r.ns.WriteAt(b, 64<<10); err != nil {
		t.Fatalf("write after reconnect: %v", err)
	}
	got := make([]byte, len(b))
	if _, err := r.ns.ReadAt(got, 64<<10); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read after reconnect: %v", err)
	}
	if r.c.CNTLID() == 1 {
		t.Errorf("still CNTLID 1 after a reconnect")
	}
}

// Every protocol violation, a C2HTermReq and a connection closed in the
// middle of I/O fail the association: the command in flight completes
// with ErrConnectionLost (and ErrProtocol for violations), and the
// controller reconnects.
func TestTCPFatalFaults(t *testing.T) {
	cases := []struct {
		name   string
		hd, dd bool
		knob   func(f *tcpFake)
		write  bool // the faulty command is a 32 KiB write (R2T), else a read
		proto  bool
		msg    string
	}{
		{"header digest", true, false, func(f *tcpFake) { f.hdgstErr.Store(1) }, false, true, "header digest error"},
		{"header digest, data digest on", true, true, func(f *tcpFake) { f.hdgstErr.Store(1) }, true, true, "header digest error"},
		{"bad R2T", false, false, func(f *tcpFake) { f.badR2T.Store(1) }, true, true, "beyond its"},
		{"bad R2T with digests", true, true, func(f *tcpFake) { f.badR2T.Store(1) }, true, true, "beyond its"},
		{"unknown CID", false, false, func(f *tcpFake) { f.unknownCID.Store(1) }, false, true, "beyond depth"},
		{"C2HTermReq", false, false, func(f *tcpFake) { f.termReq.Store(1) }, false, true, "C2HTermReq (FES 0x2"},
		{"C2HTermReq with header digest", true, false, func(f *tcpFake) { f.termReq.Store(1) }, true, true, "C2HTermReq (FES 0x2"},
		{"closed mid-I/O", false, false, func(f *tcpFake) { f.closeMidIO.Store(1) }, true, false, "connection ended"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newTCPRig(t, tc.hd, tc.dd, nil)
			tc.knob(r.f)
			done := make(DoneChan, 1)
			var err error
			if tc.write {
				err = r.ns.WriteAsync(0, make([]byte, 32<<10), 0, done)
			} else {
				err = r.ns.ReadAsync(0, make([]byte, 4096), done)
			}
			if err != nil {
				t.Fatal(err)
			}
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the fault went unnoticed")
			}
			if !errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrProtocol) != tc.proto || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want ErrConnectionLost (protocol %v) with %q", err, tc.proto, tc.msg)
			}
			r.checkRecovers(t)
		})
	}
}

// A data digest error fails only its command, with Data Transfer Error;
// the association lives on.
func TestTCPDataDigestError(t *testing.T) {
	for _, success := range []bool{false, true} {
		r := newTCPRig(t, false, true, func(f *tcpFake) { f.success = success; f.c2hChunk = 4096 })
		if _, err := r.ns.WriteAt(bytes.Repeat([]byte{7}, 16<<10), 0); err != nil {
			t.Fatal(err)
		}
		r.f.ddgstErr.Store(1)
		done := make(DoneChan, 1)
		buf := make([]byte, 16<<10)
		if err := r.ns.ReadAsync(0, buf, done); err != nil {
			t.Fatal(err)
		}
		err := <-done
		var se *StatusError
		if !errors.As(err, &se) || se.Status.Code() != nvme.StatusDataTransferError {
			t.Fatalf("success %v: err = %v, want Data Transfer Error", success, err)
		}
		st := r.c.Stats()
		if st.DataDigestErrors != 1 || st.Failures != 0 || r.c.State() != StateLive {
			t.Fatalf("stats %+v, state %v", st, r.c.State())
		}
		if _, err := r.ns.ReadAt(buf, 0); err != nil || buf[100] != 7 {
			t.Fatalf("read after the digest error: %v", err)
		}
	}
}

// An error status before any R2T (a write refused outright) completes
// the write: the sender holds nothing of it.
func TestTCPWriteRefusedBeforeR2T(t *testing.T) {
	r := newTCPRig(t, false, false, nil)
	done := make(DoneChan, 1)
	last := r.ns.Blocks() - 64 // 32 KiB from here fits
	if err := r.ns.WriteAsync(last, make([]byte, 32<<10), 0, done); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Shrink the fake's namespace under the host: the next write is out
	// of range for the target, refused without an R2T.
	r.f.mu.Lock()
	r.f.ns[1] = r.f.ns[1][:len(r.f.ns[1])/2]
	r.f.mu.Unlock()
	if err := r.ns.WriteAsync(last, make([]byte, 32<<10), 0, done); err != nil {
		t.Fatal(err)
	}
	var se *StatusError
	if err := <-done; !errors.As(err, &se) || se.Status.Code() != nvme.StatusLBAOutOfRange {
		t.Fatalf("err = %v, want LBA Out of Range", err)
	}
	if r.c.Stats().Failures != 0 {
		t.Fatal("association failed")
	}
}

// Keep-alive loss over TCP is the supervisor's business, as over RDMA.
func TestTCPKeepAliveLoss(t *testing.T) {
	f := newTCPFake(t, testNQN)
	f.start()
	cfg := tcpTestConfig(t)
	cfg.KATO = time.Second
	cfg.Queues = 1
	c := connectTCPFake(t, f, cfg)
	waitFor(t, "keep-alives", 5*time.Second, func() bool { return f.kaCount.Load() >= 2 })
	f.muteKA.Store(true)
	waitFor(t, "failure", 10*time.Second, func() bool { return c.Stats().Failures >= 1 })
	f.muteKA.Store(false)
	r := &tcpRig{f: f, c: c, ns: c.Namespace(1)}
	r.checkRecovers(t)
}

// Discover over TCP reads the log; TCP entries keep their TSAS raw.
func TestTCPDiscover(t *testing.T) {
	f := newTCPFake(t, nvme.DiscoveryNQN)
	for i := 0; i < 5; i++ {
		e := nvme.DiscoveryLogEntry{TrType: nvme.TrTypeTCP, AdrFam: nvme.AdrFamIPv4, SubType: nvme.SubTypeNVM, PortID: uint16(i), CNTLID: 0xFFFF, ASQSZ: 32}
		e.SubNQN, _ = nvme.MakeNQNField("nqn.2024-01.io.blk:v" + string(rune('a'+i)))
		e.SetTrAddr("127.0.0.1")
		e.SetTrSvcID("4420")
		e.TSAS[0] = 1 // SECTYPE: none
		f.entries = append(f.entries, e)
	}
	f.bumpGen = 2
	f.start()
	cfg := tcpTestConfig(t)
	cfg.HeaderDigest = true
	got, err := Discover(ctxT(t), cfg, f.addr)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 || got[3].TrType != nvme.TrTypeTCP || got[4].TSAS[0] != 1 || !got[1].SubNQN.Equal("nqn.2024-01.io.blk:vb") {
		t.Fatalf("entries %+v", got)
	}
	if f.shutdowns.Load() != 1 || len(f.icReqs) != 1 {
		t.Errorf("%d shutdowns, %d connections", f.shutdowns.Load(), len(f.icReqs))
	}
	// Without a port, Discover over TCP goes to 8009, Connect to 4420.
	c, err := newController(cfg, "127.0.0.1", nvme.DiscoveryNQN, true)
	if err != nil || c.addr != "127.0.0.1:8009" {
		t.Errorf("discovery address %q, %v", c.addr, err)
	}
	c, err = newController(cfg, "127.0.0.1", testNQN, false)
	if err != nil || c.addr != "127.0.0.1:4420" {
		t.Errorf("address %q, %v", c.addr, err)
	}
}

// Seeded: concurrent writers and readers on disjoint regions, through
// the asynchronous and blocking paths, with the connections cut at
// random; every block read back equals what was last written.
func TestTCPStressWithFaults(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewSource(seed))
	hd, dd := rng.Intn(2) == 1, rng.Intn(2) == 1
	f := newTCPFake(t, testNQN)
	f.maxH2C = 4096 << rng.Intn(4)
	f.c2hChunk = uint32(4096 << rng.Intn(3))
	f.success = rng.Intn(2) == 1
	f.start()
	cfg := tcpTestConfig(t)
	cfg.HeaderDigest, cfg.DataDigest = hd, dd
	cfg.Queues, cfg.QueueDepth = 2, 8
	c := connectTCPFake(t, f, cfg)
	ns := c.Namespace(1)
	t.Logf("digests header %v data %v, MAXH2CDATA %d, C2HData %d, SUCCESS %v", hd, dd, f.maxH2C, f.c2hChunk, f.success)

	const workers = 4
	region := int(ns.Size()) / workers
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	stop := make(chan struct{})
	for w := 0; w < workers; w++ {
		wseed := rng.Int63()
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(wseed))
			base := w * region
			shadow := make([]byte, region)
			copy(shadow, f.disk(1)[base:base+region])
			buf := make([]byte, 64<<10)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := (1 + r.Intn(128)) * 512
				off := r.Intn(region-n) &^ 511
				if r.Intn(2) == 0 {
					r.Read(buf[:n])
					if _, err := ns.WriteAt(buf[:n], int64(base+off)); err != nil {
						errs <- err
						return
					}
					copy(shadow[off:], buf[:n])
				} else {
					if _, err := ns.ReadAt(buf[:n], int64(base+off)); err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(buf[:n], shadow[off:off+n]) {
						errs <- errors.New("read differs from what was written")
						return
					}
				}
			}
		}(w)
	}
	const drops = 5
	for i := 0; i < drops; i++ {
		time.Sleep(time.Duration(30+rng.Intn(70)) * time.Millisecond)
		f.dropAllTCP()
		waitFor(t, "reconnect", 10*time.Second, func() bool {
			return c.Stats().Associations >= uint64(i+2) && c.State() == StateLive
		})
	}
	time.Sleep(30 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := c.Stats()
	t.Logf("stats %+v", st)
	if st.Failures < drops {
		t.Errorf("%d failures for %d cuts", st.Failures, drops)
	}
}
