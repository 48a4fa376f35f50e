package target

import (
	"fmt"

	"github.com/blk-project/blk/nvme"
)

// Asymmetric Namespace Access (NVMe 2.0 §8.1.1), for a subsystem that
// several targets export under one NQN: each target's controllers report
// the namespaces' state on that path (optimized where the volume is
// served, inaccessible elsewhere), and a multipath host sends I/O only
// to the optimized paths, moving when an ANA change notice says the
// states flipped.
//
// A subsystem has one ANA group, ID 1, holding all its namespaces (blk
// exports one volume per subsystem; nvmet, whose groups are per port,
// has up to 128). Its state is the subsystem's, set by SetANAState; an
// ANA subsystem reports it through:
//
//	Identify Controller  CMIC.ANA, OAES ANA change, ANATT, ANACAP,
//	                     ANAGRPMAX = NANAGRPID = 1, MNAN = NN (a Linux
//	                     host refuses ANA with MNAN 0: nvme_mpath_init_identify)
//	Identify Namespace   ANAGRPID 1
//	Get Log Page 0Ch     the ANA log: header and the group's descriptor
//	AEN                  Notice / ANA change / log 0Ch, masked until the
//	                     log is read without RAE, as the other notices
//	I/O commands         in a state that serves none, its status (SCT 3h,
//	                     no DNR) before the backend: one atomic load
//
// A subsystem without ANA answers as it always has: no bit, no field,
// log 0Ch Invalid Field, every I/O command served.

const (
	// anaGroupID is the one ANA group of a subsystem.
	anaGroupID = 1
	// anaTransitionTime is Identify Controller ANATT, in seconds: how long
	// the change state may last. blk never reports the change state
	// itself (SetANAState takes it, for completeness); nvmet says 10.
	anaTransitionTime = 10
	// anaCapabilities is Identify Controller ANACAP: every state may be
	// reported, and a namespace's group never changes.
	anaCapabilities = nvme.ANACAPOptimized | nvme.ANACAPNonOptimized | nvme.ANACAPInaccessible |
		nvme.ANACAPPersistentLoss | nvme.ANACAPChange | nvme.ANACAPGroupIDFixed
)

// initANA sets up a new subsystem's ANA state from its configuration.
func (s *Subsystem) initANA(c SubsystemConfig) {
	s.ana = c.ANA && !s.discovery
	if !s.ana {
		return
	}
	st := c.ANAState
	if st == 0 {
		st = nvme.ANAOptimized
	}
	s.anaState = st
	s.anaIO.Store(uint32(st.IOStatus()))
}

// ANA reports whether the subsystem reports Asymmetric Namespace Access.
func (s *Subsystem) ANA() bool { return s.ana }

// ANAState returns the state of the subsystem's ANA group (0 for a
// subsystem without ANA).
func (s *Subsystem) ANAState() nvme.ANAState {
	s.anaMu.Lock()
	defer s.anaMu.Unlock()
	return s.anaState
}

// SetANAState changes the state of the subsystem's ANA group. A change
// bumps the ANA change count, tells every controller that enabled ANA
// change notices (an AEN, masked until the host reads the log), and
// from then on each I/O command gets the state's status before it
// reaches the backend: optimized and non-optimized serve I/O;
// inaccessible, persistent loss and change answer Asymmetric Access
// Inaccessible, Persistent Loss and Transition, without DNR, so the host
// retries on another path. Admin commands are served in every state.
// Commands already past the check (at the backend, or about to be
// submitted) complete as they would have: SetANAState orders new
// commands, it does not drain old ones (EvictAndDrain does). Setting the
// current state again does nothing. A subsystem without ANA, or a value
// that is no ANA state, is ErrInvalid.
func (s *Subsystem) SetANAState(state nvme.ANAState) error {
	if !s.ana {
		return fmt.Errorf("target: subsystem %s: configured without ANA: %w", s.nqn, ErrInvalid)
	}
	if !state.Valid() {
		return fmt.Errorf("target: subsystem %s: ANA state %#x: %w", s.nqn, uint8(state), ErrInvalid)
	}
	s.anaMu.Lock()
	if s.anaState == state {
		s.anaMu.Unlock()
		return nil
	}
	s.anaState = state
	s.anaChg++
	// The log (read under anaMu) and the I/O path see the new state
	// before any controller is told.
	s.anaIO.Store(uint32(state.IOStatus()))
	s.anaMu.Unlock()
	for _, c := range s.controllers() {
		c.anaChanged()
	}
	return nil
}

// anaSnapshot returns the group's state and the change count.
func (s *Subsystem) anaSnapshot() (nvme.ANAState, uint64) {
	s.anaMu.Lock()
	defer s.anaMu.Unlock()
	return s.anaState, s.anaChg
}

// anaChanged sends an ANA change notice to a controller that enabled it
// and has read the ANA log since the last one.
func (c *ctrl) anaChanged() { c.notice(nvme.AENANAChange, nvme.AERNoticeANA, nvme.LogANA) }

// anaLog builds the ANA log page: the group, with every attached NSID
// in increasing order unless rgo (Return Groups Only). The group's
// change count is the subsystem's: it has one group. Requires c.mu.
func (c *ctrl) anaLog(rgo bool) []byte {
	state, chg := c.s.anaSnapshot()
	g := nvme.ANAGroupDesc{GroupID: anaGroupID, ChangeCount: chg, State: state}
	if !rgo {
		l := c.s.table().list
		g.NSIDs = make([]uint32, len(l))
		for i, ns := range l {
			g.NSIDs[i] = ns.nsid
		}
	}
	log := nvme.ANALog{ChangeCount: chg, Groups: []nvme.ANAGroupDesc{g}}
	page := c.scratch(log.Size())
	_, _ = log.Marshal(page)
	return page
}

// setIdentifyANA fills the ANA fields of Identify Controller for an ANA
// subsystem.
func (c *ctrl) setIdentifyANA(id *nvme.IdentifyController) {
	id.CMIC |= nvme.CMICANA
	id.ANATT = anaTransitionTime
	id.ANACAP = anaCapabilities
	id.ANAGRPMAX = anaGroupID
	id.NANAGRPID = anaGroupID
	// A Linux host sizes its ANA log buffer by MNAN and refuses ANA
	// (the whole controller) if it is 0 or above NN.
	id.MNAN = id.NN
}
