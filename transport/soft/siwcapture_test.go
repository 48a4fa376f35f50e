package soft

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft/wire"
)

// These tests put the provider itself, not just the framing package, on
// the wire against bytes a Linux host sent (shared/docs/vm-notes.md): a
// raw TCP peer replays the Linux nvme-rdma host's MPA request and first
// FPDU (captured over siw) against our listener, and reads what our active
// side sends.

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// captured MPA request: rev 2, enhanced, IRD 128 / ORD 0, 32-byte NVMe/RDMA
// CM request (recfmt 0, qid 0, hrqsize 32, hsqsize 31).
func capturedRequest(t testing.TB) []byte {
	return unhex(t, `4d50412049442052657120467261 6d65 10020024 00800000
		00000000 20001f00`+strings.Repeat("00", 24))
}

// captured first FPDU: an untagged Send (MSN 1) of the 64-byte Connect SQE.
func capturedFPDU(t testing.TB) ([]byte, []byte) {
	sqe := unhex(t, `7f400000 01000000`+strings.Repeat("00", 24)+`00040000 0000004f 00000000 1f000000`+strings.Repeat("00", 16))
	f := unhex(t, `0052 4143 00000000 00000000 00000001 00000000`)
	f = append(f, sqe...)
	return append(f, 0, 0, 0, 0), sqe
}

func TestReplayLinuxHostCapture(t *testing.T) {
	a, err := New(Config{PollGroup: benchPollGroup})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	pd, _ := a.CreatePD()
	cq, _ := a.CreateCQ(transport.CQConfig{Depth: 16, Affinity: -1})
	q, _ := pd.CreateQP(transport.QPConfig{ReceiveCQ: cq, InitiatorCQ: cq, ReceiveQueueDepth: 4, InitiatorQueueDepth: 4, MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1})
	buf := make([]byte, 1024)
	mr, _ := pd.RegisterMemory(buf, transport.AccessLocalWrite)
	if err := q.PostReceive("capsule", []transport.SGE{mr.SGE(0, 1024)}); err != nil {
		t.Fatal(err)
	}
	ln, err := a.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(capturedRequest(t)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cr, err := ln.GetConnectionRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := unhex(t, `00000000 20001f00`+strings.Repeat("00", 24)); !bytes.Equal(cr.PrivateData(), want) {
		t.Fatalf("private data % x, want the 32-byte NVMe/RDMA CM request", cr.PrivateData())
	}
	if ird, ord := cr.ReadLimits(); ird != 128 || ord != 0 {
		t.Fatalf("read limits %d/%d, want 128/0", ird, ord)
	}
	if err := cr.Accept(ctx, q, transport.ConnParams{}); err != nil {
		t.Fatal(err)
	}
	// The reply must be what the Linux host accepted in the capture: our
	// IRD follows its ORD (0), our ORD its IRD (128).
	rep := make([]byte, 24)
	if _, err := io.ReadFull(c, rep); err != nil {
		t.Fatal(err)
	}
	if want := unhex(t, `4d50412049442052657020467261 6d65 10020004 00000080`); !bytes.Equal(rep, want) {
		t.Fatalf("MPA reply\n got % x\nwant % x", rep, want)
	}
	fpdu, sqe := capturedFPDU(t)
	if _, err := c.Write(fpdu); err != nil {
		t.Fatal(err)
	}
	comp := waitComp(t, cq)
	if comp.Status != nil || comp.Type != transport.OpReceive || comp.Bytes != 64 || comp.RequestContext != "capsule" {
		t.Fatalf("completion %+v", comp)
	}
	if !bytes.Equal(buf[:64], sqe) {
		t.Fatalf("capsule % x\nwant % x", buf[:64], sqe)
	}
}

// TestActiveSideWire checks what our active side sends: an MPA rev 2
// request with the enhanced flag and IRD/ORD words, then (after the reply)
// FPDUs laid out as siw lays them, with the CRC field zero or a correct
// CRC32C when negotiated.
func TestActiveSideWire(t *testing.T) {
	for _, crc := range []bool{false, true} {
		raw, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		a, _ := New(Config{CRC: crc, FirstFPDUDelay: -1, PollGroup: benchPollGroup})
		defer a.Close()
		pd, _ := a.CreatePD()
		cq, _ := a.CreateCQ(transport.CQConfig{Depth: 16, Affinity: -1})
		q, _ := pd.CreateQP(transport.QPConfig{ReceiveCQ: cq, InitiatorCQ: cq, ReceiveQueueDepth: 4, InitiatorQueueDepth: 4, MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1, InlineDataSize: 64})
		type result struct {
			req  []byte
			fpdu []byte
			err  error
		}
		res := make(chan result, 1)
		go func() {
			var r result
			defer func() { res <- r }()
			c, err := raw.Accept()
			if err != nil {
				r.err = err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			r.req = make([]byte, 20+4+3)
			if _, r.err = io.ReadFull(c, r.req); r.err != nil {
				return
			}
			flags := byte(0x10)
			if crc {
				flags |= 0x40
			}
			rep := append([]byte("MPA ID Rep Frame"), flags, 2, 0, 4, 0, 1, 0, 1)
			if _, r.err = c.Write(rep); r.err != nil {
				return
			}
			r.fpdu = make([]byte, 2+18+5+3+4)
			_, r.err = io.ReadFull(c, r.fpdu)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := a.Connect(ctx, q, raw.Addr().String(), transport.ConnParams{PrivateData: []byte("abc")}); err != nil {
			t.Fatal(err)
		}
		msg := []byte("hello")
		mr, _ := pd.RegisterMemory(msg, 0)
		if err := q.Send(nil, []transport.SGE{mr.SGE(0, 5)}, 0); err != nil {
			t.Fatal(err)
		}
		r := <-res
		if r.err != nil {
			t.Fatal(r.err)
		}
		wantFlags := "10"
		if crc {
			wantFlags = "50"
		}
		wantReq := unhex(t, `4d50412049442052657120467261 6d65`+wantFlags+`020007 0080 0080 616263`)
		if !bytes.Equal(r.req, wantReq) {
			t.Fatalf("crc=%v MPA request\n got % x\nwant % x", crc, r.req, wantReq)
		}
		// ULPDU 23 = 18 header + 5 payload; 3 bytes of pad make 2+23+3 a
		// multiple of 4; then the CRC.
		want := unhex(t, `0017 4143 00000000 00000000 00000001 00000000 68656c6c6f 000000`)
		if !bytes.Equal(r.fpdu[:len(want)], want) {
			t.Fatalf("crc=%v FPDU\n got % x\nwant % x", crc, r.fpdu[:len(want)], want)
		}
		got := binary.LittleEndian.Uint32(r.fpdu[len(want):])
		var wantCRC uint32
		if crc {
			wantCRC = wire.CRCUpdate(0, want)
		}
		if got != wantCRC {
			t.Fatalf("crc=%v CRC field %#x, want %#x", crc, got, wantCRC)
		}
	}
}
