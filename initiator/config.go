package initiator

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/auth"
	"github.com/blk-project/blk/transport"
)

// Defaults of Config, each with its reason.
const (
	// DefaultQueueDepth is the entries of each I/O queue: 128, Linux's
	// queue_size default (NVMF_DEF_QUEUE_SIZE). It is then clamped to the
	// controller's CAP.MQES+1 and MAXCMD (ioQueueDepth).
	DefaultQueueDepth = 128
	// MaxQueueDepth is the deepest I/O queue: 256, Linux nvme-rdma's
	// NVME_RDMA_MAX_QUEUE_SIZE. Every slot owns a MaxTransfer buffer, so
	// depth multiplies memory.
	MaxQueueDepth = 256
	// MinQueueDepth: SQSIZE is 0's based and 0 is invalid, so two entries.
	MinQueueDepth = 2
	// DefaultMaxTransfer is the largest transfer of one command, and the
	// size of every I/O slot's registered buffer: 128 KiB (the common
	// max_sectors of Linux block devices). It is lowered to the
	// controller's MDTS. At the default depth a queue registers 16 MiB.
	DefaultMaxTransfer = 128 << 10
	// MaxMaxTransfer bounds MaxTransfer: 8 MiB, under the 16 MiB − 1 a
	// keyed SGL's 24-bit length allows, and under MDTS 11.
	MaxMaxTransfer = 8 << 20
	// DefaultKATO is the keep-alive timeout sent in the admin Connect:
	// 5 s, Linux's NVME_DEFAULT_KATO. Keep Alive is sent every KATO/2.
	DefaultKATO = 5 * time.Second
	// DefaultCtrlLossTimeout bounds reconnecting after a failure: 60 s.
	// (Linux defaults to 600 s; a library caller usually prefers to learn
	// sooner.) Never infinite.
	DefaultCtrlLossTimeout = 60 * time.Second
	// DefaultReconnectDelay is the first pause before a reconnect: 1 s,
	// doubled after every failed attempt up to DefaultMaxReconnectDelay.
	DefaultReconnectDelay = time.Second
	// DefaultMaxReconnectDelay caps the backoff at 10 s, Linux's fixed
	// reconnect_delay.
	DefaultMaxReconnectDelay = 10 * time.Second
	// DefaultConnectTimeout bounds each queue's connection (RDMA CM
	// exchange, or TCP connect and ICReq/ICResp, plus the Fabrics Connect
	// command): 10 s, the time Linux allows a TCP host for ICResp and our
	// transport's default.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultAdminTimeout bounds an admin command: 60 s, Linux's
	// admin_timeout.
	DefaultAdminTimeout = 60 * time.Second
	// DefaultIOTimeout bounds an I/O command: 30 s, Linux's io_timeout.
	// An expired I/O fails the association (error recovery), as in Linux.
	DefaultIOTimeout = 30 * time.Second
	// DefaultShutdownTimeout bounds the wait for CSTS.SHST = complete at
	// Close: 5 s, Linux's shutdown_timeout (raised to RTD3E, at most 60 s).
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultPort is the port used when an address has none: 4420
	// (nvme-cli uses it for RDMA connect and discover alike, and for TCP
	// connect). Discover over TCP uses 8009 (nvme.TCPDiscoveryPort).
	DefaultPort = "4420"
	// DefaultTransport is NVMe/RDMA, the binding this package began with.
	DefaultTransport = TransportRDMA
)

// Config configures Connect and Discover. Zero fields take the defaults
// above (WithDefaults); Validate checks the completed configuration.
type Config struct {
	// Transport is the NVMe-oF transport binding: TransportRDMA ("rdma",
	// the default) over Adapter, or TransportTCP ("tcp"): one TCP
	// connection per queue, no Adapter.
	Transport string
	// Adapter is the RDMA device to use (e.g. soft.New). Required for
	// RDMA, unused for TCP. The caller keeps ownership: closing the
	// Controller does not close it.
	Adapter transport.Adapter
	// HeaderDigest and DataDigest ask for NVMe/TCP header and data
	// digests (CRC32C; nvme connect -g and -G). Off by default; TCP only.
	// The controller must grant exactly what is asked (the ICResp echo),
	// or the connect fails, as with Linux.
	HeaderDigest, DataDigest bool
	// HostNQN identifies this host. Default: the UUID form
	// "nqn.2014-08.org.nvmexpress:uuid:<HostID>".
	HostNQN string
	// HostID is the 128-bit host identifier sent in every Connect.
	// Default: the UUID of a UUID-form HostNQN; else derived from
	// /etc/machine-id (stable per machine); else random.
	HostID [16]byte
	// Queues is the number of I/O queues asked for (Set Features Number
	// of Queues); the controller may grant fewer. Default runtime.NumCPU().
	Queues int
	// QueueDepth is the entries of each I/O queue, in [2, 256]. Default
	// 128; clamped to CAP.MQES+1 and MAXCMD like Linux.
	QueueDepth int
	// MaxTransfer is the largest data transfer of one command, in bytes,
	// a multiple of 4096 in [4096, 8 MiB]; every I/O slot registers a
	// buffer of this size. Default 128 KiB; lowered to MDTS.
	MaxTransfer int
	// KATO is the keep-alive timeout (ms precision). 0 means DefaultKATO;
	// negative disables keep-alive (KATO 0 in Connect).
	KATO time.Duration
	// CtrlLossTimeout is how long reconnecting is tried after a failure
	// before the controller is lost. Default 60 s.
	CtrlLossTimeout time.Duration
	// NoReconnect makes the first failure of the association lose the
	// controller (ErrControllerLost) instead of reconnecting: for a
	// caller that must not reach, under the same Controller, a target
	// that may have restarted and lost what it acknowledged (a
	// replicated volume's primary writing to a replica: the primary
	// reports the replica and connects again itself).
	NoReconnect bool
	// ReconnectDelay is the first pause before reconnecting; it doubles
	// per failed attempt up to MaxReconnectDelay. Default 1 s / 10 s.
	ReconnectDelay    time.Duration
	MaxReconnectDelay time.Duration
	// ConnectTimeout bounds each queue's connection setup. Default 10 s.
	ConnectTimeout time.Duration
	// AdminTimeout and IOTimeout bound one command. Defaults 60 s, 30 s.
	AdminTimeout time.Duration
	IOTimeout    time.Duration
	// ShutdownTimeout bounds the wait for shutdown at Close. Default 5 s.
	ShutdownTimeout time.Duration
	// PinCores pins each engine core's notifications to a processor.
	// Off by default: with the soft provider pinning made a 4 KiB read at
	// queue depth 1 four times slower (transport.EngineConfig.NoPin).
	PinCores bool
	// Logf receives diagnostic messages (connects, failures, reconnects).
	// Default: discard.
	Logf func(format string, args ...any)
	// DHCHAPSecret is this host's DH-HMAC-CHAP secret ("DHHC-1:..."), for
	// a controller that requires in-band authentication (ATR in the
	// Connect response): every queue then authenticates before use.
	// DHCHAPCtrlSecret, when set, is the controller's secret: the host
	// then also challenges the controller and refuses one that does not
	// prove it (bidirectional). Neither is ever logged.
	DHCHAPSecret     string
	DHCHAPCtrlSecret string
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Transport == "" {
		c.Transport = DefaultTransport
	}
	if c.HostID == ([16]byte{}) {
		c.HostID = defaultHostID(c.HostNQN)
	}
	if c.HostNQN == "" {
		c.HostNQN = "nqn.2014-08.org.nvmexpress:uuid:" + formatUUID(c.HostID)
	}
	if c.Queues == 0 {
		c.Queues = runtime.NumCPU()
	}
	if c.QueueDepth == 0 {
		c.QueueDepth = DefaultQueueDepth
	}
	if c.MaxTransfer == 0 {
		c.MaxTransfer = DefaultMaxTransfer
	}
	if c.KATO == 0 {
		c.KATO = DefaultKATO
	}
	if c.CtrlLossTimeout == 0 {
		c.CtrlLossTimeout = DefaultCtrlLossTimeout
	}
	if c.ReconnectDelay == 0 {
		c.ReconnectDelay = DefaultReconnectDelay
	}
	if c.MaxReconnectDelay == 0 {
		c.MaxReconnectDelay = max(DefaultMaxReconnectDelay, c.ReconnectDelay)
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.AdminTimeout == 0 {
		c.AdminTimeout = DefaultAdminTimeout
	}
	if c.IOTimeout == 0 {
		c.IOTimeout = DefaultIOTimeout
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c
}

// Validate checks a completed configuration (after WithDefaults). Errors
// wrap ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	switch {
	case c.Transport != TransportRDMA && c.Transport != TransportTCP:
		return bad("Transport %q is neither %q nor %q", c.Transport, TransportRDMA, TransportTCP)
	case c.Transport == TransportRDMA && c.Adapter == nil:
		return bad("no Adapter (RDMA needs one)")
	case c.Transport != TransportTCP && (c.HeaderDigest || c.DataDigest):
		return bad("HeaderDigest and DataDigest need Transport %q", TransportTCP)
	case c.Queues < 1 || c.Queues > 0xFFFF:
		// Number of Queues asks for n-1 in a 16-bit field, 0xFFFF invalid.
		return bad("Queues %d not in [1, 65535]", c.Queues)
	case c.QueueDepth < MinQueueDepth || c.QueueDepth > MaxQueueDepth:
		return bad("QueueDepth %d not in [%d, %d]", c.QueueDepth, MinQueueDepth, MaxQueueDepth)
	case c.MaxTransfer < 4096 || c.MaxTransfer > MaxMaxTransfer || c.MaxTransfer%4096 != 0:
		return bad("MaxTransfer %d not a multiple of 4096 in [4096, %d]", c.MaxTransfer, MaxMaxTransfer)
	case c.KATO > 0 && c.KATO < time.Millisecond:
		return bad("KATO %v below the 1 ms unit of the Connect field", c.KATO)
	case c.KATO.Milliseconds() > int64(^uint32(0)):
		return bad("KATO %v does not fit the 32-bit millisecond field", c.KATO)
	case c.CtrlLossTimeout <= 0:
		return bad("CtrlLossTimeout %v must be positive (reconnecting is always bounded)", c.CtrlLossTimeout)
	case c.ReconnectDelay <= 0 || c.MaxReconnectDelay < c.ReconnectDelay:
		return bad("ReconnectDelay %v must be positive and at most MaxReconnectDelay %v", c.ReconnectDelay, c.MaxReconnectDelay)
	case c.ConnectTimeout <= 0 || c.AdminTimeout <= 0 || c.IOTimeout <= 0 || c.ShutdownTimeout <= 0:
		return bad("timeouts must be positive")
	}
	if err := nvme.ValidateNQN(c.HostNQN); err != nil {
		return bad("HostNQN %q: %v", c.HostNQN, err)
	}
	if _, err := c.authConfig(""); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return nil
}

// authConfig is the host side of DH-HMAC-CHAP for subNQN (nil without a
// secret).
func (c *Config) authConfig(subNQN string) (*auth.Config, error) {
	if c.DHCHAPSecret == "" {
		if c.DHCHAPCtrlSecret != "" {
			return nil, errors.New("DHCHAPCtrlSecret needs DHCHAPSecret")
		}
		return nil, nil
	}
	hk, err := auth.ParseKey(c.DHCHAPSecret)
	if err != nil {
		return nil, fmt.Errorf("DHCHAPSecret: %v", err)
	}
	hc := &auth.Config{HostNQN: c.HostNQN, SubNQN: subNQN, HostKey: hk}
	if c.DHCHAPCtrlSecret != "" {
		ck, err := auth.ParseKey(c.DHCHAPCtrlSecret)
		if err != nil {
			return nil, fmt.Errorf("DHCHAPCtrlSecret: %v", err)
		}
		hc.CtrlKey = &ck
	}
	return hc, nil
}

// tcpDigests are the NVMe/TCP digests asked for in ICReq.
func (c *Config) tcpDigests() nvme.TCPDigests {
	return nvme.TCPDigests{Header: c.HeaderDigest, Data: c.DataDigest}
}

// katoMillis is the KATO field of the admin Connect.
func (c *Config) katoMillis() uint32 {
	if c.KATO <= 0 {
		return 0
	}
	return uint32(c.KATO.Milliseconds())
}

// defaultHostID picks the host identifier: the UUID inside a UUID-form
// NQN (what nvme-cli does), else one derived from the machine identity,
// else a random one.
func defaultHostID(nqn string) [16]byte {
	const uuidPrefix = "nqn.2014-08.org.nvmexpress:uuid:"
	if strings.HasPrefix(nqn, uuidPrefix) {
		if id, ok := parseUUID(nqn[len(uuidPrefix):]); ok {
			return id
		}
	}
	var id [16]byte
	if m, err := os.ReadFile("/etc/machine-id"); err == nil && len(strings.TrimSpace(string(m))) > 0 {
		sum := sha256.Sum256(append([]byte("blk-initiator-hostid:"), strings.TrimSpace(string(m))...))
		copy(id[:], sum[:16])
	} else if _, err := rand.Read(id[:]); err != nil {
		panic("initiator: no randomness for a host identifier: " + err.Error())
	}
	id[6] = id[6]&0x0F | 0x40 // version 4 layout (random-looking)
	id[8] = id[8]&0x3F | 0x80 // RFC 4122 variant
	return id
}

func formatUUID(id [16]byte) string {
	h := hex.EncodeToString(id[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func parseUUID(s string) ([16]byte, bool) {
	var id [16]byte
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, false
	}
	h := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36]
	if _, err := hex.Decode(id[:], []byte(h)); err != nil {
		return id, false
	}
	return id, true
}
