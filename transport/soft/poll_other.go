//go:build !linux

package soft

import (
	"errors"

	"github.com/blk-project/blk/transport"
)

// Poll groups need epoll; New refuses Config.PollGroup elsewhere, so none
// of this runs.
const pollSupported = false

type pollGroup struct{}

const rxPollBufSize = rxBufSize

func (g *pollGroup) kick()                  {}
func (g *pollGroup) mark(q *qp)             {}
func (g *pollGroup) adopt(q *qp) bool       { return false }
func (q *qp) finishPending()                {}
func (q *qp) writeBatch() bool              { return false }
func (t *txState) writevFD(fd uintptr) bool { return true }
func (r *rxState) readNBFD(fd uintptr) bool { return true }

func (c *cq) startPoll(started chan struct{}) error { return transport.ErrNotSupported }

var errPollShort = errors.New("soft: poll group: FPDU not whole in the buffer")

func (g *pollGroup) counters() (wakes, sleeps, full uint64) { return 0, 0, 0 }
