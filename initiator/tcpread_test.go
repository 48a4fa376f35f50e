package initiator

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/blk-project/blk/internal/testseed"
)

// chunkConn is a net.Conn whose Read returns what has "arrived": the
// stream in the chunks given, at most one chunk (or what p holds of it)
// per call, then io.EOF; it counts the calls.
type chunkConn struct {
	net.Conn
	chunks [][]byte
	reads  int
}

func (c *chunkConn) Read(p []byte) (int, error) {
	c.reads++
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	if c.chunks[0] = c.chunks[0][n:]; len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

// TestTCPReadFull: the receiver's readFull gives back the stream exactly,
// whatever the sizes asked (headers, digests, small and large payloads)
// and however it arrives; and a burst of responses that arrived together
// costs one read of the connection, not one per response (the syscall
// per I/O it saves).
func TestTCPReadFull(t *testing.T) {
	seed := testseed.Seed(t, "./initiator/")
	rng := rand.New(rand.NewPCG(seed, 0))
	for round := range 50 {
		stream := make([]byte, 1+rng.IntN(200<<10))
		for i := range stream {
			stream[i] = byte(rng.Uint32())
		}
		c := &chunkConn{}
		for rest := stream; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(3*tcpRecvBuffer/2))
			c.chunks = append(c.chunks, rest[:n])
			rest = rest[n:]
		}
		w := &tcpWire{conn: c, rbuf: make([]byte, tcpRecvBuffer)}
		var got []byte
		for len(got) < len(stream) {
			var want int
			switch rng.IntN(4) {
			case 0:
				want = tcpRecvHeader
			case 1:
				want = 4
			case 2:
				want = 4096
			default:
				want = 1 + rng.IntN(40<<10)
			}
			want = min(want, len(stream)-len(got))
			p := make([]byte, want)
			if n, err := w.readFull(p); n != want || err != nil {
				t.Fatalf("round %d: readFull(%d) at %d = %d, %v", round, want, len(got), n, err)
			}
			got = append(got, p...)
		}
		if !bytes.Equal(got, stream) {
			t.Fatalf("round %d: the bytes read differ from the stream", round)
		}
		if n, err := w.readFull(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("round %d: at the end: %d, %v; want 0, EOF", round, n, err)
		}
	}

	// The end in the middle of a PDU.
	w := &tcpWire{conn: &chunkConn{chunks: [][]byte{make([]byte, 10)}}, rbuf: make([]byte, tcpRecvBuffer)}
	if n, err := w.readFull(make([]byte, tcpRecvHeader)); n != 10 || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a header cut after 10 bytes: %d, %v; want 10, ErrUnexpectedEOF", n, err)
	}

	// 64 responses that arrived together: one read.
	c := &chunkConn{chunks: [][]byte{make([]byte, 64*tcpRecvHeader)}}
	w = &tcpWire{conn: c, rbuf: make([]byte, tcpRecvBuffer)}
	for i := range 64 {
		if _, err := w.readFull(w.rhdr[:tcpRecvHeader]); err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
	}
	if c.reads != 1 {
		t.Fatalf("64 responses that arrived together took %d reads, want 1", c.reads)
	}
}
