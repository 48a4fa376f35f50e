package nbd

// Wire constants of the NBD protocol (NetworkBlockDevice/nbd doc/proto.md).
// Every integer on the wire is big-endian.

const (
	// Handshake magics.
	nbdMagic      = 0x4e42444d41474943 // "NBDMAGIC"
	optMagic      = 0x49484156454F5054 // "IHAVEOPT"
	optReplyMagic = 0x3e889045565a9

	// Handshake flags (server) and client flags.
	flagFixedNewstyle   = 1 << 0
	flagNoZeroes        = 1 << 1
	clientFixedNewstyle = 1 << 0
	clientNoZeroes      = 1 << 1

	// Options.
	optExportName      = 1
	optAbort           = 2
	optList            = 3
	optStartTLS        = 5
	optInfo            = 6
	optGo              = 7
	optStructuredReply = 8

	// Option reply types.
	repAck          = 1
	repServer       = 2
	repInfo         = 3
	repFlagError    = 1 << 31
	repErrUnsup     = repFlagError | 1
	repErrPolicy    = repFlagError | 2
	repErrInvalid   = repFlagError | 3
	repErrUnknown   = repFlagError | 6
	repErrShutdown  = repFlagError | 7
	repErrBlockSize = repFlagError | 8
	repErrTooBig    = repFlagError | 9

	// NBD_REP_INFO types.
	infoExport      = 0
	infoName        = 1
	infoDescription = 2
	infoBlockSize   = 3

	// Transmission flags.
	tflagHasFlags        = 1 << 0
	tflagReadOnly        = 1 << 1
	tflagSendFlush       = 1 << 2
	tflagSendFUA         = 1 << 3
	tflagSendTrim        = 1 << 5
	tflagSendWriteZeroes = 1 << 6
	tflagCanMultiConn    = 1 << 8

	// Transmission phase.
	requestMagic     = 0x25609513
	simpleReplyMagic = 0x67446698
	requestSize      = 28 // magic 4, flags 2, type 2, handle 8, offset 8, length 4
	replySize        = 16 // magic 4, error 4, handle 8

	// Commands.
	cmdRead        = 0
	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdTrim        = 4
	cmdCache       = 5
	cmdWriteZeroes = 6
	cmdBlockStatus = 7

	// Command flags.
	cmdFlagFUA    = 1 << 0
	cmdFlagNoHole = 1 << 1

	// Error values of simple replies (Linux errno numbers, as the
	// protocol fixes them whatever the server's platform).
	errnoOK        = 0
	errnoEPERM     = 1
	errnoEIO       = 5
	errnoENOMEM    = 12
	errnoEINVAL    = 22
	errnoENOSPC    = 28
	errnoESHUTDOWN = 108
)

// cmdName names a command for errors and logs.
func cmdName(c uint16) string {
	switch c {
	case cmdRead:
		return "READ"
	case cmdWrite:
		return "WRITE"
	case cmdDisc:
		return "DISC"
	case cmdFlush:
		return "FLUSH"
	case cmdTrim:
		return "TRIM"
	case cmdCache:
		return "CACHE"
	case cmdWriteZeroes:
		return "WRITE_ZEROES"
	case cmdBlockStatus:
		return "BLOCK_STATUS"
	}
	return "unknown"
}
