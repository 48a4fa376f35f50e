package target_test

import (
	"bytes"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// TestIdentifyMatchesBehaviour (docs/reservations.md §5): what Identify
// claims is what the target does. For every bit Identify Controller sets
// in ONCS and FUSES, the commands it claims are sent, well formed, and
// must not be refused with Invalid Opcode or Invalid Field; every
// feature the controller serves (featureServed, so a feature added
// later is covered without touching this test) must answer Get
// Features; a namespace whose RESCAP is 0 answers the reservation
// opcodes with Invalid Opcode, one whose RESCAP is set serves them. A
// claim this test does not know how to exercise fails it: teach it the
// new bit.
func TestIdentifyMatchesBehaviour(t *testing.T) {
	h := newHarness(t)
	s, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subA, AllowAnyHost: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, nc := range []target.NamespaceConfig{{NSID: 1, Reservations: target.LocalReservations()}, {NSID: 2}} {
		m, _ := target.NewMemBackend(4096, 64)
		nc.Backend = m
		if err := s.AddNamespace(nc); err != nil {
			t.Fatal(err)
		}
	}
	admin, io := h.connectHost("a", hostA, subA, hostIDA)
	c := h.exec(admin, identifyCmd(nvme.CNSController, 0), make([]byte, nvme.IdentifySize))
	mustOK(t, c, "identify controller")
	var id nvme.IdentifyController
	if err := id.Unmarshal(c.data); err != nil {
		t.Fatal(err)
	}
	refused := func(st nvme.Status) bool {
		st = st &^ (nvme.StatusDNR | nvme.StatusMore)
		return st == nvme.StatusInvalidOpcode || st == nvme.StatusInvalidField
	}
	block := bytes.Repeat([]byte{0x5a}, 4096)

	// ONCS: each bit, the commands it claims (NSID 1, which serves
	// everything the controller claims).
	claims := map[uint16][]func() (string, *call){
		nvme.ONCSCompare: {func() (string, *call) {
			return "Compare", h.exec(io, ioCmd(nvme.IOCompare, 1, 0, 1, 0), make([]byte, 4096))
		}},
		nvme.ONCSDSM: {func() (string, *call) {
			cmd := nvme.Command{Opcode: uint8(nvme.IODatasetManagement), Flags: nvme.FlagSGLMetaBuf, NSID: 1, CDW11: nvme.DSMAD}
			data := make([]byte, 4096)
			(&nvme.DSMRange{SLBA: 1, NLB: 1}).Marshal((*[16]byte)(data))
			return "Dataset Management", h.exec(io, cmd, data)
		}},
		nvme.ONCSWriteZeroes: {func() (string, *call) {
			return "Write Zeroes", h.exec(io, ioCmd(nvme.IOWriteZeroes, 1, 2, 1, 0), nil)
		}},
		nvme.ONCSReservations: {
			func() (string, *call) {
				cmd, data := resvCmd(nvme.IOReservationRegister, nvme.RREGARegister, 0, 0, 0xa1)
				return "Reservation Register", h.exec(io, cmd, data)
			},
			func() (string, *call) {
				cmd, data := resvCmd(nvme.IOReservationAcquire, nvme.RACQAAcquire, 1, 0xa1, 0)
				return "Reservation Acquire", h.exec(io, cmd, data)
			},
			func() (string, *call) {
				cmd := nvme.Command{Opcode: uint8(nvme.IOReservationReport), Flags: nvme.FlagSGLMetaBuf, NSID: 1,
					CDW10: 4096/4 - 1, CDW11: nvme.ResvReportEDS}
				return "Reservation Report", h.exec(io, cmd, make([]byte, 4096))
			},
			func() (string, *call) {
				cmd, data := resvCmd(nvme.IOReservationRelease, nvme.RRELARelease, 1, 0xa1, 0)
				return "Reservation Release", h.exec(io, cmd, data[:8])
			},
		},
	}
	for b := range 16 {
		bit := uint16(1) << b
		if id.ONCS&bit == 0 {
			continue
		}
		fns, ok := claims[bit]
		if !ok {
			t.Errorf("ONCS bit %d is claimed and this test cannot exercise it: add it to claims", b)
			continue
		}
		for _, fn := range fns {
			what, c := fn()
			if refused(c.status()) {
				t.Errorf("ONCS bit %d claims %s, which is refused: %s", b, what, fmtStatus(c.status()))
			}
		}
	}

	// FUSES: bit 0, Compare and Write. The pair is sent back to back, as
	// a host does.
	for b := range 16 {
		bit := uint16(1) << b
		if id.FUSES&bit == 0 {
			continue
		}
		if bit != 1 {
			t.Errorf("FUSES bit %d is claimed and this test cannot exercise it", b)
			continue
		}
		mustOK(t, h.exec(io, ioCmd(nvme.IOWrite, 1, 8, 1, 0), block), "write before the fused pair")
		first := ioCmd(nvme.IOCompare, 1, 8, 1, 0)
		first.Flags |= nvme.FlagFuseFirst
		second := ioCmd(nvme.IOWrite, 1, 8, 1, 0)
		second.Flags |= nvme.FlagFuseSecond
		c1 := h.submit(io, first, block)
		c2 := h.submit(io, second, make([]byte, 4096))
		c1.wait(t)
		c2.wait(t)
		for _, c := range []*call{c1, c2} {
			if refused(c.status()) {
				t.Errorf("FUSES claims Compare and Write, whose half is refused: %s", fmtStatus(c.status()))
			}
		}
	}
	if id.ONCS&nvme.ONCSReservations == 0 {
		t.Errorf("ONCS %#x: no Reservations bit with a keeper on NSID 1", id.ONCS)
	}

	// Features: each one the controller serves answers Get Features.
	// 81h (Host Identifier) is asked the only way it is served: EXHID
	// and 16 bytes.
	for _, fid := range target.FeaturesServed(admin.q) {
		cmd := getFeatCmd(fid, nvme.FeatureSelCurrent)
		cmd.NSID = 1
		var data []byte
		if fid == nvme.FeatureHostID {
			cmd.CDW11 = 1
			data = make([]byte, 16)
		}
		if c := h.exec(admin, cmd, data); refused(c.status()) {
			t.Errorf("feature %#02x is served (featureServed) and Get Features refuses it: %s", fid, fmtStatus(c.status()))
		}
	}

	// RESCAP: set on NSID 1 (the opcodes were served above), clear on
	// NSID 2, whose reservation opcodes are Invalid Opcode.
	for nsid, want := range map[uint32]bool{1: true, 2: false} {
		c := h.exec(admin, identifyCmd(nvme.CNSNamespace, nsid), make([]byte, nvme.IdentifySize))
		mustOK(t, c, "identify namespace")
		var ns nvme.IdentifyNamespace
		if err := ns.Unmarshal(c.data); err != nil {
			t.Fatal(err)
		}
		if (ns.RESCAP != 0) != want {
			t.Errorf("NSID %d: RESCAP %#x", nsid, ns.RESCAP)
		}
	}
	for _, op := range []nvme.IOOpcode{nvme.IOReservationRegister, nvme.IOReservationAcquire,
		nvme.IOReservationRelease, nvme.IOReservationReport} {
		cmd, data := resvCmd(op, 0, 1, 0xa1, 0)
		cmd.NSID = 2
		if op == nvme.IOReservationReport {
			cmd.CDW10, cmd.CDW11, data = 4096/4-1, nvme.ResvReportEDS, make([]byte, 4096)
		}
		if st := h.exec(io, cmd, data).status(); st != nvme.StatusInvalidOpcode.WithDNR() {
			t.Errorf("%v to a namespace without a keeper: %s, want Invalid Opcode", op, fmtStatus(st))
		}
	}
}
