package csi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/initiator/failover"
	"github.com/blk-project/blk/initiator/nbd"
)

// nbdVolume is a volume attached through NBD (§1.10.1): blk's own
// initiator over NVMe/TCP in this process, served to the kernel as
// /dev/nbdN. It lives only as long as the process: the node service
// reattaches the staged NBD volumes at start (node.start).
type nbdVolume struct {
	att  *nbd.Attachment
	dev  *failover.Device
	ctrl atomic.Pointer[initiator.Controller] // the current path's
}

func (v *nbdVolume) healthy() bool {
	c := v.ctrl.Load()
	return c != nil && c.State() == initiator.StateLive
}

func (h *kernelHost) nbdVolume(subNQN string) *nbdVolume {
	h.nbdMu.Lock()
	defer h.nbdMu.Unlock()
	return h.nbd[subNQN]
}

// nbdMax bounds the search for a free NBD device: the module's default
// nbds_max is 16.
const nbdMax = 128

// freeNBD is the first /dev/nbdN the kernel does not use (no pid in
// /sys/block/nbdN) and no attachment of this process holds.
func (h *kernelHost) freeNBD() (string, error) {
	if _, err := os.Stat("/dev/nbd0"); err != nil {
		return "", fmt.Errorf("%w (no /dev/nbd0)", nbd.ErrNoModule)
	}
	held := map[string]bool{}
	for _, v := range h.nbd {
		held[v.att.Device()] = true
	}
	for i := 0; i < nbdMax; i++ {
		dev := fmt.Sprintf("/dev/nbd%d", i)
		if _, err := os.Stat(dev); err != nil {
			break
		}
		if held[dev] {
			continue
		}
		if _, err := os.Stat(filepath.Join(h.sys, "block", fmt.Sprintf("nbd%d", i), "pid")); err == nil {
			continue // connected by someone else
		}
		return dev, nil
	}
	return "", errors.New("no free /dev/nbdN (load nbd with a larger nbds_max)")
}

// connectNBD connects blk's initiator to the volume and attaches it to a
// free NBD device. The paths are the publish context's endpoints; when
// the one in use fails (a failover moved the volume's primary), the
// failover device tries the next, round robin, until one serves.
func (h *kernelHost) connectNBD(ctx context.Context, c Connection) (string, error) {
	h.nbdMu.Lock()
	defer h.nbdMu.Unlock()
	if v := h.nbd[c.SubNQN]; v != nil {
		return v.att.Device(), nil
	}
	if len(c.Endpoints) == 0 {
		return "", fmt.Errorf("no endpoint to connect %s through", c.SubNQN)
	}
	v := &nbdVolume{}
	connect := func(ctx context.Context, ep failover.Endpoint) (failover.Path, error) {
		cfg := initiator.Config{Transport: initiator.TransportTCP, HostNQN: c.HostNQN,
			DHCHAPSecret: c.DHCHAPSecret, DHCHAPCtrlSecret: c.DHCHAPCtrlSecret,
			Logf: func(format string, args ...any) {
				h.log.Info(fmt.Sprintf(format, args...), "subnqn", c.SubNQN, "addr", ep.Addr)
			}}
		if id, ok := parseHostID(c.HostID); ok {
			cfg.HostID = id
		}
		ctrl, err := initiator.Connect(ctx, cfg, ep.Addr, ep.SubNQN)
		if err != nil {
			return failover.Path{}, fmt.Errorf("connect %s at %s: %w", ep.SubNQN, ep.Addr, err)
		}
		ns := ctrl.Namespace(ep.NSID)
		if ns == nil {
			ctrl.Close()
			return failover.Path{}, fmt.Errorf("%s at %s has no namespace %d", ep.SubNQN, ep.Addr, ep.NSID)
		}
		v.ctrl.Store(ctrl)
		return failover.Path{Endpoint: ep, Namespace: ns}, nil
	}
	nsid := c.NSID
	if nsid == 0 {
		nsid = 1
	}
	eps := make([]failover.Endpoint, len(c.Endpoints))
	for i, e := range c.Endpoints {
		eps[i] = failover.Endpoint{Transport: "tcp", Addr: e.Addr, SubNQN: c.SubNQN, NSID: nsid}
	}
	var first failover.Path
	var errs []error
	for _, ep := range eps {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		p, err := connect(cctx, ep)
		cancel()
		if err == nil {
			first = p
			break
		}
		errs = append(errs, err)
	}
	if first.Namespace == nil {
		return "", errors.Join(errs...)
	}
	var next atomic.Int64
	resolve := func(ctx context.Context) (failover.Endpoint, error) {
		return eps[int(next.Add(1))%len(eps)], nil
	}
	dev, err := failover.New(failover.Config{Resolve: resolve, Connect: connect,
		Logf: func(format string, args ...any) { h.log.Warn(fmt.Sprintf(format, args...), "subnqn", c.SubNQN) }}, first)
	if err != nil {
		first.Namespace.Controller().Close()
		return "", err
	}
	devPath, err := h.freeNBD()
	if err != nil {
		dev.Close()
		return "", err
	}
	att, err := nbd.Attach(devPath, dev)
	if err != nil {
		dev.Close()
		return "", err
	}
	v.att, v.dev = att, dev
	h.nbd[c.SubNQN] = v
	h.log.Info("volume attached over NBD", "subnqn", c.SubNQN, "device", devPath, "addr", first.Endpoint.Addr)
	return devPath, nil
}

func (h *kernelHost) disconnectNBD(subNQN string) error {
	h.nbdMu.Lock()
	v := h.nbd[subNQN]
	delete(h.nbd, subNQN)
	h.nbdMu.Unlock()
	if v == nil {
		return nil
	}
	err := v.att.Detach()
	return errors.Join(err, v.dev.Close())
}

// closeNBD detaches every NBD volume (the plugin stopping: the devices
// could not outlive the process anyway, and a detach flushes the
// kernel's queue first).
func (h *kernelHost) closeNBD() error {
	h.nbdMu.Lock()
	subs := make([]string, 0, len(h.nbd))
	for s := range h.nbd {
		subs = append(subs, s)
	}
	h.nbdMu.Unlock()
	var errs []error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, s := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.disconnectNBD(s); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
