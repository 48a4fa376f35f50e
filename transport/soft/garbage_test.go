package soft

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft/wire"
)

// TestGarbageFromPeer: after a correct MPA handshake, a raw TCP peer sends
// FPDUs mutated at random (lengths, control bits, opcodes, queue numbers,
// MSNs, offsets, STags, payload). The provider must neither panic nor
// hang: each connection either keeps working or ends with an error, and
// every posted receive completes exactly once.
func TestGarbageFromPeer(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("BLK_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (replay with BLK_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x9a4b))
	a, err := New(Config{PollGroup: benchPollGroup})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	pd, _ := a.CreatePD()
	ln, err := a.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	region := make([]byte, 64<<10)
	mr, _ := pd.RegisterMemory(region, transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead)
	iters := 150
	if testing.Short() {
		iters = 30
	}
	for it := 0; it < iters; it++ {
		cq, _ := a.CreateCQ(transport.CQConfig{Depth: 256, Affinity: -1})
		q, _ := pd.CreateQP(transport.QPConfig{ReceiveCQ: cq, InitiatorCQ: cq, ReceiveQueueDepth: 8, InitiatorQueueDepth: 8, MaxReceiveRequestSge: 2, MaxInitiatorRequestSge: 1})
		for i := 0; i < 4; i++ {
			q.PostReceive(i, []transport.SGE{mr.SGE(uint32(i)*1024, 512), mr.SGE(uint32(i)*1024+512, 512)})
		}
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		crc := rng.IntN(2) == 0
		req := wire.Frame{CRC: crc, Revision: wire.Revision2, Enhanced: true, IRD: 4, ORD: 4}
		b, _ := req.Append(nil)
		c.Write(b)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cr, err := ln.GetConnectionRequest(ctx)
		if err != nil {
			t.Fatalf("seed %d iter %d: %v", seed, it, err)
		}
		if err := cr.Accept(ctx, q, transport.ConnParams{}); err != nil {
			t.Fatalf("seed %d iter %d: accept: %v", seed, it, err)
		}
		cancel()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := wire.ReadFrame(c, true); err != nil {
			t.Fatalf("seed %d iter %d: reply: %v", seed, it, err)
		}
		// A few FPDUs, each a valid one of a random kind, then mutated.
		for k := 0; k < 1+rng.IntN(4); k++ {
			c.Write(garbageFPDU(rng, mr, crc))
		}
		// Then the peer goes away: the QP must end, with every receive
		// completed exactly once.
		c.Close()
		select {
		case <-q.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("seed %d iter %d: QP still up 5 s after the peer closed", seed, it)
		}
		seen := map[any]int{}
		deadline := time.Now().Add(5 * time.Second)
		var out [16]transport.Completion
		for len(seen) < 4 && time.Now().Before(deadline) {
			n := cq.Poll(out[:])
			for _, comp := range out[:n] {
				if comp.Type == transport.OpReceive {
					seen[comp.RequestContext]++
				}
			}
			if n == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		for i := 0; i < 4; i++ {
			if seen[i] != 1 {
				t.Fatalf("seed %d iter %d: receive %d completed %d times (%v)", seed, it, i, seen[i], q.Err())
			}
		}
		q.Close()
		cq.Close()
	}
}

func garbageFPDU(rng *rand.Rand, mr transport.MemoryRegion, crc bool) []byte {
	var h wire.Header
	payload := make([]byte, rng.IntN(1500))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	switch rng.IntN(5) {
	case 0:
		h = wire.Header{Last: true, Opcode: wire.OpSend, QN: wire.QNSend, MSN: 1}
	case 1:
		h = wire.Header{Tagged: true, Last: true, Opcode: wire.OpWrite, STag: mr.RKey(), TO: mr.Addr() + uint64(rng.IntN(70000))}
	case 2:
		h = wire.Header{Last: true, Opcode: wire.OpReadRequest, QN: wire.QNReadRequest, MSN: 1}
		payload = make([]byte, wire.ReadRequestLen)
		rr := wire.ReadRequest{SinkSTag: 0x100, SinkTO: 0, Size: uint32(rng.IntN(100000)), SrcSTag: mr.RKey(), SrcTO: mr.Addr() + uint64(rng.IntN(70000))}
		rr.Put(payload)
	case 3:
		h = wire.Header{Last: true, Opcode: wire.OpTerminate, QN: wire.QNTerminate, MSN: 1}
	default:
		h = wire.Header{Tagged: true, Last: true, Opcode: wire.OpReadResponse, STag: rng.Uint32(), TO: rng.Uint64()}
	}
	hb := make([]byte, h.Len())
	h.Put(hb)
	ulpdu := append(hb, payload...)
	// Mutate: flip a few bits anywhere, or lie about the length.
	for m := rng.IntN(4); m > 0; m-- {
		i := rng.IntN(len(ulpdu))
		ulpdu[i] ^= 1 << rng.IntN(8)
	}
	ulen := len(ulpdu)
	if rng.IntN(8) == 0 {
		ulen = rng.IntN(0x10000)
	}
	f := binary.BigEndian.AppendUint16(nil, uint16(ulen))
	f = append(f, ulpdu...)
	f = append(f, make([]byte, wire.PadLen(len(ulpdu)))...)
	var sum uint32
	if crc && rng.IntN(4) != 0 {
		sum = wire.CRCUpdate(0, f)
	}
	f = append(f, 0, 0, 0, 0)
	wire.PutCRC(f[len(f)-4:], sum)
	return f
}
