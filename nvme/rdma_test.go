package nvme

import "testing"

// The 32-byte private data of the Linux nvme-rdma host's admin-queue CM
// request, as captured over siw (vm-notes.md): recfmt 0, qid 0, hrqsize
// 32, hsqsize 31, rest 0.
func TestRDMACMRequestCapture(t *testing.T) {
	capture := hexBytes(t, `00 00 00 00 20 00 1f 00
		00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00`)
	var r RDMACMRequest
	if err := r.Unmarshal(capture); err != nil {
		t.Fatal(err)
	}
	want := RDMACMRequest{RecFmt: RDMACMRecFmt10, QID: 0, HRQSize: 32, HSQSize: 31}
	if r != want {
		t.Fatalf("got %+v, want %+v", r, want)
	}
	var b [RDMACMRequestSize]byte
	r.Marshal(&b)
	equalBytes(t, "CM request", b[:], capture)
	if err := r.Unmarshal(capture[:31]); err != ErrShortBuffer {
		t.Fatalf("short: %v", err)
	}
}

func TestRDMACMRequestIOQueue(t *testing.T) {
	// An I/O queue request from a recent host carries the CNTLID at 8-9.
	r := RDMACMRequest{QID: 2, HRQSize: 128, HSQSize: 127, CNTLID: 0x0102}
	var b [RDMACMRequestSize]byte
	for i := range b {
		b[i] = 0xEE
	}
	r.Marshal(&b)
	want := hexBytes(t, `00 00 02 00 80 00 7f 00 02 01
		00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00`)
	equalBytes(t, "CM request", b[:], want)
	var back RDMACMRequest
	if err := back.Unmarshal(b[:]); err != nil || back != r {
		t.Fatalf("round trip %v %+v", err, back)
	}
}

func TestRDMACMAcceptReject(t *testing.T) {
	a := RDMACMAccept{CRQSize: 32}
	var ab [RDMACMAcceptSize]byte
	for i := range ab {
		ab[i] = 0xEE
	}
	a.Marshal(&ab)
	equalBytes(t, "accept", ab[:], hexBytes(t, `00 00 20 00
		00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00`))
	var aback RDMACMAccept
	if err := aback.Unmarshal(ab[:]); err != nil || aback != a {
		t.Fatalf("accept round trip %v %+v", err, aback)
	}
	if err := aback.Unmarshal(ab[:31]); err != ErrShortBuffer {
		t.Fatalf("short accept: %v", err)
	}

	// Status values from include/linux/nvme-rdma.h (nvme_rdma_cm_status).
	codes := []struct {
		s RDMACMRejectStatus
		v uint16
	}{
		{RDMACMInvalidLength, 1}, {RDMACMInvalidRecFmt, 2}, {RDMACMInvalidQID, 3},
		{RDMACMInvalidHSQSize, 4}, {RDMACMInvalidHRQSize, 5}, {RDMACMNoResources, 6},
		{RDMACMInvalidIRD, 7}, {RDMACMInvalidORD, 8}, {RDMACMInvalidCNTLID, 9},
	}
	for _, c := range codes {
		rj := RDMACMReject{Status: c.s}
		var b [RDMACMRejectSize]byte
		rj.Marshal(&b)
		equalBytes(t, c.s.String(), b[:], []byte{0, 0, byte(c.v), byte(c.v >> 8)})
		var back RDMACMReject
		if err := back.Unmarshal(b[:]); err != nil || back != rj {
			t.Fatalf("reject round trip %v %+v", err, back)
		}
	}
	var rj RDMACMReject
	if err := rj.Unmarshal([]byte{0, 0, 1}); err != ErrShortBuffer {
		t.Fatalf("short reject: %v", err)
	}
}
