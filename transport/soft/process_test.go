package soft

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/transport"
)

// TestTwoProcesses runs the peer in a second process (this test binary
// re-executed): the parent RDMA-writes random data into the child's
// region, asks the child (with a send) for a CRC of what landed, reads the
// region back with RDMA read, and tells the child to exit.
func TestTwoProcesses(t *testing.T) {
	if os.Getenv("BLK_SOFT_CHILD") == "1" {
		childPeer()
		return
	}
	if testing.Short() {
		t.Skip("spawns a process")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTwoProcesses$", "-test.v")
	cmd.Env = append(os.Environ(), "BLK_SOFT_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	var addr string
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			addr = a
			break
		}
	}
	if addr == "" {
		t.Fatal("child printed no address")
	}
	go func() { // drain the child's output
		for sc.Scan() {
		}
	}()

	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	pd, _ := a.CreatePD()
	cq, _ := a.CreateCQ(transport.CQConfig{Depth: 64, Affinity: -1})
	q, err := pd.CreateQP(transport.QPConfig{ReceiveCQ: cq, InitiatorCQ: cq, ReceiveQueueDepth: 4, InitiatorQueueDepth: 16, MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1, InlineDataSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	const size = 256 << 10
	buf := make([]byte, 2*size)
	mr, _ := pd.RegisterMemory(buf, transport.AccessLocalWrite|transport.AccessRemoteWrite)
	rng := rand.New(rand.NewPCG(seed, seed))
	for i := 0; i < size; i++ {
		buf[i] = byte(rng.Uint32())
	}
	q.PostReceive("reply", []transport.SGE{mr.SGE(size, 64)})
	peer, err := a.Connect(ctx, q, addr, transport.ConnParams{PrivateData: []byte("parent")})
	if err != nil {
		t.Fatal(err)
	}
	if len(peer) != 16 {
		t.Fatalf("child's private data %x", peer)
	}
	raddr, rkey := binary.BigEndian.Uint64(peer), binary.BigEndian.Uint32(peer[8:])
	wait := func(want transport.OpType) transport.Completion {
		t.Helper()
		c := waitComp(t, cq)
		if c.Status != nil || c.Type != want {
			t.Fatalf("completion %+v, want %v (seed %d)", c, want, seed)
		}
		return c
	}
	if err := q.Write("w", []transport.SGE{mr.SGE(0, size)}, raddr, rkey, 0); err != nil {
		t.Fatal(err)
	}
	wait(transport.OpWrite)
	var cmdBuf [8]byte
	binary.BigEndian.PutUint32(cmdBuf[:], 1)
	binary.BigEndian.PutUint32(cmdBuf[4:], size)
	copy(buf[size+64:], cmdBuf[:])
	if err := q.Send("crc?", []transport.SGE{mr.SGE(size+64, 8)}, transport.FlagInline); err != nil {
		t.Fatal(err)
	}
	// The send's completion and the reply's are on different queues of
	// the same CQ: either may come first.
	var c transport.Completion
	for i := 0; i < 2; i++ {
		x := waitComp(t, cq)
		if x.Status != nil {
			t.Fatalf("completion %+v (seed %d)", x, seed)
		}
		if x.Type == transport.OpReceive {
			c = x
		}
	}
	if c.Bytes != 4 || binary.BigEndian.Uint32(buf[size:]) != crc32.ChecksumIEEE(buf[:size]) {
		t.Fatalf("child's CRC of the written data differs (seed %d)", seed)
	}
	if err := q.Read("r", []transport.SGE{mr.SGE(size, size)}, raddr, rkey, 0); err != nil {
		t.Fatal(err)
	}
	wait(transport.OpRead)
	if !bytes.Equal(buf[size:], buf[:size]) {
		t.Fatalf("RDMA read from the child returned other data (seed %d)", seed)
	}
	binary.BigEndian.PutUint32(buf[size+64:], 2)
	q.Send("exit", []transport.SGE{mr.SGE(size+64, 8)}, transport.FlagInline)
	wait(transport.OpSend)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

// childPeer is the second process: it serves one connection.
func childPeer() {
	fail := func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, "child: "+f+"\n", a...)
		os.Exit(1)
	}
	a, err := New(Config{})
	if err != nil {
		fail("%v", err)
	}
	pd, _ := a.CreatePD()
	cq, _ := a.CreateCQ(transport.CQConfig{Depth: 64, Affinity: 0})
	q, err := pd.CreateQP(transport.QPConfig{ReceiveCQ: cq, InitiatorCQ: cq, ReceiveQueueDepth: 4, InitiatorQueueDepth: 4, MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1, InlineDataSize: 64})
	if err != nil {
		fail("%v", err)
	}
	region := make([]byte, 256<<10)
	mr, _ := pd.RegisterMemory(region, transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead)
	msg := make([]byte, 64)
	mmr, _ := pd.RegisterMemory(msg, transport.AccessLocalWrite)
	for i := 0; i < 2; i++ {
		q.PostReceive(nil, []transport.SGE{mmr.SGE(uint32(i)*16, 16)})
	}
	ln, err := a.Listen("127.0.0.1:0")
	if err != nil {
		fail("%v", err)
	}
	fmt.Printf("ADDR %s\n", ln.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cr, err := ln.GetConnectionRequest(ctx)
	if err != nil {
		fail("%v", err)
	}
	if string(cr.PrivateData()) != "parent" {
		fail("private data %q", cr.PrivateData())
	}
	var pdata [16]byte
	binary.BigEndian.PutUint64(pdata[:], mr.Addr())
	binary.BigEndian.PutUint32(pdata[8:], mr.RKey())
	if err := cr.Accept(ctx, q, transport.ConnParams{PrivateData: pdata[:]}); err != nil {
		fail("accept: %v", err)
	}
	var out [4]transport.Completion
	for {
		n := cq.Poll(out[:])
		if n == 0 {
			select {
			case <-q.Done():
				fail("connection ended: %v", q.Err())
			case <-time.After(100 * time.Microsecond):
			}
			continue
		}
		for _, c := range out[:n] {
			if c.Status != nil {
				fail("completion %+v", c)
			}
			if c.Type != transport.OpReceive {
				continue
			}
			// The message is in one of the two 16-byte slots.
			var m []byte
			for i := 0; i < 2; i++ {
				if binary.BigEndian.Uint32(msg[i*16:]) != 0 {
					m = msg[i*16 : i*16+8]
					break
				}
			}
			if m == nil {
				fail("empty message")
			}
			switch binary.BigEndian.Uint32(m) {
			case 1:
				n := binary.BigEndian.Uint32(m[4:])
				binary.BigEndian.PutUint32(msg[32:], crc32.ChecksumIEEE(region[:n]))
				clear(m)
				q.PostReceive(nil, []transport.SGE{mmr.SGE(uint32(cap(msg)-cap(m)), 16)})
				if err := q.Send(nil, []transport.SGE{mmr.SGE(32, 4)}, transport.FlagInline); err != nil {
					fail("send: %v", err)
				}
			case 2:
				q.Disconnect()
				a.Close()
				os.Exit(0)
			}
		}
	}
}
