// Package e2e holds blk's end-to-end tests: blkd, blkctl and the initiator
// library against the Linux kernel's NVMe host and target, in QEMU VMs
// running a stock Debian kernel.
//
// The tests are behind the e2e build tag, so the plain test command stays
// free of VMs:
//
//	sudo go test -tags e2e -count=1 -v ./e2e/
//
// They need root on Debian (apt): the first run installs QEMU and the
// build tools through apt, downloads the guest kernel, its headers and
// sources and the guest userland with apt-get download, builds siw
// (Soft-iWARP, which Debian does not ship) out of tree for exactly that
// kernel and assembles an initramfs (guest/prepare.sh). All of it is
// cached in e2e/work/cache (BLK_E2E_WORK moves e2e/work) and rebuilt when
// the package versions or the scripts change. Without root or apt the
// tests skip and say why.
//
// Each VM boots with software emulation (TCG, one vCPU, no KVM), the
// initramfs's /init mounts a 9p share holding the scenario's script, its
// parameters and the static blkd/blkctl binaries, runs the script, copies
// dmesg to the share and powers off. Every VM has a hard timeout. A
// scenario's share — console log, dmesg, the JSON the guest's tools
// wrote, blkd's logs — is kept under e2e/work/runs/<test>; a failing
// test prints the tail of the console and of dmesg.
package e2e
