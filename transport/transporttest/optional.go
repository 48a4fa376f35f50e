package transporttest

import (
	"github.com/blk-project/blk/transport"
)

// Optional features (transport/optional.go) are found by type assertion
// on the PD and QP a provider returned. A subtest that needs one asks for
// it here: a provider that has it gets the interfaces back; one that lacks
// it is checked for saying so the way an NDK adapter without the
// capability must (its AdapterInfo advertises none of it), and the subtest
// is skipped naming the missing interface. A provider that has half of a
// feature (the PD side without the QP side, or the reverse) fails.

// fastRegisterOf returns e's fast-register interfaces, or skips: when the
// provider lacks them (after checking that AdapterInfo.FRMRPageCount is
// 0), or when it has them but the adapter reports FRMRPageCount 0.
func (t *T) fastRegisterOf(e *endpoint) (transport.FastRegisterPD, transport.FastRegisterQP) {
	t.Helper()
	fpd, okPD := e.pd.(transport.FastRegisterPD)
	fqp, okQP := e.qp.(transport.FastRegisterQP)
	switch {
	case okPD != okQP:
		t.Fatalf("provider has half of fast registration: PD is a transport.FastRegisterPD: %v, QP is a transport.FastRegisterQP: %v (both or neither)", okPD, okQP)
	case !okPD:
		if e.info.FRMRPageCount != 0 {
			t.Fatalf("provider implements neither transport.FastRegisterPD nor transport.FastRegisterQP, but its AdapterInfo reports FRMRPageCount %d (must be 0: no fast registration)", e.info.FRMRPageCount)
		}
		t.Skip("provider has no fast registration: its PD is not a transport.FastRegisterPD and its QP not a transport.FastRegisterQP (FRMRPageCount 0, as it must be)")
	}
	t.skipUnless(e.info.FRMRPageCount > 0, "adapter reports FRMRPageCount 0: no fast registration")
	return fpd, fqp
}

// memoryWindowsOf returns e's memory-window interfaces, or skips when the
// provider lacks them (after checking that FlagMemoryWindowsSupported is
// clear). A provider that has them is returned them whatever the flag
// says: the caller checks the flag's half of the contract.
func (t *T) memoryWindowsOf(e *endpoint) (transport.MemoryWindowPD, transport.BindQP) {
	t.Helper()
	mpd, okPD := e.pd.(transport.MemoryWindowPD)
	bqp, okQP := e.qp.(transport.BindQP)
	switch {
	case okPD != okQP:
		t.Fatalf("provider has half of memory windows: PD is a transport.MemoryWindowPD: %v, QP is a transport.BindQP: %v (both or neither)", okPD, okQP)
	case !okPD:
		if e.info.Flags&transport.FlagMemoryWindowsSupported != 0 {
			t.Fatal("provider implements neither transport.MemoryWindowPD nor transport.BindQP, but its AdapterInfo sets FlagMemoryWindowsSupported")
		}
		t.Skip("provider has no memory windows: its PD is not a transport.MemoryWindowPD and its QP not a transport.BindQP (FlagMemoryWindowsSupported clear, as it must be)")
	}
	return mpd, bqp
}

// hasFastRegister and hasMemoryWindows say whether a feature is usable on
// e without skipping, for subtests (Q5) that exercise it only as a part.
// A provider that lacks the interfaces must advertise none of the
// feature; that is checked here too.
func (t *T) hasFastRegister(e *endpoint) bool {
	t.Helper()
	_, okPD := e.pd.(transport.FastRegisterPD)
	_, okQP := e.qp.(transport.FastRegisterQP)
	if okPD != okQP {
		t.Fatalf("provider has half of fast registration: PD is a transport.FastRegisterPD: %v, QP is a transport.FastRegisterQP: %v (both or neither)", okPD, okQP)
	}
	if !okPD && e.info.FRMRPageCount != 0 {
		t.Fatalf("provider implements neither transport.FastRegisterPD nor transport.FastRegisterQP, but its AdapterInfo reports FRMRPageCount %d (must be 0)", e.info.FRMRPageCount)
	}
	return okPD && e.info.FRMRPageCount > 0
}

func (t *T) hasMemoryWindows(e *endpoint) bool {
	t.Helper()
	_, okPD := e.pd.(transport.MemoryWindowPD)
	_, okQP := e.qp.(transport.BindQP)
	if okPD != okQP {
		t.Fatalf("provider has half of memory windows: PD is a transport.MemoryWindowPD: %v, QP is a transport.BindQP: %v (both or neither)", okPD, okQP)
	}
	if !okPD && e.info.Flags&transport.FlagMemoryWindowsSupported != 0 {
		t.Fatal("provider implements neither transport.MemoryWindowPD nor transport.BindQP, but its AdapterInfo sets FlagMemoryWindowsSupported")
	}
	return okPD && e.info.Flags&transport.FlagMemoryWindowsSupported != 0
}
