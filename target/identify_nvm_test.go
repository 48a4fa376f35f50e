package target_test

import (
	"bytes"
	"testing"

	"github.com/blk-project/blk/nvme"
)

// identifyCS is Identify CNS 0x06 for command set csi.
func identifyCS(csi uint8, nsid uint32) nvme.Command {
	c := adminCmd(nvme.AdminIdentify)
	(&nvme.IdentifyCommand{CNS: nvme.CNSCSController, CSI: csi, NSID: nsid}).Encode(&c)
	return c
}

// TestIdentifyControllerNVM: Identify CNS 0x06 with CSI 0 answers the NVM
// command set's controller limits on an I/O controller (the Linux host
// asks for it from VER 1.1 on, and takes max_write_zeroes_sectors from
// WZSL); any other command set, any other length, and a discovery
// controller are refused.
func TestIdentifyControllerNVM(t *testing.T) {
	h := newHarness(t)
	h.mustSubsystem(subA, 16)
	admin, _ := h.adminConnect("admin", hostA, subA, 5000)
	disc, _ := h.adminConnect("disc", hostA, nvme.DiscoveryNQN, 0)
	fill := func(n int) []byte { return bytes.Repeat([]byte{0xEE}, n) }
	for _, tc := range []struct {
		name string
		q    *tq
		cmd  nvme.Command
		len  int
		want nvme.Status
	}{
		{"nvm", admin, identifyCS(nvme.CSINVM, 0), 4096, nvme.StatusSuccess},
		{"nvm, nsid ignored", admin, identifyCS(nvme.CSINVM, 0xFFFFFFFF), 4096, nvme.StatusSuccess},
		{"zoned", admin, identifyCS(nvme.CSIZNS, 0), 4096, nvme.StatusInvalidField.WithDNR()},
		{"key value", admin, identifyCS(0x01, 0), 4096, nvme.StatusInvalidField.WithDNR()},
		{"short", admin, identifyCS(nvme.CSINVM, 0), 2048, nvme.StatusSGLInvalidDataLength.WithDNR()},
		{"discovery controller", disc, identifyCS(nvme.CSINVM, 0), 4096, nvme.StatusInvalidField.WithDNR()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := h.exec(tc.q, tc.cmd, fill(tc.len))
			if s := c.status(); s != tc.want {
				t.Fatalf("status %s, want %s", fmtStatus(s), fmtStatus(tc.want))
			}
			if tc.want != nvme.StatusSuccess {
				return
			}
			var id nvme.IdentifyControllerNVM
			if err := id.Unmarshal(c.data); err != nil {
				t.Fatal(err)
			}
			// WZSL 13: 2^13 × 4 KiB = 32 MiB, 65536 blocks of 512
			// bytes, the most one Write Zeroes can name.
			if want := (nvme.IdentifyControllerNVM{WZSL: 13}); id != want {
				t.Errorf("%+v, want %+v", id, want)
			}
			if i := bytes.IndexFunc(c.data[16:], func(r rune) bool { return r != 0 }); i >= 0 {
				t.Errorf("reserved byte %d not zero", 16+i)
			}
		})
	}
}

// TestWriteZeroesAtWZSL: a Write Zeroes as long as WZSL allows (32 MiB,
// 65536 blocks of 512 bytes, NLB 0xFFFF) is served by a store volume with DEAC,
// without, and with FUA, and zeroes exactly its range.
func TestWriteZeroesAtWZSL(t *testing.T) {
	const bs, wz = 512, 1 << 16              // block size, blocks of one WZSL-sized Write Zeroes
	f := newStoreFixture(t, bs, wz+2, 4<<20) // thin: five clusters are written
	h, admin, io := f.h, f.admin, f.io
	c := h.exec(admin, identifyCS(nvme.CSINVM, 0), make([]byte, 4096))
	mustOK(t, c, "identify CNS 0x06")
	var id nvme.IdentifyControllerNVM
	_ = id.Unmarshal(c.data)
	if got := (uint64(4096) << id.WZSL) / bs; got != wz {
		t.Fatalf("WZSL %d allows %d blocks of %d bytes, want %d", id.WZSL, got, bs, wz)
	}

	data := bytes.Repeat([]byte{0x5A}, bs)
	for _, flags := range []uint32{nvme.RWDEAC, 0, nvme.RWFUA} {
		for _, lba := range []uint64{0, 1, wz / 2, wz, wz + 1} {
			mustOK(t, h.exec(io, ioCmd(nvme.IOWrite, 1, lba, 1, 0), data), "write")
		}
		mustOK(t, h.exec(io, ioCmd(nvme.IOWriteZeroes, 1, 1, wz, flags), nil), "write zeroes")
		for lba, want := range map[uint64]byte{0: 0x5A, 1: 0, wz / 2: 0, wz: 0, wz + 1: 0x5A} {
			c := h.exec(io, ioCmd(nvme.IORead, 1, lba, 1, 0), make([]byte, bs))
			mustOK(t, c, "read")
			if !bytes.Equal(c.data, bytes.Repeat([]byte{want}, bs)) {
				t.Errorf("flags %#x: LBA %d reads %#x..., want %#x", flags, lba, c.data[0], want)
			}
		}
	}
}
