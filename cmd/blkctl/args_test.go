package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/blk-project/blk/pki"
	"github.com/urfave/cli/v2"
)

// runIn runs blkctl in this process and returns its exit code and output.
func runIn(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(append([]string{"blkctl"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

// TestCertHostsEitherOrder issues node certificates with --host given
// before and after NAME (docs/blkctl.md shows it after): both must carry
// the same two SANs, one DNS name and one IP each given, never one DNS
// name "[a b]" (issue 21 case 7).
func TestCertHostsEitherOrder(t *testing.T) {
	dir := t.TempDir()
	if code, _, errs := runIn("cert", "ca", "--dir", dir); code != 0 {
		t.Fatalf("cert ca: %d %s", code, errs)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"after", []string{"cert", "issue", "after", "--role", "node", "--ca-dir", dir, "--host", "a.example", "--host", "b", "--host", "10.0.0.7"}},
		{"before", []string{"cert", "issue", "--role", "node", "--ca-dir", dir, "--host", "a.example", "--host", "b", "--host", "10.0.0.7", "before"}},
		{"split", []string{"cert", "issue", "--host", "a.example", "split", "--role", "node", "--ca-dir", dir, "--host", "b", "--host", "10.0.0.7"}},
	} {
		if code, _, errs := runIn(tc.args...); code != 0 {
			t.Fatalf("%s: %v: exit %d: %s", tc.name, tc.args, code, errs)
		}
		c, err := pki.LoadCert(filepath.Join(dir, tc.name+".crt"))
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"a.example", "b"}; !slices.Equal(c.DNSNames, want) {
			t.Errorf("%s: DNS SANs %q, want %q", tc.name, c.DNSNames, want)
		}
		if len(c.IPAddresses) != 1 || !c.IPAddresses[0].Equal(net.ParseIP("10.0.0.7")) {
			t.Errorf("%s: IP SANs %v, want [10.0.0.7]", tc.name, c.IPAddresses)
		}
		if err := c.VerifyHostname("b"); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// level is a cli.Generic flag value (as a custom flag type would be).
type level struct{ v string }

func (l *level) Set(s string) error {
	if s != "low" && s != "high" {
		return fmt.Errorf("level %q: use low or high", s)
	}
	l.v = s
	return nil
}
func (l *level) String() string { return l.v }

// flagValues is what a command saw of every flag type blkctl uses.
type flagValues struct {
	Str   string
	Int   int
	Bool  bool
	Dur   time.Duration
	Slice []string
	Gen   string
	Alias string
	Args  []string
}

// parseBothWays runs a command with one flag of each type through args(),
// as blkctl's commands do.
func parseBothWays(t *testing.T, argv ...string) (flagValues, error) {
	t.Helper()
	var got flagValues
	app := &cli.App{
		Writer: &bytes.Buffer{}, ErrWriter: &bytes.Buffer{},
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{{
			Name: "cmd",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "str", Value: "default"},
				&cli.IntFlag{Name: "int", Value: 7},
				&cli.BoolFlag{Name: "bool"},
				&cli.DurationFlag{Name: "dur", Value: time.Second},
				&cli.StringSliceFlag{Name: "slice"},
				&cli.GenericFlag{Name: "gen", Value: &level{"low"}},
				&cli.StringFlag{Name: "alias", Aliases: []string{"a"}},
			},
			Action: func(c *cli.Context) error {
				a, err := args(c, "x", "y")
				if err != nil {
					return err
				}
				got = flagValues{c.String("str"), c.Int("int"), c.Bool("bool"), c.Duration("dur"),
					c.StringSlice("slice"), c.Generic("gen").(*level).v, c.String("alias"), a}
				return nil
			},
		}},
	}
	app.OnUsageError = onUsageError
	err := app.Run(append([]string{"test", "cmd"}, argv...))
	return got, err
}

// TestFlagsAfterArguments: every flag type keeps its value whether it is
// given before, between or after the positional arguments.
func TestFlagsAfterArguments(t *testing.T) {
	flags := [][]string{
		{"--str", "s v"}, {"--int", "42"}, {"--bool"}, {"--dur", "1m30s"},
		{"--slice", "a"}, {"--slice", "b c"}, {"--gen", "high"}, {"-a", "al"},
	}
	want := flagValues{"s v", 42, true, 90 * time.Second, []string{"a", "b c"}, "high", "al", []string{"X", "Y"}}
	var all []string
	for _, f := range flags {
		all = append(all, f...)
	}
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"before", append(slices.Clone(all), "X", "Y")},
		{"after", append([]string{"X", "Y"}, all...)},
		{"between", append(append([]string{"X"}, all...), "Y")},
		{"mixed", append(append(append(slices.Concat(flags[:3]...), "X"), slices.Concat(flags[3:5]...)...), append([]string{"Y"}, slices.Concat(flags[5:]...)...)...)},
	} {
		got, err := parseBothWays(t, tc.argv...)
		if err != nil {
			t.Fatalf("%s %q: %v", tc.name, tc.argv, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s %q:\n got %+v\nwant %+v", tc.name, tc.argv, got, want)
		}
	}
	// Defaults stay defaults; a bad value after the arguments is a usage
	// error naming the flag.
	got, err := parseBothWays(t, "X", "Y")
	if err != nil || !reflect.DeepEqual(got, flagValues{"default", 7, false, time.Second, nil, "low", "", []string{"X", "Y"}}) {
		t.Errorf("defaults: %+v %v", got, err)
	}
	for _, bad := range [][]string{{"X", "Y", "--int", "many"}, {"X", "Y", "--gen", "medium"}, {"X", "Y", "--dur", "soon"}, {"X", "Y", "--nope"}} {
		_, err := parseBothWays(t, bad...)
		var ue *usageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), strings.TrimPrefix(bad[2], "--")) {
			t.Errorf("%q: %v, want a usage error naming the flag", bad, err)
		}
	}
}

var _ flag.Value = (*level)(nil)
