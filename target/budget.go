package target

import (
	"fmt"
	"net"

	"github.com/blk-project/blk/nvme"
)

// The controller budget. Discovery is open to any host NQN, so whoever
// reaches a port can create discovery controllers; I/O controllers need
// a host NQN the subsystem allows. Without a budget, a peer that opens
// discovery controllers until MaxControllers is reached locks every
// allowed host out. So:
//
//   - all controllers together stay within MaxControllers (the CNTLID
//     space the target hands out);
//   - discovery controllers stay within MaxDiscoveryControllers, which
//     is below MaxControllers: I/O controllers of allowed hosts always
//     have MaxControllers − MaxDiscoveryControllers to themselves;
//   - the discovery controllers of one source address stay within
//     MaxDiscoveryPerSource, so one peer cannot take the discovery
//     budget from the others either;
//   - a discovery controller that sends nothing after its Connect ends
//     after DiscoveryIdleTimeout (ctrl.go), not DiscoveryKATO.
//
// A Connect over budget gets Connect Controller Busy without DNR: the
// condition is temporary (controllers end), and a Linux host stops
// reconnecting for good on a Connect status with DNR
// (nvmf_should_reconnect in drivers/nvme/host/fabrics.c), while without
// DNR it retries every reconnect_delay until ctrl_loss_tmo.

// busyReason says which budget refused a controller; busyNone that none
// did.
type busyReason uint8

const (
	busyNone            busyReason = iota
	busyControllers                // MaxControllers
	busyDiscovery                  // MaxDiscoveryControllers
	busyDiscoverySource            // MaxDiscoveryPerSource
	numBusyReasons
)

// sourceOf is the source address a queue's controllers are budgeted by:
// the host part of RemoteAddr, an IP address in its canonical form
// (an IPv4-mapped IPv6 address as IPv4), or RemoteAddr itself when it is
// no host:port.
func sourceOf(remote string) string {
	host, _ := SplitHostPort(remote)
	if ip := net.ParseIP(host); ip != nil {
		return ip.String()
	}
	return host
}

// allocCNTLID reserves a controller ID for a controller of src
// (discovery or not) within the budget, or says which budget is full.
func (t *Target) allocCNTLID(disc bool, src string) (uint16, busyReason) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed || t.nctrl >= t.cfg.MaxControllers:
		return 0, busyControllers
	case disc && t.ndisc >= t.cfg.MaxDiscoveryControllers:
		return 0, busyDiscovery
	case disc && t.discBySource[src] >= t.cfg.MaxDiscoveryPerSource:
		return 0, busyDiscoverySource
	}
	id, ok := t.cntlids.alloc()
	if !ok {
		return 0, busyControllers
	}
	t.nctrl++
	if disc {
		t.ndisc++
		t.discBySource[src]++
	}
	return id, busyNone
}

// freeCNTLID releases a controller ID and its place in the budget;
// rollback says no host saw it.
func (t *Target) freeCNTLID(id uint16, rollback, disc bool, src string) {
	t.mu.Lock()
	t.cntlids.free(id, rollback)
	t.nctrl--
	if disc {
		t.ndisc--
		if n := t.discBySource[src] - 1; n > 0 {
			t.discBySource[src] = n
		} else {
			delete(t.discBySource, src)
		}
	}
	t.mu.Unlock()
}

// busyRefusal says in words why a Connect got Controller Busy, naming
// the source where its own budget was the one full.
func (t *Target) busyRefusal(why busyReason, src string) string {
	switch why {
	case busyDiscovery:
		return fmt.Sprintf("%d discovery controllers live (MaxDiscoveryControllers)", t.cfg.MaxDiscoveryControllers)
	case busyDiscoverySource:
		return fmt.Sprintf("source %s has %d discovery controllers (MaxDiscoveryPerSource)", src, t.cfg.MaxDiscoveryPerSource)
	}
	return fmt.Sprintf("%d controllers live (MaxControllers)", t.cfg.MaxControllers)
}

// SetCNTLIDRange makes the target hand out controller IDs lo..hi (both
// included) from now on, as Config.CNTLIDMin and CNTLIDMax would have:
// for a target created before it knew its share of the IDs, as blkd's is
// before the registry gives its node an ordinal. The range must be valid
// as in Config.Validate and hold MaxControllers IDs (the budget does not
// change), else ErrInvalid and nothing changes.
//
// Live controllers keep the IDs they have, inside the new range or not:
// a host knows its controllers by them. No new controller takes an ID a
// live one holds, whatever the ranges before and after (the IDs in use
// are tracked over the whole CNTLID space), so the target never has two
// controllers with one ID; a controller outside the new range frees its
// ID when it ends, and it is not handed out again while the range
// excludes it. Controllers created before the call may duplicate IDs
// another target hands out in its own range: set the range before
// hosts connect where that matters.
func (t *Target) SetCNTLIDRange(lo, hi uint16) error {
	if lo < nvme.CNTLIDMin || hi > nvme.CNTLIDMax || lo > hi {
		return fmt.Errorf("target: CNTLID range %#x..%#x is not 1 ≤ lo ≤ hi ≤ %#x: %w", lo, hi, nvme.CNTLIDMax, ErrInvalid)
	}
	if n := int(hi-lo) + 1; t.cfg.MaxControllers > n {
		return fmt.Errorf("target: CNTLID range %#x..%#x holds %d IDs, fewer than MaxControllers %d: %w", lo, hi, n, t.cfg.MaxControllers, ErrInvalid)
	}
	t.mu.Lock()
	t.cntlids.lo, t.cntlids.hi = lo, hi
	t.mu.Unlock()
	return nil
}
