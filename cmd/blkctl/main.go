// Command blkctl is the command-line client of blkd's management API:
// volumes, hosts, attachments, the cluster, and a benchmark that drives a
// volume through the initiator. See docs/blkctl.md.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/blk-project/blk/api"
	"github.com/blk-project/blk/internal/version"
	"github.com/blk-project/blk/nvme/auth"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/blk-project/blk/nvme"

	"github.com/urfave/cli/v2"
)

// usageError is a command used wrongly: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// run runs blkctl and returns its exit code: 0, 1 on errors, 2 on usage
// errors.
func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	err := app.Run(args)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "blkctl:", err)
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "(see blkctl --help, or blkctl <object> <verb> --help)")
		return 2
	}
	return 1
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:      "blkctl",
		Usage:     "manage a blk cluster through blkd's management API",
		UsageText: "blkctl [--api URL] [--output table|json] <object> <verb> [arguments]",
		Version:   version.String(),
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "api", EnvVars: []string{"BLK_API"}, Value: "http://127.0.0.1:7070", Usage: "blkd management API `URL` (any node; writes follow the leader)"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "output format: table or json"},
			&cli.StringFlag{Name: "ca", EnvVars: []string{"BLK_CA"}, Usage: "with an https --api: the cluster CA `FILE` (default ~/.config/blk/ca.crt)"},
			&cli.StringFlag{Name: "cert", EnvVars: []string{"BLK_CERT"}, Usage: "with an https --api: your operator certificate `FILE` (default ~/.config/blk/operator.crt)"},
			&cli.StringFlag{Name: "key", EnvVars: []string{"BLK_KEY"}, Usage: "with an https --api: its key `FILE` (default ~/.config/blk/operator.key)"},
		},
		Before: func(c *cli.Context) error {
			if o := c.String("output"); o != "table" && o != "json" {
				return usageErrorf("--output %q: use table or json", o)
			}
			return nil
		},
		ExitErrHandler:  func(*cli.Context, error) {},
		HideHelpCommand: true,
		Commands: []*cli.Command{
			volumeCommand(),
			hostCommand(),
			attachCommand(),
			detachCommand(),
			clusterCommand(),
			benchCommand(),
			certCommand(),
			completionCommand(),
			manCommand(),
		},
		EnableBashCompletion: true,
	}
	app.OnUsageError = onUsageError
	app.Action = func(c *cli.Context) error {
		var objs []string
		for _, cmd := range c.App.Commands {
			objs = append(objs, cmd.Name)
		}
		if c.Args().Present() {
			return usageErrorf("unknown command %q: use one of %s", c.Args().First(), strings.Join(objs, ", "))
		}
		cli.ShowAppHelp(c)
		return usageErrorf("no command given: use one of %s", strings.Join(objs, ", "))
	}
	for _, cmd := range app.Commands {
		setUsage(cmd)
	}
	return app
}

func onUsageError(c *cli.Context, err error, _ bool) error {
	return &usageError{err.Error()}
}

// setUsage makes every usage error of cmd and its subcommands exit 2, and
// an object without a known verb a usage error.
func setUsage(cmd *cli.Command) {
	cmd.OnUsageError = onUsageError
	if len(cmd.Subcommands) == 0 {
		// The global flags work after the verb too (hidden; see global).
		cmd.Flags = append(cmd.Flags,
			&cli.StringFlag{Name: "api", Hidden: true},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Hidden: true},
			&cli.StringFlag{Name: "ca", Hidden: true},
			&cli.StringFlag{Name: "cert", Hidden: true},
			&cli.StringFlag{Name: "key", Hidden: true})
	}
	if len(cmd.Subcommands) > 0 {
		cmd.HideHelpCommand = true
		cmd.Action = func(c *cli.Context) error {
			var verbs []string
			for _, s := range cmd.Subcommands {
				verbs = append(verbs, s.Name)
			}
			if c.Args().Present() {
				return usageErrorf("unknown verb %q for %s: use one of %s", c.Args().First(), cmd.Name, strings.Join(verbs, ", "))
			}
			return usageErrorf("%s needs a verb: one of %s", cmd.Name, strings.Join(verbs, ", "))
		}
		for _, s := range cmd.Subcommands {
			setUsage(s)
		}
	}
}

// env is what every command needs: the client and the output settings.
type env struct {
	c      *cli.Context
	api    *client
	json   bool
	stdout io.Writer
	stderr io.Writer
}

// global returns a global flag: given after the verb, else before the
// object (or its default or environment variable).
func global(c *cli.Context, name string) string {
	if v := c.String(name); v != "" {
		return v
	}
	for _, p := range c.Lineage()[1:] {
		if v := p.String(name); v != "" {
			return v
		}
	}
	return ""
}

func newEnv(c *cli.Context) (*env, error) {
	out := global(c, "output")
	if out != "table" && out != "json" {
		return nil, usageErrorf("--output %q: use table or json", out)
	}
	api, err := newClient(global(c, "api"), c.App.ErrWriter)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(api.base, "https://") {
		if err := api.useTLS(global(c, "ca"), global(c, "cert"), global(c, "key")); err != nil {
			return nil, err
		}
	}
	return &env{c: c, api: api, json: out == "json", stdout: c.App.Writer, stderr: c.App.ErrWriter}, nil
}

// args checks the command got exactly the named positional arguments.
// Flags may also follow the arguments ("volume create v --size 1GiB"):
// the standard flag parsing stops at the first argument, so the rest is
// parsed here with the command's flags, and each value given there is
// set on the context again as it was typed, occurrence by occurrence.
// Re-setting a flag from its parsed value's String() would be wrong for
// every type whose String() is not its input: a slice flag given twice
// (--host a --host b) would become the one value "[a b]".
func args(c *cli.Context, names ...string) ([]string, error) {
	raw := c.Args().Slice()
	fs := flag.NewFlagSet(c.Command.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, f := range c.Command.Flags {
		if err := f.Apply(fs); err != nil {
			return nil, err
		}
	}
	var given []typed
	fs.VisitAll(func(f *flag.Flag) { f.Value = record(f.Name, f.Value, &given) })
	var a []string
	for len(raw) > 0 {
		if err := fs.Parse(raw); err != nil {
			return nil, usageErrorf("%s: %v", c.Command.FullName(), err)
		}
		raw = fs.Args()
		if len(raw) > 0 {
			a, raw = append(a, raw[0]), raw[1:]
		}
	}
	for _, g := range given {
		// Set the flag under its main name: an alias ("-o") parsed here
		// is a separate entry of fs, and the context reads the main one.
		name := g.name
		for _, cf := range c.Command.Flags {
			if ns := cf.Names(); slices.Contains(ns, g.name) {
				name = ns[0]
			}
		}
		if err := c.Set(name, g.value); err != nil {
			return nil, usageErrorf("%s: -%s: %v", c.Command.FullName(), g.name, err)
		}
	}
	if len(a) < len(names) {
		return nil, usageErrorf("%s: missing %s (usage: %s)", c.Command.FullName(), strings.ToUpper(names[len(a)]), c.Command.UsageText)
	}
	if len(a) > len(names) {
		return nil, usageErrorf("%s: unexpected argument %q (usage: %s)", c.Command.FullName(), a[len(names)], c.Command.UsageText)
	}
	for i, v := range a {
		if strings.TrimSpace(v) == "" {
			return nil, usageErrorf("%s: %s is empty", c.Command.FullName(), strings.ToUpper(names[i]))
		}
		if err := checkArg(c, names[i], v); err != nil {
			return nil, usageErrorf("%s: %v", c.Command.FullName(), err)
		}
	}
	return a, nil
}

// checkArg checks a positional argument by what it names, before any
// request is sent: a volume name or node ID (NAME, VOLUME, NODEID) must be
// in the name grammar (api.CheckName), a host NQN must be an NQN. A name
// that would not be one path segment as written ("..", "a/b") never
// reaches a URL. With --legacy-name (volume delete, cluster remove) a
// name from before the grammar is taken as it is: it then travels in a
// query or a body, never in a path.
func checkArg(c *cli.Context, name, v string) error {
	switch name {
	case "name", "volume", "nodeid":
		if name == "name" && c.Command.Name == "delete" && strings.Contains(v, "@") && !c.Bool("legacy-name") {
			_, _, _, err := splitSnap(v) // volume delete VOL@SNAP
			return err
		}
		if c.Bool("legacy-name") {
			return nil
		}
		err := api.CheckName(strings.ToUpper(name), v)
		if err != nil && slices.ContainsFunc(c.Command.Flags, func(f cli.Flag) bool { return slices.Contains(f.Names(), "legacy-name") }) {
			err = fmt.Errorf("%w (a name an older blkd accepted: repeat with --legacy-name)", err)
		}
		return err
	case "hostnqn":
		return checkNQN(strings.ToUpper(name), v)
	}
	return nil
}

// checkNQN checks an NQN as the NVMe Base specification defines it
// ("NVMe Qualified Names": nqn.yyyy-mm.reverse.domain[:string], or the
// UUID form nqn.2014-08.org.nvmexpress:uuid:..., at most 223 bytes of
// UTF-8), with the check the target itself applies (nvme.ValidateNQN).
func checkNQN(what, v string) error {
	err := nvme.ValidateNQN(v)
	if err == nil && !utf8.ValidString(v) {
		err = errors.New("not UTF-8")
	}
	if err != nil {
		return fmt.Errorf("%s %q is not an NQN (%v): give the host's NQN, nqn.yyyy-mm.reverse.domain:… (its /etc/nvme/hostnqn, e.g. nqn.2014-08.org.nvmexpress:uuid:…)", what, v, err)
	}
	return nil
}

// typed is one flag occurrence as typed on the command line: a bool
// flag without a value is "true", as the flag package sets it.
type typed struct{ name, value string }

// record wraps v so that every value the flag package sets on it is also
// appended to given. A bool flag stays a bool flag (--force takes no
// value).
func record(name string, v flag.Value, given *[]typed) flag.Value {
	r := recorder{Value: v, name: name, given: given}
	if b, ok := v.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return boolRecorder{r}
	}
	return r
}

type recorder struct {
	flag.Value
	name  string
	given *[]typed
}

func (r recorder) Set(s string) error {
	if err := r.Value.Set(s); err != nil {
		return err
	}
	*r.given = append(*r.given, typed{r.name, s})
	return nil
}

type boolRecorder struct{ recorder }

func (boolRecorder) IsBoolFlag() bool { return true }

// hostNQNFlag returns --host-nqn, which must be set.
func hostNQNFlag(c *cli.Context) (string, error) {
	h := c.String("host-nqn")
	if h == "" {
		return "", usageErrorf("%s: missing --host-nqn (the NQN of the host, e.g. nqn.2014-08.org.nvmexpress:uuid:…)", c.Command.FullName())
	}
	if err := checkNQN("--host-nqn", h); err != nil {
		return "", usageErrorf("%s: %v", c.Command.FullName(), err)
	}
	return h, nil
}

func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (e *env) table() *tabwriter.Writer {
	return tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
}

// keyValues prints rows of key, value pairs as a two-column table.
func (e *env) keyValues(rows [][2]string) error {
	tw := e.table()
	for _, r := range rows {
		fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

// hint adds what to do with blkctl to a few API errors.
func hint(err error, volume, host string) error {
	var ae *apiError
	if !errors.As(err, &ae) {
		return err
	}
	switch {
	case ae.Status == http.StatusForbidden && host != "":
		return fmt.Errorf("%s (with blkctl: blkctl host allow %s %s)", ae.Msg, volume, host)
	case ae.Status == http.StatusNotFound && volume != "":
		return fmt.Errorf("%s (see blkctl volume list)", ae.Msg)
	}
	return err
}

// ---- volume ----

func volumeCommand() *cli.Command {
	return &cli.Command{
		Name:  "volume",
		Usage: "create, list, show, resize and delete volumes",
		Subcommands: append([]*cli.Command{
			{
				Name: "create", Usage: "create a volume; the cluster places it on the node with the most free capacity, or --node", UsageText: "blkctl volume create NAME --size 10GiB [--block-size 4096] [--node NODEID] [--replicas N]",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "size", Usage: "volume size: " + api.SizeHelp + "; a multiple of the block size"},
					&cli.StringFlag{Name: "block-size", Value: "4096", Usage: "logical block size: 512 or 4096"},
					&cli.StringFlag{Name: "node", Usage: "put the volume (its primary copy) on this node (`NODEID`, as blkctl cluster status lists it; it must be up) instead of letting the cluster place it"},
					&cli.IntFlag{Name: "replicas", Usage: "keep `N` copies (1 to 5), each on a node in a zone of its own; default: 3 when the cluster has three zones, else 1"},
				},
				Action: volumeCreate,
			},
			{Name: "list", Usage: "list the volumes", UsageText: "blkctl volume list", Action: volumeList},
			{Name: "show", Usage: "show one volume", UsageText: "blkctl volume show NAME", Action: volumeShow},
			{
				Name: "resize", Usage: "grow a volume (needs a blkd with POST /v1/volumes/{name}/resize)", UsageText: "blkctl volume resize NAME --size 20GiB",
				Flags:  []cli.Flag{&cli.StringFlag{Name: "size", Usage: "new size: " + api.SizeHelp}},
				Action: volumeResize,
			},
			{
				Name: "verify", Usage: "compare a volume's replicas with its primary's, region by region (SHA-256 of each MiB)", UsageText: "blkctl volume verify NAME [--snapshots]",
				Flags:  []cli.Flag{&cli.BoolFlag{Name: "snapshots", Usage: "also compare every ready snapshot's copies on the nodes holding it"}},
				Action: volumeVerify,
			},
			{
				Name: "replace-replica", Usage: "replace a volume's replica on a node (typically one gone for good) with a new one, copied in full while hosts write; the old one is removed once the new one is in sync", UsageText: "blkctl volume replace-replica NAME NODEID [--to NODEID]",
				Flags:  []cli.Flag{&cli.StringFlag{Name: "to", Usage: "put the new replica on this node (`NODEID`); default: where placement says, outside the zones of the volume's other replicas"}},
				Action: volumeReplaceReplica,
			},
			{
				Name: "move", Usage: "move a volume's replica from a node to another online (drain a node): the new one is copied while hosts write, takes over as primary if the old one was, then the old one is removed", UsageText: "blkctl volume move NAME --from NODEID [--to NODEID]",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "from", Usage: "the node (`NODEID`) whose replica moves"},
					&cli.StringFlag{Name: "to", Usage: "the node (`NODEID`) to move it to; default: where placement says, outside the zones of the volume's other replicas"},
				},
				Action: volumeMove,
			},
			{
				Name: "delete", Usage: "delete a volume, or a snapshot (VOLUME@SNAPSHOT)", UsageText: "blkctl volume delete NAME|VOLUME@SNAPSHOT [--force] [--snapshots] [--legacy-name]",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "force", Usage: "delete even while hosts are attached (drops their connections)"},
					&cli.BoolFlag{Name: "snapshots", Usage: "delete the volume's snapshots with it (refused while one has clones)"},
					&cli.BoolFlag{Name: "legacy-name", Usage: "NAME is outside the name grammar (from an older blkd, e.g. '.' or 'a/b'): take it as it is"},
				},
				Action: volumeDelete,
			},
		}, append(snapshotCommands(), reservationCommand())...),
	}
}

func sizeFlag(c *cli.Context) (uint64, error) {
	s := c.String("size")
	if s == "" {
		return 0, usageErrorf("%s: missing --size (%s)", c.Command.FullName(), api.SizeHelp)
	}
	n, err := api.ParseSize(s)
	if err != nil {
		return 0, usageErrorf("--size: %v", err)
	}
	if n == 0 {
		return 0, usageErrorf("--size %q: a volume needs a size above 0", s)
	}
	return n, nil
}

func volumeCreate(c *cli.Context) error {
	a, err := args(c, "name")
	if err != nil {
		return err
	}
	size, err := sizeFlag(c)
	if err != nil {
		return err
	}
	bs, err := api.ParseSize(c.String("block-size"))
	if err != nil {
		return usageErrorf("--block-size: %v", err)
	}
	if bs != 512 && bs != 4096 {
		return usageErrorf("--block-size %s: use 512 or 4096", c.String("block-size"))
	}
	if err := api.CheckBlockMultiple(c.String("size"), size, bs); err != nil {
		return usageErrorf("--size %v", err)
	}
	body := map[string]any{"name": a[0], "size": size, "block_size": bs}
	if c.IsSet("node") {
		node := c.String("node")
		if err := api.CheckName("--node", node); err != nil {
			return usageErrorf("%s: %v", c.Command.FullName(), err)
		}
		body["node"] = node
	}
	if c.IsSet("replicas") {
		n := c.Int("replicas")
		if n < 1 || n > 5 {
			return usageErrorf("--replicas %d: give 1 to 5", n)
		}
		body["replicas"] = n
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var v volume
	if err := e.api.do("POST", "/v1/volumes", body, &v); err != nil {
		return err
	}
	if e.json {
		return e.printJSON(v)
	}
	fmt.Fprintf(e.stdout, "created volume %s (%s, block size %d) on node %s\n", v.Name, api.HumanSize(v.SizeBytes), v.BlockSize, v.Node)
	return e.showVolume(v)
}

func volumeList(c *cli.Context) error {
	if _, err := args(c); err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var l struct {
		Volumes []volume `json:"volumes"`
	}
	if err := e.api.do("GET", "/v1/volumes", nil, &l); err != nil {
		return err
	}
	if l.Volumes == nil {
		l.Volumes = []volume{}
	}
	if e.json {
		return e.printJSON(l)
	}
	if len(l.Volumes) == 0 {
		fmt.Fprintln(e.stdout, "no volumes (create one with: blkctl volume create NAME --size 10GiB)")
		return nil
	}
	tw := e.table()
	fmt.Fprintln(tw, "NAME\tSIZE\tBLOCK\tSTATE\tNODE\tHOSTS\tNQN")
	for _, v := range l.Volumes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", v.Name, api.HumanSize(v.SizeBytes), v.BlockSize, v.State, v.Node, hostsText(v), v.NQN)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, v := range l.Volumes {
		if legacyName(v) {
			fmt.Fprintf(e.stderr, "blkctl: warning: %s\n", legacyText(v))
		}
	}
	return nil
}

func hostsText(v volume) string {
	switch {
	case v.AllowAny:
		return "any"
	case len(v.Hosts) == 0:
		return "-"
	}
	return strings.Join(v.Hosts, ",")
}

func volumeShow(c *cli.Context) error {
	a, err := args(c, "name")
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var v volume
	if err := e.api.do("GET", volPath(a[0]), nil, &v); err != nil {
		return hint(err, a[0], "")
	}
	if e.json {
		return e.printJSON(v)
	}
	return e.showVolume(v)
}

func (e *env) showVolume(v volume) error {
	created := "-"
	if v.CreatedAt != 0 {
		created = time.Unix(0, v.CreatedAt).UTC().Format(time.RFC3339)
	}
	kv := [][2]string{
		{"Name", v.Name},
		{"ID", fmt.Sprint(v.ID)},
		{"Size", fmt.Sprintf("%s (%d bytes)", api.HumanSize(v.SizeBytes), v.SizeBytes)},
		{"Block size", fmt.Sprint(v.BlockSize)},
		{"State", v.State},
		{"Node", v.Node},
	}
	kv = append(kv, replicaRows(v)...)
	kv = append(kv, [][2]string{
		{"NQN", v.NQN},
		{"Hosts", hostsText(v)},
		{"Attached", attachedText(v)},
		{"Created", created},
	}...)
	if r := reservationRow(v); r != "" {
		kv = append(kv, [2]string{"Reservation", r})
	}
	if v.Reason != "" {
		kv = append(kv, [2]string{"Reason", v.Reason})
	}
	if legacyName(v) {
		kv = append(kv, [2]string{"Warning", legacyText(v)})
	}
	return e.keyValues(kv)
}

// replicaRows are volume show's replica lines: the epoch, how many copies
// are in sync of how many wanted, and one line per copy, "*" at the
// primary (the node hosts use). A blkd older than replicas shows none.
func replicaRows(v volume) [][2]string {
	if len(v.Replicas) == 0 {
		return nil
	}
	inSync := 0
	for _, r := range v.Replicas {
		if r.State == api.ReplicaInSync {
			inSync++
		}
	}
	rows := [][2]string{
		{"Epoch", fmt.Sprint(v.Epoch)},
		{"Replicas", fmt.Sprintf("%d in sync of %d, %d wanted", inSync, len(v.Replicas), v.WantReplicas)},
	}
	for _, r := range v.Replicas {
		mark := " "
		if r.Primary {
			mark = "*"
		}
		line := fmt.Sprintf("%s %s %s", mark, r.Node, r.State)
		if r.Since != 0 {
			line += " since " + time.Unix(0, r.Since).UTC().Format(time.RFC3339)
		}
		if r.Reason != "" {
			line += ": " + r.Reason
		}
		if r.ReplacedBy != "" {
			line += "; leaving, replaced by " + r.ReplacedBy
		}
		if rb := r.Rebuild; rb != nil && rb.TotalBytes > 0 {
			line += fmt.Sprintf(" (copied %d%%: %s of %s)", rb.DoneBytes*100/rb.TotalBytes, api.HumanSize(rb.DoneBytes), api.HumanSize(rb.TotalBytes))
		}
		rows = append(rows, [2]string{"  replica", line})
	}
	return rows
}

// legacyName says whether v's name is outside the name grammar (an older
// blkd accepted it); an older blkd does not say so itself.
func legacyName(v volume) bool { return v.LegacyName || api.CheckName("volume name", v.Name) != nil }

func legacyText(v volume) string {
	return fmt.Sprintf("volume %q has a name outside the name grammar (from an older blkd): it works, but blkctl can only delete it: copy its data to a volume with a valid name, then blkctl volume delete --legacy-name %q", v.Name, v.Name)
}

// attachedText lists a volume's attachments: host (node, since).
func attachedText(v volume) string {
	if len(v.Attachments) == 0 {
		return "-"
	}
	var parts []string
	for _, a := range v.Attachments {
		parts = append(parts, fmt.Sprintf("%s (on %s since %s)", a.HostNQN, a.Node, time.Unix(0, a.Since).UTC().Format(time.RFC3339)))
	}
	return strings.Join(parts, ", ")
}

// volumeVerify compares a volume's replicas (POST
// /v1/volumes/{name}/verify) and says where they differ; it fails (exit
// 1) when an in-sync replica differs from the primary — a lost write or
// corruption — and only reports the differences of an out-of-sync one,
// which its rebuild is to copy.
func volumeVerify(c *cli.Context) error {
	a, err := args(c, "name")
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var res api.VerifyResult
	p := volPath(a[0]) + "/verify"
	if c.Bool("snapshots") {
		p += "?snapshots=true"
	}
	if err := e.api.do("POST", p, nil, &res); err != nil {
		return hint(err, a[0], "")
	}
	bad := 0
	for _, m := range res.Mismatches {
		if m.InSync {
			bad++
		}
	}
	if e.json {
		if err := e.printJSON(res); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.stdout, "volume %s (epoch %d): %d regions of %s compared on %s (primary first)\n", res.Volume, res.Epoch, res.Regions, api.HumanSize(res.RegionBytes), strings.Join(res.Compared, ", "))
		if len(res.Snapshots) > 0 {
			fmt.Fprintf(e.stdout, "  and the copies of its snapshots %s\n", strings.Join(res.Snapshots, ", "))
		}
		for n, why := range res.Unreachable {
			fmt.Fprintf(e.stdout, "  %s not compared: %s\n", n, why)
		}
		per := map[string]int{}
		var order []string
		for _, m := range res.Mismatches {
			if m.Snapshot != "" {
				continue
			}
			if per[m.Node] == 0 {
				order = append(order, m.Node)
			}
			per[m.Node]++
		}
		for _, n := range order {
			what := "out of sync: its rebuild copies them"
			for _, m := range res.Mismatches {
				if m.Node == n && m.InSync && m.Snapshot == "" {
					what = "IN SYNC: lost writes or corruption"
					break
				}
			}
			fmt.Fprintf(e.stdout, "  %s differs from the primary in %d region(s) (%s); first at byte %d\n", n, per[n], what, firstOffset(res.Mismatches, n))
		}
		for _, m := range res.Mismatches {
			if m.Snapshot != "" {
				fmt.Fprintf(e.stdout, "  %s's copy of %s@%s differs from the reference copy at byte %d (corruption)\n", m.Node, res.Volume, m.Snapshot, m.Offset)
			}
		}
		if len(res.Mismatches) == 0 {
			fmt.Fprintln(e.stdout, "  no difference")
		}
	}
	if bad > 0 {
		return fmt.Errorf("volume %s: %d region(s) of in-sync replicas differ from the primary", res.Volume, bad)
	}
	return nil
}

func firstOffset(ms []api.VerifyMismatch, node string) uint64 {
	for _, m := range ms {
		if m.Node == node && m.Snapshot == "" {
			return m.Offset
		}
	}
	return 0
}

// volumeReplaceReplica is volume replace-replica NAME NODEID [--to].
func volumeReplaceReplica(c *cli.Context) error {
	a, err := args(c, "name", "nodeid")
	if err != nil {
		return err
	}
	return replaceReplica(c, a[0], a[1], c.String("to"), "replacing")
}

// volumeMove is volume move NAME --from NODEID [--to].
func volumeMove(c *cli.Context) error {
	a, err := args(c, "name")
	if err != nil {
		return err
	}
	if c.String("from") == "" {
		return usageErrorf("%s: missing --from NODEID, the node whose replica moves (usage: %s)", c.Command.FullName(), c.Command.UsageText)
	}
	return replaceReplica(c, a[0], c.String("from"), c.String("to"), "moving")
}

// replaceReplica asks POST /v1/volumes/{name}/replicas/replace and says
// where the new replica goes and how to follow it.
func replaceReplica(c *cli.Context, name, node, to, verb string) error {
	for _, n := range []string{node, to} {
		if n != "" {
			if err := api.CheckName("NODEID", n); err != nil {
				return usageErrorf("%s: %v", c.Command.FullName(), err)
			}
		}
	}
	if to == node {
		return usageErrorf("%s: --to %s is the node the replica leaves: give another, or none to let placement choose", c.Command.FullName(), to)
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var v volume
	err = e.api.do("POST", volPath(name)+"/replicas/replace", api.ReplaceReplicaRequest{Node: node, To: to}, &v)
	var ae *apiError
	if errors.As(err, &ae) && ae.notFoundRoute() {
		return fmt.Errorf("this blkd (%s) cannot replace replicas: upgrade every node to a blkd with POST /v1/volumes/{name}/replicas/replace", e.api.base)
	}
	if err != nil {
		return hint(err, name, "")
	}
	if e.json {
		return e.printJSON(v)
	}
	for _, r := range v.Replicas {
		if r.Node == node && r.ReplacedBy != "" {
			fmt.Fprintf(e.stdout, "%s the replica of volume %s on %s: a new one on %s is copied in full; the old one is removed once it is in sync (blkctl volume show %s)\n", verb, v.Name, node, r.ReplacedBy, v.Name)
			return nil
		}
	}
	fmt.Fprintf(e.stdout, "%s the replica of volume %s on %s (blkctl volume show %s)\n", verb, v.Name, node, v.Name)
	return nil
}

func volumeResize(c *cli.Context) error {
	a, err := args(c, "name")
	if err != nil {
		return err
	}
	size, err := sizeFlag(c)
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var v volume
	err = e.api.do("POST", volPath(a[0])+"/resize", map[string]any{"size": size}, &v)
	var ae *apiError
	if errors.As(err, &ae) && ae.notFoundRoute() {
		return fmt.Errorf("this blkd (%s) does not support resize: upgrade blkd to one with POST /v1/volumes/{name}/resize", e.api.base)
	}
	if err != nil {
		return hint(err, a[0], "")
	}
	if v.Name == "" { // an answer without the volume: read it
		if err := e.api.do("GET", volPath(a[0]), nil, &v); err != nil {
			return err
		}
	}
	if e.json {
		return e.printJSON(v)
	}
	fmt.Fprintf(e.stdout, "resized volume %s to %s\n", v.Name, api.HumanSize(v.SizeBytes))
	return nil
}

// sep is what joins a query parameter to p: "?" or "&".
func sep(p string) string {
	if strings.Contains(p, "?") {
		return "&"
	}
	return "?"
}

func volumeDelete(c *cli.Context) error {
	a, err := args(c, "name")
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	if vol, snap, ok, _ := splitSnap(a[0]); ok && !c.Bool("legacy-name") {
		if c.Bool("force") || c.Bool("snapshots") {
			return usageErrorf("%s: --force and --snapshots are for volumes, not a snapshot (%s)", c.Command.FullName(), a[0])
		}
		return snapshotDelete(c, e, vol, snap)
	}
	p := volPath(a[0])
	if c.Bool("legacy-name") {
		// Any name is one query value; no path could hold ".." or "a/b".
		p = "/v1/volumes?" + url.Values{"name": {a[0]}}.Encode()
	}
	if c.Bool("force") {
		p += sep(p) + "force=true"
	}
	if c.Bool("snapshots") {
		p += sep(p) + "snapshots=true"
	}
	if err := e.api.do("DELETE", p, nil, nil); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusConflict && strings.Contains(ae.Msg, "snapshots") {
			return fmt.Errorf("%s (with blkctl: blkctl volume delete %s --snapshots)", ae.Msg, a[0])
		}
		if errors.As(err, &ae) && ae.Status == http.StatusConflict && !c.Bool("force") {
			return fmt.Errorf("%s (with blkctl: blkctl detach %s --host-nqn NQN, or blkctl volume delete %s --force)", ae.Msg, a[0], a[0])
		}
		return hint(err, a[0], "")
	}
	if e.json {
		return e.printJSON(map[string]any{"deleted": a[0]})
	}
	fmt.Fprintf(e.stdout, "deleted volume %s\n", a[0])
	return nil
}

// ---- host ----

func hostCommand() *cli.Command {
	return &cli.Command{
		Name:  "host",
		Usage: "allow or deny a host (by NQN) access to a volume; list the registered hosts",
		Subcommands: []*cli.Command{
			{
				Name: "allow", Usage: "allow a host to attach a volume, optionally only with DH-HMAC-CHAP authentication",
				UsageText: "blkctl host allow VOLUME HOSTNQN [--dhchap-secret SECRET|generate [--dhchap-ctrl-secret SECRET|generate]]",
				Description: "With --dhchap-secret the host must prove on every queue it connects that it holds this secret\n" +
					"(DHHC-1 format, as nvme gen-dhchap-key writes it; 'generate' makes one and prints it once).\n" +
					"With --dhchap-ctrl-secret the volume's controller proves its own secret to a host that asks\n" +
					"(nvme connect --dhchap-ctrl-secret). New secrets replace the host's old ones; allowing a host\n" +
					"again without them keeps them; host deny drops them. The API never shows a secret again.",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "dhchap-secret", EnvVars: []string{"BLK_DHCHAP_SECRET"}, Usage: "the host's DH-HMAC-CHAP `SECRET`, or 'generate'"},
					&cli.StringFlag{Name: "dhchap-ctrl-secret", EnvVars: []string{"BLK_DHCHAP_CTRL_SECRET"}, Usage: "the controller's DH-HMAC-CHAP `SECRET` (bidirectional), or 'generate'"},
				},
				Action: hostAllow,
			},
			{
				Name: "deny", Usage: "take a host's access away (its live controllers are torn down)", UsageText: "blkctl host deny VOLUME HOSTNQN [--force]",
				Flags:  []cli.Flag{&cli.BoolFlag{Name: "force", Usage: "deny even while the host is attached"}},
				Action: hostDeny,
			},
			hostListCommand(),
		},
	}
}

func hostAllow(c *cli.Context) error {
	a, err := args(c, "volume", "hostnqn")
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	req := api.HostRequest{HostNQN: a[1]}
	var generated [][2]string
	for _, f := range []struct {
		flag, what string
		dst        *string
	}{{"dhchap-secret", "host secret", &req.DHCHAPSecret}, {"dhchap-ctrl-secret", "controller secret", &req.DHCHAPCtrlSecret}} {
		switch v := c.String(f.flag); v {
		case "":
		case "generate":
			// Transformed with SHA-256 (DHHC-1:01): the secret as used is
			// bound to the host's NQN, as nvme gen-dhchap-key --hmac=1.
			k, err := auth.GenerateKey(auth.SHA256, 32)
			if err != nil {
				return err
			}
			*f.dst = k.Encode()
			generated = append(generated, [2]string{f.what, *f.dst})
		default:
			if _, err := auth.ParseKey(v); err != nil {
				return usageErrorf("--%s: %v (give a DHHC-1 secret from nvme gen-dhchap-key, or 'generate')", f.flag, err)
			}
			*f.dst = v
		}
	}
	if req.DHCHAPCtrlSecret != "" && req.DHCHAPSecret == "" {
		return usageErrorf("--dhchap-ctrl-secret needs --dhchap-secret: the host authenticates first")
	}
	var v volume
	if err := e.api.do("POST", volPath(a[0])+"/hosts", req, &v); err != nil {
		return hint(err, a[0], "")
	}
	if e.json {
		// The only time a generated secret is shown: beside the volume's
		// fields (api.Volume has its own MarshalJSON, so embedding it in a
		// struct would hide these).
		raw, err := json.Marshal(v)
		if err != nil {
			return err
		}
		var out map[string]json.RawMessage
		if err := json.Unmarshal(raw, &out); err != nil {
			return err
		}
		for _, g := range generated {
			key := "generated_dhchap_ctrl_secret"
			if g[0] == "host secret" {
				key = "generated_dhchap_secret"
			}
			if out[key], err = json.Marshal(g[1]); err != nil {
				return err
			}
		}
		return e.printJSON(out)
	}
	fmt.Fprintf(e.stdout, "host %s may attach volume %s (hosts: %s)\n", a[1], a[0], hostsText(v))
	if m := v.Authentication[a[1]]; m != "" {
		fmt.Fprintf(e.stdout, "host %s must authenticate (%s)\n", a[1], m)
	}
	for _, g := range generated {
		fmt.Fprintf(e.stdout, "generated %s of host %s (give it to the host; it is not shown again): %s\n", g[0], a[1], g[1])
	}
	return nil
}

func hostDeny(c *cli.Context) error {
	a, err := args(c, "volume", "hostnqn")
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	p := volPath(a[0]) + "/hosts/" + url.PathEscape(a[1])
	if strings.ContainsAny(a[1], "/\\%") {
		// A valid NQN may hold these after its ':'; no clean path
		// segment can (blkd refuses an escaped '/' or '%'): the query
		// holds any NQN.
		p = volPath(a[0]) + "/hosts?" + url.Values{"host_nqn": {a[1]}}.Encode()
	}
	if c.Bool("force") {
		p += sep(p) + "force=true"
	}
	var v volume
	if err := e.api.do("DELETE", p, nil, &v); err != nil {
		return hint(err, a[0], "")
	}
	if e.json {
		return e.printJSON(v)
	}
	fmt.Fprintf(e.stdout, "host %s may no longer attach volume %s (hosts: %s)\n", a[1], a[0], hostsText(v))
	return nil
}

// ---- cluster ----

func clusterCommand() *cli.Command {
	return &cli.Command{
		Name:  "cluster",
		Usage: "show the cluster, add or remove nodes",
		Subcommands: []*cli.Command{
			{Name: "status", Usage: "show the members and the registry leader", UsageText: "blkctl cluster status", Action: clusterStatus},
			{Name: "join", Usage: "how to add a node (start blkd with --join)", UsageText: "blkctl cluster join", Action: clusterJoin},
			{
				Name: "remove", Usage: "remove a node from the cluster", UsageText: "blkctl cluster remove NODEID [--legacy-name]",
				Flags:  []cli.Flag{&cli.BoolFlag{Name: "legacy-name", Usage: "NODEID is outside the name grammar (from an older blkd): take it as it is"}},
				Action: clusterRemove,
			},
		},
	}
}

// promised is a member's promised capacity, "8MiB of 100GiB" (volume
// sizes; snapshots are not promised: see DISK).
func promised(m api.Member) string {
	switch {
	case m.State == "unregistered":
		return "-"
	case m.CapacityBytes == 0:
		return api.HumanSize(m.PromisedBytes) + " (no limit)"
	}
	return api.HumanSize(m.PromisedBytes) + " of " + api.HumanSize(m.CapacityBytes)
}

// disk is what a member's store really holds, as it reports it:
// "1GiB held, 40GiB free of 100GiB", "FULL: <reason>", or "-" (it did
// not answer).
func disk(d *api.NodeDisk) string {
	switch {
	case d == nil:
		return "-"
	case d.Full != "":
		return "FULL: " + d.Full
	case d.TotalBytes == 0:
		return api.HumanSize(d.MappedBytes) + " held"
	}
	return fmt.Sprintf("%s held, %s free of %s", api.HumanSize(d.MappedBytes), api.HumanSize(d.FreeBytes), api.HumanSize(d.TotalBytes))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// joinHelp is what cluster join prints: joining is blkd's, at start.
const joinHelp = `A node joins a cluster when it starts: run blkd on the new node with
--join set to the API address (host:port) of any live member, e.g.

  blkd --node-id node2 --data-dir /var/lib/blk \
       --raft-addr 10.0.0.2:7000 --tcp-addr 10.0.0.2:4420 --nvme-addr 10.0.0.2:4421 \
       --api-addr 10.0.0.2:7070 \
       --join 10.0.0.1:7070

(or "join" in its config file). Then check it with: blkctl cluster status
`

func clusterJoin(c *cli.Context) error {
	if wantJSON(c) {
		return writeJSON(c, map[string]string{"help": joinHelp})
	}
	fmt.Fprint(c.App.Writer, joinHelp)
	return nil
}

func clusterRemove(c *cli.Context) error {
	a, err := args(c, "nodeid")
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var res map[string]any
	if err := e.api.do("POST", "/v1/cluster/remove", map[string]string{"node_id": a[0]}, &res); err != nil {
		return err
	}
	if e.json {
		return e.printJSON(res)
	}
	fmt.Fprintf(e.stdout, "removed node %s from the cluster (registry: %v)\n", a[0], res["registry"])
	return nil
}
