package resv

import (
	"encoding/binary"

	"github.com/blk-project/blk/nvme"
)

// Access returns what h may do now under s (the NVM command set's command
// behaviour in the presence of a reservation): with nothing held,
// everything; the holder (any registrant, for types 5–6), everything;
// otherwise WE refuses the write group, EA both groups, WE-RO and WE-AR the
// write group to non-registrants, EA-RO and EA-AR both groups to
// non-registrants. A nil s holds nothing. The zero host is a
// non-registrant.
func Access(s *State, h HostID) Rights {
	if s == nil || s.Type == None || s.Holds(h) {
		return AllRights
	}
	registered := !h.IsZero() && s.find(h) >= 0
	switch s.Type {
	case WriteExclusive:
		return ReadOK
	case ExclusiveAccess:
		return 0
	case WriteExclusiveRegsOnly, WriteExclusiveAllRegs:
		if registered {
			return AllRights
		}
		return ReadOK
	case ExclusiveAccessRegsOnly, ExclusiveAccessAllRegs:
		if registered {
			return AllRights
		}
		return 0
	}
	return 0 // unreachable for a state that passes Check
}

// ReportSize returns the length of the full extended Reservation Status
// data structure of s: the header and one entry per registrant.
func (s *State) ReportSize() int {
	n := 0
	if s != nil {
		n = len(s.Regs)
	}
	return nvme.ResvStatusHeaderSize + n*nvme.ResvStatusEntrySize
}

// Report writes the Reservation Status data structure into dst, truncated
// to len(dst) (the rest of dst is zeroed). eds false is Host Identifier
// Inconsistent Format with DNR: the 64-bit structure cannot carry 128-bit
// host identifiers (§1.8). REGCTL always counts every registrant; each
// entry has CNTLID FFFFh (a registration is a host's), RCSTS bit 0 for a
// holder. A nil s reports nothing held. No allocation.
func (s *State) Report(eds bool, dst []byte) nvme.Status {
	if !eds {
		return nvme.StatusHostIDInconsistent.WithDNR()
	}
	clear(dst)
	var hdr [nvme.ResvStatusHeaderSize]byte
	var st State
	if s != nil {
		st = *s
	}
	le := binary.LittleEndian
	le.PutUint32(hdr[0:], st.Gen)
	hdr[4] = uint8(st.Type)
	le.PutUint16(hdr[5:], uint16(len(st.Regs)))
	if st.PTPL {
		hdr[9] = 1
	}
	off := copy(dst, hdr[:])
	for _, r := range st.Regs {
		if off >= len(dst) {
			break
		}
		var e [nvme.ResvStatusEntrySize]byte
		le.PutUint16(e[0:], nvme.ResvCNTLIDNone)
		if st.Holds(r.Host) {
			e[2] = 1
		}
		le.PutUint64(e[8:], r.Key)
		copy(e[16:32], r.Host[:])
		off += copy(dst[off:], e[:])
	}
	return nvme.StatusSuccess
}
