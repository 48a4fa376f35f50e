package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// jsonWalkArgs are the arguments each leaf command runs with in
// TestJSONEverywhere, in an order that leaves what the next needs: a
// volume v, its snapshot s, a clone c. A leaf missing here fails the test.
var jsonWalkArgs = []struct {
	path string
	args []string
}{
	{"volume create", []string{"v", "--size", "16Mi"}},
	{"volume list", nil},
	{"volume show", []string{"v"}},
	{"volume resize", []string{"v", "--size", "32MiB"}},
	{"volume verify", []string{"v"}},
	{"host allow", []string{"v", "nqn.2026-11.io.blk:h1"}},
	{"host deny", []string{"v", "nqn.2026-11.io.blk:h1"}},
	{"host list", nil},
	{"volume snapshot", []string{"v", "s"}},
	{"volume snapshots", []string{"v"}},
	{"volume clone", []string{"v@s", "c"}},
	{"volume flatten", []string{"c"}},
	{"volume revert", []string{"v", "s"}},
	{"volume reservation show", []string{"v"}},
	{"volume reservation clear", []string{"v", "--yes"}},
	{"cluster status", nil},
	{"cluster join", nil},
	{"volume export", []string{"v@s", "{dir}/v.img"}},
	{"volume import", []string{"{dir}/v.img", "w"}},
	{"cert ca", []string{"--dir", "{dir}/ca"}},
	{"cert issue", []string{"n1", "--role", "node", "--ca-dir", "{dir}/ca"}},
	{"cert show", []string{"{dir}/ca/n1.crt"}},
	{"cert issue", []string{"csi", "--role", "host", "--ca-dir", "{dir}/ca"}},
	{"volume delete", []string{"c"}},
}

// jsonWalkSkip are the leaves the walk does not run, with why.
var jsonWalkSkip = map[string]string{
	"attach":                 "connects a kernel or user-space host: e2e",
	"detach":                 "needs an attach",
	"bench":                  "runs I/O through a host connection",
	"volume replace-replica": "needs a second node",
	"volume move":            "needs a second node",
	"cluster remove":         "removes a member",
	"completion":             "prints a shell script, not an object",
	"man":                    "prints a roff page, not an object",
}

// TestJSONEverywhere (docs/operations.md §5.5): every leaf command with
// an Action, run with -o json against a real blkd, prints one JSON value
// on stdout.
func TestJSONEverywhere(t *testing.T) {
	api := startBlkd(t)
	dir := t.TempDir()
	planned := map[string]bool{}
	for _, w := range jsonWalkArgs {
		planned[w.path] = true
	}
	walkCommands(newApp(nil, nil).Commands, "", func(path string, c *cli.Command) {
		if len(c.Subcommands) > 0 || c.Action == nil || c.Name == "help" {
			return
		}
		if !planned[path] && jsonWalkSkip[path] == "" {
			t.Errorf("blkctl %s: neither in jsonWalkArgs nor in jsonWalkSkip", path)
		}
	})
	for _, w := range jsonWalkArgs {
		args := append([]string{"-o", "json"}, strings.Fields(w.path)...)
		for _, a := range w.args {
			args = append(args, strings.ReplaceAll(a, "{dir}", filepath.Clean(dir)))
		}
		out, errb, code := blkctl(t, api, args...)
		if code != 0 {
			t.Errorf("blkctl %s: exit %d: %s", strings.Join(args, " "), code, errb)
			continue
		}
		var v any
		dec := json.NewDecoder(strings.NewReader(out))
		if err := dec.Decode(&v); err != nil || dec.More() {
			t.Errorf("blkctl %s: stdout is not one JSON value (%v):\n%s", strings.Join(args, " "), err, out)
		}
	}
}
