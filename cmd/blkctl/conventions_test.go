package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/internal/version"
	"github.com/urfave/cli/v2"
)

// TestVersion: --version prints internal/version's line, the one
// blk_build_info carries too.
func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if err := newApp(&out, &errb).Run([]string{"blkctl", "--version"}); err != nil {
		t.Fatalf("blkctl --version: %v (%s)", err, errb.String())
	}
	want := "blkctl version " + version.String() + "\n"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
	if !strings.Contains(out.String(), "(rev ") {
		t.Errorf("no revision in %q", out.String())
	}
}

// TestSizeRefusal: a decimal size that is not whole blocks is a usage
// error naming the nearest sizes and the binary unit, before any API call.
func TestSizeRefusal(t *testing.T) {
	var out, errb bytes.Buffer
	err := newApp(&out, &errb).Run([]string{"blkctl", "--api", "http://127.0.0.1:1", "volume", "create", "v", "--size", "10GB"})
	var ue *usageError
	if !errors.As(err, &ue) {
		t.Fatalf("got %v, want a usage error", err)
	}
	const want = "--size 10GB is 10000000000 bytes, not a multiple of the block size 4096: use 9999998976 or 10000003072, or 10GiB"
	if err.Error() != want {
		t.Errorf("got %q\nwant %q", err.Error(), want)
	}
}

// walkCommands calls fn for every command under cmds, with its full path.
func walkCommands(cmds []*cli.Command, path string, fn func(path string, c *cli.Command)) {
	for _, c := range cmds {
		p := strings.TrimSpace(path + " " + c.Name)
		fn(p, c)
		walkCommands(c.Subcommands, p, fn)
	}
}

func runOut(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if err := newApp(&out, &errb).Run(append([]string{"blkctl"}, args...)); err != nil {
		t.Fatalf("blkctl %v: %v (%s)", args, err, errb.String())
	}
	return out.String()
}

// TestManAndCompletion: the man page and the fish script name every
// command and every visible flag; the bash and zsh shims call blkctl's
// own completion, which lists an object's verbs.
func TestManAndCompletion(t *testing.T) {
	man := runOut(t, "man")
	if !strings.HasPrefix(man, ".nh\n.TH blkctl 1") {
		t.Errorf("man page does not start as a section 1 page: %.40q", man)
	}
	fish := runOut(t, "completion", "fish")
	walkCommands(newApp(nil, nil).Commands, "", func(path string, c *cli.Command) {
		for what, doc := range map[string]string{"man page": man, "fish completion": fish} {
			if !strings.Contains(doc, c.Name) {
				t.Errorf("%s lacks command %q", what, path)
			}
		}
		for _, f := range c.VisibleFlags() {
			name := f.Names()[0]
			if name == "help" {
				continue
			}
			if !strings.Contains(man, "--"+name) {
				t.Errorf("man page lacks %s --%s", path, name)
			}
			if !strings.Contains(fish, "-l "+name) {
				t.Errorf("fish completion lacks %s --%s", path, name)
			}
		}
	})
	for _, sh := range []string{"bash", "zsh"} {
		if s := runOut(t, "completion", sh); !strings.Contains(s, "--generate-bash-completion") || !strings.Contains(s, "blkctl") {
			t.Errorf("%s completion does not call blkctl --generate-bash-completion:\n%s", sh, s)
		}
	}
	// urfave/cli reads os.Args for completion: run the binary.
	raw, err := exec.Command(blkctlBin, "volume", "--generate-bash-completion").Output()
	if err != nil {
		t.Fatalf("blkctl volume --generate-bash-completion: %v", err)
	}
	verbs := strings.Fields(string(raw))
	for _, v := range []string{"create", "list", "resize", "delete"} {
		if !slices.Contains(verbs, v) {
			t.Errorf("volume completion %v lacks %s", verbs, v)
		}
	}
	var out, errb bytes.Buffer
	err = newApp(&out, &errb).Run([]string{"blkctl", "completion", "tcsh"})
	if ue := (*usageError)(nil); !errors.As(err, &ue) || !strings.Contains(err.Error(), "bash, zsh, fish") {
		t.Errorf("completion tcsh: %v, want a usage error naming the shells", err)
	}
}

// TestCompletionScriptsParse: bash -n (and zsh -n, fish -n where they
// exist) accept the scripts.
func TestCompletionScriptsParse(t *testing.T) {
	for _, sh := range completionShells {
		bin, err := exec.LookPath(sh)
		if err != nil {
			t.Logf("%s not installed: its script is not syntax-checked", sh)
			continue
		}
		f := filepath.Join(t.TempDir(), "c."+sh)
		if err := os.WriteFile(f, []byte(runOut(t, "completion", sh)), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v\n%s", sh, err, out)
		}
	}
}

// TestCertJSON: the cert verbs honour -o json, before or after the verb,
// with RFC 3339 times.
func TestCertJSON(t *testing.T) {
	dir := t.TempDir()
	var ca map[string]string
	if err := json.Unmarshal([]byte(runOut(t, "-o", "json", "cert", "ca", "--dir", dir)), &ca); err != nil || ca["cert"] != filepath.Join(dir, "ca.crt") {
		t.Fatalf("cert ca -o json: %v %v", ca, err)
	}
	var is map[string]string
	if err := json.Unmarshal([]byte(runOut(t, "cert", "issue", "n1", "--role", "node", "--ca-dir", dir, "--host", "10.0.0.1", "-o", "json")), &is); err != nil || is["role"] != "node" || is["key"] != filepath.Join(dir, "n1.key") {
		t.Fatalf("cert issue -o json: %v %v", is, err)
	}
	// Only a node certificate names addresses: --host on a client's is
	// refused, not dropped.
	fails(t, "", 2, `--host 10.0.0.9: only a node certificate names the addresses`, "cert", "issue", "op1", "--role", "admin", "--ca-dir", dir, "--host", "10.0.0.9")
	if _, err := os.Stat(filepath.Join(dir, "op1.crt")); !os.IsNotExist(err) {
		t.Errorf("a refused cert issue wrote op1.crt: %v", err)
	}
	var ci certInfo
	if err := json.Unmarshal([]byte(runOut(t, "cert", "show", filepath.Join(dir, "n1.crt"), "-o", "json")), &ci); err != nil {
		t.Fatal(err)
	}
	if ci.Kind != "certificate" || ci.Name != "n1" || ci.Role != "node" || !slices.Equal(ci.Hosts, []string{"10.0.0.1"}) || ci.State != "valid" || !ci.NotAfter.After(ci.NotBefore) {
		t.Errorf("cert show -o json: %+v", ci)
	}
	raw := runOut(t, "-o", "json", "cert", "show", filepath.Join(dir, "ca.crt"))
	if !strings.Contains(raw, `"kind": "CA"`) || !regexp.MustCompile(`"not_after": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"`).MatchString(raw) {
		t.Errorf("cert show CA -o json:\n%s", raw)
	}
}

// TestClusterSummary: the summary counts nodes, capacity, disks and the
// volumes that need an operator; ready nodes when the members' readiness
// is known, and nothing of readiness when it is not (an older blkd).
func TestClusterSummary(t *testing.T) {
	ci := clusterInfo{LeaderID: "n1", Members: []api.Member{
		{ID: "n1", State: "up", CapacityBytes: 10 << 30, PromisedBytes: 1 << 30, Disk: &api.NodeDisk{MappedBytes: 1 << 20, TotalBytes: 20 << 30}},
		{ID: "n2", State: "down", CapacityBytes: 10 << 30, PromisedBytes: 2 << 30},
		{ID: "n3", State: "up", PromisedBytes: 1 << 30, Disk: &api.NodeDisk{MappedBytes: 3 << 20, TotalBytes: 10 << 30}},
	}}
	vols := []api.Volume{{State: "online"}, {State: "online", Reason: "degraded: 1/2 in sync"}, {State: "failed", Reason: "x"}, {State: "degraded"}}
	got := summarize(ci, vols).String()
	const want = "3 nodes (2 up), leader n1; capacity: 4 GiB promised of 20 GiB (+1 nodes with no limit), 4 MiB held of 30 GiB on disk (1 nodes did not answer); 4 volumes (2 degraded, 1 failed)"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	ci.Members[0].Ready, ci.Members[1].Ready, ci.Members[2].Ready = "ready", "unreachable", "not ready: registry"
	if got, want := summarize(ci, vols).String(), "3 nodes (2 up, 1 ready), leader n1;"; !strings.HasPrefix(got, want) {
		t.Errorf("with readiness: got %s\nwant %s...", got, want)
	}
	ci.Members[0].Ready = "not ready: store"
	if got, want := summarize(ci, vols).String(), "3 nodes (2 up, 0 ready), leader n1;"; !strings.HasPrefix(got, want) {
		t.Errorf("none ready: got %s\nwant %s...", got, want)
	}
}

// TestClusterStatusColumns: both transport addresses in their own
// columns, the node's readiness, the summary line, and -o json with the
// summary.
func TestClusterStatusColumns(t *testing.T) {
	api := startBlkd(t)
	out := ok(t, api, "cluster", "status")
	if !regexp.MustCompile(`(?m)^summary:\s+1 nodes \(1 up, 1 ready\), leader node1; capacity: .* 0 volumes \(0 degraded, 0 failed\)$`).MatchString(out) {
		t.Errorf("no summary:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^NODE\s+LEADER\s+STATE\s+READY\s+ZONE\s+SUFFRAGE\s+RAFT\s+API\s+NVME/TCP\s+NVME/RDMA\s+PROMISED\s+DISK\n^node1\s+\*\s+up\s+yes\s+-\s+voter\s+\S+\s+\S+\s+127\.0\.0\.1:\d+\s+(-|127\.0\.0\.1:\d+)\s`).MatchString(out) {
		t.Errorf("columns:\n%s", out)
	}
	var st struct {
		Members []struct {
			TCPAddr string `json:"tcp_addr"`
			Ready   string `json:"ready"`
		} `json:"members"`
		Summary clusterSummary `json:"summary"`
	}
	if err := json.Unmarshal([]byte(ok(t, api, "-o", "json", "cluster", "status")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Summary.Nodes != 1 || st.Summary.Up != 1 || st.Summary.Ready == nil || *st.Summary.Ready != 1 || st.Summary.Leader != "node1" ||
		len(st.Members) != 1 || st.Members[0].TCPAddr == "" || st.Members[0].Ready != "ready" {
		t.Errorf("cluster status -o json: %+v", st)
	}
}

// TestClusterStatusSorted: rows and JSON members come sorted by node ID,
// whatever order the registry answers in. The fake answers as a blkd
// older than the ready field: READY shows -, the summary counts no
// ready nodes.
func TestClusterStatusSorted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cluster":
			json.NewEncoder(w).Encode(api.Cluster{NodeID: "n2", LeaderID: "n3", Members: []api.Member{
				{ID: "n3", State: "up", Leader: true, TCPAddr: "10.0.0.3:4420", NVMeAddr: "10.0.0.3:4421"},
				{ID: "n1", State: "down", TCPAddr: "10.0.0.1:4420"},
				{ID: "n2", State: "up", NVMeAddr: "10.0.0.2:4421"},
			}})
		case "/v1/volumes":
			json.NewEncoder(w).Encode(api.VolumeList{})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	table := runOut(t, "--api", srv.URL, "cluster", "status")
	rows := regexp.MustCompile(`(?m)^(n\d)\s.*?(\S+)\s+(\S+)\s+\S+\s+\S+$`).FindAllStringSubmatch(table, -1)
	if len(rows) != 3 || rows[0][1] != "n1" || rows[1][1] != "n2" || rows[2][1] != "n3" {
		t.Fatalf("rows not sorted:\n%s", table)
	}
	if !regexp.MustCompile(`(?m)^n1\s.*\s10\.0\.0\.1:4420\s+-\s`).MatchString(table) || !regexp.MustCompile(`(?m)^n2\s.*\s-\s+10\.0\.0\.2:4421\s`).MatchString(table) {
		t.Errorf("TCP and RDMA addresses not in their columns:\n%s", table)
	}
	if !regexp.MustCompile(`(?m)^n1\s+down\s+-\s+-\s`).MatchString(table) || !regexp.MustCompile(`(?m)^n3\s+\*\s+up\s+-\s`).MatchString(table) ||
		!regexp.MustCompile(`(?m)^summary:\s+3 nodes \(2 up\), leader n3;`).MatchString(table) {
		t.Errorf("READY of an older blkd not -, or a summary counting ready nodes:\n%s", table)
	}
	var st struct {
		Members []struct {
			ID string `json:"id"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(runOut(t, "--api", srv.URL, "-o", "json", "cluster", "status")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 3 || st.Members[0].ID != "n1" || st.Members[2].ID != "n3" {
		t.Errorf("JSON members not sorted: %+v", st.Members)
	}
}

// TestClusterStatusReady: cluster status asks for the members' readiness
// and shows it in READY (yes, no and the failing checks, unreachable),
// counted in the summary; -o json carries each member's ready field.
func TestClusterStatusReady(t *testing.T) {
	var query string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/cluster":
			query = r.URL.RawQuery
			json.NewEncoder(w).Encode(api.Cluster{NodeID: "n1", LeaderID: "n1", Members: []api.Member{
				{ID: "n1", State: "up", Leader: true, Suffrage: "voter", Ready: "ready"},
				{ID: "n2", State: "up", Suffrage: "voter", Ready: "not ready: registry, ports"},
				{ID: "n3", State: "down", Suffrage: "voter", Ready: "unreachable"},
			}})
		case "/v1/volumes":
			json.NewEncoder(w).Encode(api.VolumeList{})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	table := runOut(t, "--api", srv.URL, "cluster", "status")
	if q, _ := url.ParseQuery(query); q.Get("health") != "true" || q.Get("usage") != "true" {
		t.Errorf("cluster status asked /v1/cluster?%s, want usage=true and health=true", query)
	}
	for _, re := range []string{
		`(?m)^NODE\s+LEADER\s+STATE\s+READY\s+ZONE\s`,
		`(?m)^n1\s+\*\s+up\s+yes\s+-\s+voter\s`,
		`(?m)^n2\s+up\s+no \(registry, ports\)\s+-\s+voter\s`,
		`(?m)^n3\s+down\s+unreachable\s+-\s+voter\s`,
		`(?m)^summary:\s+3 nodes \(2 up, 1 ready\), leader n1;`,
	} {
		if !regexp.MustCompile(re).MatchString(table) {
			t.Errorf("no match for %s in:\n%s", re, table)
		}
	}
	var st struct {
		Members []struct {
			ID    string `json:"id"`
			Ready string `json:"ready"`
		} `json:"members"`
		Summary struct {
			Ready *int `json:"ready"`
		} `json:"summary"`
	}
	if err := json.Unmarshal([]byte(runOut(t, "--api", srv.URL, "-o", "json", "cluster", "status")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 3 || st.Members[1].Ready != "not ready: registry, ports" || st.Summary.Ready == nil || *st.Summary.Ready != 1 {
		t.Errorf("cluster status -o json: %+v", st)
	}
}
