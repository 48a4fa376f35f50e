# Shell functions for the e2e guest scripts (sourced; busybox sh or dash).
# The test writes /share/env.sh with the scenario's parameters.
. /share/env.sh

log() { echo "blk-e2e[$(hostname) $(cut -d' ' -f1 /proc/uptime)s]: $*"; }
# fail: say why, tell the other guests (a /share/failed-NAME mark ends
# their waits at once), exit.
fail() {
	log "FAIL: $*"
	echo "$*" >"/share/failed-$(hostname)"
	exit 1
}

# RDMA devices pin the memory they register: no cap on locked memory
# (the default 8 MiB is less than one engine core's receive buffers).
ulimit -l unlimited

# net_user: eth0 on QEMU's user-mode network; the host's loopback is 10.0.2.2.
net_user() {
	ip link set eth0 up
	ip addr add 10.0.2.15/24 dev eth0
	ip route add default via 10.0.2.2
}

# net_link: eth1, the link to another guest (BLK_LINK_IP/24), MTU 9000:
# rxe's RDMA MTU follows it (4096 rather than 1024).
net_link() {
	[ -n "$BLK_LINK_IP" ] || fail "this guest has no link (blk.linkip)"
	ip link set eth1 mtu 9000 up
	ip addr add "$BLK_LINK_IP/24" dev eth1
}

# rxe_up NETDEV: Soft-RoCE on NETDEV as rxe0.
rxe_up() {
	modprobe crc32_generic
	modprobe crc32c_generic
	modprobe rdma_rxe
	modprobe rdma_ucm
	modprobe ib_uverbs
	rdma link add rxe0 type rxe netdev "$1" || fail "rdma link add rxe0 on $1"
	log "$(rdma link show | tr '\n' ' ')"
}

# siw_up [NETDEV]: Soft-iWARP on NETDEV (eth0) as siw0 (built out of tree for this kernel).
siw_up() {
	modprobe crc32c_generic
	modprobe libcrc32c
	modprobe siw
	modprobe rdma_ucm
	rdma link add siw0 type siw netdev "${1:-eth0}" || fail "rdma link add siw0 on ${1:-eth0}"
	log "$(rdma link show | tr '\n' ' ')"
}

# rdma_up KIND NETDEV: the RDMA device of KIND (rxe, siw, or none for the
# soft provider, which needs none) on NETDEV.
rdma_up() {
	case $1 in
	rxe) rxe_up "$2" ;;
	siw) siw_up "$2" ;;
	none) ;;
	*) fail "unknown RDMA device kind $1" ;;
	esac
}

# nvmet_serve TRADDR NQN [HOSTNQN]: the Linux NVMe/RDMA target serving a
# 64 MiB RAM disk (/dev/ram0) as namespace 1 of NQN on TRADDR:4420, to
# HOSTNQN only, or to any host.
nvmet_serve() {
	modprobe nvmet
	modprobe nvmet-rdma
	modprobe brd rd_nr=1 rd_size=65536
	wait_dev /dev/ram0 10
	(
		cd /sys/kernel/config/nvmet
		mkdir "subsystems/$2"
		if [ -n "${3:-}" ]; then
			mkdir "hosts/$3"
			# DH-HMAC-CHAP (nvmet rebuilt with CONFIG_NVME_TARGET_AUTH):
			# the host's secret, and the controller's for a host that asks.
			if [ -n "${AUTHSECRET:-}" ]; then
				echo "$AUTHSECRET" >"hosts/$3/dhchap_key"
				echo "$AUTHCTRLSECRET" >"hosts/$3/dhchap_ctrl_key"
				log "host $3 must authenticate: $(cat "hosts/$3/dhchap_hash") dhgroup $(cat "hosts/$3/dhchap_dhgroup")"
			fi
			echo 0 >"subsystems/$2/attr_allow_any_host"
			ln -s "/sys/kernel/config/nvmet/hosts/$3" "subsystems/$2/allowed_hosts/$3"
		else
			echo 1 >"subsystems/$2/attr_allow_any_host"
		fi
		mkdir "subsystems/$2/namespaces/1"
		echo /dev/ram0 >"subsystems/$2/namespaces/1/device_path"
		echo 1 >"subsystems/$2/namespaces/1/enable"
		mkdir ports/1
		echo rdma >ports/1/addr_trtype
		echo ipv4 >ports/1/addr_adrfam
		echo "$1" >ports/1/addr_traddr
		echo 4420 >ports/1/addr_trsvcid
		ln -s "/sys/kernel/config/nvmet/subsystems/$2" ports/1/subsystems/
	) || fail "configuring nvmet"
	log "nvmet-rdma serving $2 on $1:4420"
}

# nvmet_tcp_port TRADDR TRSVCID NQN: the subsystem nvmet_serve made is
# also served over NVMe/TCP (nvmet-tcp) on TRADDR:TRSVCID.
nvmet_tcp_port() {
	modprobe nvmet-tcp
	(
		cd /sys/kernel/config/nvmet
		mkdir ports/2
		echo tcp >ports/2/addr_trtype
		echo ipv4 >ports/2/addr_adrfam
		echo "$1" >ports/2/addr_traddr
		echo "$2" >ports/2/addr_trsvcid
		ln -s "/sys/kernel/config/nvmet/subsystems/$3" ports/2/subsystems/
	) || fail "configuring the nvmet-tcp port"
	log "nvmet-tcp serving $3 on $1:$2"
}

# wait_for TEST PATH SECONDS: wait until [ TEST PATH ] holds (-e a file the
# host or another guest creates, -b a block device node).
wait_for() {
	n=0
	while [ ! "$1" "$2" ]; do
		for f in /share/failed-*; do
			[ -e "$f" ] && [ "$f" != "/share/failed-$(hostname)" ] && fail "gave up waiting for $2: ${f#/share/failed-} failed: $(cat "$f")"
		done
		n=$((n + 1))
		[ $n -le $(($3 * 10)) ] || fail "timed out after $3 s waiting for $2"
		sleep 0.1
	done
}
wait_file() { wait_for -e "$1" "$2"; }
wait_dev() { wait_for -b "$1" "$2"; }

# mark NAME: tell the host that this guest reached NAME.
mark() {
	: >"/share/$1"
	log "mark $1"
}

# no_io_errors: the kernel logged no block I/O error.
no_io_errors() {
	if dmesg | grep -Ei 'I/O error|blk_update_request|Buffer I/O error'; then
		fail "the kernel logged I/O errors"
	fi
}

# ride_restart DEV CTRL: blkd is killed and restarted under the connected
# host. A pattern is written to DEV (flushed), then read again and again
# while the test kills blkd (after mark ready-kill) until it says
# restarted; every read must equal the pattern, however long it waits.
# Then controller CTRL must be live again, reconnected by the host
# itself, and the pattern still read back.
ride_restart() {
	rdev=$1 rctrl=$2
	log "kill -9: flushed pattern, then reads through the outage"
	dd if=/dev/urandom of=/tmp/pat bs=1M count=8 2>/dev/null
	dd if=/tmp/pat of="$rdev" bs=1M seek=100 oflag=direct conv=fsync 2>/dev/null || fail "writing the pattern"
	(
		n=0
		while [ ! -e /share/restarted ]; do
			dd if="$rdev" of=/tmp/during bs=1M skip=100 count=8 iflag=direct 2>/dev/null || exit 1
			cmp -s /tmp/pat /tmp/during || exit 2
			n=$((n + 1))
		done
		dd if="$rdev" of=/tmp/during bs=1M skip=100 count=8 iflag=direct 2>/dev/null || exit 1
		cmp -s /tmp/pat /tmp/during || exit 2
		echo $n >/tmp/reads
	) &
	reader=$!
	sleep 1
	mark ready-kill
	wait_file /share/restarted 120
	wait $reader || fail "a read during the outage failed or differed (status $?)"
	log "$(cat /tmp/reads) pattern reads before the restart was seen, all equal"
	n=0
	until [ "$(cat /sys/class/nvme/$rctrl/state)" = live ]; do
		n=$((n + 1)); [ $n -le 600 ] || fail "controller not live again"; sleep 0.1
	done
	dmesg | grep -E "$rctrl: (Successfully reconnected|reconnect)" | tail -3
	dmesg | grep -q "$rctrl: Successfully reconnected" || fail "the host did not reconnect by itself"
	dd if="$rdev" of=/tmp/after bs=1M skip=100 count=8 iflag=direct 2>/dev/null || fail "read after restart"
	cmp /tmp/pat /tmp/after || fail "flushed pattern differs after the restart"
}

# Multipath (NQN from env.sh). ctrls: the controllers of subsystem $NQN
# (wait_ctrls below waits for them);
# ctrl_of PORT: the one connected to PORT; path_state CTRL: the ANA state
# of CTRL's path to namespace 1.
ctrls() {
	for c in /sys/class/nvme/nvme*; do
		[ -e "$c/subsysnqn" ] && grep -qx "$NQN" "$c/subsysnqn" && basename "$c"
	done
	true
}
# wait_ctrls N WORD: wait up to 30 s for N (WORD, for the message)
# controllers of $NQN.
wait_ctrls() {
	local n=0
	until [ "$(ctrls | wc -l)" -eq "$1" ]; do
		n=$((n + 1))
		[ $n -le 300 ] || fail "not $2 controllers of $NQN after 30 s: $(ctrls | tr '\n' ' ')"
		sleep 0.1
	done
}
ctrl_of() {
	for c in $(ctrls); do
		case ",$(cat /sys/class/nvme/$c/address)," in *",trsvcid=$1,"*) echo "$c" ;; esac
	done
}
path_state() {
	for p in /sys/class/nvme/$1/nvme*c*n1; do
		cat "$p/ana_state" 2>/dev/null
	done
}
