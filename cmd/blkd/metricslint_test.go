package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestMetricsScrape: three real blkd, a volume r of three replicas (its
// primary the registry's leader) written by a host and snapshotted, and a
// volume p of one copy. On every node's /metrics:
//   - promlint, the linter of promtool check metrics, finds no problem;
//   - every family that labels a volume or a namespace does so with one
//     label, volume, whose values are volume names (the store ID only on
//     blk_volume_info; no subsystem, nsid nor parent label); snapshot
//     families name the snapshot; the target's namespaces of r are there
//     with role host on every node, and role replica on the secondaries;
//   - no label value is the host's NQN (/metrics holds no secret and no
//     host identity: docs/operations.md §2.2).
//
// Every blk_ family the alert rules (deploy/prometheus/blk.rules.yml)
// and the dashboard (deploy/grafana/blk.json) name is exported by some
// node. The leader's scrape is written to $BLK_METRICS_SCRAPE when it is
// set: .ci/run runs promtool check metrics on it.
func TestMetricsScrape(t *testing.T) {
	c, ids, leader := startZoned(t, 3)
	lp := c.procs[leader]
	lp.must(t, "POST", "/v1/volumes", `{"name": "r", "size": "16MiB", "node": "`+leader+`"}`, 201, nil)
	lp.must(t, "POST", "/v1/volumes", `{"name": "p", "size": "8MiB", "node": "`+leader+`", "replicas": 1}`, 201, nil)
	ctrl, ns := attachNS(t, lp, "r")
	mustWrite(t, ns, 0, make([]byte, 64<<10))
	lp.must(t, "POST", "/v1/volumes/r/snapshots", `{"name": "s1"}`, 201, nil)
	mustWrite(t, ns, 0, make([]byte, 4096))
	ctrl.Close()

	families := map[string]bool{}
	for _, id := range ids {
		text := c.procs[id].metricsText(t)
		if id == leader {
			if path := os.Getenv("BLK_METRICS_SCRAPE"); path != "" {
				if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		problems, err := promlint.New(strings.NewReader(text)).Lint()
		if err != nil {
			t.Fatalf("%s: promlint: %v", id, err)
		}
		for _, p := range problems {
			t.Errorf("%s: promlint: %s: %s", id, p.Metric, p.Text)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatalf("%s: parse /metrics: %v", id, err)
		}
		checkVolumeLabels(t, id, mfs, id == leader)
		for name := range mfs {
			families[name] = true
		}
	}

	for _, file := range []string{"../../deploy/prometheus/blk.rules.yml", "../../deploy/grafana/blk.json"} {
		for _, name := range namedFamilies(t, file) {
			if !families[name] && !families[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")] && !withTLSOnly[name] {
				t.Errorf("%s names %s, which blkd does not export", file, name)
			}
		}
	}
}

// withTLSOnly are the families a node exports only with --tls-dir, which
// TestHealthWithoutCertificate checks.
var withTLSOnly = map[string]bool{"blk_tls_cert_expiry_timestamp_seconds": true}

// checkVolumeLabels applies TestMetricsScrape's label rules to one
// node's families.
func checkVolumeLabels(t *testing.T, node string, mfs map[string]*dto.MetricFamily, primary bool) {
	t.Helper()
	roles := map[string]bool{}
	labelled := map[string]bool{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
				if lp.GetValue() == hostNQN {
					t.Errorf("%s: %s: label %s is the host's NQN", node, name, lp.GetName())
				}
			}
			for _, k := range []string{"subsystem", "nsid", "id", "parent"} {
				if _, ok := l[k]; ok && !(k == "id" && name == "blk_volume_info") {
					t.Errorf("%s: %s%v: label %s (volumes are labelled volume, by name)", node, name, l, k)
				}
			}
			v, ok := l["volume"]
			if !ok {
				continue
			}
			labelled[name] = true
			if v != "r" && v != "p" {
				t.Errorf("%s: %s%v: volume %q is not a volume's name", node, name, l, v)
			}
			if strings.HasPrefix(name, "blk_snapshot_") && (v != "r" || l["snapshot"] != "s1") {
				t.Errorf("%s: %s%v: want volume r, snapshot s1", node, name, l)
			}
			if name == "blk_target_namespace_writes_total" && v == "r" {
				roles[l["role"]] = true
			}
		}
	}
	want := []string{"blk_volume_writes_total", "blk_volume_info", "blk_snapshot_disk_bytes", "blk_target_namespace_writes_total", "blk_target_namespace_io_latency_seconds"}
	// Every replica's node serves the volume's own subsystem (the
	// secondaries' paths inaccessible to hosts), and a secondary the
	// replica subsystem too.
	wantRoles := map[string]bool{"host": true, "replica": true}
	if primary {
		want = append(want, "blk_replica_in_sync", "blk_volume_epoch", "blk_volume_state")
		wantRoles = map[string]bool{"host": true}
	}
	for _, name := range want {
		if !labelled[name] {
			t.Errorf("%s: %s: no series labelled volume", node, name)
		}
	}
	if fmt.Sprint(roles) != fmt.Sprint(wantRoles) {
		t.Errorf("%s: volume r's namespace roles %v, want %v", node, roles, wantRoles)
	}
}

// blkName is a blk metric name in a rule or dashboard expression.
var blkName = regexp.MustCompile(`\bblk_[a-z0-9_]+\b`)

// namedFamilies lists the blk_ metric names file holds (its expressions
// and nothing else name them), sorted, each once.
func namedFamilies(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	names := blkName.FindAllString(string(b), -1)
	sort.Strings(names)
	names = slices.Compact(names)
	if len(names) < 5 {
		t.Fatalf("%s: only %d blk_ names: %v", file, len(names), names)
	}
	return names
}

// grafanaVars are the dashboard's variables and Grafana's own, with the
// PromQL each stands for when the expressions are checked.
var grafanaVars = map[string]string{"$__rate_interval": "5m", "$__interval": "1m", "$volume": ".*"}

// TestDashboardExprs: deploy/grafana/blk.json is JSON whose every panel
// target has an expression, a refId unique in its panel and the
// dashboard's datasource variable; every $variable an expression uses is
// the dashboard's or Grafana's. promtool cannot read a dashboard: with
// BLK_DASHBOARD_RULES set, the expressions (variables replaced) are
// written there as recording rules, and .ci/run runs promtool check
// rules on them, which parses each. (That each blk_ name is exported is
// TestMetricsScrape's.)
func TestDashboardExprs(t *testing.T) {
	b, err := os.ReadFile("../../deploy/grafana/blk.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int    `json:"id"`
			Title      string `json:"title"`
			Type       string `json:"type"`
			Datasource *struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("blk.json: %v", err)
	}
	if dash.UID == "" {
		t.Error("blk.json: no uid")
	}
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars["$"+v.Name] = true
	}
	for _, v := range []string{"$datasource", "$volume"} {
		if !vars[v] {
			t.Errorf("blk.json: no variable %s", v)
		}
	}
	var rules strings.Builder
	rules.WriteString("# The expressions of deploy/grafana/blk.json, for promtool check rules.\ngroups:\n  - name: blk-dashboard\n    rules:\n")
	n := 0
	ids := map[int]bool{}
	variable := regexp.MustCompile(`\$[A-Za-z_]+`)
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want the variable ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no target", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: target %+v: empty expression, or refId missing or repeated", p.Title, tg)
			}
			refs[tg.RefID] = true
			expr := tg.Expr
			for _, v := range variable.FindAllString(expr, -1) {
				if _, ok := grafanaVars[v]; !ok {
					t.Errorf("panel %q: %s in %q is no variable of the dashboard's", p.Title, v, expr)
				}
			}
			for v, with := range grafanaVars {
				expr = strings.ReplaceAll(expr, v, with)
			}
			n++
			fmt.Fprintf(&rules, "      - record: blk_dashboard:panel%d:%s\n        expr: %s\n", p.ID, strings.ToLower(tg.RefID), strconv.Quote(expr))
		}
	}
	if n < 10 {
		t.Errorf("blk.json: %d expressions", n)
	}
	if path := os.Getenv("BLK_DASHBOARD_RULES"); path != "" {
		if err := os.WriteFile(path, []byte(rules.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
