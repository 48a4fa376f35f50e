package nvme

import (
	"strings"
	"testing"
)

// Layout per nvme.h struct nvme_completion and wire digest §1.2.
func TestCompletionLayout(t *testing.T) {
	c := Completion{
		DW0: 0x01020304, DW1: 0x05060708, SQHead: 0x090A, SQID: 0x0B0C, CID: 0x0D0E,
		Status: StatusConnectInvalidHost.WithDNR(), Phase: true,
	}
	want := hexBytes(t, "04 03 02 01 | 08 07 06 05 | 0a 09 | 0c 0b | 0e 0d | 09 83")
	var b [CQESize]byte
	c.Marshal(&b)
	equalBytes(t, "CQE", b[:], want)
	var got Completion
	if err := got.Unmarshal(want); err != nil || got != c {
		t.Fatalf("round trip %v: %+v", err, got)
	}
	if err := got.Unmarshal(want[:15]); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
}

func TestCompletionResult64(t *testing.T) {
	var c Completion
	c.SetResult64(0x0000_0820_0F00_03FF)
	var b [CQESize]byte
	c.Marshal(&b)
	equalBytes(t, "DW0-DW1", b[:8], hexBytes(t, "ff 03 00 0f 20 08 00 00"))
	if c.Result64() != 0x0000_0820_0F00_03FF {
		t.Fatalf("Result64 = %#x", c.Result64())
	}
}

// Wire words from the digest's status table (§4, "wire word = with DNR"),
// which match the kernel's NVME_SC_* values shifted left by one.
func TestStatusWire(t *testing.T) {
	cases := []struct {
		s    Status
		wire uint16
	}{
		{StatusSuccess, 0x0000},
		{StatusInvalidOpcode.WithDNR(), 0x8002},
		{StatusInvalidField.WithDNR(), 0x8004},
		{StatusCIDConflict.WithDNR(), 0x8006},
		{StatusDataTransferError.WithDNR(), 0x8008},
		{StatusInternalError.WithDNR(), 0x800C},
		{StatusInternalError, 0x000C},
		{StatusInvalidNamespace.WithDNR(), 0x8016},
		{StatusCommandSequenceError.WithDNR(), 0x8018},
		{StatusSGLInvalidDataLength.WithDNR(), 0x801E},
		{StatusSGLInvalidType.WithDNR(), 0x8022},
		{StatusSGLInvalidOffset.WithDNR(), 0x802C},
		{StatusKeepAliveExpired.WithDNR(), 0x8032},
		{StatusKeepAliveInvalid.WithDNR(), 0x8034},
		{StatusLBAOutOfRange.WithDNR(), 0x8100},
		{StatusCapacityExceeded.WithDNR(), 0x8102},
		{StatusNamespaceNotReady, 0x0104},
		{StatusReservationConflict.WithDNR(), 0x8106},
		{StatusAERLimitExceeded.WithDNR(), 0x820A},
		{StatusWriteToReadOnly.WithDNR(), 0x8304},
		{StatusConnectIncompatibleFormat.WithDNR(), 0x8300},
		{StatusConnectControllerBusy.WithDNR(), 0x8302},
		{StatusConnectInvalidParameters.WithDNR(), 0x8304},
		{StatusConnectRestartDiscovery.WithDNR(), 0x8306},
		{StatusConnectInvalidHost.WithDNR(), 0x8308},
		{StatusAuthenticationRequired.WithDNR(), 0x8322},
		{StatusWriteFault.WithDNR(), 0x8500},
		{StatusUnrecoveredReadError.WithDNR(), 0x8502},
		{StatusCompareFailure.WithDNR(), 0x850A},
		{StatusInternalPathError, 0x0600},
		{StatusInvalidField.WithMore(), 0x4004},
		{StatusInvalidField.WithCRD(1), 0x1004},
	}
	for _, tc := range cases {
		if got := tc.s.Wire(false); got != tc.wire {
			t.Errorf("%v: wire %#04x, want %#04x", tc.s, got, tc.wire)
		}
		if got := tc.s.Wire(true); got != tc.wire|1 {
			t.Errorf("%v: wire with phase %#04x", tc.s, got)
		}
		s, p := StatusFromWire(tc.wire | 1)
		if s != tc.s || !p {
			t.Errorf("StatusFromWire(%#04x) = %v, %v", tc.wire|1, s, p)
		}
	}
}

func TestStatusSplit(t *testing.T) {
	s := MakeStatus(SCTCommandSpecific, 0x82).WithDNR().WithMore().WithCRD(2)
	if s.SCT() != 1 || s.SC() != 0x82 || !s.DNR() || !s.More() || s.CRD() != 2 {
		t.Fatalf("split: %v sct %d sc %#x", s, s.SCT(), s.SC())
	}
	if s.Code() != StatusConnectInvalidParameters || s.Success() {
		t.Fatalf("Code = %#x", uint16(s.Code()))
	}
	if s.WithCRD(0).CRD() != 0 {
		t.Fatal("WithCRD(0)")
	}
	if !StatusSuccess.Success() || !StatusSuccess.WithMore().Success() {
		t.Fatal("success")
	}
	if MakeStatus(SCTMedia, 0x85) != StatusCompareFailure || MakeStatus(SCTGeneric, 0x80) != StatusLBAOutOfRange {
		t.Fatal("MakeStatus")
	}
}

func TestStatusString(t *testing.T) {
	cases := map[Status]string{
		StatusSuccess:                            "Successful Completion",
		StatusInvalidOpcode.WithDNR():            "Invalid Command Opcode +DNR",
		StatusNamespaceNotReady:                  "Namespace Not Ready",
		StatusConnectInvalidHost.WithDNR():       "Connect Invalid Host +DNR",
		StatusInvalidField.WithMore().WithDNR():  "Invalid Field in Command +M +DNR",
		MakeStatus(SCTVendor, 0x12):              "SCT 7 SC 0x12",
		StatusCompareFailure:                     "Compare Failure",
		StatusInvalidField.WithCRD(3):            "Invalid Field in Command +CRD3",
		StatusAuthenticationRequired:             "Authentication Required",
		StatusLBAOutOfRange:                      "LBA Out of Range",
		StatusCIDConflict:                        "Command ID Conflict",
		StatusDataTransferError:                  "Data Transfer Error",
		StatusInternalError:                      "Internal Error",
		StatusConnectInvalidParameters.WithDNR(): "Connect Invalid Parameters / Attempted Write to Read Only Range +DNR",
	}
	for s, want := range cases {
		if got := s.String(); got != want {
			t.Errorf("%#x: %q, want %q", uint16(s), got, want)
		}
	}
	for s, name := range statusNames {
		if name == "" || strings.HasPrefix(s.String(), "SCT ") {
			t.Errorf("status %#x has no name", uint16(s))
		}
	}
}
