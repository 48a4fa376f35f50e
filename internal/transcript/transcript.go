// Package transcript runs the block transcripts of blk's pure state
// machines (meta's registry, nvme/resv's reservations): a file of blocks,
// each a directive line, input lines, "----", and the expected output up
// to a blank line. Blank lines and lines starting with # between blocks
// are comments. It is for tests only; what a directive means is the
// caller's.
package transcript

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// Run reads the transcript at path and calls do for each block with its
// directive, its input lines and the line number of its directive; do
// returns the block's output lines. Run fails t where they differ from
// the expected ones, or, when rewrite is set, writes the file again with
// what do returned as the expected output.
func Run(t testing.TB, path string, rewrite bool, do func(directive string, input []string, start int) []string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder // the rewritten file
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	line := 0
	next := func() (string, bool) {
		if !sc.Scan() {
			return "", false
		}
		line++
		return sc.Text(), true
	}
	for {
		l, ok := next()
		if !ok {
			break
		}
		if l == "" || strings.HasPrefix(l, "#") {
			out.WriteString(l + "\n")
			continue
		}
		directive, start := l, line
		var input []string
		for {
			l, ok = next()
			if !ok {
				t.Fatalf("%s:%d: block without ----", path, start)
			}
			if l == "----" {
				break
			}
			input = append(input, l)
		}
		var want []string
		for {
			l, ok = next()
			if !ok || l == "" {
				break
			}
			want = append(want, l)
		}
		got := do(directive, input, start)
		out.WriteString(directive + "\n")
		for _, in := range input {
			out.WriteString(in + "\n")
		}
		out.WriteString("----\n")
		for _, g := range got {
			out.WriteString(g + "\n")
		}
		out.WriteString("\n")
		if !rewrite && strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, start, directive, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
