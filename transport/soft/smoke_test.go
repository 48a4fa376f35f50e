package soft

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/blk-project/blk/transport"
)

type pair struct {
	a, b     *Adapter
	pa, pb   transport.PD
	cqa, cqb transport.CQ
	qa, qb   transport.QP
}

func newPair(t testing.TB, cfg Config) *pair {
	t.Helper()
	p := &pair{}
	var err error
	if p.a, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if p.b, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.a.Close(); p.b.Close() })
	p.pa, _ = p.a.CreatePD()
	p.pb, _ = p.b.CreatePD()
	p.cqa, err = p.a.CreateCQ(transport.CQConfig{Depth: 1024, Affinity: -1})
	if err != nil {
		t.Fatal(err)
	}
	p.cqb, _ = p.b.CreateCQ(transport.CQConfig{Depth: 1024, Affinity: -1})
	mk := func(pd transport.PD, c transport.CQ, name string) transport.QP {
		q, err := pd.CreateQP(transport.QPConfig{ReceiveCQ: c, InitiatorCQ: c, Context: name, ReceiveQueueDepth: 256, InitiatorQueueDepth: 256, MaxReceiveRequestSge: 2, MaxInitiatorRequestSge: 2, InlineDataSize: 64})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	p.qa = mk(p.pa, p.cqa, "a")
	p.qb = mk(p.pb, p.cqb, "b")
	ln, err := p.b.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		cr, err := ln.GetConnectionRequest(ctx)
		if err != nil {
			errc <- err
			return
		}
		if string(cr.PrivateData()) != "hello" {
			t.Errorf("private data %q", cr.PrivateData())
		}
		errc <- cr.Accept(ctx, p.qb, transport.ConnParams{PrivateData: []byte("welcome")})
	}()
	pd, err := p.a.Connect(ctx, p.qa, ln.Addr().String(), transport.ConnParams{PrivateData: []byte("hello")})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if string(pd) != "welcome" {
		t.Fatalf("accept private data %q", pd)
	}
	return p
}

func waitComp(t testing.TB, c transport.CQ) transport.Completion {
	t.Helper()
	var out [1]transport.Completion
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if c.Poll(out[:]) == 1 {
			return out[0]
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Fatal("no completion")
	return out[0]
}

func TestSmoke(t *testing.T) {
	for _, crc := range []bool{false, true} {
		p := newPair(t, Config{CRC: crc})
		rbuf := make([]byte, 300<<10)
		rmr, _ := p.pb.RegisterMemory(rbuf, transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead)
		if err := p.qb.PostReceive("r1", []transport.SGE{rmr.SGE(0, 200<<10)}); err != nil {
			t.Fatal(err)
		}
		sbuf := make([]byte, 300<<10)
		for i := range sbuf {
			sbuf[i] = byte(i * 7)
		}
		smr, _ := p.pa.RegisterMemory(sbuf, transport.AccessLocalWrite|transport.AccessRemoteWrite)
		if err := p.qa.Send("s1", []transport.SGE{smr.SGE(0, 150000)}, 0); err != nil {
			t.Fatal(err)
		}
		c := waitComp(t, p.cqa)
		if c.Status != nil || c.RequestContext != "s1" || c.Bytes != 150000 || c.QPContext != "a" {
			t.Fatalf("send completion %+v", c)
		}
		c = waitComp(t, p.cqb)
		if c.Status != nil || c.RequestContext != "r1" || c.Bytes != 150000 || c.QPContext != "b" {
			t.Fatalf("recv completion %+v", c)
		}
		if !bytes.Equal(rbuf[:150000], sbuf[:150000]) {
			t.Fatal("send data mismatch")
		}
		// RDMA write a→b then read b→a.
		if err := p.qa.Write("w1", []transport.SGE{smr.SGE(1000, 100000)}, rmr.Addr()+5, rmr.RKey(), 0); err != nil {
			t.Fatal(err)
		}
		if c = waitComp(t, p.cqa); c.Status != nil || c.Type != transport.OpWrite {
			t.Fatalf("write completion %+v", c)
		}
		dst := make([]byte, 100000)
		dmr, _ := p.pa.RegisterMemory(dst, transport.AccessLocalWrite|transport.AccessRemoteWrite)
		if err := p.qa.Read("rd", []transport.SGE{dmr.SGE(0, 100000)}, rmr.Addr()+5, rmr.RKey(), 0); err != nil {
			t.Fatal(err)
		}
		if c = waitComp(t, p.cqa); c.Status != nil || c.Type != transport.OpRead || c.Bytes != 100000 {
			t.Fatalf("read completion %+v", c)
		}
		if !bytes.Equal(dst, sbuf[1000:101000]) {
			t.Fatal("write/read data mismatch")
		}
	}
}
