package soft_test

import (
	"context"
	"testing"

	"github.com/blk-project/blk/transport"
	"github.com/blk-project/blk/transport/soft"
	"github.com/blk-project/blk/transport/transporttest"
)

// TestConformanceMinimal runs the suite against the soft provider seen
// through wrappers that have only the mandatory interfaces (a struct that
// embeds transport.PD or transport.QP has only their methods): the
// provider a new backend starts as. The optional features' subtests must
// see no FastRegisterPD, FastRegisterQP or FlushQP, check that the
// adapter advertises none of them (FRMRPageCount 0), and skip; Q4 must
// cancel with Disconnect instead of Flush.
func TestConformanceMinimal(t *testing.T) {
	if testing.Short() {
		t.Skip("the full suite a second time; -short runs it once (TestConformance)")
	}
	transporttest.Run(t, transporttest.Harness{
		NewAdapter: func(t testing.TB) transport.Adapter {
			// StrictReadSink: the second run also covers an iWARP
			// adapter whose read sinks need remote write
			// (ReadSinkLocal's other half).
			a, err := soft.New(soft.Config{StrictReadSink: true})
			if err != nil {
				t.Fatal(err)
			}
			return minAdapter{a}
		},
		ListenAddr: "127.0.0.1:0",
	})
}

type minAdapter struct{ transport.Adapter }

func (a minAdapter) Info() transport.AdapterInfo {
	i := a.Adapter.Info()
	i.FRMRPageCount = 0 // no FastRegisterPD/QP: none to advertise
	return i
}

func (a minAdapter) CreatePD() (transport.PD, error) {
	pd, err := a.Adapter.CreatePD()
	if err != nil {
		return nil, err
	}
	return minPD{pd}, nil
}

func (a minAdapter) Listen(addr string) (transport.Listener, error) {
	ln, err := a.Adapter.Listen(addr)
	if err != nil {
		return nil, err
	}
	return minListener{ln}, nil
}

func (a minAdapter) Connect(ctx context.Context, qp transport.QP, addr string, p transport.ConnParams) ([]byte, error) {
	return a.Adapter.Connect(ctx, unwrapQP(qp), addr, p)
}

type minPD struct{ transport.PD }

func (p minPD) CreateQP(cfg transport.QPConfig) (transport.QP, error) {
	qp, err := p.PD.CreateQP(cfg)
	if err != nil {
		return nil, err
	}
	return minQP{qp}, nil
}

type minQP struct{ transport.QP }

func unwrapQP(qp transport.QP) transport.QP {
	if m, ok := qp.(minQP); ok {
		return m.QP
	}
	return qp
}

type minListener struct{ transport.Listener }

func (l minListener) GetConnectionRequest(ctx context.Context) (transport.ConnRequest, error) {
	r, err := l.Listener.GetConnectionRequest(ctx)
	if err != nil {
		return nil, err
	}
	return minReq{r}, nil
}

type minReq struct{ transport.ConnRequest }

func (r minReq) Accept(ctx context.Context, qp transport.QP, p transport.ConnParams) error {
	return r.ConnRequest.Accept(ctx, unwrapQP(qp), p)
}
