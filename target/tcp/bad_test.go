package tcp_test

import (
	"encoding/binary"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target/tcp"
)

// badConfig is the port of the bad-input tests: I/O in-capsule data of
// 4 KiB (so that 8 KiB in a capsule is legal framing but too much for an
// I/O queue), MAXH2CDATA 4096, and no header digests.
var badConfig = tcp.Config{InCapsule: 4096, MaxH2CData: 4096, NoHeaderDigest: true}

type badCase struct {
	name string
	// at is where the connection is before send: "raw" (nothing sent),
	// "admin" (ICReq and admin Connect done) or "io" (an I/O queue of 2
	// entries connected).
	at string
	dg nvme.TCPDigests
	// send sends the bad input.
	send func(t *testing.T, h *rawHost)
	// Exactly one of: a TermReq with fes/fei (fei -1: not checked), a
	// close without TermReq, or a command status (the connection lives).
	fes    uint16
	fei    int64
	close  bool
	status nvme.Status
}

func capsuleWith(h *rawHost, cmd nvme.Command, sgl nvme.SGL, data []byte) []byte {
	h.cid++
	cmd.CID = h.cid
	cmd.Flags = 0x40
	cmd.DPTR = sgl
	return h.capsulePDU(cmd, data)
}

// r2tFor sends a write of n bytes with SGL 0x5A and reads its R2T.
func r2tFor(t *testing.T, h *rawHost, n int) nvme.TCPDataPDU {
	t.Helper()
	if err := h.write(capsuleWith(h, rw(nvme.IOWrite, 1, 0, uint32(n/testBlock)), nvme.TransportSGL(uint32(n)), nil)); err != nil {
		t.Fatal(err)
	}
	hdr, b, err := h.readPDU()
	if err != nil || hdr.Type != nvme.TCPR2T {
		t.Fatalf("want an R2T, got type %#x: %v", hdr.Type, err)
	}
	var d nvme.TCPDataPDU
	_ = d.Unmarshal(b)
	if d.Length != uint32(n) || d.Offset != 0 || d.CCCID != h.cid {
		t.Fatalf("R2T %+v for a write of %d", d, n)
	}
	return d
}

func badCases() []badCase {
	send := func(b func(h *rawHost) []byte) func(*testing.T, *rawHost) {
		return func(t *testing.T, h *rawHost) {
			if err := h.write(b(h)); err != nil {
				t.Fatal(err)
			}
		}
	}
	icreq := func(ic nvme.TCPICReqPDU) func(*rawHost) []byte {
		return func(*rawHost) []byte {
			var b [nvme.TCPICSize]byte
			ic.Marshal(&b)
			return b[:]
		}
	}
	read4k := rw(nvme.IORead, 1, 0, 1)
	write4k := rw(nvme.IOWrite, 1, 0, 1)
	return []badCase{
		// Connection initialisation.
		{name: "capsule-before-icreq", at: "raw", send: send(func(h *rawHost) []byte { return capsuleWith(h, read4k, nvme.TransportSGL(0), nil) }),
			fes: nvme.TCPFESPDUSequence, fei: 0},
		{name: "second-icreq", at: "admin", send: send(icreq(nvme.TCPICReqPDU{})), fes: nvme.TCPFESPDUSequence, fei: 0},
		{name: "pfv", at: "raw", send: send(icreq(nvme.TCPICReqPDU{PFV: 1})), fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffPFV},
		{name: "hpda", at: "raw", send: send(icreq(nvme.TCPICReqPDU{HPDA: 1})), fes: nvme.TCPFESUnsupportedParam, fei: nvme.TCPOffHPDA},
		{name: "refused-header-digest", at: "raw", send: send(icreq(nvme.TCPICReqPDU{DGST: nvme.TCPDigestHeader})), fes: nvme.TCPFESUnsupportedParam, fei: nvme.TCPOffDGST},
		{name: "icreq-plen", at: "raw", send: send(func(h *rawHost) []byte {
			b := icreq(nvme.TCPICReqPDU{})(h)
			binary.LittleEndian.PutUint32(b[4:], 132)
			return append(b, 0, 0, 0, 0)
		}), fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffPLen},
		// Common header.
		{name: "unknown-type", at: "admin", send: send(func(h *rawHost) []byte {
			return []byte{0x08, 0, 24, 0, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		}), fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffType},
		{name: "c2h-type-from-host", at: "admin", send: send(func(h *rawHost) []byte {
			return []byte{nvme.TCPCapsuleResp, 0, 24, 0, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		}), fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffType},
		{name: "capsule-hlen", at: "admin", send: send(func(h *rawHost) []byte {
			b := capsuleWith(h, read4k, nvme.TransportSGL(0), nil)
			b[2] = 64
			return b
		}), fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffHLen},
		{name: "capsule-data-beyond-8k", at: "io", send: send(func(h *rawHost) []byte {
			return capsuleWith(h, rw(nvme.IOWrite, 1, 0, 3), nvme.InCapsuleSGL(0, 12288), make([]byte, 12288))
		}), fes: nvme.TCPFESDataLimitExceeded, fei: nvme.TCPOffPLen},
		{name: "data-digest-flag-missing", at: "io", dg: nvme.TCPDigests{Data: true}, send: send(func(h *rawHost) []byte {
			h.dd = 0
			b := capsuleWith(h, write4k, nvme.InCapsuleSGL(0, 4096), make([]byte, 4096))
			h.dd = 4
			return b
		}), fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffFlags},
		// Command statuses: the connection lives on.
		{name: "inline-on-read", at: "io", send: send(func(h *rawHost) []byte {
			return capsuleWith(h, read4k, nvme.InCapsuleSGL(0, 4096), make([]byte, 4096))
		}), status: nvme.StatusInvalidField | nvme.StatusDNR},
		{name: "inline-beyond-ioccsz", at: "io", send: send(func(h *rawHost) []byte {
			return capsuleWith(h, rw(nvme.IOWrite, 1, 0, 2), nvme.InCapsuleSGL(0, 8192), make([]byte, 8192))
		}), status: nvme.StatusSGLInvalidOffset | nvme.StatusDNR},
		{name: "inline-offset", at: "io", send: send(func(h *rawHost) []byte {
			return capsuleWith(h, rw(nvme.IOWrite, 1, 0, 1), nvme.InCapsuleSGL(16, 4096), make([]byte, 4096))
		}), status: nvme.StatusSGLInvalidOffset | nvme.StatusDNR},
		{name: "inline-length-not-data", at: "io", send: send(func(h *rawHost) []byte {
			return capsuleWith(h, rw(nvme.IOWrite, 1, 0, 1), nvme.InCapsuleSGL(0, 4096), make([]byte, 2048))
		}), status: nvme.StatusSGLInvalidDataLength | nvme.StatusDNR},
		{name: "keyed-sgl", at: "io", send: send(func(h *rawHost) []byte {
			return capsuleWith(h, read4k, nvme.KeyedSGL(0x1000, 4096, 7, true), nil)
		}), status: nvme.StatusSGLInvalidType | nvme.StatusDNR},
		{name: "transport-sgl-beyond-mdts", at: "io", send: send(func(h *rawHost) []byte {
			return capsuleWith(h, rw(nvme.IORead, 1, 0, 64), nvme.TransportSGL(256<<10), nil)
		}), status: nvme.StatusSGLInvalidDataLength | nvme.StatusDNR},
		{name: "data-with-transport-sgl", at: "io", send: send(func(h *rawHost) []byte {
			return capsuleWith(h, write4k, nvme.TransportSGL(4096), make([]byte, 4096))
		}), status: nvme.StatusSGLInvalidDataLength | nvme.StatusDNR},
		// Digests.
		{name: "capsule-data-digest", at: "io", dg: nvme.TCPDigests{Data: true}, send: send(func(h *rawHost) []byte {
			b := capsuleWith(h, write4k, nvme.InCapsuleSGL(0, 4096), make([]byte, 4096))
			b[len(b)-1] ^= 1
			return b
		}), close: true},
		// H2CData.
		{name: "h2c-without-r2t", at: "io", send: send(func(h *rawHost) []byte {
			return h.h2cPDU(1, 0, 0, make([]byte, 4096), true)
		}), fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffTTag},
		{name: "h2c-ttag", at: "io", send: func(t *testing.T, h *rawHost) {
			d := r2tFor(t, h, 4096)
			h.write(h.h2cPDU(d.CCCID, d.TTag+7, 0, make([]byte, 4096), true))
		}, fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffTTag},
		{name: "h2c-cccid", at: "io", send: func(t *testing.T, h *rawHost) {
			d := r2tFor(t, h, 4096)
			h.write(h.h2cPDU(d.CCCID+1, d.TTag, 0, make([]byte, 4096), true))
		}, fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffCCCID},
		{name: "h2c-datao", at: "io", send: func(t *testing.T, h *rawHost) {
			d := r2tFor(t, h, 8192)
			h.write(h.h2cPDU(d.CCCID, d.TTag, 4096, make([]byte, 4096), true))
		}, fes: nvme.TCPFESDataOutOfRange, fei: -1},
		{name: "h2c-beyond-r2t", at: "io", send: func(t *testing.T, h *rawHost) {
			d := r2tFor(t, h, 8192)
			h.write(h.h2cPDU(d.CCCID, d.TTag, 0, make([]byte, 4096), false))
			h.write(h.h2cPDU(d.CCCID, d.TTag, 4096, make([]byte, 4096), false)) // ends the transfer without LAST_PDU
		}, fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffFlags},
		{name: "h2c-past-length", at: "io", send: func(t *testing.T, h *rawHost) {
			d := r2tFor(t, h, 4096)
			h.write(h.h2cPDU(d.CCCID, d.TTag, 0, make([]byte, 2048), false))
			h.write(h.h2cPDU(d.CCCID, d.TTag, 2048, make([]byte, 4096), true))
		}, fes: nvme.TCPFESDataOutOfRange, fei: -1},
		{name: "h2c-over-maxh2cdata", at: "io", send: func(t *testing.T, h *rawHost) {
			d := r2tFor(t, h, 8192)
			h.write(h.h2cPDU(d.CCCID, d.TTag, 0, make([]byte, 8192), true))
		}, fes: nvme.TCPFESDataLimitExceeded, fei: nvme.TCPOffPLen},
		{name: "h2c-datal-not-plen", at: "io", send: func(t *testing.T, h *rawHost) {
			d := r2tFor(t, h, 4096)
			b := h.h2cPDU(d.CCCID, d.TTag, 0, make([]byte, 4096), true)
			binary.LittleEndian.PutUint32(b[nvme.TCPOffDataL:], 4000)
			h.write(b)
		}, fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffDataL},
		{name: "h2c-early-last", at: "io", send: func(t *testing.T, h *rawHost) {
			d := r2tFor(t, h, 8192)
			h.write(h.h2cPDU(d.CCCID, d.TTag, 0, make([]byte, 4096), true))
		}, fes: nvme.TCPFESInvalidHeaderField, fei: nvme.TCPOffFlags},
		{name: "h2c-data-digest", at: "io", dg: nvme.TCPDigests{Data: true}, send: func(t *testing.T, h *rawHost) {
			d := r2tFor(t, h, 4096)
			b := h.h2cPDU(d.CCCID, d.TTag, 0, make([]byte, 4096), true)
			b[len(b)-2] ^= 0x10
			h.write(b)
		}, close: true},
		// Flow control and termination by the host.
		{name: "queue-depth-exceeded", at: "io", send: func(t *testing.T, h *rawHost) {
			// The queue holds 2 commands; three writes wait for data.
			for i := 0; i < 3; i++ {
				h.write(capsuleWith(h, rw(nvme.IOWrite, 1, uint64(i), 1), nvme.TransportSGL(4096), nil))
			}
		}, fes: nvme.TCPFESPDUSequence, fei: 0},
		{name: "h2c-termreq", at: "io", send: send(func(h *rawHost) []byte {
			b := make([]byte, nvme.TCPTermReqHeaderSize+8)
			nvme.MarshalTermReq(b, nvme.TCPH2CTermReq, nvme.TCPFault{FES: nvme.TCPFESHeaderDigest}, b[:8])
			return b
		}), close: true},
	}
}

// TestBadInput: every malformed or forbidden input gets the right
// TermReq (FES, FEI) and a close, a close without TermReq (data digest
// errors, H2CTermReq: as nvmet), or the right status on a connection
// that lives on; and the target serves a new connection afterwards.
func TestBadInput(t *testing.T) {
	tt := newTestTarget(t, badConfig)
	for _, tc := range badCases() {
		t.Run(tc.name, func(t *testing.T) {
			var h *rawHost
			switch tc.at {
			case "raw":
				h = dialRaw(t, tt.addr)
			case "admin":
				h = dialRaw(t, tt.addr)
				h.mustIC(tc.dg)
				if rsp := h.connect(0, 31, 0, nvme.CNTLIDDynamic); rsp.Status != 0 {
					t.Fatalf("admin Connect: %v", rsp.Status)
				}
			case "io":
				_, cntlid := tt.adminUp(t, nvme.TCPDigests{})
				h = tt.ioUp(t, cntlid, 1, 1, 0, tc.dg)
			}
			before := tt.port.Stats()
			tc.send(t, h)
			switch {
			case tc.close:
				h.expectClose()
			case tc.status != 0:
				res, err := h.await(h.cid, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if res.rsp.Status != tc.status {
					t.Fatalf("status %v, want %v", res.rsp.Status, tc.status)
				}
				// The queue still works.
				w := pattern(4096, 9)
				if res := h.mustExchange(rw(nvme.IOWrite, 1, 5, 1), w, nil, nil); res.rsp.Status != 0 {
					t.Fatalf("write after the bad command: %v", res.rsp.Status)
				}
			default:
				et := h.expectTerm()
				if et.FES != tc.fes || tc.fei >= 0 && et.FEI != uint32(tc.fei) {
					t.Fatalf("TermReq FES %#x FEI %d, want FES %#x FEI %d", et.FES, et.FEI, tc.fes, tc.fei)
				}
				if len(et.Hdr) < nvme.TCPCommonHeaderSize {
					t.Fatalf("TermReq carries %d bytes of the offending header", len(et.Hdr))
				}
				if tt.port.Stats().Terminations == before.Terminations {
					t.Fatal("termination not counted")
				}
			}
			// A new connection is served.
			admin, _ := tt.adminUp(t, nvme.TCPDigests{})
			if res := admin.mustExchange(identify(1, 0), nil, nil, make([]byte, 4096)); res.rsp.Status != 0 {
				t.Fatalf("Identify on a new connection: %v", res.rsp.Status)
			}
		})
	}
	st := tt.port.Stats()
	if st.DataDigestErrors != 2 || st.HostTerminations != 1 {
		t.Fatalf("stats %+v", st)
	}
}
