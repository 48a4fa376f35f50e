package csi

import (
	"bytes"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
)

// kernelHost is the real Host: the kernel's NVMe/TCP host through
// /dev/nvme-fabrics and /sys (this file), the NBD fallback (nbd.go), and
// filesystems and mounts (mount.go).
type kernelHost struct {
	log       *slog.Logger
	sys       string // "/sys"
	fabrics   string // "/dev/nvme-fabrics"
	mountinfo string // "/proc/self/mountinfo"
	// deviceWait bounds the wait for a connected namespace's block
	// device (udev-less: the node in /dev is devtmpfs's).
	deviceWait time.Duration

	nbdMu sync.Mutex
	nbd   map[string]*nbdVolume // subsystem NQN -> attachment (nbd.go)
}

// NewHost is the Host of a real node: the kernel's NVMe/TCP host, NBD,
// and mount(2). cmd/blk-csi passes it as Config.Host in node mode.
func NewHost(log *slog.Logger) Host {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &kernelHost{log: log, sys: "/sys", fabrics: "/dev/nvme-fabrics", mountinfo: "/proc/self/mountinfo",
		deviceWait: 10 * time.Second, nbd: map[string]*nbdVolume{}}
}

// connectString is what /dev/nvme-fabrics is given to connect one path,
// as nvme-cli writes it: ctrl_loss_tmo=-1 keeps the kernel reconnecting
// for ever (a volume's node restarting must not fail the file system
// above; NodeUnstage deletes the controller), and the DH-HMAC-CHAP
// secrets when the volume has them.
func connectString(c Connection, traddr, trsvcid string) string {
	s := fmt.Sprintf("transport=tcp,traddr=%s,trsvcid=%s,nqn=%s,hostnqn=%s", traddr, trsvcid, c.SubNQN, c.HostNQN)
	if c.HostID != "" {
		s += ",hostid=" + c.HostID
	}
	s += ",ctrl_loss_tmo=-1"
	if c.DHCHAPSecret != "" {
		s += ",dhchap_secret=" + c.DHCHAPSecret
	}
	if c.DHCHAPCtrlSecret != "" {
		s += ",dhchap_ctrl_secret=" + c.DHCHAPCtrlSecret
	}
	return s
}

// parseAddress reads /sys/class/nvme/nvmeN/address:
// "traddr=10.0.2.2,trsvcid=4420[,src_addr=...]".
func parseAddress(s string) map[string]string {
	m := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSpace(s), ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// ctrl is one kernel controller of a subsystem.
type ctrl struct {
	name            string // "nvme3"
	traddr, trsvcid string
	state           string // "live", "connecting", ...
}

func (h *kernelHost) readSys(parts ...string) string {
	b, err := os.ReadFile(filepath.Join(append([]string{h.sys}, parts...)...))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// controllers lists the kernel controllers of subNQN, by name.
func (h *kernelHost) controllers(subNQN string) ([]ctrl, error) {
	ents, err := os.ReadDir(filepath.Join(h.sys, "class", "nvme"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []ctrl
	for _, e := range ents {
		if h.readSys("class", "nvme", e.Name(), "subsysnqn") != subNQN {
			continue
		}
		a := parseAddress(h.readSys("class", "nvme", e.Name(), "address"))
		out = append(out, ctrl{name: e.Name(), traddr: a["traddr"], trsvcid: a["trsvcid"],
			state: h.readSys("class", "nvme", e.Name(), "state")})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

var (
	// headName is a namespace's disk: the multipath head, or without
	// multipath the path's own; hidden path disks (nvme1c2n1) never match.
	headName = regexp.MustCompile(`^nvme\d+n\d+$`)
	instance = regexp.MustCompile(`instance=(\d+)`) // the connect's answer
)

// namespaceDevice finds the block device of namespace nsid (0: any) of
// the subsystem: with native multipath, the head under
// /sys/class/nvme-subsystem/nvme-subsysX/ (one device over every path);
// without, the namespace disk under the first controller.
func (h *kernelHost) namespaceDevice(subNQN string, nsid uint32, ctrls []ctrl) string {
	var dirs []string
	subs, _ := os.ReadDir(filepath.Join(h.sys, "class", "nvme-subsystem"))
	for _, s := range subs {
		if h.readSys("class", "nvme-subsystem", s.Name(), "subsysnqn") == subNQN {
			dirs = append(dirs, filepath.Join(h.sys, "class", "nvme-subsystem", s.Name()))
		}
	}
	for _, c := range ctrls {
		dirs = append(dirs, filepath.Join(h.sys, "class", "nvme", c.name))
	}
	for _, d := range dirs {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if !headName.MatchString(e.Name()) {
				continue
			}
			if nsid != 0 {
				b, err := os.ReadFile(filepath.Join(d, e.Name(), "nsid"))
				if err == nil && strings.TrimSpace(string(b)) != strconv.FormatUint(uint64(nsid), 10) {
					continue
				}
			}
			return "/dev/" + e.Name()
		}
	}
	return ""
}

// Connect attaches the subsystem: over NBD for transport "nbd" (nbd.go),
// else through the kernel's NVMe/TCP host, one controller per path the
// discovery log lists for this host (§1.10 step 2).
func (h *kernelHost) Connect(ctx context.Context, c Connection) (string, error) {
	if c.Transport == "nbd" {
		return h.connectNBD(ctx, c)
	}
	if c.Transport != "" && c.Transport != "tcp" {
		return "", fmt.Errorf("transport %q is not tcp or nbd", c.Transport)
	}
	if err := h.loadTCP(ctx); err != nil {
		return "", err
	}
	paths, err := h.discover(ctx, c)
	if err != nil {
		return "", err
	}
	existing, err := h.controllers(c.SubNQN)
	if err != nil {
		return "", err
	}
	var errs []error
	connected := 0
	for _, p := range paths {
		host, port, _ := net.SplitHostPort(p.Addr)
		if slicesContainsCtrl(existing, host, port) {
			connected++
			continue
		}
		name, err := h.writeFabrics(connectString(c, host, port))
		if err != nil {
			hint := ""
			if c.DHCHAPSecret != "" && errors.Is(err, syscall.EIO) {
				// What Linux answers a failed DH-HMAC-CHAP (dmesg:
				// "qid 0: authentication failed").
				hint = " (with DH-HMAC-CHAP a wrong secret fails so: is the node-stage secret the one the volume allows?)"
			}
			errs = append(errs, fmt.Errorf("connect %s at %s: %w%s", c.SubNQN, p.Addr, err, hint))
			continue
		}
		h.log.Info("nvme-tcp path connected", "subnqn", c.SubNQN, "addr", p.Addr, "controller", name)
		connected++
	}
	if connected == 0 {
		return "", errors.Join(errs...)
	}
	for _, e := range errs {
		h.log.Warn("a path of the volume did not connect", "subnqn", c.SubNQN, "err", e)
	}
	return h.waitDevice(ctx, c.SubNQN, c.NSID)
}

func slicesContainsCtrl(cs []ctrl, host, port string) bool {
	for _, c := range cs {
		if c.traddr == host && c.trsvcid == port {
			return true
		}
	}
	return false
}

// loadTCP makes sure the kernel has the NVMe-oF host and its TCP
// transport: modprobe nvme-tcp (which loads nvme-fabrics) when
// /dev/nvme-fabrics is missing.
func (h *kernelHost) loadTCP(ctx context.Context) error {
	if _, err := os.Stat(h.fabrics); err == nil {
		return nil
	}
	out, err := h.run(ctx, "modprobe", "nvme-tcp")
	if _, serr := os.Stat(h.fabrics); serr != nil {
		return fmt.Errorf("%s is missing and modprobe nvme-tcp failed (%v: %s): the node's kernel has no NVMe/TCP host; use transport nbd", h.fabrics, err, lastLine(out))
	}
	return nil
}

// discover reads the volume's paths from the discovery log of the first
// endpoint, through blk's own initiator as this host (the log lists only
// what this host is allowed on, so ControllerPublish must have run), and
// keeps the TCP entries of the volume's subsystem; every replica's node
// exports it with ANA. If the discovery controller cannot be reached the
// publish context's endpoints are used as they are.
func (h *kernelHost) discover(ctx context.Context, c Connection) ([]Endpoint, error) {
	if len(c.Endpoints) == 0 {
		return nil, fmt.Errorf("no endpoint to connect %s through", c.SubNQN)
	}
	cfg := initiator.Config{Transport: initiator.TransportTCP, HostNQN: c.HostNQN, Queues: 1,
		ConnectTimeout: 5 * time.Second, AdminTimeout: 10 * time.Second,
		DHCHAPSecret: c.DHCHAPSecret, DHCHAPCtrlSecret: c.DHCHAPCtrlSecret}
	if id, ok := parseHostID(c.HostID); ok {
		cfg.HostID = id
	}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	entries, err := initiator.Discover(dctx, cfg, c.Endpoints[0].Addr)
	if err != nil {
		h.log.Warn("discovery failed; connecting the publish context's endpoints", "subnqn", c.SubNQN,
			"addr", c.Endpoints[0].Addr, "err", err)
		return c.Endpoints, nil
	}
	var out []Endpoint
	for i := range entries {
		e := &entries[i]
		if e.TrType != nvme.TrTypeTCP || e.SubNQN.String() != c.SubNQN {
			continue
		}
		addr := net.JoinHostPort(padded(e.TrAddr[:]), padded(e.TrSvcID[:]))
		if !containsEndpoint(out, addr) {
			out = append(out, Endpoint{Addr: addr})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the discovery log at %s lists no NVMe/TCP path of %s for host %s: is the volume published to this node?",
			c.Endpoints[0].Addr, c.SubNQN, c.HostNQN)
	}
	return out, nil
}

func containsEndpoint(es []Endpoint, addr string) bool {
	for _, e := range es {
		if e.Addr == addr {
			return true
		}
	}
	return false
}

// padded is a discovery log string field: space- or NUL-padded.
func padded(b []byte) string { return strings.TrimRight(string(b), " \x00") }

// writeFabrics writes one connect string to /dev/nvme-fabrics and
// returns the new controller's name from the answer
// ("instance=N,cntlid=M"). The write's error is the connect's: the
// kernel's errno (a refused host, a failed authentication, no route).
func (h *kernelHost) writeFabrics(opts string) (string, error) {
	f, err := os.OpenFile(h.fabrics, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.Write([]byte(opts)); err != nil {
		return "", err // the kernel's errno; the options (secrets) are not in it
	}
	buf := make([]byte, 256)
	n, err := f.Read(buf)
	if err != nil {
		return "", fmt.Errorf("reading the connect's answer: %w", err)
	}
	m := instance.FindSubmatch(buf[:n])
	if m == nil {
		return "", fmt.Errorf("unexpected answer %q from %s", bytes.TrimSpace(buf[:n]), h.fabrics)
	}
	return "nvme" + string(m[1]), nil
}

// waitDevice waits for the namespace's block device to appear under /sys
// and /dev.
func (h *kernelHost) waitDevice(ctx context.Context, subNQN string, nsid uint32) (string, error) {
	deadline := time.Now().Add(h.deviceWait)
	for {
		ctrls, err := h.controllers(subNQN)
		if err != nil {
			return "", err
		}
		if dev := h.namespaceDevice(subNQN, nsid, ctrls); dev != "" {
			if _, err := os.Stat(dev); err == nil {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			states := make([]string, len(ctrls))
			for i, c := range ctrls {
				states[i] = c.name + " " + c.state
			}
			return "", fmt.Errorf("no block device for namespace %d of %s within %v (controllers: %s)",
				nsid, subNQN, h.deviceWait, strings.Join(states, ", "))
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (h *kernelHost) Device(ctx context.Context, subNQN string) (string, bool, error) {
	if v := h.nbdVolume(subNQN); v != nil {
		return v.att.Device(), true, nil
	}
	ctrls, err := h.controllers(subNQN)
	if err != nil || len(ctrls) == 0 {
		return "", false, err
	}
	dev := h.namespaceDevice(subNQN, 0, ctrls)
	return dev, dev != "", nil
}

// Disconnect deletes every controller of the subsystem
// (delete_controller), or detaches its NBD device.
func (h *kernelHost) Disconnect(ctx context.Context, subNQN string) error {
	if h.nbdVolume(subNQN) != nil {
		return h.disconnectNBD(subNQN)
	}
	ctrls, err := h.controllers(subNQN)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range ctrls {
		err := os.WriteFile(filepath.Join(h.sys, "class", "nvme", c.name, "delete_controller"), []byte("1"), 0)
		if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, os.ErrInvalid) {
			errs = append(errs, fmt.Errorf("delete controller %s of %s: %w", c.name, subNQN, err))
			continue
		}
		h.log.Info("nvme controller deleted", "subnqn", subNQN, "controller", c.name, "state", c.state)
	}
	return errors.Join(errs...)
}

func (h *kernelHost) Healthy(ctx context.Context, subNQN string) (bool, error) {
	if v := h.nbdVolume(subNQN); v != nil {
		return v.healthy(), nil
	}
	ctrls, err := h.controllers(subNQN)
	if err != nil || len(ctrls) == 0 {
		return false, err
	}
	for _, c := range ctrls {
		if c.state != "live" {
			return false, nil
		}
	}
	return true, nil
}

// Rescan asks every controller of the subsystem to rescan its namespaces
// (rescan_controller): the size a resize gave, when the namespace change
// notice has not been acted on yet.
func (h *kernelHost) Rescan(ctx context.Context, subNQN string) error {
	ctrls, err := h.controllers(subNQN)
	if err != nil {
		return err
	}
	for _, c := range ctrls {
		if err := os.WriteFile(filepath.Join(h.sys, "class", "nvme", c.name, "rescan_controller"), []byte("1"), 0); err != nil {
			return fmt.Errorf("rescan %s: %w", c.name, err)
		}
	}
	return nil
}

// Probe is ready when the node can attach a volume: the kernel's NVMe-oF
// host is there (or can be loaded), or the NBD driver is.
func (h *kernelHost) Probe(ctx context.Context) error {
	if err := h.loadTCP(ctx); err == nil {
		return nil
	}
	if _, err := os.Stat("/dev/nbd0"); err == nil {
		return nil
	}
	return fmt.Errorf("neither %s (modprobe nvme-tcp failed) nor /dev/nbd0 exists: this node cannot attach volumes", h.fabrics)
}

// Node identity (§1.4).

const uuidNQNPrefix = "nqn.2014-08.org.nvmexpress:uuid:"

// nodeIDNamespace is the UUIDv5 namespace of host NQNs derived from
// /etc/machine-id (a random UUID chosen for blk-csi; fixed for ever, or
// every node's NQN would change).
var nodeIDNamespace = [16]byte{0x6b, 0x0e, 0x3f, 0x52, 0x1c, 0x8a, 0x4f, 0x27, 0x9d, 0x41, 0x5e, 0x03, 0xa2, 0x7c, 0x19, 0xd6}

// NodeIdentity is the node's host NQN (its CSI node ID) and the kernel's
// host ID (§1.4). The NQN: hostNQN if set, else /etc/nvme/hostnqn, else
// one derived from /etc/machine-id (a UUIDv5; nothing is written to
// /etc); none of the three is an error naming them. The host ID: hostID
// if set, else /etc/nvme/hostid, else the NQN's UUID when it is a uuid:
// NQN, else a UUID derived from the machine ID (or, without one, from the
// NQN).
func NodeIdentity(hostNQN, hostID string) (nqn, id string, err error) {
	return nodeIdentity("/", hostNQN, hostID)
}

func nodeIdentity(root, hostNQN, hostID string) (string, string, error) {
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	machine := read("etc/machine-id")
	nqn := hostNQN
	if nqn == "" {
		nqn = read("etc/nvme/hostnqn")
	}
	if nqn == "" && machine != "" {
		nqn = uuidNQNPrefix + uuidString(uuidV5(nodeIDNamespace, "hostnqn:"+machine))
	}
	if nqn == "" {
		return "", "", errors.New("no host NQN: set --host-nqn, or provide /etc/nvme/hostnqn or /etc/machine-id")
	}
	if err := nvme.ValidateNQN(nqn); err != nil {
		return "", "", fmt.Errorf("host NQN %q: %v", nqn, err)
	}
	id := hostID
	if id == "" {
		id = read("etc/nvme/hostid")
	}
	if id == "" {
		if u, ok := parseHostID(strings.TrimPrefix(nqn, uuidNQNPrefix)); ok && strings.HasPrefix(nqn, uuidNQNPrefix) {
			id = uuidString(u)
		} else if machine != "" {
			id = uuidString(uuidV5(nodeIDNamespace, "hostid:"+machine))
		} else {
			id = uuidString(uuidV5(nodeIDNamespace, "hostid-of-nqn:"+nqn))
		}
	}
	u, ok := parseHostID(id)
	if !ok {
		return "", "", fmt.Errorf("host ID %q is not a UUID", id)
	}
	return nqn, uuidString(u), nil
}

// uuidV5 is RFC 9562's name-based UUID (SHA-1).
func uuidV5(ns [16]byte, name string) [16]byte {
	h := sha1.New()
	h.Write(ns[:])
	h.Write([]byte(name))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0F | 0x50
	u[8] = u[8]&0x3F | 0x80
	return u
}

func uuidString(u [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// parseHostID parses a UUID in its 8-4-4-4-12 form.
func parseHostID(s string) ([16]byte, bool) {
	var u [16]byte
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	hex := strings.ReplaceAll(s, "-", "")
	for i := 0; i < 16; i++ {
		v, err := strconv.ParseUint(hex[2*i:2*i+2], 16, 8)
		if err != nil {
			return u, false
		}
		u[i] = byte(v)
	}
	return u, true
}
