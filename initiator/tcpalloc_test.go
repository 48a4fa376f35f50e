package initiator

import (
	"testing"
	"time"
)

// The NVMe/TCP asynchronous path allocates nothing in the steady state
// either — submit → sender's writev → fake → receiver → callback — for
// writes in the capsule, writes answered with R2T/H2CData, and reads, with
// and without digests (host and fake in one process: the fake is held to
// it too). So do the blocking calls.
func TestTCPZeroAllocIO(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, dc := range digestCases {
		t.Run(dc.name, func(t *testing.T) {
			f := newTCPFake(t, testNQN)
			f.maxH2C = 8192 // several H2CData per R2T
			f.start()
			cfg := tcpTestConfig(t)
			cfg.KATO = time.Minute
			cfg.HeaderDigest, cfg.DataDigest = dc.header, dc.data
			c := connectTCPFake(t, f, cfg)
			checkZeroAllocIO(t, c.Namespace(1))
		})
	}
}

// tcpWires returns the I/O queues' TCP wires of the live association.
func tcpWires(c *Controller) []*tcpWire {
	var ws []*tcpWire
	for _, q := range c.assoc.Load().io {
		ws = append(ws, q.w.(*tcpWire))
	}
	return ws
}

// BenchmarkTCPQueue drives one NVMe/TCP I/O queue against the fake over
// 127.0.0.1 at queue depth 16 through the asynchronous API: 4 KiB reads,
// 4 KiB writes (in the capsule) and 64 KiB writes (R2T). Besides
// allocs/op it reports writev/op (how well the sender batches), PDUs
// each way per op, and copies/op: user-space copies of the data, one per
// I/O by construction (caller ↔ slot; the socket's copy is the
// kernel's). Fast at -benchtime 1x.
func BenchmarkTCPQueue(b *testing.B) {
	for _, bc := range []struct {
		name  string
		write bool
		size  int
	}{{"read4k", false, 4096}, {"write4k", true, 4096}, {"write64k", true, 64 << 10}} {
		b.Run(bc.name, func(b *testing.B) {
			f := newTCPFake(b, testNQN)
			f.maxH2C = 128 << 10
			f.start()
			cfg := tcpTestConfig(b)
			cfg.Logf = func(string, ...any) {}
			cfg.Queues, cfg.QueueDepth, cfg.KATO = 1, 16, time.Minute
			c, err := Connect(ctxT(b), cfg, f.addr, f.subNQN)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ns := c.Namespace(1)
			const qd = 16
			bufs := make([][]byte, qd)
			for i := range bufs {
				bufs[i] = make([]byte, bc.size)
			}
			cb := &ioCounter{done: make(chan struct{}, qd)}
			blocks := bc.size / 512
			submit := func(i int) {
				lba := uint64(i*blocks) % (ns.Blocks() - uint64(blocks))
				var err error
				if bc.write {
					err = ns.WriteAsync(lba, bufs[i%qd], 0, cb)
				} else {
					err = ns.ReadAsync(lba, bufs[i%qd], cb)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; i < 4*qd; i++ { // warm up: goroutine stacks, socket buffers
				submit(i)
				<-cb.done
			}
			w := tcpWires(c)[0]
			writes0, out0, in0 := w.st.writes.Load(), w.st.pdusOut.Load(), w.st.pdusIn.Load()
			b.ReportAllocs()
			b.SetBytes(int64(bc.size))
			b.ResetTimer()
			n := 0
			for ; n < min(qd, b.N); n++ {
				submit(n)
			}
			for i := 0; i < b.N; i++ {
				<-cb.done
				if n < b.N {
					submit(n)
					n++
				}
			}
			b.StopTimer()
			if cb.errs != 0 {
				b.Fatalf("%d errors", cb.errs)
			}
			ops := float64(b.N)
			b.ReportMetric(float64(w.st.writes.Load()-writes0)/ops, "writev/op")
			b.ReportMetric(float64(w.st.pdusOut.Load()-out0)/ops, "PDUsOut/op")
			b.ReportMetric(float64(w.st.pdusIn.Load()-in0)/ops, "PDUsIn/op")
			b.ReportMetric(1, "copies/op")
		})
	}
}
