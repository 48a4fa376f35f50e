package target_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/auth"
	"github.com/blk-project/blk/nvme/resv"
	"github.com/blk-project/blk/store"
	"github.com/blk-project/blk/target"
)

// faultBackend wraps a Backend and fails the operations it is told to,
// with errors as a store volume behind its adapter would.
type faultBackend struct {
	target.Backend
	mu   sync.Mutex
	errs map[string]error // "read", "write", "writezeroes", "deallocate", "flush", "geometry"
}

func newFaultBackend(b target.Backend) *faultBackend {
	return &faultBackend{Backend: b, errs: map[string]error{}}
}

func (f *faultBackend) set(op string, err error) {
	f.mu.Lock()
	f.errs[op] = err
	f.mu.Unlock()
}

// err is the injected failure of op, as the store adapter returns it
// (translated by the adapter's storeStatus; a geometry error as is).
func (f *faultBackend) err(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return target.StoreError(op, f.errs[op])
}

func (f *faultBackend) Geometry() (target.Geometry, error) {
	if err := f.err("geometry"); err != nil {
		return target.Geometry{}, err
	}
	return f.Backend.Geometry()
}

func (f *faultBackend) Read(lba uint64, buf []byte) error {
	if err := f.err("read"); err != nil {
		return err
	}
	return f.Backend.Read(lba, buf)
}

func (f *faultBackend) Write(lba uint64, data []byte, fua bool) error {
	if err := f.err("write"); err != nil {
		return err
	}
	return f.Backend.Write(lba, data, fua)
}

func (f *faultBackend) WriteZeroes(lba, n uint64, fua bool) error {
	if err := f.err("writezeroes"); err != nil {
		return err
	}
	return f.Backend.WriteZeroes(lba, n, fua)
}

func (f *faultBackend) Deallocate(lba, n uint64) error {
	if err := f.err("deallocate"); err != nil {
		return err
	}
	return f.Backend.Deallocate(lba, n)
}

func (f *faultBackend) Flush() error {
	if err := f.err("flush"); err != nil {
		return err
	}
	return f.Backend.Flush()
}

// statusErr is a backend error carrying its own status.
type statusErr nvme.Status

func (s statusErr) Error() string           { return "status " + fmtStatus(nvme.Status(s)) }
func (s statusErr) NVMeStatus() nvme.Status { return nvme.Status(s) }

// fixture is a live controller with one I/O queue on a 64-block
// namespace behind a fault-injecting memory backend.
type fixture struct {
	h              *harness
	admin, io      *tq
	cntlid         uint16
	mem            *target.MemBackend
	fault          *faultBackend
	sub            *target.Subsystem
	data4k, data8k []byte
}

func newFixture(t *testing.T, opts ...func(*target.Config)) *fixture {
	h := newHarness(t, opts...)
	s, err := h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subA, Hosts: []string{hostA}})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := target.NewMemBackend(4096, 64)
	fb := newFaultBackend(m)
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: fb}); err != nil {
		t.Fatal(err)
	}
	admin, cntlid := h.adminConnect("admin", hostA, subA, 5000)
	io := h.ioConnect("io1", 1, hostA, subA, cntlid)
	return &fixture{h: h, admin: admin, io: io, cntlid: cntlid, mem: m, fault: fb, sub: s,
		data4k: make([]byte, 4096), data8k: make([]byte, 8192)}
}

func (f *fixture) read(blocks uint32, n int) *call {
	return f.h.exec(f.io, ioCmd(nvme.IORead, 1, 0, blocks, 0), make([]byte, n))
}

// statusCases provoke every status the target returns. TestStatusTable
// runs them; TestStatusTableComplete checks that every status constant
// the package's code uses has a row.
var statusCases = []struct {
	name string
	want nvme.Status
	run  func(t *testing.T, f *fixture) *call
}{
	{"success", nvme.StatusSuccess, func(t *testing.T, f *fixture) *call { return f.read(1, 4096) }},

	// Generic command status.
	{"invalid opcode: unknown I/O opcode", nvme.StatusInvalidOpcode.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.io, ioCmd(nvme.IOWriteUncorrectable, 1, 0, 1, 0), nil)
	}},
	{"invalid opcode: unknown admin opcode", nvme.StatusInvalidOpcode.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.admin, adminCmd(nvme.AdminFormatNVM), nil)
	}},
	{"invalid opcode: command before Connect", nvme.StatusInvalidOpcode.WithDNR(), func(t *testing.T, f *fixture) *call {
		q := f.h.queue("new", target.QueueParams{QID: 0, SQSize: 31})
		return f.h.exec(q, identifyCmd(nvme.CNSController, 0), make([]byte, 4096))
	}},
	{"invalid opcode: authentication send", nvme.StatusInvalidOpcode.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.admin, fabricsCmd(nvme.FabricsAuthSend), nil)
	}},
	{"invalid field: unknown CNS", nvme.StatusInvalidField.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.admin, identifyCmd(nvme.CNSNamespaceCSIndep, 1), make([]byte, 4096))
	}},
	{"invalid field: CNS 0x06 for a command set other than NVM", nvme.StatusInvalidField.WithDNR(), func(t *testing.T, f *fixture) *call {
		cmd := adminCmd(nvme.AdminIdentify)
		(&nvme.IdentifyCommand{CNS: nvme.CNSCSController, CSI: nvme.CSIZNS}).Encode(&cmd)
		return f.h.exec(f.admin, cmd, make([]byte, 4096))
	}},
	{"invalid field: unknown FID", nvme.StatusInvalidField.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.admin, getFeatCmd(nvme.FeatureTimestamp, 0), nil)
	}},
	{"invalid field: unknown LID", nvme.StatusInvalidField.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.admin, getLogCmd(nvme.LogANA, 0, 4096, 0, false), make([]byte, 4096))
	}},
	{"invalid field: fused", nvme.StatusInvalidField.WithDNR(), func(t *testing.T, f *fixture) *call {
		c := ioCmd(nvme.IORead, 1, 0, 1, 0)
		c.Flags |= nvme.FlagFuseFirst
		return f.h.exec(f.io, c, make([]byte, 4096))
	}},
	{"invalid field: PRP data pointer", nvme.StatusInvalidField.WithDNR(), func(t *testing.T, f *fixture) *call {
		c := ioCmd(nvme.IORead, 1, 0, 1, 0)
		c.Flags = 0
		return f.h.exec(f.io, c, make([]byte, 4096))
	}},
	{"invalid field: transfer above MDTS", nvme.StatusInvalidField.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.read(33, 33*4096)
	}},
	{"invalid field: unknown property", nvme.StatusInvalidField.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.admin, propGet(nvme.PropNSSR, false), nil)
	}},
	{"invalid field: coalescing refused by the binding", nvme.StatusInvalidField.WithDNR(), func(t *testing.T, f *fixture) *call {
		q := f.h.queue("coal", target.QueueParams{QID: 0, SQSize: 31,
			Coalescing: func(uint8, uint8) error { return errors.New("no moderation") }})
		mustOK(t, f.h.exec(q, connectCmd(0, 31, 5000), connectData(hostA, subA, 0xFFFF, hostIDA)), "connect")
		mustOK(t, f.h.exec(q, propSet(nvme.PropCC, ccEnable), nil), "enable")
		return f.h.exec(q, setFeatCmd(nvme.FeatureIRQCoalescing, 0x0a05), nil)
	}},
	{"internal error: backend failure", nvme.StatusInternalError.WithDNR(), func(t *testing.T, f *fixture) *call {
		f.fault.set("read", errors.New("something broke"))
		return f.read(1, 4096)
	}},
	{"internal error: failed flush", nvme.StatusInternalError.WithDNR(), func(t *testing.T, f *fixture) *call {
		f.fault.set("flush", fmt.Errorf("sync: %w", store.ErrIO))
		return f.h.exec(f.io, nvme.Command{Opcode: uint8(nvme.IOFlush), Flags: nvme.FlagSGLMetaBuf, NSID: 1}, nil)
	}},
	{"abort SQ deleted: held AER at teardown", nvme.StatusAbortSQDeleted, func(t *testing.T, f *fixture) *call {
		c, done := f.h.execMayHold(f.admin, adminCmd(nvme.AdminAsyncEvent), nil)
		if done {
			t.Fatal("AER completed at once")
		}
		f.admin.q.Close()
		c.wait(t)
		return c
	}},
	{"abort SQ deleted: I/O on a torn-down controller", nvme.StatusAbortSQDeleted, func(t *testing.T, f *fixture) *call {
		f.admin.q.Close()
		return f.read(1, 4096)
	}},
	{"abort SQ deleted: command on a closed queue", nvme.StatusAbortSQDeleted, func(t *testing.T, f *fixture) *call {
		f.io.q.Close()
		return f.read(1, 4096)
	}},
	{"invalid namespace", nvme.StatusInvalidNamespace.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.io, ioCmd(nvme.IORead, 9, 0, 1, 0), make([]byte, 4096))
	}},
	{"invalid namespace: volume deleted", nvme.StatusInvalidNamespace.WithDNR(), func(t *testing.T, f *fixture) *call {
		f.fault.set("read", fmt.Errorf("volume 1: %w", store.ErrNotFound))
		return f.read(1, 4096)
	}},
	{"command sequence error: before CSTS.RDY", nvme.StatusCommandSequenceError.WithDNR(), func(t *testing.T, f *fixture) *call {
		mustOK(t, f.h.exec(f.admin, propSet(nvme.PropCC, 0x00460000), nil), "disable")
		return f.read(1, 4096)
	}},
	{"command sequence error: QID in use", nvme.StatusCommandSequenceError.WithDNR(), func(t *testing.T, f *fixture) *call {
		q := f.h.queue("dup", target.QueueParams{QID: 1, SQSize: 127})
		return f.h.exec(q, connectCmd(1, 127, 0), connectData(hostA, subA, f.cntlid, hostIDA))
	}},
	{"data SGL length invalid: read", nvme.StatusSGLInvalidDataLength.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.read(2, 4096)
	}},
	{"data SGL length invalid: connect data", nvme.StatusSGLInvalidDataLength.WithDNR(), func(t *testing.T, f *fixture) *call {
		q := f.h.queue("short", target.QueueParams{QID: 0, SQSize: 31})
		return f.h.exec(q, connectCmd(0, 31, 0), connectData(hostA, subA, 0xFFFF, hostIDA)[:1000])
	}},
	{"data SGL length invalid: misaligned for the volume", nvme.StatusSGLInvalidDataLength.WithDNR(), func(t *testing.T, f *fixture) *call {
		f.fault.set("read", fmt.Errorf("%w", store.ErrMisaligned))
		return f.read(1, 4096)
	}},
	{"authentication required: a host with secrets before it authenticated", nvme.StatusAuthenticationRequired.WithDNR(), func(t *testing.T, f *fixture) *call {
		hk, _ := auth.GenerateKey(0, 32)
		if err := f.sub.SetHostKeys(hostA, &target.HostKeys{Host: hk}); err != nil {
			t.Fatal(err)
		}
		// The fixture's controller, unauthenticated, is gone; a new
		// one must authenticate before anything else.
		q := f.h.queue("auth-admin", target.QueueParams{QID: 0, SQSize: 31})
		mustOK(t, f.h.exec(q, connectCmd(0, 31, 0), connectData(hostA, subA, 0xFFFF, hostIDA)), "admin connect")
		return f.h.exec(q, propGet(nvme.PropCSTS, false), nil)
	}},
	{"keep alive timeout invalid", nvme.StatusKeepAliveInvalid.WithDNR(), func(t *testing.T, f *fixture) *call {
		mustOK(t, f.h.exec(f.admin, setFeatCmd(nvme.FeatureKeepAliveTimer, 0), nil), "KATO 0")
		return f.h.exec(f.admin, adminCmd(nvme.AdminKeepAlive), nil)
	}},
	{"namespace write protected", nvme.StatusNamespaceWriteProtect.WithDNR(), func(t *testing.T, f *fixture) *call {
		f.fault.set("write", fmt.Errorf("volume 1: %w", store.ErrReadOnly))
		return f.h.exec(f.io, ioCmd(nvme.IOWrite, 1, 0, 1, 0), f.data4k)
	}},
	{"LBA out of range", nvme.StatusLBAOutOfRange.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.io, ioCmd(nvme.IORead, 1, 63, 2, 0), f.data8k)
	}},
	{"namespace not ready: store closed", nvme.StatusNamespaceNotReady, func(t *testing.T, f *fixture) *call {
		f.fault.set("read", fmt.Errorf("volume 1: %w", store.ErrClosed))
		return f.read(1, 4096)
	}},
	{"capacity exceeded: disk under the store's reserve", nvme.StatusCapacityExceeded.WithDNR(), func(t *testing.T, f *fixture) *call {
		f.fault.set("write", fmt.Errorf("volume 1: %w", store.ErrNoSpace))
		return f.h.exec(f.io, ioCmd(nvme.IOWrite, 1, 0, 1, 0), f.data4k)
	}},

	// Command specific status.
	{"AER limit exceeded", nvme.StatusAERLimitExceeded.WithDNR(), func(t *testing.T, f *fixture) *call {
		for range 4 {
			if _, done := f.h.execMayHold(f.admin, adminCmd(nvme.AdminAsyncEvent), nil); done {
				t.Fatal("AER completed at once")
			}
		}
		return f.h.exec(f.admin, adminCmd(nvme.AdminAsyncEvent), nil)
	}},
	{"feature not saveable", nvme.StatusFeatureNotSaveable.WithDNR(), func(t *testing.T, f *fixture) *call {
		c := setFeatCmd(nvme.FeatureKeepAliveTimer, 5000)
		c.CDW10 |= 1 << 31
		return f.h.exec(f.admin, c, nil)
	}},
	{"feature not changeable", nvme.StatusFeatureNotChangable.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.admin, setFeatCmd(nvme.FeatureVolatileWC, 0), nil)
	}},
	{"connect incompatible format", nvme.StatusConnectIncompatibleFormat.WithDNR(), func(t *testing.T, f *fixture) *call {
		q := f.h.queue("fmt", target.QueueParams{QID: 0, SQSize: 31})
		c := connectCmd(0, 31, 0)
		c.CDW10 |= 1
		return f.h.exec(q, c, connectData(hostA, subA, 0xFFFF, hostIDA))
	}},
	// Without DNR: the target is full for now, and a Linux host that
	// gets DNR on a Connect never reconnects.
	{"connect controller busy: no controller ID", nvme.StatusConnectControllerBusy, func(t *testing.T, f *fixture) *call {
		// The fixture's controller is the only one allowed.
		q := f.h.queue("busy", target.QueueParams{QID: 0, SQSize: 31})
		return f.h.exec(q, connectCmd(0, 31, 0), connectData(hostA, subA, 0xFFFF, hostIDA))
	}},
	{"connect controller busy: queue already connected", nvme.StatusConnectControllerBusy.WithDNR(), func(t *testing.T, f *fixture) *call {
		return f.h.exec(f.io, connectCmd(1, 127, 0), connectData(hostA, subA, f.cntlid, hostIDA))
	}},
	{"connect invalid parameters", nvme.StatusConnectInvalidParameters.WithDNR(), func(t *testing.T, f *fixture) *call {
		q := f.h.queue("nosub", target.QueueParams{QID: 0, SQSize: 31})
		return f.h.exec(q, connectCmd(0, 31, 0), connectData(hostA, subB, 0xFFFF, hostIDA))
	}},
	{"connect invalid host", nvme.StatusConnectInvalidHost.WithDNR(), func(t *testing.T, f *fixture) *call {
		q := f.h.queue("nohost", target.QueueParams{QID: 0, SQSize: 31})
		return f.h.exec(q, connectCmd(0, 31, 0), connectData(hostB, subA, 0xFFFF, hostIDA))
	}},

	{"connect invalid host: Admit says later", nvme.StatusConnectInvalidHost, func(t *testing.T, f *fixture) *call {
		if _, err := f.h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subB, Admit: func(string) error {
			return fmt.Errorf("epoch ahead: %w", target.ErrAdmitRetry)
		}}); err != nil {
			t.Fatal(err)
		}
		q := f.h.queue("later", target.QueueParams{QID: 0, SQSize: 31})
		return f.h.exec(q, connectCmd(0, 31, 0), connectData(hostA, subB, 0xFFFF, hostIDA))
	}},

	// Path related status (ANA): no DNR, the host retries elsewhere.
	{"asymmetric access inaccessible", nvme.StatusANAInaccessible, func(t *testing.T, f *fixture) *call {
		return anaRead(t, f, nvme.ANAInaccessible)
	}},
	{"asymmetric access persistent loss", nvme.StatusANAPersistentLoss, func(t *testing.T, f *fixture) *call {
		return anaRead(t, f, nvme.ANAPersistentLoss)
	}},
	{"asymmetric access transition", nvme.StatusANATransition, func(t *testing.T, f *fixture) *call {
		return anaRead(t, f, nvme.ANAChange)
	}},

	// Media and data integrity errors.
	{"write fault", nvme.StatusWriteFault.WithDNR(), func(t *testing.T, f *fixture) *call {
		f.fault.set("write", fmt.Errorf("wal: %w", store.ErrIO))
		return f.h.exec(f.io, ioCmd(nvme.IOWrite, 1, 0, 1, 0), f.data4k)
	}},
	{"write fault: deallocate", nvme.StatusWriteFault.WithDNR(), func(t *testing.T, f *fixture) *call {
		f.fault.set("deallocate", fmt.Errorf("wal: %w", store.ErrIO))
		return f.h.exec(f.io, ioCmd(nvme.IOWriteZeroes, 1, 0, 1, nvme.RWDEAC), nil)
	}},
	{"unrecovered read error", nvme.StatusUnrecoveredReadError.WithDNR(), func(t *testing.T, f *fixture) *call {
		f.fault.set("read", fmt.Errorf("data area: %w", store.ErrIO))
		return f.read(1, 4096)
	}},
	{"compare failure", nvme.StatusCompareFailure.WithDNR(), func(t *testing.T, f *fixture) *call {
		data := make([]byte, 4096)
		data[100] = 1
		return f.h.exec(f.io, ioCmd(nvme.IOCompare, 1, 0, 1, 0), data)
	}},

	// Fused Compare and Write (fused.go).
	{"missing fused command: a second with no first", nvme.StatusAbortFusedMissing, func(t *testing.T, f *fixture) *call {
		return f.h.submitStamped(f.io, fusedCmd(nvme.IOWrite, 1, 0, 1, nvme.FlagFuseSecond), f.data4k, 1, 0)
	}},
	{"failed fused command: the pair miscompared", nvme.StatusAbortFusedFail, func(t *testing.T, f *fixture) *call {
		cmp := make([]byte, 4096)
		cmp[7] = 1
		f.h.submitStamped(f.io, fusedCmd(nvme.IOCompare, 1, 0, 1, nvme.FlagFuseFirst), cmp, 1, 0)
		return f.h.submitStamped(f.io, fusedCmd(nvme.IOWrite, 1, 0, 1, nvme.FlagFuseSecond), f.data4k, 2, nvme.FlagFuseFirst)
	}},

	// A backend's own status passes through unchanged.
	{"backend status: reservation conflict", nvme.StatusReservationConflict.WithDNR(), func(t *testing.T, f *fixture) *call {
		f.fault.set("write", fmt.Errorf("held: %w", statusErr(nvme.StatusReservationConflict.WithDNR())))
		return f.h.exec(f.io, ioCmd(nvme.IOWrite, 1, 0, 1, 0), f.data4k)
	}},

	// Reservations (resv.go, resv_cmd.go).
	{"reservation conflict: another host holds Write Exclusive", nvme.StatusReservationConflict.WithDNR(), func(t *testing.T, f *fixture) *call {
		other := resv.HostID{0xb}
		st := &resv.State{Gen: 1, Type: resv.WriteExclusive, Holder: other, Regs: []resv.Registrant{{Host: other, Key: 1}}}
		if err := f.sub.SetReservations(1, target.LocalReservations(), st); err != nil {
			t.Fatal(err)
		}
		return f.h.exec(f.io, ioCmd(nvme.IOWrite, 1, 0, 1, 0), f.data4k)
	}},
	{"host identifier inconsistent format: report without EDS", nvme.StatusHostIDInconsistent.WithDNR(), func(t *testing.T, f *fixture) *call {
		if err := f.sub.SetReservations(1, target.LocalReservations(), nil); err != nil {
			t.Fatal(err)
		}
		cmd := nvme.Command{Opcode: uint8(nvme.IOReservationReport), Flags: nvme.FlagSGLMetaBuf, NSID: 1, CDW10: 4096/4 - 1}
		return f.h.exec(f.io, cmd, make([]byte, 4096))
	}},
}

// anaRead reads on a second subsystem, with ANA, in state st.
func anaRead(t *testing.T, f *fixture, st nvme.ANAState) *call {
	s, err := f.h.tgt.AddSubsystem(target.SubsystemConfig{NQN: subB, AllowAnyHost: true, ANA: true, ANAState: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddNamespace(target.NamespaceConfig{NSID: 1, Backend: f.mem}); err != nil {
		t.Fatal(err)
	}
	_, cntlid := f.h.adminConnect("ana-admin", hostA, subB, 5000)
	io := f.h.ioConnect("ana-io", 1, hostA, subB, cntlid)
	return f.h.exec(io, ioCmd(nvme.IORead, 1, 0, 1, 0), make([]byte, 4096))
}

// oneCtrlCases run on a target with MaxControllers 1.
var oneCtrlCases = map[string]bool{"connect controller busy: no controller ID": true}

func TestStatusTable(t *testing.T) {
	for _, tc := range statusCases {
		t.Run(tc.name, func(t *testing.T) {
			var opts []func(*target.Config)
			if oneCtrlCases[tc.name] {
				opts = append(opts, func(c *target.Config) { c.MaxControllers = 1 })
			}
			f := newFixture(t, opts...)
			c := tc.run(t, f)
			if got := c.status(); got != tc.want {
				t.Fatalf("status %s (%v), want %s (%v)", fmtStatus(got), got, fmtStatus(tc.want), tc.want)
			}
		})
	}
}

// statusByName names the status constants of package nvme the target
// uses; TestStatusTableComplete fails on a constant missing here.
var statusByName = map[string]nvme.Status{
	"StatusSuccess":                   nvme.StatusSuccess,
	"StatusInvalidOpcode":             nvme.StatusInvalidOpcode,
	"StatusInvalidField":              nvme.StatusInvalidField,
	"StatusInternalError":             nvme.StatusInternalError,
	"StatusAbortSQDeleted":            nvme.StatusAbortSQDeleted,
	"StatusInvalidNamespace":          nvme.StatusInvalidNamespace,
	"StatusCommandSequenceError":      nvme.StatusCommandSequenceError,
	"StatusAuthenticationRequired":    nvme.StatusAuthenticationRequired,
	"StatusSGLInvalidDataLength":      nvme.StatusSGLInvalidDataLength,
	"StatusKeepAliveInvalid":          nvme.StatusKeepAliveInvalid,
	"StatusNamespaceWriteProtect":     nvme.StatusNamespaceWriteProtect,
	"StatusLBAOutOfRange":             nvme.StatusLBAOutOfRange,
	"StatusNamespaceNotReady":         nvme.StatusNamespaceNotReady,
	"StatusCapacityExceeded":          nvme.StatusCapacityExceeded,
	"StatusAERLimitExceeded":          nvme.StatusAERLimitExceeded,
	"StatusFeatureNotSaveable":        nvme.StatusFeatureNotSaveable,
	"StatusFeatureNotChangable":       nvme.StatusFeatureNotChangable,
	"StatusConnectIncompatibleFormat": nvme.StatusConnectIncompatibleFormat,
	"StatusConnectControllerBusy":     nvme.StatusConnectControllerBusy,
	"StatusConnectInvalidParameters":  nvme.StatusConnectInvalidParameters,
	"StatusConnectInvalidHost":        nvme.StatusConnectInvalidHost,
	"StatusWriteFault":                nvme.StatusWriteFault,
	"StatusUnrecoveredReadError":      nvme.StatusUnrecoveredReadError,
	"StatusCompareFailure":            nvme.StatusCompareFailure,
	"StatusReservationConflict":       nvme.StatusReservationConflict,
	"StatusHostIDInconsistent":        nvme.StatusHostIDInconsistent,
	"StatusAbortFusedMissing":         nvme.StatusAbortFusedMissing,
	"StatusAbortFusedFail":            nvme.StatusAbortFusedFail,
}

// TestStatusTableComplete reads the package's source for every nvme.Status
// constant it returns and checks the table has a row provoking it.
func TestStatusTableComplete(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "nvme" && strings.HasPrefix(sel.Sel.Name, "Status") &&
				sel.Sel.Name != "Status" && sel.Sel.Name != "StatusDNR" && sel.Sel.Name != "StatusMore" && sel.Sel.Name != "StatusError" {
				used[sel.Sel.Name] = true
			}
			return true
		})
	}
	covered := map[nvme.Status]bool{}
	for _, tc := range statusCases {
		covered[tc.want.Code()] = true
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s, ok := statusByName[n]
		if !ok {
			t.Errorf("the target uses nvme.%s: add it to statusByName and a row to statusCases", n)
			continue
		}
		if !covered[s] {
			t.Errorf("no row of statusCases provokes nvme.%s (%s)", n, fmtStatus(s))
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only %d status constants: %v", len(names), names)
	}
}

// NewWriteGroup implements target.Backend: none, so that every write
// goes through Write and its injected fault.
func (f *faultBackend) NewWriteGroup() target.WriteGroup { return nil }
