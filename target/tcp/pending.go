//go:build linux

package tcp

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/blk-project/blk/target"
)

// The pending budget: connections accepted whose queue has not connected
// yet hold a receive buffer and a slot of the port until their Connect
// succeeds or ConnectTimeout ends them. Anyone who reaches the port can
// open them, so they are budgeted:
//
//   - at most MaxPendingPerSource of one source address (the peer's IP):
//     one peer reopening idle connections cannot take the port;
//   - at most MaxPending of the port: when it is full, a connection of a
//     source with fewer pending than the source with the most (by two or
//     more) evicts that source's oldest pending connection instead of
//     being refused, so peers with many addresses cannot starve a host
//     with few either, until every source holds about the same share.
//
// Each refusal and eviction is a Warn naming the source. All of it runs
// once per connection on the accept goroutine (and once more when the
// connection connects or closes), never per command.

// errEvicted is why an evicted connection is closed.
var errEvicted = errors.New("tcp: evicted: the port's pending connections were full and its source had the most")

// pendingSource is one source address's pending connections: n counts
// them, reservations made by admitPending included; conns are those
// tracked, oldest first (the eviction candidates).
type pendingSource struct {
	n     int
	conns []*conn
}

// sourceOf is the source address pending connections are counted by:
// the peer's IP (an IPv4-mapped address as IPv4).
func sourceOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _ := target.SplitHostPort(a.String())
	return host
}

// admitPending reserves a place for a new connection of src among the
// pending ones, or says why there is none. When the port is full it may
// take the place of victim, which the caller must disconnect.
func (p *Port) admitPending(src string) (victim *conn, why string) {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	have := 0
	if ps := p.pendingBy[src]; ps != nil {
		have = ps.n
	}
	if have >= p.cfg.MaxPendingPerSource {
		p.rejected.Add(1)
		p.rejectedSource.Add(1)
		return nil, fmt.Sprintf("%d connections of %s are already waiting to connect (MaxPendingPerSource)", have, src)
	}
	if n := p.pending.Load(); n >= int32(p.cfg.MaxPending) {
		if victim = p.evictFor(have); victim == nil {
			p.rejected.Add(1)
			return nil, fmt.Sprintf("%d connections are already waiting to connect (MaxPending)", n)
		}
		p.evicted.Add(1)
	}
	ps := p.pendingBy[src]
	if ps == nil {
		ps = &pendingSource{}
		p.pendingBy[src] = ps
	}
	ps.n++
	p.pending.Add(1)
	return victim, ""
}

// evictFor picks the connection a source holding have pending
// connections takes the place of: the oldest registered one of the
// source with the most, if that source holds at least have+2 (with
// have+1 the two would only trade places). It takes the victim out of
// the budget. Requires pmu.
func (p *Port) evictFor(have int) *conn {
	var big *pendingSource
	for _, ps := range p.pendingBy {
		if big == nil || ps.n > big.n {
			big = ps
		}
	}
	if big == nil || big.n < have+2 {
		return nil
	}
	for i, c := range big.conns {
		// A connection the group has not registered yet cannot be
		// disconnected cleanly; an older one is there anyway (big.n ≥ 2).
		if c.registered.Load() {
			big.conns = slices.Delete(big.conns, i, i+1)
			c.counted = false
			p.dropOne(c.src, big)
			return c
		}
	}
	return nil
}

// track records c, whose place admitPending reserved, as pending.
func (p *Port) track(c *conn, src string) {
	p.pmu.Lock()
	c.src, c.pending, c.counted = src, true, true
	ps := p.pendingBy[src]
	ps.conns = append(ps.conns, c)
	p.pmu.Unlock()
}

// unreserve gives back a place admitPending reserved for src for a
// connection that was never tracked.
func (p *Port) unreserve(src string) {
	p.pmu.Lock()
	p.dropOne(src, p.pendingBy[src])
	p.pmu.Unlock()
}

// releasePending gives back c's place: its queue connected, or it
// closed. An evicted connection gave its place back already.
func (p *Port) releasePending(c *conn) {
	p.pmu.Lock()
	if c.counted {
		c.counted = false
		ps := p.pendingBy[c.src]
		if i := slices.Index(ps.conns, c); i >= 0 {
			ps.conns = slices.Delete(ps.conns, i, i+1)
		}
		p.dropOne(c.src, ps)
	}
	p.pmu.Unlock()
}

// dropOne takes one connection of src (ps) out of the counts. Requires
// pmu.
func (p *Port) dropOne(src string, ps *pendingSource) {
	ps.n--
	if ps.n == 0 {
		delete(p.pendingBy, src)
	}
	p.pending.Add(-1)
}
