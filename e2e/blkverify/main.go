// Command blkverify is the e2e tests' initiator program: it connects to an
// NVMe-oF subsystem with blk's initiator library over the transport
// provider it is told (soft or verbs), writes a seeded pattern of mixed
// sizes, flushes, reads the region back and compares, for several
// associations in a row; it prints one line per association and exits 1
// on the first difference or error. The e2e scenarios run it in guests.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/transport/providers"
)

func main() {
	addr := flag.String("addr", "", "target address host:port")
	nqn := flag.String("nqn", "", "subsystem NQN")
	host := flag.String("hostnqn", "nqn.2026-11.io.blk:blkverify", "host NQN")
	prov := flag.String("provider", providers.Default, "transport provider: soft or verbs")
	dev := flag.String("device", "", "RDMA device of the verbs provider")
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()), "pattern seed")
	mib := flag.Int("mib", 16, "region written and read back, MiB from offset 0")
	rounds := flag.Int("rounds", 3, "associations in a row")
	flag.Parse()
	if err := run(*addr, *nqn, *host, *prov, *dev, *seed, *mib, *rounds); err != nil {
		fmt.Fprintf(os.Stderr, "blkverify: %v (seed %d)\n", err, *seed)
		os.Exit(1)
	}
}

func run(addr, nqn, host, prov, dev string, seed uint64, mib, rounds int) error {
	if addr == "" || nqn == "" {
		return fmt.Errorf("-addr and -nqn are required")
	}
	fmt.Printf("seed %d, provider %s %s\n", seed, prov, dev)
	rng := rand.New(rand.NewPCG(seed, 7))
	image := make([]byte, mib<<20)
	sizes := []int{4096, 8192, 61440, 128 << 10, 1 << 20}
	got := make([]byte, len(image))
	for round := 1; round <= rounds; round++ {
		nic, err := providers.Open(prov, providers.Options{Device: dev})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		start := time.Now()
		ctrl, err := initiator.Connect(ctx, initiator.Config{Adapter: nic, HostNQN: host, Queues: 1, QueueDepth: 32}, addr, nqn)
		cancel()
		if err != nil {
			nic.Close()
			return fmt.Errorf("round %d: connect: %w", round, err)
		}
		connected := time.Since(start)
		ns := ctrl.Namespace(1)
		if ns == nil || ns.Size() < int64(len(image)) {
			ctrl.Close()
			nic.Close()
			return fmt.Errorf("round %d: namespace 1 missing or smaller than %d MiB", round, mib)
		}
		start = time.Now()
		written := 0
		for i := 0; i < 32; i++ {
			n := sizes[rng.IntN(len(sizes))]
			off := rng.IntN((len(image)-n)/4096+1) * 4096
			chunk := image[off : off+n]
			for j := range chunk {
				chunk[j] = byte(rng.Uint32())
			}
			if _, err := ns.WriteAt(chunk, int64(off)); err != nil {
				return fmt.Errorf("round %d: write %d at %d: %w", round, n, off, err)
			}
			written += n
		}
		if err := ns.Flush(); err != nil {
			return fmt.Errorf("round %d: flush: %w", round, err)
		}
		for off := 0; off < len(got); off += 1 << 20 {
			if _, err := ns.ReadAt(got[off:off+1<<20], int64(off)); err != nil {
				return fmt.Errorf("round %d: read at %d: %w", round, off, err)
			}
		}
		if i := firstDiff(got, image); i >= 0 {
			return fmt.Errorf("round %d: read back differs first at byte %d", round, i)
		}
		st := ctrl.Stats()
		fmt.Printf("round %d: connect %v (%d Connects retried), %d KiB written, %d MiB read back equal in %v\n",
			round, connected.Round(time.Millisecond), st.ConnectRetries, written>>10, mib, time.Since(start).Round(time.Millisecond))
		ctrl.Close()
		nic.Close()
	}
	return nil
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
