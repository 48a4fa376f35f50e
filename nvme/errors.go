package nvme

import "errors"

// Sentinel errors. They are package variables so that returning one never
// allocates.
var (
	// ErrShortBuffer is returned by an Unmarshal given fewer bytes than the
	// structure's wire size.
	ErrShortBuffer = errors.New("nvme: buffer shorter than the wire structure")
	// ErrSGLLength is returned when a keyed SGL descriptor's length does
	// not fit its 24-bit field.
	ErrSGLLength = errors.New("nvme: keyed SGL length exceeds 24 bits")
	// ErrNotFabrics is returned when a fabrics decoder is given a command
	// whose opcode is not 0x7F or whose FCTYPE does not match.
	ErrNotFabrics = errors.New("nvme: not the expected fabrics command")
	// ErrNQN is returned by ValidateNQN for a malformed NQN.
	ErrNQN = errors.New("nvme: malformed NQN")
	// ErrNQNLength is returned for an NQN longer than MaxNQNLen bytes or
	// empty.
	ErrNQNLength = errors.New("nvme: NQN length outside 1..223 bytes")
	// ErrFieldNotTerminated is returned for a fixed-size string field with
	// no NUL terminator.
	ErrFieldNotTerminated = errors.New("nvme: string field not NUL-terminated")
	// ErrFieldTooLong is returned when a string does not fit its
	// fixed-size field with a terminating NUL.
	ErrFieldTooLong = errors.New("nvme: string too long for its field")
	// ErrNotASCII is returned by SetASCII for a byte outside printable
	// ASCII.
	ErrNotASCII = errors.New("nvme: string is not printable ASCII")
	// ErrNIDLength is returned for a namespace identification descriptor
	// whose length does not match its type or its buffer.
	ErrNIDLength = errors.New("nvme: bad namespace identification descriptor length")
	// ErrANALog is returned by ANALog.Unmarshal for a page whose
	// descriptors do not fit its length.
	ErrANALog = errors.New("nvme: ANA log descriptors overrun the page")
)
