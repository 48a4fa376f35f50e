package initiator

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/blk-project/blk/nvme"
)

// Persistent reservations (docs/reservations.md §1.1): Reservation
// Register, Acquire, Release and Report, sent on an I/O queue as the
// Linux host's pr_ops and nvme-cli's resv-* commands send them. They are
// blocking, not on the data path, and used by blk's tests and tools; the
// status of a refused command is a *StatusError (Reservation Conflict:
// nvme.StatusReservationConflict).

// ReservationRegister sends Reservation Register: action is RREGA
// (nvme.RREGARegister, RREGAUnregister, RREGAReplace), crkey the current
// key, nrkey the new one, cptpl the Change Persist Through Power Loss
// field (nvme.CPTPLNoChange, CPTPLClear, CPTPLSet).
func (ns *Namespace) ReservationRegister(ctx context.Context, action uint8, crkey, nrkey uint64, iekey bool, cptpl uint8) error {
	return ns.resvKeys(ctx, nvme.IOReservationRegister, action, iekey, 0, cptpl, crkey, nrkey, nvme.ResvDataSize)
}

// ReservationAcquire sends Reservation Acquire: action is RACQA
// (nvme.RACQAAcquire, RACQAPreempt, RACQAPreemptAndAbort), rtype the
// reservation type (1–6), crkey the host's key, prkey the key to preempt.
func (ns *Namespace) ReservationAcquire(ctx context.Context, action, rtype uint8, crkey, prkey uint64, iekey bool) error {
	return ns.resvKeys(ctx, nvme.IOReservationAcquire, action, iekey, rtype, 0, crkey, prkey, nvme.ResvDataSize)
}

// ReservationRelease sends Reservation Release: action is RRELA
// (nvme.RRELARelease, RRELAClear), rtype the type held, crkey the host's
// key.
func (ns *Namespace) ReservationRelease(ctx context.Context, action, rtype uint8, crkey uint64, iekey bool) error {
	return ns.resvKeys(ctx, nvme.IOReservationRelease, action, iekey, rtype, 0, crkey, 0, nvme.ResvReleaseDataSize)
}

// resvKeys sends one of the three commands with its keys as data.
func (ns *Namespace) resvKeys(ctx context.Context, op nvme.IOOpcode, action uint8, iekey bool, rtype, cptpl uint8, k1, k2 uint64, n int) error {
	cmd := nvme.Command{Opcode: uint8(op), Flags: cmdFlags, NSID: ns.id}
	cmd.SetResv(action, iekey, rtype, cptpl)
	var data [nvme.ResvDataSize]byte
	(&nvme.ResvKeys{CRKEY: k1, Key2: k2}).Marshal(&data)
	return ns.resvExec(ctx, &cmd, data[:n], nil)
}

// ReservationStatus is a Reservation Report's answer (the extended data
// structure: 128-bit host identifiers).
type ReservationStatus struct {
	Gen  uint32
	Type uint8 // RTYPE held, 0: none
	PTPL bool  // PTPLS
	// Registrants are the entries returned (Count says how many there
	// are: a report truncated by its buffer holds fewer).
	Registrants []ReservationRegistrant
	Count       int // REGCTL
}

// ReservationRegistrant is one registrant of a report.
type ReservationRegistrant struct {
	CNTLID uint16
	Holder bool // RCSTS bit 0
	Key    uint64
	HostID [16]byte
}

// resvReportMax bounds a report: the header and 128 registrants
// (resv.MaxRegistrants).
const resvReportMax = nvme.ResvStatusHeaderSize + 128*nvme.ResvStatusEntrySize

// ReservationReport sends Reservation Report with EDS set (the extended
// structure, as the Linux host asks first) and parses it.
func (ns *Namespace) ReservationReport(ctx context.Context) (ReservationStatus, error) {
	buf := make([]byte, resvReportMax)
	cmd := nvme.Command{Opcode: uint8(nvme.IOReservationReport), Flags: cmdFlags, NSID: ns.id,
		CDW10: uint32(len(buf)/4 - 1), CDW11: nvme.ResvReportEDS}
	if err := ns.resvExec(ctx, &cmd, nil, buf); err != nil {
		return ReservationStatus{}, err
	}
	return parseReservationStatus(buf)
}

// ReservationReportRaw sends Reservation Report with eds as given and n
// bytes of buffer, and returns what came back (tests of the refusal of
// EDS 0 and of truncation).
func (ns *Namespace) ReservationReportRaw(ctx context.Context, eds bool, n int) ([]byte, error) {
	if n < 4 || n%4 != 0 || n > resvReportMax {
		return nil, fmt.Errorf("initiator: report buffer of %d bytes: a multiple of 4 up to %d", n, resvReportMax)
	}
	buf := make([]byte, n)
	cmd := nvme.Command{Opcode: uint8(nvme.IOReservationReport), Flags: cmdFlags, NSID: ns.id, CDW10: uint32(n/4 - 1)}
	if eds {
		cmd.CDW11 = nvme.ResvReportEDS
	}
	err := ns.resvExec(ctx, &cmd, nil, buf)
	return buf, err
}

// parseReservationStatus reads the extended Reservation Status structure.
func parseReservationStatus(b []byte) (ReservationStatus, error) {
	if len(b) < nvme.ResvStatusHeaderSize {
		return ReservationStatus{}, fmt.Errorf("initiator: reservation report of %d bytes", len(b))
	}
	st := ReservationStatus{
		Gen:   binary.LittleEndian.Uint32(b[0:]),
		Type:  b[4],
		Count: int(binary.LittleEndian.Uint16(b[5:])),
		PTPL:  b[9]&1 != 0,
	}
	for i := range st.Count {
		off := nvme.ResvStatusHeaderSize + i*nvme.ResvStatusEntrySize
		if off+nvme.ResvStatusEntrySize > len(b) {
			break
		}
		e := b[off : off+nvme.ResvStatusEntrySize]
		r := ReservationRegistrant{CNTLID: binary.LittleEndian.Uint16(e[0:]), Holder: e[2]&1 != 0, Key: binary.LittleEndian.Uint64(e[8:])}
		copy(r.HostID[:], e[16:32])
		st.Registrants = append(st.Registrants, r)
	}
	return st, nil
}

// resvExec runs cmd on one of the live association's I/O queues and
// waits; it waits out a reconnect as the blocking calls do.
func (ns *Namespace) resvExec(ctx context.Context, cmd *nvme.Command, wdata, rdst []byte) error {
	if ns.Removed() {
		return ErrNamespaceRemoved
	}
	a, err := ns.c.waitLive(ctx)
	if err != nil {
		return err
	}
	n := uint32(len(a.io))
	if n == 0 {
		return fmt.Errorf("%w: no I/O queues", ErrNotSupported)
	}
	q := a.io[ns.c.rr.Add(1)%n]
	_, err = q.exec(ctx, cmd, wdata, rdst, q.timeout)
	return err
}

// ReservationNotice reads the controller's Reservation Notification log
// page (80h): its oldest entry, which the controller then removes (Count
// 0: the log was empty). It re-arms the controller's reservation event.
func (c *Controller) ReservationNotice(ctx context.Context) (nvme.ResvNotifLog, error) {
	a, err := c.waitLive(ctx)
	if err != nil {
		return nvme.ResvNotifLog{}, err
	}
	buf := make([]byte, nvme.ResvNotifLogSize)
	if err := a.readLog(ctx, nvme.LogResvNotification, 0, buf, false); err != nil {
		return nvme.ResvNotifLog{}, err
	}
	var l nvme.ResvNotifLog
	err = l.Unmarshal(buf)
	return l, err
}

// SetReservationPersistence sends Set Features Reservation Persistence
// (83h) for the namespace: Persist Through Power Loss on or off.
func (ns *Namespace) SetReservationPersistence(ctx context.Context, ptpl bool) error {
	a, err := ns.c.waitLive(ctx)
	if err != nil {
		return err
	}
	var v uint32
	if ptpl {
		v = 1
	}
	var cmd nvme.Command
	setFeaturesCmd(&cmd, nvme.FeatureResvPersist, v)
	cmd.NSID = ns.id
	_, err = a.admin.exec(ctx, &cmd, nil, nil, a.c.cfg.AdminTimeout)
	return err
}
