//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme/auth"
)

// TestKernelHostToBlkd is scenario 1: the Linux nvme-rdma host over siw
// in a guest attaches to blkd (soft iWARP) on the host: discover, connect,
// nvme-cli's identify and log commands, fio with crc32c verify, ext4 made,
// written and checked; then blkd is killed with SIGKILL and restarted under
// the connected host, which reconnects by itself with its flushed data
// intact and reads through the outage without an I/O error.
func TestKernelHostToBlkd(t *testing.T) {
	s := newScenario(t)
	port := ports(24100)
	nvmePort, api := port(), addr(port())
	// --dhchap-dhgroups null: the guest kernel's crypto has no RFC 7919
	// groups (CONFIG_CRYPTO_DH_RFC7919_GROUPS is built in, and off).
	d := s.startDaemon("blkd", api, "--raft-addr", addr(port()), "--nvme-addr", addr(nvmePort), "--tcp-addr", addr(port()), "--dhchap-dhgroups", "null")

	const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:e2e00000-0000-4000-8000-000000000001"
	const sizeBytes = 256 << 20
	s.blkctl(api, nil, "volume", "create", "vol1", "--size", "256MiB")
	s.blkctl(api, nil, "host", "allow", "vol1", hostNQN)
	var at attachInfo
	s.blkctl(api, &at, "attach", "vol1", "--host-nqn", hostNQN, "--transport", "rdma")
	if at.Port != nvmePort || at.SubsystemNQN == "" {
		t.Fatalf("attach answered %+v", at)
	}
	seed := time.Now().UnixNano() % 1000000
	t.Logf("fio seed %d", seed)
	// A second volume only for this host authenticated with DH-HMAC-CHAP
	// (the guest's NVMe modules are rebuilt with CONFIG_NVME_AUTH).
	s.blkctl(api, nil, "volume", "create", "secured", "--size", "16MiB")
	var keys [3]auth.Key
	for i := range keys {
		var err error
		if keys[i], err = auth.GenerateKey(auth.SHA256, 32); err != nil {
			t.Fatal(err)
		}
	}
	secret, ctrlSecret, wrong := keys[0], keys[1], keys[2]
	s.blkctl(api, nil, "host", "allow", "secured", hostNQN, "--dhchap-secret", secret.Encode(), "--dhchap-ctrl-secret", ctrlSecret.Encode())
	var sec attachInfo
	s.blkctl(api, &sec, "attach", "secured", "--host-nqn", hostNQN, "--transport", "rdma")
	s.setEnv("PORT", strconv.Itoa(nvmePort), "NQN", at.SubsystemNQN, "HOSTNQN", hostNQN, "SEED", fmt.Sprint(seed),
		"AUTHNQN", sec.SubsystemNQN, "AUTHSECRET", secret.Encode(), "AUTHCTRLSECRET", ctrlSecret.Encode(), "WRONGSECRET", wrong.Encode())
	s.script("kernel_host.sh")

	g := s.boot(vmConfig{name: "host1", script: "kernel_host.sh", timeout: 10 * time.Minute})
	s.waitMark("ready-kill", g, 8*time.Minute)
	// Traffic-based keep-alive: the host (KATO 5 s) ran I/O for tens of
	// seconds; with CTRATT.TBKAS it sends no Keep Alive while commands
	// complete, and the target's timer restarts on that traffic.
	kaTraffic := s.metric(api, "blk_target_keep_alive_traffic_total")
	d.kill()
	t.Logf("blkd killed with SIGKILL under the connected host")
	time.Sleep(2 * time.Second)
	d.start()
	s.mark("restarted")
	s.wait(g)

	// What the guest's tools printed.
	var disc struct {
		Records []struct {
			Trtype, Subnqn, Trsvcid, Traddr string
		}
	}
	s.decode("discover.json", &disc)
	found := false
	for _, r := range disc.Records {
		// Listed once per port: the RDMA port the host discovered
		// through, and the NVMe/TCP port.
		if r.Subnqn == at.SubsystemNQN && r.Trtype == "rdma" {
			found = true
			if r.Trsvcid != strconv.Itoa(nvmePort) {
				t.Errorf("discovery record %+v: want rdma, service %d", r, nvmePort)
			}
		}
	}
	if !found {
		t.Errorf("discovery log %+v lacks %s", disc.Records, at.SubsystemNQN)
	}

	var idc map[string]any
	s.decode("id-ctrl.json", &idc)
	if got := fmt.Sprint(idc["subnqn"]); got != at.SubsystemNQN {
		t.Errorf("id-ctrl subnqn %q, want %q", got, at.SubsystemNQN)
	}
	for _, f := range []string{"mdts", "kas", "ctratt", "maxcmd", "ioccsz", "sgls", "vwc", "oncs"} {
		t.Logf("id-ctrl %s = %v", f, idc[f])
	}
	if num(idc["ioccsz"]) < 4 {
		t.Errorf("id-ctrl ioccsz %v", idc["ioccsz"])
	}
	if int(num(idc["ctratt"]))&0x40 == 0 {
		t.Errorf("id-ctrl ctratt %v lacks TBKAS", idc["ctratt"])
	}
	if kaTraffic <= 0 {
		t.Errorf("blk_target_keep_alive_traffic_total %v: the kernel host kept sending Keep Alive under I/O (or the target ignored traffic)", kaTraffic)
	}
	t.Logf("keep-alive timer restarted by traffic %v times before the kill", kaTraffic)

	var idns map[string]any
	s.decode("id-ns.json", &idns)
	lbas := idns["lbafs"].([]any)
	flbas := int(num(idns["flbas"])) & 0xf
	ds := int(num(lbas[flbas].(map[string]any)["ds"]))
	if got, want := num(idns["nsze"]), float64(uint64(sizeBytes)>>ds); got != want {
		t.Errorf("id-ns nsze %v blocks of 2^%d, want %v", got, ds, want)
	}

	var smart map[string]any
	s.decode("smart-log.json", &smart)
	if _, ok := smart["data_units_written"]; !ok {
		t.Errorf("smart-log lacks data_units_written: %v", smart)
	}
	maxKB, _ := strconv.Atoi(strings.TrimSpace(string(s.readShare("max_hw_sectors_kb"))))
	wz, _ := strconv.Atoi(strings.TrimSpace(string(s.readShare("write_zeroes_max_bytes"))))
	t.Logf("kernel host limits: max_hw_sectors_kb %d, write_zeroes_max_bytes %d", maxKB, wz)
	// MDTS 1 MiB; nvme-rdma itself caps a request at 255 pages (its 256
	// segments less one for an unaligned start): 1020 KiB. Write Zeroes
	// from Identify CNS 06h WZSL, far beyond MDTS.
	if maxKB < 1020 {
		t.Errorf("max_hw_sectors_kb %d, want 1020 (MDTS 8, capped by nvme-rdma's 255 pages)", maxKB)
	}
	if wz <= maxKB<<10 {
		t.Errorf("write_zeroes_max_bytes %d not above MDTS: the host did not take WZSL", wz)
	}

	// blkd logged the host's controllers: the first run's, and the one the
	// host made when it reconnected to the restarted blkd.
	for _, f := range []string{"blkd.log.1", "blkd.log.2"} {
		mustContain(t, f, string(s.readShare(f)), `msg="controller created"`, "host_nqn="+hostNQN)
	}

	for _, job := range []string{"fio-rand4k.json", "fio-seq128k.json", "fio-after.json"} {
		s.fioResult(job)
	}

	// DH-HMAC-CHAP with the Linux host: both modes attached and verified,
	// the three wrong attempts refused, counted and logged without a
	// secret.
	s.fioResult("fio-auth-host.json")
	s.fioResult("fio-auth-bidirectional.json")
	okLog := string(s.readShare("auth-dmesg-ok.txt"))
	t.Logf("guest dmesg, accepted:\n%s", okLog)
	mustContain(t, "auth-dmesg-ok.txt", okLog, "authenticated with hash hmac(sha256) dhgroup null", "controller authenticated")
	for _, f := range []string{"auth-wrong.txt", "auth-none.txt", "auth-wrongctrl.txt"} {
		t.Logf("%s: %s", f, strings.TrimSpace(string(s.readShare(f))))
	}
	t.Logf("guest dmesg, refused:\n%s", s.readShare("auth-dmesg.txt"))
	succeeded, failed := s.metric(api, "blk_target_auth_succeeded_total"), s.metric(api, "blk_target_auth_failed_total")
	t.Logf("blkd: %v queues authenticated, %v refused", succeeded, failed)
	if succeeded < 4 {
		t.Errorf("blk_target_auth_succeeded_total %v: two associations of at least two queues each", succeeded)
	}
	if failed < 3 {
		t.Errorf("blk_target_auth_failed_total %v after three refused attempts", failed)
	}
	log2 := string(s.readShare("blkd.log.2"))
	mustContain(t, "blkd.log.2", log2, `msg="authentication failed"`, "wrong response")
	for _, k := range keys {
		if strings.Contains(log2, k.Encode()[10:30]) {
			t.Errorf("blkd logged a secret")
		}
	}
}

// decode reads JSON the guest wrote into the share.
func (s *scenario) decode(name string, out any) {
	s.t.Helper()
	b := s.readShare(name)
	// nvme-cli and fio may print notes ahead of their JSON.
	if i := strings.IndexAny(string(b), "{["); i > 0 {
		b = b[i:]
	}
	if err := json.Unmarshal(b, out); err != nil {
		s.t.Fatalf("%s: %v\n%s", name, err, b)
	}
}

func num(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	}
	return -1
}

// fioResult checks a fio JSON report for errors and logs its figures.
func (s *scenario) fioResult(name string) {
	s.t.Helper()
	var r struct {
		Jobs []struct {
			Jobname string
			Error   int
			Read    struct {
				IOPS     float64 `json:"iops"`
				BwBytes  float64 `json:"bw_bytes"`
				TotalIOs int     `json:"total_ios"`
			}
			Write struct {
				IOPS     float64 `json:"iops"`
				BwBytes  float64 `json:"bw_bytes"`
				TotalIOs int     `json:"total_ios"`
			}
		}
	}
	s.decode(name, &r)
	if len(r.Jobs) == 0 {
		s.t.Fatalf("%s: no jobs", name)
	}
	for _, j := range r.Jobs {
		if j.Error != 0 {
			s.t.Errorf("%s: job %s error %d", name, j.Jobname, j.Error)
		}
		if j.Write.TotalIOs == 0 {
			s.t.Errorf("%s: job %s wrote nothing", name, j.Jobname)
		}
		s.t.Logf("fio %s (emulated, for the record): write %.0f IOPS %.1f MB/s, verify read %.0f IOPS %.1f MB/s",
			j.Jobname, j.Write.IOPS, j.Write.BwBytes/1e6, j.Read.IOPS, j.Read.BwBytes/1e6)
	}
}
