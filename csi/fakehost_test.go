package csi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// fakeHost is the machine without a kernel: it keeps connected subsystems,
// filesystems and mounts in maps and records every call, so the node
// service's own rules run without root (csi-sanity's node part on the
// host, §8.1). The real Host is exercised in the e2e guest (§8.2).
type fakeHost struct {
	mu        sync.Mutex
	next      int
	conns     map[string]fakeConn  // subNQN -> connection
	fs        map[string]string    // device -> fstype
	sizes     map[string]int64     // device -> bytes
	mounts    map[string]fakeMount // target -> mount
	calls     []string             // "Connect nqn", "Mkfs dev ext4", ...
	failNext  map[string]error     // method -> error returned once
	unhealthy map[string]bool      // subNQN -> a controller is not live
	// volumeSize, if set, is the size of the subsystem's namespace as the
	// target has it now: the fake kernel sees a resize through it, as
	// the real one does through the namespace change notice (csi-sanity
	// on the host expands volumes before staging them).
	volumeSize func(subNQN string) (int64, bool)
}

type fakeConn struct {
	c      Connection
	device string
}

type fakeMount struct {
	source, fstype string
	options        []string
}

func newFakeHost() *fakeHost {
	return &fakeHost{
		conns:     map[string]fakeConn{},
		fs:        map[string]string{},
		sizes:     map[string]int64{},
		mounts:    map[string]fakeMount{},
		failNext:  map[string]error{},
		unhealthy: map[string]bool{},
	}
}

// record notes a call and returns the error armed for its method, once.
func (h *fakeHost) record(method string, args ...string) error {
	h.calls = append(h.calls, strings.Join(append([]string{method}, args...), " "))
	if err := h.failNext[method]; err != nil {
		delete(h.failNext, method)
		return err
	}
	return nil
}

func (h *fakeHost) Connect(ctx context.Context, c Connection) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.record("Connect", c.SubNQN); err != nil {
		return "", err
	}
	if fc, ok := h.conns[c.SubNQN]; ok {
		return fc.device, nil
	}
	h.next++
	dev := fmt.Sprintf("/dev/nvme%dn1", h.next)
	h.conns[c.SubNQN] = fakeConn{c: c, device: dev}
	if _, ok := h.sizes[dev]; !ok {
		h.sizes[dev] = 64 << 20
	}
	return dev, nil
}

func (h *fakeHost) Device(ctx context.Context, subNQN string) (string, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fc, ok := h.conns[subNQN]
	return fc.device, ok, nil
}

func (h *fakeHost) Disconnect(ctx context.Context, subNQN string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.record("Disconnect", subNQN); err != nil {
		return err
	}
	delete(h.conns, subNQN)
	return nil
}

func (h *fakeHost) Healthy(ctx context.Context, subNQN string) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.conns[subNQN]
	return ok && !h.unhealthy[subNQN], nil
}

func (h *fakeHost) DeviceSize(ctx context.Context, device string) (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub, fc := range h.conns {
		if fc.device == device && h.volumeSize != nil {
			if n, ok := h.volumeSize(sub); ok {
				h.sizes[device] = n
			}
		}
	}
	n, ok := h.sizes[device]
	if !ok {
		return 0, fmt.Errorf("fake host: no device %s", device)
	}
	return n, nil
}

func (h *fakeHost) FSType(ctx context.Context, device string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fs[device], h.record("FSType", device)
}

func (h *fakeHost) Mkfs(ctx context.Context, device, fstype string, options []string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.record("Mkfs", append([]string{device, fstype}, options...)...); err != nil {
		return err
	}
	h.fs[device] = fstype
	return nil
}

func (h *fakeHost) Resize(ctx context.Context, device, path, fstype string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.record("Resize", device, path, fstype)
}

// Mount creates nothing on disk but needs the target to exist, as the
// kernel does.
func (h *fakeHost) Mount(ctx context.Context, source, target, fstype string, options []string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.record("Mount", source, target, fstype, strings.Join(options, ",")); err != nil {
		return err
	}
	if _, err := os.Stat(target); err != nil {
		return fmt.Errorf("fake host: mount %s: %w", target, err)
	}
	// A bind mount of a mounted directory shows the directory's device.
	if m, ok := h.mounts[filepath.Clean(source)]; ok && fstype == "" {
		source = m.source
	}
	h.mounts[filepath.Clean(target)] = fakeMount{source: source, fstype: fstype, options: options}
	return nil
}

func (h *fakeHost) Unmount(ctx context.Context, target string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.record("Unmount", target); err != nil {
		return err
	}
	delete(h.mounts, filepath.Clean(target))
	return nil
}

func (h *fakeHost) Mounted(ctx context.Context, target string) (string, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.mounts[filepath.Clean(target)]
	return m.source, ok, nil
}

func (h *fakeHost) Stats(ctx context.Context, path string) (Usage, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.mounts[filepath.Clean(path)]
	if !ok {
		return Usage{}, fmt.Errorf("fake host: %s is not mounted", path)
	}
	total := h.sizes[m.source]
	return Usage{BytesTotal: total, BytesAvailable: total, InodesTotal: total >> 14, InodesAvailable: total >> 14}, nil
}

var _ Host = (*fakeHost)(nil)
