#!/usr/bin/env bash
# Installs blk on this machine (or into a tree, for packaging): blkd and
# blkctl to /usr/local/bin, their man pages and shell completions, the
# systemd unit, the sysusers.d and tmpfiles.d files (then creates the blk
# user and /etc/blk), docs/blkd.md (the unit's Documentation=) and, when
# there is none, an example /etc/blk/blkd.json to edit. Idempotent: run it
# again after an upgrade; an existing /etc/blk/blkd.json is kept.
#
#   deploy/install.sh [--root DIR] [--bin DIR]
#
#   --root DIR  install under DIR instead of / (no systemctl; the user is
#               written to DIR/etc by systemd-sysusers --root)
#   --bin DIR   take blkd and blkctl from DIR (default: build them with
#               go build -buildvcs=true into a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."

root=/
bin=
while [ $# -gt 0 ]; do
	case $1 in
	--root) root=${2:?--root needs a directory}; shift 2 ;;
	--bin) bin=${2:?--bin needs a directory}; shift 2 ;;
	-h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ -d "$root" ] || { echo "install.sh: --root $root: no such directory" >&2; exit 2; }
root=$(cd "$root" && pwd)
r=${root%/} # "" for /

if [ -z "$bin" ]; then
	command -v go >/dev/null || { echo "install.sh: no go to build with: pass --bin DIR with built blkd and blkctl" >&2; exit 2; }
	bin=$(mktemp -d)
	trap 'rm -rf "$bin"' EXIT
	go build -buildvcs=true -o "$bin/" ./cmd/blkd ./cmd/blkctl
fi
for b in blkd blkctl; do
	[ -x "$bin/$b" ] || { echo "install.sh: $bin/$b: not an executable" >&2; exit 2; }
done

say() { echo "install.sh: $*"; }

install -d "$r/usr/local/bin"
install -m 0755 "$bin/blkd" "$bin/blkctl" "$r/usr/local/bin/"
say "binaries in $r/usr/local/bin"

# Man pages and completions come from the binaries themselves (blkd --man,
# blkctl man, blkctl completion SHELL); a binary that cannot make one is
# said and skipped.
gen() { # gen DEST CMD...: CMD's output, when it has one, to DEST
	local dest=$1 tmp
	shift
	tmp=$(mktemp)
	if "$@" >"$tmp" 2>/dev/null && [ -s "$tmp" ]; then
		install -D -m 0644 "$tmp" "$dest"
	else
		say "skipped $dest: '$(basename "$1") ${*:2}' did not produce it"
	fi
	rm -f "$tmp"
}
gen "$r/usr/local/share/man/man8/blkd.8" "$bin/blkd" --man
gen "$r/usr/local/share/man/man1/blkctl.1" "$bin/blkctl" man
gen "$r/usr/local/share/bash-completion/completions/blkctl" "$bin/blkctl" completion bash
gen "$r/usr/local/share/zsh/site-functions/_blkctl" "$bin/blkctl" completion zsh
gen "$r/usr/local/share/fish/vendor_completions.d/blkctl.fish" "$bin/blkctl" completion fish

install -D -m 0644 deploy/systemd/blkd.service "$r/etc/systemd/system/blkd.service"
install -D -m 0644 deploy/systemd/blk.sysusers "$r/usr/lib/sysusers.d/blk.conf"
install -D -m 0644 deploy/systemd/blk.tmpfiles "$r/usr/lib/tmpfiles.d/blk.conf"
install -D -m 0644 docs/blkd.md "$r/usr/share/doc/blk/blkd.md"
say "unit, sysusers.d, tmpfiles.d and docs installed"

# The user first: tmpfiles' "root blk" needs the group.
if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null; then
	mkdir -p "$r/etc"
	systemd-sysusers --root="$root" "$r/usr/lib/sysusers.d/blk.conf"
	systemd-tmpfiles --root="$root" --create "$r/usr/lib/tmpfiles.d/blk.conf"
	say "user blk and /etc/blk ready"
else
	say "no systemd-sysusers/systemd-tmpfiles here: create the user blk and /etc/blk (0750 root:blk) yourself"
fi

if [ ! -e "$r/etc/blk/blkd.json" ]; then
	install -D -m 0640 deploy/blkd.example.json "$r/etc/blk/blkd.json"
	# Readable by blkd: group blk (its gid from the tree's own /etc/group).
	gid=$(awk -F: '$1 == "blk" {print $3}' "$r/etc/group" 2>/dev/null || true)
	if [ "$(id -u)" = 0 ] && [ -n "$gid" ]; then
		chgrp "$gid" "$r/etc/blk/blkd.json"
	fi
	say "example config in $r/etc/blk/blkd.json: edit its addresses before you start blkd"
else
	say "kept the existing $r/etc/blk/blkd.json"
fi

if [ -z "$r" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	say "then: systemctl enable --now blkd"
fi
