package transport

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// Unit tests of the engine against the deterministic fake provider
// (engine_fake_test.go). The integration tests against the soft provider
// are in engine_soft_test.go.

func smallConfig() EngineConfig {
	return EngineConfig{
		Cores:           2,
		QPsPerCore:      4,
		InitiatorDepth:  8,
		SRQDepth:        64,
		Buffers:         64,
		BufferSize:      128,
		RefillThreshold: 16,
		PollBatch:       8,
		Moderation:      ModerationConfig{Off: true},
	}
}

type rig struct {
	a  *fakeAdapter
	pd *fakePD
	e  *Engine
	// qpctx is a preboxed QP context, so that delivering allocates nothing.
	qpctx any
}

func newRig(t testing.TB, moderation bool, cfg EngineConfig, h Handler) *rig {
	t.Helper()
	a := newFakeAdapter(cfg.Cores, moderation)
	pd, _ := a.CreatePD()
	e, err := NewEngine(a, pd, cfg, h)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return &rig{a: a, pd: pd.(*fakePD), e: e, qpctx: "qp"}
}

func (r *rig) cq(i int) *fakeCQ   { return r.e.cores[i].cq.(*fakeCQ) }
func (r *rig) srq(i int) *fakeSRQ { return r.e.cores[i].srq.(*fakeSRQ) }

// deliver makes k messages arrive on core i: each consumes a receive from
// the SRQ, its payload is written into the buffer's registered memory and
// a receive completion is pushed. It allocates nothing.
func (r *rig) deliver(tb testing.TB, i, k int, payload func(j int) []byte) {
	c := r.e.cores[i]
	mem := c.mr.(*fakeMR).buf
	for j := 0; j < k; j++ {
		rc, ok := r.srq(i).take()
		if !ok {
			tb.Fatalf("core %d: SRQ empty after %d of %d messages", i, j, k)
		}
		n := 0
		if payload != nil {
			n = copy(mem[rc.sge.Addr-0x1000:][:rc.sge.Length], payload(j))
		}
		r.cq(i).push(Completion{Type: OpReceive, RequestContext: rc.ctx, QPContext: r.qpctx, Bytes: uint32(n)})
	}
}

func TestEngineConfigDefaults(t *testing.T) {
	info := newFakeAdapter(4, true).Info()
	c := EngineConfig{}.WithDefaults(info)
	want := EngineConfig{
		Cores: 4, QPsPerCore: DefaultQPsPerCore, InitiatorDepth: DefaultInitiatorDepth,
		InitiatorSGE: 4, // capped at the adapter's 4
		SRQDepth:     DefaultSRQDepth, Buffers: DefaultSRQDepth, BufferSize: DefaultBufferSize,
		RefillThreshold: DefaultSRQDepth / 4, PollBatch: DefaultPollBatch,
	}
	c2 := c
	c2.Moderation = ModerationConfig{}
	if fmt.Sprintf("%+v", c2) != fmt.Sprintf("%+v", want) {
		t.Errorf("defaults = %+v, want %+v", c2, want)
	}
	if got := c.CQDepth(); got != 1024+16*256 {
		t.Errorf("CQDepth = %d, want 5120", got)
	}
	if len(c.Moderation.Profile) != len(DefaultModerationProfile()) || c.Moderation.Window != DefaultModerationWindow {
		t.Errorf("moderation defaults = %+v", c.Moderation)
	}
	if err := c.ValidateFor(info); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
	// Explicit values are kept.
	c = EngineConfig{SRQDepth: 100, Buffers: 50}.WithDefaults(info)
	if c.SRQDepth != 100 || c.Buffers != 50 || c.RefillThreshold != 12 {
		t.Errorf("explicit values: %+v", c)
	}
}

func TestEngineConfigDefaultsFitSmallAdapter(t *testing.T) {
	info := newFakeAdapter(1, true).Info()
	info.MaxSrqDepth = 256
	info.MaxCqDepth = 1024
	info.MaxInitiatorQueueDepth = 64
	info.MaxTransferLength = 2048
	c := EngineConfig{}.WithDefaults(info)
	if err := c.ValidateFor(info); err != nil {
		t.Fatalf("defaults for a small adapter do not validate: %v (%+v)", err, c)
	}
	// (1024 − 256) / 64 = 12 QPs per core fit.
	if c.SRQDepth != 256 || c.InitiatorDepth != 64 || c.QPsPerCore != 12 || c.BufferSize != 2048 {
		t.Errorf("small adapter defaults: %+v", c)
	}
	if c.CQDepth() > uint64(info.MaxCqDepth) {
		t.Errorf("CQ depth %d above the adapter's %d", c.CQDepth(), info.MaxCqDepth)
	}
	// A CQ too small for the top moderation count loses those levels.
	info.MaxCqDepth = 24
	info.MaxSrqDepth = 16
	info.MaxInitiatorQueueDepth = 8
	c = EngineConfig{}.WithDefaults(info)
	for _, l := range c.Moderation.Profile {
		if uint64(l.Count) > c.CQDepth() {
			t.Errorf("profile level %v above CQ depth %d", l, c.CQDepth())
		}
	}
	if err := c.ValidateFor(info); err != nil {
		t.Errorf("tiny adapter defaults: %v (%+v)", err, c)
	}
}

func TestEngineConfigValidate(t *testing.T) {
	info := newFakeAdapter(2, true).Info()
	cases := map[string]func(c *EngineConfig){
		"cores 0":             func(c *EngineConfig) { c.Cores = -1 },
		"buffers > SRQ depth": func(c *EngineConfig) { c.Buffers = c.SRQDepth + 1 },
		"buffers 1":           func(c *EngineConfig) { c.Buffers, c.RefillThreshold = 1, 1 },
		"threshold = buffers": func(c *EngineConfig) { c.RefillThreshold = c.Buffers },
		"SRQ depth > adapter": func(c *EngineConfig) { c.SRQDepth, c.Buffers = info.MaxSrqDepth+1, 64 },
		"initiator > adapter": func(c *EngineConfig) { c.InitiatorDepth = info.MaxInitiatorQueueDepth + 1 },
		"SGE > adapter":       func(c *EngineConfig) { c.InitiatorSGE = info.MaxInitiatorRequestSge + 1 },
		"CQ depth > adapter":  func(c *EngineConfig) { c.QPsPerCore, c.InitiatorDepth = 1000, 1000 },
		"CQ depth > 32 bits":  func(c *EngineConfig) { c.QPsPerCore, c.InitiatorDepth = 1<<20, 1<<20 },
		"pool > registration": func(c *EngineConfig) { c.BufferSize = 1 << 30 },
		"moderation count > CQ": func(c *EngineConfig) {
			c.Moderation.Off = false
			c.Moderation.Profile = []ModerationLevel{{}, {8, 1 << 20}}
		},
		"moderation level 0 on":   func(c *EngineConfig) { c.Moderation.Off = false; c.Moderation.Profile = []ModerationLevel{{8, 4}} },
		"poll batch 0 (explicit)": func(c *EngineConfig) { c.PollBatch = 0 },
	}
	for name, mutate := range cases {
		c := smallConfig().WithDefaults(info)
		mutate(&c)
		if name == "poll batch 0 (explicit)" {
			if err := c.Validate(); !errors.Is(err, ErrInvalidParameter) {
				t.Errorf("%s: Validate = %v", name, err)
			}
			continue
		}
		if err := c.ValidateFor(info); !errors.Is(err, ErrInvalidParameter) {
			t.Errorf("%s: ValidateFor = %v, want ErrInvalidParameter", name, err)
		}
	}
	// NewEngine refuses the same, and a missing handler.
	a := newFakeAdapter(2, true)
	pd, _ := a.CreatePD()
	bad := smallConfig()
	bad.Buffers = bad.SRQDepth + 1
	if _, err := NewEngine(a, pd, bad, HandlerFunc(func(*Core, *Completion) {})); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("NewEngine(bad config) = %v", err)
	}
	if _, err := NewEngine(a, pd, smallConfig(), nil); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("NewEngine(nil handler) = %v", err)
	}
}

func TestEngineBuildsPerCoreObjects(t *testing.T) {
	cfg := smallConfig()
	cfg.Cores = 3
	r := newRig(t, false, cfg, HandlerFunc(func(*Core, *Completion) {}))
	if len(r.e.Cores()) != 3 {
		t.Fatalf("cores = %d", len(r.e.Cores()))
	}
	wantDepth := uint32(r.e.Config().CQDepth())
	for i, c := range r.e.Cores() {
		cq, srq := r.cq(i), r.srq(i)
		// The fake adapter reports Cores = 3 here: pinned to i.
		if cq.cfg.Affinity != i || srq.cfg.Affinity != i || c.CPU() != i || c.Index() != i {
			t.Errorf("core %d: CQ affinity %d, SRQ affinity %d, CPU %d", i, cq.cfg.Affinity, srq.cfg.Affinity, c.CPU())
		}
		if cq.cfg.Depth != wantDepth {
			t.Errorf("core %d: CQ depth %d, want %d", i, cq.cfg.Depth, wantDepth)
		}
		if srq.Queued() != int(cfg.Buffers) || srq.threshold != cfg.RefillThreshold || !srq.armed {
			t.Errorf("core %d: SRQ queued %d threshold %d armed %v", i, srq.Queued(), srq.threshold, srq.armed)
		}
		if srq.cfg.NotifyThreshold != 0 {
			t.Errorf("core %d: SRQ created armed (threshold %d) while empty", i, srq.cfg.NotifyThreshold)
		}
		if !cq.armed {
			t.Errorf("core %d: CQ not armed", i)
		}
		// Buffers are disjoint, BufferSize apart, in one region.
		for j := range c.bufs {
			b := &c.bufs[j]
			if b.sge[0].Length != cfg.BufferSize || b.sge[0].Addr != 0x1000+uint64(j)*uint64(cfg.BufferSize) || len(b.Bytes()) != int(cfg.BufferSize) {
				t.Fatalf("core %d buffer %d: sge %+v len %d", i, j, b.sge[0], len(b.Bytes()))
			}
		}
	}
	// More engine cores than processors wrap around.
	a := newFakeAdapter(2, false)
	pd, _ := a.CreatePD()
	e, err := NewEngine(a, pd, cfg, HandlerFunc(func(*Core, *Completion) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i, c := range e.Cores() {
		if c.CPU() != i%2 || c.cq.(*fakeCQ).cfg.Affinity != i%2 {
			t.Errorf("core %d on CPU %d, want %d", i, c.CPU(), i%2)
		}
	}
}

func TestEnginePlacement(t *testing.T) {
	cfg := smallConfig()
	cfg.Cores, cfg.QPsPerCore = 3, 2
	r := newRig(t, false, cfg, HandlerFunc(func(*Core, *Completion) {}))
	e := r.e
	var qps []QP
	var got []int
	for i := 0; i < 6; i++ {
		if p := e.PlaceQP(); p == nil {
			t.Fatalf("PlaceQP = nil with %d QPs", i)
		}
		qp, c, err := e.CreateQP(i, 0, 0)
		if err != nil {
			t.Fatalf("CreateQP %d: %v", i, err)
		}
		f := qp.(*fakeQP)
		if f.cfg.ReceiveCQ != c.cq || f.cfg.InitiatorCQ != c.cq || f.cfg.SRQ != c.srq || f.cfg.Context != i ||
			f.cfg.InitiatorQueueDepth != cfg.InitiatorDepth || f.cfg.MaxReceiveRequestSge != 1 {
			t.Errorf("QP %d config %+v", i, f.cfg)
		}
		qps = append(qps, qp)
		got = append(got, c.Index())
	}
	if fmt.Sprint(got) != "[0 1 2 0 1 2]" {
		t.Errorf("placement = %v, want least-loaded, ties to lowest index", got)
	}
	if p := e.PlaceQP(); p != nil {
		t.Errorf("PlaceQP = core %d with every core full", p.Index())
	}
	if _, _, err := e.CreateQP(nil, 0, 0); !errors.Is(err, ErrInsufficientResources) {
		t.Errorf("CreateQP on full engine = %v", err)
	}
	// Closing a QP of core 1 makes core 1 the least loaded.
	if err := e.Cores()[1].CloseQP(qps[1]); err != nil {
		t.Fatal(err)
	}
	if !qps[1].(*fakeQP).closed {
		t.Error("CloseQP did not close the QP")
	}
	if err := e.Cores()[1].CloseQP(qps[1]); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("second CloseQP = %v", err)
	}
	if p := e.PlaceQP(); p == nil || p.Index() != 1 {
		t.Errorf("PlaceQP after closing on core 1 = %v", p)
	}
	if err := e.CloseQP(qps[5]); err != nil { // core 2, through the engine
		t.Fatal(err)
	}
	if p := e.PlaceQP(); p == nil || p.Index() != 1 {
		t.Errorf("PlaceQP ties not to the lowest index: %v", p)
	}
	if s := e.Stats(); s.QPs != 4 {
		t.Errorf("Stats.QPs = %d, want 4", s.QPs)
	}
	// Depth above the sizing is refused; a provider failure does not leak
	// the reserved slot.
	if _, _, err := e.CreateQP(nil, cfg.InitiatorDepth+1, 0); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("CreateQP(depth too big) = %v", err)
	}
	if _, _, err := e.CreateQP(nil, 0, 1<<20); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("CreateQP(inline too big) = %v", err)
	}
	if n := e.Cores()[1].QPs(); n != 1 {
		t.Errorf("core 1 QPs = %d after a failed create, want 1", n)
	}
	if err := e.CloseQP(&fakeQP{}); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("CloseQP(foreign) = %v", err)
	}
}

func TestEngineDispatchAndRepost(t *testing.T) {
	var got []string
	var userCtx = &struct{ n int }{}
	h := HandlerFunc(func(c *Core, comp *Completion) {
		if b := c.RecvBuf(comp); b != nil {
			got = append(got, fmt.Sprintf("%d:%s:%v", c.Index(), c.RecvBuffer(comp), comp.QPContext))
			if b.Core() != c {
				t.Error("buffer core mismatch")
			}
			if err := b.Repost(); err != nil {
				t.Error(err)
			}
			return
		}
		if c.RecvBuffer(comp) != nil {
			t.Error("RecvBuffer of a send completion")
		}
		got = append(got, fmt.Sprintf("%d:%v", c.Index(), comp.Type))
	})
	r := newRig(t, false, smallConfig(), h)
	r.deliver(t, 1, 10, func(j int) []byte { return []byte(fmt.Sprintf("m%d", j)) })
	r.cq(1).push(Completion{Type: OpSend, RequestContext: userCtx, QPContext: "qp"})
	if !r.cq(1).fire() {
		t.Fatal("CQ not armed")
	}
	want := "1:m0:qp 1:m1:qp 1:m2:qp 1:m3:qp 1:m4:qp 1:m5:qp 1:m6:qp 1:m7:qp 1:m8:qp 1:m9:qp 1:send"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("handled %s\nwant    %s", s, want)
	}
	if q := r.srq(1).Queued(); q != 64 {
		t.Errorf("SRQ queued %d after reposts, want 64", q)
	}
	if !r.cq(1).armed {
		t.Error("CQ not re-armed")
	}
	s := r.e.Stats()
	if s.Completions != 11 || s.Receives != 10 || s.Notifications != 1 || s.Reposts != 10 || s.CompletionsPerNotification() != 11 {
		t.Errorf("stats %+v", s)
	}
	if s0 := r.e.Cores()[0].Stats(); s0.Completions != 0 || s0.SRQQueued != 64 {
		t.Errorf("core 0 stats %+v", s0)
	}
	// The completion array does not keep the contexts alive.
	for _, c := range r.e.Cores()[1].batch {
		if c.RequestContext != nil || c.QPContext != nil {
			t.Fatal("completion array keeps references")
		}
	}
}

func TestEngineReleaseAndRefill(t *testing.T) {
	cfg := smallConfig()
	cfg.SRQDepth, cfg.Buffers, cfg.RefillThreshold = 32, 32, 8
	h := HandlerFunc(func(c *Core, comp *Completion) { c.Release(c.RecvBuf(comp)) })
	r := newRig(t, false, cfg, h)
	srq := r.srq(0)
	r.deliver(t, 0, 24, nil) // 8 left: not below the threshold
	r.cq(0).fire()
	if srq.pending || srq.Queued() != 8 {
		t.Fatalf("queued %d pending %v", srq.Queued(), srq.pending)
	}
	r.deliver(t, 0, 1, nil) // 7 < 8: the threshold fires
	r.cq(0).fire()
	if !srq.pump() {
		t.Fatal("threshold did not fire")
	}
	if q := srq.Queued(); q != 32 {
		t.Errorf("after refill queued %d, want 32", q)
	}
	if !srq.armed {
		t.Error("threshold not re-armed after refill")
	}
	s := r.e.Stats()
	if s.SRQNotifications != 1 || s.SRQRefills != 1 || s.SRQRefillBuffers != 25 || s.Releases != 25 || s.SRQStarved != 0 {
		t.Errorf("stats %+v", s)
	}
	// A second round refills again.
	r.deliver(t, 0, 30, nil)
	r.cq(0).fire()
	srq.pump()
	if s := r.e.Stats(); s.SRQRefills != 2 || s.SRQRefillBuffers != 55 || srq.Queued() != 32 {
		t.Errorf("second refill: queued %d stats %+v", srq.Queued(), s)
	}
}

func TestEngineStarvedSRQIsKicked(t *testing.T) {
	cfg := smallConfig()
	cfg.SRQDepth, cfg.Buffers, cfg.RefillThreshold = 16, 16, 4
	var held []*RecvBuf
	h := HandlerFunc(func(c *Core, comp *Completion) { held = append(held, c.RecvBuf(comp)) })
	r := newRig(t, false, cfg, h)
	c, srq := r.e.Cores()[0], r.srq(0)
	r.deliver(t, 0, 13, nil) // 3 queued < 4
	r.cq(0).fire()
	srq.pump()
	if c.srqState.Load() != srqStarved || srq.armed || srq.pending {
		t.Fatalf("state %d armed %v pending %v: want starved, unarmed (re-arming would fire at once)", c.srqState.Load(), srq.armed, srq.pending)
	}
	if s := r.e.Stats(); s.SRQStarved != 1 || s.SRQRefills != 0 {
		t.Errorf("stats %+v", s)
	}
	// Release while starved posts at once and re-arms: 3 + 1 = 4.
	held[0].Release()
	if srq.Queued() != 4 || !srq.armed || c.srqState.Load() != srqArmed {
		t.Errorf("after release while starved: queued %d armed %v state %d", srq.Queued(), srq.armed, c.srqState.Load())
	}
	// Armed again: a Release waits on the free list for the next refill.
	held[1].Release()
	if srq.Queued() != 4 {
		t.Errorf("release while armed posted at once: queued %d", srq.Queued())
	}
	// Repost posts at once.
	for _, b := range held[2:] {
		if err := b.Repost(); err != nil {
			t.Fatal(err)
		}
	}
	if srq.Queued() != 15 {
		t.Errorf("queued %d, want 15", srq.Queued())
	}
	// Starve again through Repost: drain to 3, then one Repost kicks.
	held = held[:0]
	r.deliver(t, 0, 12, nil)
	r.cq(0).fire()
	srq.pump() // posts the one free buffer (from Release above): 4, armed
	if srq.Queued() != 4 || c.srqState.Load() != srqArmed {
		t.Fatalf("queued %d state %d", srq.Queued(), c.srqState.Load())
	}
	r.deliver(t, 0, 1, nil)
	r.cq(0).fire()
	srq.pump() // 3 queued, nothing free: starved
	if c.srqState.Load() != srqStarved {
		t.Fatalf("state %d, want starved", c.srqState.Load())
	}
	held[0].Repost()
	if c.srqState.Load() != srqArmed || !srq.armed {
		t.Errorf("Repost while starved did not re-arm: state %d", c.srqState.Load())
	}
}

func TestEngineRepostFailureGoesToFreeList(t *testing.T) {
	cfg := smallConfig()
	var held []*RecvBuf
	r := newRig(t, false, cfg, HandlerFunc(func(c *Core, comp *Completion) { held = append(held, c.RecvBuf(comp)) }))
	srq := r.srq(0)
	r.deliver(t, 0, 2, nil)
	r.cq(0).fire()
	srq.failPost = true
	if err := held[0].Repost(); !errors.Is(err, ErrInsufficientResources) {
		t.Fatalf("Repost with a refusing SRQ = %v", err)
	}
	srq.failPost = false
	if s := r.e.Stats(); s.RepostFailures != 1 || s.Reposts != 0 {
		t.Errorf("stats %+v", s)
	}
	// The next threshold crossing posts it.
	r.deliver(t, 0, int(cfg.Buffers-cfg.RefillThreshold)-1, nil)
	srq.pump()
	if s := r.e.Stats(); s.SRQRefillBuffers != 1 {
		t.Errorf("refilled %d, want the 1 refused buffer", s.SRQRefillBuffers)
	}
}

func TestEngineBufferMisusePanics(t *testing.T) {
	var held []*RecvBuf
	r := newRig(t, false, smallConfig(), HandlerFunc(func(c *Core, comp *Completion) { held = append(held, c.RecvBuf(comp)) }))
	r.deliver(t, 0, 2, nil)
	r.cq(0).fire()
	r.deliver(t, 1, 1, nil)
	r.cq(1).fire()
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", name)
			}
		}()
		f()
	}
	held[0].Repost()
	mustPanic("double Repost", func() { held[0].Repost() })
	mustPanic("Release after Repost", func() { held[0].Release() })
	held[1].Release()
	mustPanic("double Release", func() { held[1].Release() })
	mustPanic("Repost on a foreign core", func() { r.e.Cores()[0].Repost(held[2]) })
	// A completion for a buffer that is not posted: a provider bug.
	mustPanic("completion of a held buffer", func() {
		r.cq(1).push(Completion{Type: OpReceive, RequestContext: held[2]})
		r.cq(1).fire()
	})
}

func TestEngineArmThenPoll(t *testing.T) {
	n := 0
	r := newRig(t, false, smallConfig(), HandlerFunc(func(c *Core, comp *Completion) {
		n++
		if b := c.RecvBuf(comp); b != nil {
			b.Repost()
		}
	}))
	cq := r.cq(0)
	once := true
	cq.onArm = func() {
		// A completion lands right after the arm, before the re-poll.
		if once {
			once = false
			cq.push(Completion{Type: OpSend})
		}
	}
	r.deliver(t, 0, 1, nil)
	cq.fire()
	if n != 2 {
		t.Fatalf("handled %d completions in the notification, want 2 (the late one by the post-arm poll)", n)
	}
	if s := r.e.Stats(); s.Notifications != 1 || s.Completions != 2 {
		t.Errorf("stats %+v", s)
	}
	// Its arm may still fire: the notification finds nothing.
	cq.fireStatus(nil)
	if s := r.e.Stats(); s.Notifications != 2 || s.EmptyNotifications != 1 || s.Completions != 2 {
		t.Errorf("after empty notification: %+v", s)
	}
	if !cq.armed {
		t.Error("not re-armed after an empty notification")
	}
}

func TestEngineModerationControl(t *testing.T) {
	load := func(r *rig, notifications, per int) {
		for i := 0; i < notifications; i++ {
			r.deliver(t, 0, per, nil)
			r.cq(0).fire()
		}
	}
	repost := HandlerFunc(func(c *Core, comp *Completion) { c.RecvBuf(comp).Repost() })
	cfg := smallConfig()
	cfg.Moderation = ModerationConfig{IdleGap: time.Hour} // no idle reset under a slow test

	// Supported: after one window of 8 completions per notification the
	// controller probes level 1 and the CQ is told.
	r := newRig(t, true, cfg, repost)
	load(r, DefaultModerationWindow, 8)
	if got := r.cq(0).mods; len(got) != 1 || got[0] != DefaultModerationProfile()[1] {
		t.Errorf("moderation calls %v, want [%v]", got, DefaultModerationProfile()[1])
	}
	if s := r.e.Cores()[0].Stats(); s.ModerationChanges != 1 || s.Moderation != DefaultModerationProfile()[1] {
		t.Errorf("stats %+v", s)
	}
	// QD1 brings it back to off (after at most two windows: the probe
	// window and a timer-driven one).
	load(r, 3*DefaultModerationWindow, 1)
	mods := r.cq(0).mods
	if last := mods[len(mods)-1]; !last.Off() {
		t.Errorf("after QD1 moderation %v, want off (calls %v)", last, mods)
	}

	// QD1 from the start: never called.
	r = newRig(t, true, cfg, repost)
	load(r, 10*DefaultModerationWindow, 1)
	if len(r.cq(0).mods) != 0 {
		t.Errorf("QD1 moderation calls %v, want none", r.cq(0).mods)
	}

	// Not supported (M9) or turned off: never called.
	for _, tc := range []struct {
		name string
		flag bool
		off  bool
	}{{"no flag", false, false}, {"off", true, true}} {
		c := cfg
		c.Moderation.Off = tc.off
		r = newRig(t, tc.flag, c, repost)
		load(r, 4*DefaultModerationWindow, 8)
		if len(r.cq(0).mods) != 0 {
			t.Errorf("%s: moderation calls %v", tc.name, r.cq(0).mods)
		}
	}
}

type errHandler struct {
	HandlerFunc
	errs []error
}

func (h *errHandler) HandleCQError(c *Core, err error) { h.errs = append(h.errs, err) }

func TestEngineCQErrors(t *testing.T) {
	h := &errHandler{HandlerFunc: func(*Core, *Completion) {}}
	r := newRig(t, false, smallConfig(), h)
	r.cq(0).fireStatus(ErrCQOverflow)
	r.cq(0).fireStatus(ErrClosed) // not an error
	if len(h.errs) != 1 || !errors.Is(h.errs[0], ErrCQOverflow) {
		t.Errorf("errors %v", h.errs)
	}
	if s := r.e.Stats(); s.CQErrors != 1 {
		t.Errorf("CQErrors = %d", s.CQErrors)
	}
}

func TestEngineClose(t *testing.T) {
	var held []*RecvBuf
	calls := 0
	r := newRig(t, false, smallConfig(), HandlerFunc(func(c *Core, comp *Completion) {
		calls++
		if b := c.RecvBuf(comp); b != nil {
			held = append(held, b)
		}
	}))
	qp, _, err := r.e.CreateQP(nil, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	r.deliver(t, 0, 1, nil)
	r.cq(0).fire()
	if err := r.e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.e.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if !qp.(*fakeQP).closed {
		t.Error("QP not closed")
	}
	for i := range r.e.Cores() {
		if !r.cq(i).closed || !r.srq(i).closed || !r.e.Cores()[i].mr.(*fakeMR).closed {
			t.Errorf("core %d objects not closed", i)
		}
	}
	// No callback runs after Close.
	r.cq(0).push(Completion{Type: OpSend})
	r.cq(0).fireStatus(nil)
	r.srq(0).cfg.Notify(r.srq(0).cfg.Context, nil)
	if calls != 1 {
		t.Errorf("handler ran after Close (%d calls)", calls)
	}
	if _, _, err := r.e.CreateQP(nil, 0, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("CreateQP after Close = %v", err)
	}
	if r.e.PlaceQP() != nil {
		t.Error("PlaceQP after Close")
	}
	// Giving a buffer back after Close fails quietly, without panicking.
	if err := held[0].Repost(); err == nil {
		t.Error("Repost after Close succeeded")
	}
}

// TestEngineSteadyStateAllocs guards the completion path: draining a CQ,
// dispatching receive and send completions, Repost, Release, the SRQ
// refill and the moderation controller allocate nothing.
func TestEngineSteadyStateAllocs(t *testing.T) {
	cfg := smallConfig()
	cfg.Cores = 1
	cfg.Moderation = ModerationConfig{}
	h := HandlerFunc(func(c *Core, comp *Completion) {
		b := c.RecvBuf(comp)
		if b == nil {
			return
		}
		if b.Index()%2 == 0 {
			b.Repost()
		} else {
			b.Release()
		}
	})
	r := newRig(t, true, cfg, h)
	cq, srq := r.cq(0), r.srq(0)
	cq.mods = make([]ModerationLevel, 0, 1<<16)
	var sendCtx any = &struct{}{}
	payload := []byte("0123456789")
	pay := func(int) []byte { return payload }
	round := func() {
		r.deliver(t, 0, 24, pay)
		cq.push(Completion{Type: OpSend, RequestContext: sendCtx, QPContext: r.qpctx})
		cq.fire()
		srq.pump()
	}
	for range 100 {
		round() // warm up: the controller climbs and settles
	}
	allocs := testing.AllocsPerRun(1000, round)
	if allocs != 0 {
		t.Errorf("steady state: %v allocs per notification of 25 completions, want 0", allocs)
	}
	s := r.e.Stats()
	if s.SRQRefills == 0 || s.Releases == 0 || s.Reposts == 0 {
		t.Errorf("the measured path did not refill: %+v", s)
	}
}

// BenchmarkEngineDispatch measures the engine's completion path per
// completion (fake provider: the provider's own cost is a mutex per Poll
// and per post).
func BenchmarkEngineDispatch(b *testing.B) {
	for _, per := range []int{1, 32} {
		b.Run(fmt.Sprintf("per-notification=%d", per), func(b *testing.B) {
			cfg := smallConfig()
			cfg.Cores = 1
			cfg.SRQDepth, cfg.Buffers, cfg.RefillThreshold = 256, 256, 64
			cfg.Moderation = ModerationConfig{}
			h := HandlerFunc(func(c *Core, comp *Completion) { c.RecvBuf(comp).Repost() })
			r := newRig(b, true, cfg, h)
			r.cq(0).mods = make([]ModerationLevel, 0, 1<<16)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				r.deliver(b, 0, 1, nil)
				n++
				if n%per == 0 {
					r.cq(0).fire()
				}
			}
			r.cq(0).fire()
			s := r.e.Stats()
			b.ReportMetric(s.CompletionsPerNotification(), "completions/notification")
		})
	}
}

// TestEngineSplitReceive: with HeaderSize every receive buffer is posted
// as two SGEs, a header of HeaderSize bytes and a payload of the rest
// that starts on a page (on a region the provider did not align: the
// fake's is a Go slice), all of them disjoint inside the one region; a
// HeaderSize that leaves no whole pages, or an adapter with one SGE per
// receive, is refused.
func TestEngineSplitReceive(t *testing.T) {
	cfg := smallConfig()
	cfg.BufferSize, cfg.HeaderSize = 64+2*receivePage, 64
	r := newRig(t, false, cfg, HandlerFunc(func(*Core, *Completion) {}))
	for _, c := range r.e.cores {
		owner := make(map[uintptr]int) // first byte of each header and payload
		for i := range c.bufs {
			b := &c.bufs[i]
			h, p := b.Bytes(), b.Payload()
			if len(h) != 64 || len(p) != 2*receivePage || b.nsge != 2 {
				t.Fatalf("core %d buffer %d: header %d bytes, payload %d, %d SGEs; want 64, %d, 2", c.index, i, len(h), len(p), b.nsge, 2*receivePage)
			}
			if a := uintptr(unsafe.Pointer(&p[0])); a%receivePage != 0 {
				t.Fatalf("core %d buffer %d: payload at %#x, not on a page", c.index, i, a)
			}
			if b.sge[0].Length != 64 || b.sge[1].Length != 2*receivePage || b.SGE(nvmeCQE).Length != nvmeCQE {
				t.Fatalf("core %d buffer %d: SGEs %+v", c.index, i, b.sge)
			}
			for _, s := range [][]byte{h, p} {
				for j := range s {
					a := uintptr(unsafe.Pointer(&s[j]))
					if o, ok := owner[a]; ok {
						t.Fatalf("core %d: byte %#x in buffers %d and %d", c.index, a, o, i)
					}
					owner[a] = i
				}
			}
		}
	}
	for _, bad := range []struct{ size, hdr uint32 }{{64 + 100, 64}, {64, 64}, {4096, 64}} {
		c := smallConfig()
		c.BufferSize, c.HeaderSize = bad.size, bad.hdr
		if err := c.Validate(); !errors.Is(err, ErrInvalidParameter) {
			t.Errorf("BufferSize %d, HeaderSize %d: Validate %v, want ErrInvalidParameter", bad.size, bad.hdr, err)
		}
	}
	c := smallConfig()
	c.BufferSize, c.HeaderSize = 64+receivePage, 64
	info := newFakeAdapter(1, false).Info()
	info.MaxReceiveRequestSge = 1
	if err := c.ValidateFor(info); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("split receive on an adapter of one receive SGE: ValidateFor %v, want ErrInvalidParameter", err)
	}
}

// nvmeCQE is a response's size, as an NVMe binding sends from a header.
const nvmeCQE = 16
