package soft

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft/wire"
)

// TestReadResponseOnlyIntoItsSink: a peer answering this side's RDMA read
// can place data only into that read's sink, within its range: a response
// naming another region (even one registered remotely writable) or
// running past the sink ends the connection and changes no memory. The
// peer is a raw TCP endpoint speaking MPA and DDP/RDMAP byte by byte.
func TestReadResponseOnlyIntoItsSink(t *testing.T) {
	const n = 4096
	for _, tc := range []struct {
		name string
		ok   bool
		// forge returns the STag and offset of the response, given the
		// read request and the other region.
		forge func(rr wire.ReadRequest, other transport.MemoryRegion) (uint32, uint64)
	}{
		{"into its sink", true, func(rr wire.ReadRequest, _ transport.MemoryRegion) (uint32, uint64) { return rr.SinkSTag, rr.SinkTO }},
		{"into another region", false, func(_ wire.ReadRequest, o transport.MemoryRegion) (uint32, uint64) { return o.RKey(), o.Addr() }},
		{"past the sink's end", false, func(rr wire.ReadRequest, _ transport.MemoryRegion) (uint32, uint64) {
			return rr.SinkSTag, rr.SinkTO + 64
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(Config{PollGroup: benchPollGroup})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			pd, _ := a.CreatePD()
			cq, _ := a.CreateCQ(transport.CQConfig{Depth: 64, Affinity: -1})
			q, err := pd.CreateQP(transport.QPConfig{ReceiveCQ: cq, InitiatorCQ: cq, ReceiveQueueDepth: 4, InitiatorQueueDepth: 4,
				MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1})
			if err != nil {
				t.Fatal(err)
			}
			sink, _ := pd.RegisterMemory(make([]byte, n), transport.AccessLocalWrite)
			other, _ := pd.RegisterMemory(make([]byte, n), transport.AccessLocalWrite|transport.AccessRemoteWrite)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			payload := bytes.Repeat([]byte{0xee}, n)
			peer := make(chan error, 1)
			go func() { peer <- rawReadResponder(ln, payload, other, tc.forge) }()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := a.Connect(ctx, q, ln.Addr().String(), transport.ConnParams{InboundReadLimit: 4, OutboundReadLimit: 4}); err != nil {
				t.Fatal(err)
			}
			if err := q.Read("read", []transport.SGE{sink.SGE(0, n)}, 0x1000, 0x1234, 0); err != nil {
				t.Fatal(err)
			}
			var c [1]transport.Completion
			deadline := time.Now().Add(5 * time.Second)
			for cq.Poll(c[:]) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the read never completed")
				}
				time.Sleep(time.Millisecond)
			}
			if err := <-peer; err != nil {
				t.Fatalf("raw peer: %v", err)
			}
			if tc.ok {
				if c[0].Status != nil || !bytes.Equal(sink.Bytes(), payload) {
					t.Fatalf("read: %v; sink holds the response %v", c[0].Status, bytes.Equal(sink.Bytes(), payload))
				}
				return
			}
			if c[0].Status == nil {
				t.Fatal("a response outside the read's sink completed the read")
			}
			select {
			case <-q.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the connection survived a response outside the read's sink")
			}
			if !bytes.Equal(other.Bytes(), make([]byte, n)) || !bytes.Equal(sink.Bytes(), make([]byte, n)) {
				t.Fatal("a refused read response changed memory")
			}
			t.Logf("refused: read %v, QP %v", c[0].Status, q.Err())
		})
	}
}

// rawReadResponder accepts one MPA connection, waits for an RDMA read
// request and answers it with one read response segment of payload at
// the STag and offset forge picks.
func rawReadResponder(ln net.Listener, payload []byte, other transport.MemoryRegion,
	forge func(wire.ReadRequest, transport.MemoryRegion) (uint32, uint64)) error {
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req, err := wire.ReadFrame(c, false)
	if err != nil {
		return err
	}
	reply := wire.Frame{Reply: true, Revision: req.Revision, Enhanced: req.Enhanced, IRD: 4, ORD: 4}
	if req.Enhanced {
		reply.IRD |= req.IRD &^ wire.IRDORDMask
		reply.ORD |= req.ORD &^ wire.IRDORDMask
	}
	b, err := reply.Append(nil)
	if err != nil {
		return err
	}
	if _, err := c.Write(b); err != nil {
		return err
	}
	for {
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return err
		}
		ulen := int(binary.BigEndian.Uint16(l[:]))
		rest := make([]byte, ulen+wire.PadLen(ulen)+wire.CRCLen)
		if _, err := io.ReadFull(c, rest); err != nil {
			return err
		}
		h, hl, err := wire.ParseHeader(rest[:ulen])
		if err != nil {
			return err
		}
		if h.Tagged || h.Opcode != wire.OpReadRequest {
			continue // an RTR or the like
		}
		rr, err := wire.ParseReadRequest(rest[hl:ulen])
		if err != nil {
			return err
		}
		stag, to := forge(rr, other)
		resp := wire.Header{Tagged: true, Last: true, Opcode: wire.OpReadResponse, STag: stag, TO: to}
		u := make([]byte, resp.Len(), resp.Len()+len(payload))
		resp.Put(u)
		u = append(u, payload...)
		f := binary.BigEndian.AppendUint16(nil, uint16(len(u)))
		f = append(f, u...)
		f = append(f, make([]byte, wire.PadLen(len(u))+wire.CRCLen)...)
		_, err = c.Write(f)
		time.Sleep(200 * time.Millisecond) // let the Terminate, if any, arrive before closing
		return err
	}
}
