package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/blk-project/blk/nvme"
	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
)

// rawHost is a deliberately bare NVMe/RDMA host written straight on the
// transport, byte by byte, for tests of the binding that must not depend
// on our initiator: CM private data, capsules, keyed and in-capsule SGLs,
// Send with Invalidate.
type rawHost struct {
	t    testing.TB
	a    transport.Adapter
	pd   transport.PD
	cq   transport.CQ
	qp   transport.QP
	mr   transport.MemoryRegion // [0,4096) capsules, [4096,4096+16*32) responses
	data transport.MemoryRegion // remote read + write, 1 MiB
	frmr transport.MemoryRegion // fast-registered per command (SGL 0x4F)
	cid  uint16
}

const rawRespOff = 8192

func dialRaw(t testing.TB, addr string, cm nvme.RDMACMRequest) (*rawHost, error) {
	t.Helper()
	return dialRawWith(t, addr, cm, soft.Config{})
}

// dialRawWith is dialRaw on an adapter of the given configuration.
func dialRawWith(t testing.TB, addr string, cm nvme.RDMACMRequest, cfg soft.Config) (*rawHost, error) {
	t.Helper()
	a, err := soft.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &rawHost{t: t, a: a}
	t.Cleanup(func() { h.close() })
	h.pd, _ = a.CreatePD()
	h.cq, err = a.CreateCQ(transport.CQConfig{Depth: 256, Affinity: -1})
	if err != nil {
		t.Fatal(err)
	}
	h.qp, err = h.pd.CreateQP(transport.QPConfig{ReceiveCQ: h.cq, InitiatorCQ: h.cq,
		ReceiveQueueDepth: 64, InitiatorQueueDepth: 64,
		MaxReceiveRequestSge: 1, MaxInitiatorRequestSge: 1, InlineDataSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	if h.mr, err = h.pd.RegisterMemory(make([]byte, rawRespOff+64*16), transport.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if h.data, err = h.pd.RegisterMemory(make([]byte, 1<<20), transport.AccessLocalWrite|transport.AccessRemoteRead|transport.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	// The raw host plays the Linux host, which fast-registers every
	// command's data: it needs the optional fast-register interfaces.
	fpd, ok := h.pd.(transport.FastRegisterPD)
	if !ok {
		t.Fatalf("raw host: the provider's PD is not a transport.FastRegisterPD")
	}
	if h.frmr, err = fpd.AllocateMR(1 << 20); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 64; i++ {
		if err := h.qp.PostReceive(i, []transport.SGE{h.mr.SGE(rawRespOff+uint32(i)*16, 16)}); err != nil {
			t.Fatal(err)
		}
	}
	var pdata [nvme.RDMACMRequestSize]byte
	cm.Marshal(&pdata)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = a.Connect(ctx, h.qp, addr, transport.ConnParams{PrivateData: pdata[:]})
	return h, err
}

func (h *rawHost) close() {
	if h.qp != nil {
		h.qp.Close()
	}
	h.a.Close()
}

// rejectStatus extracts the NVMe/RDMA reject status of a connect error.
func rejectStatus(err error) (nvme.RDMACMRejectStatus, bool) {
	var re *transport.RejectError
	if !errors.As(err, &re) {
		return 0, false
	}
	var r nvme.RDMACMReject
	if r.Unmarshal(re.PrivateData) != nil {
		return 0, false
	}
	return r.Status, true
}

// exchange sends one capsule (SQE plus in-capsule data) and waits for the
// response capsule, returning it and the receive completion (which says
// whether the target invalidated a key). Any failure fails the test.
func (h *rawHost) exchange(cmd nvme.Command, inCapsule []byte) (nvme.Completion, transport.Completion) {
	h.t.Helper()
	rsp, comp, err := h.tryExchange(cmd, inCapsule)
	if err != nil {
		h.t.Fatal(err)
	}
	return rsp, comp
}

// tryExchange is exchange that reports a failed or dropped connection as
// an error instead of failing the test.
func (h *rawHost) tryExchange(cmd nvme.Command, inCapsule []byte) (nvme.Completion, transport.Completion, error) {
	h.cid++
	cmd.CID = h.cid
	buf := h.mr.Bytes()
	if err := cmd.Marshal((*[nvme.SQESize]byte)(buf[:nvme.SQESize])); err != nil {
		return nvme.Completion{}, transport.Completion{}, err
	}
	copy(buf[nvme.SQESize:], inCapsule)
	if err := h.qp.Send(nil, []transport.SGE{h.mr.SGE(0, uint32(nvme.SQESize+len(inCapsule)))}, transport.FlagSilentSuccess); err != nil {
		return nvme.Completion{}, transport.Completion{}, err
	}
	deadline := time.Now().Add(10 * time.Second)
	var c [1]transport.Completion
	for time.Now().Before(deadline) {
		if h.cq.Poll(c[:]) == 0 {
			time.Sleep(50 * time.Microsecond)
			continue
		}
		if c[0].Status != nil {
			return nvme.Completion{}, c[0], fmt.Errorf("raw host: %v completion: %w (QP: %v)", c[0].Type, c[0].Status, h.qp.Err())
		}
		if c[0].Type != transport.OpReceive {
			continue
		}
		i := c[0].RequestContext.(int)
		off := rawRespOff + uint32(i)*16
		var rsp nvme.Completion
		if err := rsp.Unmarshal(buf[off : off+16]); err != nil {
			return rsp, c[0], err
		}
		if err := h.qp.PostReceive(i, []transport.SGE{h.mr.SGE(off, 16)}); err != nil {
			return rsp, c[0], err
		}
		if rsp.CID != cmd.CID {
			return rsp, c[0], fmt.Errorf("response CID %#x, want %#x", rsp.CID, cmd.CID)
		}
		return rsp, c[0], nil
	}
	return nvme.Completion{}, transport.Completion{}, fmt.Errorf("raw host: no response to %s within 10 s (QP: %v)", describe(cmd), h.qp.Err())
}

func describe(c nvme.Command) string {
	if c.IsFabrics() {
		return fmt.Sprintf("fabrics %v", c.FCType())
	}
	return fmt.Sprintf("opcode %#x", c.Opcode)
}

// keyed returns a keyed SGL (0x40) naming data[off:off+n] of the host's
// statically registered buffer.
func (h *rawHost) keyed(off, n uint32) nvme.SGL {
	return nvme.KeyedSGL(h.data.Addr()+uint64(off), n, h.data.RKey(), false)
}

// fastKeyed fast-registers data[off:off+n] with a fresh key and returns a
// keyed SGL with subtype invalidate (0x4F) naming it, as the Linux host
// does for every command; the target must answer with Send with
// Invalidate of that key.
func (h *rawHost) fastKeyed(off, n uint32) nvme.SGL {
	h.t.Helper()
	fqp, ok := h.qp.(transport.FastRegisterQP)
	if !ok {
		h.t.Fatal("raw host: the provider's QP is not a transport.FastRegisterQP")
	}
	key, err := fqp.FastRegister("fr", h.frmr, h.data.Bytes()[off:off+n], transport.AccessRemoteRead|transport.AccessRemoteWrite, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	var c [1]transport.Completion
	deadline := time.Now().Add(10 * time.Second)
	for h.cq.Poll(c[:]) == 0 {
		if time.Now().After(deadline) {
			h.t.Fatal("fast-register did not complete")
		}
		time.Sleep(50 * time.Microsecond)
	}
	if c[0].Type != transport.OpFastRegister || c[0].Status != nil {
		h.t.Fatalf("fast-register: %v %v", c[0].Type, c[0].Status)
	}
	return nvme.KeyedSGL(h.frmr.Addr(), n, key, true)
}

// connect sends the fabrics Connect with its data in the host's buffer at
// offset 0, fetched by the target with an RDMA READ (keyed SGL), as the
// Linux host does on the admin queue.
func (h *rawHost) connect(qid, sqsize uint16, kato uint32, cntlid uint16, subnqn, hostnqn string) nvme.Completion {
	h.t.Helper()
	var d nvme.ConnectData
	d.HostID = [16]byte{1, 2, 3, 4}
	d.CNTLID = cntlid
	var err error
	if d.SubNQN, err = nvme.MakeNQNField(subnqn); err != nil {
		h.t.Fatal(err)
	}
	if d.HostNQN, err = nvme.MakeNQNField(hostnqn); err != nil {
		h.t.Fatal(err)
	}
	d.Marshal((*[nvme.ConnectDataSize]byte)(h.data.Bytes()[:nvme.ConnectDataSize]))
	cc := nvme.ConnectCommand{QID: qid, SQSize: sqsize, KATO: kato}
	var cmd nvme.Command
	cc.Encode(&cmd)
	cmd.Flags = 0x40
	cmd.DPTR = h.fastKeyed(0, nvme.ConnectDataSize)
	rsp, _ := h.exchange(cmd, nil)
	return rsp
}
