package target_test

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/nvme/resv"
	"github.com/blk-project/blk/target"
)

// The reservation verbs of the transcripts (testdata/reservations.txt):
//
//	resv-register q= [nsid=1] [crkey=] [nrkey=] [rrega=] [iekey] [cptpl=] [disnsrs] [len=16] [hold]
//	resv-acquire q= [nsid=1] [crkey=] [prkey=] [rtype=] [racqa=] [iekey] [len=16] [hold]
//	resv-release q= [nsid=1] [crkey=] [rtype=] [rrela=] [iekey] [len=8] [hold]
//	                (hold: print "held" if the keeper has not answered; its
//	                completion prints as an event later)
//	resv-report q= [nsid=1] [eds] [len=4096]      prints the header and each registrant
//	resv-log q= [rae] [len=64] [off=]             Get Log Page 80h, decoded
//	resv-hostid q= [exhid] [sel=] [len=16]        Get Features 81h (with data)
//	resv-get-feature q= fid= [nsid=] [sel=]       Get Features with an NSID
//	resv-set-feature q= fid= [nsid=] [value=] [sv]
//	resv-keeper nqn= [nsid=1] local|manual|none   Subsystem.SetReservations, no state
//	resv-complete status= [err]                   the manual keeper completes its oldest IO
//	                                              (err: with an error carrying the status)
//	resv-publish nqn= [nsid=1] index= [gen=] [type=] [holder=HEX] [regs=HEX:KEY,...] [ptpl]
//	resv-state nqn= [nsid=1]                      the published state
//	resv-stats                                    Stats' reservation counters
//
// Host identifiers are given as hex, zero-padded on the right to 16
// bytes (a = 0a000000..., as connect's hostid=).
func (tr *transcript) runResv(verb string, a *args) ([]string, bool) {
	switch verb {
	case "resv-register", "resv-acquire", "resv-release":
		return tr.resvCmd(verb, a), true
	case "resv-report":
		return tr.resvReport(a), true
	case "resv-log":
		return tr.resvLog(a), true
	case "resv-hostid":
		cmd := getFeatCmd(0x81, uint8(a.num("sel", 0)))
		if a.has("exhid") {
			cmd.CDW11 = 1
		}
		c := tr.harness().exec(tr.queue(a), cmd, make([]byte, a.num("len", 16)))
		out := []string{fmtRsp(c.rsp)}
		if c.rsp.Status.Success() {
			out = append(out, "hostid="+hex.EncodeToString(c.data))
		}
		return out, true
	case "resv-get-feature":
		cmd := getFeatCmd(uint8(a.num("fid", 0)), uint8(a.num("sel", 0)))
		cmd.NSID = uint32(a.num("nsid", 1))
		return []string{fmtRsp(tr.harness().exec(tr.queue(a), cmd, nil).rsp)}, true
	case "resv-set-feature":
		cmd := setFeatCmd(uint8(a.num("fid", 0)), uint32(a.num("value", 0)))
		cmd.NSID = uint32(a.num("nsid", 1))
		if a.has("sv") {
			cmd.CDW10 |= 1 << 31
		}
		return []string{fmtRsp(tr.harness().exec(tr.queue(a), cmd, nil).rsp)}, true
	case "resv-keeper":
		var k target.ReservationKeeper
		switch {
		case a.has("local"):
			k = target.LocalReservations()
		case a.has("manual"):
			mk := &manualKeeper{}
			manualKeepers.Store(tr, mk)
			k = mk
		}
		a.used["none"] = true
		return []string{errLine(tr.subsystem(a).SetReservations(uint32(a.num("nsid", 1)), k, nil))}, true
	case "resv-complete":
		v, ok := manualKeepers.Load(tr)
		if !ok {
			tr.fatalf("no manual keeper")
		}
		st, err := parseStatus(a.must("status"))
		if err != nil {
			tr.fatalf("status: %v", err)
		}
		return []string{v.(*manualKeeper).complete(st, a.has("err"))}, true
	case "resv-publish":
		st := &resv.State{Index: a.num("index", 0), Gen: uint32(a.num("gen", 0)), Type: resv.Type(a.num("type", 0)),
			Holder: tr.hostID(a.str("holder", "")), PTPL: a.has("ptpl")}
		for _, e := range strings.Split(a.str("regs", ""), ",") {
			if e == "" {
				continue
			}
			h, k, _ := strings.Cut(e, ":")
			key, _ := strconv.ParseUint(k, 0, 64)
			st.Regs = append(st.Regs, resv.Registrant{Host: tr.hostID(h), Key: key})
		}
		return []string{errLine(tr.subsystem(a).PublishReservation(uint32(a.num("nsid", 1)), st))}, true
	case "resv-state":
		st, ok := tr.subsystem(a).Reservation(uint32(a.num("nsid", 1)))
		if !ok {
			return []string{"state=none"}, true
		}
		return []string{fmtResvState(&st)}, true
	case "resv-stats":
		st := tr.harness().tgt.Stats()
		var ops []string
		for i, n := range st.ReservationCommands {
			ops = append(ops, fmt.Sprintf("%v=%d", target.ResvOp(i), n))
		}
		return []string{fmt.Sprintf("%s conflicts=%d at-keeper=%d", strings.Join(ops, " "), st.ReservationConflicts, st.AtKeeper)}, true
	}
	return nil, false
}

// hostID reads a host identifier in hex, zero-padded on the right.
func (tr *transcript) hostID(s string) resv.HostID {
	var h resv.HostID
	if s == "" {
		return h
	}
	b, err := hex.DecodeString(s)
	if err != nil || len(b) > 16 {
		tr.fatalf("host ID %q", s)
	}
	copy(h[:], b)
	return h
}

// resvCmd sends Register, Acquire or Release.
func (tr *transcript) resvCmd(verb string, a *args) []string {
	op, action, n := nvme.IOReservationRegister, a.num("rrega", 0), uint64(16)
	switch verb {
	case "resv-acquire":
		op, action = nvme.IOReservationAcquire, a.num("racqa", 0)
	case "resv-release":
		op, action, n = nvme.IOReservationRelease, a.num("rrela", 0), 8
	}
	cmd := nvme.Command{Opcode: uint8(op), Flags: nvme.FlagSGLMetaBuf, NSID: uint32(a.num("nsid", 1))}
	cmd.SetResv(uint8(action), a.has("iekey"), uint8(a.num("rtype", 0)), uint8(a.num("cptpl", 0)))
	if a.has("disnsrs") {
		cmd.CDW10 |= nvme.ResvDISNSRS
	}
	data := make([]byte, a.num("len", n))
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:], a.num("crkey", 0))
	binary.LittleEndian.PutUint64(b[8:], a.num("nrkey", a.num("prkey", 0)))
	copy(data, b[:])
	if a.has("hold") {
		if c, done := tr.harness().execMayHold(tr.queue(a), cmd, data); done {
			return []string{fmtRsp(c.rsp)}
		}
		return []string{"held"}
	}
	// Waited for, however it completes (a preempt-and-abort of the local
	// keeper completes on a goroutine of its own).
	return []string{fmtRsp(tr.harness().exec(tr.queue(a), cmd, data).rsp)}
}

// resvReport sends Report and prints what it returned.
func (tr *transcript) resvReport(a *args) []string {
	n := a.num("len", 4096)
	cmd := nvme.Command{Opcode: uint8(nvme.IOReservationReport), Flags: nvme.FlagSGLMetaBuf, NSID: uint32(a.num("nsid", 1)),
		CDW10: uint32(n/4 - 1)}
	if a.has("eds") {
		cmd.CDW11 = nvme.ResvReportEDS
	}
	c := tr.harness().exec(tr.queue(a), cmd, make([]byte, n))
	out := []string{fmtRsp(c.rsp)}
	if !c.rsp.Status.Success() {
		return out
	}
	d := c.data
	le := binary.LittleEndian
	if len(d) < 64 {
		return append(out, "data="+summarize(d))
	}
	regctl := int(le.Uint16(d[5:]))
	out = append(out, fmt.Sprintf("gen=%d rtype=%d regctl=%d ptpls=%d", le.Uint32(d[0:]), d[4], regctl, d[9]))
	for i := 0; i < regctl && 64+(i+1)*64 <= len(d); i++ {
		e := d[64+i*64:]
		out = append(out, fmt.Sprintf("reg cntlid=%#x rcsts=%d hostid=%s rkey=%#x", le.Uint16(e[0:]), e[2],
			strings.TrimRight(hex.EncodeToString(e[16:32]), "0"), le.Uint64(e[8:])))
	}
	return out
}

// resvLog reads log page 80h.
func (tr *transcript) resvLog(a *args) []string {
	n := uint32(a.num("len", 64))
	c := tr.harness().exec(tr.queue(a), getLogCmd(nvme.LogResvNotification, 0, max(n, 4), a.num("off", 0), a.has("rae")),
		make([]byte, n))
	out := []string{fmtRsp(c.rsp)}
	if !c.rsp.Status.Success() {
		return out
	}
	var l nvme.ResvNotifLog
	if err := l.Unmarshal(c.data); err != nil {
		return append(out, "data="+summarize(c.data))
	}
	return append(out, fmt.Sprintf("count=%d type=%d avail=%d nsid=%d", l.Count, l.Type, l.Available, l.NSID))
}

// fmtResvState prints a state: gen, type, holder, registrants, PTPL,
// index.
func fmtResvState(st *resv.State) string {
	var regs []string
	for _, r := range st.Regs {
		regs = append(regs, fmt.Sprintf("%s:%#x", strings.TrimRight(r.Host.String(), "0"), r.Key))
	}
	return fmt.Sprintf("gen=%d type=%v holder=%s regs=%s ptpl=%v index=%d", st.Gen, st.Type,
		strings.TrimRight(st.Holder.String(), "0"), strings.Join(regs, ","), st.PTPL, st.Index)
}

// manualKeepers are the transcripts' manual keepers, by transcript.
var manualKeepers sync.Map

// manualKeeper holds every IO until the transcript completes it
// (resv-complete): the command waits at the keeper meanwhile.
type manualKeeper struct {
	mu  sync.Mutex
	ios []*target.IO
}

func (k *manualKeeper) Submit(io *target.IO) {
	k.mu.Lock()
	k.ios = append(k.ios, io)
	k.mu.Unlock()
}

// complete completes the oldest IO with status st (as an error carrying
// it, if asErr: the keeper could not answer) and prints what it was.
func (k *manualKeeper) complete(st nvme.Status, asErr bool) string {
	k.mu.Lock()
	if len(k.ios) == 0 {
		k.mu.Unlock()
		return "none pending"
	}
	io := k.ios[0]
	k.ios = k.ios[1:]
	k.mu.Unlock()
	what := fmt.Sprintf("completed %v action=%d nsid=%d", io.Resv.Op, io.Resv.Action, io.NSID())
	if asErr {
		io.Done(target.WithStatus(errors.New("no leader"), st))
		return what
	}
	io.ResvStatus = st
	io.Done(nil)
	return what
}
