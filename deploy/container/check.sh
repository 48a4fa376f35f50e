#!/usr/bin/env bash
# Runs the Containerfile's own build command (read from the file, so the
# two cannot drift) outside any container, as CI does: there is no
# container engine here, so this is what is checked of the image
# (docs/operations.md §1.12): the programs build static with those
# flags, and the version the build arguments give is the one they report.
#
#   bash deploy/container/check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "container check: $*" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The build stage's RUN ... go build ..., continuation lines joined.
cmd=$(sed -e ':a' -e '/\\$/{N;s/\\\n//;ba' -e '}' deploy/container/Containerfile |
	sed -n 's/^RUN \(.*go build .*\)$/\1/p' | sed 's/[[:space:]]\{1,\}/ /g')
[ -n "$cmd" ] || fail "no 'RUN ... go build' in deploy/container/Containerfile"
case $cmd in
*" -o /out/ "*) ;;
*) fail "the build command does not write to /out/: $cmd" ;;
esac
cmd=${cmd/ -o \/out\/ / -o $work\/out\/ }

# Every package it builds; one not in this tree yet is said and left out.
progs=()
for pkg in $(printf '%s\n' "$cmd" | grep -o '\./cmd/[a-z0-9-]*'); do
	if [ -d "$pkg" ]; then
		progs+=("$(basename "$pkg")")
	else
		echo "container check: $pkg is not in this tree: not built"
		cmd=${cmd/ $pkg/}
	fi
done
[ "${#progs[@]}" -gt 0 ] || fail "the build command builds nothing that is here"

VERSION=v0.0.0-container-check
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
mkdir "$work/out"
(eval "$cmd") || fail "the Containerfile's build failed: $cmd"
for p in "${progs[@]}"; do
	out=$("$work/out/$p" --version) || fail "$p --version failed"
	case $out in
	*"$VERSION (rev $REVISION"*) ;;
	*) fail "$p --version says '$out', not $VERSION (rev $REVISION ...)" ;;
	esac
	go version -m "$work/out/$p" | grep -q 'CGO_ENABLED=0' || fail "$p is not built with CGO_ENABLED=0"
	echo "container check: $out"
done
