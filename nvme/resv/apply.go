package resv

import "github.com/blk-project/blk/nvme"

// Statuses of a refusal. Every one carries DNR: the same command against
// the same state gets the same answer.
var (
	stConflict = nvme.StatusReservationConflict.WithDNR()
	stInvalid  = nvme.StatusInvalidField.WithDNR()
	// stFull answers a registration past MaxRegistrants: the
	// specification has no status for it (§9 question 3).
	stFull = nvme.StatusInternalError.WithDNR()
)

// Apply executes c against s and returns the new state and the outcome.
// It never fails: a refusal is an Outcome.Status, with a state equal to s.
// s is not modified and the result shares nothing with it.
//
// A command whose Token is in s.Recent is a retry of one already applied:
// it gets the recorded outcome and changes nothing. A successful command
// with a token is recorded (the last RecentLimit); a refused one is not,
// since it changed nothing and computing it again is as good as replaying
// it.
func Apply(s State, c Command) (State, Outcome) {
	if c.Token != 0 {
		for _, d := range s.Recent {
			if d.Token == c.Token {
				return s.clone(), d.Out.clone()
			}
		}
	}
	if err := c.Check(); err != nil {
		return s.clone(), Outcome{Status: StatusOf(err)}
	}
	n := s.clone()
	var out Outcome
	switch c.Op {
	case Register:
		out = n.register(c)
	case Acquire:
		out = n.acquire(c)
	case Release:
		out = n.release(c)
	case SetPTPL:
		n.PTPL = c.CPTPL == nvme.CPTPLSet
	case PowerLoss:
		n.powerLoss()
	}
	if !out.Status.Success() {
		return s.clone(), out
	}
	if c.Token != 0 {
		n.remember(c.Token, out)
	}
	return n, out
}

// remember appends a token and its outcome, keeping the last RecentLimit.
func (s *State) remember(token uint64, out Outcome) {
	r := append(s.Recent, Done{Token: token, Out: out.clone()})
	if len(r) > RecentLimit {
		r = append([]Done(nil), r[len(r)-RecentLimit:]...)
	}
	s.Recent = r
}

// keyOK: the host is registered and CRKEY matches, or IEKEY is set where
// it counts (Register only: RESCAP.IEK13, §1.2).
func (s *State) keyOK(c Command, iekey bool) (int, bool) {
	i := s.find(c.Host)
	if i < 0 {
		return -1, false
	}
	return i, iekey || s.Regs[i].Key == c.CRKEY
}

// register executes Reservation Register (RREGA 0, 1, 2) and its CPTPL.
func (s *State) register(c Command) Outcome {
	var out Outcome
	switch c.Action {
	case nvme.RREGARegister:
		if i := s.find(c.Host); i >= 0 {
			if s.Regs[i].Key != c.NRKEY {
				return Outcome{Status: stConflict}
			}
		} else if !s.add(c) {
			return Outcome{Status: stFull}
		}
	case nvme.RREGAUnregister:
		i, ok := s.keyOK(c, c.IEKEY)
		if !ok {
			return Outcome{Status: stConflict}
		}
		out.Notices = s.unregister(i)
	case nvme.RREGAReplace:
		i := s.find(c.Host)
		switch {
		case i >= 0 && (c.IEKEY || s.Regs[i].Key == c.CRKEY):
			s.Regs[i].Key = c.NRKEY
		case i < 0 && c.IEKEY:
			if !s.add(c) {
				return Outcome{Status: stFull}
			}
		default:
			return Outcome{Status: stConflict}
		}
	}
	switch c.CPTPL {
	case nvme.CPTPLClear:
		s.PTPL = false
	case nvme.CPTPLSet:
		s.PTPL = true
	}
	s.Gen++
	return out
}

// add registers c.Host with NRKEY; false at MaxRegistrants.
func (s *State) add(c Command) bool {
	if len(s.Regs) >= MaxRegistrants {
		return false
	}
	s.Regs = append(s.Regs, Registrant{Host: c.Host, Key: c.NRKEY, NQN: c.NQN})
	return true
}

// unregister removes registrant i. A type 1–4 reservation it held is
// released (types 3–4 tell the other registrants); an all-registrants
// reservation stays while a registrant is left.
func (s *State) unregister(i int) []Notice {
	h := s.Regs[i].Host
	s.Regs = append(s.Regs[:i:i], s.Regs[i+1:]...)
	switch {
	case s.Type.AllRegistrants():
		if len(s.Regs) == 0 {
			s.Type = None
		}
	case s.Type != None && s.Holder == h:
		t := s.Type
		s.Type, s.Holder = None, HostID{}
		if t.RegistrantsOnly() {
			return s.tellOthers(h, ReservationReleased)
		}
	}
	return nil
}

// tellOthers returns a notice of kind k for every registrant but h.
func (s *State) tellOthers(h HostID, k NoticeKind) []Notice {
	var n []Notice
	for _, r := range s.Regs {
		if r.Host != h {
			n = append(n, Notice{Host: r.Host, Kind: k})
		}
	}
	return n
}

// acquire executes Reservation Acquire (RACQA 0, 1, 2). IEKEY is ignored:
// the key is always checked (RESCAP.IEK13, §1.2).
func (s *State) acquire(c Command) Outcome {
	if _, ok := s.keyOK(c, false); !ok {
		return Outcome{Status: stConflict}
	}
	if c.Action == nvme.RACQAAcquire {
		switch {
		case s.Type == None:
			s.hold(c.Type, c.Host)
		case s.Type != c.Type || !s.Holds(c.Host):
			return Outcome{Status: stConflict}
		}
		return Outcome{}
	}
	out := s.preempt(c)
	if out.Status.Success() {
		s.Gen++
	}
	return out
}

// hold makes h the holder of a reservation of type t (every registrant,
// for types 5–6).
func (s *State) hold(t Type, h HostID) {
	s.Type, s.Holder = t, h
	if t.AllRegistrants() {
		s.Holder = HostID{}
	}
}

// preempt executes Preempt and Preempt and Abort:
//
//   - nothing held: the registrants with PRKEY are removed (none:
//     Reservation Conflict);
//   - an all-registrants type held: PRKEY 0 makes the host the holder of
//     RTYPE and removes every other registrant; another PRKEY removes the
//     registrants with it (none: Reservation Conflict);
//   - a type 1–4 held and PRKEY is the holder's key: the registrants other
//     than the host with PRKEY are removed and the host holds RTYPE (the
//     holder preempting itself changes the type);
//   - otherwise PRKEY ≠ 0 removes the registrants with it (the reservation
//     stays; none: Reservation Conflict), PRKEY 0 is Invalid Field.
//
// Each removed host other than the sender gets Registration Preempted; a
// type change tells the remaining registrants but the sender Reservation
// Released. With abort, the removed hosts but the sender are Outcome.Abort.
func (s *State) preempt(c Command) Outcome {
	prkey := c.NRKEY
	abort := c.Action == nvme.RACQAPreemptAndAbort
	var out Outcome
	switch {
	case s.Type == None:
		if !s.removeByKey(c.Host, prkey, true, abort, &out) {
			return Outcome{Status: stConflict}
		}
	case s.Type.AllRegistrants():
		if prkey == 0 {
			s.removeOthers(c.Host, abort, &out)
			s.retype(c, &out)
			break
		}
		if !s.removeByKey(c.Host, prkey, true, abort, &out) {
			return Outcome{Status: stConflict}
		}
		if len(s.Regs) == 0 {
			s.Type = None
		}
	case s.holderKeyIs(prkey):
		s.removeByKey(c.Host, prkey, false, abort, &out)
		s.retype(c, &out)
	case prkey != 0:
		if !s.removeByKey(c.Host, prkey, true, abort, &out) {
			return Outcome{Status: stConflict}
		}
	default:
		return Outcome{Status: stInvalid}
	}
	return out
}

// holderKeyIs reports whether key is the type 1–4 holder's key (its
// registration is an invariant; a state breaking it matches no key).
func (s *State) holderKeyIs(key uint64) bool {
	i := s.find(s.Holder)
	return i >= 0 && s.Regs[i].Key == key
}

// retype makes the sender the holder of RTYPE; a changed type tells the
// other registrants Reservation Released.
func (s *State) retype(c Command, out *Outcome) {
	old := s.Type
	s.hold(c.Type, c.Host)
	if old != c.Type {
		out.Notices = append(out.Notices, s.tellOthers(c.Host, ReservationReleased)...)
	}
}

// removeByKey removes the registrants whose key is key (the sender too
// when self, as nvmet and SPDK do); false if none matched.
func (s *State) removeByKey(sender HostID, key uint64, self, abort bool, out *Outcome) bool {
	return s.removeIf(func(r Registrant) bool {
		return r.Key == key && (self || r.Host != sender)
	}, sender, abort, out)
}

// removeOthers removes every registrant but the sender.
func (s *State) removeOthers(sender HostID, abort bool, out *Outcome) {
	s.removeIf(func(r Registrant) bool { return r.Host != sender }, sender, abort, out)
}

// removeIf removes the registrants rm selects, in registration order; a
// removed host other than the sender gets Registration Preempted (and is
// to be drained, with abort). Reports whether any was removed.
func (s *State) removeIf(rm func(Registrant) bool, sender HostID, abort bool, out *Outcome) bool {
	kept := s.Regs[:0:0]
	removed := false
	for _, r := range s.Regs {
		if !rm(r) {
			kept = append(kept, r)
			continue
		}
		removed = true
		if r.Host == sender {
			continue
		}
		out.Notices = append(out.Notices, Notice{Host: r.Host, Kind: RegistrationPreempted})
		if abort {
			out.Abort = append(out.Abort, r.Host)
		}
	}
	if len(kept) == 0 {
		kept = nil
	}
	s.Regs = kept
	return removed
}

// release executes Reservation Release (RRELA 0) and Clear (1). IEKEY is
// ignored: the key is always checked.
func (s *State) release(c Command) Outcome {
	if _, ok := s.keyOK(c, false); !ok {
		return Outcome{Status: stConflict}
	}
	if c.Action == nvme.RRELAClear {
		out := Outcome{Notices: s.tellOthers(c.Host, ReservationPreempted)}
		s.Type, s.Holder, s.Regs = None, HostID{}, nil
		s.Gen++
		return out
	}
	if !s.Holds(c.Host) {
		return Outcome{} // not the holder, or nothing held: success, no change
	}
	if s.Type != c.Type {
		return Outcome{Status: stInvalid}
	}
	t := s.Type
	s.Type, s.Holder = None, HostID{}
	if t.RegistrantsOnly() || t.AllRegistrants() {
		return Outcome{Notices: s.tellOthers(c.Host, ReservationReleased)}
	}
	return Outcome{}
}

// powerLoss: with PTPL 0 the registrations and the reservation are lost
// (Gen + 1, no notices: no controller is left to tell); with PTPL 1, or
// nothing to lose, nothing changes.
func (s *State) powerLoss() {
	if s.PTPL || s.Type == None && len(s.Regs) == 0 {
		return
	}
	s.Type, s.Holder, s.Regs = None, HostID{}, nil
	s.Gen++
}

// ClearAll is the operator's break-glass (the registry's Op 30, `blkctl
// volume reservation clear`): every registration and the reservation are
// removed, Gen + 1, every registrant is told Reservation Preempted. PTPL
// and the tokens stay. With nothing registered and nothing held it
// changes nothing. s is not modified.
func ClearAll(s State) (State, Outcome) {
	n := s.clone()
	if n.Type == None && len(n.Regs) == 0 {
		return n, Outcome{}
	}
	out := Outcome{Notices: n.tellOthers(HostID{}, ReservationPreempted)}
	n.Type, n.Holder, n.Regs = None, HostID{}, nil
	n.Gen++
	return n, out
}
