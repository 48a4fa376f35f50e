package rdma_test

import (
	"net"
	"strings"
	"testing"

	"github.com/blk-project/blk/target"
	"github.com/blk-project/blk/target/rdma"
	"github.com/blk-project/blk/transport/soft"
)

// Listen on an address in use fails with an error naming it, and frees
// what it had set up (it used to release through a nil *Port and panic).
func TestListenAddrInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	a, err := soft.New(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cfg := rdma.Config{Addr: busy.Addr().String()}
	tgt, err := target.New(target.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	p, err := rdma.Listen(tgt, a, cfg)
	if err == nil {
		p.Close()
		t.Fatal("Listen on an address in use succeeded")
	}
	if !strings.Contains(err.Error(), busy.Addr().String()) {
		t.Fatalf("error %q does not name %s", err, busy.Addr())
	}
}
