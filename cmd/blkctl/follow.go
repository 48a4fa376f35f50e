package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/failover"
)

// resolveRequestTimeout bounds one API request of the attach follower: a
// healthy node answers in milliseconds, and a node that does not answer
// in 2 s is passed over for the next member's API (the follower's whole
// resolve is bounded by failover.DefaultAttemptTimeout, 10 s).
const resolveRequestTimeout = 2 * time.Second

// followDevice connects to at (the attachment's chosen endpoint) and
// returns the device attach --nbd serves: it follows vol to the node
// that serves it after a failover, asking the API (volumeResolver) and
// connecting there as the first connection was made (host NQN,
// DH-HMAC-CHAP secrets, transport and its flags).
func (e *env) followDevice(opts connOpts, vol, host string, at attachment) (*failover.Device, error) {
	connectTo := func(ctx context.Context, ep failover.Endpoint) (failover.Path, error) {
		h, p, err := net.SplitHostPort(ep.Addr)
		if err != nil {
			return failover.Path{}, fmt.Errorf("endpoint address %q: %v", ep.Addr, err)
		}
		port, _ := strconv.Atoi(p)
		a := attachment{Transport: ep.Transport, Address: h, Port: port, SubsystemNQN: ep.SubNQN, NSID: ep.NSID}
		closeAll, _, ns, err := opts.connect(ctx, a, host, initiator.Config{})
		if err != nil {
			return failover.Path{}, err
		}
		return failover.Path{Endpoint: ep, Namespace: ns, Close: closeAll}, nil
	}
	first := failover.Endpoint{Transport: at.Transport, Addr: net.JoinHostPort(at.Address, strconv.Itoa(at.Port)),
		SubNQN: at.SubsystemNQN, NSID: at.NSID}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := connectTo(ctx, first)
	if err != nil {
		return nil, err
	}
	r := newVolumeResolver(e.api, vol, at.Transport)
	// Learn the other members' APIs now, while --api answers: it may be
	// the node that dies. A failure here only leaves the list short.
	_, _ = r.resolve(ctx)
	d, err := failover.New(failover.Config{
		Resolve: r.resolve,
		Connect: connectTo,
		Logf: func(format string, args ...any) {
			fmt.Fprintf(e.stderr, "blkctl: volume %s: %s\n", vol, fmt.Sprintf(format, args...))
		},
	}, p)
	if err != nil {
		p.Close()
		return nil, err
	}
	return d, nil
}

// volumeResolver finds where a volume is served now: its primary (GET
// /v1/volumes/{name}, Node) and that node's port of the attachment's
// transport (GET /v1/cluster). It asks the --api node first and, when
// that does not answer (it may be the node that died), every other
// member's API that a cluster answer named, the last one that answered
// first.
type volumeResolver struct {
	vol, transport string
	scheme         string
	hc             *http.Client // shares the --api client's TLS settings

	mu   sync.Mutex
	apis []*client // the last that answered first
}

func newVolumeResolver(c *client, vol, transport string) *volumeResolver {
	scheme, _, _ := strings.Cut(c.base, "://")
	hc := &http.Client{Transport: c.hc.Transport, Timeout: resolveRequestTimeout, CheckRedirect: checkRedirect}
	return &volumeResolver{vol: vol, transport: transport, scheme: scheme, hc: hc,
		apis: []*client{{base: c.base, hc: hc, stderr: c.stderr}}}
}

func (r *volumeResolver) resolve(ctx context.Context) (failover.Endpoint, error) {
	r.mu.Lock()
	apis := append([]*client(nil), r.apis...)
	r.mu.Unlock()
	var errs []string
	for _, c := range apis {
		ep, members, err := r.ask(ctx, c)
		if err == nil {
			r.learn(c, members)
			return ep, nil
		}
		errs = append(errs, err.Error())
		var ae *apiError
		if ctx.Err() != nil || errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			break // out of time, or the volume is gone: no other node knows better
		}
	}
	return failover.Endpoint{}, errors.New(strings.Join(errs, "; "))
}

// ask asks one node's API.
func (r *volumeResolver) ask(ctx context.Context, c *client) (failover.Endpoint, []member, error) {
	var v volume
	if err := c.get(ctx, volPath(r.vol), &v); err != nil {
		return failover.Endpoint{}, nil, err
	}
	var ci clusterInfo
	if err := c.get(ctx, "/v1/cluster", &ci); err != nil {
		return failover.Endpoint{}, nil, err
	}
	at, ok := servedBy(v, ci.Members)
	if !ok {
		return failover.Endpoint{}, ci.Members, fmt.Errorf("blkd at %s: the registry knows no NVMe address of node %s, primary of %s", c.base, v.Node, r.vol)
	}
	for _, ep := range at.Endpoints {
		if ep.Transport == r.transport {
			return failover.Endpoint{Transport: ep.Transport, Addr: net.JoinHostPort(ep.Address, strconv.Itoa(ep.Port)),
				SubNQN: at.SubsystemNQN, NSID: at.NSID}, ci.Members, nil
		}
	}
	return failover.Endpoint{}, ci.Members, fmt.Errorf("blkd at %s: node %s, primary of %s, does not serve it over %s", c.base, v.Node, r.vol, r.transport)
}

// learn puts c first and adds the API of every member it named.
func (r *volumeResolver) learn(c *client, members []member) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []*client{c}
	seen := map[string]bool{c.base: true}
	for _, old := range r.apis {
		if !seen[old.base] {
			seen[old.base] = true
			out = append(out, old)
		}
	}
	for _, m := range members {
		if m.APIAddr == "" {
			continue
		}
		base := r.scheme + "://" + m.APIAddr
		if !seen[base] {
			seen[base] = true
			out = append(out, &client{base: base, hc: r.hc, stderr: c.stderr})
		}
	}
	r.apis = out
}
