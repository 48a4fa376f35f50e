package target

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// syncPool runs the commands that may wait for a disk sync, so that
// Queue.Execute never blocks its caller on one. It is preallocated: n
// goroutines started by New, and a queue of depth slots. A command that
// finds the queue full runs on a goroutine of its own, counted in
// Stats.SyncOverflow, rather than blocking the binding.
type syncPool struct {
	t  *Target
	ch chan *Request
	wg sync.WaitGroup // workers

	// closed stops submissions; submitting counts submits in progress,
	// so close can wait for them before closing ch (the Go memory model
	// orders the two atomics: a submit either sees closed or is seen by
	// close).
	closed     atomic.Bool
	submitting atomic.Int64
	overflow   sync.WaitGroup
}

func newSyncPool(t *Target, n, depth int) *syncPool {
	p := &syncPool{t: t, ch: make(chan *Request, depth)}
	p.wg.Add(n)
	for range n {
		go p.work()
	}
	return p
}

func (p *syncPool) work() {
	defer p.wg.Done()
	for r := range p.ch {
		p.t.runSync(r)
	}
}

// submit hands a checked command (r.ns holds its namespace reference, or
// nil for a flush of every namespace) to a worker. It never blocks.
func (p *syncPool) submit(r *Request) {
	p.t.enter(r, reqQueued)
	p.submitting.Add(1)
	defer p.submitting.Add(-1)
	if p.closed.Load() {
		p.t.abortSync(r)
		return
	}
	select {
	case p.ch <- r:
	default:
		p.t.stats.syncOverflow.Add(1)
		p.overflow.Add(1)
		go func() {
			defer p.overflow.Done()
			p.t.runSync(r)
		}()
	}
}

// close stops submissions and waits until every queued command has run.
func (p *syncPool) close() {
	p.closed.Store(true)
	for p.submitting.Load() != 0 {
		runtime.Gosched()
	}
	p.overflow.Wait()
	close(p.ch)
	p.wg.Wait()
}
