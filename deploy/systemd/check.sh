#!/usr/bin/env bash
# Checks the systemd files without a running systemd (CI runs it; systemd
# need not be PID 1, only its tools installed):
#   - systemd-analyze verify blkd.service (ExecStart pointed at a built
#     blkd: verify refuses a missing executable);
#   - systemd-analyze security --offline=yes --threshold=20: an exposure
#     above 2.0 fails;
#   - blk.sysusers then blk.tmpfiles into a temporary root: the user blk
#     exists and /etc/blk is 0750 root:blk (tmpfiles fails to resolve the
#     group without sysusers first);
#   - deploy/install.sh --root into another, twice: the tree it writes.
# Skips, saying so, where systemd-analyze is absent.
#
#   deploy/systemd/check.sh [BINDIR]   (BINDIR: built blkd and blkctl;
#                                       default: go build into a temp dir)
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v systemd-analyze >/dev/null; then
	echo "systemd check: skipped, no systemd-analyze here (Debian: apt-get install systemd)"
	exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=${1:-}
if [ -z "$bin" ]; then
	bin=$work/bin
	go build -o "$bin/" ./cmd/blkd ./cmd/blkctl
fi
bin=$(cd "$bin" && pwd)
fail() { echo "systemd check: $*" >&2; exit 1; }

# verify and security read the unit from a directory of its own.
mkdir "$work/unit"
unit=$work/unit/blkd.service
sed "s|^ExecStart=/usr/local/bin/blkd |ExecStart=$bin/blkd |" deploy/systemd/blkd.service >"$unit"
grep -q "^ExecStart=$bin/blkd " "$unit" || fail "blkd.service: no 'ExecStart=/usr/local/bin/blkd ' line to point at the built blkd"
if [ ! -x /bin/kill ]; then # procps is not in a minimal Debian
	echo "systemd check: no /bin/kill here: ExecReload checked with /bin/true in its place"
	sed -i 's|^ExecReload=/bin/kill |ExecReload=/bin/true |' "$unit"
fi
out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify blkd.service failed:
$out"
[ -z "$out" ] || fail "systemd-analyze verify blkd.service warns:
$out"
echo "systemd check: verify passed"
if ! out=$(systemd-analyze security --offline=yes --threshold=20 "$unit" 2>&1); then
	printf '%s\n' "$out" | grep -E '^✗|Overall' >&2 || true
	fail "systemd-analyze security: blkd.service's exposure is above 2.0"
fi
printf '%s\n' "$out" | grep 'Overall exposure'

root=$work/root
# (the tools want an absolute path to a file argument)
mkdir -p "$root/etc"
systemd-sysusers --root="$root" "$PWD/deploy/systemd/blk.sysusers"
systemd-tmpfiles --root="$root" --create "$PWD/deploy/systemd/blk.tmpfiles"
grep -q '^blk:x:[0-9]*:[0-9]*:blk storage node:/var/lib/blk:' "$root/etc/passwd" || fail "sysusers: no user blk in $root/etc/passwd"
gid=$(awk -F: '$1 == "blk" {print $3}' "$root/etc/group")
[ -n "$gid" ] || fail "sysusers: no group blk"
for d in etc/blk etc/blk/tls; do
	want="750 0 $gid"
	[ "$(id -u)" = 0 ] || want="750 $(id -u) $(id -g)" # only root can chown
	[ "$(stat -c '%a %u %g' "$root/$d")" = "$want" ] || fail "tmpfiles: $d is $(stat -c '%a %u %g' "$root/$d"), want $want"
done
echo "systemd check: sysusers and tmpfiles passed"

inst=$work/inst
mkdir "$inst"
deploy/install.sh --root "$inst" --bin "$bin" >/dev/null
echo '{"edited": true}' >"$inst/etc/blk/blkd.json"
deploy/install.sh --root "$inst" --bin "$bin" >/dev/null # idempotent, keeps the config
for f in usr/local/bin/blkd usr/local/bin/blkctl etc/systemd/system/blkd.service \
	usr/lib/sysusers.d/blk.conf usr/lib/tmpfiles.d/blk.conf usr/share/doc/blk/blkd.md; do
	[ -f "$inst/$f" ] || fail "install.sh: no $f"
done
cmp -s "$inst/etc/systemd/system/blkd.service" deploy/systemd/blkd.service || fail "install.sh: the unit differs from deploy/systemd/blkd.service"
grep -q edited "$inst/etc/blk/blkd.json" || fail "install.sh: overwrote an existing /etc/blk/blkd.json"
[ "$(grep -c '^blk:' "$inst/etc/passwd")" = 1 ] || fail "install.sh: user blk not created exactly once"
# The unit's Documentation= file is one install.sh installs.
doc=$(sed -n 's|^Documentation=file://||p' deploy/systemd/blkd.service)
[ -z "$doc" ] || [ -f "$inst$doc" ] || fail "install.sh does not install the unit's Documentation=file://$doc"
echo "systemd check: install.sh passed"
