package tcp_test

import (
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/blk-project/blk/internal/testseed"
	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target/tcp"
)

func testSeed(t *testing.T) uint64 { return testseed.Seed(t, "./target/tcp/") }

// outcome is how a random PDU ended.
type outcome int

const (
	answered   outcome = iota // a response (or SUCCESS) came
	terminated                // a C2HTermReq, then the end of the stream
	closed                    // the end of the stream without a TermReq
)

// settle reads until the one command in flight is answered or the
// connection ends; R2Ts are answered with zeros, sometimes with a
// mutated H2CData header.
func (h *rawHost) settle(rng *rand.Rand) (outcome, error) {
	for {
		hdr, b, err := h.readPDU()
		var et *errTerm
		switch {
		case errors.As(err, &et):
			h.nc.SetReadDeadline(time.Now().Add(rawTimeout))
			if n, err := h.nc.Read(make([]byte, 1)); n > 0 || err == nil {
				return terminated, errors.New("data after a C2HTermReq")
			}
			return terminated, nil
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err):
			return closed, nil
		case err != nil:
			return answered, err
		}
		switch hdr.Type {
		case nvme.TCPCapsuleResp:
			return answered, nil
		case nvme.TCPC2HData:
			if hdr.Flags&nvme.TCPFlagSuccess != 0 {
				return answered, nil
			}
		case nvme.TCPR2T:
			var d nvme.TCPDataPDU
			_ = d.Unmarshal(b)
			end := d.Offset + d.Length
			for off := d.Offset; off < end; {
				n := min(end-off, h.maxH2C)
				p := h.h2cPDU(d.CCCID, d.TTag, off, make([]byte, n), off+n == end)
				mutate(rng, p, 0.1, nvme.TCPDataHeaderSize+h.hd)
				if err := h.write(p); err != nil {
					return closed, nil
				}
				off += n
			}
		default:
			return answered, h.unexpected(hdr, b)
		}
	}
}

func isReset(err error) bool {
	var ne interface{ Timeout() bool }
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// mutate, with probability p, sets one random byte of the first n bytes
// of pdu (never PLEN: the PDU stays whole on the stream) to a random
// value. It reports the offset changed, or -1.
func mutate(rng *rand.Rand, pdu []byte, p float64, n int) int {
	if rng.Float64() >= p {
		return -1
	}
	for {
		at := rng.IntN(min(n, len(pdu)))
		if at >= nvme.TCPOffPLen && at < nvme.TCPOffPLen+4 {
			continue
		}
		pdu[at] = byte(rng.Uint32())
		return at
	}
}

// TestRandomPDUs sends seeded random commands on live I/O queues, a third
// of them with one byte changed (header, SQE or data; H2CData headers
// too): every PDU must be answered, or its connection terminated with a
// TermReq and closed (closed without one only where nvmet does: a data
// digest error, an H2CTermReq), and the target must serve a new
// connection afterwards and let every connection go.
func TestRandomPDUs(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 7))
	tt := newTestTarget(t, tcp.Config{InCapsule: 4096, MaxH2CData: 16384})
	conns, perConn := 24, 40
	if testing.Short() {
		conns = 6
	}
	var ans, terms, closes int
	for i := 0; i < conns; i++ {
		dg := nvme.TCPDigestsOf(uint8(rng.IntN(4)))
		ctrl, cntlid := tt.adminUp(t, nvme.TCPDigests{})
		h := tt.ioUp(t, cntlid, 1, 7, 0, dg)
		for k := 0; k < perConn; k++ {
			size := []int{0, 4096, 8192, 12288, 64 << 10}[rng.IntN(5)]
			lba := uint64(rng.IntN(testBlocks - 32))
			var cmd nvme.Command
			var data []byte
			h.cid++
			switch rng.IntN(4) {
			case 0:
				cmd = rw(nvme.IORead, 1, lba, uint32(max(size, 4096)/testBlock))
				cmd.DPTR = nvme.TransportSGL(uint32(max(size, 4096)))
			case 1:
				cmd = rw(nvme.IOWrite, 1, lba, uint32(max(size, 4096)/testBlock))
				if size <= 4096 {
					data = pattern(4096, byte(k))
					cmd.DPTR = nvme.InCapsuleSGL(0, 4096)
				} else {
					cmd.DPTR = nvme.TransportSGL(uint32(size))
				}
			case 2:
				cmd = nvme.Command{Opcode: uint8(nvme.IOFlush), NSID: 1, DPTR: nvme.TransportSGL(0)}
			case 3:
				cmd = rw(nvme.IOWriteZeroes, 1, lba, 8)
				cmd.DPTR = nvme.TransportSGL(0)
			}
			cmd.CID, cmd.Flags = h.cid, 0x40
			pdu := h.capsulePDU(cmd, data)
			at := mutate(rng, pdu, 0.33, len(pdu))
			if err := h.write(pdu); err != nil {
				t.Fatalf("connection %d PDU %d: write: %v", i, k, err)
			}
			o, err := h.settle(rng)
			if err != nil {
				t.Fatalf("connection %d PDU %d (byte %d changed): %v", i, k, at, err)
			}
			if o == closed && !dg.Data && at != nvme.TCPOffType {
				t.Fatalf("connection %d PDU %d (byte %d changed): closed without a TermReq", i, k, at)
			}
			if o == answered {
				ans++
				continue
			}
			if o == terminated {
				terms++
			} else {
				closes++
			}
			break
		}
		h.nc.Close()
		ctrl.nc.Close()
		// The target serves a new connection.
		admin, _ := tt.adminUp(t, nvme.TCPDigests{})
		if res := admin.mustExchange(identify(1, 0), nil, nil, make([]byte, 4096)); res.rsp.Status != 0 {
			t.Fatalf("Identify after connection %d: %v", i, res.rsp.Status)
		}
		admin.nc.Close()
	}
	t.Logf("%d answered, %d terminated, %d closed; stats %+v", ans, terms, closes, tt.port.Stats())
	waitConns(t, tt, 0)
}
