package soft_test

import (
	"context"
	"fmt"
	"time"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

// Two adapters on loopback: the server posts a receive and accepts; the
// client connects with private data and sends a message inline.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func() (*soft.Adapter, transport.PD, transport.CQ, transport.QP) {
		a, _ := soft.New(soft.Config{})
		pd, _ := a.CreatePD()
		cq, _ := a.CreateCQ(transport.CQConfig{Depth: 16, Affinity: -1})
		qp, _ := pd.CreateQP(transport.QPConfig{ReceiveCQ: cq, InitiatorCQ: cq,
			ReceiveQueueDepth: 4, InitiatorQueueDepth: 4,
			MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1, InlineDataSize: 64})
		return a, pd, cq, qp
	}
	srv, srvPD, srvCQ, srvQP := open()
	defer srv.Close()
	cli, cliPD, cliCQ, cliQP := open()
	defer cli.Close()

	inbox := make([]byte, 64)
	inboxMR, _ := srvPD.RegisterMemory(inbox, transport.AccessLocalWrite)
	srvQP.PostReceive("inbox", []transport.SGE{inboxMR.SGE(0, 64)})
	ln, _ := srv.Listen("127.0.0.1:0")
	defer ln.Close()
	go func() {
		req, err := ln.GetConnectionRequest(ctx)
		if err != nil {
			return
		}
		fmt.Printf("server: connect request with %q\n", req.PrivateData())
		req.Accept(ctx, srvQP, transport.ConnParams{PrivateData: []byte("welcome")})
	}()
	reply, err := cli.Connect(ctx, cliQP, ln.Addr().String(), transport.ConnParams{PrivateData: []byte("hello")})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("client: accepted with %q\n", reply)

	msg := []byte("block storage")
	msgMR, _ := cliPD.RegisterMemory(msg, 0)
	cliQP.Send("greeting", []transport.SGE{msgMR.SGE(0, uint32(len(msg)))}, transport.FlagInline)

	poll := func(cq transport.CQ) transport.Completion {
		var c [1]transport.Completion
		for cq.Poll(c[:]) == 0 {
			time.Sleep(100 * time.Microsecond)
		}
		return c[0]
	}
	s := poll(cliCQ)
	fmt.Printf("client: %v %q done, status %v\n", s.Type, s.RequestContext, s.Status)
	r := poll(srvCQ)
	fmt.Printf("server: %v into %q: %q\n", r.Type, r.RequestContext, inbox[:r.Bytes])
	// Output:
	// server: connect request with "hello"
	// client: accepted with "welcome"
	// client: send "greeting" done, status <nil>
	// server: receive into "inbox": "block storage"
}
