//go:build verbs && linux && cgo

package verbs_test

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/blk-project/blk/transport"
)

func init() { os.Setenv("BLK_VERBS_DEBUG", "1") }

func probeOnce(t *testing.T, srvA, cliA transport.Adapter, addr string, n int) string {
	mk := func(a transport.Adapter) transport.QP {
		pd, _ := a.CreatePD()
		c, _ := a.CreateCQ(transport.CQConfig{Depth: 16, Affinity: -1})
		q, err := pd.CreateQP(transport.QPConfig{ReceiveCQ: c, InitiatorCQ: c, ReceiveQueueDepth: 1, InitiatorQueueDepth: 1, MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	ln, err := srvA.Listen(net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sq, cq := mk(srvA), mk(cliA)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	res := make(chan string, 1)
	go func() {
		req, err := ln.GetConnectionRequest(ctx)
		if err != nil {
			res <- "no request: " + err.Error()
			return
		}
		got := len(req.PrivateData())
		if err := req.Accept(ctx, sq, transport.ConnParams{PrivateData: make([]byte, n)}); err != nil {
			res <- "request " + itoa(got) + " bytes; accept: " + err.Error()
			return
		}
		res <- "request " + itoa(got) + " bytes; accepted"
	}()
	pd, err := cliA.Connect(ctx, cq, ln.Addr().String(), transport.ConnParams{PrivateData: make([]byte, n)})
	r := <-res
	if err != nil {
		return "connect: " + err.Error() + "; passive: " + r
	}
	return "connected, accept data " + itoa(len(pd)) + "; passive: " + r
}

func itoa(n int) string {
	b := []byte{}
	if n == 0 {
		return "0"
	}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
