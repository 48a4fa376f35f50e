#!/usr/bin/env bash
# Builds what the e2e VMs boot, into the directory named by $1 (the cache):
#   vmlinuz        the stock Debian bookworm kernel (linux-image-amd64)
#   initrd.cpio    an uncompressed initramfs: busybox, the modules the tests
#                  need (plus siw built out of tree for exactly that kernel,
#                  and its NVMe modules rebuilt with DH-HMAC-CHAP),
#                  the Debian userland the tests run (nvme-cli, fio,
#                  e2fsprogs, rdma-core, iproute2, kmod) and /init
#   key            what it was built from; prepare.sh is a no-op when the
#                  inputs (package versions, this script, init) are unchanged
# Needs root and apt (Debian). Prints one line per step.
set -euo pipefail

mkdir -p "$1"
out=$(readlink -f "$1")
here=$(dirname "$(readlink -f "$0")")
mkdir -p "$out"
export DEBIAN_FRONTEND=noninteractive

step() { echo "e2e prepare: $*" >&2; }

# Host tools. apt-get update only when something is missing or the kernel
# packages cannot be resolved.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v depmod >/dev/null || need+=(kmod)
command -v xz >/dev/null || need+=(xz-utils)
command -v make >/dev/null || need+=(make)
command -v strip >/dev/null || need+=(binutils)
command -v gcc-12 >/dev/null || need+=(gcc-12)
dpkg -s libc6-dev >/dev/null 2>&1 || need+=(libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
	step "apt-get install ${need[*]}"
	apt-get update -qq
	apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The guest kernel: the candidate of linux-image-amd64 and the ABI package it
# depends on; the siw sources and headers of exactly that version.
resolve() {
	V=$(apt-cache policy linux-image-amd64 | awk '/Candidate:/ {print $2}')
	ABI=$(apt-cache show "linux-image-amd64=$V" 2>/dev/null | awk -F'[ ,]' '/^Depends:/ {for (i=2;i<=NF;i++) if ($i ~ /^linux-image-[0-9]/) {print $i; exit}}')
	ABI=${ABI#linux-image-}
	ABI=${ABI%-amd64}
}
resolve
if [ -z "${V:-}" ] || [ "$V" = "(none)" ] || [ -z "$ABI" ] || ! apt-cache show "linux-source-6.1=$V" >/dev/null 2>&1; then
	step "apt-get update (kernel packages not resolvable)"
	apt-get update -qq
	resolve
fi
[ -n "$ABI" ] || { echo "e2e prepare: cannot resolve the guest kernel from linux-image-amd64" >&2; exit 1; }
KREL="$ABI-amd64"

# Guest userland: these packages and their dependencies, less what a test
# guest never runs (perl, python, package management).
userpkgs="nvme-cli fio e2fsprogs iproute2 kmod libibverbs1 ibverbs-providers librdmacm1 ibverbs-utils rdmacm-utils util-linux"
mapfile -t deps < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
	--no-breaks --no-replaces --no-enhances $userpkgs | grep '^[a-z0-9]' |
	grep -Ev '^(perl|perl-base|perl-modules-.*|libperl.*|lib.*-perl|python3.*|libpython3.*|usrmerge|usr-is-merged|debconf|cdebconf|adduser|dpkg|install-info|passwd|mailcap|mime-support|media-types|libdebian-installer4|libtextwrap1|libnewt0.52|libslang2)$' | sort -u)
userver=$(apt-cache policy "${deps[@]}" | awk '/^[a-z0-9]/ {p=$1} /Candidate:/ {print p $2}' | sha256sum | cut -c1-16)

key="kernel=$V abi=$ABI user=$userver script=$(cat "$0" "$here/init" | sha256sum | cut -c1-16)"
if [ -f "$out/key" ] && [ "$(cat "$out/key")" = "$key" ] && [ -f "$out/initrd.cpio" ] && [ -f "$out/vmlinuz" ]; then
	step "cached ($key)"
	exit 0
fi
step "building ($key)"
rm -f "$out/key"

debs="$out/debs"
rm -rf "$debs" && mkdir -p "$debs"
cd "$debs"
step "apt-get download kernel $V ($KREL) and ${#deps[@]} userland packages"
download() {
	apt-get download -q "linux-image-$KREL=$V" "linux-headers-$KREL=$V" "linux-headers-$ABI-common=$V" \
		"linux-kbuild-6.1=$V" "linux-source-6.1=$V" "${deps[@]}" >download.log 2>&1
}
if ! download; then
	# Package lists older than the mirror: a version is gone. Once more
	# with fresh lists.
	step "apt-get download failed ($(grep -E '^(E|W):' download.log | grep -v unsandboxed | head -2 | tr '\n' ' ')); apt-get update and again"
	apt-get update -qq
	download || { cat download.log >&2; echo "e2e prepare: apt-get download failed" >&2; exit 1; }
fi
ls linux-image-*.deb linux-source-*.deb >/dev/null

# Kernel and modules.
k="$out/kernel"
rm -rf "$k" && mkdir -p "$k"
dpkg-deb -x "$debs"/linux-image-"$KREL"_*.deb "$k"
cp "$k/boot/vmlinuz-$KREL" "$out/vmlinuz.new"
depmod -b "$k" "$KREL"

# siw, out of tree, for exactly this kernel.
step "building siw for $KREL"
h="$out/headers"
rm -rf "$h" && mkdir -p "$h"
for p in "linux-headers-$KREL" "linux-headers-$ABI-common" linux-kbuild-6.1; do
	dpkg-deb -x "$debs"/"$p"_*.deb "$h"
done
sed -i "s#/usr/src/#$h/usr/src/#" "$h/usr/src/linux-headers-$KREL/Makefile"
src="$out/src"
rm -rf "$src" && mkdir -p "$src"
dpkg-deb --fsys-tarfile "$debs"/linux-source-6.1_*.deb | tar -x -C "$src" ./usr/src/linux-source-6.1.tar.xz
tar -xJf "$src/usr/src/linux-source-6.1.tar.xz" -C "$src" linux-source-6.1/drivers/infiniband/sw/siw linux-source-6.1/drivers/nvme
rm -f "$src/usr/src/linux-source-6.1.tar.xz"
make -s -C "$h/usr/src/linux-headers-$KREL" M="$src/linux-source-6.1/drivers/infiniband/sw/siw" \
	CONFIG_RDMA_SIW=m modules 2>&1 | grep -v 'Skipping BTF' >&2 || true
siwko="$src/linux-source-6.1/drivers/infiniband/sw/siw/siw.ko"
[ -f "$siwko" ] || { echo "e2e prepare: siw.ko was not built" >&2; exit 1; }

# The NVMe host and target modules again, from the same source, with
# in-band authentication (DH-HMAC-CHAP): Debian builds 6.1 without
# CONFIG_NVME_AUTH and CONFIG_NVME_TARGET_AUTH. The C code tests the
# options with #ifdef, the Makefiles with the make variables. What cannot
# be rebuilt: CONFIG_CRYPTO_DH_RFC7919_GROUPS is off in the built-in
# crypto/dh.c, so these modules authenticate with the null DH group only.
step "building nvme host and target modules with DH-HMAC-CHAP for $KREL"
nv="$src/linux-source-6.1/drivers/nvme"
make -s -j"$(nproc)" -C "$h/usr/src/linux-headers-$KREL" M="$nv" \
	CONFIG_NVME_COMMON=m CONFIG_NVME_AUTH=y CONFIG_NVME_TARGET_AUTH=y \
	CONFIG_BLK_DEV_NVME= CONFIG_NVME_FC= CONFIG_NVME_TARGET_FC= CONFIG_NVME_TARGET_FCLOOP= CONFIG_NVME_APPLE= \
	KCFLAGS="-DCONFIG_NVME_AUTH=1 -DCONFIG_NVME_TARGET_AUTH=1 -DCONFIG_NVME_COMMON_MODULE=1" \
	modules 2>&1 | grep -v 'Skipping BTF' >&2 || true
nvmekos="common/nvme-common host/nvme-core host/nvme-fabrics host/nvme-rdma host/nvme-tcp target/nvmet target/nvmet-rdma target/nvmet-tcp"
for m in $nvmekos; do
	[ -f "$nv/$m.ko" ] || { echo "e2e prepare: $m.ko was not built" >&2; exit 1; }
done

# The initramfs tree.
step "assembling the initramfs"
r="$out/root"
rm -rf "$r" && mkdir -p "$r"/{bin,sbin,etc,proc,sys,dev,tmp,run,mnt,share,root,var/tmp,usr/bin,usr/sbin,usr/lib64}
ln -s usr/lib "$r/lib"
ln -s usr/lib64 "$r/lib64"
mkdir -p "$r/usr/lib"
for d in "$debs"/*.deb; do
	case $(basename "$d") in linux-*) continue ;; esac
	dpkg-deb --fsys-tarfile "$d" | tar -x --keep-directory-symlink -C "$r" \
		--exclude='./usr/share/doc' --exclude='./usr/share/man' --exclude='./usr/share/locale' \
		--exclude='./usr/share/info' --exclude='./usr/share/lintian' --exclude='./usr/include'
done
# Debian's /bin and /sbin are real directories in the packages; merge them
# under /usr so that one PATH finds everything.
for d in bin sbin; do
	cp -a "$r/$d/." "$r/usr/$d/" && rm -rf "${r:?}/$d" && ln -s "usr/$d" "$r/$d"
done
# busybox for the rest (sh, mount, ip fallback, poweroff...), never over a
# Debian binary.
cp /bin/busybox "$r/usr/bin/busybox"
for a in $(/bin/busybox --list); do
	[ -e "$r/usr/bin/$a" ] || [ -e "$r/usr/sbin/$a" ] || ln -s busybox "$r/usr/bin/$a"
done
ldconfig -r "$r" 2>/dev/null || true
echo "root:x:0:0:root:/root:/bin/sh" >"$r/etc/passwd"
echo "root:x:0:" >"$r/etc/group"
touch "$r/etc/fstab"
printf '127.0.0.1 localhost\n' >"$r/etc/hosts"

# Modules: what the tests load, with their dependencies.
mods="e1000 virtio_pci virtio_net 9pnet_virtio 9p configfs crc32c_generic crc32c-intel crc32_generic libcrc32c
ib_core ib_uverbs rdma_ucm rdma_cm iw_cm ib_cm rdma_rxe nvme-core nvme-fabrics nvme-rdma nvme-tcp
nvmet nvmet-rdma nvmet-tcp nbd brd null_blk ext4"
mdir="$k/lib/modules/$KREL"
declare -A want=()
add() {
	local m=$1 line f dep
	line=$(modprobe -d "$k" -S "$KREL" --show-depends "$m" 2>/dev/null) || { echo "e2e prepare: no module $m" >&2; exit 1; }
	while read -r kind f _; do
		[ "$kind" = insmod ] && want[$f]=1
	done <<<"$line"
}
for m in $mods; do add "$m"; done
rm -rf "$r/usr/lib/modules" && mkdir -p "$r/usr/lib/modules/$KREL/extra"
for f in "${!want[@]}"; do
	rel=${f#"$mdir"/}
	mkdir -p "$r/usr/lib/modules/$KREL/$(dirname "$rel")"
	cp "$f" "$r/usr/lib/modules/$KREL/$rel"
done
cp "$mdir"/modules.{order,builtin,builtin.modinfo} "$r/usr/lib/modules/$KREL/"
strip --strip-debug -o "$r/usr/lib/modules/$KREL/extra/siw.ko" "$siwko"
for m in $nvmekos; do
	mkdir -p "$r/usr/lib/modules/$KREL/kernel/drivers/nvme/$(dirname "$m")"
	strip --strip-debug -o "$r/usr/lib/modules/$KREL/kernel/drivers/nvme/$m.ko" "$nv/$m.ko"
done
depmod -b "$r" "$KREL"

cp "$here/init" "$r/init"
chmod 755 "$r/init"
(cd "$r" && find . -print0 | cpio --null -o -H newc --quiet) >"$out/initrd.cpio.new"
mv "$out/initrd.cpio.new" "$out/initrd.cpio"
mv "$out/vmlinuz.new" "$out/vmlinuz"
rm -rf "$src" "$h" "$k" "$debs"
echo "$key" >"$out/key"
step "done: $(du -h "$out/initrd.cpio" | cut -f1) initramfs, kernel $KREL"
