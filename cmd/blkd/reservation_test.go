package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blk-project/blk/initiator"
	"github.com/blk-project/blk/nvme"
)

// Persistent reservations kept by the registry (docs/reservations.md
// §7.5): blk's initiator plays two hosts, A and B, each with a host
// identifier of its own (a registration is a host identifier's).

const (
	resvHostA = "nqn.2026-11.io.blk:resv-host-a"
	resvHostB = "nqn.2026-11.io.blk:resv-host-b"
	keyA      = 0xA1
	keyB      = 0xB2
	rtypeWE   = 1 // Write Exclusive
)

var resvHostIDs = map[string][16]byte{
	resvHostA: {0xA, 0xA, 0xA, 0xA, 1},
	resvHostB: {0xB, 0xB, 0xB, 0xB, 2},
}

// resvVolumeJSON is a volume with its reservation (api.Reservation).
type resvVolumeJSON struct {
	Name        string `json:"name"`
	ID          uint64 `json:"id"`
	Node        string `json:"node"`
	Epoch       uint64 `json:"epoch"`
	NQN         string `json:"nqn"`
	Reservation *struct {
		Gen         uint32 `json:"gen"`
		Type        string `json:"type"`
		Holder      string `json:"holder"`
		HolderNQN   string `json:"holder_nqn"`
		PTPL        bool   `json:"ptpl"`
		Registrants []struct {
			HostID  string `json:"host_id"`
			HostNQN string `json:"host_nqn"`
			Key     uint64 `json:"key"`
			Holder  bool   `json:"holder"`
		} `json:"registrants"`
	} `json:"reservation"`
}

// resvConfig is host's initiator configuration: its own host ID, a long
// I/O timeout (a reservation command is a registry commit), multipath's
// reconnect behaviour.
func resvConfig(host string) initiator.Config {
	cfg := multipathConfig
	cfg.HostNQN, cfg.HostID = host, resvHostIDs[host]
	cfg.IOTimeout = 20 * time.Second
	return cfg
}

// resvConnect connects host to nqn at addr (one path).
func resvConnect(t *testing.T, host, addr, nqn string) *initiator.Namespace {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ctrl, err := initiator.Connect(ctx, resvConfig(host), addr, nqn)
	if err != nil {
		t.Fatalf("%s: connect to %s at %s: %v", host, nqn, addr, err)
	}
	t.Cleanup(func() { ctrl.Close() })
	if ctrl.Namespace(1) == nil {
		t.Fatalf("%s: %s has no namespace 1", host, nqn)
	}
	return ctrl.Namespace(1)
}

// isStatus says whether err is an NVMe status of code st (DNR aside).
func isStatus(err error, st nvme.Status) bool {
	var se *initiator.StatusError
	return errors.As(err, &se) && se.Status.Code() == st.Code()
}

// pathError says whether err is one a multipath host retries on a path:
// a path status, Namespace Not Ready (a view not known yet, no leader),
// a lost connection or a path given up (its node gone).
func pathError(err error) bool {
	var se *initiator.StatusError
	if errors.As(err, &se) {
		return se.Status.SCT() == nvme.SCTPath || se.Status.Code() == nvme.StatusNamespaceNotReady
	}
	return errors.Is(err, initiator.ErrConnectionLost) || errors.Is(err, initiator.ErrControllerLost) ||
		errors.Is(err, initiator.ErrNamespaceRemoved) || errors.Is(err, context.DeadlineExceeded)
}

// onAnyPath runs f on each of paths until one answers it with something
// other than a path error, for at most within (a multipath host's way
// with a reservation command: Linux sends it on the optimized path, and
// its caller retries a path failure). It returns that answer.
func onAnyPath(paths []*initiator.Namespace, within time.Duration, f func(ns *initiator.Namespace) error) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		for _, ns := range paths {
			err := f(ns)
			if err == nil || !pathError(err) {
				return err
			}
			last = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no path answered within %v (last: %w)", within, last)
}

// resvHost is one host's paths to one volume.
type resvHost struct {
	t      *testing.T
	host   string
	paths  []*initiator.Namespace
	byNode map[string]*initiator.Namespace // resvPaths': each node's path
}

// notice reads the oldest Reservation Notification log entry of the
// host's controller ns.
func (h *resvHost) notice(ns *initiator.Namespace) nvme.ResvNotifLog {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := ns.Controller().ReservationNotice(ctx)
	if err != nil {
		h.t.Fatalf("%s: reservation notification log: %v", h.host, err)
	}
	return n
}

// mustNotice checks the oldest entry of ns's log is one notice of kind.
func (h *resvHost) mustNotice(what string, ns *initiator.Namespace, kind uint8) {
	h.t.Helper()
	if n := h.notice(ns); n.Count == 0 || n.Type != kind || n.NSID != 1 {
		h.t.Fatalf("%s: %s's notice %+v, want type %d on NSID 1", what, h.host, n, kind)
	}
}

func (h *resvHost) do(what string, f func(ctx context.Context, ns *initiator.Namespace) error) error {
	return onAnyPath(h.paths, 40*time.Second, func(ns *initiator.Namespace) error {
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		return f(ctx, ns)
	})
}

func (h *resvHost) register(key uint64, cptpl uint8) error {
	return h.do("register", func(ctx context.Context, ns *initiator.Namespace) error {
		return ns.ReservationRegister(ctx, nvme.RREGARegister, 0, key, false, cptpl)
	})
}

func (h *resvHost) acquire(action uint8, crkey, prkey uint64) error {
	return h.do("acquire", func(ctx context.Context, ns *initiator.Namespace) error {
		return ns.ReservationAcquire(ctx, action, rtypeWE, crkey, prkey, false)
	})
}

func (h *resvHost) report() initiator.ReservationStatus {
	h.t.Helper()
	var st initiator.ReservationStatus
	err := h.do("report", func(ctx context.Context, ns *initiator.Namespace) error {
		var err error
		st, err = ns.ReservationReport(ctx)
		return err
	})
	if err != nil {
		h.t.Fatalf("%s: reservation report: %v", h.host, err)
	}
	return st
}

// write writes one block of b at block lba through the serving path.
func (h *resvHost) write(lba int64, b byte) error {
	return onAnyPath(h.paths, 40*time.Second, func(ns *initiator.Namespace) error {
		_, err := ns.WriteAt(pattern(b, 4096), lba*4096)
		return err
	})
}

// read reads one block at lba through the serving path.
func (h *resvHost) read(lba int64) ([]byte, error) {
	got := make([]byte, 4096)
	err := onAnyPath(h.paths, 40*time.Second, func(ns *initiator.Namespace) error {
		_, err := ns.ReadAt(got, lba*4096)
		return err
	})
	return got, err
}

func mustOK(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// mustConflict checks err is Reservation Conflict.
func mustConflict(t *testing.T, what string, err error) {
	t.Helper()
	if !isStatus(err, nvme.StatusReservationConflict) {
		t.Fatalf("%s: %v, want Reservation Conflict", what, err)
	}
}

// checkReport checks a report: generation, the type held, the holder's
// host (nil: none) and the registrants' keys by host.
func checkReport(t *testing.T, who string, st initiator.ReservationStatus, gen uint32, rtype uint8, holder string, keys map[string]uint64) {
	t.Helper()
	got := map[[16]byte]uint64{}
	var holds [][16]byte
	for _, r := range st.Registrants {
		got[r.HostID] = r.Key
		if r.Holder {
			holds = append(holds, r.HostID)
		}
	}
	want := map[[16]byte]uint64{}
	for h, k := range keys {
		want[resvHostIDs[h]] = k
	}
	ok := st.Gen == gen && st.Type == rtype && st.Count == len(keys) && len(got) == len(want)
	for h, k := range want {
		ok = ok && got[h] == k
	}
	if holder == "" {
		ok = ok && len(holds) == 0
	} else {
		ok = ok && len(holds) == 1 && holds[0] == resvHostIDs[holder]
	}
	if !ok {
		t.Fatalf("%s: report %+v, want gen %d, type %d, holder %q, keys %v", who, st, gen, rtype, holder, keys)
	}
}

// checkShown checks the volume as GET /v1/volumes/{name} shows it
// against the report st (the coordinator's e2e compares the two).
func checkShown(t *testing.T, d *daemon, name string, st initiator.ReservationStatus) {
	t.Helper()
	var v resvVolumeJSON
	d.must(t, "GET", "/v1/volumes/"+name, "", 200, &v)
	r := v.Reservation
	if r == nil || r.Gen != st.Gen || len(r.Registrants) != st.Count {
		t.Fatalf("volume %s shows reservation %+v, the hosts' report %+v", name, r, st)
	}
	for _, g := range st.Registrants {
		if g.Holder && r.Holder != fmt.Sprintf("%x", g.HostID) && !strings.HasSuffix(r.Type, "all-registrants") {
			t.Fatalf("volume %s shows holder %q, the report %x", name, r.Holder, g.HostID)
		}
	}
}

// allowBoth allows hosts A and B on volume name.
func allowBoth(t *testing.T, d *daemon, name string) {
	t.Helper()
	for _, h := range []string{resvHostA, resvHostB} {
		d.must(t, "POST", "/v1/volumes/"+name+"/hosts", `{"host_nqn": "`+h+`"}`, 200, nil)
	}
}

// startResvCluster starts three zoned nodes; pin is the node, not the
// registry's leader, that the tests' 3-replica volumes are primary on,
// so that losing it needs no election. lp is the leader's daemon.
func startResvCluster(t *testing.T) (c *cluster, ids []string, leader string, lp *daemon, pin string) {
	t.Helper()
	c, ids, leader = startZoned(t, 3)
	pin = ids[0]
	if pin == leader {
		pin = ids[1]
	}
	return c, ids, leader, c.procs[leader], pin
}

// createResvVolume creates volume name (size, replicas, primary on node)
// through d and allows hosts A and B on it.
func createResvVolume(t *testing.T, d *daemon, name, size string, replicas int, node string) resvVolumeJSON {
	t.Helper()
	var v resvVolumeJSON
	d.must(t, "POST", "/v1/volumes", fmt.Sprintf(`{"name": %q, "size": %q, "replicas": %d, "node": %q}`, name, size, replicas, node), 201, &v)
	allowBoth(t, d, name)
	return v
}

// newTCPCluster makes the addresses of three nodes, node1 to node3, and
// an NVMe/TCP address of each (tcp, by node), starting none: the tests
// that restart nodes by hand keep their NVMe/TCP ports.
func newTCPCluster(t *testing.T) (c *cluster, ids []string, tcp map[string]string) {
	t.Helper()
	c = &cluster{t: t, nodes: map[string]*nodeAddrs{}, procs: map[string]*daemon{}}
	ids = []string{"node1", "node2", "node3"}
	tcp = map[string]string{}
	for _, id := range ids {
		c.nodes[id] = &nodeAddrs{t.TempDir(), freeAddr(t), freeAddr(t), freeAddr(t)}
		tcp[id] = freeAddr(t)
	}
	return c, ids, tcp
}

// tcpEndpoint is the NVMe/TCP address the volume's attach answer names.
func tcpEndpoint(t *testing.T, d *daemon, name string) (addr, nqn string) {
	t.Helper()
	var a attachJSON
	d.must(t, "POST", "/v1/volumes/"+name+"/attach", `{"host_nqn": "`+resvHostA+`"}`, 200, &a)
	a = a.over("tcp")
	return net.JoinHostPort(a.Address, strconv.Itoa(a.Port)), a.SubsystemNQN
}

// TestReservationRestart: one blkd, a volume of one replica; host A
// registers (PTPL on) and takes Write Exclusive, host B registers; B's
// write is refused with Reservation Conflict, its read served; both
// report the same; the volume shows it. blkd restarted (SIGKILL): the
// reservation is still there, B's write still refused, A's served.
func TestReservationRestart(t *testing.T) {
	dir := t.TempDir()
	api, raft, nvmeAddr, tcp := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	d := startBlkdOn(t, dir, raft, nvmeAddr, api, "--tcp-addr", tcp)
	d.must(t, "POST", "/v1/volumes", `{"name": "r", "size": "16MiB", "replicas": 1}`, 201, nil)
	allowBoth(t, d, "r")
	addr, nqn := tcpEndpoint(t, d, "r")
	a := &resvHost{t: t, host: resvHostA, paths: []*initiator.Namespace{resvConnect(t, resvHostA, addr, nqn)}}
	b := &resvHost{t: t, host: resvHostB, paths: []*initiator.Namespace{resvConnect(t, resvHostB, addr, nqn)}}

	mustOK(t, "A writes before any reservation", a.write(1, 'a'))
	mustOK(t, "A registers", a.register(keyA, nvme.CPTPLSet))
	mustOK(t, "B registers", b.register(keyB, nvme.CPTPLNoChange))
	mustOK(t, "A acquires WE", a.acquire(nvme.RACQAAcquire, keyA, 0))
	mustConflict(t, "A registers again with another key", a.register(keyB, nvme.CPTPLNoChange))
	mustConflict(t, "B acquires while A holds", b.acquire(nvme.RACQAAcquire, keyB, 0))
	mustConflict(t, "B's write", b.write(1, 'b'))
	got, err := b.read(1)
	mustOK(t, "B's read", err)
	if got[0] != 'a' {
		t.Fatalf("B read %q, want A's block", got[:4])
	}
	want := map[string]uint64{resvHostA: keyA, resvHostB: keyB}
	// Two registrations (+2); an acquire and the refusals change no
	// generation.
	checkReport(t, "A", a.report(), 2, rtypeWE, resvHostA, want)
	checkReport(t, "B", b.report(), 2, rtypeWE, resvHostA, want)
	checkShown(t, d, "r", a.report())
	for name, least := range map[string]float64{
		"blk_reservation_command_seconds_count":  5, // the keeper's: register ×3, acquire ×2
		"blk_target_reservation_commands_total":  7, // and the two reports
		"blk_target_reservation_conflicts_total": 1, // B's write
	} {
		if n := d.metric(t, name); n < least {
			t.Errorf("%s %v, want at least %v", name, n, least)
		}
	}
	m := d.metricsText(t)
	for _, series := range []string{`blk_target_reservation_commands_total{op="acquire"}`, `blk_target_fused_total{outcome="pair"}`, "blk_target_range_lock_waits_total"} {
		if !strings.Contains(m, series) {
			t.Errorf("/metrics has no %s", series)
		}
	}
	t.Logf("mean time of a reservation command at the keeper (one node, the registry's commit included): %.2f ms",
		1000*d.metric(t, "blk_reservation_command_seconds_sum")/d.metric(t, "blk_reservation_command_seconds_count"))

	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	d = startBlkdOn(t, dir, raft, nvmeAddr, api, "--tcp-addr", tcp)
	a = &resvHost{t: t, host: resvHostA, paths: []*initiator.Namespace{resvConnect(t, resvHostA, addr, nqn)}}
	b = &resvHost{t: t, host: resvHostB, paths: []*initiator.Namespace{resvConnect(t, resvHostB, addr, nqn)}}
	mustConflict(t, "B's write after the restart", b.write(1, 'b'))
	mustOK(t, "A's write after the restart", a.write(2, 'A'))
	checkReport(t, "B after the restart", b.report(), 2, rtypeWE, resvHostA, want)
	checkShown(t, d, "r", b.report())
	// Release by the holder: B writes.
	mustOK(t, "A releases", a.do("release", func(ctx context.Context, ns *initiator.Namespace) error {
		return ns.ReservationRelease(ctx, nvme.RRELARelease, rtypeWE, keyA, false)
	}))
	mustOK(t, "B's write after the release", b.write(1, 'b'))
	checkReport(t, "B after the release", b.report(), 2, 0, "", want)

	// The operator's clear (Op 30), through blkctl: A holds again, the
	// clear drops every registration at once, B writes.
	mustOK(t, "A acquires again", a.acquire(nvme.RACQAAcquire, keyA, 0))
	mustConflict(t, "B's write before the clear", b.write(1, 'x'))
	out := mustBlkctl(t, d, "volume", "reservation", "show", "r")
	for _, w := range []string{"Generation:", "write-exclusive", fmt.Sprintf("%#x", keyA), fmt.Sprintf("%#x", keyB), resvHostA} {
		if !strings.Contains(out, w) {
			t.Fatalf("blkctl volume reservation show: no %q in:\n%s", w, out)
		}
	}
	if code, out := blkctl(t, d, "volume", "reservation", "clear", "r"); code == 0 || !strings.Contains(out, "--yes") {
		t.Fatalf("clear without --yes: exit %d: %s", code, out)
	}
	mustBlkctl(t, d, "volume", "reservation", "clear", "r", "--yes")
	// Both registrants were told, by the time the clear answered.
	a.mustNotice("the clear", a.paths[0], nvme.ResvNotifReservationPreempted)
	b.mustNotice("the clear", b.paths[0], nvme.ResvNotifReservationPreempted)
	mustOK(t, "B's write after the clear", b.write(1, 'c'))
	checkReport(t, "B after the clear", b.report(), 3, 0, "", nil)
	checkShown(t, d, "r", b.report())
	d.refuse(t, "POST", "/v1/volumes/nope/reservation/clear", "", 404, "unknown volume")
}

// TestReservationPTPLZero: PTPL cleared by a Register with CPTPL 10b;
// blkd restarted (every controller gone: a power loss), the state is
// empty with the generation one up, and B writes. A second volume with
// PTPL on keeps its reservation across the same restart.
func TestReservationPTPLZero(t *testing.T) {
	dir := t.TempDir()
	api, raft, nvmeAddr, tcp := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	d := startBlkdOn(t, dir, raft, nvmeAddr, api, "--tcp-addr", tcp)
	hosts := map[string]map[string]*resvHost{}
	ends := map[string][2]string{}
	connectAll := func() {
		for _, name := range []string{"p0", "p1"} {
			if _, ok := ends[name]; !ok {
				addr, nqn := tcpEndpoint(t, d, name)
				ends[name] = [2]string{addr, nqn}
			}
			addr, nqn := ends[name][0], ends[name][1]
			hosts[name] = map[string]*resvHost{}
			for _, h := range []string{resvHostA, resvHostB} {
				hosts[name][h] = &resvHost{t: t, host: h, paths: []*initiator.Namespace{resvConnect(t, h, addr, nqn)}}
			}
		}
	}
	for _, name := range []string{"p0", "p1"} {
		d.must(t, "POST", "/v1/volumes", `{"name": "`+name+`", "size": "4MiB", "replicas": 1}`, 201, nil)
		allowBoth(t, d, name)
	}
	connectAll()
	for name, cptpl := range map[string]uint8{"p0": nvme.CPTPLClear, "p1": nvme.CPTPLNoChange} {
		a := hosts[name][resvHostA]
		mustOK(t, name+": A registers", a.register(keyA, cptpl))
		if name == "p1" {
			// PTPL on through Set Features 83h, a keeper's command too.
			mustOK(t, "p1: Set Features Reservation Persistence", a.do("set ptpl", func(ctx context.Context, ns *initiator.Namespace) error {
				return ns.SetReservationPersistence(ctx, true)
			}))
			if st := a.report(); !st.PTPL {
				t.Fatalf("p1: report after Set Features 83h: %+v, want PTPL on", st)
			}
		}
		mustOK(t, name+": A acquires", a.acquire(nvme.RACQAAcquire, keyA, 0))
		mustConflict(t, name+": B's write", hosts[name][resvHostB].write(0, 'b'))
	}
	var v resvVolumeJSON
	d.must(t, "GET", "/v1/volumes/p0", "", 200, &v)
	if v.Reservation == nil || v.Reservation.PTPL || v.Reservation.Gen != 1 {
		t.Fatalf("p0 shows %+v, want PTPL off at generation 1", v.Reservation)
	}

	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	d = startBlkdOn(t, dir, raft, nvmeAddr, api, "--tcp-addr", tcp)
	connectAll()
	mustOK(t, "p0: B's write after the power loss", hosts["p0"][resvHostB].write(0, 'b'))
	checkReport(t, "p0 after the power loss", hosts["p0"][resvHostB].report(), 2, 0, "", nil)
	checkShown(t, d, "p0", hosts["p0"][resvHostA].report())
	mustConflict(t, "p1: B's write after the restart", hosts["p1"][resvHostB].write(0, 'b'))
	checkReport(t, "p1 after the restart", hosts["p1"][resvHostB].report(), 1, rtypeWE, resvHostA, map[string]uint64{resvHostA: keyA})
	if !strings.Contains(d.output(), "registrations dropped at a new subsystem") {
		t.Errorf("blkd did not log the power loss of p0")
	}
}

// resvPaths connects host to volume nqn through every node's path
// (tcpAddrs: by node), as a Linux host with native multipath does.
func resvPaths(t *testing.T, host, nqn string, tcpAddrs map[string]string) *resvHost {
	t.Helper()
	h := &resvHost{t: t, host: host, byNode: map[string]*initiator.Namespace{}}
	for node, addr := range tcpAddrs {
		ns := resvConnect(t, host, addr, nqn)
		h.paths = append(h.paths, ns)
		h.byNode[node] = ns
	}
	return h
}

// newPrimaryOf waits until a node other than old is primary of name at
// epoch; it returns it.
func newPrimaryOf(t *testing.T, c *cluster, name, old string, epoch uint64) string {
	t.Helper()
	var v resvVolumeJSON
	eventually(t, 40*time.Second, "another primary of "+name, func() error {
		for id, p := range c.procs {
			if id == old {
				continue
			}
			v = resvVolumeJSON{}
			if code, _ := p.call(t, "GET", "/v1/volumes/"+name, "", &v); code == 200 && v.Node != old && v.Epoch == epoch {
				return nil
			}
		}
		return fmt.Errorf("%+v", v)
	})
	return v.Node
}

// TestReservationFailover: two 3-replica volumes with the same primary:
// on f host A holds Write Exclusive with PTPL on, B is registered; on z
// A holds it with PTPL off. The primary's blkd is killed: the new
// primary refuses B's writes to f from its first answer (the reservation
// was in its view before it served), reports the same; z's state is
// empty (a power loss, generation + 1) and B writes to it. B's
// preempt-and-abort takes f over: B writes, A is refused and no longer
// registered. The whole cluster is then killed and started again: the
// reservation is still B's.
func TestReservationFailover(t *testing.T) {
	c, ids, _, lp, pin := startResvCluster(t)
	vols := map[string]resvVolumeJSON{}
	for _, name := range []string{"f", "z"} {
		vols[name] = createResvVolume(t, lp, name, "8MiB", 3, pin)
	}
	tcpAddrs := tcpAddrsOf(t, lp)
	hosts := func() (fa, fb, za, zb *resvHost) {
		return resvPaths(t, resvHostA, vols["f"].NQN, tcpAddrs), resvPaths(t, resvHostB, vols["f"].NQN, tcpAddrs),
			resvPaths(t, resvHostA, vols["z"].NQN, tcpAddrs), resvPaths(t, resvHostB, vols["z"].NQN, tcpAddrs)
	}
	fa, fb, za, zb := hosts()

	mustOK(t, "f: A writes", fa.write(3, 'a'))
	mustOK(t, "f: A registers", fa.register(keyA, nvme.CPTPLSet))
	mustOK(t, "f: B registers", fb.register(keyB, nvme.CPTPLNoChange))
	mustOK(t, "f: A acquires", fa.acquire(nvme.RACQAAcquire, keyA, 0))
	mustOK(t, "z: A registers, PTPL off", za.register(keyA, nvme.CPTPLClear))
	mustOK(t, "z: A acquires", za.acquire(nvme.RACQAAcquire, keyA, 0))
	mustConflict(t, "f: B's write", fb.write(3, 'b'))
	mustConflict(t, "z: B's write", zb.write(3, 'b'))
	both := map[string]uint64{resvHostA: keyA, resvHostB: keyB}
	checkReport(t, "f: B", fb.report(), 2, rtypeWE, resvHostA, both)
	checkShown(t, lp, "f", fa.report())

	victim := c.procs[pin]
	victim.cmd.Process.Signal(syscall.SIGKILL)
	<-victim.exited
	delete(c.procs, pin)
	killed := time.Now()
	// B's writes to f from the kill on: none may be served.
	mustConflict(t, "f: B's write across the failover", fb.write(3, 'b'))
	primary := newPrimaryOf(t, c, "f", pin, 2)
	t.Logf("f: %v from the kill to a refusal by the new primary %s", time.Since(killed).Round(time.Millisecond), primary)
	checkReport(t, "f: B after the failover", fb.report(), 2, rtypeWE, resvHostA, both)
	mustOK(t, "f: A writes after the failover", fa.write(4, 'A'))
	got, err := fb.read(3)
	mustOK(t, "f: B reads after the failover", err)
	if got[0] != 'a' {
		t.Fatalf("f: B read %q, want A's block", got[:4])
	}
	// z, PTPL off: the new term dropped it.
	checkReport(t, "z: B after the failover", zb.report(), 2, 0, "", nil)
	mustOK(t, "z: B's write after the failover", zb.write(3, 'b'))

	// Preempt and abort: B takes f over.
	mustOK(t, "f: B preempts A", fb.acquire(nvme.RACQAPreemptAndAbort, keyB, keyA))
	// A's controller on the serving path was told, before B's command
	// completed.
	fa.mustNotice("f: the preempt", fa.byNode[primary], nvme.ResvNotifRegistrationPreempted)
	checkReport(t, "f: A after the preempt", fa.report(), 3, rtypeWE, resvHostB, map[string]uint64{resvHostB: keyB})
	mustOK(t, "f: B writes", fb.write(3, 'B'))
	mustConflict(t, "f: A's write after the preempt", fa.write(3, 'x'))
	got, err = fb.read(3)
	mustOK(t, "f: B reads back", err)
	if got[0] != 'B' {
		t.Fatalf("f: B read %q, want its own block", got[:4])
	}
	checkShown(t, c.procs[primary], "f", fb.report())

	// The whole cluster killed and started again (new NVMe/TCP ports).
	c.stopAll(syscall.SIGKILL)
	c.relaunchZoned(ids)
	lp = c.procs[c.settled(nil)]
	tcpAddrs = tcpAddrsOf(t, lp)
	fa, fb, _, _ = hosts()
	checkReport(t, "f: B after the cluster's restart", fb.report(), 3, rtypeWE, resvHostB, map[string]uint64{resvHostB: keyB})
	mustConflict(t, "f: A's write after the cluster's restart", fa.write(3, 'x'))
	mustOK(t, "f: B's write after the cluster's restart", fb.write(5, 'B'))
	checkShown(t, lp, "f", fb.report())
}

// TestReservationLeaderChange: the registry's leader (not the volume's
// primary) is killed after it committed a Register and before it
// answered the primary's keeper (BLKD_TEST_RESV_HOLD's leader pause):
// the keeper retries with the same token against the new leader, which
// answers the recorded outcome. The host's Register succeeds and the
// generation moved once.
func TestReservationLeaderChange(t *testing.T) {
	t.Setenv("BLKD_TEST_RESV_HOLD", "leader=2s")
	c, _, leader, lp, pin := startResvCluster(t)
	v := createResvVolume(t, lp, "l", "4MiB", 3, pin)
	a := resvPaths(t, resvHostA, v.NQN, tcpAddrsOf(t, lp))
	done := make(chan error, 1)
	go func() { done <- a.register(keyA, nvme.CPTPLSet) }()
	time.Sleep(700 * time.Millisecond) // committed, the answer held
	lp.cmd.Process.Signal(syscall.SIGKILL)
	<-lp.exited
	delete(c.procs, leader)
	mustOK(t, "A's register across the leader's death", <-done)
	checkReport(t, "A", a.report(), 1, 0, "", map[string]uint64{resvHostA: keyA})
	if out := c.procs[pin].output(); !strings.Contains(out, "applied after a retry with its token") {
		t.Fatalf("the primary's keeper did not retry (the leader died before it committed?):\n%s", out)
	}
	checkShown(t, c.procs[pin], "l", a.report())
}

// TestReservationStaleEpoch: a keeper holds an Acquire after it took its
// term's epoch (BLKD_TEST_RESV_HOLD's keeper pause); meanwhile its
// node is stopped (SIGSTOP) and another replica made primary. Resumed,
// its keeper proposes the Acquire at the old epoch: the registry refuses
// it (stale epoch, which the host would get as ANA Transition), and
// nothing changed: no reservation, the generation where it was.
func TestReservationStaleEpoch(t *testing.T) {
	t.Setenv("BLKD_TEST_RESV_HOLD", "keeper=4s")
	c, _, leader, lp, pin := startResvCluster(t)
	v := createResvVolume(t, lp, "s", "4MiB", 3, pin)
	tcpAddrs := tcpAddrsOf(t, lp)
	a := resvPaths(t, resvHostA, v.NQN, tcpAddrs)
	mustOK(t, "A registers", a.register(keyA, nvme.CPTPLSet))
	direct := resvConnect(t, resvHostA, tcpAddrs[pin], v.NQN)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- direct.ReservationAcquire(ctx, nvme.RACQAAcquire, rtypeWE, keyA, 0, false)
	}()
	time.Sleep(500 * time.Millisecond) // at the keeper, held
	victim := c.procs[pin]
	victim.cmd.Process.Signal(syscall.SIGSTOP)
	newPrimaryOf(t, c, "s", pin, 2)
	victim.cmd.Process.Signal(syscall.SIGCONT)
	if err := <-done; err == nil || !(isStatus(err, nvme.StatusANATransition) || pathError(err) || errors.Is(err, initiator.ErrControllerLost)) {
		t.Fatalf("the deposed primary's Acquire: %v, want ANA Transition or the path lost", err)
	}
	eventually(t, 20*time.Second, "the deposed keeper's refusal logged", func() error {
		for _, line := range strings.Split(victim.output(), "\n") {
			if strings.Contains(line, "reservation command not applied") && strings.Contains(line, "stale epoch") {
				return nil
			}
		}
		return errors.New("not yet")
	})
	checkReport(t, "A after the failover", a.report(), 1, 0, "", map[string]uint64{resvHostA: keyA})
	var got resvVolumeJSON
	c.procs[leader].must(t, "GET", "/v1/volumes/s", "", 200, &got)
	if got.Reservation == nil || got.Reservation.Type != "none" || got.Reservation.Gen != 1 {
		t.Fatalf("the registry after the stale Acquire: %+v, want no reservation at generation 1", got.Reservation)
	}
}

// TestReservationUnknownView: a volume of one replica on node2 with a
// reservation; the whole cluster killed; node2 started alone waits for a
// leader (serves nothing); node1 and node3 started: node2 serves, and
// until its copy is known current its namespace answers Namespace Not
// Ready (BLKD_TEST_RESV_HOLD's bringup pause makes the window wide
// enough to see), then B's write gets Reservation Conflict: never served.
func TestReservationUnknownView(t *testing.T) {
	t.Setenv("BLKD_TEST_RESV_HOLD", "bringup=4s")
	c, ids, tcp := newTCPCluster(t)
	c.start("node1", "--tcp-addr", tcp["node1"])
	for _, id := range ids[1:] {
		c.start(id, "--tcp-addr", tcp[id], "--join", c.nodes["node1"].api)
	}
	lp := c.procs[c.settled(nil)]
	v := createResvVolume(t, lp, "u", "4MiB", 1, "node2")
	a := &resvHost{t: t, host: resvHostA, paths: []*initiator.Namespace{resvConnect(t, resvHostA, tcp["node2"], v.NQN)}}
	mustOK(t, "A registers", a.register(keyA, nvme.CPTPLSet))
	mustOK(t, "A acquires", a.acquire(nvme.RACQAAcquire, keyA, 0))

	c.stopAll(syscall.SIGKILL)
	launch := func(id string) (*daemon, <-chan struct{}) {
		n := c.nodes[id]
		return launchBlkdOn(t, n.dir, n.raft, n.nvme, n.api, "--node-id", id, "--tcp-addr", tcp[id])
	}
	d2, ready2 := launch("node2")
	c.procs["node2"] = d2
	time.Sleep(3 * time.Second)
	select {
	case <-ready2:
		t.Fatalf("node2 alone became ready without a registry leader:\n%s", d2.output())
	default:
	}
	if conn, err := net.DialTimeout("tcp", tcp["node2"], time.Second); err == nil {
		conn.Close()
		t.Fatalf("node2 alone, without a registry leader, accepts NVMe/TCP connections")
	}
	ready := map[string]<-chan struct{}{}
	for _, id := range []string{"node1", "node3"} {
		c.procs[id], ready[id] = launch(id)
	}
	d2.waitReady(t, ready2, 90*time.Second)
	b := resvConnect(t, resvHostB, tcp["node2"], v.NQN)
	notReady, deadline := 0, time.Now().Add(30*time.Second)
	var err error
	for time.Now().Before(deadline) {
		_, err = b.WriteAt(pattern('b', 4096), 0)
		if !isStatus(err, nvme.StatusNamespaceNotReady) {
			break
		}
		notReady++
		time.Sleep(100 * time.Millisecond)
	}
	mustConflict(t, "B's write once node2's view is known", err)
	if notReady == 0 {
		t.Fatalf("B's first write was answered before node2's view was known: the bringup pause should have shown Namespace Not Ready")
	}
	t.Logf("B's write: %d answers of Namespace Not Ready, then Reservation Conflict", notReady)
	for _, id := range []string{"node1", "node3"} {
		c.procs[id].waitReady(t, ready[id], 90*time.Second)
	}
}

// TestReservationUpgradeGate (docs/reservations.md §1.3): node3 runs a
// blkd that registers without the reservations feature (built with
// withoutReservations, as an older one would): nobody serves
// reservations (Register is Invalid Opcode, the clear 409 naming node3),
// the volume shows none. node3 restarted with this blkd: within the
// keepers' round the volume's subsystem gets its keeper, and the same
// host connection registers and holds.
func TestReservationUpgradeGate(t *testing.T) {
	c, tcp := clusterWithOlderNode3(t, "withoutReservations")
	lp := c.procs[c.settled(nil)]
	v := createResvVolume(t, lp, "g", "4MiB", 1, "node1")
	a := &resvHost{t: t, host: resvHostA, paths: []*initiator.Namespace{resvConnect(t, resvHostA, tcp["node1"], v.NQN)}}
	if err := a.register(keyA, nvme.CPTPLSet); !isStatus(err, nvme.StatusInvalidOpcode) {
		t.Fatalf("Register while node3 lacks the feature: %v, want Invalid Opcode", err)
	}
	lp.refuse(t, "POST", "/v1/volumes/g/reservation/clear", "", 409, `node3 .*"reservations"`)
	lp.must(t, "GET", "/v1/volumes/g", "", 200, &v)
	if v.Reservation == nil || v.Reservation.Gen != 0 || v.Reservation.Type != "none" {
		t.Fatalf("volume g before the upgrade: %+v", v.Reservation)
	}

	c.procs["node3"].stop(t)
	c.start("node3", "--tcp-addr", tcp["node3"])
	eventually(t, 20*time.Second, "Register served once node3 has the feature", func() error {
		return a.register(keyA, nvme.CPTPLSet)
	})
	mustOK(t, "A acquires", a.acquire(nvme.RACQAAcquire, keyA, 0))
	b := &resvHost{t: t, host: resvHostB, paths: []*initiator.Namespace{resvConnect(t, resvHostB, tcp["node1"], v.NQN)}}
	mustConflict(t, "B's write", b.write(0, 'b'))
	checkShown(t, c.procs["node1"], "g", a.report())
}
