package target_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/target"
)

// Transcript tests: testdata/*.txt are exchanges between a host and the
// target, one command per line, each followed by the lines it must print:
//
//	# comment
//	connect q=admin sqsize=31 kato=5000 host=$H sub=$S
//	-> status=ok dw0=0x1
//
// The verbs are the methods of transcript below (doc comment on run).
// Asynchronous things (completions of held AERs, Responder.Disconnect
// calls) print after the command during which they happened, as
// "-> [queue cid=N] ..." and "-> disconnect queue: reason".
//
// go test ./target -run Transcripts -rewrite rewrites the expected lines
// from what the target does now; review the diff.

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata transcripts")

func TestTranscripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			runTranscript(t, f)
		})
	}
}

type transcript struct {
	t    *testing.T
	path string
	line int

	opts     []func(*target.Config)
	h        *harness
	vars     map[string]string
	backends map[string]*target.MemBackend
	limits   map[string]*target.Limits // named by the limits verb
	admits   map[string]*admission     // by subsystem NQN, for SubsystemConfig.Admit
	remote   []target.RemoteSubsystem  // what the remote verb last set
}

// admission is a transcript subsystem's Admit: hosts in ok are
// admitted, hosts in later refused with ErrAdmitRetry (no DNR), every
// other host refused for good (DNR) — as blkd admits the primary at the
// fence's epoch, a newer epoch later, an older never.
type admission struct {
	mu        sync.Mutex
	ok, later map[string]bool
}

func (ad *admission) set(a *args, okKey, laterKey string) {
	ad.mu.Lock()
	defer ad.mu.Unlock()
	ad.ok, ad.later = map[string]bool{}, map[string]bool{}
	for _, h := range strings.Split(a.str(okKey, ""), ",") {
		ad.ok[a.tr.expand(h)] = h != ""
	}
	for _, h := range strings.Split(a.str(laterKey, ""), ",") {
		ad.later[a.tr.expand(h)] = h != ""
	}
}

func (ad *admission) admit(host string) error {
	ad.mu.Lock()
	defer ad.mu.Unlock()
	switch {
	case ad.ok[host]:
		return nil
	case ad.later[host]:
		return fmt.Errorf("epoch ahead of the fence: %w", target.ErrAdmitRetry)
	}
	return errors.New("stale epoch")
}

// expand returns $NAME's value, or s itself.
func (tr *transcript) expand(s string) string {
	if strings.HasPrefix(s, "$") {
		return tr.vars[s[1:]]
	}
	return s
}

func runTranscript(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	tr := &transcript{t: t, path: path, vars: map[string]string{}, backends: map[string]*target.MemBackend{},
		limits: map[string]*target.Limits{}, admits: map[string]*admission{}}
	var out []string
	for i := 0; i < len(lines); {
		l := lines[i]
		trim := strings.TrimSpace(l)
		if trim == "" || strings.HasPrefix(trim, "#") {
			out = append(out, l)
			i++
			continue
		}
		if strings.HasPrefix(trim, "->") {
			t.Errorf("%s:%d: output line without a command", path, i+1)
			i++
			continue
		}
		tr.line = i + 1
		var want []string
		j := i + 1
		for ; j < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[j]), "->"); j++ {
			want = append(want, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(lines[j]), "->")))
		}
		got := tr.run(trim)
		if tr.h != nil {
			got = append(got, tr.h.takeEvents()...)
		}
		out = append(out, l)
		for _, g := range got {
			out = append(out, "-> "+g)
		}
		if !*rewrite && !slices.Equal(got, want) {
			t.Errorf("%s:%d: %s\n got:\n  -> %s\nwant:\n  -> %s", path, i+1, trim,
				strings.Join(got, "\n  -> "), strings.Join(want, "\n  -> "))
		}
		i = j
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.Join(out, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// args are a command's key=value pairs and bare flags.
type args struct {
	tr   *transcript
	kv   map[string]string
	used map[string]bool
}

func (a *args) has(k string) bool {
	a.used[k] = true
	_, ok := a.kv[k]
	return ok
}

func (a *args) str(k, def string) string {
	a.used[k] = true
	if v, ok := a.kv[k]; ok {
		return v
	}
	return def
}

func (a *args) num(k string, def uint64) uint64 {
	a.used[k] = true
	v, ok := a.kv[k]
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 0, 64)
	if err != nil {
		a.tr.fatalf("%s=%q: %v", k, v, err)
	}
	return n
}

func (a *args) must(k string) string {
	a.used[k] = true
	v, ok := a.kv[k]
	if !ok {
		a.tr.fatalf("missing %s=", k)
	}
	return v
}

func (tr *transcript) fatalf(format string, args ...any) {
	tr.t.Helper()
	tr.t.Fatalf("%s:%d: %s", tr.path, tr.line, fmt.Sprintf(format, args...))
}

func (tr *transcript) parse(fields []string) *args {
	a := &args{tr: tr, kv: map[string]string{}, used: map[string]bool{}}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		if strings.HasPrefix(v, "$") {
			val, ok := tr.vars[v[1:]]
			if !ok {
				tr.fatalf("undefined variable %s", v)
			}
			v = val
		}
		a.kv[k] = v
	}
	return a
}

func (tr *transcript) harness() *harness {
	if tr.h == nil {
		tr.h = newHarness(tr.t, tr.opts...)
	}
	return tr.h
}

func (tr *transcript) queue(a *args) *tq {
	name := a.must("q")
	h := tr.harness()
	h.mu.Lock()
	q := h.queues[name]
	h.mu.Unlock()
	if q == nil {
		tr.fatalf("no queue %q", name)
	}
	return q
}

// run executes one command line and returns what it prints. Verbs:
//
//	let NAME=value                        define $NAME
//	target maxio= mqes= admq= incapsule= maxxfer= keyed= maxctrl= errlog= maxdisc= discsrc= discidle= cntlidmin= cntlidmax= [nolimits]
//	limits name= maxio= mqes= admq= incapsule= maxxfer= keyed=
//	port id= trtype= adrfam= traddr= trsvcid= [treq=] [advaddr=] [advsvc=] [sectype=] [limits=]
//	rm-port id=
//	subsystem nqn= [serial=] [model=] [any] [hosts=a,b] [ana] [ana-state=] [admit=a,b [later=c]]
//	ana nqn= state=optimized|non-optimized|inaccessible|persistent-loss|change|N
//	admit nqn= hosts=a,b [later=c]        change what Admit admits
//	refuse nqn= [why=text [retry]]        Refuse(why) (none: nil); prints the hosts connected
//	paths nqn= set=id/trtype/addr/svc,... SetPaths (IPv4), set= empty: none
//	remote nqn= [any] [hosts=a,b] [treq=] paths=id/trtype/addr/svc,...   add or replace a remote subsystem; SetRemoteSubsystems
//	remote nqn= drop  |  remote same      remove one  |  set the same list again
//	rm-subsystem nqn=
//	allow nqn= host= | deny nqn= host= | allow-any nqn= on|off
//	namespace nqn= nsid= [blocks=] [bs=] [ro] [resv]   (resv: LocalReservations)
//	resize nqn= nsid= blocks=  |  rm-namespace nqn= nsid=
//	queue name= [qid=] [sqsize=] [laddr=] [lport=] [trtype=] [limits=] [raddr=host:port]
//	close q=
//	connect q= host= sub= [qid=] [sqsize=] [kato=] [cntlid=] [hostid=] [recfmt=] [len=] [cattr=]
//	prop-get q= reg= [size=]   |  prop-set q= reg= value= [size=]
//	poll-csts q= want=
//	identify q= cns= [nsid=] [len=] [show=F,F]
//	get-features q= fid= [sel=] [cdw11=] [nsid=]  |  set-features q= fid= value= [sv]
//	get-log q= lid= [nsid=] [len=] [off=] [rae] [csi=] [lsp=] [show=F,F]
//	aer q=  |  keep-alive q=  |  advance d=
//	read q= nsid= slba= blocks= [bs=] [len=]
//	write q= nsid= slba= blocks= [fill=] [fua] [len=]
//	compare q= nsid= slba= blocks= [fill=]
//	flush q= [nsid=]  |  write-zeroes q= nsid= slba= blocks= [deac] [fua]
//	dsm q= nsid= ranges=slba:n,... [ad] [len=]
//	raw q= opc= [fctype=] [nsid=] [flags=] [cdw10..15=] [len=]
//	ns-stats nqn= nsid=
//	budget                                the controller budget's counters
//	resv-*                                reservations: resv_transcript_test.go
func (tr *transcript) run(line string) []string {
	fields := strings.Fields(line)
	verb := fields[0]
	a := tr.parse(fields[1:])
	var out []string
	switch verb {
	case "let":
		for k, v := range a.kv {
			tr.vars[k] = v
			a.used[k] = true
		}
	case "target":
		if tr.h != nil {
			tr.fatalf("target must come before anything else")
		}
		l := tr.parseLimits(a)
		if a.has("nolimits") {
			l = target.Limits{}
		}
		maxctrl := int(a.num("maxctrl", 0))
		errlog := int(a.num("errlog", 0))
		maxdisc, discsrc := int(a.num("maxdisc", 0)), int(a.num("discsrc", 0))
		cntlidMin, cntlidMax := uint16(a.num("cntlidmin", 0)), uint16(a.num("cntlidmax", 0))
		discidle, err := time.ParseDuration(a.str("discidle", "0s"))
		if err != nil {
			tr.fatalf("discidle: %v", err)
		}
		tr.opts = append(tr.opts, func(c *target.Config) {
			c.Limits = l
			c.MaxControllers = maxctrl
			c.ErrorLogEntries = errlog
			c.MaxDiscoveryControllers = maxdisc
			c.MaxDiscoveryPerSource = discsrc
			c.DiscoveryIdleTimeout = discidle
			c.CNTLIDMin, c.CNTLIDMax = cntlidMin, cntlidMax
		})
	case "limits":
		l := tr.parseLimits(a)
		tr.limits[a.must("name")] = &l
	case "port":
		p := target.Port{ID: uint16(a.num("id", 1)), TrType: uint8(a.num("trtype", uint64(nvme.TrTypeRDMA))),
			AdrFam: uint8(a.num("adrfam", uint64(nvme.AdrFamIPv4))), TrAddr: a.str("traddr", ""),
			TrSvcID: a.str("trsvcid", "4420"), TReq: uint8(a.num("treq", 0)),
			AdvertiseAddr: a.str("advaddr", ""), AdvertiseSvcID: a.str("advsvc", ""),
			TCP: nvme.TCPTSAS{SecType: uint8(a.num("sectype", 0))}, Limits: tr.namedLimits(a),
			DiscoveryOnly: a.has("discovery-only")}
		out = append(out, errLine(tr.harness().tgt.AddPort(p)))
	case "rm-port":
		out = append(out, errLine(tr.harness().tgt.RemovePort(uint16(a.num("id", 1)))))
	case "subsystem":
		c := target.SubsystemConfig{NQN: a.must("nqn"), Serial: a.str("serial", ""), Model: a.str("model", ""),
			AllowAnyHost: a.has("any"), ANA: a.has("ana"), ANAState: tr.anaState(a.str("ana-state", "0"))}
		if a.has("admit") {
			ad := &admission{}
			ad.set(a, "admit", "later")
			tr.admits[c.NQN] = ad
			c.Admit = ad.admit
		}
		if hs := a.str("hosts", ""); hs != "" {
			for _, h := range strings.Split(hs, ",") {
				if strings.HasPrefix(h, "$") {
					h = tr.vars[h[1:]]
				}
				c.Hosts = append(c.Hosts, h)
			}
		}
		_, err := tr.harness().tgt.AddSubsystem(c)
		out = append(out, errLine(err))
	case "ana":
		out = append(out, errLine(tr.subsystem(a).SetANAState(tr.anaState(a.must("state")))))
	case "paths":
		out = append(out, errLine(tr.subsystem(a).SetPaths(tr.parsePaths(a.str("set", "")))))
	case "remote":
		out = append(out, tr.setRemote(a)...)
	case "admit":
		ad := tr.admits[tr.subsystem(a).NQN()]
		if ad == nil {
			tr.fatalf("subsystem has no Admit")
		}
		ad.set(a, "hosts", "later")
	case "refuse":
		var why error
		if a.has("why") {
			why = errors.New(strings.ReplaceAll(a.must("why"), "_", " "))
			if a.has("retry") {
				why = fmt.Errorf("%w: %w", why, target.ErrAdmitRetry)
			}
		}
		out = append(out, "connected="+strings.Join(tr.subsystem(a).Refuse(why), ","))
	case "rm-subsystem":
		out = append(out, errLine(tr.harness().tgt.RemoveSubsystem(a.must("nqn"))))
	case "allow", "deny", "allow-any":
		s := tr.subsystem(a)
		var err error
		switch verb {
		case "allow":
			err = s.AllowHost(a.must("host"))
		case "deny":
			err = s.DenyHost(a.must("host"))
		default:
			s.SetAllowAnyHost(a.has("on"))
			a.used["off"] = true
		}
		out = append(out, errLine(err))
	case "namespace":
		s := tr.subsystem(a)
		nsid := uint32(a.num("nsid", 1))
		m, err := target.NewMemBackend(uint32(a.num("bs", 4096)), a.num("blocks", 1024))
		if err != nil {
			tr.fatalf("%v", err)
		}
		m.SetReadOnly(a.has("ro"))
		tr.backends[fmt.Sprintf("%s/%d", s.NQN(), nsid)] = m
		nc := target.NamespaceConfig{NSID: nsid, Backend: m}
		if a.has("resv") {
			nc.Reservations = target.LocalReservations() // resv_transcript_test.go
		}
		out = append(out, errLine(s.AddNamespace(nc)))
	case "resize":
		s := tr.subsystem(a)
		m := tr.backends[fmt.Sprintf("%s/%d", s.NQN(), a.num("nsid", 1))]
		m.Resize(a.num("blocks", 0))
	case "rm-namespace":
		out = append(out, errLine(tr.subsystem(a).RemoveNamespace(uint32(a.num("nsid", 1)))))
	case "queue":
		p := target.QueueParams{QID: uint16(a.num("qid", 0)), SQSize: uint16(a.num("sqsize", 31)),
			LocalAddr: a.str("laddr", ""), LocalPort: a.str("lport", ""), Transport: uint8(a.num("trtype", 0)),
			RemoteAddr: a.str("raddr", "10.0.0.99:50000"), Limits: tr.namedLimits(a)}
		if _, err := tr.harness().newQueue(a.must("name"), p); err != nil {
			out = append(out, errLine(err))
		}
	case "close":
		tr.queue(a).q.Close()
	case "connect":
		q := tr.queue(a)
		p := q.q.Params()
		cmd := connectCmd(uint16(a.num("qid", uint64(p.QID))), uint16(a.num("sqsize", uint64(p.SQSize))),
			uint32(a.num("kato", 0)))
		cmd.CDW10 |= uint32(a.num("recfmt", 0))
		cmd.CDW11 |= uint32(a.num("cattr", 0)) << 16
		var hostID [16]byte = hostIDA
		if s := a.str("hostid", ""); s != "" {
			b, _ := hex.DecodeString(s)
			copy(hostID[:], b)
		}
		data := connectData(a.must("host"), a.must("sub"), uint16(a.num("cntlid", 0xFFFF)), hostID)
		data = data[:a.num("len", nvme.ConnectDataSize)]
		out = append(out, fmtRsp(tr.harness().exec(q, cmd, data).rsp))
	case "prop-get", "prop-set":
		q := tr.queue(a)
		off, size8 := tr.register(a)
		var cmd nvme.Command
		if verb == "prop-get" {
			cmd = propGet(off, size8)
		} else {
			cmd = propSet(off, a.num("value", 0))
			if size8 {
				cmd.CDW10 = 1
			}
		}
		if a.has("attrib") {
			cmd.CDW10 = uint32(a.num("attrib", 0))
		}
		out = append(out, fmtRsp(tr.harness().exec(q, cmd, nil).rsp))
	case "poll-csts":
		q := tr.queue(a)
		want := uint32(a.num("want", 1))
		deadline := time.Now().Add(10 * time.Second)
		var got uint32
		for {
			got = tr.harness().exec(q, propGet(nvme.PropCSTS, false), nil).dw0()
			if got == want || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		out = append(out, fmt.Sprintf("csts=%#x", got))
	case "identify":
		q := tr.queue(a)
		cmd := identifyCmd(uint8(a.num("cns", 1)), uint32(a.num("nsid", 0)))
		c := tr.harness().exec(q, cmd, make([]byte, a.num("len", nvme.IdentifySize)))
		out = append(out, fmtRsp(c.rsp))
		if show := a.str("show", ""); show != "" && c.rsp.Status.Success() {
			out = append(out, showIdentify(tr, uint8(a.num("cns", 1)), c.data, show))
		}
	case "get-features":
		cmd := getFeatCmd(uint8(a.num("fid", 0)), uint8(a.num("sel", 0)))
		cmd.CDW11, cmd.NSID = uint32(a.num("cdw11", 0)), uint32(a.num("nsid", 0))
		c := tr.harness().exec(tr.queue(a), cmd, nil)
		out = append(out, fmtRsp(c.rsp))
	case "set-features":
		cmd := setFeatCmd(uint8(a.num("fid", 0)), uint32(a.num("value", 0)))
		if a.has("sv") {
			cmd.CDW10 |= 1 << 31
		}
		out = append(out, fmtRsp(tr.harness().exec(tr.queue(a), cmd, nil).rsp))
	case "get-log":
		q := tr.queue(a)
		lid := uint8(a.num("lid", 0))
		n := uint32(a.num("len", 4096))
		off := a.num("off", 0)
		cmd := getLogCmd(lid, uint32(a.num("nsid", 0)), max(n, 4), off, a.has("rae"))
		cmd.CDW14 |= uint32(a.num("csi", 0)) << 24
		cmd.CDW10 |= uint32(a.num("lsp", 0)&0x7F) << 8
		c := tr.harness().exec(q, cmd, make([]byte, n))
		out = append(out, fmtRsp(c.rsp))
		if show := a.str("show", ""); show != "" && c.rsp.Status.Success() {
			out = append(out, showLog(tr, lid, off, c.data, show)...)
		}
	case "aer":
		cmd := adminCmd(nvme.AdminAsyncEvent)
		cmd.CID = uint16(a.num("cid", 0))
		c, done := tr.harness().execMayHold(tr.queue(a), cmd, nil)
		if done {
			out = append(out, fmtRsp(c.rsp))
		} else {
			out = append(out, "held")
		}
	case "keep-alive":
		out = append(out, fmtRsp(tr.harness().exec(tr.queue(a), adminCmd(nvme.AdminKeepAlive), nil).rsp))
	case "advance":
		d, err := time.ParseDuration(a.must("d"))
		if err != nil {
			tr.fatalf("%v", err)
		}
		tr.harness().clock.Advance(d)
	case "read", "write", "compare", "write-zeroes":
		out = append(out, tr.io(verb, a)...)
	case "flush":
		cmd := nvme.Command{Opcode: uint8(nvme.IOFlush), Flags: nvme.FlagSGLMetaBuf, NSID: uint32(a.num("nsid", 1))}
		out = append(out, fmtRsp(tr.harness().exec(tr.queue(a), cmd, nil).rsp))
	case "dsm":
		out = append(out, tr.dsm(a))
	case "fused", "fused-stats":
		out = append(out, tr.fused(verb, a)...) // fused_test.go
	case "raw":
		cmd := nvme.Command{Opcode: uint8(a.num("opc", 0)), Flags: uint8(a.num("flags", uint64(nvme.FlagSGLMetaBuf))),
			NSID: uint32(a.num("nsid", 0))}
		if a.has("fctype") {
			cmd.NSID = uint32(a.num("fctype", 0))
		}
		for i, p := range []*uint32{&cmd.CDW10, &cmd.CDW11, &cmd.CDW12, &cmd.CDW13, &cmd.CDW14, &cmd.CDW15} {
			*p = uint32(a.num(fmt.Sprintf("cdw%d", 10+i), 0))
		}
		c, done := tr.harness().execMayHold(tr.queue(a), cmd, make([]byte, a.num("len", 0)))
		if !done {
			c.wait(tr.t)
			c.mu.Lock()
			c.async = false
			c.mu.Unlock()
		}
		out = append(out, fmtRsp(c.rsp))
	case "budget":
		st := tr.harness().tgt.Stats()
		out = append(out, fmt.Sprintf("controllers=%d discovery=%d busy-controllers=%d busy-discovery=%d busy-source=%d discovery-idle=%d",
			st.Controllers, st.DiscoveryControllers, st.BusyControllers, st.BusyDiscovery, st.BusyDiscoverySource, st.DiscoveryIdle))
	case "ns-stats":
		s := tr.subsystem(a)
		nsid := uint32(a.num("nsid", 1))
		for _, n := range tr.harness().tgt.Stats().Namespaces {
			if n.Subsystem == s.NQN() && n.NSID == nsid {
				out = append(out, fmt.Sprintf("reads=%d writes=%d fua=%d compares=%d flushes=%d wz=%d dealloc=%d rbytes=%d wbytes=%d dblocks=%d errors=%d",
					n.Reads, n.Writes, n.FUAWrites, n.Compares, n.Flushes, n.WriteZeroes, n.Deallocates,
					n.ReadBytes, n.WriteBytes, n.DeallocatedBlocks, n.Errors))
			}
		}
	default:
		var ok bool
		if out, ok = tr.runResv(verb, a); !ok { // resv_transcript_test.go
			tr.fatalf("unknown verb %q", verb)
		}
	}
	for k := range a.kv {
		if !a.used[k] {
			tr.fatalf("%s: unknown argument %q", verb, k)
		}
	}
	return out
}

// anaState reads an ANA state by name or number.
func (tr *transcript) anaState(v string) nvme.ANAState {
	for s := nvme.ANAState(1); s != 0; s++ {
		if s.Valid() && s.String() == v {
			return s
		}
	}
	n, err := strconv.ParseUint(v, 0, 8)
	if err != nil {
		tr.fatalf("ANA state %q", v)
	}
	return nvme.ANAState(n)
}

// parseLimits reads limits: testLimits, changed by maxio=, mqes=, admq=,
// incapsule=, maxxfer= and keyed=.
func (tr *transcript) parseLimits(a *args) target.Limits {
	l := testLimits()
	l.MaxIOQueues = uint16(a.num("maxio", uint64(l.MaxIOQueues)))
	l.MaxQueueEntries = uint32(a.num("mqes", uint64(l.MaxQueueEntries)))
	l.AdminQueueEntries = uint32(a.num("admq", uint64(l.AdminQueueEntries)))
	l.InCapsule = uint32(a.num("incapsule", uint64(l.InCapsule)))
	l.MaxTransfer = uint32(a.num("maxxfer", uint64(l.MaxTransfer)))
	l.KeyedSGL = a.num("keyed", 1) != 0
	return l
}

// namedLimits returns the limits limits= names (nil if none).
func (tr *transcript) namedLimits(a *args) *target.Limits {
	name := a.str("limits", "")
	if name == "" {
		return nil
	}
	l, ok := tr.limits[name]
	if !ok {
		tr.fatalf("no limits %q", name)
	}
	return l
}

func errLine(err error) string {
	if err == nil {
		return "ok"
	}
	return "error: " + err.Error()
}

func (tr *transcript) subsystem(a *args) *target.Subsystem {
	s, ok := tr.harness().tgt.Subsystem(a.must("nqn"))
	if !ok {
		tr.fatalf("no subsystem %s", a.kv["nqn"])
	}
	return s
}

// register reads reg= (a name or an offset) and size= (4 or 8; CAP
// defaults to 8).
func (tr *transcript) register(a *args) (uint32, bool) {
	var off uint32
	size := uint64(4)
	switch r := a.must("reg"); r {
	case "cap":
		off, size = nvme.PropCAP, 8
	case "vs":
		off = nvme.PropVS
	case "cc":
		off = nvme.PropCC
	case "csts":
		off = nvme.PropCSTS
	case "nssr":
		off = nvme.PropNSSR
	case "crto":
		off = nvme.PropCRTO
	default:
		n, err := strconv.ParseUint(r, 0, 32)
		if err != nil {
			tr.fatalf("reg=%q", r)
		}
		off = uint32(n)
	}
	return off, a.num("size", size) == 8
}

func (tr *transcript) io(verb string, a *args) []string {
	q := tr.queue(a)
	nsid := uint32(a.num("nsid", 1))
	blocks := uint32(a.num("blocks", 1))
	bs := a.num("bs", 4096)
	n := a.num("len", uint64(blocks)*bs)
	var flags uint32
	if a.has("fua") {
		flags |= nvme.RWFUA
	}
	if a.has("deac") {
		flags |= nvme.RWDEAC
	}
	op := map[string]nvme.IOOpcode{"read": nvme.IORead, "write": nvme.IOWrite, "compare": nvme.IOCompare,
		"write-zeroes": nvme.IOWriteZeroes}[verb]
	cmd := ioCmd(op, nsid, a.num("slba", 0), blocks, flags)
	var data []byte
	if verb != "write-zeroes" {
		data = bytes.Repeat([]byte{byte(a.num("fill", 0))}, int(n))
	} else {
		data = make([]byte, a.num("len", 0))
	}
	c := tr.harness().exec(q, cmd, data)
	out := []string{fmtRsp(c.rsp)}
	if verb == "read" && c.rsp.Status.Success() {
		out = append(out, fmt.Sprintf("data=%s", summarize(c.data)))
	}
	return out
}

// summarize prints data as runs of equal bytes: "4096x00" or
// "512xab 3584x00".
func summarize(b []byte) string {
	var parts []string
	for i := 0; i < len(b); {
		j := i
		for j < len(b) && b[j] == b[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("%dx%02x", j-i, b[i]))
		i = j
	}
	return strings.Join(parts, " ")
}

func (tr *transcript) dsm(a *args) string {
	q := tr.queue(a)
	var ranges []nvme.DSMRange
	for _, r := range strings.Split(a.must("ranges"), ",") {
		s, n, _ := strings.Cut(r, ":")
		slba, _ := strconv.ParseUint(s, 0, 64)
		nlb, _ := strconv.ParseUint(n, 0, 32)
		ranges = append(ranges, nvme.DSMRange{SLBA: slba, NLB: uint32(nlb)})
	}
	data := make([]byte, a.num("len", 4096))
	for i, r := range ranges {
		if (i+1)*16 <= len(data) {
			r.Marshal((*[16]byte)(data[i*16:]))
		}
	}
	cmd := nvme.Command{Opcode: uint8(nvme.IODatasetManagement), Flags: nvme.FlagSGLMetaBuf,
		NSID: uint32(a.num("nsid", 1)), CDW10: uint32(len(ranges) - 1)}
	if a.has("ad") {
		cmd.CDW11 = nvme.DSMAD
	}
	return fmtRsp(tr.harness().exec(q, cmd, data).rsp)
}

// showFields prints the named fields of a struct: numbers in hex, ASCII
// fields trimmed, NQN fields as strings, other byte arrays in hex.
func showFields(tr *transcript, v any, names string) string {
	rv := reflect.ValueOf(v).Elem()
	var parts []string
	for _, name := range strings.Split(names, ",") {
		f := rv.FieldByNameFunc(func(s string) bool { return strings.EqualFold(s, name) })
		if !f.IsValid() {
			tr.fatalf("no field %q in %T", name, v)
		}
		var s string
		switch x := f.Interface().(type) {
		case nvme.NQNField:
			s = x.String()
		case [20]byte:
			s = strconv.Quote(nvme.TrimASCII(x[:]))
		case [40]byte:
			s = strconv.Quote(nvme.TrimASCII(x[:]))
		case [8]byte:
			s = strconv.Quote(nvme.TrimASCII(x[:]))
		case [16]byte:
			s = hex.EncodeToString(x[:])
		case nvme.Uint128:
			s = fmt.Sprintf("%#x", x.Lo)
		default:
			s = fmt.Sprintf("%#x", f.Interface())
		}
		parts = append(parts, strings.ToLower(name)+"="+s)
	}
	return strings.Join(parts, " ")
}

func showIdentify(tr *transcript, cns uint8, data []byte, show string) string {
	switch cns {
	case nvme.CNSController:
		var id nvme.IdentifyController
		_ = id.Unmarshal(data)
		return showFields(tr, &id, show)
	case nvme.CNSNamespace:
		var id nvme.IdentifyNamespace
		_ = id.Unmarshal(data)
		s := strings.ReplaceAll(show, "lbads", "")
		s = strings.Trim(strings.ReplaceAll(s, ",,", ","), ",")
		out := ""
		if s != "" {
			out = showFields(tr, &id, s)
		}
		if strings.Contains(show, "lbads") {
			out = strings.TrimSpace(out + fmt.Sprintf(" lbads=%d", id.LBAF[id.FormatIndex()].LBADS))
		}
		return out
	case nvme.CNSActiveNSList:
		var ids []string
		for i := 0; i+4 <= len(data); i += 4 {
			id := binary.LittleEndian.Uint32(data[i:])
			if id == 0 {
				break
			}
			ids = append(ids, strconv.Itoa(int(id)))
		}
		return "nsids=" + strings.Join(ids, ",")
	case nvme.CNSNSDescriptorList:
		var ds []string
		if err := nvme.WalkNSDescriptors(data, func(nidt uint8, id []byte) {
			ds = append(ds, fmt.Sprintf("%d:%s", nidt, hex.EncodeToString(id)))
		}); err != nil {
			ds = append(ds, err.Error())
		}
		return "descriptors=" + strings.Join(ds, ",")
	}
	return ""
}

func showLog(tr *transcript, lid uint8, off uint64, data []byte, show string) []string {
	switch lid {
	case nvme.LogDiscovery:
		var out []string
		if off == 0 && len(data) >= 20 {
			var h nvme.DiscoveryLogHeader
			_ = h.Unmarshal(data)
			out = append(out, fmt.Sprintf("genctr=%d numrec=%d recfmt=%d", h.GenCtr, h.NumRec, h.RecFmt))
		}
		// Whole entries inside the window.
		for e := (off + 1023) / 1024 * 1024; e >= 1024 && e+1024 <= off+uint64(len(data)); e += 1024 {
			var en nvme.DiscoveryLogEntry
			_ = en.Unmarshal(data[e-off:])
			if en.SubType == 0 {
				out = append(out, fmt.Sprintf("entry %d: zeros", e/1024-1))
				break
			}
			line := fmt.Sprintf("entry %d: subtype=%d trtype=%d adrfam=%d treq=%d portid=%d cntlid=%#x asqsz=%d eflags=%d traddr=%s trsvcid=%s subnqn=%s",
				e/1024-1, en.SubType, en.TrType, en.AdrFam, en.TReq, en.PortID, en.CNTLID, en.ASQSZ, en.EFlags,
				string(bytes.TrimRight(en.TrAddr[:], "\x00")), string(bytes.TrimRight(en.TrSvcID[:], "\x00")), en.SubNQN.String())
			switch en.TrType {
			case nvme.TrTypeRDMA:
				t := en.RDMATSAS()
				line += fmt.Sprintf(" tsas=%d/%d/%d", t.QPType, t.PrType, t.CMS)
				if t.PKey != 0 {
					line += fmt.Sprintf(" pkey=%#x", t.PKey)
				}
			case nvme.TrTypeTCP:
				line += fmt.Sprintf(" sectype=%d", en.TCPTSAS().SecType)
			}
			// Nothing but the transport's TSAS fields may be set.
			var rest nvme.DiscoveryLogEntry
			rest.TSAS = en.TSAS
			switch en.TrType {
			case nvme.TrTypeRDMA:
				rest.SetRDMATSAS(nvme.RDMATSAS{})
			case nvme.TrTypeTCP:
				rest.SetTCPTSAS(nvme.TCPTSAS{})
			}
			if rest.TSAS != ([256]byte{}) {
				line += " tsas-reserved-set"
			}
			out = append(out, line)
		}
		if len(out) == 0 {
			out = append(out, "data="+summarize(data))
		}
		return out
	case nvme.LogANA:
		if off != 0 {
			return []string{"data=" + summarize(data)}
		}
		var l nvme.ANALog
		if err := l.Unmarshal(data); err != nil {
			return []string{"error: " + err.Error(), "data=" + summarize(data)}
		}
		out := []string{fmt.Sprintf("chgcnt=%d ngrps=%d size=%d", l.ChangeCount, len(l.Groups), l.Size())}
		for _, g := range l.Groups {
			ids := make([]string, len(g.NSIDs))
			for i, id := range g.NSIDs {
				ids[i] = strconv.Itoa(int(id))
			}
			out = append(out, fmt.Sprintf("group %d: state=%v chgcnt=%d nsids=%s", g.GroupID, g.State, g.ChangeCount, strings.Join(ids, ",")))
		}
		return out
	case nvme.LogChangedNSList:
		var ids []string
		for i := 0; i+4 <= len(data); i += 4 {
			id := binary.LittleEndian.Uint32(data[i:])
			if id == 0 {
				break
			}
			ids = append(ids, fmt.Sprintf("%#x", id))
		}
		return []string{"changed=" + strings.Join(ids, ",")}
	case nvme.LogSMART:
		if off != 0 || len(data) < nvme.SMARTLogSize {
			return []string{"data=" + summarize(data)}
		}
		var s nvme.SMARTLog
		_ = s.Unmarshal(data)
		return []string{showFields(tr, &s, show)}
	case nvme.LogErrorInfo:
		var out []string
		for i := 0; i+64 <= len(data); i += 64 {
			var e nvme.ErrorLogEntry
			_ = e.Unmarshal(data[i:])
			if e.ErrorCount == 0 {
				break
			}
			out = append(out, fmt.Sprintf("error %d: sqid=%d cid=%d status=%s nsid=%#x lba=%#x",
				e.ErrorCount, e.SQID, e.CID, fmtStatus(e.Status), e.NSID, e.LBA))
		}
		return out
	case nvme.LogCommandsEffects:
		var l nvme.CommandEffectsLog
		_ = l.Unmarshal(data)
		// Each supported opcode, with its effect bits beyond CSUPP.
		effects := func(op int, v uint32) string {
			s := fmt.Sprintf("%#02x", op)
			for _, b := range []struct {
				bit  uint32
				name string
			}{{nvme.EffectsLBCC, "lbcc"}, {nvme.EffectsNCC, "ncc"}, {nvme.EffectsNIC, "nic"}, {nvme.EffectsCCC, "ccc"}} {
				if v&b.bit != 0 {
					s += "+" + b.name
				}
			}
			return s
		}
		var acs, iocs []string
		for i, v := range l.ACS {
			if v != 0 {
				acs = append(acs, effects(i, v))
			}
		}
		for i, v := range l.IOCS {
			if v != 0 {
				iocs = append(iocs, effects(i, v))
			}
		}
		return []string{"admin=" + strings.Join(acs, ","), "io=" + strings.Join(iocs, ",")}
	}
	return []string{"data=" + summarize(data)}
}

// parsePaths reads id/trtype/addr/svc,... (IPv4) as ports; "" is none.
func (tr *transcript) parsePaths(set string) []target.Port {
	var ps []target.Port
	for _, e := range strings.Split(set, ",") {
		if e == "" {
			continue
		}
		f := strings.Split(e, "/")
		if len(f) != 4 {
			tr.fatalf("path %q: want id/trtype/addr/svc", e)
		}
		id, _ := strconv.ParseUint(f[0], 0, 16)
		tt, _ := strconv.ParseUint(f[1], 0, 8)
		ps = append(ps, target.Port{ID: uint16(id), TrType: uint8(tt), AdrFam: nvme.AdrFamIPv4, TrAddr: f[2], TrSvcID: f[3]})
	}
	return ps
}

// setRemote changes the transcript's list of remote subsystems as the
// remote verb says and sets it (SetRemoteSubsystems). A refused list is
// not kept.
func (tr *transcript) setRemote(a *args) []string {
	l := slices.Clone(tr.remote)
	if !a.has("same") {
		nqn := a.must("nqn")
		l = slices.DeleteFunc(l, func(r target.RemoteSubsystem) bool { return r.NQN == nqn })
		if !a.has("drop") {
			r := target.RemoteSubsystem{NQN: nqn, AllowAny: a.has("any"), Paths: tr.parsePaths(a.str("paths", ""))}
			for i := range r.Paths {
				r.Paths[i].TReq = uint8(a.num("treq", 0))
			}
			if hs := a.str("hosts", ""); hs != "" {
				for _, h := range strings.Split(hs, ",") {
					if strings.HasPrefix(h, "$") {
						h = tr.vars[h[1:]]
					}
					r.Hosts = append(r.Hosts, h)
				}
			}
			l = append(l, r)
		}
	}
	err := tr.harness().tgt.SetRemoteSubsystems(l)
	if err == nil {
		tr.remote = l
	}
	return []string{errLine(err)}
}
