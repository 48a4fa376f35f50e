package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// The bash and zsh shims ask blkctl itself for the candidates
// (urfave/cli's --generate-bash-completion, enabled in newApp), so they
// never go stale; fish gets the whole tree, generated from the commands.
const bashCompletion = `# bash completion for blkctl (blkctl completion bash)
_blkctl_complete() {
	local cur words
	COMPREPLY=()
	cur="${COMP_WORDS[COMP_CWORD]}"
	if [[ "$cur" == "-"* ]]; then
		words=$("${COMP_WORDS[@]:0:$COMP_CWORD}" "$cur" --generate-bash-completion 2>/dev/null)
	else
		words=$("${COMP_WORDS[@]:0:$COMP_CWORD}" --generate-bash-completion 2>/dev/null)
	fi
	COMPREPLY=($(compgen -W "$words" -- "$cur"))
	return 0
}
complete -o bashdefault -o default -F _blkctl_complete blkctl
`

const zshCompletion = `#compdef blkctl
# zsh completion for blkctl (blkctl completion zsh)
_blkctl() {
	local -a opts
	local cur
	cur=${words[-1]}
	if [[ "$cur" == "-"* ]]; then
		opts=("${(@f)$(${words[@]:0:#words[@]-1} "$cur" --generate-bash-completion 2>/dev/null)}")
	else
		opts=("${(@f)$(${words[@]:0:#words[@]-1} --generate-bash-completion 2>/dev/null)}")
	fi
	if [[ "${opts[1]}" != "" ]]; then
		_describe 'values' opts
	else
		_files
	fi
}
if [ "$funcstack[1]" = "_blkctl" ]; then
	_blkctl "$@"
else
	compdef _blkctl blkctl
fi
`

// completionShells are the shells blkctl completion writes for.
var completionShells = []string{"bash", "zsh", "fish"}

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print the shell completion script for bash, zsh or fish",
		UsageText: "blkctl completion bash|zsh|fish   (e.g. blkctl completion bash > /usr/share/bash-completion/completions/blkctl)",
		Action: func(c *cli.Context) error {
			a, err := args(c, "bash|zsh|fish")
			if err != nil {
				return err
			}
			var script string
			switch a[0] {
			case "bash":
				script = bashCompletion
			case "zsh":
				script = zshCompletion
			case "fish":
				if script, err = c.App.ToFishCompletion(); err != nil {
					return fmt.Errorf("fish completion: %w", err)
				}
			default:
				return usageErrorf("completion %q: use one of %s", a[0], strings.Join(completionShells, ", "))
			}
			_, err = fmt.Fprint(c.App.Writer, script)
			return err
		},
	}
}

func manCommand() *cli.Command {
	return &cli.Command{
		Name:      "man",
		Usage:     "print blkctl's manual page (roff), generated from its commands",
		UsageText: "blkctl man > /usr/share/man/man1/blkctl.1",
		Action: func(c *cli.Context) error {
			if _, err := args(c); err != nil {
				return err
			}
			page, err := c.App.ToManWithSection(1)
			if err != nil {
				return fmt.Errorf("man page: %w", err)
			}
			_, err = fmt.Fprint(c.App.Writer, page)
			return err
		},
	}
}
