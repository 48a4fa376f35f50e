package resv

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/blk-project/blk/nvme"
)

// MaxRegistrants bounds the registrants of one namespace: above ESXi's 96
// hosts per cluster, and small enough that a registry entry stays about
// 10 KiB of JSON at the limit (docs/reservations.md §9 question 3). One
// more registration is refused with Internal Error (the specification has
// no status for it).
const MaxRegistrants = 128

// RecentLimit is how many command tokens a State remembers (§1.5): a
// keeper retries one command at a time per volume, so a handful would do;
// 16 covers retries that overlap a leader change.
const RecentLimit = 16

// Type is a reservation type (RTYPE); 0 is no reservation.
type Type uint8

// Reservation types.
const (
	None                    Type = 0
	WriteExclusive          Type = 1 // WE
	ExclusiveAccess         Type = 2 // EA
	WriteExclusiveRegsOnly  Type = 3 // WE-RO
	ExclusiveAccessRegsOnly Type = 4 // EA-RO
	WriteExclusiveAllRegs   Type = 5 // WE-AR
	ExclusiveAccessAllRegs  Type = 6 // EA-AR
	maxType                      = ExclusiveAccessAllRegs
)

var typeNames = [...]string{"-", "WE", "EA", "WE-RO", "EA-RO", "WE-AR", "EA-AR"}

// String returns the type's short name (WE, EA-RO, ...), "-" for none.
func (t Type) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// ParseType reads a short name or a number.
func ParseType(s string) (Type, bool) {
	for i, n := range typeNames {
		if n == s {
			return Type(i), true
		}
	}
	var v uint8
	if _, err := fmt.Sscanf(s, "%d", &v); err == nil {
		return Type(v), true
	}
	return 0, false
}

// Valid reports a reservation type 1–6.
func (t Type) Valid() bool { return t >= WriteExclusive && t <= maxType }

// AllRegistrants reports the two types every registrant holds (5 and 6).
func (t Type) AllRegistrants() bool {
	return t == WriteExclusiveAllRegs || t == ExclusiveAccessAllRegs
}

// RegistrantsOnly reports types 3 and 4.
func (t Type) RegistrantsOnly() bool {
	return t == WriteExclusiveRegsOnly || t == ExclusiveAccessRegsOnly
}

// HostID is a 128-bit host identifier (Connect's HOSTID); the zero ID is
// no host (§1.8). It encodes in JSON as 32 hex digits.
type HostID [16]byte

// IsZero reports the zero identifier.
func (h HostID) IsZero() bool { return h == HostID{} }

// String returns 32 hex digits.
func (h HostID) String() string { return hex.EncodeToString(h[:]) }

// MarshalText encodes 32 hex digits.
func (h HostID) MarshalText() ([]byte, error) {
	b := make([]byte, 32)
	hex.Encode(b, h[:])
	return b, nil
}

// UnmarshalText decodes 32 hex digits.
func (h *HostID) UnmarshalText(b []byte) error {
	if len(b) != 32 {
		return fmt.Errorf("resv: host ID %q: want 32 hex digits", b)
	}
	_, err := hex.Decode(h[:], b)
	return err
}

// Registrant is a host registered with a key.
type Registrant struct {
	Host HostID `json:"host"`
	Key  uint64 `json:"key"`
	// NQN is the host NQN at registration: shown to operators, never
	// compared.
	NQN string `json:"nqn,omitempty"`
}

// State is one namespace's reservation state.
type State struct {
	// Gen is PRGEN: +1 on every successful Register (register,
	// unregister, replace), Preempt, Clear, and a power loss that cleared
	// something.
	Gen  uint32 `json:"gen"`
	Type Type   `json:"type,omitempty"`
	// Holder is the holder of a type 1–4 reservation; zero for none and
	// for types 5 and 6, which every registrant holds.
	Holder HostID `json:"holder,omitzero"`
	// Regs are in registration order.
	Regs []Registrant `json:"registrants,omitempty"`
	// PTPL is the Persist Through Power Loss state (§1.10).
	PTPL bool `json:"ptpl,omitempty"`
	// Index is the registry index of the last change, set by meta: it
	// orders views (§1.4). Apply copies it unchanged.
	Index uint64 `json:"index,omitempty"`
	// Recent holds the last RecentLimit command tokens that succeeded and
	// their outcomes, oldest first (§1.5).
	Recent []Done `json:"recent,omitempty"`
}

// Done is a command token and the outcome it got.
type Done struct {
	Token uint64  `json:"token"`
	Out   Outcome `json:"outcome"`
}

// Op is what a Command does.
type Op uint8

// Ops.
const (
	Register  Op = 1 // Reservation Register: Action is RREGA
	Acquire   Op = 2 // Reservation Acquire: Action is RACQA
	Release   Op = 3 // Reservation Release: Action is RRELA
	SetPTPL   Op = 4 // Set Features 83h: CPTPL 10b clears PTPL, 11b sets it
	PowerLoss Op = 5 // the start of a new serving term (§1.10)
)

var opNames = [...]string{"", "register", "acquire", "release", "set-ptpl", "power-loss"}

// String returns the op's name.
func (o Op) String() string {
	if o != 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Command is one reservation command as the target decoded it.
type Command struct {
	Op     Op     `json:"op"`
	Action uint8  `json:"action,omitempty"` // RREGA / RACQA / RRELA (nvme.RREGA*, ...)
	IEKEY  bool   `json:"iekey,omitempty"`
	CPTPL  uint8  `json:"cptpl,omitempty"` // Register, SetPTPL (nvme.CPTPL*)
	Type   Type   `json:"type,omitempty"`  // Acquire, Release
	CRKEY  uint64 `json:"crkey,omitempty"`
	NRKEY  uint64 `json:"nrkey,omitempty"` // Register: the new key; Acquire: PRKEY
	Host   HostID `json:"host,omitzero"`
	NQN    string `json:"nqn,omitempty"`
	Token  uint64 `json:"token,omitempty"` // the keeper's retry token (§1.5); 0: none
}

// Errors of Command.Check.
var (
	// ErrMalformed is a command no host may send: an unknown op, an action
	// or RTYPE out of range, CPTPL 01b. The host gets Invalid Field.
	ErrMalformed = errors.New("resv: malformed reservation command")
	// ErrNoHost is a command from the zero host identifier: Command
	// Sequence Error (§1.8).
	ErrNoHost = errors.New("resv: reservation command from the zero host identifier")
	// ErrState is a State that breaks the invariants (Check).
	ErrState = errors.New("resv: inconsistent reservation state")
)

// Check reports whether c is well formed: op and action in range, RTYPE
// 1–6 where used, CPTPL not 01b, a non-zero host (except PowerLoss), an
// NQN of at most 223 bytes. Apply answers a command that fails it with
// StatusOf(err) and no change; the registry refuses to log one.
func (c Command) Check() error {
	if c.Op != PowerLoss && c.Host.IsZero() {
		return ErrNoHost
	}
	if len(c.NQN) > nvme.MaxNQNLen {
		return fmt.Errorf("%w: host NQN of %d bytes", ErrMalformed, len(c.NQN))
	}
	switch c.Op {
	case Register:
		if c.Action > nvme.RREGAReplace {
			return fmt.Errorf("%w: RREGA %d", ErrMalformed, c.Action)
		}
		if c.CPTPL == 1 || c.CPTPL > nvme.CPTPLSet {
			return fmt.Errorf("%w: CPTPL %d", ErrMalformed, c.CPTPL)
		}
	case Acquire:
		if c.Action > nvme.RACQAPreemptAndAbort {
			return fmt.Errorf("%w: RACQA %d", ErrMalformed, c.Action)
		}
		if !c.Type.Valid() {
			return fmt.Errorf("%w: RTYPE %d", ErrMalformed, c.Type)
		}
	case Release:
		if c.Action > nvme.RRELAClear {
			return fmt.Errorf("%w: RRELA %d", ErrMalformed, c.Action)
		}
		if c.Action == nvme.RRELARelease && !c.Type.Valid() {
			return fmt.Errorf("%w: RTYPE %d", ErrMalformed, c.Type)
		}
	case SetPTPL:
		if c.CPTPL != nvme.CPTPLClear && c.CPTPL != nvme.CPTPLSet {
			return fmt.Errorf("%w: PTPL change %d", ErrMalformed, c.CPTPL)
		}
	case PowerLoss:
	default:
		return fmt.Errorf("%w: op %d", ErrMalformed, c.Op)
	}
	return nil
}

// StatusOf returns the status a host gets for an error of Command.Check:
// Command Sequence Error for the zero host, Invalid Field otherwise (both
// with DNR), Success for nil.
func StatusOf(err error) nvme.Status {
	switch {
	case err == nil:
		return nvme.StatusSuccess
	case errors.Is(err, ErrNoHost):
		return nvme.StatusCommandSequenceError.WithDNR()
	default:
		return nvme.StatusInvalidField.WithDNR()
	}
}

// NoticeKind is a Reservation Notification log page type.
type NoticeKind uint8

// Notice kinds (the log page types of nvme.ResvNotif*).
const (
	RegistrationPreempted NoticeKind = NoticeKind(nvme.ResvNotifRegistrationPreempted)
	ReservationReleased   NoticeKind = NoticeKind(nvme.ResvNotifReservationReleased)
	ReservationPreempted  NoticeKind = NoticeKind(nvme.ResvNotifReservationPreempted)
)

var kindNames = [...]string{"", "registration-preempted", "reservation-released", "reservation-preempted"}

// String returns the kind's name.
func (k NoticeKind) String() string {
	if k != 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("NoticeKind(%d)", uint8(k))
}

// Notice is one notification a host's controllers get (§1.7).
type Notice struct {
	Host HostID     `json:"host"`
	Kind NoticeKind `json:"kind"`
}

// Outcome is what a command got: its status (with DNR on a refusal), the
// notices to post, and for preempt-and-abort the hosts whose earlier
// commands must end before it completes (§1.6).
type Outcome struct {
	Status  nvme.Status `json:"status"`
	Notices []Notice    `json:"notices,omitempty"`
	Abort   []HostID    `json:"abort,omitempty"`
}

func (o Outcome) clone() Outcome {
	o.Notices = cloneSlice(o.Notices)
	o.Abort = cloneSlice(o.Abort)
	return o
}

// Rights is what a host may do under a reservation (Access).
type Rights uint8

// Rights bits: the read group (Read, Compare) and the write group (Write,
// Write Zeroes, Dataset Management, Flush, the fused pair).
const (
	ReadOK  Rights = 1 << 0
	WriteOK Rights = 1 << 1
	// AllRights is what every host has when nothing is held.
	AllRights = ReadOK | WriteOK
)

func cloneSlice[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return append(make([]T, 0, len(s)), s...)
}

// Clone returns a deep copy of s (nil for nil).
func (s *State) Clone() *State {
	if s == nil {
		return nil
	}
	c := s.clone()
	return &c
}

func (s State) clone() State {
	s.Regs = cloneSlice(s.Regs)
	if s.Recent != nil {
		r := make([]Done, len(s.Recent))
		for i, d := range s.Recent {
			r[i] = Done{Token: d.Token, Out: d.Out.clone()}
		}
		s.Recent = r
	}
	return s
}

// IsEmpty reports a state that holds nothing worth keeping: no
// registrant, no reservation, Gen 0, PTPL 0 (meta keeps nil instead).
func (s *State) IsEmpty() bool {
	return s == nil || s.Gen == 0 && s.Type == None && len(s.Regs) == 0 && !s.PTPL && len(s.Recent) == 0
}

// find returns the index of h's registration, or -1.
func (s *State) find(h HostID) int {
	for i := range s.Regs {
		if s.Regs[i].Host == h {
			return i
		}
	}
	return -1
}

// Registered reports whether h is a registrant.
func (s *State) Registered(h HostID) bool { return s != nil && s.find(h) >= 0 }

// Holds reports whether h holds the reservation: the holder of a type
// 1–4, any registrant of type 5 or 6.
func (s *State) Holds(h HostID) bool {
	if s == nil || s.Type == None || h.IsZero() {
		return false
	}
	if s.Type.AllRegistrants() {
		return s.find(h) >= 0
	}
	return s.Holder == h
}

// Check reports whether s keeps the invariants: a known type; a holder
// that is registered for types 1–4 and none otherwise; at least one
// registrant for types 5–6; hosts non-zero and unique; at most
// MaxRegistrants; NQNs of at most 223 bytes; at most RecentLimit tokens,
// non-zero and unique, each with a successful outcome. A nil s is empty
// and valid.
func Check(s *State) error {
	if s == nil {
		return nil
	}
	if s.Type > maxType {
		return fmt.Errorf("%w: type %d", ErrState, s.Type)
	}
	if len(s.Regs) > MaxRegistrants {
		return fmt.Errorf("%w: %d registrants, limit %d", ErrState, len(s.Regs), MaxRegistrants)
	}
	for i, r := range s.Regs {
		if r.Host.IsZero() {
			return fmt.Errorf("%w: registrant %d has the zero host ID", ErrState, i)
		}
		if len(r.NQN) > nvme.MaxNQNLen {
			return fmt.Errorf("%w: registrant %s NQN of %d bytes", ErrState, r.Host, len(r.NQN))
		}
		for _, o := range s.Regs[:i] {
			if o.Host == r.Host {
				return fmt.Errorf("%w: host %s registered twice", ErrState, r.Host)
			}
		}
	}
	switch {
	case s.Type == None || s.Type.AllRegistrants():
		if !s.Holder.IsZero() {
			return fmt.Errorf("%w: holder %s with type %s", ErrState, s.Holder, s.Type)
		}
		if s.Type != None && len(s.Regs) == 0 {
			return fmt.Errorf("%w: type %s held with no registrant", ErrState, s.Type)
		}
	default:
		if s.Holder.IsZero() || s.find(s.Holder) < 0 {
			return fmt.Errorf("%w: holder %s of type %s not registered", ErrState, s.Holder, s.Type)
		}
	}
	if len(s.Recent) > RecentLimit {
		return fmt.Errorf("%w: %d tokens, limit %d", ErrState, len(s.Recent), RecentLimit)
	}
	for i, d := range s.Recent {
		if d.Token == 0 || !d.Out.Status.Success() {
			return fmt.Errorf("%w: token entry %d (token %d, status %#x)", ErrState, i, d.Token, uint16(d.Out.Status))
		}
		for _, o := range s.Recent[:i] {
			if o.Token == d.Token {
				return fmt.Errorf("%w: token %d twice", ErrState, d.Token)
			}
		}
	}
	return nil
}
