package target

import (
	"context"
	"errors"
	"fmt"

	"github.com/blk-project/blk/nvme"
)

// Admission and fencing, for a subsystem whose hosts are other targets'
// replication legs (docs/replication.md §3): SubsystemConfig.Admit
// decides at Connect who may create a controller, and EvictAndDrain
// removes those no longer admitted and says when the last I/O they had
// at the backend has completed. Together: once EvictAndDrain returns, no
// command of an evicted controller reaches the backend again, and none
// is still there.
//
// The race between the two is closed by evictGen: a Connect admitted
// before an EvictAndDrain whose controller the eviction did not see
// (registered after its snapshot) asks Admit again once registered, and
// is refused if the caller changed what Admit answers before evicting.
// Subsystem.Refuse (any subsystem, host list or Admit) turns every new
// controller away for a while — blkd's volume import — and bumps
// evictGen the same way, so a Connect it did not see asks again too.

// ErrAdmitRetry, wrapped in an error SubsystemConfig.Admit returns,
// refuses the Connect without DNR: the host may connect again later
// (a Linux host retries every reconnect_delay). Any other error refuses
// with DNR: the refusal is final, and the host gives up.
var ErrAdmitRetry = errors.New("target: not admitted now; retry")

// errEvicted is the teardown reason of EvictAndDrain.
var errEvicted = fmt.Errorf("%w: evicted (host fenced)", ErrControllerRemoved)

// admitStatus is the status of a Connect Admit refused, err the refusal.
func admitStatus(err error) nvme.Status {
	if errors.Is(err, ErrAdmitRetry) {
		return nvme.StatusConnectInvalidHost
	}
	return nvme.StatusConnectInvalidHost.WithDNR()
}

// admitHost checks whether a host may create a controller: the host
// list (a host it does not name is refused for good, refusal or not),
// then Refuse, then Admit (which a refusal spares a call). On refusal it
// sets q.refusal and returns the status.
func (q *Queue) admitHost(s *Subsystem, host string) (nvme.Status, bool) {
	if s.admit == nil && !s.hostAllowed(host) {
		return nvme.StatusConnectInvalidHost.WithDNR(), false
	}
	if err := s.refusing(); err != nil {
		q.refusal = "refused: " + err.Error()
		return admitStatus(err), false
	}
	if s.admit != nil {
		if err := s.admit(host); err != nil {
			q.refusal = "not admitted: " + err.Error()
			return admitStatus(err), false
		}
	}
	return nvme.StatusSuccess, true
}

// readmit is the admission asked again of a Connect during which an
// EvictAndDrain or a Refuse ran (evictGen moved): Admit, if set, and
// Refuse. The host list is not asked again (a host denied meanwhile has
// its controllers torn down by DenyHost).
func (s *Subsystem) readmit(host string) error {
	if s.admit != nil {
		if err := s.admit(host); err != nil {
			return err
		}
	}
	return s.refusing()
}

// refusing is Refuse's reason in force, nil if none.
func (s *Subsystem) refusing() error {
	if p := s.refuse.Load(); p != nil {
		return *p
	}
	return nil
}

// Refuse turns away every new controller of the subsystem from now on:
// an admin queue Connect of a host that the host list (or Admit) admits
// is refused with Connect Invalid Host, IPO at HOSTNQN, with why in the
// target's log — without DNR if why wraps ErrAdmitRetry (the host may
// connect again later), with DNR otherwise. Refuse(nil) admits them
// again. The controllers that exist are left as they are: Refuse
// returns the hosts that have one once the refusal is in force, and the
// caller decides (a volume's import gives up if there are any; a
// fence would EvictAndDrain them). A Connect running meanwhile either
// has its controller among those returned or is refused (it asks
// again once registered, as after an EvictAndDrain), so a caller that
// gets none knows that no host has a controller until it calls
// Refuse(nil). blkd refuses a volume's hosts while an import writes it.
// The discovery subsystem refuses nobody.
func (s *Subsystem) Refuse(why error) []string {
	if s.discovery {
		return s.ConnectedHosts()
	}
	s.mu.Lock()
	if why == nil {
		s.refuse.Store(nil)
	} else {
		s.refuse.Store(&why)
	}
	s.evictGen.Add(1)
	s.mu.Unlock()
	return s.ConnectedHosts()
}

// EvictAndDrain tears down every controller of the subsystem whose host
// NQN match accepts (each of its queues gets Responder.Disconnect, as
// for DenyHost), then waits until every I/O queue those hosts have
// connected — of these controllers and of any torn down before that
// still had commands — is closed by its binding and has completed every
// command it executed (Queue.Drained): their I/Os at the backend have
// completed, and a command still arriving on their connections is
// answered Abort SQ Deleted without reaching the backend. It returns the
// number of controllers it tore down. If ctx ends first it returns
// ctx's error (wrapped); the teardown has happened, the drain goes on.
//
// Change what Admit answers before calling it: a Connect running
// meanwhile is then either torn down here or asks Admit again. match is
// called with the subsystem's locks held: it must not call the target.
func (s *Subsystem) EvictAndDrain(ctx context.Context, match func(hostNQN string) bool) (int, error) {
	s.mu.Lock()
	s.evictGen.Add(1)
	var cs []*ctrl
	for _, c := range s.ctrls {
		if match(c.hostNQN) {
			cs = append(cs, c)
		}
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.teardown(errEvicted)
	}
	// After the teardowns no queue joins these controllers (connectIO
	// checks the state under ctrl.mu), so the set is complete.
	var qs []*Queue
	s.qmu.Lock()
	for q, host := range s.ioQueues {
		if match(host) {
			qs = append(qs, q)
		}
	}
	s.qmu.Unlock()
	for i, q := range qs {
		select {
		case <-q.Drained():
		case <-ctx.Done():
			return len(cs), fmt.Errorf("target: subsystem %s: evict: %d of %d queues not drained: %w",
				s.nqn, len(qs)-i, len(qs), ctx.Err())
		}
	}
	return len(cs), nil
}

// trackIO records a connecting I/O queue of host until it drains.
func (s *Subsystem) trackIO(q *Queue, host string) {
	s.qmu.Lock()
	s.ioQueues[q] = host
	s.qmu.Unlock()
	q.tracked.Store(s)
}

// untrackIO forgets a drained I/O queue.
func (s *Subsystem) untrackIO(q *Queue) {
	s.qmu.Lock()
	delete(s.ioQueues, q)
	s.qmu.Unlock()
}
