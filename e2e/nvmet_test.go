//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme/auth"
	"github.com/blk-project/blk/transport/soft"
)

// TestInitiatorToLinuxTarget is scenario 2: blk's initiator library (in
// this test process, on the soft iWARP provider) against the Linux kernel's
// nvmet-rdma over siw in a guest, reached through QEMU's forward of a host
// loopback port. Several associations in a row (each: discover, connect,
// a seeded pattern of mixed-size writes, flush, read back equal, close), as
// each one meets siw's responder right after its MPA reply — every other
// round without the soft provider's pause before the first FPDU, so that
// siw loses Connects and the initiator's answer timeout and new
// association must carry it; then two more over NVMe/TCP against the same
// subsystem on nvmet-tcp (the second with header and data digests); then
// the guest checks that its RAM disk holds exactly what the initiator
// wrote.
func TestInitiatorToLinuxTarget(t *testing.T) {
	s := newScenario(t)
	const (
		nqn      = "nqn.2026-11.io.blk:e2e-nvmet"
		hostNQN  = "nqn.2026-11.io.blk:e2e-initiator"
		ramBytes = 64 << 20
		imageMiB = 16
		rounds   = 6
		// tcpRounds follow over NVMe/TCP (nvmet-tcp on the guest's
		// port 4421): without digests, then with header and data
		// digests.
		tcpRounds = 2
	)
	fwd, tcpFwd := 24201, 24202
	// nvmet (rebuilt with CONFIG_NVME_TARGET_AUTH) makes this host
	// authenticate with DH-HMAC-CHAP: every association does, the odd ones
	// bidirectionally.
	var keys [3]auth.Key
	for i := range keys {
		var err error
		if keys[i], err = auth.GenerateKey(auth.SHA256, 32); err != nil {
			t.Fatal(err)
		}
	}
	secret, ctrlSecret, wrong := keys[0].Encode(), keys[1].Encode(), keys[2].Encode()
	s.setEnv("NQN", nqn, "HOSTNQN", hostNQN, "IMAGE_MIB", strconv.Itoa(imageMiB), "AUTHSECRET", secret, "AUTHCTRLSECRET", ctrlSecret)
	s.script("nvmet.sh")
	g := s.boot(vmConfig{name: "target1", script: "nvmet.sh", timeout: 12 * time.Minute,
		hostFwd: []string{"127.0.0.1:" + strconv.Itoa(fwd) + "-:4420", "127.0.0.1:" + strconv.Itoa(tcpFwd) + "-:4421"}})
	s.waitMark("target-ready", g, 3*time.Minute)

	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("BLK_E2E_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("pattern seed %d (BLK_E2E_SEED=%d repeats it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	image := make([]byte, imageMiB<<20)
	rdmaTarget, tcpTarget := "127.0.0.1:"+strconv.Itoa(fwd), "127.0.0.1:"+strconv.Itoa(tcpFwd)
	sizes := []int{512, 4096, 8192, 61440, 128 << 10, 1 << 20}

	for round := 1; round <= rounds+tcpRounds; round++ {
		pause, pauseName := time.Duration(0), soft.DefaultFirstFPDUDelay.String() // 0: the default
		if round%2 == 0 {
			pause, pauseName = -1, "none"
		}
		cfg := initiator.Config{HostNQN: hostNQN, Queues: 1, QueueDepth: 32,
			ConnectTimeout: 30 * time.Second, Logf: t.Logf, DHCHAPSecret: secret}
		target := rdmaTarget
		closeNIC := func() {}
		if round > rounds {
			// NVMe/TCP: no adapter; the second TCP round asks for both
			// digests, which nvmet-tcp grants.
			cfg.Transport, target = initiator.TransportTCP, tcpTarget
			cfg.HeaderDigest, cfg.DataDigest = round == rounds+2, round == rounds+2
			pauseName = fmt.Sprintf("none (NVMe/TCP, digests %v)", cfg.HeaderDigest)
		} else {
			nic, err := soft.New(soft.Config{FirstFPDUDelay: pause})
			if err != nil {
				t.Fatal(err)
			}
			cfg.Adapter = nic
			closeNIC = func() { nic.Close() }
		}
		if round%2 == 1 {
			cfg.DHCHAPCtrlSecret = ctrlSecret
		}
		if round == 1 {
			// Refused first: no secret, a wrong one, a controller that
			// does not hold the controller secret.
			for _, bad := range []struct{ name, host, ctrl string }{{"no secret", "", ""}, {"a wrong secret", wrong, ""}, {"a wrong controller secret", secret, wrong}} {
				c := cfg
				c.DHCHAPSecret, c.DHCHAPCtrlSecret = bad.host, bad.ctrl
				bctx, bcancel := context.WithTimeout(context.Background(), 2*time.Minute)
				ctrl, err := initiator.Connect(bctx, c, target, nqn)
				bcancel()
				if err == nil {
					ctrl.Close()
					t.Fatalf("Linux nvmet accepted %s", bad.name)
				}
				if !errors.Is(err, initiator.ErrAuthRequired) {
					t.Fatalf("%s: %v, want ErrAuthRequired", bad.name, err)
				}
				t.Logf("refused with %s: %v", bad.name, err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)

		start := time.Now()
		entries, err := initiator.Discover(ctx, cfg, target)
		if err != nil {
			cancel()
			t.Fatalf("round %d: discover: %v", round, err)
		}
		found := false
		for _, e := range entries {
			if e.SubNQN.Equal(nqn) {
				found = true
			}
		}
		if !found {
			t.Fatalf("round %d: the discovery log %+v lacks %s", round, entries, nqn)
		}
		discovered := time.Since(start)

		start = time.Now()
		ctrl, err := initiator.Connect(ctx, cfg, target, nqn)
		if err != nil {
			cancel()
			t.Fatalf("round %d: connect: %v", round, err)
		}
		connected := time.Since(start)
		ns := ctrl.Namespace(1)
		if ns == nil || ns.Size() != ramBytes {
			t.Fatalf("round %d: namespace 1 %v, want %d bytes", round, ns, ramBytes)
		}

		// A seeded pattern of mixed sizes at block-aligned offsets.
		start = time.Now()
		written := 0
		for i := 0; i < 24; i++ {
			n := sizes[rng.IntN(len(sizes))]
			off := rng.IntN((len(image)-n)/512+1) * 512
			chunk := image[off : off+n]
			for j := range chunk {
				chunk[j] = byte(rng.Uint32())
			}
			if _, err := ns.WriteAt(chunk, int64(off)); err != nil {
				t.Fatalf("round %d: write %d bytes at %d: %v", round, n, off, err)
			}
			written += n
		}
		if err := ns.Flush(); err != nil {
			t.Fatalf("round %d: flush: %v", round, err)
		}
		got := make([]byte, len(image))
		for off := 0; off < len(got); off += 1 << 20 {
			if _, err := ns.ReadAt(got[off:off+1<<20], int64(off)); err != nil {
				t.Fatalf("round %d: read at %d: %v", round, off, err)
			}
		}
		if !bytes.Equal(got, image) {
			for i := range got {
				if got[i] != image[i] {
					t.Fatalf("round %d: read back differs first at byte %d (seed %d)", round, i, seed)
				}
			}
		}
		t.Logf("round %d (first-FPDU pause %s): discover %v, connect %v (%d Connects lost and retried), %d KiB written in 24 writes + flush, %d MiB read back equal in %v",
			round, pauseName, discovered.Round(time.Millisecond), connected.Round(time.Millisecond),
			ctrl.Stats().ConnectRetries, written>>10, imageMiB, time.Since(start).Round(time.Millisecond))
		if err := ctrl.Close(); err != nil {
			t.Errorf("round %d: close: %v", round, err)
		}
		if round > rounds {
			if tr := ctrl.Info().Transport; tr != initiator.TransportTCP {
				t.Errorf("round %d: the controller's transport is %q, want tcp", round, tr)
			}
		}
		cancel()
		closeNIC()
	}

	if err := os.WriteFile(s.path("expected.img"), image, 0o644); err != nil {
		t.Fatal(err)
	}
	s.mark("host-done")
	s.wait(g)
}
